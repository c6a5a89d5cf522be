"""Check command-line overrides before Hydra runs, so a typo is one clear line, not a traceback.

Each override (each value of a sweep) is composed with Hydra's compose API against the
packaged config tree; the first failure is reported with the options that exist.
"""

from __future__ import annotations

from importlib import resources

from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from kvbench.errors import UserError

GROUPS = ("scenario", "model", "hardware", "workload", "allocator", "backend", "graph", "experiment", "preset", "executor")


def group_options(group: str) -> list[str]:
    folder = resources.files("kvbench.conf") / group
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _split(override: str) -> tuple[str, list[str]]:
    key, _, value = override.partition("=")
    values = [value]
    if "," in value and not value.startswith(("[", "{", "'", '"')) and "(" not in value:
        values = value.split(",")
    return key, values


def validate_argv(argv: list[str]) -> None:
    overrides = [a for a in argv if "=" in a and not a.startswith("-")
                 and not a.lstrip("+~").startswith("hydra")]
    if not overrides or any(a in ("--help", "-h", "--hydra-help", "--info", "-i") for a in argv):
        return
    for arg in overrides:
        key, values = _split(arg)
        group = key.lstrip("+~")
        if group in GROUPS:
            known = group_options(group)
            for v in values:
                if v not in known:
                    raise UserError(f"unknown {group} {v!r}; known: {', '.join(known)}")
    singles = []
    for arg in overrides:
        key, values = _split(arg)
        singles.append(f"{key}={values[0]}")
    try:
        with initialize_config_module("kvbench.conf", version_base="1.3"):
            for arg in overrides:
                key, values = _split(arg)
                for v in values[1:]:
                    compose("bench", overrides=[s for s in singles if not s.startswith(key + "=")] + [f"{key}={v}"])
            compose("bench", overrides=singles)
    except (HydraException, OmegaConfBaseException) as err:
        first = str(err).strip().splitlines()[0]
        raise UserError(f"bad override: {first}") from None
