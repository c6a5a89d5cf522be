"""The command line's overrides as Hydra parses them, and those refused before Hydra composes:
a group chosen as null, a number past a float's range, an empty path, a range of no values, a
key deleted that every run reads, a key given twice. Each would otherwise run another sweep
than the one asked for, or fail in Hydra's words."""

from __future__ import annotations

import functools
import math
import re
from importlib import resources
from pathlib import Path

from omegaconf import OmegaConf

from kvbench import schema
from kvbench.errors import UserError


def split_override(item: str) -> tuple[str, str]:
    """`+key=value`, `~key` or `key=value` as (key, value)."""
    key, _, value = item.lstrip("+~").partition("=")
    return key, value


def is_group(key: str) -> bool:
    return (
        "." not in key
        and "/" not in key
        and key != "hydra"
        and ((resources.files("kvbench.conf") / key).is_dir() or key in schema.PLUGIN_GROUPS)
    )


def parse_overrides(items) -> list:
    """`items` as Hydra's parser reads overrides; [] where one does not parse (Hydra says why
    in its own words when it composes)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(list(items))
    except Exception:  # noqa: BLE001
        return []


def override_values(item: str) -> list:
    """The values an override gives, as Hydra parses them (each of a sweep's)."""
    parsed = parse_overrides([item])
    value = parsed[0].value() if parsed else []
    return list(getattr(value, "list", None) or [value]) if not isinstance(value, list) else [value]


def sweeps(*overrides: str) -> bool:
    """Whether any of `overrides` sweeps a list of values (a,b / range() / glob() ...)."""
    return any(o.is_sweep_override() for o in parse_overrides(overrides))


def task_overrides(config) -> list[str]:
    """A saved sweep config's command line (hydra.overrides.task) as it was typed: an override
    that holds an interpolation (`seed=${hydra:job.num}`) stays text, where reading it would
    resolve it without the point it belongs to."""
    node = OmegaConf.select(config, "hydra.overrides.task", default=None)
    return [str(item) for item in OmegaConf.to_container(node, resolve=False)] if node is not None else []


@functools.lru_cache(maxsize=1)
def run_mode_keys() -> tuple[str, ...]:
    """The keys that change how a point runs or is reported, not what it measures: the packaged
    conf/bench.yaml's override_dirname.exclude_keys, before a command line extends them."""
    packaged = OmegaConf.load(str(resources.files("kvbench.conf") / "bench.yaml"))
    return tuple(packaged.hydra.job.config.override_dirname.exclude_keys)


def refuse_deleted_keys(overrides: list[str]) -> None:
    """`~key` deletes a key or section that every run reads (a group's choice may go: `~allocator`).
    Checked before Hydra composes: a key whose value is null it would call missing."""
    deleted = [item for item in overrides if item.startswith("~")]
    if not deleted:
        return
    from kvbench.schema.docs import schema_fields

    read = schema_fields()
    for item in deleted:
        key = split_override(item)[0]
        setting = (o for o in overrides if not o.startswith("~") and split_override(o)[0].startswith(f"{key}."))
        inside = next(setting, None)
        if inside is not None:  # `~workload workload.num_requests=20`: Hydra's line would say to add it with +
            raise UserError(f"{inside} sets a key of {key}, which {item} deletes: drop one of them")
        if "/" in key or is_group(key):  # a group's choice (hydra/launcher, allocator) may go
            continue
        if key in read:
            raise UserError(f"{item} deletes a key every run reads: set it instead ({key}=VALUE)")
        if any(field.startswith(f"{key}.") for field in read):
            raise UserError(f"{item} deletes a section every run reads: set its keys instead ({key}.KEY=VALUE)")


def refuse_empty_ranges(overrides: list[str]) -> None:
    """`-m seed=range(0,0)`: a sweep of no points, refused before Hydra launches it (it would
    announce 0 jobs and leave a sweep folder behind)."""
    from hydra.core.override_parser.types import RangeSweep

    for override in parse_overrides(overrides):
        value = override.value()
        if not isinstance(value, RangeSweep) or value.step == 0:  # a step of 0: Hydra's own line says so
            continue
        if next(override.sweep_iterator(), None) is None:
            raise UserError(
                f"{override.input_line} gives no value (range(start, stop, step) stops before it starts): "
                f"the sweep would have no points"
            )


def refuse_unusable_hydra_paths(overrides: list[str]) -> None:
    """`hydra.run.dir=''` wrote a run's files into the current folder; a search path that names
    no folder or package was a multi-line warning, then "unknown allocator" for its plugin."""
    import importlib.util

    for item in overrides:
        key, value = split_override(item)
        if key in ("hydra.run.dir", "hydra.sweep.dir") and not any(str(v).strip() for v in override_values(item)):
            raise UserError(f"{key} is empty: give a folder (left out, kvbench makes one under results/)")
        if key.endswith(".out_dir") and any(isinstance(v, str) and not v.strip() for v in override_values(item)):
            raise UserError(f"{key} is empty: give a folder, or null for the run's own")
        if key != "hydra.searchpath":
            continue
        for entry in (e for v in override_values(item) for e in (v if isinstance(v, list) else [v])):
            entry = str(entry)
            if entry.startswith("file://") and not Path(entry[len("file://") :]).is_dir():
                raise UserError(f"hydra.searchpath names {entry}, which is no folder: give file:///path/to/conf")
            if entry.startswith("pkg://"):
                module = entry[len("pkg://") :].replace("/", ".")
                try:
                    found = importlib.util.find_spec(module) is not None
                except (ImportError, ValueError) as err:  # its parent package is not installed, or failed to import
                    top = module.split(".")[0]
                    if top == module or importlib.util.find_spec(top) is None or getattr(err, "name", None) == top:
                        found = False
                    else:  # installed, but its own import failed (a dependency of its own missing)
                        raise UserError(
                            f"a package of hydra.searchpath, {top}, cannot be imported ({type(err).__name__}: {err}): "
                            f"fix or uninstall it"
                        ) from None
                except Exception as err:  # noqa: BLE001 (the package raised as it was imported)
                    raise UserError(
                        f"a package of hydra.searchpath cannot be imported ({type(err).__name__}: {err}): fix or "
                        f"uninstall it"
                    ) from None
                if not found:
                    raise UserError(
                        f"hydra.searchpath names {entry}, but no installed package has {module}: install the "
                        f"package, or name its config folder with file://"
                    )


INF_SPELLED = re.compile(r"(?i)(?<![\w.])[-+]?inf(inity)?(?![\w.])")


def _infinities(value) -> int:
    """How many infinite floats a parsed override value holds (a list's or a dict's too)."""
    if isinstance(value, float):
        return int(math.isinf(value))
    if isinstance(value, dict):
        return sum(_infinities(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_infinities(v) for v in value)
    bounds = [getattr(value, name, None) for name in ("start", "stop", "step", "end")]  # range(), interval()
    return sum(isinstance(b, float) and math.isinf(b) for b in bounds)


def refuse_overflowing_numbers(overrides: list[str]) -> None:
    """`workload.rate=1e400`: Hydra reads a number beyond a float's range as inf, and the run
    would put every request at t=0 without a word. An infinity the command line does not spell
    `inf` is refused; a name such as `run-1e999` is Hydra's text, not a number."""
    for item in overrides:
        values = override_values(item)
        if any(hasattr(v, "stop") and _infinities(v) for v in values):  # range(1,inf) would never end
            raise UserError(f"{item.lstrip('+~')}: a range() sweep needs finite start, stop and step")
        if _infinities(values) > len(INF_SPELLED.findall(split_override(item)[1])):
            raise UserError(
                f"{item.lstrip('+~')} holds a number beyond a float's range (about 1.8e308), which reads as "
                f"infinite: give a finite number, or inf where a key takes it (workload.rate=inf)"
            )


# a value (or a list's, a range's) of digits with an underscore between them (1_0), not a part
# of a name (run_1_0, /tmp/1_0) or a quoted text
UNDERSCORED = re.compile(r"(?<![^\s,\[(:{])[-+]?\d+(?:_\d+)+(?:\.\d*)?(?:[eE][-+]?\d+)?(?![^\s,\])}])")
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def refuse_underscored_numbers(overrides: list[str]) -> None:
    """`workload.num_requests=1_0`: Hydra reads 1_0 as 10, as Python does; a typo for 10 or 100
    would run another workload without a word (a trace's cell 1_0 is refused the same way)."""
    for item in overrides:
        unquoted = QUOTED.sub("", split_override(item)[1])
        for text in UNDERSCORED.findall(unquoted):
            number = override_values(f"x={text}")
            if number and isinstance(number[0], (int, float)) and not isinstance(number[0], bool):
                raise UserError(
                    f"{item.lstrip('+~')}: {text} reads as {number[0]:g} (an underscore between digits is dropped), "
                    f"which may be a typo: write the number without underscores"
                )


# A sweep larger than this is a typo (range(0,1000000) for range(0,10)): each point's config is
# composed and checked before the first runs (0.15-0.25 s a point), then each runs
MAX_SWEEP_POINTS = 10_000


def refuse_huge_sweeps(overrides: list[str]) -> None:
    """`-m seed=range(0,1000000)`: Hydra lists every point, and kvbench composes each to check
    it, before the first one runs: minutes to days with no word. The number of points is the
    product of each swept key's count of values (a glob() counts as unknown, and is left out)."""
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    counts = []
    for override in parse_overrides(overrides):
        value = override.value()
        if isinstance(value, RangeSweep) and value.step:
            counts.append((override.input_line, max(0, math.ceil((value.stop - value.start) / value.step))))
        elif isinstance(value, ChoiceSweep):
            counts.append((override.input_line, len(value.list)))
    points = math.prod(count for _, count in counts)
    if points > MAX_SWEEP_POINTS:
        sizes = " x ".join(f"{line}: {count:,}" for line, count in counts if count > 1)
        raise UserError(
            f"the sweep has {points:,} points ({sizes}), more than {MAX_SWEEP_POINTS:,}: each is checked and run "
            f"one by one; narrow it, or split it into several sweeps"
        )


def refuse_null_groups(overrides: list[str]) -> None:
    """`hardware=null` (NULL, or null among a sweep's values): Hydra's words are "Config group
    override must be a string or a list"."""
    for item in overrides:
        key, value = split_override(item)
        if "null" in value.lower() and is_group(key) and None in override_values(item):
            plus = item[: len(item) - len(item.lstrip("+"))]  # a plugin group is added with +
            raise UserError(
                f"{item} chooses no option of the {key} group: choose one with {plus}{key}=NAME "
                f"(bench --help lists them)"
            )


def refuse_keys_given_twice(overrides: list[str]) -> None:
    """`seed=0,1 seed=2,3`: Hydra keeps the last list silently, and the sweep would be another
    than the one asked for (one value after another keeps the last, as a command line does).
    And `model={num_layers:20}` (alone or among a sweep's values): a group's keys set through a
    dict, which no column of the row records (its name stays the option's); `model=[a,b]`, two
    options merged into one config, the row naming the last."""
    seen: dict[str, str] = {}
    for item in overrides:
        key, value = split_override(item)
        if "{" in value and is_group(key) and any(isinstance(v, dict) for v in override_values(item)):
            raise UserError(
                f"{item} sets keys of the {key} group through a dict, which the result row would not record: set "
                f"each key instead ({key}.KEY=VALUE; {key}=NAME chooses one of its options)"
            )
        if "[" in value and is_group(key) and any(isinstance(v, list) for v in override_values(item)):
            raise UserError(
                f"{item} lists several options of the {key} group, which would be merged into one config while "
                f"the row names the last: choose one ({key}=NAME), or sweep them (-m {key}=A,B)"
            )
        if key in seen and sweeps(seen[key], item):  # one value after another: the last wins, as usual
            raise UserError(
                f"{key} is given twice ({seen[key]} and {item}); the last would replace the first, and its points "
                f"would be another sweep's: give one list of every value to sweep"
            )
        seen[key] = item
