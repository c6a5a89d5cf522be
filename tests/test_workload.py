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
    assert abs(gaps.std() / gaps.mean() - burstiness**-0.5) < 0.05  # gamma: cv = 1/sqrt(shape)


def test_a_duration_bounds_poisson_arrivals():
    requests = generate({**SHAREGPT, "num_requests": None, "duration_s": 100}, seed=0, max_model_len=2048)
    assert 330 < len(requests) < 470 and requests[-1].arrival_s <= 100


def test_a_trace_is_used_in_file_order_with_its_arrivals(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("input_len,output_len,arrival_s\n10,5,0.5\n20,6,0.1\n30,7,2.0\n")
    requests = generate({"kind": "trace", "path": str(path), "rate": 1.0}, seed=0, max_model_len=2048)
    assert [(r.prompt_len, r.output_len) for r in requests] == [(20, 6), (10, 5), (30, 7)]
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 0.4, 1.9])  # from the first arrival on


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "does not exist"),
        ("input_len,output_len\n", "no rows"),
        ("input_len,output_len\n10,5\nten,5\n", "line 3: input_len='ten' is not a number"),
        ("prompt,output\n1,2\n", "has no column for input_len: input_len or prompt_len"),
        ('[{"input_len": 10, "output_len": 5}]\n', "reads as JSON; a trace is a CSV file"),  # vLLM's --save-result
        ('{"prompt_len": 10, "output_len": 5}\n', "reads as JSON; a trace is a CSV file"),  # JSON lines
        ("input_len,output_len\n10,5\n20,6,7\n", "line 3: 3 field\\(s\\), but the header has 2"),
        ("input_len,output_len,arrival_s\n10,5,0\n20\n", "line 3: 1 field\\(s\\), but the header has 3"),
        ("input_len,output_len\n10.5,5\n", "line 2: input_len='10.5' is not a whole number of tokens"),
        ("input_len,output_len,arrival_s\n10,5,0.0\n20,6,\n", "line 3: no arrival_s; give every row"),
        ("input_len,output_len\n10,nan\n", "line 2: output_len='nan' is not a whole number of tokens"),
        # the row's every cell was named, in kvbench's names rather than the file's; 1_0 read as 10
        ("Timestamp,Model,Request tokens,Response tokens\n0,x,47x2,5\n", "line 2: Request tokens='47x2' is not a"),
        ("input_len,output_len\n1_0,5\n", "line 2: input_len='1_0' is not a number"),
        ("input_len,output_len\n\u0661\u0660,5\n", "input_len='\u0661\u0660' is not a number"),  # Arabic-Indic 10
        ("input_len,output_len\n\n\n\n10,20\n-1,5\n", "line 6: lengths must be >= 1"),  # the file's line, blanks too
        ("input_len,output_len\r\n10,20\r\n\r\n-1,5\r\n", "line 4: lengths must be >= 1"),
        (
            "num_prefill_tokens,num_decode_tokens,arrived_at\n10,5,inf\n",  # Vidur's names, its own in the message
            "line 2: lengths must be >= 1 and arrived_at a finite number >= 0",
        ),
    ],
)
def test_a_bad_trace_says_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "trace.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError, match=message):
        generate({"kind": "trace", "path": str(path), "rate": 1.0}, seed=0, max_model_len=2048)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"rate": 0}, "rate"),
        ({"rate": -1}, "rate"),
        ({"burstiness": 0}, "burstiness"),
        ({"kind": "fixed", "input_len": 2000, "output_len": 100}, "max_model_len"),
    ],
)
def test_bad_workload_settings_are_refused(override, message):
    with pytest.raises(UserError, match=message):
        generate({**SHAREGPT, "num_requests": 5, **override}, seed=0, max_model_len=2048)


def test_a_shared_prefix_counts_against_the_length_filter():
    requests = generate(
        {**SHAREGPT, "num_requests": 500, "prefix_len": 64, "num_prefixes": 2}, seed=0, max_model_len=512
    )
    assert all(r.prompt_len + r.output_len <= 512 for r in requests)
    assert len({tuple(r.prompt_tokens[:64]) for r in requests}) == 2


def trace(tmp_path, text: str) -> str:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "header",
    [
        "input_len,output_len",
        "prompt_len,output_len",
        "prompt_len,expected_output_len",
        "num_prefill_tokens,num_decode_tokens",
        "Request tokens,Response tokens",
    ],
)
def test_a_trace_reads_kvbench_vllm_and_vidur_column_spellings(tmp_path, header):
    path = trace(tmp_path, f"{header}\n10,5\n20,6\n")
    requests = generate({"kind": "trace", "path": path, "rate": 1.0}, seed=0, max_model_len=2048)
    assert [(r.prompt_len, r.output_len) for r in requests] == [(10, 5), (20, 6)]


