"""Hydra's and OmegaConf's errors (a bad override, an unknown option or key) as kvbench's one line."""

from __future__ import annotations

import re

from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel

from kvbench.schema import (
    EXPERIMENT_SECTIONS,
    OPTION_GROUPS,
    SINGLE_GROUPS,
    elsewhere_line,
    experiment_key_line,
    groups,
    section_named,
    top_level_keys,
)
from kvbench.schema.messages import closest, section_model, unknown_key

LAUNCHERS = (
    " (submitit_local and submitit_slurm come with pip install 'kvbench[slurm]', ray with pip install 'kvbench[ray]')"
)
GRAMMAR = "key=value, -m key=1,2,3, key=range(1,4), +key=value (add), ~key (delete)"


def group_fields(group: str) -> list[str]:
    """Every key any option of a top-level group has, for suggestions."""
    if group in SINGLE_GROUPS:
        models = [SINGLE_GROUPS[group]]
    elif group in OPTION_GROUPS:
        models = list(OPTION_GROUPS[group][1].values())
    elif group in groups.PLUGINS:
        models = list(groups.PLUGINS[group].values())
    else:
        field = groups.Root.model_fields.get(group)
        models = [field.annotation] if field is not None and hasattr(field.annotation, "model_fields") else []
    return list(dict.fromkeys(name for model in models for name in model.model_fields))


