"""The hooks a kvbench plugin implements. Each returns the plugin classes it contributes.

A package contributes plugins by exposing a module with `@hookimpl` functions under the
entry-point group `kvbench` (the built-ins are registered exactly that way):

    [project.entry-points.kvbench]
    my_allocators = "my_package.allocators"

Each class carries a unique `name` (what `+allocator=NAME` selects) and implements the
contract of its base class: `kvbench.plugins.allocators.base.KVAllocator`,
`kvbench.plugins.backends.base.AttentionBackend` or `kvbench.plugins.graphs.base.GraphMode`.
"""

import pluggy

PROJECT = "kvbench"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def kvbench_allocators() -> list:
    """KV allocator classes (subclasses of KVAllocator): admit, grow, fork, free, accounting."""


@hookspec
def kvbench_backends() -> list:
    """Attention backend classes (subclasses of AttentionBackend): write_kv and forward."""


@hookspec
def kvbench_graph_modes() -> list:
    """Graph-mode classes (subclasses of GraphMode): wrap a model's forward for a batch."""
