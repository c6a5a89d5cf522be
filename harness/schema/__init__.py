"""Configs that refuse nonsense: every group of a composed config checked before a point runs.

The schemas are pydantic models (kvbench.schema.groups), one per config group, or one per option
where options differ in their fields (workload kinds, scenarios, built-in plugins). pydantic rather
than Hydra structured configs, because one declaration carries the type, the range (> 0, [0, 1),
finite, whole, an upper bound), strict booleans and the unknown-key check together, and reports
every failure as data (key, value, rule) that becomes one line; OmegaConf types alone have no
ranges and take `yes` / `on` / `1` for a boolean. Hydra still parses and composes everything
(overrides, sweeps, interpolations, `+experiment=...`, `hydra.searchpath`); the schemas look at
the result, in every process a launcher starts.

Adding a field is one line in the group's model, e.g. in groups.PagedAllocator:

    placement: Literal["buddy", "first_fit"] = "buddy"

Adding a group is a `Section` subclass and one line in `Root` (a plain section such as
`report: Report = Report()`), or, for a group whose options differ, a model per option and one
line in `OPTION_GROUPS` below. A value a YAML sets but no schema knows is an error, so a new
YAML key and its schema line go in together. An allocator, backend or graph mode that is not
built in (a third-party plugin, its YAML shipped through `hydra.searchpath`) is checked against
its class's constructor: unknown options are refused with the ones it accepts.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import typing
from importlib import resources

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, TypeAdapter, ValidationError

from kvbench.arith import tensor_parallel_degrees
from kvbench.errors import UserError
from kvbench.schema import groups
from kvbench.schema.memory import DTYPE_BYTES, refuse_if_too_big
from kvbench.schema.messages import allowed, closest, rule, show, unknown_key, validation_line

# group -> (the key that picks the option's model, option -> model); the others have one model
OPTION_GROUPS = {
    "scenario": ("name", groups.SCENARIOS),
    "workload": ("kind", groups.WORKLOADS),
    "executor": ("name", groups.EXECUTORS),
}
SINGLE_GROUPS = {"model": groups.Model, "hardware": groups.Hardware}
PLUGIN_GROUPS = tuple(groups.PLUGINS)
# arguments the harness passes a plugin itself; never config options
HARNESS_ARGUMENTS = {"self", "num_slots", "max_model_len", "model", "forward", "device", "max_seq_len"}


# the experiments with a table of their own settings: Root's `dict | None` fields (fig12, ...)
EXPERIMENT_SECTIONS = tuple(name for name, field in groups.Root.model_fields.items() if field.annotation == dict | None)


@functools.cache
def experiment_keys(name: str) -> list[str]:
    """The settings conf/experiment/NAME.yaml gives its own section (fig13: rates, duration_s)."""
    import yaml

    path = resources.files("kvbench.conf") / "experiment" / f"{name}.yaml"
    section = (yaml.safe_load(path.read_text()) or {}).get(name) if path.is_file() else None
    return list(section) if isinstance(section, dict) else []


def top_level_keys() -> list[str]:
    return [*groups.Root.model_fields, *OPTION_GROUPS, *SINGLE_GROUPS, *PLUGIN_GROUPS]


def section_named(name: str) -> str | None:
    """`report.goodput` for `goodput`: the nested section of that name, if there is one."""
    for top, field in groups.Root.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel) and name in model.model_fields:
            return f"{top}.{name}"
    return None


def _check(model: type[BaseModel], data, group: str):
    try:
        return model.model_validate(data)
    except ValidationError as err:
        error = err.errors(include_url=False)[0]
        chooses = OPTION_GROUPS[group][0] if group in OPTION_GROUPS else "name" if group in groups.PLUGINS else None
        if chooses and error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
            elsewhere = elsewhere_line(group, str(error["loc"][0]), error.get("input"), data.get(chooses))
            if elsewhere:
                raise UserError(elsewhere) from None
        raise UserError(validation_line(err, group, model)) from None


@functools.cache
def experiments() -> dict[str, list[str]]:
    """`+experiment=NAME`'s names (conf/experiment/*.yaml), each with the keys of its own
    settings section (`fig12: {point, rates, duration_s}`; none for most)."""
    import yaml

    folder = resources.files("kvbench.conf").joinpath("experiment")
    found = {}
    for entry in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if entry.name.endswith(".yaml"):
            name = entry.name.removesuffix(".yaml")
            section = (yaml.safe_load(entry.read_text()) or {}).get(name)
            found[name] = list(section) if isinstance(section, dict) else []
    return found


def experiment_key_line(key: str) -> str | None:
    """For a key under an experiment's name (fig12.point, fig2.x): what is wrong with it; None for
    a key under anything else, or deeper than an experiment's own settings."""
    name, _, rest = key.partition(".")
    known = experiments()
    if name not in known or "." in rest:
        return None
    own = known[name]
    if not own:
        with_settings = [n for n, keys in known.items() if keys]
        return (
            f"{key}: +experiment={name} has no settings of its own (those with settings: "
            f"{', '.join(with_settings)}); the run's own keys (workload.*, seed, ...) apply to it"
        )
    if rest and rest in own:
        return f"{key} is a setting of +experiment={name}: choose the experiment too (+experiment={name} {key}=...)"
    return unknown_key(key, own, f"+experiment={name}'s settings")