def test_a_trace_header_s_spaces_are_not_part_of_its_names(tmp_path):
    path = trace(tmp_path, " input_len , output_len \n10,5\n20.0,6\n")
    requests = generate({"kind": "trace", "path": path, "rate": 1.0}, seed=0, max_model_len=2048)
    assert [(r.prompt_len, r.output_len) for r in requests] == [(10, 5), (20, 6)]


def test_a_trace_saved_by_a_spreadsheet_with_a_byte_order_mark_reads_as_any_other(tmp_path):
    from kvbench.core.workload import trace_has_arrival_times

    path = tmp_path / "trace.csv"
    path.write_bytes("\ufeffarrival_s,input_len,output_len\n0.0,10,5\n1.5,20,6\n".encode())
    assert trace_has_arrival_times(str(path))  # so rate is not read (the header's first name)
    requests = generate({"kind": "trace", "path": str(path), "rate": 99.0}, seed=0, max_model_len=2048)
    assert [(r.arrival_s, r.prompt_len) for r in requests] == [(0.0, 10), (1.5, 20)]


def test_a_vidur_trace_s_arrived_at_gives_the_arrivals(tmp_path):
    path = trace(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n1.5,20,6\n")
    requests = generate({"kind": "trace", "path": path, "rate": 99.0}, seed=0, max_model_len=2048)
    assert [(r.arrival_s, r.prompt_len) for r in requests] == [(0.0, 10), (1.5, 20)]


BURSTGPT = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"  # its files' header


def test_a_burstgpt_trace_gives_its_timestamps_and_token_counts(tmp_path):
    path = trace(tmp_path, BURSTGPT + "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,230,1317,API log\n")
    requests = generate({"kind": "trace", "path": path, "rate": 99.0}, seed=0, max_model_len=2048)
    # times count from the trace's first arrival
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in requests] == [(0.0, 472, 18), (40.0, 1087, 230)]


def test_a_burstgpt_trace_s_failed_requests_are_skipped_other_zero_lengths_refused(tmp_path):
    """BurstGPT logs a failed request with 0 response tokens; elsewhere a 0 length is bad input."""
    rows = ["5,GPT-4,472,18,490,API log", "7,GPT-4,300,0,300,API log", "45,GPT-4,1087,230,1317,API log"]
    path = trace(tmp_path, BURSTGPT + "\n".join(rows) + "\n")
    requests = generate({"kind": "trace", "path": path, "rate": 99.0}, seed=0, max_model_len=2048)
    assert [(r.arrival_s, r.output_len) for r in requests] == [(0.0, 18), (40.0, 230)]
    path = trace(tmp_path, "Timestamp,Request tokens,Response tokens\n5,472,0\n7,300,0\n")
    with pytest.raises(UserError, match="all 2 rows are failed requests"):
        generate({"kind": "trace", "path": path, "rate": 1.0}, seed=0, max_model_len=2048)
    path = trace(tmp_path, "input_len,output_len\n10,5\n300,0\n")
    with pytest.raises(UserError, match="line 3: lengths must be >= 1"):
        generate({"kind": "trace", "path": path, "rate": 1.0}, seed=0, max_model_len=2048)


def test_a_trace_that_starts_late_runs_as_one_that_starts_at_0(tmp_path):
    rows = "".join(f"{10 + i},{5 + i % 7},{t}\n" for i, t in enumerate([0.0, 0.4, 0.9, 1.5, 2.0, 2.2]))
    early = trace(tmp_path, "input_len,output_len,arrival_s\n" + rows)
    late = str(tmp_path / "late.csv")
    (tmp_path / "late.csv").write_text(
        "input_len,output_len,arrival_s\n"
        + "".join(f"{r.rsplit(',', 1)[0]},{1000 + float(r.rsplit(',', 1)[1])}\n" for r in rows.splitlines())
    )
    spec = {"kind": "trace", "rate": 1.0, "duration_s": 2.0}
    times = [[r.arrival_s for r in generate({**spec, "path": p}, seed=0, max_model_len=2048)] for p in (early, late)]
    assert times[0] == pytest.approx(times[1]) and len(times[0]) == 5  # duration_s counts from the first too
    # a row too long to run counts as dropped by the same clock (it was compared with the unshifted one)
    (tmp_path / "late.csv").write_text((tmp_path / "late.csv").read_text() + "3000,5,1001.0\n3000,5,1003.0\n")
    requests = generate({**spec, "path": late}, seed=0, max_model_len=2048)
    assert len(requests) == 5 and requests.dropped == 1


