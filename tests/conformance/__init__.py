"""Conformance of kvbench with vLLM's scheduler (a package, so its conftest does not shadow tests/conftest)."""
