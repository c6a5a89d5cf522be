"""The `bench` command: a Hydra app that runs one point (or, with -m, a sweep) and writes its rows.

Bad input ends a run with one line on stderr and exit code 2. Inside a sweep a failing point is
recorded (status=failed, with the reason) and the sweep goes on; re-running a sweep into the same
directory (hydra.sweep.dir=...) skips the points an earlier run completed.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from kvbench.errors import UserError
from kvbench.profiling import profiled
from kvbench.reporting.results import environment, read_csv, write_csv
from kvbench.validate import validate_argv

log = logging.getLogger("kvbench")


def point_dirname(overrides: str) -> str:
    """A sweep point's directory name: its overrides, with every character a file name cannot
    safely hold (a path's slashes) replaced, and a short hash of the original when anything was
    replaced or cut, so two points never share a directory."""
    safe = re.sub(r"[^A-Za-z0-9._=,+-]", "_", overrides)[:150]
    if safe == overrides:
        return safe
    return f"{safe}-{hashlib.sha1(overrides.encode()).hexdigest()[:8]}"


# hydra.sweep.subdir (conf/bench.yaml) names each point's directory through this resolver; a
# joblib worker registers it too, when it imports this module to run the task function.
OmegaConf.register_new_resolver("point_dirname", point_dirname, replace=True)


def point_overrides() -> dict:
    """The swept / overridden parameters of this point, as identity columns."""
    columns = {}
    not_parameters = set(HydraConfig.get().job.config.override_dirname.exclude_keys)  # e.g. progress
    for item in HydraConfig.get().overrides.task:
        key, _, value = item.lstrip("+~").partition("=")
        if key in ("allocator", "backend", "graph", "scenario", "model", "hardware", "workload"):
            continue
        if key in not_parameters:
            continue
        columns[key] = value
    return columns


def point_complete(metrics: Path) -> bool:
    """True when an earlier run of the sweep finished this point with status ok.

    metrics.csv is written atomically, so if it exists it is whole."""
    if not metrics.is_file():
        return False
    rows = read_csv(metrics)
    return "status" in rows and not rows.empty and bool((rows["status"] == "ok").all())


def failed_point(cfg: DictConfig, out_dir: Path, reason: str) -> tuple[list[dict], str, str]:
    from kvbench.scenarios.run import identity

    reason = reason.strip().splitlines()[0] if reason.strip() else "no message"
    print(f"error in point {out_dir.name}: {reason}", file=sys.stderr)
    try:
        rows = [identity(cfg)]
    except Exception:  # the identity itself may be what is invalid
        rows = [{}]
    return rows, "failed", reason


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="bench")
def _main(cfg: DictConfig) -> None:
    from kvbench.scenarios.run import run_point

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    if multirun and point_complete(out_dir / "metrics.csv"):
        log.info("skipped %s: complete from an earlier run of this sweep", out_dir.name)
        return
    try:
        with profiled(cfg, out_dir):
            rows = run_point(cfg)
        status, reason = "ok", ""
    except UserError as err:
        if not multirun:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        rows, status, reason = failed_point(cfg, out_dir, str(err))
    except Exception as err:  # out of memory, a crashed kernel: recorded, and the sweep goes on
        if not multirun:
            raise
        log.exception("point %s failed", out_dir.name)
        rows, status, reason = failed_point(cfg, out_dir, f"{type(err).__name__}: {err}")
    env = environment()
    for row in rows:
        row.update(point_overrides())
        row.setdefault("device", "cpu")
        row.update(status=status, reason=reason, **env)
    write_csv(out_dir / "metrics.csv", rows)
    if status == "ok":
        log.info("wrote %s", out_dir / "metrics.csv")
    if not multirun:  # a sweep prints its table and draws its comparison plots once, at its end
        from kvbench.reporting.console import run_table
        from kvbench.reporting.plots import draw_all

        for row in rows:
            print(run_table(row))
        for path in draw_all(rows, out_dir):
            log.info("wrote %s", path)


def main() -> None:
    # argparse takes one run of overrides: `bench a=1 -m b=1,2` must reach Hydra as `-m a=1 b=1,2`.
    sys.argv[1:] = sorted(sys.argv[1:], key=lambda arg: arg not in ("-m", "--multirun"))
    try:
        validate_argv(sys.argv[1:])
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    _main()


if __name__ == "__main__":
    main()