def _first(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def parse_reason(err: OverrideParseException) -> str:
    """What the override grammar's parser (ANTLR) found, in words: its list of the grammar's
    token names (ID, ESC, WS, ...) dropped, the end of the text and a bad character named so."""
    skipped = ("Error parsing override", "See ")  # the override again, and Hydra's link to its grammar
    reason = next((line.strip() for line in str(err).splitlines() if line.strip() and not line.startswith(skipped)), "")
    if reason.startswith("LexerNoViableAltException"):
        return "a quote left open, or a character the grammar does not allow"
    reason = re.sub(r" expecting \{[^}]*\}", "", reason).replace(" expecting <EOF>", "")
    reason = reason.replace("mismatched input '<EOF>'", "it ends where a value was expected")
    reason = reason.replace("no viable alternative at input", "cannot read")
    return reason.replace("mismatched input", "unexpected").replace("extraneous input", "unexpected")


def _nested(group: str, rest: str) -> tuple[str, list[str]] | None:
    """For `group.section.key` inside a top-level section (report.goodput.x): the innermost section
    that exists and its keys; None when the key is not below a nested section."""
    field = groups.Root.model_fields.get(group)
    model, where = (field.annotation if field is not None else None), group
    for part in rest.split(".")[:-1]:
        inner = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if inner is None or not (isinstance(inner.annotation, type) and issubclass(inner.annotation, BaseModel)):
            break
        model, where = inner.annotation, f"{where}.{part}"
    return (where, list(model.model_fields)) if where != group else None


def _option_section_key(group: str, rest: str, add: str, missing: str) -> str | None:
    """For `group.section.key` where `section` is a table of some options of an option group
    (scenario.profiling on scenario=validate): which options have the section when the chosen one
    lacks it (`missing` is the key Hydra could not find), else the section's own keys."""
    head, _, tail = rest.partition(".")
    options = OPTION_GROUPS[group][1]
    owners = {name: model.model_fields[head] for name, model in options.items() if head in model.model_fields}
    sections = [m for m in (section_model(f.annotation) for f in owners.values()) if m is not None]
    if not sections:
        return None
    where = f"{group}.{head}"
    while "." in tail:  # scenario.serve.sampling.temperature: the innermost section named
        part, _, rest_of = tail.partition(".")
        inner = [section_model(m.model_fields[part].annotation) for m in sections if part in m.model_fields]
        if not any(inner):
            break
        sections, where, tail = [m for m in inner if m is not None], f"{where}.{part}", rest_of
    if missing == head:  # the chosen option has no such section
        value = add.partition("=")[2] or "VALUE"
        return (
            f"{where} is not a key of the chosen {group}; {' and '.join(f'{group}={o}' for o in owners)} "
            f"{'has' if len(owners) == 1 else 'have'} it: e.g. {group}={next(iter(owners))} "
            f"+{group}.{rest}={value}"
        )
    fields = list(dict.fromkeys(name for model in sections for name in model.model_fields))
    if "." not in tail and tail in fields:
        how = add or f"+{group}.{rest}=VALUE"
        return f"{group}.{rest} is a {where} key that this config does not set: add it with {how}"
    return unknown_key(f"{group}.{rest}", fields, where)


def _unknown_key(full_key: str, add: str = "", chosen: bool = False, missing: str = "") -> str:
    """`chosen`: the key's group has a node (a plugin group: one is chosen) and lacks the key;
    `missing`: the key Hydra could not find, where it says (the last part of a dotted key or
    a section above it)."""
    group, _, rest = full_key.partition(".")
    if group == "hydra" and rest:  # hydra.launcher.foo: Hydra's own config, not kvbench's
        parent = full_key.rsplit(".", 1)[0]
        choice = next((g for g in ("launcher", "sweeper") if rest.startswith(g + ".")), None)
        chosen = f" (a {choice}'s options come with its choice, hydra/{choice}=NAME)" if choice else ""
        listed = f"bench --cfg hydra -p {parent} lists those it has{chosen}"
        return f"{full_key} is not a setting of Hydra's config: {listed}"
    if not rest and full_key in EXPERIMENT_SECTIONS:  # fig12=...: the table of an experiment not chosen
        return (
            f"{full_key} is the table of +experiment={full_key}'s settings: choose the experiment "
            f"(+experiment={full_key}) and set its keys, {full_key}.KEY=VALUE"
        )
    if not rest:
        from kvbench.schema.docs import schema_fields

        owners = [field for field in schema_fields() if field.endswith(f".{full_key}") and field.count(".") == 1]
        if owners:  # prefix_caching=true: a section's key, given without its section
            return f"{full_key} is not a key of the config; did you mean {' or '.join(owners)}?"
        return unknown_key(full_key, top_level_keys(), "the config")
    about_experiment = experiment_key_line(full_key)
    if about_experiment:
        return about_experiment
    if group not in top_level_keys():  # goodput.ttft_ms: the section is what is unknown
        section = section_named(group)
        if section is not None:
            return f"{group} is not a section of the config; did you mean {section}.{rest}?"
        return unknown_key(group, top_level_keys(), "the config")
    nested = _nested(group, rest)
    if nested is not None and rest.rsplit(".", 1)[-1] in nested[1]:
        return (
            f"{full_key} is a {nested[0]} key that this config does not set: add it with "
            f"{add or '+' + full_key + '=VALUE'}"
        )
    if nested is not None:
        return unknown_key(full_key, nested[1], nested[0])
    if group in OPTION_GROUPS and "." in rest:  # scenario.profiling.repeats: a section some options have
        line = _option_section_key(group, rest, add, missing)
        if line:
            return line
    if group in groups.PLUGINS and rest in group_fields(group):
        if chosen:  # a plugin is chosen, and its config lacks the key: others have it, or it may add it
            return elsewhere_line(group, rest, add.partition("=")[2] or "VALUE") or (
                f"{full_key} is a {group} key that the chosen {group}'s config does not set: add it with "
                f"{add or '+' + full_key + '=VALUE'}"
            )
        return f"{full_key} is an option of a plugin, and no {group} is chosen: add +{group}=NAME first"
    if group in OPTION_GROUPS and "." not in rest:  # a key of other options only
        elsewhere = elsewhere_line(group, rest, add.partition("=")[2] or "VALUE")
        if elsewhere:
            return elsewhere
    if rest in group_fields(group):
        how = add or f"+{full_key}=VALUE"
        return f"{full_key} is a {group} key that this {group} config does not set: add it with {how}"
    owners = _outside_owners(group, rest) if group in groups.PLUGINS and "." not in rest else []
    if owners:  # -m +allocator=paged,mine allocator.spare_blocks=4: paged's point has no such key
        return (
            f"{full_key} is an option of {' and '.join(f'{group}={o}' for o in owners)} (a plugin from another "
            f"package), not of every {group} chosen here: set it in a sweep that chooses only {owners[0]}"
        )
    return unknown_key(full_key, group_fields(group), group)


def _outside_owners(group: str, key: str) -> list[str]:
    """The plugins from other packages whose constructor takes `key` (kvbench's schema knows
    only its own plugins' keys)."""
    import inspect

    from kvbench.registry import default_registry, from_outside

    owners = []
    try:
        found = default_registry().classes(group)
    except Exception:  # noqa: BLE001 (two plugins of one name: the run says so in its own words)
        return []
    for name, cls in found.items():
        if not from_outside(cls):
            continue
        try:
            if key in inspect.signature(cls).parameters:
                owners.append(name)
        except (TypeError, ValueError):  # no signature to read
            continue
    return owners


def _third_party_plugin_key(key: str, cause) -> str | None:
    """`allocator.spare_block=3` where the chosen allocator is a plugin kvbench has no schema for:
    the keys its own YAML sets, not kvbench's allocators' (OmegaConf's error holds the node)."""
    group, _, option = key.partition(".")
    node = getattr(cause, "parent_node", None)
    name = node.get("name") if isinstance(node, DictConfig) else None
    if group not in groups.PLUGINS or not isinstance(name, str) or name in groups.PLUGINS[group] or "." in option:
        return None
    keys = [str(k) for k in node]
    near = closest(option, keys)  # a typo's likely key first: adding the typo with + is the other way
    return (
        f"{key} is not a key of {group}={name}'s config{near} (its keys: {', '.join(keys)}; an option its "
        f"constructor takes beyond them is added with +{key}=VALUE)"
    )


def _installed_without_config(group: str, option: str) -> str | None:
    """`+allocator=mine` where a plugin package registers `mine` but no conf/allocator/mine.yaml is
    on Hydra's search path (the package ships none, or its path is not given): how to choose it."""
    from kvbench.registry import KINDS, default_registry

    if group not in KINDS:
        return None
    try:
        registered = option in default_registry().classes(group)
    except Exception:  # a broken package: the run's own check of the registry says so
        return None
    if not registered:
        return None
    return (
        f"{group} {option!r} is installed, but no {group}/{option}.yaml is on the config search path: choose "
        f"it with +{group}.name={option} (its options as +{group}.KEY=VALUE), or give the package's config "
        f"folder: hydra.searchpath=[pkg://PACKAGE.conf]"
    )


def hydra_line(err: BaseException) -> str | None:
    """One line for an error Hydra or OmegaConf raised while composing; None if it is neither's."""
    if isinstance(err, OverrideParseException):
        override = f" {err.override!r}" if getattr(err, "override", None) else ""
        return f"cannot parse the override{override}: {parse_reason(err)}; overrides are {GRAMMAR}"
    if isinstance(err, MissingConfigException):
        missing = str(err.missing_cfg_file or "")
        group, _, option = missing.rpartition("/")
        if "//" in missing:  # model=/etc/passwd: a path where an option's name goes
            group, _, option = missing.partition("//")
            option = "/" + option
            return (
                f"{group}={option} names a file, but a {group} is chosen by the name of one of its configs: "
                f"{', '.join(sorted(err.options or []))} (a plugin's own: hydra.searchpath)"
            )
        if err.options:
            installed = _installed_without_config(group, option)
            if installed:
                return installed
            return (
                f"unknown {group} {option!r}{closest(option, err.options)}; known: "
                f"{', '.join(sorted(err.options))}{LAUNCHERS if group == 'hydra/launcher' else ''}"
            )
        if missing and "/" not in missing:  # --config-name foo: a primary config, not a group's option
            from kvbench.schema import OPTION_GROUPS, PLUGIN_GROUPS, SINGLE_GROUPS

            chosen = sorted({*OPTION_GROUPS, *PLUGIN_GROUPS, *SINGLE_GROUPS})
            return (
                f"cannot find the config {missing}: bench has one, bench (--config-name bench, the default); "
                f"choose its groups' options instead, GROUP=NAME ({', '.join(chosen)}), or +experiment=NAME "
                f"(bench --help lists them)"
            )
        return f"cannot find the config {missing or _first(err)}; known groups: {', '.join(top_level_keys())}"
    if "does not support sweep type" in str(err):
        return (
            f"{_first(err)}: the basic sweeper takes lists, range(), choice() and glob(); interval() "
            f"needs a sampling sweeper plugin (hydra/sweeper=...)"
        )
    cause = err.__cause__ or err.__context__
    if isinstance(err, ConfigCompositionException):
        message = str(err)
        if message.startswith("Could not override '"):
            key, add = message.split("'")[1], message.rsplit("use ", 1)[-1].strip()
            if not key:  # `=alpaca`
                return "an override has no key (=VALUE): write KEY=VALUE"
            if "No match in the defaults list" in message:  # allocator=paged: a group no default chooses
                return f"{key} has no default to change: add the group with a + ({add})"
            group = key.split(".", 1)[0]
            third_party = _third_party_plugin_key(key, cause)
            if third_party:
                return third_party
            chosen = cause is not None and f"Key '{group}' is not in struct" not in str(cause)
            missing = str(cause).split("Key '", 1)[-1].split("'", 1)[0] if cause is not None else ""
            if "={" in add and missing and missing not in key.split("."):  # KEY={a:1}: a is what is unknown
                inner = str(getattr(cause, "full_key", "") or "")  # KEY={a:{b:1}}: OmegaConf's KEY.a.b
                return _unknown_key(inner if inner.startswith(f"{key}.") else f"{key}.{missing}", "", chosen, missing)
            return _unknown_key(key, add, chosen, missing)
        deleted = re.match(r"Could not delete '([^']+)'\. No match in the defaults list", message)
        if deleted:  # `~allocator` where no +allocator=NAME chose one
            return (
                f"~{deleted[1]} removes a group's choice, but this config chooses no {deleted[1]}: drop it "
                f"(bench --help lists each group's default)"
            )
        if message.startswith("Ambiguous value for argument"):
            return (
                f"{_first(message).removeprefix('Ambiguous value for argument ').rstrip()} has several "
                f"values: add -m to sweep over them, or write [a,b] for a list"
            )
        multiple = re.match(r"Multiple values for (\S+)\. To override a value use 'override \S+: (\S+)'", message)
        if multiple:  # Hydra's hint is a defaults-list line, not what a command line writes
            group, option = multiple.groups()
            return (
                f"{group} is already chosen by the config (an experiment or preset picks it): write "
                f"{group}={option} (without +) to choose another"
            )
        if "An item is already at" in message:
            key = message.split("An item is already at '")[-1].split("'")[0]
            return f"{key} is already in the config: write {key}=VALUE (without +) to change it"
        return " ".join([_first(message), _first(cause) if cause else ""]).strip()
    if isinstance(err, OmegaConfBaseException):
        full_key = getattr(err, "full_key", None)
        return f"{full_key}: {_first(err)}" if full_key else _first(err)
    if isinstance(err, HydraException):
        return " ".join([_first(err), _first(cause) if cause else ""]).strip()
    if _raised_importing_a_search_path(err):  # pkg://its.conf: importing the package raised
        return (
            f"a package of hydra.searchpath cannot be imported ({type(err).__name__}: {_first(err)}); "
            f"fix it, or drop it from hydra.searchpath"
        )
    if isinstance(err, ValueError) and _raised_in_hydra(err):  # a value Hydra's parser took but cannot use
        message = str(err)
        if message.startswith("range() arg 3 must not be zero"):
            return "range(start, stop, step) needs a step other than 0"
        if message.startswith("Config group override must be a string"):
            return "an override has no key (=VALUE): write KEY=VALUE"
        return f"cannot use the overrides: {_first(err)}"
    return None


def sweeper_params_line(err: BaseException, keys: list[str]) -> str | None:
    """One line where an override set a key inside `hydra.sweeper.params` of a config that leaves
    it null (every config but an experiment's): Hydra and OmegaConf then fail with an assertion or
    an attribute error, not a message. None where no override's key (`keys`) names it."""
    if not any(key == "hydra.sweeper.params" or key.startswith("hydra.sweeper.params.") for key in keys):
        return None
    if "NoneType" not in f"{err} {err.__cause__ or err.__context__ or ''}":  # not the null params
        return None
    return (
        "hydra.sweeper.params is empty (null) unless an experiment sets it (+experiment=fig2 ...): "
        "give the sweep on the command line instead, e.g. bench -m seed=0,1"
    )


def _raised_importing_a_search_path(err: BaseException) -> bool:
    """Whether `err` came out of an import Hydra's search path made (importlib_resources_config_source)."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith("importlib_resources_config_source.py"):
            return True
        tb = tb.tb_next
    return False


def _raised_in_hydra(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and "/hydra/" in tb.tb_frame.f_code.co_filename.replace("\\", "/")
