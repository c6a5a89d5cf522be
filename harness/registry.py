"""Plugin registry over pluggy: finds every allocator, backend and graph mode by name.

Built-ins and third-party plugins arrive the same way, through the `kvbench` entry-point group;
`register()` adds a module or object at run time (tests, notebooks). Names are unique across
all sources: a duplicate is an error naming both.
"""

from __future__ import annotations

import functools

import pluggy

from kvbench import hookspecs
from kvbench.errors import UserError

KINDS = {
    "allocator": "kvbench_allocators",
    "backend": "kvbench_backends",
    "graph": "kvbench_graph_modes",
}


class Registry:
    def __init__(self, load_entry_points: bool = True):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        if load_entry_points:
            self.pm.load_setuptools_entrypoints(hookspecs.PROJECT)

    def register(self, plugin, name: str | None = None) -> None:
        self.pm.register(plugin, name=name)

    def unregister(self, plugin) -> None:
        self.pm.unregister(plugin)

    def _source(self, plugin) -> str:
        for dist_plugin, dist in self.pm.list_plugin_distinfo():
            if dist_plugin is plugin:
                return f"{dist.project_name} ({self.pm.get_name(plugin)})"
        return getattr(plugin, "__name__", None) or self.pm.get_name(plugin)

    def classes(self, kind: str) -> dict[str, type]:
        """name -> class for one kind; raises if two sources contribute the same name."""
        if kind not in KINDS:
            raise UserError(f"unknown plugin kind {kind!r}; known: {', '.join(KINDS)}")
        hook = getattr(self.pm.hook, KINDS[kind])
        found: dict[str, tuple[type, str]] = {}
        for impl in hook.get_hookimpls():
            source = self._source(impl.plugin)
            for cls in impl.function() or []:
                if cls.name in found and found[cls.name][0] is not cls:
                    raise UserError(
                        f"two {kind} plugins are named {cls.name!r}: one from {found[cls.name][1]}, "
                        f"one from {source}; uninstall or rename one of them"
                    )
                found[cls.name] = (cls, source)
        return {name: cls for name, (cls, _) in sorted(found.items())}

    def get(self, kind: str, name: str) -> type:
        classes = self.classes(kind)
        if name not in classes:
            raise UserError(f"unknown {kind} {name!r}; known: {', '.join(classes) or '(none)'}")
        return classes[name]


@functools.lru_cache(maxsize=1)
def default_registry() -> Registry:
    return Registry()
