"""The `bench` command: a Hydra app that runs one point (or, with -m, a sweep) and writes its rows.

Bad input ends a run with one line on stderr and exit code 2. Inside a sweep a bad point is
recorded (status=failed, with the reason) and the sweep goes on.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from kvbench.errors import UserError
from kvbench.results import environment, write_csv
from kvbench.validate import validate_argv

log = logging.getLogger("kvbench")


def point_overrides() -> dict:
    """The swept / overridden parameters of this point, as identity columns."""
    columns = {}
    for item in HydraConfig.get().overrides.task:
        key, _, value = item.lstrip("+~").partition("=")
        if key in ("allocator", "backend", "graph", "scenario", "model", "hardware", "workload"):
            continue
        columns[key] = value
    return columns


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="bench")
def _main(cfg: DictConfig) -> None:
    from kvbench.run import identity, run_point

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        rows = run_point(cfg)
        status, reason = "ok", ""
    except UserError as err:
        if not multirun:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        print(f"error in point {out_dir.name}: {err}", file=sys.stderr)
        try:
            rows = [identity(cfg)]
        except Exception:  # the identity itself may be what is invalid
            rows = [{}]
        status, reason = "failed", str(err)
    env = environment()
    for row in rows:
        row.update(point_overrides())
        row.setdefault("device", "cpu")
        row.update(status=status, reason=reason, **env)
    write_csv(out_dir / "metrics.csv", rows)
    if status == "ok":
        log.info("wrote %s", out_dir / "metrics.csv")


def main() -> None:
    try:
        validate_argv(sys.argv[1:])
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    _main()


if __name__ == "__main__":
    main()
