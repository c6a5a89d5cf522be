"""kvbench's config groups, which Hydra reads as pkg://kvbench.conf. Importing this package (as
Hydra does before it composes) registers the resolver conf/preset/vllm.yaml calls."""

from omegaconf import OmegaConf

GIB = 1 << 30


def vllm_batch_default(key: str, gpu: str, memory_bytes: float) -> int:
    """vLLM 0.33's OpenAI-server default of `key` (max_num_seqs or max_num_batched_tokens) on one
    GPU of `memory_bytes` named `gpu` (EngineArgs.get_batch_defaults): 1,024 / 16,384 from 160 GiB
    up; 1,024 / 8,192 from 70 GiB up on GPUs other than A100s; 256 / 2,048 below those."""
    try:  # a number as the schema reads one ("8.6e10" too); else the config's check names it
        memory_bytes = 0 if isinstance(memory_bytes, bool) else float(memory_bytes)
    except (TypeError, ValueError):
        memory_bytes = 0
    if memory_bytes >= 160 * GIB:
        seqs, tokens = 1024, 16384
    elif memory_bytes >= 70 * GIB and "a100" not in str(gpu).lower():
        seqs, tokens = 1024, 8192
    else:
        seqs, tokens = 256, 2048
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}[key]


OmegaConf.register_new_resolver("kvbench.vllm_batch_default", vllm_batch_default, replace=True)
