"""The paper's headline in simulation: where KV memory goes, and what it does to batch and rate."""

import pytest
from hydra import compose, initialize_config_module

from kvbench.scenarios.run import run_point

ALLOCATORS = ("contiguous", "oracle", "pow2", "paged")


def simulate(allocator: str, *overrides: str) -> dict:
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("bench", overrides=[f"+allocator={allocator}", "progress=false", *overrides])
    return run_point(cfg)[0]


@pytest.fixture(scope="module")
def at_4_req_s():
    return {a: simulate(a, "workload.duration_s=300") for a in ALLOCATORS}


def test_kv_fractions_add_up_to_one(at_4_req_s):
    for row in at_4_req_s.values():
        parts = [
            row[k]
            for k in (
                "kv_token_util",
                "kv_reserved_frac",
                "kv_internal_frag_frac",
                "kv_rounding_frac",
                "kv_external_frag_frac",
            )
        ]
        assert all(p >= 0 for p in parts) and sum(parts) == pytest.approx(1.0)


def test_paged_keeps_over_90_percent_token_states_and_max_under_30(at_4_req_s):
    util = {a: row["kv_token_util"] for a, row in at_4_req_s.items()}
    assert util["paged"] >= 0.90
    assert util["contiguous"] <= 0.30
    assert util["contiguous"] < util["pow2"] < util["oracle"] < util["paged"]


def test_orca_max_fits_exactly_seven_opt_13b_requests(at_4_req_s):
    assert at_4_req_s["contiguous"]["mean_batch_size"] == pytest.approx(7.0)


def test_where_the_baselines_saturate_paged_sustains_a_higher_rate(at_4_req_s):
    for allocator in ("contiguous", "oracle", "pow2"):
        assert at_4_req_s["paged"]["request_throughput"] > at_4_req_s[allocator]["request_throughput"]


def test_at_2_req_s_paged_batches_over_three_times_as_many_requests_as_max():
    paged = simulate("paged", "workload.rate=2", "workload.duration_s=400")
    contiguous = simulate("contiguous", "workload.rate=2", "workload.duration_s=400")
    assert paged["mean_batch_size"] >= 3 * contiguous["mean_batch_size"]


def test_the_same_seed_reproduces_every_simulated_metric():
    a, b = (simulate("paged", "workload.num_requests=200") for _ in range(2))
    drop = {"schedule_us_per_step"}  # host wall time, not simulated
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


def test_a_run_tunes_the_collector_for_its_loop_and_leaves_it_as_it_found_it(monkeypatch):
    """Engine.run freezes what the process held before it out of the collector's scans and
    collects young objects less often (engine.few_collections); afterwards the thresholds and
    the freeze are as they were, and garbage made during the run is collectable again."""
    import gc

    from kvbench.core import engine

    seen = []
    run = engine.Engine._run
    monkeypatch.setattr(
        engine.Engine,
        "_run",
        lambda self, requests: seen.append((gc.get_threshold(), gc.get_freeze_count())) or run(self, requests),
    )
    before = gc.get_threshold()
    simulate("paged", "workload.num_requests=20")
    ((during, frozen),) = seen
    assert during == (10_000, *before[1:]) and frozen > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    gc.freeze()  # frozen by someone else: the run leaves that freeze alone
    try:
        count = gc.get_freeze_count()
        simulate("paged", "workload.num_requests=20")
        # (frozen objects that die leave the count: it may only fall)
        assert seen[-1][1] <= count and 0 < gc.get_freeze_count() <= count
    finally:
        gc.unfreeze()


