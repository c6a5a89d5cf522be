"""requests.jsonl: one JSON line per finished request, streamed to disk while the run goes on.

JSON lines rather than parquet: a line is appended the moment a request finishes, so memory
does not grow with the run (parquet buffers whole row groups and needs pyarrow); and its arrays
(`itl_s`) read like `vllm bench serve --save-result`'s. orjson writes each line: a float as
Python's repr does, a numpy array without a list in between, several times faster than json.
`pandas.read_json(path, lines=True)` loads it. The file is written under a temporary name and
renamed when the run ends, as every kvbench result file is, so a finished name is a whole file.

Formatting the lines is most of what a finished request costs a run (3.3M inter-token gaps of
10,000 ShareGPT requests make 42 MB of text, about 0.15 s of a 1.8 s run). Where `bench` has
its helper process (kvbench.launch), the run hands that work to it: `SpooledRequestLog` appends
each request's numbers in binary to a spool file beside the log (a fixed header, `HEADER`, then
the gaps as float64), and the helper follows the spool as it grows and writes the lines
(`follow_spool`) on the other core. When the run ends, the log waits for the helper to catch up
(the last buffer's worth: milliseconds) and remove the spool, checks that it wrote every
request, and renames its file; where the helper failed or fell silent, the run converts the
spool itself. Both paths write the same bytes (`_line`), so a run's requests.jsonl does not
depend on which wrote it. Whoever converts the spool also counts the gaps it reads for the
run's ITL columns (serving_metrics.ValueCounts, `SpooledRequestLog.gap_stats`): the same values,
so the same statistics, off the run's core where the helper converts.
While the run goes on, the spool takes disk beside the log: about 0.65x of the log's size
(27 MB for 10,000 ShareGPT requests, whose log is 42 MB), removed when the run ends.
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Protocol

import numpy as np
import orjson

from kvbench.core.serving_metrics import STATS, ValueCounts

LINE = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
# a line's fields, in the order Recorder passes them (itl_s follows them)
FIELDS = (
    "request_id",
    "arrival_s",
    "first_token_s",
    "finish_s",
    "input_len",
    "output_len",
    "num_sequences",
    "cached_tokens",
    "preemptions",
)
HEADER = struct.Struct("=q3d5qq")  # a spooled request: FIELDS, then how many gaps (float64) follow
SPOOL_BUFFER = 1 << 18  # what the helper sees at once, and what is left for it when the run ends


def _line(values, itl_s: np.ndarray) -> bytes:
    """The JSON line of one request: FIELDS' `values`, then its gaps in seconds, to the ns."""
    record = dict(zip(FIELDS, values))
    record["itl_s"] = itl_s.round(9)
    return orjson.dumps(record, option=LINE)


def _temp_beside(path: Path, suffix: str, buffering: int):
    """A new, empty temporary file beside `path`, open for writing: (its name, the file). Opened
    from mkstemp's descriptor, not reopened with O_TRUNC: ext4 flushes a file that was truncated
    and written to disk when it is closed (15 ms for 42 MB here), as it does one renamed over
    another (auto_da_alloc)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    return name, os.fdopen(fd, "wb", buffering=buffering)


def _discard(file, *paths: str) -> None:
    file.close()
    for path in paths:
        if os.path.exists(path):
            os.unlink(path)


class RequestLog:
    """Writes the lines itself, as requests finish, and counts their inter-token gaps: a run
    with a log leaves the counting to it, and reads `gap_stats` (ValueCounts.stats("itl")) once
    the log is closed."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp, self._file = _temp_beside(self.path, ".tmp", 1 << 16)
        # a run that raises never calls close(): its partial file goes with the log
        self._cleanup = weakref.finalize(self, _discard, self._file, self._tmp)
        self._gaps = ValueCounts()
        self.gap_stats: dict | None = None  # once closed

    def write(self, values: tuple, itl_s: np.ndarray) -> None:
        """One request: FIELDS' `values` and its inter-token gaps (seconds, float64)."""
        self._file.write(_line(values, itl_s))
        self._gaps.add(itl_s)

    def close(self) -> Path:
        self._cleanup.detach()
        self._file.close()
        self.gap_stats = self._gaps.stats("itl")
        return self._publish()

    def _publish(self) -> Path:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(self._tmp, 0o666 & ~mask)  # mkstemp makes 0600; results are for everyone to read
        os.replace(self._tmp, self.path)
        return self.path


class Follower(Protocol):
    """Who converts a spool as it grows (kvbench.launch.Helper): `tell` hands it a message,
    True if it took it; `ask` hands it one and waits up to `timeout_s` for its answer."""

    def tell(self, message: dict) -> bool: ...

    def ask(self, message: dict, timeout_s: float) -> dict | None: ...

    def close(self) -> None: ...


