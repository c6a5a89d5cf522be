"""requests.jsonl: written by the run itself or, where `bench` has its helper, spooled in binary
and written by the helper; the two ways give the same bytes, and a helper that fails or falls
silent leaves the run to convert the spool itself, with nothing lost and no file left behind."""

from __future__ import annotations

import json
import struct
import threading

import numpy as np
import pandas as pd
import pytest

from kvbench import launch
from kvbench.core.request_log import (
    FIELDS,
    HEADER,
    RequestLog,
    SpooledRequestLog,
    follow_spool,
    open_request_log,
)
from kvbench.core.serving_metrics import ValueCounts


def requests(count: int, seed: int = 0) -> list[tuple[tuple, np.ndarray]]:
    """`count` finished requests as the recorder hands them over: FIELDS' values, their gaps."""
    rng = np.random.default_rng(seed)
    out = []
    for index in range(count):
        gaps = rng.random(int(rng.integers(0, 400))) * 0.07 + 1e-4  # 0 gaps: a one-token output
        arrival = float(rng.random() * 100)
        out.append(((index, arrival, arrival + 0.2, arrival + 0.2 + gaps.sum(), 17, len(gaps) + 1, 1, 16, 2), gaps))
    return out


def write_all(log, records) -> None:
    for values, gaps in records:
        log.write(values, gaps)
    log.close()


class InProcessFollower:
    """The helper's side of the spool (kvbench.reporting.helper), on a thread of this process."""

    def __init__(self, answer_with=None, takes=True):
        self.size = None
        self.answer_with, self.takes, self.closed = answer_with, takes, False
        self.thread = None
        self.result = None

    def tell(self, message):
        if not self.takes:
            return False
        if self.answer_with is not None:  # one that fails: a partial line, then the wrong answer
            with open(message["out"], "r+b") as out:
                out.write(b'{"request_id":0,"arr')
            return True
        self.thread = threading.Thread(target=self._follow, args=(message["spool"], message["out"]))
        self.thread.start()
        return True

    def _follow(self, spool, out):
        try:
            self.result = follow_spool(spool, out, lambda: self.size, lambda: self.closed)
        except FileNotFoundError:  # the run's log was gone before this opened it (as the helper's _Spool)
            self.result = None

    def ask(self, message, timeout_s):
        assert timeout_s >= 30
        if self.answer_with is not None:
            return self.answer_with
        self.size = message["size"]
        self.thread.join()
        return self.result

    def close(self):
        self.closed = True


def gap_stats(records) -> dict:
    """The inter-token latency columns of `records`, counted as the recorder counts them."""
    counts = ValueCounts()
    for _, gaps in records:
        counts.add(gaps)
    return counts.stats("itl")


def leftovers(folder) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name != "requests.jsonl")


def test_the_spooled_log_writes_the_bytes_the_run_writes_itself(tmp_path):
    records = requests(300)
    direct_log = RequestLog(tmp_path / "direct" / "requests.jsonl")
    write_all(direct_log, records)
    assert direct_log.gap_stats == gap_stats(records)  # a log the run writes itself counts them too
    follower = InProcessFollower()
    log = open_request_log(tmp_path / "spooled" / "requests.jsonl", follower)
    assert isinstance(log, SpooledRequestLog)
    write_all(log, records)
    direct = (tmp_path / "direct" / "requests.jsonl").read_bytes()
    assert (tmp_path / "spooled" / "requests.jsonl").read_bytes() == direct
    assert follower.result["written"] == 300 and not follower.closed  # the follower wrote them all
    assert log.gap_stats == gap_stats(records)  # and counted their gaps
    assert leftovers(tmp_path / "spooled") == []  # no spool, no temporary file
    frame = pd.read_json(tmp_path / "spooled" / "requests.jsonl", lines=True)
    assert list(frame.columns) == [*FIELDS, "itl_s"]
    assert frame["itl_s"].map(len).tolist() == [len(gaps) for _, gaps in records]
    line = json.loads((tmp_path / "spooled" / "requests.jsonl").read_text().splitlines()[5])
    assert line == {**dict(zip(FIELDS, records[5][0])), "itl_s": records[5][1].round(9).tolist()}