def test_arrival_times_too_large_to_tell_apart_are_refused(tmp_path):
    path = trace(tmp_path, "input_len,output_len,arrival_s\n10,5,1e17\n10,5,100000000000000001\n")
    with pytest.raises(UserError, match="cannot be told apart to the microsecond"):
        generate({"kind": "trace", "path": path, "rate": 1.0}, seed=0, max_model_len=2048)


def test_a_rate_that_spreads_requests_past_31_years_is_refused():
    with pytest.raises(UserError, match="spreads 5 requests over"):
        generate({"kind": "sharegpt", "rate": 1e-300, "num_requests": 5}, seed=0, max_model_len=2048)


def test_an_over_long_trace_row_is_dropped_counted_and_said(tmp_path, caplog):
    """999 of 1,000 rows dropped left a run of one request whose console said nothing of them."""
    path = trace(tmp_path, "input_len,output_len\n10,5\n2000,100\n20,6\n30,7\n")
    requests = generate({"kind": "trace", "path": path, "rate": 1.0}, seed=0, max_model_len=2048)
    assert [r.prompt_len for r in requests] == [10, 20, 30]
    assert requests.dropped == 1
    assert f"trace {path}: 1 of its rows are longer than 2048 tokens" in caplog.text
    caplog.clear()
    first = generate({"kind": "trace", "path": path, "rate": 1.0, "num_requests": 1}, seed=0, max_model_len=2048)
    assert first.dropped == 0 and not caplog.text  # the over-long row lies beyond the one row this run reads


def test_a_strict_trace_names_its_over_long_row(tmp_path):
    path = trace(tmp_path, "input_len,output_len\n10,5\n2000,100\n")
    with pytest.raises(UserError, match="line 3: 2000 input \\+ 100 output tokens exceed max_model_len=2048"):
        generate({"kind": "trace", "path": path, "rate": 1.0, "strict": True}, seed=0, max_model_len=2048)


def test_a_trace_run_honours_num_requests_and_duration(tmp_path):
    path = trace(tmp_path, "input_len,output_len\n" + "".join(f"{i},5\n" for i in range(1, 2001)))
    first = generate({"kind": "trace", "path": path, "rate": 4.0, "num_requests": 50}, seed=0, max_model_len=2048)
    assert [r.prompt_len for r in first] == list(range(1, 51))  # the first rows, in file order
    timed = generate({"kind": "trace", "path": path, "rate": 4.0, "duration_s": 100}, seed=0, max_model_len=2048)
    assert 330 < len(timed) < 470 and timed[-1].arrival_s <= 100  # Poisson at 4 req/s for 100 s
    assert [r.prompt_len for r in timed] == list(range(1, len(timed) + 1))


def test_num_requests_takes_precedence_over_duration_for_a_timed_trace_too(tmp_path):
    """A timed trace cut at duration_s=2 gave 3 of the 10 requests asked for, without a word,
    where a generated workload and an untimed trace give 10."""
    path = trace(tmp_path, "input_len,output_len,arrival_s\n" + "".join(f"{i},5,{i * 0.5}\n" for i in range(1, 21)))
    both = {"kind": "trace", "path": path, "rate": 4.0, "num_requests": 10, "duration_s": 2.0}
    assert [r.prompt_len for r in generate(both, seed=0, max_model_len=2048)] == list(range(1, 11))
    alone = {**both, "num_requests": None}
    # times count from the first (0, 0.5, ...): five rows arrive by 2 s
    assert [r.prompt_len for r in generate(alone, seed=0, max_model_len=2048)] == [1, 2, 3, 4, 5]


def test_an_untimed_trace_at_an_infinite_rate_refuses_a_duration_it_cannot_read(tmp_path):
    path = trace(tmp_path, "input_len,output_len\n10,5\n20,5\n")
    cfg = {"kind": "trace", "path": path, "rate": float("inf"), "duration_s": 0.5}
    with pytest.raises(UserError, match="at t=0, so workload.duration_s=0.5 cannot bound them"):
        generate(cfg, seed=0, max_model_len=2048)


