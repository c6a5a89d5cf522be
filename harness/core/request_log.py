"""requests.jsonl: one JSON line per finished request, streamed to disk while the run goes on.

JSON lines rather than parquet: a line is appended the moment a request finishes, so memory
does not grow with the run (parquet buffers whole row groups and needs pyarrow); and its arrays
(`itl_s`) read like `vllm bench serve --save-result`'s.
`pandas.read_json(path, lines=True)` loads it. The file is written under a temporary name and
renamed when the run ends, as every kvbench result file is, so a finished name is a whole file.
"""

from __future__ import annotations

import json
import os
import tempfile
import weakref
from pathlib import Path


def _discard(file, tmp: str) -> None:
    file.close()
    if os.path.exists(tmp):
        os.unlink(tmp)


class FloatText(dict):
    """float -> its repr, made once per distinct value."""

    def __missing__(self, value: float) -> str:
        text = self[value] = repr(value)
        return text


class RequestLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        self._file = os.fdopen(fd, "w", buffering=1 << 16)
        # a run that raises never calls close(): its partial file goes with the log
        self._cleanup = weakref.finalize(self, _discard, self._file, self._tmp)
        self._float_text = FloatText()

    def write(self, record: dict, itl_s=()) -> None:
        """One line: `record`, then `itl_s` (seconds) as its last field, each float written as
        json writes it (its repr) but looked up: a run's gaps repeat from request to request."""
        line = json.dumps(record, separators=(",", ":"))
        self._file.write(line[:-1])
        self._file.write(',"itl_s":[' if len(line) > 2 else '{"itl_s":[')
        self._file.write(",".join(map(self._float_text.__getitem__, itl_s)))
        self._file.write("]}\n")
        if len(self._float_text) > 1 << 16:  # the gaps of long-past steps are not seen again
            self._float_text.clear()

    def close(self) -> Path:
        self._cleanup.detach()
        self._file.close()
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(self._tmp, 0o666 & ~mask)  # mkstemp makes 0600; results are for everyone to read
        os.replace(self._tmp, self.path)
        return self.path
