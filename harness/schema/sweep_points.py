"""A sweep's points checked together, once Hydra has composed each, before the first one runs:
a point that would fail, two points that are one, points that share a folder or meet another
sweep's, a sweep of experiments, a report baseline no point runs. A sweep refused so has run
nothing and lost nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError, InterpolationResolutionError

from kvbench import schema
from kvbench.errors import UserError
from kvbench.schema.overrides import run_mode_keys, split_override
from kvbench.schema.unread import refuse_unread_overrides


def task_config(config: DictConfig) -> DictConfig:
    """A composed config without its `hydra` node: the config a point's run is handed."""
    return OmegaConf.masked_copy(config, [key for key in config if key != "hydra"])


def preset_allocator_clash(preset: str | None, allocator: str | None) -> None:
    if preset == "vllm" and allocator not in (None, "paged"):
        raise UserError(
            f"+preset=vllm configures vLLM's paged allocator (conf/preset/vllm.yaml), not allocator={allocator}: "
            f"drop +allocator={allocator}, or the preset"
        )


def refuse_swept_experiments(batch) -> None:
    """Before a sweep's first point: `-m +experiment=fig2,fig13` would run one default point of
    each, not their sweeps (an experiment's sweep is its own command's), and compare none."""
    chosen = {value for overrides in batch for key, value in map(split_override, overrides) if key == "experiment"}
    if len(chosen) > 1:
        names = sorted(chosen)
        raise UserError(
            f"+experiment is swept ({', '.join(names)}): each experiment is a sweep of its own, which a sweep "
            f"over experiments would not run; run them one at a time (bench +experiment={names[0]}, ...)"
        )


def refuse_unmeasured_sweeps(batch) -> None:
    """`-m progress=true,false`: keys that change how a point runs, not what it measures
    (run_mode_keys), name no point folder, so two points would be one (it read "hydra.sweep.subdir
    gives a point the folder '.'", or "keep the default subdir", which was the one in use)."""
    if len(batch) < 2:
        return
    values: dict[str, set] = {}
    for overrides in batch:
        for key, value in map(split_override, overrides):
            values.setdefault(key, set()).add(value)
    unmeasured = sorted(key for key, seen in values.items() if len(seen) > 1 and key in run_mode_keys())
    if unmeasured:
        one = len(unmeasured) == 1
        raise UserError(
            f"the sweep varies {', '.join(unmeasured)}, which {'changes' if one else 'change'} how a point runs, "
            f"not what it measures: {'it names' if one else 'they name'} no point folder, so two points would "
            f"be one; give {'it' if one else 'each'} one value"
        )


def refuse_a_sweep_of_nothing(subdir: str, folders: list[str]) -> None:
    """`bench -m` with no values to sweep (or only settings that name no point): under the
    default subdir (`subdir`: its text, unresolved), which names a point by its overrides, its
    one point had no name, and was refused as a subdir of '.', which nobody gave."""
    if [os.path.normpath(f) for f in folders] == ["."] and "point_dirname" in subdir:
        raise UserError(
            "-m sweeps the values given as lists (-m +allocator=paged,contiguous workload.rate=1,2); with none to "
            "sweep, run once without -m"
        )


def refuse_nested_folders(folders: list[str]) -> None:
    """A point's folder must be a folder of the sweep's own: the sweep finds its points, and a
    rerun its finished ones, at SWEEP/*/metrics.csv."""
    for folder in map(os.path.normpath, folders):  # s0/ and ./s0 are s0
        if Path(folder).name != folder or folder in (".", ".."):
            raise UserError(
                f"hydra.sweep.subdir gives a point the folder {folder!r}, not a folder directly in the sweep's: the "
                f"sweep finds its points at hydra.sweep.dir/*/metrics.csv; give a subdir without / or .."
            )


def point_folders(configs) -> list[str] | None:
    """Each point's folder name, or None where one resolves only as its point launches (a
    subdir of ${hydra.job.num})."""
    try:
        return [str(OmegaConf.select(c, "hydra.sweep.subdir", throw_on_resolution_failure=True)) for c in configs]
    except Exception:  # noqa: BLE001 (any resolution failure: the checks below are skipped)
        return None


def refuse_other_sweeps_points(sweep_dir: str | None, folders: list[str], swept: set[str]) -> None:
    """Before a sweep's first point: a sweep folder that holds results of points this sweep does
    not run (a corrected sweep into the folder of the first, the same value spelled 1 and then
    1.0). Its summary, report, paper comparison and exit code cover every point in the folder:
    the earlier sweep's failed points would fail this one, its rows would be averaged in."""
    swept.update(folders)
    if not sweep_dir:
        return
    others = sorted(p.parent.name for p in Path(sweep_dir).glob("*/metrics.csv") if p.parent.name not in swept)
    if others:
        listed = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise UserError(
            f"{sweep_dir} holds points this sweep does not run ({listed}), which its summary and report "
            f"would count; give a new hydra.sweep.dir, or this folder's whole list of points again (its "
            f"finished points are skipped), or remove those folders"
        )


