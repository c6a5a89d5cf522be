"""The schema of a bench-compare policy file (conf/compare_policy.yaml's shape)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError

from kvbench.errors import UserError
from kvbench.schema.groups import Float, Section
from kvbench.schema.messages import validation_line


class Rule(Section):
    better: Literal["higher", "lower"]
    tolerance: Float | None = Field(None, ge=0, le=1e6)  # null = report only
    abs_tolerance: Float = Field(0.0, ge=0)
    min_effect: Any = None  # measured metrics; kvbench.reporting.policy checks its range
    effect: Literal["median", "best"] = "median"  # where min_effect is measured (medians or best samples)


class Policy(Section):
    identity: list[str] = []
    environment: list[str] = []
    metrics: dict[str, Rule]
    scenarios: dict[str, dict[str, Rule]] = {}
    test: Any = None  # the significance test; kvbench.reporting.policy checks its fields


def check_policy(data, source) -> None:
    """Raise UserError naming the file and the first bad key of a policy's parsed YAML."""
    try:
        Policy.model_validate(data)
    except ValidationError as err:
        raise UserError(f"policy {source}: {validation_line(err, '', Policy)}") from None
