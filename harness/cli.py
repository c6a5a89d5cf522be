"""The `bench` command: a Hydra app that runs one point (or, with -m, a sweep) and writes its rows.

Hydra parses the command line and composes the config; kvbench.schema checks the result before
anything runs. Bad input ends a run with one line on stderr and exit code 2 (kvbench.errors).
Inside a sweep a failing point is recorded (status=failed, with the reason) and the sweep goes
on; the sweep then exits 2 naming the first failure. Re-running a sweep into its directory
(hydra.sweep.dir=...) skips the points an earlier run completed with the same config and code
(kvbench.sweep).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
import sys
from functools import partial
from importlib import resources
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import kvbench
from kvbench import launch, schema, sweep
from kvbench.core import recorder, request_log
from kvbench.errors import (
    UserError,
    exit_interrupted,
    exit_with,
    guarded_stdout,
    one_line,
    reportable,
)
from kvbench.profiling import profiled
from kvbench.reporting.results import IDENTITY, environment, write_csv
from kvbench.schema.overrides import (
    refuse_deleted_keys,
    refuse_empty_ranges,
    refuse_huge_sweeps,
    refuse_keys_given_twice,
    refuse_null_groups,
    refuse_overflowing_numbers,
    refuse_underscored_numbers,
    refuse_unusable_hydra_paths,
    run_mode_keys,
    split_override,
    sweeps,
)
from kvbench.schema.sweep_points import (
    point_folders,
    preset_allocator_clash,
    refuse_a_sweep_of_nothing,
    refuse_absent_baseline,
    refuse_bad_points,
    refuse_nested_folders,
    refuse_other_sweeps_points,
    refuse_shared_folders,
    refuse_swept_experiments,
    refuse_twice_swept,
    refuse_unmeasured_sweeps,
    task_config,
)
from kvbench.schema.unread import refuse_unread_overrides

log = logging.getLogger("kvbench")
single_run_done = False  # a single run ended well: `bench` may leave at once (kvbench.launch.leave)
sweep_dir: str | None = None  # the sweep being run, for the line an interrupted sweep ends with

# ${kvbench.pid:} in a run directory's name keeps runs started in the same second apart
OmegaConf.register_new_resolver("kvbench.pid", os.getpid, use_cache=True, replace=True)


def _field_docs(*, _root_) -> str:
    from kvbench.schema import groups
    from kvbench.schema.docs import help_text

    names = {}
    for group in groups.PLUGINS:
        try:  # a name that does not resolve (${oc.env:UNSET}): the run says so, the help still shows
            names[group] = OmegaConf.select(_root_, f"{group}.name", default=None)
        except Exception:  # noqa: BLE001 (OmegaConf's errors, and a resolver's own)
            names[group] = None
    plugins = {g: name for g, name in names.items() if isinstance(name, str) and name not in groups.PLUGINS[g]}
    searchpath = OmegaConf.select(_root_, "hydra.searchpath", default=None) or []
    return help_text(OmegaConf.select(_root_, "hydra.runtime.choices", default=None), plugins, list(searchpath))


def _config_groups(*, _root_) -> str:
    from kvbench.schema.docs import groups_text

    return groups_text(list(OmegaConf.select(_root_, "hydra.searchpath", default=None) or []))


OmegaConf.register_new_resolver("kvbench.field_docs", _field_docs, replace=True)
OmegaConf.register_new_resolver("kvbench.config_groups", _config_groups, replace=True)


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


def not_measured() -> list[str]:
    """The keys in no point's name or column: conf/bench.yaml's override_dirname.exclude_keys,
    which a command line may extend."""
    return list(HydraConfig.get().job.config.override_dirname.exclude_keys)


def unfingerprinted() -> list[str]:
    """The keys a point's fingerprint leaves out: those of not_measured() that only change how it
    runs (run_mode_keys). A key a command line adds to exclude_keys (workload.num_requests) still
    shapes what the point measures, so a rerun that changes it runs the point again."""
    return [key for key in not_measured() if key in run_mode_keys()]


def point_overrides() -> dict:
    """The swept / overridden parameters of this point, as identity columns (the groups in
    IDENTITY have their own; another group chosen, such as +preset=vllm, is a column of its own)."""
    hydra_cfg = HydraConfig.get()
    skipped = set(not_measured()) | (set(hydra_cfg.runtime.choices) & set(IDENTITY))
    return {key: value for key, value in map(split_override, hydra_cfg.overrides.task) if key not in skipped}


# read at a sweep's end (summary, report, paper comparison): a single run would ignore them
SWEEP_END_KEYS = ("report.paper", "report.baseline", "report.slo_s_per_token")


def failed_rows(cfg: DictConfig) -> list[dict]:
    from kvbench.scenarios.run import identity

    try:
        return [identity(cfg)]
    except Exception:  # the identity itself may be what is invalid
        return [{}]


def refuse_preset_clash() -> None:
    """+preset=vllm sets the paged allocator's knobs: another allocator would be refused for a
    key it lacks, with no word of the preset that set it."""
    choices = HydraConfig.get().runtime.choices
    preset, allocator = choices.get("preset"), choices.get("allocator")
    preset_allocator_clash(preset, allocator)
    chosen = [split_override(o)[0] for o in HydraConfig.get().overrides.task]
    if (
        preset == "vllm"
        and {"allocator", "preset"} <= set(chosen)
        and chosen.index("allocator") > chosen.index("preset")
    ):
        raise UserError(  # composed after the preset, the allocator's own YAML replaced its settings
            "+allocator=... after +preset=vllm replaces the settings the preset gives the paged allocator "
            "(watermark, prefix caching): drop it (the preset chooses paged), or put it before +preset=vllm"
        )


# files a run reads, given relative to where `bench` was launched
INPUT_PATHS = ("workload.path", "executor.profile", "scenario.profile")


def from_the_launch_folder(cfg: DictConfig) -> None:
    """A relative input path read where `bench` was launched, not in the run's folder, which
    hydra.job.chdir=true makes the working directory."""
    from hydra.utils import to_absolute_path

    if Path.cwd() == Path(HydraConfig.get().runtime.cwd):
        return
    for key in INPUT_PATHS:
        path = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        if isinstance(path, str) and path.strip() and not Path(path).is_absolute():
            OmegaConf.update(cfg, key, to_absolute_path(path))


def check_run_config(cfg: DictConfig) -> None:
    """What a run checks of its config before it runs anything (HydraConfig set)."""
    from_the_launch_folder(cfg)
    refuse_preset_clash()
    schema.settle_whole_numbers(cfg, schema.validate(cfg))
    refuse_unread_overrides(cfg)
    from kvbench.scenarios.build import load_specs, refuse_plugins_that_cannot_meet
    from kvbench.scenarios.run import preflight

    refuse_plugins_that_cannot_meet(cfg, load_specs(cfg)[0])
    preflight(cfg)


def run_checked(cfg: DictConfig, out_dir: Path) -> list[dict]:
    from kvbench.scenarios.run import run_point

    check_run_config(cfg)
    with sweep.deadline(float(cfg.sweep.point_timeout_s)), profiled(cfg, out_dir):
        return run_point(cfg)


def _draw_early(cfg: DictConfig, out_dir: Path, helper, sent: list, shares: dict) -> None:
    """Hand the helper a single run's figure job from its KV shares and identity, all the figure
    shows (run_figure.draw_run): the figure is drawn while the summary's latencies, the row and
    the console table are made, not after (0.11 s off a 10,000-request run's end)."""
    from kvbench.scenarios.run import identity

    if not sent:
        helper.send({"job": "run", "rows": [{**identity(cfg), **shares, "status": "ok"}], "out": str(out_dir)})
        sent.append(helper)


def run_point_and_record(cfg: DictConfig, out_dir: Path, multirun: bool) -> None:
    drawing_early: list = []  # the helper that had the figure's job from the summary
    if not multirun:
        paper = OmegaConf.select(cfg, "report.paper")
        known = bool(paper) and (resources.files("kvbench.conf") / "experiment" / f"{paper}.yaml").is_file()
        if (
            known
        ):  # written by SweepSummary, at a sweep's end: a single run would end without it (another: the schema's)
            forced = bool(HydraConfig.get().sweeper.get("params"))  # an experiment's sweep, run as one
            fix = "drop hydra.mode=RUN" if forced else f"run +experiment={paper} (the paper's sweep), or add -m"
            raise UserError(
                f"report.paper={paper} compares a sweep with the paper when the sweep ends, and this is one run: {fix}"
            )
        for key, value in map(split_override, HydraConfig.get().overrides.task):
            if key in SWEEP_END_KEYS:
                raise UserError(
                    f"{key}={value} is read when a sweep ends (its report); a single run would ignore it: "
                    f"add -m, or drop it"
                )
        # the helper of this single run of `bench` writes its requests.jsonl (core/request_log),
        # and draws a simulated run's figure as soon as its KV shares are known (recorder.shares_ready)
        helper = launch.run_helper()
        token = request_log.follower.set(helper)
        early = helper is not None and cfg.plots is True and cfg.scenario.name == "simulate"
        hook = recorder.shares_ready.set(partial(_draw_early, cfg, out_dir, helper, drawing_early) if early else None)
        try:
            rows, status, reason = run_checked(cfg, out_dir), "ok", ""
        finally:
            request_log.follower.reset(token)
            recorder.shares_ready.reset(hook)
    else:
        # a subdir that resolved only now (../p${hydra.job.num}): the check before the sweep could not see it
        try:
            refuse_nested_folders([str(HydraConfig.get().sweep.subdir)])
        except UserError:
            # what Hydra made there for the point; the sweep's folder goes as bench ends (remove_bare_sweep_folders)
            sweep.remove_if_bare(out_dir, (".hydra", "cli.log"))
            raise
        try:
            current = sweep.fingerprint(cfg, unfingerprinted())
        except Exception:  # a config that does not resolve: the schema check below says why
            current = {}
        skip, why = sweep.resume(out_dir, current) if current else (False, "")
        if skip:
            log.info("skipped %s: %s", out_dir.name, why)
            return
        if why:
            log.info("re-running %s: %s", out_dir.name, why)
        try:
            rows, status, reason = run_checked(cfg, out_dir), "ok", ""
        except Exception as err:  # bad input, out of memory, a crashed kernel: recorded, the sweep goes on
            if not reportable(err):
                log.exception("point %s crashed", out_dir.name)
            reason = one_line(err) if reportable(err) else f"{type(err).__name__}: {one_line(err)}"
            log.warning("point %s failed: %s", out_dir.name, reason)
            rows, status = failed_rows(cfg), "failed"
    env = environment()
    overridden = point_overrides()
    options = {key: value for key, value in sweep.plugin_options(cfg).items() if key not in overridden}
    for row in rows:
        # an identity column the row has is the value the run read (seed=1e3 ran, and is, seed 1000)
        row.update({key: value for key, value in overridden.items() if key not in IDENTITY or key not in row})
        row.update({key: value for key, value in options.items() if key not in row})
        row.setdefault("device", "simulated" if cfg.scenario.name == "simulate" else "cpu")  # a failed point's
        row.update(status=status, reason=reason, **env)
    drawing = not multirun and cfg.plots is True
    helper = launch.current() if drawing else None
    if helper is not None:  # `bench`'s helper draws the figure while the row is written and printed here
        helper.send({"job": "run", "rows": rows, "out": str(out_dir)})
    elif drawing and drawing_early:  # it has had the job since the summary had the shares
        helper = drawing_early[0]
    write_csv(out_dir / "metrics.csv", rows)
    if multirun and current:
        sweep.write_fingerprint(out_dir, current)
    if status == "ok":
        log.info("wrote %s", out_dir / "metrics.csv")
    if not multirun:  # a sweep prints its table and draws its comparison plots once, at its end
        from kvbench.reporting.console import run_table, validation_table

        if status == "ok" and rows[0].get("scenario") == "validate":  # a row a metric
            print(validation_table(rows))
        else:
            for row in rows:
                print(run_table(row))
        if drawing:
            done = helper.result() if helper is not None else None
            if done is None:
                from kvbench.reporting.run_figure import draw_run

                done = {"written": draw_run(rows, out_dir)}
            for path in done["written"]:
                log.info("wrote %s", path)
        global single_run_done
        single_run_done = status == "ok"


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="bench")
def _main(cfg: DictConfig) -> None:
    global sweep_dir
    # a log line to a console closed early is dropped, not a traceback: a joblib worker's console
    # is not the guarded one (GuardedStdout), and its Hydra-made handlers write to the closed pipe
    logging.raiseExceptions = False
    out_dir, multirun = Path(HydraConfig.get().runtime.output_dir), HydraConfig.get().mode == RunMode.MULTIRUN
    sweep_dir = str(HydraConfig.get().sweep.dir) if multirun else None
    try:
        run_point_and_record(cfg, out_dir, multirun)
    except Exception as err:  # here, not in main(): Hydra would print a line of its own first
        if isinstance(err, OmegaConfBaseException):  # seed=${seed}, seed=${nope}: resolved as the run reads it
            from kvbench.schema.hydra_errors import hydra_line

            line = hydra_line(err)
            given = [o for o in sys.argv[1:] if "${" in o and "=" in o]  # the values that did not resolve
            key = getattr(err, "full_key", None) or ", ".join(given)
            if line is not None:
                exit_with(UserError(f"{key}: {line}" if key and not line.startswith(str(key)) else line))
        if not reportable(err):
            raise
        exit_with(err)


