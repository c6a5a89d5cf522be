"""Plugin registry over pluggy: finds every allocator, backend and graph mode by name.

Built-ins and third-party plugins arrive the same way, through the `kvbench` entry-point group;
`register()` adds a module or object at run time (tests, notebooks). Names are unique across
all sources: a duplicate is an error naming both.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import pluggy

from kvbench import hookspecs
from kvbench.errors import UserError

KINDS = {
    "allocator": "kvbench_allocators",
    "backend": "kvbench_backends",
    "graph": "kvbench_graph_modes",
}
# the class every plugin of a kind extends (module, name): its contract (docs/design.md)
BASES = {
    "allocator": ("kvbench.plugins.allocators.base", "KVAllocator"),
    "backend": ("kvbench.plugins.backends.base", "AttentionBackend"),
    "graph": ("kvbench.plugins.graphs.base", "GraphMode"),
}


class Registry:
    def __init__(self, load_entry_points: bool = True):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        if load_entry_points:
            try:
                self.pm.load_setuptools_entrypoints(hookspecs.PROJECT)
            except Exception as err:  # noqa: BLE001 (an installed plugin that fails to import)
                raise UserError(f"{_broken_entry_point()}: {type(err).__name__}: {err}; fix or uninstall it") from None
            self.check_hooks()

    def check_hooks(self) -> None:
        """A hook whose name kvbench has none of (`kvbench_allocator`) would be ignored in silence."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as err:
            raise UserError(
                f"the kvbench plugin {self.pm.get_name(err.plugin)} defines a hook kvbench has not "
                f"({str(err).splitlines()[0]}); kvbench's hooks: {', '.join(KINDS.values())}"
            ) from None

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
            where = f"the {kind} plugin from {source} ({KINDS[kind]})"
            try:
                given = impl.function()
            except Exception as err:  # noqa: BLE001 (a third party's hook: say whose, in one line)
                raise UserError(f"{where} failed: {type(err).__name__}: {err}; fix or uninstall it") from None
            if given is not None and not isinstance(given, (list, tuple)):
                raise UserError(f"{where} returned {given!r}; the hook returns a list of classes")
            for cls in given or []:
                _check_named(cls, kind, where)
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
        _check_contract(classes[name], kind)
        return classes[name]


def _check_named(cls, kind: str, where: str) -> None:
    """A class the hook gave, with a name: what every lookup of the kind relies on."""
    if not isinstance(cls, type):
        raise UserError(f"{where} returned {cls!r}, not a class; the hook returns a list of classes")
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise UserError(
            f"{where}: {cls.__qualname__}.name is {getattr(cls, 'name', None)!r}; a {kind} is named by a str"
        )


def _check_contract(cls: type, kind: str) -> None:
    """The class a run chose: a subclass of its kind's base with nothing abstract left (checked
    when chosen, so that one unfinished plugin of a package does not stop runs of the others)."""
    base = getattr(importlib.import_module(BASES[kind][0]), BASES[kind][1])
    if not issubclass(cls, base):
        raise UserError(f"{kind} {cls.name!r} ({cls.__module__}.{cls.__qualname__}) does not extend {base.__name__}")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise UserError(f"{kind} {cls.name!r} ({cls.__module__}) does not implement {missing} (see {base.__name__})")
    if kind == "allocator":  # what the executors read of the layout it declares
        layout = getattr(cls, "layout", None)
        reads = {"paged": "block_table", "contiguous": "slot_start"}
        if layout not in reads:
            raise UserError(
                f"allocator {cls.name!r} ({cls.__module__}) has layout {layout!r}; a layout is 'paged' "
                f"(block tables, read by block_table(seq)) or 'contiguous' (a slot range, read by slot_start(seq))"
            )
        if not callable(getattr(cls, reads[layout], None)):
            raise UserError(
                f"allocator {cls.name!r} ({cls.__module__}) has a {layout} layout but no {reads[layout]}(seq), "
                f"which a real run reads it by (see KVAllocator)"
            )


def _broken_entry_point() -> str:
    """Which `kvbench` entry point fails to load, as `package (name = value)`."""
    from importlib import metadata

    for entry in metadata.entry_points(group=hookspecs.PROJECT):
        try:
            entry.load()
        except Exception:  # noqa: BLE001
            dist = getattr(entry, "dist", None)
            return f"the kvbench plugin {dist.name if dist else '?'} ({entry.name} = {entry.value}) cannot be loaded"
    return "a kvbench plugin cannot be loaded"


def from_outside(cls: type) -> bool:
    """Whether a plugin class comes from a package other than kvbench (whose own plugins its
    schema, version and git sha name already)."""
    return cls.__module__.split(".")[0] != "kvbench"


@functools.lru_cache(maxsize=1)
def default_registry() -> Registry:
    return Registry()