@pytest.mark.parametrize(
    "answer",
    [
        {"written": 299, "itl": {}},
        {"written": 300},
        {"written": 300, "itl": {"mean_itl_ms": 1.0}},
        {"error": "ValueError: boom"},
        "not a dict",
    ],
    ids=["short", "no-gaps", "some-gaps", "error", "garbled"],
)
def test_a_follower_that_fails_is_stopped_and_the_run_converts_the_spool(tmp_path, answer):
    """It left a partial line and answered wrong: the run throws its file away and writes every
    line, and counts the gaps itself."""
    records = requests(300, seed=1)
    write_all(RequestLog(tmp_path / "direct.jsonl"), records)
    follower = InProcessFollower(answer_with=answer)
    log = open_request_log(tmp_path / "run" / "requests.jsonl", follower)
    write_all(log, records)
    assert follower.closed
    assert (tmp_path / "run" / "requests.jsonl").read_bytes() == (tmp_path / "direct.jsonl").read_bytes()
    assert log.gap_stats == gap_stats(records)
    assert leftovers(tmp_path / "run") == []


def test_a_follower_that_takes_no_spool_leaves_the_run_to_write_its_lines(tmp_path):
    log = open_request_log(tmp_path / "requests.jsonl", InProcessFollower(takes=False))
    assert type(log) is RequestLog
    write_all(log, requests(3))
    assert leftovers(tmp_path) == []
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 3


def test_a_run_that_raises_leaves_no_spool_and_no_partial_file(tmp_path):
    follower = InProcessFollower()
    log = open_request_log(tmp_path / "requests.jsonl", follower)
    for values, gaps in requests(50):
        log.write(values, gaps)
    del log  # what a run that raised leaves: its log is collected, never closed
    follower.close()  # the helper is stopped or told the run ended without a size
    follower.thread.join()
    assert follower.result is None
    assert list(tmp_path.iterdir()) == []


def test_a_spool_that_ends_inside_a_request_is_an_error(tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    out.touch()
    spool.write_bytes(HEADER.pack(*requests(1)[0][0], 3) + struct.pack("=2d", 0.1, 0.2))  # 3 gaps promised
    with pytest.raises(ValueError, match="does not end with a whole request"):
        follow_spool(str(spool), str(out), lambda: spool.stat().st_size)


def test_the_helper_process_follows_a_spool_and_answers_how_many_it_wrote(tmp_path):
    """The real helper (python -m kvbench.reporting.helper): a request log spooled for it, then
    its figure job, as a single run of `bench` hands them over."""
    records = requests(200, seed=2)
    write_all(RequestLog(tmp_path / "direct.jsonl"), records)
    helper = launch.Helper("run")
    log = open_request_log(tmp_path / "run" / "requests.jsonl", helper)
    assert isinstance(log, SpooledRequestLog)
    asked = []
    ask = helper.ask
    helper.ask = lambda message, timeout_s: asked.append(ask(message, timeout_s)) or asked[-1]
    write_all(log, records)
    assert asked == [{"written": 200, "itl": gap_stats(records)}]  # the helper wrote and counted them, not the run
    assert (tmp_path / "run" / "requests.jsonl").read_bytes() == (tmp_path / "direct.jsonl").read_bytes()
    helper.send({"job": "run", "rows": [{"status": "failed"}], "out": str(tmp_path / "run")})
    assert helper.result() == {"written": []}  # a failed row draws nothing; the helper still answers
    assert leftovers(tmp_path / "run") == []


def test_a_helper_given_a_spool_but_never_its_end_drops_it_and_answers_its_job(tmp_path):
    helper = launch.Helper("run")
    log = open_request_log(tmp_path / "requests.jsonl", helper)
    for values, gaps in requests(20):
        log.write(values, gaps)
    helper.send({"job": "run", "rows": [{"status": "failed"}], "out": str(tmp_path)})
    assert helper.result() == {"written": []}
    del log
    assert list(tmp_path.iterdir()) == []


def test_a_follower_late_to_a_run_that_failed_makes_no_file_again(tmp_path):
    """The run removed its files (it failed at once) before the follower opened them: following
    fails, and the removed log is not made again in the run's folder."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.write_bytes(b"")
    with pytest.raises(FileNotFoundError):
        follow_spool(str(spool), str(out), lambda: 0)
    assert not out.exists()
