"""Built-in KV allocators: contiguous (Orca Max), oracle, pow2 (buddy), paged, hybrid."""

from kvbench.hookspecs import hookimpl


@hookimpl
def kvbench_allocators():
    from kvbench.plugins.allocators.contiguous import ContiguousAllocator, OracleAllocator
    from kvbench.plugins.allocators.hybrid import HybridAllocator
    from kvbench.plugins.allocators.paged import PagedAllocator
    from kvbench.plugins.allocators.pow2 import Pow2Allocator

    return [ContiguousAllocator, OracleAllocator, Pow2Allocator, PagedAllocator, HybridAllocator]
