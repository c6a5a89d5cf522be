"""Hydra callback: one sweep per directory while it runs; at its end summary.csv, the plots and the report.

Before the first point it also checks the joblib launcher's settings that joblib itself would
refuse only once the sweep had launched (`check_joblib`).

A sweep holds a lock on its directory from start to end, so a second sweep into the same
directory is refused instead of computing its points again or mixing two sweeps' rows. A sweep
with a failed point, or whose summary could not be written, exits 2 with one line; the
finished points' metrics.csv stay as they are either way.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from kvbench.errors import UserError, exit_crashed, exit_with, one_line, reportable
from kvbench.sweep import SweepLock

log = logging.getLogger("kvbench")


# scenarios whose numbers are this machine's wall-clock times, which points run side by side share
TIMED = ("serve", "kernel", "profile", "validate")


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.lock: SweepLock | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.lock = SweepLock(Path(config.hydra.sweep.dir))
        try:
            launcher = config.hydra.get("launcher") or {}
            check_joblib(launcher)
            self.lock.acquire()
        except Exception as err:
            if not reportable(err):
                raise
            exit_with(err)
        scenario = OmegaConf.select(config, "scenario.name", default=None)
        if is_joblib(launcher) and launcher.get("n_jobs") != 1 and scenario in TIMED:
            log.warning(
                "hydra/launcher=joblib runs scenario=%s points side by side (hydra.launcher.n_jobs=%s): their "
                "wall-clock timings share this machine's cores; hydra.launcher.n_jobs=1 times each point alone",
                scenario,
                launcher.get("n_jobs"),
            )

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        plots = config.get("plots", "auto") is not False
        if not any(sweep_dir.glob("*/metrics.csv")):  # every point leaves one, a failed point too
            # the lock stays held: bench releases it and removes the folder it left bare
            exit_with(
                UserError(
                    "the sweep has no points: a value list on the command line is empty (range() with "
                    "start >= stop or a step of the wrong sign, a glob() that matches no option)"
                )
            )
        try:
            done = self._summary(sweep_dir, plots)
        except BaseException:  # its line said; the lock goes with it
            if self.lock is not None:
                self.lock.release()
            raise
        for path in done["written"]:
            log.info("wrote %s", path)
        print(done["table"])
        failed = done["failed"]
        for point, reason in failed:
            log.warning("point %s failed: %s", point, reason)
        compared, refused = "", None
        try:  # the comparison is the sweep's too: written under its lock
            if not failed or len(failed) < done["rows"]:
                compared, refused = paper_comparison(config, sweep_dir, plots)  # from the points that ran
        except Exception as err:  # raised, Hydra would only warn and the sweep exit 0
            if reportable(err):  # a file it could not write, say
                exit_with(err)
            log.exception("the sweep's paper comparison crashed")
            exit_crashed(
                f"the sweep's paper comparison in {sweep_dir} could not be written ({type(err).__name__}: "
                f"{one_line(err)}); its summary, report and points are intact"
            )
        finally:
            if self.lock is not None:
                self.lock.release()
        if failed and len(failed) == done["rows"]:
            exit_with(UserError(f"every point of the sweep failed; the first, {failed[0][0]}: {failed[0][1]}"))
        if failed:
            if refused is not None:
                log.warning("paper comparison: %s", refused)
            exit_with(
                UserError(
                    f"{len(failed)} of {done['rows']} points of the sweep failed (their rows are in "
                    f"summary.csv{compared}); the first, {failed[0][0]}: {failed[0][1]}"
                )
            )
        if refused is not None:
            exit_with(refused)

    @staticmethod
    def _summary(sweep_dir: Path, plots: bool) -> dict:
        """summary.csv, the plots and the report; a failure is the sweep's one-line error."""
        from kvbench import launch

        try:
            # done by the helper `bench` started, where there is one that did it (its imports
            # loaded while the points ran); else, or where it failed, here
            done = launch.helper_does({"job": "sweep", "dir": str(sweep_dir), "plots": plots})
            if done is None:
                from kvbench.reporting.report import end_of_sweep

                done = end_of_sweep(sweep_dir, plots)
        except UserError as err:  # bad input (report.baseline not in the sweep, ...): its own line
            exit_with(err)
        except Exception as err:
            line = (
                f"the sweep's summary, plots or report in {sweep_dir} could not be written "
                f"({one_line(err) if reportable(err) else f'{type(err).__name__}: {one_line(err)}'}); its finished "
                f"points are intact in */metrics.csv"
            )
            if reportable(err):
                exit_with(UserError(line))
            # a bug: raised, Hydra would only warn and the sweep exit 0 with its points unsummarized
            log.exception("the sweep's summary crashed")
            exit_crashed(line)
        return done


