"""`bench --help`'s field list: every schema field with its type, its range and its one-line doc.

The doc of a field is the comment beside it in the YAML that sets it (docs/configs.md): the
chosen option's where the command line chose one, else the first found across the group's
options. A schema `Field(description=...)` comes first: it is given where the YAML comments
describe one option only.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from importlib import resources
from pathlib import Path

import annotated_types
from pydantic import BaseModel

from kvbench.schema import OPTION_GROUPS, PLUGIN_GROUPS, SINGLE_GROUPS, groups

_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<value>[^#]*?)(?:#\s*(?P<doc>.*))?$")
_BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", ">="),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "<="),
)


def yaml_docs(text: str, prefix: str = "") -> dict[str, str]:
    """dotted key -> the first line of the comment on its line, for one YAML file."""
    docs, path, last = {}, [], None  # path: (indent, key) of the enclosing mappings
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and last is not None and line.startswith("  "):
            docs[last] += " " + stripped.lstrip("#").strip()  # the comment goes on below its key
            continue
        last = None
        match = _LINE.match(line)
        if not match or stripped.startswith("-"):
            continue
        indent = len(match["indent"])
        while path and path[-1][0] >= indent:
            path.pop()
        key = ".".join([prefix, *(k for _, k in path), match["key"]]).lstrip(".")
        if match["doc"] and key not in docs:
            docs[key], last = match["doc"].strip(), key
        if not match["value"].strip():
            path.append((indent, match["key"]))
    return docs


@functools.cache
def option_docs(group: str, option: str) -> dict[str, str]:
    """The YAML comments of one option of a group (conf/workload/trace.yaml's for workload=trace)."""
    return _docs_in(resources.files("kvbench.conf"), group, option)


def _docs_in(root, group: str, option: str) -> dict[str, str]:
    """The YAML comments of `root`/group/option.yaml; none where there is no such file."""
    path = root / group / f"{option}.yaml"
    return yaml_docs(path.read_text(), group) if path.is_file() else {}


@functools.lru_cache(maxsize=1)
def all_docs() -> dict[str, str]:
    conf = resources.files("kvbench.conf")
    docs = yaml_docs((conf / "bench.yaml").read_text().split("\nhydra:")[0])
    for folder in sorted(conf.iterdir(), key=lambda p: p.name):
        if folder.is_dir() and not folder.name.startswith("_"):
            for option in sorted(folder.iterdir(), key=lambda p: p.name):
                if option.name.endswith(".yaml"):
                    for key, doc in yaml_docs(option.read_text(), folder.name).items():
                        docs.setdefault(key, doc)
    return docs


def _type_name(annotation) -> str:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return "|".join(str(a) for a in args)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # Union[a, b] or a | b
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names + ["null"] * (type(None) in args))
    if typing.get_origin(annotation) is typing.Annotated:
        return _type_name(args[0])
    if typing.get_origin(annotation) is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    known = {bool: "bool", int: "int", float: "float", str: "str", typing.Any: "any"}
    return known.get(annotation, getattr(annotation, "__name__", "?"))


def constraints(field) -> list:
    """A field's constraint objects, its own and those inside its (Optional / Annotated) type."""
    found, todo = list(field.metadata), [field.annotation]
    while any(hasattr(m, "metadata") for m in found):  # a Field() inside Annotated carries its own
        found = [inner for m in found for inner in (m.metadata if hasattr(m, "metadata") else [m])]
    while todo:
        annotation = todo.pop()
        if typing.get_origin(annotation) is typing.Annotated:
            for m in annotation.__metadata__:
                found += list(m.metadata) if hasattr(m, "metadata") else [m]
            todo.append(typing.get_args(annotation)[0])
        elif typing.get_origin(annotation) in (typing.Union, types.UnionType):
            todo += list(typing.get_args(annotation))
    return found


def allows_inf(field) -> bool:
    return any(getattr(m, "allow_inf_nan", False) for m in constraints(field))


def _bound(value) -> str:
    """A bound in six digits (1e+06), or exact where a user may type it (seed's 4294967294, not
    4.29497e+09); a byte count's 2**50 stays 1.1259e+15."""
    short = f"{value:g}"
    return str(value) if isinstance(value, int) and float(short) != value and abs(value) < 1e10 else short


def describe(field) -> str:
    bounds = [
        f"{sign} {_bound(getattr(m, attr))}"
        for m in constraints(field)
        for kind, attr, sign in _BOUNDS
        if isinstance(m, kind)
    ]
    finite = "inf ok" if allows_inf(field) else ""
    return ", ".join(part for part in [_type_name(field.annotation), *bounds, finite] if part)


def fields(prefix: str, model: type[BaseModel]):
    """(dotted key, field) for every leaf field of a model, nested models flattened."""
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from fields(key, field.annotation)
        else:
            yield key, field


