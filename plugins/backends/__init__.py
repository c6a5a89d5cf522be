"""Built-in attention backends: eager (the PyTorch reference), triton_paged, flashinfer."""

from kvbench.hookspecs import hookimpl


@hookimpl
def kvbench_backends():
    from kvbench.plugins.backends.eager import EagerBackend
    from kvbench.plugins.backends.flashinfer import FlashInferBackend
    from kvbench.plugins.backends.triton_paged import TritonPagedBackend

    return [EagerBackend, TritonPagedBackend, FlashInferBackend]