def mode_is_the_command_lines(args) -> bool:
    """Whether the run mode follows from the command line alone: -m or not (composing_once then
    skips get_mode's composition). In kvbench's configs only the experiment group sets the mode,
    so this holds unless the command line chooses an experiment, sets hydra.mode or a search
    path, names another primary config, or chooses a group option that is not one of kvbench's
    own (a plugin's YAML might set the mode)."""
    if args.multirun:  # a config's mode can only be MULTIRUN too (or RUN, which -m overrides)
        return True
    if args.config_path or args.config_name or args.config_dir:
        return False
    conf = resources.files("kvbench.conf")
    for key, value in map(split_override, args.overrides):
        if key.startswith(("hydra.mode", "hydra.searchpath")) or key == "experiment":
            return False
        group = conf / key
        if "." not in key and "/" not in key and value and group.is_dir() and not (group / f"{value}.yaml").is_file():
            return False
    return True


def refuse_unreadable_rerun(path: str) -> None:
    """--experimental-rerun FILE: Hydra unpickles a run's .hydra/config.pickle; a file that is not
    one, or none at all, is refused in one line."""
    import pickle

    if not Path(path).is_file():  # Hydra's own line spoke of overrides
        raise UserError(
            f"--experimental-rerun {path}: {'is a directory' if Path(path).is_dir() else 'no such file'}; give a "
            f"run's .hydra/config.pickle (written with +hydra.callbacks.save_job_info._target_="
            f"hydra.experimental.callbacks.PickleJobInfoCallback)"
        )
    try:
        with open(path, "rb") as file:
            config = pickle.load(file)
    except Exception as err:  # noqa: BLE001 (whatever unpickling raises: the file is not a pickled config)
        config = err
    if not isinstance(config, DictConfig):
        raise UserError(
            f"--experimental-rerun {path}: not a config Hydra pickled ({type(config).__name__}); give a run's "
            f".hydra/config.pickle"
        )