def schema_fields():
    """Every settable key of every group (options' fields merged), in help order."""
    sections = [("", groups.Root)]
    sections += [(g, m) for g, m in SINGLE_GROUPS.items()]
    sections += [(g, m) for g, (_, options) in OPTION_GROUPS.items() for m in dict.fromkeys(options.values())]
    sections += [(g, m) for g in PLUGIN_GROUPS for m in dict.fromkeys(groups.PLUGINS[g].values())]
    seen: dict[str, list] = {}
    for prefix, model in sections:
        for key, field in fields(prefix, model):
            seen.setdefault(key, []).append(field)
    return seen


def describe_all(same_key: list) -> str:
    """One key's type across the options that have it (the options' names, for a choice key)."""
    choices = [
        a for f in same_key if typing.get_origin(f.annotation) is typing.Literal for a in typing.get_args(f.annotation)
    ]
    if len(choices) == sum(len(typing.get_args(f.annotation)) for f in same_key) and choices:
        return "|".join(dict.fromkeys(str(c) for c in choices))
    return describe(same_key[0])


def doc_of(key: str, same_key: list, chosen: dict[str, str] | None = None) -> str:
    """The schema's description (kept for fields whose YAML comments are about one option), else
    the YAML comment of the option chosen (`chosen`: its docs), else the first one found."""
    return (
        next((f.description for f in same_key if f.description), None)
        or (chosen or {}).get(key)
        or all_docs().get(key)
        or ""
    )


def help_text(choices=None, plugins=None, searchpath=()) -> str:
    """The field list; `choices` (group -> option, Hydra's runtime choices) makes the options a
    command line chose document their own keys (`bench --help workload=trace`: a trace's rate).
    `plugins` (group -> the name of the plugin chosen) adds the options of one from another
    package that kvbench's own have not, typed and ranged by its constructor and documented by
    its YAML on `searchpath`."""
    chosen: dict[str, str] = {}
    for group, option in (choices or {}).items():
        if "/" not in str(group) and option is not None:  # hydra/launcher and the like are Hydra's
            chosen.update(option_docs(str(group), str(option)) or searchpath_docs(searchpath, str(group), str(option)))
    lines, known = [], schema_fields()
    for key, same_key in known.items():
        lines.append(f"  {key:<36} {describe_all(same_key):<30}  {doc_of(key, same_key, chosen)}".rstrip())
    for group, name in (plugins or {}).items():
        for key, field in plugin_fields(group, name):
            if key in known:  # block_size and the like, which a plugin inherits from kvbench's own
                continue
            doc = chosen.get(key) or f"an option of {group} {name} (its constructor's)"
            lines.append(f"  {key:<36} {describe(field):<30}  {doc}".rstrip())
    return "\n".join(lines).replace("$", "$$")


def plugin_fields(group: str, name: str):
    """(dotted key, field) for each option of a plugin from another package: its constructor's
    keywords, with the type and range their annotations give; none for an unknown name."""
    from pydantic.fields import FieldInfo

    from kvbench.registry import default_registry
    from kvbench.schema import _hints, accepted_options

    cls = default_registry().classes(group).get(name)
    if cls is None:
        return
    hints = _hints(cls)
    for key, param in accepted_options(cls).items():
        default = None if param.default is param.empty else param.default
        # unannotated, it takes any value (check_plugin_options checks no type it is not given)
        yield f"{group}.{key}", FieldInfo.from_annotated_attribute(hints.get(key, typing.Any), default)


def searchpath_docs(searchpath, group: str, option: str) -> dict[str, str]:
    """The YAML comments of an option found on hydra.searchpath (pkg://package.conf or
    file:///folder), where a plugin from another package ships its config."""
    for entry in searchpath or ():
        scheme, _, where = str(entry).partition("://")
        try:
            root = resources.files(where) if scheme == "pkg" else Path(where)
        except (ImportError, ValueError):  # bench itself names a searchpath that does not import
            continue
        found = _docs_in(root, group, option)
        if found:
            return found
    return {}


def groups_text(searchpath) -> str:
    """Each config group with its options, one line each, those on hydra.searchpath included
    (Hydra's $APP_CONFIG_GROUPS lists the search path it started with, without them)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    loader = GlobalHydra.instance().config_loader()
    overrides = [f"hydra.searchpath=[{','.join(repr(str(e)) for e in searchpath)}]"] if searchpath else []
    names = loader.get_group_options("", ObjectType.GROUP, overrides=overrides)
    lines = []
    for group in sorted(name for name in names if name != "hydra"):
        options = loader.get_group_options(group, ObjectType.CONFIG, overrides=overrides)
        if options:
            lines.append(f"{group}: {', '.join(sorted(options))}")
    return "\n".join(lines).replace("$", "$$")
