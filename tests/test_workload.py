"""Workloads: seeded, reproducible, and shaped like the published datasets."""

import numpy as np
import pytest

from kvbench.core.workload import generate
from kvbench.errors import UserError

SHAREGPT = {"kind": "sharegpt", "rate": 4.0, "duration_s": None, "num_requests": 20_000, "burstiness": 1.0}


def test_sharegpt_lengths_match_the_published_means_and_medians():
    requests = generate(SHAREGPT, seed=0, max_model_len=2048)
    inputs = np.array([r.prompt_len for r in requests])
    outputs = np.array([r.output_len for r in requests])
    assert abs(inputs.mean() - 161.31) / 161.31 < 0.05
    assert abs(np.median(inputs) - 35) <= 3
    assert abs(outputs.mean() - 337.99) / 337.99 < 0.05
    assert abs(np.median(outputs) - 271) <= 10
    assert (inputs + outputs <= 2048).all()


def test_alpaca_lengths_match_the_published_means():
    requests = generate({**SHAREGPT, "kind": "alpaca"}, seed=0, max_model_len=2048)
    assert abs(np.mean([r.prompt_len for r in requests]) - 19.31) / 19.31 < 0.05
    assert abs(np.mean([r.output_len for r in requests]) - 58.45) / 58.45 < 0.05


def test_the_same_seed_gives_the_same_requests_and_another_seed_does_not():
    a, b, c = (generate({**SHAREGPT, "num_requests": 50}, seed=s, max_model_len=2048) for s in (1, 1, 2))
    key = lambda rs: [(r.arrival_s, r.prompt_len, r.output_len) for r in rs]
    assert key(a) == key(b) != key(c)


@pytest.mark.parametrize("burstiness", [1.0, 0.25])
def test_arrivals_keep_the_mean_rate_and_burstiness_raises_the_spread(burstiness):
    requests = generate({**SHAREGPT, "rate": 2.0, "burstiness": burstiness}, seed=0, max_model_len=2048)
    gaps = np.diff([r.arrival_s for r in requests])
    assert abs(gaps.mean() - 0.5) < 0.02
    assert abs(gaps.std() / gaps.mean() - burstiness ** -0.5) < 0.05  # gamma: cv = 1/sqrt(shape)


def test_a_duration_bounds_poisson_arrivals():
    requests = generate({**SHAREGPT, "num_requests": None, "duration_s": 100}, seed=0, max_model_len=2048)
    assert 330 < len(requests) < 470 and requests[-1].arrival_s <= 100


def test_a_trace_is_used_in_file_order_with_its_arrivals(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("input_len,output_len,arrival_s\n10,5,0.5\n20,6,0.1\n30,7,2.0\n")
    requests = generate({"kind": "trace", "path": str(path), "rate": 1.0}, seed=0, max_model_len=2048)
    assert [(r.prompt_len, r.output_len, r.arrival_s) for r in requests] == [(20, 6, 0.1), (10, 5, 0.5), (30, 7, 2.0)]


@pytest.mark.parametrize("text, message", [
    (None, "does not exist"),
    ("input_len,output_len\n", "no rows"),
    ("input_len,output_len\n10,5\nten,5\n", "row 3"),
    ("prompt,output\n1,2\n", "missing"),
])
def test_a_bad_trace_says_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "trace.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError, match=message):
        generate({"kind": "trace", "path": str(path), "rate": 1.0}, seed=0, max_model_len=2048)


@pytest.mark.parametrize("override, message", [
    ({"rate": 0}, "rate"), ({"rate": -1}, "rate"), ({"burstiness": 0}, "burstiness"),
    ({"kind": "fixed", "input_len": 2000, "output_len": 100}, "max_model_len"),
])
def test_bad_workload_settings_are_refused(override, message):
    with pytest.raises(UserError, match=message):
        generate({**SHAREGPT, "num_requests": 5, **override}, seed=0, max_model_len=2048)


def test_a_shared_prefix_counts_against_the_length_filter():
    requests = generate({**SHAREGPT, "num_requests": 500, "prefix_len": 64, "num_prefixes": 2},
                        seed=0, max_model_len=512)
    assert all(r.prompt_len + r.output_len <= 512 for r in requests)
    assert len({tuple(r.prompt_tokens[:64]) for r in requests}) == 2