def elsewhere_line(group: str, key: str, value, chosen: str | None = None) -> str | None:
    """For a key that the chosen option of `group` lacks but others have (workload.input_len on
    workload=sharegpt, allocator.prefix_caching on contiguous): which options have it, and how
    to choose one. None where every option has it (an option's config that leaves it unset:
    add it with +) or none does (a typo)."""
    plugin = group in groups.PLUGINS  # chosen with a + (+allocator=paged)
    options = groups.PLUGINS[group] if plugin else OPTION_GROUPS[group][1]
    owners = [
        name
        for name, model in options.items()
        if key in model.model_fields and getattr(model, "read_only_by", {}).get(key, name) == name
    ]
    if not owners or len(owners) == len(options):
        return None
    which = f"{group}={chosen}" if chosen else f"the chosen {group}"
    return (
        f"{group}.{key} is not a key of {which}; {' and '.join(f'{group}={o}' for o in owners)} "
        f"{'has' if len(owners) == 1 else 'have'} it: e.g. {'+' if plugin else ''}{group}={owners[0]} "
        f"{group}.{key}={show(value)}"
    )


def _option_model(group: str, node) -> type[BaseModel]:
    key, options = OPTION_GROUPS[group]
    if not isinstance(node, dict):
        raise UserError(f"{group}={show(node)}: choose a {group} config ({', '.join(options)})")
    choice = node.get(key)
    if not isinstance(choice, str) or choice not in options:  # [1] or {a: 1}: no name, and unhashable
        raise UserError(
            f"{group}.{key}={show(choice)} must be one of {', '.join(options)}{closest(str(choice), options)}"
        )
    return options[choice]


def _constructors(cls: type) -> list:
    """The constructors a plugin class's keywords reach: its own (or the one it inherits), and
    each base's further up while the one below passes **options on."""
    found = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            break
        found.append(init)
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            break
    return found