def test_a_simulated_run_imports_only_what_simulating_needs(tmp_path):
    """Start-up: a simulated single run, in a fresh process with stderr not a terminal, loads
    none of torch, triton, matplotlib, pandas (its figure is the helper's) or tqdm (no bar is
    drawn off a terminal)."""
    import subprocess
    import sys

    code = (
        "import sys; from kvbench import cli\n"
        f"sys.argv = ['bench', 'workload.num_requests=10', 'plots=false', 'hydra.run.dir={tmp_path}']\n"
        "cli.main()\n"
        "print(sorted(m for m in ('torch', 'triton', 'matplotlib', 'pandas', 'tqdm') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"
    assert (tmp_path / "metrics.csv").is_file()


def test_the_progress_bar_is_drawn_on_a_terminal(monkeypatch, capsys):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    simulate("paged", "workload.num_requests=20", "progress=true")
    assert "paged:" in terminal.getvalue() and "/20 [" in terminal.getvalue()  # tqdm's bar, 20 requests


def test_a_run_whose_requests_were_all_admitted_in_the_warm_up_warns_its_window_is_a_drain(tmp_path):
    """Three requests at 0, 0.5 and 1 s: the window, [a third of the run, its end], holds only
    their last tokens, and the mean batch it reports is the drain's, without a word."""
    from kvbench import cli

    from helpers.cli import in_process

    trace = tmp_path / "t.csv"
    trace.write_text("input_len,output_len,arrival_s\n10,200,0\n10,200,0.5\n10,200,1.0\n")
    run = ["workload=trace", f"workload.path={trace}", "plots=false"]
    early = in_process(lambda: cli.main([*run, f"hydra.run.dir={tmp_path / 'run'}"]))
    assert early.returncode == 0 and "every request was admitted within the warm-up" in early.stdout + early.stderr
    whole = in_process(lambda: cli.main([*run, "measure.warmup_frac=0", f"hydra.run.dir={tmp_path / 'all'}"]))
    assert whole.returncode == 0 and "admitted within the warm-up" not in whole.stdout + whole.stderr
    # the row says so too, for a report to name the point beside the others of its sweep
    import csv

    rows = [next(csv.DictReader((tmp_path / run / "metrics.csv").open())) for run in ("run", "all")]
    drained = [row["window_drained"] for row in rows]
    assert drained == ["True", "False"]


def test_the_window_s_warm_up_is_a_share_of_the_run_from_its_first_arrival():
    """One request, arriving after seconds of an empty server: the run is its own time, and the
    warm-up a third of that. Counted from 0, the window began and ended before its
    first step, and the time-averaged columns fell back to weighting every step, under a
    window in which nothing ran."""
    overrides = ["workload.num_requests=1", "workload.duration_s=null", "workload.rate=0.2", "progress=false"]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        row = run_point(compose("bench", overrides=overrides))[0]
    first_arrival = row["duration_s"] - row["mean_e2el_ms"] / 1e3  # duration_s counts from 0, as vLLM's
    run = row["window_end_s"] - first_arrival
    assert first_arrival > run  # the empty server's wait is longer than the run
    assert row["window_start_s"] == pytest.approx(first_arrival + run / 3, abs=1e-4)
    assert row["mean_batch_size"] == 1.0


def test_a_window_no_step_ran_in_says_so_and_names_the_span_it_averaged(tmp_path, caplog):
    """50 requests at t=0 and one at 1,000 s: the window, 333 s to the last admission at 1,000 s,
    holds no step (the server sat idle), and the shares quietly averaged every step of the run
    under window_start_s=333 and window_end_s=1000."""
    trace = tmp_path / "late.csv"
    trace.write_text("input_len,output_len,arrival_s\n" + "500,500,0\n" * 50 + "10,10,1000\n")
    overrides = ["workload=trace", f"workload.path={trace}", "progress=false"]
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        row = run_point(compose("bench", overrides=overrides))[0]
    assert "no step ran within the measurement window (333.1 s to 1000 s" in caplog.text
    assert row["window_start_s"] == 0 and row["window_end_s"] == row["duration_s"] > 1000
    assert 1 < row["mean_batch_size"] < 50 and not row["window_drained"]


@pytest.mark.parametrize("budget", [100, 32, 7])
def test_a_prefill_costs_the_causal_half_of_its_attention_pairs_however_it_is_chunked(budget):
    """A 100-token prompt's queries read 1, 2, ..., 100 keys: 5,050 pairs, which a causal kernel
    computes; the step model counted 100 x 100 (and a chunk of n at context c, n x c)."""
    from kvbench.arith import causal_pairs
    from kvbench.core.scheduler import Scheduler
    from kvbench.core.sequence import Request, Sequence
    from kvbench.plugins.allocators.paged import PagedAllocator

    allocator = PagedAllocator(4096, 256, block_size=16)
    scheduler = Scheduler(allocator, max_num_seqs=4, max_num_batched_tokens=budget, chunked_prefill=True)
    scheduler.add(Sequence(0, Request(0, 0.0, 100, 5), 100))
    pairs = []
    while sum(pairs) < 5050:
        batch = scheduler.schedule(0.0)
        pairs.append(batch.attention_pairs)
    assert sum(pairs) == 5050 == causal_pairs(100, 100)
    assert pairs[0] == causal_pairs(min(budget, 100), min(budget, 100))
    assert causal_pairs(10, 40, window=16) == sum(min(k, 16) for k in range(31, 41))