def paper_comparison(config: DictConfig, sweep_dir: Path, plots: bool) -> tuple[str, UserError | None]:
    """An experiment's comparison with the paper (report.paper), once the summary is written: a
    sweep with failed points still compares the points that ran (naming the failed ones in
    paper_comparison.md). Returns what the failed points' message adds, and the comparison's
    refusal, if any."""
    from kvbench.reporting.paper import report_settings, write_comparison

    if report_settings(config.get("report"))["paper"] is None:
        return "", None
    table = sweep_dir / "paper_comparison.md"
    before = table.stat().st_mtime_ns if table.exists() else None
    try:
        written = write_comparison(sweep_dir, config.get("report"), plots)
    except UserError as err:  # fig12 writes what its placed curves compare before refusing the rest
        now = table.stat().st_mtime_ns if table.exists() else None
        return ("; no paper comparison" if now is None or now == before else f"; {table.name} from what it could"), err
    for path in written:
        log.info("wrote %s", path)
    from kvbench.reporting.page import add_paper_section

    add_paper_section(sweep_dir)  # the report was written before the comparison
    return f"; {written[1].name} compares the others with the paper", None


def is_joblib(launcher) -> bool:
    return "joblib" in str(launcher.get("_target_", "")).lower()


def check_joblib(launcher) -> None:
    """hydra/launcher=joblib's settings that joblib refuses only once the sweep launches (a
    traceback), and its timeout, which ends the whole sweep with no summary of the points it
    finished: each point has its own, sweep.point_timeout_s."""
    if not is_joblib(launcher):
        return
    n_jobs, prefer, batch_size = launcher.get("n_jobs"), launcher.get("prefer"), launcher.get("batch_size")
    if n_jobs == 0:
        raise UserError("hydra.launcher.n_jobs=0 runs nothing: a number of processes >= 1, or -1 for one a core")
    cores = os.cpu_count() or 1
    if isinstance(n_jobs, int) and not -cores <= n_jobs <= cores:  # each point is a CPU-bound process
        raise UserError(
            f"hydra.launcher.n_jobs={n_jobs} asks for more processes than this machine's {cores} cores, each a point "
            f"busy on one (a thousand took minutes to start): give 1 to {cores}, or -1 for one a core"
        )
    if prefer not in (None, "processes", "threads"):
        raise UserError(f"hydra.launcher.prefer={prefer} must be processes, threads or null")
    if str(batch_size) != "auto" and not (str(batch_size).isdigit() and int(batch_size) >= 1):
        raise UserError(f"hydra.launcher.batch_size={batch_size} must be auto or a whole number >= 1")
    pre_dispatch = str(launcher.get("pre_dispatch", "2*n_jobs"))
    if pre_dispatch != "all" and not re.fullmatch(r"\d+|(\d+\s*\*\s*)?n_jobs", pre_dispatch.strip()):
        raise UserError(f"hydra.launcher.pre_dispatch={pre_dispatch} must be all, a number, or N*n_jobs, e.g. 2*n_jobs")
    if launcher.get("backend") not in (None, "loky"):  # Hydra's joblib launcher sets loky, whatever is given
        raise UserError(
            f"hydra.launcher.backend={launcher.get('backend')} is not used: Hydra's joblib launcher always runs "
            f"joblib's loky processes; give loky or null (hydra.launcher.n_jobs=1 runs the points one at a time)"
        )
    if launcher.get("require") not in (None, "sharedmem"):
        raise UserError(f"hydra.launcher.require={launcher.get('require')} must be sharedmem or null")
    if launcher.get("timeout") is not None:
        raise UserError(
            f"hydra.launcher.timeout={launcher.get('timeout')} would stop the whole sweep and leave no summary of "
            f"the points it finished: give each point its limit with sweep.point_timeout_s instead"
        )
