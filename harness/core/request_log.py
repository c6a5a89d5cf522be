"""requests.jsonl: one JSON line per finished request, streamed to disk while the run goes on.

JSON lines rather than parquet: a line is appended the moment a request finishes, so memory
does not grow with the run (parquet buffers whole row groups and needs pyarrow); and its arrays
(`itl_s`) read like `vllm bench serve --save-result`'s. orjson writes each line: a float as
Python's repr does, a numpy array without a list in between, several times faster than json.
`pandas.read_json(path, lines=True)` loads it. The file is written under a temporary name and
renamed when the run ends, as every kvbench result file is, so a finished name is a whole file.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from pathlib import Path

import orjson

LINE = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def _discard(file, tmp: str) -> None:
    file.close()
    if os.path.exists(tmp):
        os.unlink(tmp)


class RequestLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        self._file = os.fdopen(fd, "wb", buffering=1 << 16)
        # a run that raises never calls close(): its partial file goes with the log
        self._cleanup = weakref.finalize(self, _discard, self._file, self._tmp)

    def write(self, record: dict, itl_s=()) -> None:
        """One line: `record`, then `itl_s` (seconds, a list or a numpy array) as its last field."""
        self._file.write(orjson.dumps({**record, "itl_s": itl_s}, option=LINE))

    def close(self) -> Path:
        self._cleanup.detach()
        self._file.close()
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(self._tmp, 0o666 & ~mask)  # mkstemp makes 0600; results are for everyone to read
        os.replace(self._tmp, self.path)
        return self.path