def refuse_shared_folders(batch, folders: list[str]) -> None:
    """Before a sweep's first point: points whose folders are one (hydra.sweep.subdir=same) would
    each overwrite the last one's result."""
    for first, (folder, overrides) in enumerate(zip(folders, batch)):
        if folder in folders[:first]:
            other = list(batch[folders.index(folder)])
            apart = [o for o in other if o not in overrides], [o for o in overrides if o not in other]
            raise UserError(
                f"hydra.sweep.subdir gives the points {' '.join(apart[0])} and {' '.join(apart[1])} one folder, "
                f"{folder!r}: each would overwrite the last; keep the default subdir, or one that names each point"
            )


def refuse_twice_swept(batch, configs) -> None:
    """Before a sweep's first point: two points that are one (seed=1000,1e3: Hydra keeps both
    spellings) would run twice and leave two rows of one identity, which no comparison can match."""

    def canonical(value):  # 1e3 is 1000
        if isinstance(value, dict):
            return {k: canonical(v) for k, v in value.items() if k != "hydra"}
        if isinstance(value, list):
            return [canonical(v) for v in value]
        return int(value) if isinstance(value, float) and value.is_integer() else value

    seen: dict[str, list[str]] = {}
    for overrides, config in zip(batch, configs):
        body = json.dumps(canonical(OmegaConf.to_container(config, resolve=False)), sort_keys=True, default=str)
        if body in seen:
            first, second = seen[body], list(overrides)
            apart = [o for o in first if o not in second], [o for o in second if o not in first]
            if not apart[0]:  # the same value listed twice (+allocator=paged,paged)
                raise UserError(
                    f"the sweep runs one point twice ({' '.join(first)}): a value is listed twice; give each once"
                )
            raise UserError(
                f"the sweep runs one point twice: {' '.join(apart[0])} and {' '.join(apart[1])} are the same "
                f"setting; give each value once"
            )
        seen[body] = list(overrides)


def refuse_bad_points(batch, configs) -> None:
    """Before a sweep's first point: a point whose config the schema refuses (`-m workload.rate=1,x`),
    or whose allocator cannot hold its model's layers (`-m model=glob(*)` with paged and a
    sliding-window model), would fail only when its turn came, after the points before it had
    run. What cannot be decided from the config alone (an interpolation that resolves only as
    its point launches) is left to the point, which fails with its own error."""
    from kvbench.scenarios.build import allocator_class, load_specs, refuse_plugins_that_cannot_meet
    from kvbench.scenarios.run import preflight

    traces_read: set[str] = set()  # each trace file's rows are checked once, whatever points share it
    for overrides, config in zip(batch, configs):
        try:
            try:  # resolved here, without the point's own Hydra settings (a ${hydra:...} value fails)
                data = OmegaConf.to_container(task_config(config), resolve=True)
            except (InterpolationKeyError, InterpolationResolutionError) as err:
                # ${nosuch.key}, fig14_15.sharing=foo, fig12.duration_s=5: no launch resolves it
                if isinstance(err, InterpolationKeyError) or "is not a container" in str(err):
                    schema.validate(task_config(config))  # which says so in kvbench's words
                continue
            except Exception:  # noqa: BLE001 (it resolves only as its point launches, or fails there)
                continue
            schema.validate(data)
            point = OmegaConf.create(data)
            model = load_specs(point)[0]
            allocator_class(point, model)
            refuse_plugins_that_cannot_meet(point, model)
            preflight(point)
            refuse_unread_overrides(point, OmegaConf.select(config, "hydra.overrides.task", default=None) or overrides)
            trace = point.workload.get("path") if point.workload.get("kind") == "trace" else None
            if trace and str(trace) not in traces_read:  # a malformed row fails its point only as it runs
                from kvbench.core.workload import load_trace

                load_trace(str(trace))
                traces_read.add(str(trace))
        except UserError as err:
            raise UserError(
                f"the sweep's point {','.join(overrides) or '(no overrides)'} would fail: {err}; "
                f"no point has run: fix or drop that value"
            ) from None
        except Exception:  # noqa: BLE001 (not decidable before the point launches)
            continue


def refuse_absent_baseline(batch, configs) -> None:
    """Before a sweep's first point: a report.baseline given that no point's allocator is (its
    report would end the sweep with this error, every point run)."""
    asked = {value for overrides in batch for key, value in map(split_override, overrides) if key == "report.baseline"}
    asked.discard("null")  # the default: the sweep's first system in the paper's order
    from kvbench.scenarios.build import plugin_cfg  # a point that names no allocator runs the default

    systems = [str(plugin_cfg(c, "allocator")["name"]) for c in configs]
    for name in asked - set(systems):
        raise UserError(
            f"report.baseline={name!r} is not in the sweep; its allocators: "
            f"{', '.join(dict.fromkeys(systems)) or 'none'}"
        )
