"""bench-compare's policy: which columns name a point, and how each metric is judged.

A metric is either exact (simulated: deterministic for a seed, so a tolerance the worse way) or
measured (wall clock: a significance test on the repeats' samples and a minimum relevant
change). The packaged policy is conf/compare_policy.yaml; its header documents every field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

import yaml

from kvbench.errors import UserError
from kvbench.schema.groups import SCENARIOS
from kvbench.schema.messages import closest, unknown_key
from kvbench.schema.policy import check_policy

DEFAULT_POLICY = "compare_policy.yaml"
TEST_METHODS = ("mannwhitneyu", "bootstrap")
# a bootstrap of more resamples than this is a typo: it would run for hours, and its interval
# stops narrowing long before
MAX_RESAMPLES = 1_000_000
# how min_effect is measured: between the medians of the samples, or the best sample of each side
EFFECTS = ("median", "best")


@dataclass(frozen=True)
class SignificanceTest:
    """How measured metrics are judged: a one-sided test at `alpha` on the two sides' samples."""

    method: str = "mannwhitneyu"
    alpha: float = 0.05
    resamples: int = 2000  # bootstrap only


@dataclass(frozen=True)
class Rule:
    """How one metric is judged.

    Exact: `tolerance` relative to the baseline (None = report only) plus `abs_tolerance`.
    Measured: `min_effect` set, the smallest change the worse way that counts (0.1 = 10 %),
    measured between the sides' medians, or with `effect="best"` between each side's best sample
    (for a time that load can only inflate: a side's fastest run is the least disturbed one).
    """

    better: str
    tolerance: float | None = None
    abs_tolerance: float = 0.0
    min_effect: float | None = None
    effect: str = "median"

    @property
    def measured(self) -> bool:
        return self.min_effect is not None

    def verdict(self, base: float, cur: float) -> str:
        """The exact comparison of two numbers."""
        if math.isnan(base) and math.isnan(cur):
            return "same"
        if math.isnan(cur):
            return "REGRESSED" if self.tolerance is not None else "worse"
        if math.isnan(base):
            return "new"
        worse_by = cur - base if self.better == "lower" else base - cur
        if worse_by == 0:
            return "same"
        if worse_by < 0:
            return "better"
        if self.tolerance is not None and worse_by > self.tolerance * abs(base) + self.abs_tolerance:
            return "REGRESSED"
        return "worse"


@dataclass
class Policy:
    identity: list
    environment: list
    rules: dict  # metric -> Rule
    scenario_rules: dict  # scenario -> {metric -> Rule}, replacing `rules` for that scenario's rows
    test: SignificanceTest

    def rules_for(self, scenario: str) -> dict:
        return {**self.rules, **self.scenario_rules.get(scenario, {})}