def refuse_replacing_a_run(cfg: DictConfig) -> None:
    """A single run into a folder that holds an earlier run's metrics.csv would replace its
    results (Hydra writes its .hydra/ there before the run starts): refused while composing. So
    is a run into a sweep's folder (and a sweep into a run's: refuse_a_sweep_into_a_run):
    bench-report reads a sweep's points from its subfolders, so the run's row would go unread."""
    try:
        if OmegaConf.select(cfg, "hydra.mode") == RunMode.MULTIRUN:
            return
        folder = OmegaConf.select(cfg, "hydra.run.dir")
    except OmegaConfBaseException:  # a folder named by what only the job knows (${hydra.job.id})
        return
    if not folder:
        return
    folder = Path(folder)
    if (folder / "metrics.csv").is_file():
        raise UserError(
            f"hydra.run.dir={folder} holds an earlier run's metrics.csv, which this run would replace: give "
            f"a new folder (or move that one away)"
        )
    if (folder / "multirun.yaml").is_file() or any(folder.glob("*/metrics.csv")):
        raise UserError(
            f"hydra.run.dir={folder} holds a sweep's points: a run's result would go unread beside them; give "
            f"a new folder"
        )


def refuse_a_sweep_into_a_run(cfg: DictConfig) -> None:
    """A sweep into a single run's folder: the sweep's summary reads its points' subfolders, not
    the run's metrics.csv beside them."""
    try:
        folder = OmegaConf.select(cfg, "hydra.sweep.dir")
    except OmegaConfBaseException:  # a folder named by what only the job knows
        return
    if folder and (Path(folder) / "metrics.csv").is_file():
        raise UserError(
            f"hydra.sweep.dir={folder} holds a single run's metrics.csv, which the sweep's summary would not "
            f"read; give a new folder"
        )