def test_a_shuffled_trace_takes_the_first_rows_and_shuffles_them_with_the_seed(tmp_path):
    path = trace(tmp_path, "input_len,output_len\n" + "".join(f"{i},5\n" for i in range(1, 201)))
    cfg = {"kind": "trace", "path": path, "rate": 4.0, "num_requests": 50, "shuffle": True}
    a, b, c = (generate(cfg, seed=s, max_model_len=2048) for s in (0, 0, 1))
    assert sorted(r.prompt_len for r in a) == list(range(1, 51))
    assert [r.prompt_len for r in a] == [r.prompt_len for r in b] != [r.prompt_len for r in c]
    assert [r.prompt_len for r in a] != list(range(1, 51))


@pytest.mark.parametrize("text", ["input_len,output_len\n10,5\n", "input_len,output_len,arrival_s\n10,5,0\n"])
def test_a_trace_shorter_than_num_requests_is_refused(tmp_path, text):
    path = trace(tmp_path, text)  # with its own arrival times or without
    with pytest.raises(UserError, match="num_requests=5 but trace .* has only 1 rows"):
        generate({"kind": "trace", "path": path, "rate": 1.0, "num_requests": 5}, seed=0, max_model_len=2048)


def test_a_short_trace_at_a_huge_rate_draws_arrivals_for_its_rows_only(tmp_path):
    """3 rows at 1e5 req/s for 1,000 s: 3 arrivals drawn, the same as the first 3 of 1e8 (a
    run that took 29 s, and that the memory check refused at 1e5 req/s, estimating 1e8 requests)."""
    from types import SimpleNamespace

    from kvbench.schema.memory import _num_requests

    path = trace(tmp_path, "input_len,output_len\n10,5\n20,5\n30,5\n")
    cfg = {"kind": "trace", "path": path, "rate": 1e5, "duration_s": 1000.0}
    requests = generate(cfg, seed=0, max_model_len=2048)
    expected = np.cumsum(np.random.default_rng(0).gamma(1.0, 1e-5, size=4))[:3]
    assert [r.arrival_s for r in requests] == expected.tolist()
    workload = SimpleNamespace(kind="trace", path=path, num_requests=None, rate=1e5, duration_s=1000.0)
    assert _num_requests(workload, SimpleNamespace()) <= 5  # its lines, not rate x duration


def test_a_timed_trace_with_no_row_that_fits_in_its_duration_is_one_line(tmp_path):
    path = trace(tmp_path, "input_len,output_len,arrival_s\n2000,100,0\n10,5,5\n")
    with pytest.raises(UserError, match="no row that fits max_model_len=2048 arrives within workload.duration_s=1"):
        generate({"kind": "trace", "path": path, "rate": 1.0, "duration_s": 1.0}, seed=0, max_model_len=2048)
    later = generate({"kind": "trace", "path": path, "rate": 1.0, "duration_s": 6.0}, seed=0, max_model_len=2048)
    assert [(r.arrival_s, r.prompt_len) for r in later] == [(5.0, 10)] and later.dropped == 1


@pytest.mark.parametrize("times", ["", ",arrival_s"])
def test_serve_s_cap_takes_at_most_that_many_rows_and_all_of_a_shorter_trace(tmp_path, times):
    rows = "".join(f"{10 + i},5{f',{i}' if times else ''}\n" for i in range(3))
    cfg = {"kind": "trace", "path": trace(tmp_path, f"input_len,output_len{times}\n{rows}"), "rate": float("inf")}
    assert [r.prompt_len for r in generate(cfg, seed=0, max_model_len=2048, at_most=64)] == [10, 11, 12]
    assert [r.prompt_len for r in generate(cfg, seed=0, max_model_len=2048, at_most=2)] == [10, 11]
    capped = generate({**cfg, "num_requests": 2}, seed=0, max_model_len=2048, at_most=64)
    assert len(capped) == 2  # a count of the workload's own is the workload's


def test_a_trace_says_whether_it_gives_arrival_times(tmp_path):
    from kvbench.core.workload import trace_has_arrival_times

    (tmp_path / "vidur.csv").write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n10,20,0.5\n")
    (tmp_path / "lengths.csv").write_text(" input_len , output_len \n10,20\n")
    assert trace_has_arrival_times(str(tmp_path / "vidur.csv"))
    assert not trace_has_arrival_times(str(tmp_path / "lengths.csv"))
    assert not trace_has_arrival_times(str(tmp_path / "missing.csv"))  # load_trace says what is wrong
