"""Before an experiment's sweep runs: what its paper comparison would refuse at the sweep's end,
known from the config and the command line (the paper's model and GPU, the axes its comparison
needs swept, the systems it compares). A sweep refused here has run no point."""

from __future__ import annotations

import sys

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from kvbench.errors import UserError
from kvbench.reporting.paper import FIG2_SETUP, FIG12, report_settings
from kvbench.schema.overrides import parse_overrides, task_overrides

# settings that size the KV pool or change a system (a prefix: any key under it): the paper's
# numbers are its setup's pool, one A100-40GB's memory less OPT-13B's weights, and its systems
# as it defines them (vLLM in blocks of 16, Pow2 a buddy allocator)
POOL_KEYS = ("model.", "hardware.", "engine.kv_cache_bytes", "allocator.")


def fig2_setup(config, figure: str = "fig2") -> None:
    """Before fig2's, fig12's or fig13's sweep runs: the paper's model and GPU (and for fig2 its
    workload and rate, each swept value checked) as the sweep's config and command line give
    them, and no override that sizes the pool or changes a system (POOL_KEYS)."""
    sweep = config.hydra.sweeper.get("params") or {}
    given = {"model": config.get("model", {}).get("name"), "hardware": config.get("hardware", {}).get("name")}
    wanted = {"model": (FIG2_SETUP[0],), "hardware": (FIG2_SETUP[1],)}
    if figure == "fig2":  # fig12's and fig13's workloads and rates are their own sweeps'
        given |= {"workload": config.get("workload", {}).get("kind"), "rate": config.get("workload", {}).get("rate")}
        wanted |= {"workload": ("sharegpt", "trace"), "rate": (4.0,)}
    off = []
    for key, value in given.items():
        swept = swept_values(config, "workload" if key == "workload" else "workload.rate") if key in RUN_KEYS else None
        if swept is not None:  # the command line's values (a sweep's, or choice(2)'s one), each checked
            off += [f"{key}={v}" for v in swept if _as_given(key, v) not in wanted[key]]
        elif value is not None and key not in sweep and f"workload.{key}" not in sweep and value not in wanted[key]:
            off.append(f"{key}={value}")
    if off:
        setup = " with ShareGPT's lengths at 4 req/s" if figure == "fig2" else ""
        raise UserError(
            f"{figure}: the paper's numbers are {FIG2_SETUP[0]} on {FIG2_SETUP[1]}'s{setup}; this sweep would run "
            f"{', '.join(off)}: drop that override (or sweep without +experiment={figure})"
        )
    pool = [o.input_line for o in _command_line(config) if o.key_or_group.lstrip("+~").startswith(POOL_KEYS)]
    if pool:
        raise UserError(
            f"{figure}: {pool[0]} sizes the KV pool or changes a system, and the paper's numbers are its setup's "
            f"pool and systems ({FIG2_SETUP[0]} on one {FIG2_SETUP[1]}, blocks of 16): drop it (or sweep without "
            f"+experiment={figure})"
        )


RUN_KEYS = ("workload", "rate")  # fig2's keys a command line may set for every point or sweep


def _as_given(key: str, text: str):
    """A command line's value as the config holds it: a rate as a number (text that is none stays
    text, off the paper's setup; the sweep's check of its points has refused it already)."""
    if key != "rate":
        return text
    try:
        return float(text)
    except ValueError:
        return text


# The axes an experiment's comparison needs several values of (fig12's capacity curve, fig18's
# best block, fig19's crossover); the others (a system, a workload) may be narrowed
NEEDED_AXES = {  # workload.rate: fig12's and fig13's rates are their tables' (fig12.rates, fig13.rates)
    "fig12": ("fig12.point", "workload.rate"),
    "fig13": ("workload.rate",),
    "fig18": ("allocator.block_size",),
    "fig19": ("engine.preemption", "allocator.block_size"),
}


def _command_line(config, before: tuple | list = ()) -> list:
    """`before`, then the sweep's command line (hydra.overrides.task), as Hydra parses overrides."""
    return parse_overrides([*before, *task_overrides(config)])


def swept_values(config, key: str) -> list[str] | None:
    """The values a sweep's points take for `key` (a group or key, with or without its +), as the
    basic sweeper combines them: the experiment's params, then the command line's, the later
    winning; None where neither names it (the config's one value), or where only the sweeper
    knows them (glob(), which it expands against the config's options)."""
    from hydra.errors import HydraException

    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    values = None
    for override in _command_line(config, params):
        if override.key_or_group != key:
            continue
        if override.is_delete():
            values = None  # `~workload`: whatever that leaves is refused elsewhere
            continue
        try:
            taken = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        except HydraException:  # glob(): expanded by the sweeper, against the config's options
            values = None
            continue
        values = [str(getattr(value, "text", value)) for value in taken]  # 'sharegpt': its text
    return values