class _DuplicateKey(Exception):
    """A mapping of the YAML gives one key twice: (key, first line, second line)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping (which would otherwise
    keep the last silently: a rule written twice judges by whichever comes second)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may override on purpose
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: the base class refuses it
                    continue
                if duplicate:
                    raise _DuplicateKey(key, seen[key], line)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads 1e-6 as text; YAML 1.2 and every reader of a policy take it for the number
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _read_yaml(source) -> dict:
    try:
        data = yaml.load(source.read_text(), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as err:
        raise UserError(f"policy {source} is not UTF-8 text (byte {err.start}); give a YAML file") from None
    except _DuplicateKey as err:
        key, first, second = err.args
        lines = f"line {first}" if first == second else f"lines {first} and {second}"
        raise UserError(
            f"policy {source}: key {key!r} is given twice in one mapping ({lines}); give each key once"
        ) from None
    except yaml.YAMLError as err:
        raise UserError(f"policy {source} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise UserError(f"policy {source} needs a 'metrics:' mapping of metric -> {{better, tolerance}}")
    check_policy(data, source)  # unknown keys and bad values, named as key=value
    for section in ("identity", "environment"):
        columns = data.get(section) or []
        twice = next((c for i, c in enumerate(columns) if c in columns[:i]), None)
        if twice is not None:  # identity's would break the merge, environment's be reported twice
            raise UserError(f"policy {source}: {section} lists {twice!r} twice; list each column once")
    unknown = next((name for name in data.get("scenarios") or {} if name not in SCENARIOS), None)
    if unknown is not None:  # its rules would never apply
        raise UserError(
            f"policy {source}: scenarios.{unknown} is not a scenario{closest(str(unknown), SCENARIOS)} "
            f"(the scenarios: {', '.join(SCENARIOS)})"
        )
    return data


def _fraction(where: str, key: str, value, low: float, high: float):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
        raise UserError(
            f"policy {where}: {key} must be a number between {low:g} and {high:g} (exclusive), not {value!r}"
        )
    return float(value)


def _rules(metrics: dict, known: dict) -> dict:
    rules = {}
    for metric, spec in (metrics or {}).items():
        if metric not in known:
            raise UserError(f"policy names unknown metric {metric!r}; known: {', '.join(known)}")
        spec = spec or {}
        where = f"metric {metric!r}"
        if spec.get("better") not in ("higher", "lower"):
            raise UserError(f"policy {where}: better must be 'higher' or 'lower', not {spec.get('better')!r}")
        tolerance, min_effect = spec.get("tolerance"), spec.get("min_effect")
        if tolerance is not None and min_effect is not None:
            raise UserError(
                f"policy {where}: give tolerance (exact metrics) or min_effect (measured metrics), not both"
            )
        if tolerance is not None and (
            isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0
        ):
            raise UserError(f"policy {where}: tolerance must be a number >= 0 or null, not {tolerance!r}")
        if min_effect is not None:
            min_effect = _fraction(where, "min_effect", min_effect, 0.0, 10.0)
        effect = spec.get("effect", "median")
        if effect not in EFFECTS:
            raise UserError(f"policy {where}: effect must be one of {', '.join(EFFECTS)}, not {effect!r}")
        if effect != "median" and min_effect is None:
            raise UserError(f"policy {where}: effect applies to measured metrics (give min_effect)")
        if spec.get("abs_tolerance", 0) and tolerance is None:  # no verdict would ever add it
            why = (
                "a measured metric is judged by min_effect"
                if min_effect is not None
                else "tolerance null reports only; give tolerance: 0 for an absolute slack alone"
            )
            raise UserError(f"policy {where}: abs_tolerance applies to exact metrics with a tolerance ({why})")
        rules[metric] = Rule(
            spec["better"],
            None if tolerance is None else float(tolerance),
            float(spec.get("abs_tolerance", 0.0)),
            min_effect,
            effect,
        )
    return rules


def _test(spec, source) -> SignificanceTest:
    spec = spec or {}
    if not isinstance(spec, dict):
        raise UserError(f"policy {source}: test must be a mapping of method, alpha, resamples")
    known = [field.name for field in fields(SignificanceTest)]
    unknown = next((key for key in spec if key not in known), None)
    if unknown is not None:
        raise UserError(f"policy {source}: {unknown_key(f'test.{unknown}', known, 'test')}")
    method = spec.get("method", SignificanceTest.method)
    if method not in TEST_METHODS:
        raise UserError(f"policy {source}: test.method must be one of {', '.join(TEST_METHODS)}, not {method!r}")
    alpha = _fraction(f"{source} test", "alpha", spec.get("alpha", SignificanceTest.alpha), 0.0, 0.5)
    resamples = spec.get("resamples", SignificanceTest.resamples)
    if isinstance(resamples, bool) or not isinstance(resamples, int) or not 100 <= resamples <= MAX_RESAMPLES:
        raise UserError(
            f"policy {source}: test.resamples must be a whole number from 100 to {MAX_RESAMPLES:,}, not {resamples!r}"
        )
    return SignificanceTest(method, alpha, resamples)


def load_policy(path: Path | None = None) -> Policy:
    """The packaged policy, or a user's; a user's may name only metrics kvbench knows."""
    packaged_source = resources.files("kvbench.conf") / DEFAULT_POLICY
    packaged = _read_yaml(packaged_source)
    if path is not None and not Path(path).is_file():
        raise UserError(f"policy {path} {'is not a regular file' if Path(path).exists() else 'does not exist'}")
    source = Path(path) if path is not None else packaged_source
    data = _read_yaml(source) if path is not None else packaged
    known = packaged["metrics"]
    scenarios = data.get("scenarios") or {}
    return Policy(
        list(data.get("identity", packaged["identity"])),
        list(data.get("environment", packaged["environment"])),
        _rules(data["metrics"], known),
        {name: _rules(metrics, known) for name, metrics in scenarios.items()},
        _test(data.get("test", packaged.get("test")), source),
    )
