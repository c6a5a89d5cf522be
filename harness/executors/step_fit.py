"""A step-time model fitted to measured steps: its form, its coefficients, its held-out error.

The features are the roofline's own (kvbench.executors.cost_model): tokens fed to the model,
sequences scheduled, context tokens the attention reads, and attention pairs (the (query,
key) pairs causal attention computes: arith.causal_pairs). A step on any device is a sum of
work proportional to each: a fixed cost (launches, host work), per-token matmuls,
per-sequence metadata / attention calls / sampling, KV reads and attention FLOPs. So the
candidate forms are linear in them:

- `linear`: one set of coefficients for every step;
- `per_phase`: decode-only steps (one new token per sequence) and steps that carry a prompt
  fitted apart, because small decode matmuls run at a different efficiency than long prefills.

Each form is fitted on most of the profile's shapes and scored on the rest; the one with the
lower held-out median relative error wins (the simpler one on a tie), and is refitted on every
shape. Interpolating on the grid was rejected: the served batches fall between grid points in
four dimensions, and a dot product of five numbers costs nothing on the simulator's hot path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FEATURES = ("num_tokens", "num_seqs", "context_tokens", "attention_pairs")
FORMS = ("linear", "per_phase")


def _design(rows: list[dict]) -> np.ndarray:
    return np.array([[1.0] + [float(r[f]) for f in FEATURES] for r in rows])


def _is_decode(row: dict) -> bool:
    return int(row["num_tokens"]) == int(row["num_seqs"])


def least_squares(rows: list[dict], times: np.ndarray) -> tuple:
    """Coefficients (intercept first) minimising squared relative error, all >= 0.

    Rows are scaled by 1/time so a 1 ms decode counts as much as a 1 s prefill; the coefficients
    are kept non-negative (a negative per-token cost would predict a negative time for shapes
    beyond the grid) by scipy's non-negative least squares, the exact optimum under that bound.
    (Dropping the most negative coefficient and refitting, as this once did, missed it in 198 of
    3,000 random problems, by up to 2.3x the squared error; on measured profiles the two agree.)"""
    from scipy.optimize import nnls

    x = _design(rows) / times[:, None]
    coef, _ = nnls(x, np.ones(len(times)))
    return tuple(float(c) for c in coef)


@dataclass(frozen=True)
class StepTimeModel:
    """t = c0 + c1 tokens + c2 seqs + c3 context + c4 pairs, with `prefill` used for steps that
    carry a prompt (equal to `decode` for the linear form)."""

    form: str
    decode: tuple
    prefill: tuple

    def predict(self, num_tokens: int, num_seqs: int, context_tokens: int, attention_pairs: int) -> float:
        c = self.decode if num_tokens == num_seqs else self.prefill
        return c[0] + c[1] * num_tokens + c[2] * num_seqs + c[3] * context_tokens + c[4] * attention_pairs

    def predict_rows(self, rows: list[dict]) -> np.ndarray:
        return np.array([self.predict(*(int(r[f]) for f in FEATURES)) for r in rows])

    def as_dict(self) -> dict:
        names = ("intercept_s",) + tuple(f"s_per_{f}" for f in FEATURES)
        return {"form": self.form, "decode": dict(zip(names, self.decode)), "prefill": dict(zip(names, self.prefill))}


def fit_form(form: str, rows: list[dict], times: np.ndarray) -> StepTimeModel:
    if form == "linear":
        coef = least_squares(rows, times)
        return StepTimeModel(form, coef, coef)
    decode = [i for i, r in enumerate(rows) if _is_decode(r)]
    prompt = [i for i, r in enumerate(rows) if not _is_decode(r)]
    if not decode or not prompt:  # one phase only: nothing to fit apart
        coef = least_squares(rows, times)
        return StepTimeModel(form, coef, coef)
    return StepTimeModel(
        form,
        least_squares([rows[i] for i in decode], times[decode]),
        least_squares([rows[i] for i in prompt], times[prompt]),
    )


def relative_errors(model: StepTimeModel, rows: list[dict], times: np.ndarray) -> np.ndarray:
    return np.abs(model.predict_rows(rows) - times) / times


@dataclass(frozen=True)
class FitReport:
    model: StepTimeModel
    heldout_median: float  # median |predicted - measured| / measured over the held-out shapes; nan if none
    heldout_max: float
    num_fit: int
    num_heldout: int
    scores: dict  # form -> held-out median relative error (in-sample where none is held out)
    held: tuple  # the shapes scored as held out: none where too few are left to fit
    fit_median: float  # the final fit's median relative error over every shape (in-sample)
    fit_max: float


def heldout_split(rows: list[dict], heldout_frac: float, seed: int) -> list[int]:
    """The shapes held out of the fit: `heldout_frac` of each phase's, drawn with `seed`."""
    rng = np.random.default_rng(seed)
    held = []
    for phase in (True, False):
        members = [i for i, r in enumerate(rows) if _is_decode(r) == phase]
        rng.shuffle(members)
        held += members[: int(round(heldout_frac * len(members))) if len(members) > 2 else 0]
    return sorted(held)


def fit(rows: list[dict], times, held: list[int]) -> FitReport:
    """Choose the form on the `held` (held-out) shapes, fitting the others; refit it on all.
    Where nothing is held out, or too few shapes would be left to fit, the forms are scored on
    the shapes they were fitted to: the report then says so (no held-out shapes, a nan
    held-out error), and its in-sample error is the only one it has."""
    times = np.asarray(times, dtype=float)
    held = sorted(set(held))
    train = [i for i in range(len(rows)) if i not in set(held)]
    scored = held
    if not held or len(train) <= len(FEATURES):  # too few shapes to hold any out: score on all
        train = scored = list(range(len(rows)))
        held = []
    pick = lambda idx: [rows[i] for i in idx]
    scores, worst = {}, {}
    for form in FORMS:
        model = fit_form(form, pick(train), times[train])
        errors = relative_errors(model, pick(scored), times[scored])
        scores[form], worst[form] = float(np.median(errors)), float(errors.max())
    best = min(FORMS, key=lambda f: (round(scores[f], 4), FORMS.index(f)))
    final = fit_form(best, rows, times)
    in_sample = relative_errors(final, rows, times)
    return FitReport(
        final,
        scores[best] if held else math.nan,
        worst[best] if held else math.nan,
        len(train),
        len(held),
        scores,
        tuple(held),
        float(np.median(in_sample)),
        float(in_sample.max()),
    )