def fig12_setup(config) -> None:
    """Before fig12's sweep: its ratios are paged's capacity over oracle's and contiguous's, on
    ShareGPT; a sweep narrowed to fewer systems or another workload would run every point and
    then have nothing to compare. A rate the command line adds to a curve (fig12.rates.sharegpt.r11)
    at a point the sweep does not run would be read by none of them."""
    points = swept_values(config, "fig12.point") or [str(OmegaConf.select(config, "fig12.point", default=""))]
    for override in _command_line(config):
        parts = override.key_or_group.split(".")
        if len(parts) == 4 and parts[:2] == ["fig12", "rates"] and parts[3] not in points:
            raise UserError(
                f"{override.input_line} is read by no point: the sweep runs fig12.point={','.join(points)}; "
                f"sweep {parts[3]} too (fig12.point={','.join([*points, parts[3]])}), or drop it"
            )
    allocators, workloads = swept_values(config, "allocator"), swept_values(config, "workload")
    if allocators is not None and not any(a in allocators and b in allocators for a, b in FIG12):
        pairs = " or ".join(f"{a} with {b}" for a, b in FIG12)
        raise UserError(
            f"fig12's ratios compare {pairs}; this sweep runs allocator {', '.join(allocators)} only: "
            f"sweep a pair (+allocator=paged,oracle) or drop the override"
        )
    if workloads is not None and "sharegpt" not in workloads:
        raise UserError(
            f"fig12's ratios are ShareGPT's; this sweep runs workload {', '.join(workloads)} only: add sharegpt "
            f"(workload=sharegpt,{workloads[0]}) or drop the override"
        )


# where fig12's and fig13's rates are set: a workload's own table, which the points read by its kind
RATE_TABLES = {
    "fig12": "fig12.rates.sharegpt.r1=0.4 (each workload's points r1..r10)",
    "fig13": "fig13.rates.sharegpt=2",
}


def refuse_fixed_axes(config, paper: str | None) -> None:
    """Before an experiment's sweep: a command line that fixes an axis its comparison needs
    (`+experiment=fig19 engine.preemption=swap`) would run every point and then be refused."""
    needed = NEEDED_AXES.get(paper or "", ())
    tables = paper in RATE_TABLES and OmegaConf.select(config, f"{paper}.rates", default=None) is not None
    for override in _command_line(config) if needed else []:
        if override.key_or_group == "workload.rate" and tables:  # +experiment's tables: one value or several
            raise UserError(
                f"+experiment={paper} takes each workload's rates from {paper}.rates, not {override.input_line}: "
                f"give {RATE_TABLES[paper]} (a trace's: +{paper}.rates.trace=..., +{paper}.duration_s.trace=...)"
            )
        if override.key_or_group in needed and not override.is_sweep_override():
            swept = (config.hydra.sweeper.get("params") or {}).get(override.key_or_group, "several values")
            raise UserError(
                f"+experiment={paper} sweeps {override.key_or_group} over {swept}, and its comparison needs them: "
                f"{override.input_line} fixes it to one; drop it (or sweep without +experiment={paper})"
            )


SHARING_KNOBS = ("workload.n", "workload.beam_width")


# experiments whose numbers are vLLM's alone (sharing, block size, preemption): their config chooses paged
PAGED_ONLY = ("fig14_15", "fig18", "fig19")


def paged_only(config, paper: str) -> None:
    """Before fig14_15's, fig18's or fig19's sweep: another allocator's points would be compared
    with vLLM's numbers (or fail one by one: Orca shares nothing)."""
    names = swept_values(config, "allocator") or [OmegaConf.select(config, "allocator.name", default=None)]
    others = [str(name) for name in names if name not in (None, "paged")]
    if others:
        raise UserError(
            f"+experiment={paper} measures vLLM's paged allocator; this sweep would run allocator "
            f"{', '.join(others)}: drop that override (or sweep without +experiment={paper})"
        )


class PaperComparison(Callback):
    """Checks `report.*` before a sweep runs. The comparison itself is written at the sweep's
    end, after its summary (kvbench.callbacks.paper_comparison)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        paper = self._settings(config)["paper"]
        try:
            check_experiment(config, paper)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    @staticmethod
    def _settings(config: DictConfig) -> dict:
        try:
            return report_settings(config.get("report"))
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)


def refuse_a_table_given_one_value(config: DictConfig) -> None:
    """`+experiment=fig12 fig12.duration_s=5`: a table the points read by key, given one value,
    fails every point as it resolves; said here, before the sweep's points are composed to find
    it (80 of them, about 20 s, for fig12). The workload the sweep's master config resolves
    reads the same tables each point reads."""
    from omegaconf.errors import OmegaConfBaseException

    from kvbench import schema

    try:
        OmegaConf.to_container(config.workload, resolve=True)
    except OmegaConfBaseException as err:
        line = schema.missing_choice(config, err) if "is not a container" in str(err) else None
        if line:
            raise UserError(line) from None


def check_experiment(config: DictConfig, paper: str | None) -> None:
    """What the paper comparison would refuse at a sweep's end, known before it runs (the
    sweep's start, and `bench --cfg job`): `config` with its hydra node."""
    if paper:  # fig12, fig13, fig14_15 and fig18 read their tables by workload
        refuse_a_table_given_one_value(config)
    if paper in ("fig2", "fig12", "fig13"):
        fig2_setup(config, paper)
    if paper == "fig12":
        fig12_setup(config)
    if paper in PAGED_ONLY:
        paged_only(config, paper)
    if paper == "fig14_15":  # the experiment sets them from its width; the rows would be refused at the end
        knob = next((o for o in _command_line(config) if o.key_or_group in SHARING_KNOBS), None)
        if knob is not None:
            raise UserError(
                f"+experiment=fig14_15 sets workload.n and workload.beam_width from fig14_15.sharing and "
                f"fig14_15.width; {knob.input_line} would run another width than the one compared: drop it, "
                f"and give the width as fig14_15.width=2,4,6"
            )
    refuse_fixed_axes(config, paper)