CHECKS_SAID = 100  # a sweep of this many points or more says it is being checked


@contextlib.contextmanager
def composing_once(args):
    """Hydra, for the length of one `main`, composing each config it runs once.

    - Hydra's `get_mode` composes the whole config once more, only to read `hydra.mode`; that is
      skipped where `mode_is_the_command_lines(args)` (about 0.1 s of a short run).
    - Hydra's sweeper composes every point's config to check a batch before it launches any
      point, and its launcher composed each again to run it (about 0.15 s a point: the README's
      sweep took 6.9 s so, 6.3 s without). The check keeps what it composed and the launcher
      takes each checked config once, so a bad point still stops a sweep before its first point
      runs. A launcher that composes in another process (joblib, submitit) composes there.

    docs/design.md has the measurements."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra
    from hydra.plugins.sweeper import Sweeper

    compose = ConfigLoaderImpl.load_sweep_config
    checked: dict[tuple, object] = {}
    # a run, not a look at its config (--cfg, --info, --help); Hydra's rerun of a pickled config
    # composes nothing, so the run-folder check never meets it
    looks = (args.cfg, args.info)
    running = all(look is None for look in looks) and not (args.help or args.hydra_help or args.shell_completion)
    swept_folders: set[str] = set()  # the point folders of this sweep's batches so far

    def validate_batch_is_legal(self, batch) -> None:
        global sweep_dir  # an interrupt before the first point ends names the sweep's folder too
        sweep_dir = str(OmegaConf.select(self.config, "hydra.sweep.dir", default=None) or "") or None
        loader = getattr(self, "hydra_context", None)
        loader = loader.config_loader if loader is not None else self.config_loader
        if len(batch) >= CHECKS_SAID:  # composing takes 0.15-0.25 s a point, in silence
            print(f"kvbench: checking the sweep's {len(batch):,} points before the first runs", file=sys.stderr)
        for overrides in batch:
            checked[tuple(overrides)] = compose(loader, master_config=self.config, sweep_overrides=list(overrides))
        configs = [checked[tuple(overrides)] for overrides in batch]
        refuse_swept_experiments(batch)
        for config in configs:  # before refuse_twice_swept: the preset makes the points one
            choices = OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}
            preset_allocator_clash(choices.get("preset"), choices.get("allocator"))
        refuse_absent_baseline(batch, configs)
        refuse_unmeasured_sweeps(batch)
        refuse_twice_swept(batch, configs)
        folders = point_folders(configs)  # None: they resolve only as each point launches
        if folders is not None:
            subdir = OmegaConf.to_container(self.config.hydra.sweep, resolve=False).get("subdir")
            refuse_a_sweep_of_nothing(str(subdir), folders)
            refuse_nested_folders(folders)
            refuse_shared_folders(batch, folders)
            refuse_other_sweeps_points(sweep_dir, folders, swept_folders)
        refuse_bad_points(batch, configs)  # last: the sweep's own shape is checked first

    def load_sweep_config(self, master_config, sweep_overrides):
        config = checked.pop(tuple(sweep_overrides), None)
        return config if config is not None else compose(self, master_config, sweep_overrides)

    load, apply = ConfigLoaderImpl.load_configuration, ConfigLoaderImpl._apply_overrides_to_config
    getting_mode: list = []  # not empty while Hydra's get_mode composes, only to read hydra.mode
    swept: set[str] = set()  # while a sweep's master config composes: the groups its points choose
    master: list = []  # not empty while a sweep's master config composes

    def load_configuration(self, config_name, overrides, run_mode, *args, **kwargs):
        if run_mode != RunMode.MULTIRUN:
            cfg = load(self, config_name, overrides, run_mode, *args, **kwargs)
            if running:
                refuse_replacing_a_run(cfg)
            return cfg
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(list(overrides))
        swept.update(o.key_or_group for o in parsed if o.is_sweep_override() and "." not in o.key_or_group)
        master.append(True)
        try:
            cfg = load(self, config_name, overrides, run_mode, *args, **kwargs)
            if running and not getting_mode:  # before Hydra writes the sweep's multirun.yaml there
                refuse_a_sweep_into_a_run(cfg)
            return cfg
        finally:
            swept.clear()
            master.clear()

    def apply_overrides(overrides, cfg) -> None:
        # A key of a group the points choose (-m +allocator=paged,hybrid allocator.block_size=32)
        # has no node in the master config, which composes without the swept groups: each
        # point's config applies it. So has a group an experiment's own sweep chooses (its
        # hydra.sweeper.params sweep +allocator, and the command line gives allocator.watermark).
        params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None) if master else None
        chosen = {str(key).lstrip("+~") for key in params or {} if "." not in str(key)}
        apply([o for o in overrides if o.key_or_group.split(".")[0] not in (swept | chosen) - set(cfg)], cfg)

    show = Hydra.show_cfg

    def show_cfg(self, config_name, overrides, cfg_type, package, resolve=False) -> None:
        """`--cfg job|all` prints the config, then checks it as a run would: a config a run
        refuses is printed, then refused (one line, exit code 2), not shown as if it would run."""
        shown: list = []  # the config printed (job, or all: job and hydra)
        sanitize = self.get_sanitized_cfg

        def keep_printed(cfg, kind):
            shown.append(sanitize(cfg, kind))
            return shown[-1]

        self.get_sanitized_cfg = keep_printed  # show_cfg composes and prints without handing it back
        try:
            show(self, config_name, overrides, cfg_type, package, resolve)
        finally:
            del self.get_sanitized_cfg
        if cfg_type in ("job", "all") and shown:
            sys.stdout.flush()
            try:
                check_run_config(task_config(shown[0]))
                from hydra.types import RunMode

                from kvbench.reporting.experiment_checks import check_experiment
                from kvbench.reporting.paper import report_settings

                full = self.compose_config(config_name, overrides, run_mode=RunMode.MULTIRUN)  # with its hydra node
                check_experiment(full, report_settings(full.get("report"))["paper"])  # what the sweep's start refuses
            except UserError as err:
                raise UserError(f"{err} (the config printed above is one a run refuses)") from None

    patches = [
        (Hydra, "show_cfg", show_cfg),
        (Sweeper, "validate_batch_is_legal", validate_batch_is_legal),
        (ConfigLoaderImpl, "load_sweep_config", load_sweep_config),
        (ConfigLoaderImpl, "load_configuration", load_configuration),
        (ConfigLoaderImpl, "_apply_overrides_to_config", staticmethod(apply_overrides)),
    ]
    if mode_is_the_command_lines(args):  # None: RUN, or MULTIRUN with -m (Hydra's _run_app)
        patches.append((Hydra, "get_mode", lambda self, config_name, overrides: None))
    else:  # an experiment's mode: get_mode composes to read it, and takes any error for "not MULTIRUN"
        get_mode = Hydra.get_mode

        def reading_the_mode(self, *args, **kwargs):
            getting_mode.append(True)  # the checks wait for the composition that runs
            try:
                return get_mode(self, *args, **kwargs)
            finally:
                getting_mode.pop()

        patches.append((Hydra, "get_mode", reading_the_mode))
    originals = [(owner, name, vars(owner)[name]) for owner, name, _ in patches]  # a staticmethod as it is
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


@contextlib.contextmanager
def missing_package_is_bad_input(parsed):
    """`bench --cfg job -p nope`: Hydra prints that the package is not found and exits 1, the code
    of a crash; it is bad input, one line and exit 2."""
    if parsed.cfg is None or parsed.package is None:
        yield
        return
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            yield
    except SystemExit as err:
        if err.code == 1 and "not found in config" in said.getvalue():
            raise UserError(
                f"-p {parsed.package} names no part of the config: give a group or key that bench --cfg job "
                f"prints (e.g. -p workload, -p scheduler.max_num_seqs)"
            ) from None
        raise
    finally:
        sys.stderr.write(said.getvalue() if "not found in config" not in said.getvalue() else "")


folders_before: set[Path] = set()  # the sweep folders named on the command line that existed before it ran


def remove_bare_sweep_folders() -> None:
    """A sweep that ends before its first point (refused, interrupted, or stopped by a bad value
    list such as range(1,9,0), whose folder's lock was taken before its points were checked)
    leaves no folder holding only Hydra's multirun.yaml and the lock; a folder that existed
    before the command is the user's, and stays."""
    folders = {Path(sweep_dir)} if sweep_dir else set()
    folders |= {lock.path.parent for lock in sweep.SweepLock.held}
    for folder in folders:
        if folder.resolve() not in folders_before:
            sweep.remove_if_bare(folder, ("multirun.yaml", sweep.LOCK))


@guarded_stdout()  # a console closed early costs the console only
def main(argv: list[str] | None = None) -> None:
    """`bench [OVERRIDES]`: every error kvbench can name is one line and exit code 2; a bug in
    kvbench keeps its traceback (HYDRA_FULL_ERROR=1 shows Hydra's own for every error)."""
    from hydra._internal.utils import get_args_parser

    from kvbench.schema.hydra_errors import hydra_line, sweeper_params_line

    global single_run_done, sweep_dir
    single_run_done, sweep_dir = False, None
    folders_before.clear()  # a hydra.sweep.dir that exists already is the user's: never removed
    folders_before.update(
        Path(value).resolve() for key, value in map(split_override, argv or sys.argv[1:]) if key == "hydra.sweep.dir"
    )
    folders_before.intersection_update(path for path in list(folders_before) if path.exists())
    args = sys.argv[1:] if argv is None else list(argv)
    if "--version" in args:  # kvbench's, where Hydra's flag would print only its own
        print(f"kvbench {kvbench.__version__} (Hydra {hydra.__version__})")
        return
    # argparse takes one run of overrides: `bench a=1 -m b=1,2` must reach Hydra as `-m a=1 b=1,2`.
    sys.argv[1:] = sorted(args, key=lambda arg: arg not in ("-m", "--multirun"))
    flags = get_args_parser()  # Hydra's own, parsed here first so a bad flag is one line too
    flags.error = lambda message: exit_with(UserError(f"bench: {message} (see bench --help)"))
    parsed = flags.parse_intermixed_args(sys.argv[1:])  # `a=1 --cfg job b=2`: both overrides
    others = list(sys.argv[1:])
    for override in reversed(parsed.overrides):  # Hydra's parser takes one run of them, after the flags
        del others[len(others) - 1 - others[::-1].index(override)]
    sys.argv[1:] = parsed.overrides + others  # before the flags: `--info` would take a later one for its value
    try:
        if parsed.hydra_help and parsed.overrides:  # Hydra composes its own help: every key read as unknown
            raise UserError(
                "--hydra-help shows Hydra's own flags and takes no overrides: drop them (bench --help shows "
                "kvbench's config with them)"
            )
        if (parsed.help or parsed.hydra_help) and parsed.multirun and sweeps(*parsed.overrides):
            raise UserError(
                "--help shows one config and its fields: give it one value of each key (or none), without "
                "-m's lists; the sweep runs without --help"
            )
        refuse_null_groups(parsed.overrides)
        refuse_overflowing_numbers(parsed.overrides)
        refuse_underscored_numbers(parsed.overrides)
        refuse_unusable_hydra_paths(parsed.overrides)
        refuse_empty_ranges(parsed.overrides)
        if parsed.multirun:
            refuse_huge_sweeps(parsed.overrides)
        refuse_deleted_keys(parsed.overrides)
        refuse_keys_given_twice(parsed.overrides)  # a sweep's, and a group set through a dict
        if parsed.experimental_rerun is not None:
            refuse_unreadable_rerun(parsed.experimental_rerun)
        if parsed.package is not None and parsed.cfg is None:  # Hydra would run the job, the flag unread
            raise UserError("bench: -p/--package selects the part of the config --cfg prints: give --cfg job with it")
    except UserError as err:
        exit_with(err)
    user_setting = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises, and the errors below become one line
    try:
        with composing_once(parsed), missing_package_is_bad_input(parsed):
            _main()
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM / SIGHUP (errors.Terminated)
        if user_setting == "1":
            raise
        remove_bare_sweep_folders()  # before the line below, which says whether the folder stays
        if not sweep_dir:
            said = "the run wrote no result"
        elif not Path(sweep_dir).is_dir():  # stopped while its points were checked, or removed bare
            said = "the sweep stopped before its first point ran: nothing was written"
        else:
            said = (
                f"the points that finished keep their rows in {sweep_dir}; the same command with "
                f"hydra.sweep.dir={sweep_dir} runs only the rest"
            )
        exit_interrupted(said, err)
    except Exception as err:
        line = sweeper_params_line(err, [split_override(o)[0] for o in parsed.overrides]) or hydra_line(err)
        if type(err).__name__ == "TerminatedWorkerError" and sweep_dir:  # joblib's: a worker killed (OOM?)
            line = (
                f"a worker process of the joblib launcher died while it ran a point (killed, or out of memory: see "
                f"dmesg); the points that finished keep their rows in {sweep_dir}, and the same command with "
                f"hydra.sweep.dir={sweep_dir} runs only the rest"
            )
        if user_setting == "1" or (line is None and not reportable(err)):
            raise
        exit_with(UserError(line) if line is not None else err)
    finally:
        remove_bare_sweep_folders()
        sweep.SweepLock.release_all()
        if user_setting is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = user_setting


if __name__ == "__main__":
    # `python -m kvbench.cli` (bench-compare --against runs bench so): run the module by its own
    # name, whose functions a joblib worker can unpickle; __main__'s it cannot
    from kvbench import cli
    from kvbench.errors import end_on_termination

    end_on_termination()
    cli.main()