class SpooledRequestLog(RequestLog):
    """Spools the requests in binary for `follower` to turn into lines (see the module doc).
    Built by `open_request_log`, which falls back to a RequestLog where the follower is gone.

    Whoever converts the spool also counts its inter-token gaps (`follow_spool`'s answer), so
    where the follower converts, that work is off the run's core too: 3.3M gaps of 10,000
    ShareGPT requests, folded a million at a time (serving_metrics.ValueCounts)."""

    def __init__(self, path: Path, follower: Follower):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp, lines = _temp_beside(self.path, ".tmp", 0)  # the follower writes the lines into it
        lines.close()
        self.spool, self._file = _temp_beside(self.path, ".spool", SPOOL_BUFFER)
        self._cleanup = weakref.finalize(self, _discard, self._file, self._tmp, self.spool)
        self.num_written = 0
        self.gap_stats: dict | None = None  # once closed: the follower's, or this process's count
        self.follower = follower
        self.taken = follower.tell({"job": "requests", "spool": self.spool, "out": self._tmp})

    def write(self, values: tuple, itl_s: np.ndarray) -> None:
        file = self._file
        file.write(HEADER.pack(*values, len(itl_s)))
        file.write(itl_s)  # its float64s as they are in memory
        self.num_written += 1

    def close(self) -> Path:
        """Wait for the follower to write the last lines (else write them all here), then name the file."""
        self._cleanup.detach()
        self._file.close()
        size = os.path.getsize(self.spool)
        # a helper that kept up has the last buffer left; one that fell behind gets a second per 20 MB
        answer = self.follower.ask({"job": "requests_end", "size": size}, timeout_s=30 + size / 20e6)
        if isinstance(answer, dict) and answer.get("written") == self.num_written and _gap_stats(answer.get("itl")):
            self.gap_stats = answer["itl"]
        else:
            self.follower.close()  # silent, wrong or late: it must not write on while this does
            os.truncate(self._tmp, 0)
            self.gap_stats = follow_spool(self.spool, self._tmp, lambda: size)["itl"]
        if os.path.exists(self.spool):  # a follower that wrote every line has removed it
            os.unlink(self.spool)
        return self._publish()


# who follows a run's spool: set by the command for its single run (kvbench.cli: `bench`'s
# helper), read where the run opens its log (scenarios/build); None everywhere else
follower: ContextVar[Follower | None] = ContextVar("follower", default=None)


def open_request_log(path: Path, follower: Follower | None = None) -> RequestLog:
    """The run's log: spooled for `follower` where there is one that takes it, else written here."""
    if follower is not None:
        log = SpooledRequestLog(path, follower)
        if log.taken:
            return log
        log._cleanup()
    return RequestLog(path)


def _gap_stats(stats) -> bool:
    """Whether a follower's `itl` answer holds every statistic ValueCounts.stats gives."""
    return isinstance(stats, dict) and all(isinstance(stats.get(f"{stat}_itl_ms"), float) for stat in STATS)


def _convert(buffer: bytes, write: Callable[[bytes], object], gaps: ValueCounts) -> tuple[int, int]:
    """Write the lines of the whole requests at the start of `buffer`, and count their gaps
    into `gaps`: (bytes used, requests)."""
    at, end, count = 0, len(buffer), 0
    header = HEADER.size
    while at + header <= end:
        *values, num_gaps = HEADER.unpack_from(buffer, at)
        stop = at + header + 8 * num_gaps
        if stop > end:
            break
        itl_s = np.frombuffer(buffer, np.float64, num_gaps, at + header)
        write(_line(values, itl_s))
        gaps.add(itl_s)
        at, count = stop, count + 1
    return at, count


def follow_spool(
    spool: str,
    out: str,
    size: Callable[[], int | None],
    stop: Callable[[], bool] = lambda: False,
    poll_s=0.002,
) -> dict | None:
    """Append the lines of the requests in `spool` to `out` (an existing file; the caller
    empties it first where it must: see _temp_beside on truncating), reading the spool as it
    grows until it is whole: `size()` says its final size, None while it grows. Returns the
    answer a follower gives at the spool's end: {"written": how many requests, "itl": their
    inter-token gaps' statistics (ValueCounts.stats)}; gives up (None) as soon as `stop()` is
    True. Raises ValueError where the spool ends inside a request, FileNotFoundError where
    either file is gone."""
    written, pending, read, gaps = 0, b"", 0, ValueCounts()
    # r+b, not ab: a file the run already removed (it failed at once) must not be made again
    with open(spool, "rb") as source, open(out, "r+b", buffering=1 << 16) as target:
        target.seek(0, os.SEEK_END)
        while True:
            chunk = source.read(1 << 20)
            if chunk:
                read += len(chunk)
                pending += chunk
                used, count = _convert(pending, target.write, gaps)
                pending, written = pending[used:], written + count
                continue
            final = size()
            if final is not None and read >= final:
                break
            if stop():
                return None
            time.sleep(poll_s)
    if pending or read != final:
        raise ValueError(f"{spool} does not end with a whole request ({len(pending)} bytes left over)")
    return {"written": written, "itl": gaps.stats("itl")}
