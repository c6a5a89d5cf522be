"""kvbench: measure how KV-cache allocation, attention kernels and graph modes shape LLM serving."""

__version__ = "0.1.0"