def accepted_options(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword options a plugin class's constructor accepts (with its bases' where it passes
    **options on to them), less the arguments kvbench itself gives."""
    accepted: dict[str, inspect.Parameter] = {}
    for init in _constructors(cls):
        for param in inspect.signature(init).parameters.values():
            if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD) and param.name not in HARNESS_ARGUMENTS:
                accepted.setdefault(param.name, param)
    return accepted


# what kvbench gives each kind's constructor, by keyword (allocators) or by position (graph modes)
GIVEN = {"allocator": ("num_slots", "max_model_len", "model"), "graph": ("forward", "device", "max_seq_len")}


def refuse_unfit_constructor(kind: str, cls: type) -> None:
    """A plugin whose constructor cannot take what kvbench gives it (build.py, graphs.base.build)
    is refused before it runs, not a TypeError mid-run."""
    inits = _constructors(cls)
    params = [p for init in inits[:1] for p in list(inspect.signature(init).parameters.values())[1:]]
    if kind == "graph":  # given by position
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            return
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        missing = list(GIVEN[kind][len(positional) :])
    elif any(p.kind is p.VAR_KEYWORD for p in params):
        return
    else:
        names = {p.name for p in params if p.kind is not p.VAR_POSITIONAL}
        missing = [name for name in GIVEN.get(kind, ()) if name not in names]
    if missing:
        given = ", ".join(GIVEN[kind])
        raise UserError(
            f"{kind} {cls.name}'s constructor takes no {', '.join(missing)}: kvbench builds a {kind} with "
            f"{given} (and its options as keywords); accept them, or **options"
        )


def _hints(cls: type) -> dict:
    hints = {}
    for init in reversed(_constructors(cls)):
        try:  # include_extras: Annotated[int, Field(ge=0)] keeps its range
            hints.update(typing.get_type_hints(init, include_extras=True))
        except Exception:  # an annotation that does not resolve only loses its type check
            pass
    return hints


def _base_type(hint):
    """int for Annotated[int, Field(ge=0)]: what the value must be, its ranges aside."""
    return typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint


def check_plugin_options(kind: str, cls: type, options: dict) -> dict:
    """A plugin kvbench has no schema for: its options must be its constructor's, of its types.
    Returns the options as the run should read them: a whole number given as a float for an int
    option as that int (`2e0` is 2, as for every int field of kvbench's own)."""
    refuse_unfit_constructor(kind, cls)
    accepted, hints = accepted_options(cls), _hints(cls)
    options = dict(options)
    for key, value in options.items():
        base = _base_type(hints.get(key))
        if base is int and type(value) is float and value.is_integer() and abs(value) <= 2**63:
            options[key] = value = int(value)
        if base is float and isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{kind}.{key}={show(value)} is not allowed: a float option is a finite number")
        if key not in accepted:
            raise UserError(
                f"{kind} {cls.name} has no option {key!r}{closest(key, accepted)} "
                f"(it accepts: {', '.join(accepted) or 'none'})"
            )
        hint = hints.get(key)
        if hint is not None:
            try:
                # strict for bool and int: the run passes the value as given, so '3' or true must
                # not pass for an int (a TypeError mid-run, or true recorded as a count)
                TypeAdapter(hint).validate_python(value, strict=base in (bool, int))
            except ValidationError as err:
                # '3' is text and 3.0 a float, where show() would write both as 3
                given = repr(value) if isinstance(value, (str, float)) and base not in (str, float) else show(value)
                raise UserError(rule(f"{kind}.{key}={given}", allowed(err.errors(include_url=False)[0]))) from None
            except Exception:  # an annotation pydantic cannot check (a protocol, a forward ref)
                pass
    return options


def _plugin(kind: str, node) -> dict:
    if not isinstance(node, dict) or not isinstance(node.get("name"), str):
        raise UserError(f"{kind}={show(node)}: choose a plugin with +{kind}=NAME (or give {kind}.name)")
    schema = groups.PLUGINS[kind].get(node["name"])
    if schema is not None:
        return _check(schema, node, kind).model_dump()
    from kvbench.registry import default_registry

    options = {k: v for k, v in node.items() if k != "name"}
    try:
        cls = default_registry().get(kind, node["name"])
    except UserError as err:
        raise UserError(f"{kind}.name={node['name']}: {err}") from None
    return {**node, **check_plugin_options(kind, cls, options)}


def missing_choice(cfg: DictConfig, err: OmegaConfBaseException) -> str | None:
    """`${a.b.${c}}` where `c`'s value is no key of a.b (an experiment's table read by a setting,
    +experiment=fig12 fig12.point=r9): which table lacks it, and the keys it has."""
    scalar = re.search(r"access ([\w.]+): node `([\w.]+)` is not a container", str(err))
    if scalar:  # fig12.duration_s=5: a table the config reads entries of, replaced by one value
        read, table = scalar[1], scalar[2]
        return (
            f"{table} is a table the config reads by key ({getattr(err, 'full_key', None) or 'a setting'} reads "
            f"{read}), not one value: set an entry, {read}=VALUE"
        )
    found = re.match(r"Interpolation key '([^']+)' not found", str(err))
    if not found or "." not in found[1]:
        return None
    parts = found[1].split(".")
    for depth in range(len(parts) - 1, 0, -1):  # the deepest table on the way that there is
        table, key = ".".join(parts[:depth]), parts[depth]
        node = OmegaConf.select(cfg, table, default=None, throw_on_resolution_failure=False)
        if isinstance(node, DictConfig):
            break
    else:
        return None
    return (
        f"{getattr(err, 'full_key', None) or 'the config'} reads {found[1]}, but {table} has no {key!r}: "
        f"its keys are {', '.join(map(str, node))}"
    )


def served_workload(data: dict):
    """The workload node as scenario=serve draws it (core.workload.served); any other
    scenario's as it is."""
    workload, scenario = data.get("workload"), data.get("scenario")
    if not (isinstance(workload, dict) and isinstance(scenario, dict) and scenario.get("name") == "serve"):
        return workload
    from kvbench.core.workload import served

    return served(workload, scenario.get("rate"), scenario.get("num_requests"))[0]


def validate(cfg: DictConfig | dict) -> dict:
    """Check a composed config; return its groups' validated models. Raises UserError (one line)."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    except OmegaConfBaseException as err:  # an interpolation that does not resolve
        from kvbench.schema.hydra_errors import hydra_line

        raise UserError(missing_choice(cfg, err) or hydra_line(err)) from None
    data.pop("hydra", None)
    known = top_level_keys()
    for key in data:
        if key not in known:
            section = section_named(key)
            if section is not None:
                raise UserError(f"{key} is not a section of the config; did you mean {section}?")
            nested = data[key] if isinstance(data[key], dict) else {}
            about_experiment = experiment_key_line(f"{key}.{next(iter(nested), '')}".rstrip("."))
            if about_experiment:
                raise UserError(about_experiment)
            raise UserError(unknown_key(key, known, "the config"))
    report = data.get("report")
    paper = report.get("paper") if isinstance(report, dict) else None  # a report=5: Root's check says
    for name in EXPERIMENT_SECTIONS:  # +fig12.point=r2 alone: settings nothing reads
        if isinstance(data.get(name), dict) and paper != name:  # (a value, not a section: Root's types)
            first = next(iter(data[name]), "KEY")
            raise UserError(
                f"{name}.{first} is a setting of +experiment={name}, which this run does not choose: "
                f"add +experiment={name}"
            )
    if paper in EXPERIMENT_SECTIONS and isinstance(data.get(paper), dict):  # +fig13.foo=1 became a column
        known_keys = experiment_keys(paper)
        unknown = next((k for k in data[paper] if known_keys and k not in known_keys), None)
        if unknown is not None:
            raise UserError(unknown_key(f"{paper}.{unknown}", known_keys, f"+experiment={paper}"))
    for group in (*SINGLE_GROUPS, *OPTION_GROUPS):
        if data.get(group) is None:
            raise UserError(f"{group} is required: choose one with {group}=NAME (bench --help lists them)")
    checked = {"root": _check(groups.Root, {k: v for k, v in data.items() if k in groups.Root.model_fields}, "")}
    for group, model in SINGLE_GROUPS.items():
        checked[group] = _check(model, data.get(group), group)
    for group in OPTION_GROUPS:
        node = served_workload(data) if group == "workload" else data[group]
        checked[group] = _check(_option_model(group, node), node, group)
    for kind in PLUGIN_GROUPS:
        if data.get(kind) is not None:
            checked[kind] = _plugin(kind, data[kind])
    workload, model = checked["workload"], checked["model"]
    if workload.prefix_len >= model.max_model_len:
        raise UserError(
            f"workload.prefix_len={workload.prefix_len} must be shorter than "
            f"max_model_len={model.max_model_len} (model.max_model_len)"
        )
    refuse_params_given_in_billions(checked)
    refuse_pool_beyond_the_gpu(checked)
    refuse_uneven_tensor_parallelism(checked)
    refuse_shapes_the_real_model_cannot_run(checked)
    refuse_if_too_big(
        checked["root"],
        model,
        checked["hardware"],
        workload,
        checked["scenario"],
        checked.get("allocator") or {},
        str((checked.get("backend") or {}).get("name", "eager")),
    )
    return checked


def refuse_params_given_in_billions(checked: dict) -> None:
    """A simulated model's num_params (its weights' bytes, so its KV pool, and its FLOPs) below a
    tenth of what its embeddings and attention projections alone hold: a count given in
    billions (num_params=13 for 13e9) left the whole GPU to the KV pool. A real model (serve,
    profile) counts its own weights, so its num_params is not read there (tiny's is nominal)."""
    model = checked["model"]
    if checked["scenario"].name != "simulate":
        return
    held = model.vocab_size * model.hidden_size
    held += model.num_layers * 2 * model.hidden_size * model.head_dim * (model.num_heads + model.num_kv_heads)
    if model.num_params < held / 10:
        raise UserError(
            f"model.num_params={model.num_params:g} is below a tenth of the {held:.3g} parameters its embeddings and "
            f"attention projections hold (vocab_size x hidden_size, and the layers' q, k, v and o): give the whole "
            f"count (13e9, not 13)"
        )


def settle_whole_numbers(cfg: DictConfig, checked: dict) -> None:
    """Write back as ints the whole numbers an int field was given as floats
    (`model.max_model_len=1e3`, `allocator.block_size=16.0`), and as numbers the numbers a number
    field was given as text (`model.max_model_len='2048'`): the schema took them so, and a run
    reads its config, not the schema's models."""

    def settle(node, value) -> None:
        pairs = value.items() if isinstance(node, DictConfig) else enumerate(value)
        for key, wanted in pairs:
            if isinstance(node, DictConfig) and key not in node:
                continue
            given = node[key]
            if isinstance(wanted, dict) and isinstance(given, DictConfig):
                settle(given, wanted)
            elif isinstance(wanted, list) and isinstance(given, ListConfig) and len(wanted) == len(given):
                settle(given, wanted)
            elif type(wanted) in (int, float) and isinstance(given, (float, str)) and type(given) is not type(wanted):
                node[key] = wanted  # 1e3 for an int, or a number quoted as text ('2048')

    for group, value in checked.items():
        node = cfg if group == "root" else cfg.get(group)
        dumped = value.model_dump() if isinstance(value, BaseModel) else value
        if isinstance(node, DictConfig) and isinstance(dumped, dict):
            settle(node, dumped)


def refuse_shapes_the_real_model_cannot_run(checked: dict) -> None:
    """What the real model (serve, profile, validate) and the kernel scenario cannot build."""
    scenario, model = checked["scenario"].name, checked["model"]
    allocator = (checked.get("allocator") or {}).get("name")
    if scenario in ("serve", "profile", "validate"):
        if model.head_dim % 2:
            raise UserError(
                f"model.head_dim={model.head_dim} must be even for scenario={scenario}: the real model's rotary "
                f"embedding turns pairs of dimensions"
            )
    graph = checked.get("graph") or {}
    limits = {"piecewise": "max_num_batched_tokens", "full": "max_num_seqs"}  # what a step's graph is sized by
    if graph.get("name") in limits and graph.get("capture_sizes"):
        knob = limits[graph["name"]]
        limit = getattr(checked["root"].scheduler, knob)
        if max(graph["capture_sizes"]) > limit:  # every step would be padded past what it can hold
            raise UserError(
                f"graph.capture_sizes={list(graph['capture_sizes'])} must stay <= scheduler.{knob}={limit}: "
                f"no step of graph={graph['name']} is larger, and a bigger graph pads every step to its size"
            )
    if scenario == "kernel" and allocator == "hybrid":
        raise UserError(
            "allocator=hybrid keeps a pool per layer kind; scenario=kernel times one attention layer's kernel on "
            "one block table: choose allocator=paged or contiguous (bench scenario=serve runs hybrid models whole)"
        )


def refuse_uneven_tensor_parallelism(checked: dict) -> None:
    """hardware.num_gpus is a tensor-parallel degree: each GPU takes an equal share of every
    layer's attention heads and of its K/V heads, so it must divide both numbers (vLLM refuses a
    degree that does not divide the heads; one above the K/V heads it serves by copying each K/V
    head onto several GPUs, which multiplies the KV a token takes and is not modelled here)."""
    hardware, model = checked["hardware"], checked["model"]
    g = hardware.num_gpus
    if g == 1 or checked["scenario"].name not in ("simulate", "serve", "validate"):  # where the profile is read
        return
    for count, what in ((model.num_heads, "attention heads"), (model.num_kv_heads, "K/V heads")):
        if count % g:
            divisors = tensor_parallel_degrees(model.num_heads, model.num_kv_heads)  # a degree divides both
            shown = ", ".join(map(str, divisors[:12])) + (", ..." if len(divisors) > 12 else "")
            copies = what == "K/V heads" and g > count
            copied = " (more GPUs than K/V heads would copy each one: not modelled)" if copies else ""
            raise UserError(
                f"hardware.num_gpus={g} is a tensor-parallel degree, and it does not divide "
                f"model={model.name}'s {count} {what} among its GPUs{copied}; give one that does: {shown}"
            )


def refuse_pool_beyond_the_gpu(checked: dict) -> None:
    """The roofline simulates the chosen GPUs: a KV pool they cannot hold beside the weights is
    a typo, not a setting (a calibrated executor's pool is the profiled device's, not theirs)."""
    kv_bytes, hardware, model = checked["root"].engine.kv_cache_bytes, checked["hardware"], checked["model"]
    if kv_bytes is None or checked["scenario"].name != "simulate" or checked["executor"].name != "roofline":
        return
    weights = model.num_params * DTYPE_BYTES[model.dtype]
    room = hardware.memory_bytes * hardware.num_gpus - weights
    if kv_bytes > room:
        raise UserError(
            f"engine.kv_cache_bytes={kv_bytes:g} is more than hardware={hardware.name} holds beside "
            f"model={model.name}'s weights: {hardware.num_gpus} x {hardware.memory_bytes:g} bytes less "
            f"{weights:g} leaves {max(room, 0):g}; lower it, or choose larger hardware (hardware.memory_bytes, "
            f"hardware.num_gpus)"
        )
