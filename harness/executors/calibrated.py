"""CalibratedExecutor: each simulated step's time from a model fitted to a measured profile.

A profile (profile.csv, written by scenario=profile) holds one row per measured batch shape:
what it was measured on (model, its shape, dtype, device, backend, graph), the batch features
and the step-time statistics. Loading it refits the step-time model from the rows
(kvbench.executors.step_fit; deterministic, milliseconds), so the CSV is the one source and its
sha256 names the calibration a result came from. A profile measured for another model, dtype,
backend, graph or device is refused: its step times say nothing about this run.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.scheduler import Batch
from kvbench.core.spec import Hardware, ModelSpec
from kvbench.errors import UserError
from kvbench.executors.base import StepResult
from kvbench.executors.cost_model import CopyTime
from kvbench.executors.step_fit import FEATURES, FitReport, fit

# What a profile must agree with, in the order a refusal checks them.
IDENTITY = ("model", "model_shape", "dtype", "backend", "graph", "device")
TIME_COLUMN = "time_s_median"
REQUIRED = IDENTITY + ("phase",) + FEATURES + (TIME_COLUMN, "heldout")


def device_name(device) -> str:
    """How a profile names the device it was measured on: cpu:<processor> or cuda:<GPU name>."""
    if str(device).split(":")[0] == "cpu":  # torch is not needed to name a CPU (2 s to import)
        return f"cpu:{_processor()}"
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{_processor()}"


# A GPU that torch can use has a driver's device node; without one torch.cuda.is_available() is
# False, so a machine with none is a CPU without importing torch (2 s of a 10k-request simulation).
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")


def local_device_name() -> str:
    """The device scenario=profile would measure here with scenario.device=auto."""
    if not any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return device_name("cpu")
    import torch

    return device_name("cuda" if torch.cuda.is_available() else "cpu")


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def model_shape(model: ModelSpec) -> str:
    """The dimensions that set a step's work; a model of the same name overridden differs here."""
    pattern = "".join(k[0] for k in model.layer_kinds)
    return (
        f"L{model.num_layers}:{pattern}-h{model.hidden_size}-q{model.num_heads}-kv{model.num_kv_heads}"
        f"-d{model.head_dim}-i{model.intermediate_size}-v{model.vocab_size}"
    )


@dataclass(frozen=True)
class Profile:
    path: str
    sha256: str
    identity: dict
    rows: list
    report: FitReport


def fit_column(row: dict) -> str:
    """The step time a profile's model is fitted to: each shape's mean (`fit_to: mean`, pauses
    included: what a queue of served steps adds up to) or its median (a typical step)."""
    return "time_s_mean" if row.get("fit_to") == "mean" else TIME_COLUMN


MAX_FEATURE = 1e15  # tokens, sequences, context tokens or attention pairs of one step


def _number(path: str, line: int, row: dict, column: str) -> float:
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        raise UserError(f"profile {path} row {line}: {column}={row[column]!r} is not a number") from None
    timed = column in (TIME_COLUMN, "time_s_mean")  # a step takes time: the fit divides by it
    if not math.isfinite(value) or value < 0 or (timed and value <= 0):
        raise UserError(
            f"profile {path} row {line}: {column}={row[column]!r} must be a finite number {'> 0' if timed else '>= 0'}"
        )
    if column in FEATURES and value > MAX_FEATURE:  # no step of any model on any device holds as many
        raise UserError(f"profile {path} row {line}: {column}={row[column]!r} is no step's (> {MAX_FEATURE:.0e})")
    if column in FEATURES and value != int(value):  # tokens and sequences are counted
        raise UserError(f"profile {path} row {line}: {column}={row[column]!r} must be a whole number")
    return value


def load_profile(path: str, key: str = "executor.profile") -> Profile:
    """Read and check a profile.csv (naming the row at fault), then fit its step-time model;
    `key` is the setting that named the file, for the error."""
    file = Path(path)
    if file.is_dir():
        inside = file / "profile.csv"
        hint = f"did you mean {key}={str(inside)!r}?" if inside.is_file() else "write one with bench scenario=profile"
        raise UserError(f"{key}={path!r} is a directory, not a profile.csv; {hint}")
    if not file.is_file():
        raise UserError(f"{key}={path!r}: no such file; write one with bench scenario=profile")
    data = file.read_bytes()
    # The csv module, not pandas: this runs at every calibrated simulation's start, where
    # importing pandas (0.3 s) would be a tenth of a 1,000-request run; cells stay text, each
    # checked below with its line named.
    try:
        lines = list(csv.reader(io.StringIO(data.decode(errors="replace"))))
    except csv.Error as err:
        raise UserError(
            f"{key}={path!r} is not a readable CSV file ({err}); write one with bench scenario=profile"
        ) from None
    header = lines[0] if lines else []
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise UserError(f"profile {path} lacks column(s) {', '.join(missing)}; it is not a scenario=profile file")
    rows, identity, shapes = [], None, {}
    for line, cells in enumerate(lines[1:], start=2):  # line 1 is the header
        if not cells:
            continue
        if len(cells) != len(header):
            raise UserError(f"profile {path} row {line}: {len(cells)} fields, the header has {len(header)}")
        row = dict(zip(header, cells))
        if any(row[c] == "" for c in REQUIRED):
            raise UserError(f"profile {path} row {line}: an empty required field")
        here = {key: row[key] for key in IDENTITY}
        if identity is None:
            identity = here
        elif here != identity:
            changed = next(k for k in IDENTITY if here[k] != identity[k])
            raise UserError(
                f"profile {path} row {line}: {changed}={here[changed]!r} differs from the first "
                f"row's {identity[changed]!r}; one profile holds one model on one device"
            )
        if fit_column(row) not in row:
            raise UserError(f"profile {path} row {line}: fit_to=mean but no {fit_column(row)} column")
        if row["heldout"] not in ("True", "False"):  # anything else read as False: a silent in-sample fit
            raise UserError(f"profile {path} row {line}: heldout={row['heldout']!r} must be True or False")
        rows.append({**row, **{c: _number(path, line, row, c) for c in FEATURES + (TIME_COLUMN, fit_column(row))}})
        shape = (row["phase"], *(rows[-1][c] for c in FEATURES))
        if shape in shapes:  # scenario=profile measures each shape once: a row copied, or files joined
            raise UserError(
                f"profile {path} row {line} repeats row {shapes[shape]}'s shape ({row['phase']}, "
                f"{', '.join(f'{c}={rows[-1][c]:.0f}' for c in FEATURES)}); a profile measures each shape once"
            )
        shapes[shape] = line
    if len(rows) < len(FEATURES) + 1:
        raise UserError(f"profile {path} has {len(rows)} measured shape(s); fitting needs at least {len(FEATURES) + 1}")
    # the split scenario=profile scored the fit on, so the reload reproduces its choice and error
    held = [i for i, r in enumerate(rows) if r["heldout"] == "True"]
    refuse_square_pairs(path, rows)
    report = fit(rows, [r[fit_column(r)] for r in rows], held)
    refuse_edited(path, rows, report)
    return Profile(str(file), hashlib.sha256(data).hexdigest(), identity, rows, report)


def refuse_square_pairs(path: str, rows: list[dict]) -> None:
    """A profile written when a prompt's attention pairs were counted L x L, not the causal
    L(L+1)/2 the scheduler counts now: its per-pair cost, fitted to the old count, would predict
    a prefill at about half its time. Told by its prefill-only shapes (n prompts of L tokens)."""
    for line, row in enumerate(rows, start=2):
        if row.get("phase") != "prefill" or not row.get("prefill_seqs") or not row.get("prefill_len"):
            continue
        try:
            seqs, length = int(row["prefill_seqs"]), int(row["prefill_len"])
        except ValueError:
            continue
        if length > 1 and row["attention_pairs"] == seqs * length * length:
            raise UserError(
                f"profile {path} row {line} counts {seqs} prompt(s) of {length} tokens as {seqs * length * length} "
                f"attention pairs, where a causal prefill computes {seqs * length * (length + 1) // 2}: it was "
                f"written by an earlier kvbench; profile again (bench scenario=profile)"
            )


def refuse_edited(path: str, rows: list[dict], report: FitReport) -> None:
    """A profile's rows hold the predictions scenario=profile fitted to their times; a reload
    refits and must give them again (to the 7 digits a CSV keeps, and then some). Times edited
    since (rescaled to ms, a column dropped that chose what was fitted) give others."""
    written = [(line, r) for line, r in enumerate(rows, start=2) if r.get("predicted_s") not in (None, "")]
    if not written:
        return  # a profile written before predictions were kept: nothing to check against
    for (line, row), refit in zip(written, report.model.predict_rows([r for _, r in written])):
        try:
            kept = float(row["predicted_s"])
        except ValueError:
            raise UserError(f"profile {path} row {line}: predicted_s={row['predicted_s']!r} is not a number") from None
        if not math.isclose(refit, kept, rel_tol=1e-4, abs_tol=1e-12):
            raise UserError(  # one edited time moves every prediction: the first that moved is not the edit's
                f"profile {path}: its times refit to other predictions than it was written with (the first, row "
                f"{line}: {refit:.6g} s, not predicted_s={kept:.6g} s): the file was edited since scenario=profile "
                f"wrote it; profile again"
            )


def check_profile(profile: Profile, expected: dict) -> None:
    """Refuse a profile whose identity differs from `expected` (a key absent there is not checked)."""
    for key in IDENTITY:
        if key in expected and str(expected[key]) != profile.identity[key]:
            raise UserError(
                f"profile {profile.path} was measured for {key}={profile.identity[key]!r}, "
                f"not {expected[key]!r}; profile this configuration with bench scenario=profile"
            )


class CalibratedExecutor:
    simulated = True
    needs_sequences = False  # reads only the batch's totals (executors/base.py)

    def __init__(self, profile: Profile, model: ModelSpec, hardware: Hardware, time_scale: float = 1.0):
        self.profile = profile
        predict = profile.report.model.predict
        self.predict = predict if time_scale == 1.0 else lambda *features: time_scale * predict(*features)
        # swaps and copies on the device the profile did not time: the hardware's copy model
        self.copy_time = CopyTime(model, hardware)

    def execute(self, batch: Batch) -> StepResult:
        step_s = self.predict(batch.num_tokens, batch.num_seqs, batch.context_tokens, batch.attention_pairs)
        if batch.swapped_blocks or batch.copied_slots:
            step_s += self.copy_time(batch)
        return StepResult(step_s)
