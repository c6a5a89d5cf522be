"""A sweep's bookkeeping: what produced each point (fingerprint), one sweep per directory (lock),
a time limit per point.

A finished point's directory holds metrics.csv and fingerprint.json: the hash of its resolved
config (less the keys that do not change what it measures), the kvbench version and git sha
that ran it, the files it reads and a third-party plugin's source file, and in a checkout with
uncommitted changes, a hash of them. Re-running a sweep into
its directory skips a point only when its rows are all ok and its fingerprint is today's;
anything else (failed, unreadable, produced by another config or another kvbench) is run again,
and the log says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kvbench.errors import UserError

FINGERPRINT = "fingerprint.json"
LOCK = ".kvbench.lock"


def fingerprint(cfg: DictConfig, not_measured=()) -> dict:
    """What produced a point: its resolved config less the `not_measured` keys (dotted; the
    sweep's hydra.job.config.override_dirname.exclude_keys, which also keep them out of the point's
    name and columns), the kvbench version and git sha, and a dirty checkout's changes."""
    from kvbench.reporting.results import environment, source_changes

    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved.pop("hydra", None)
    for key in not_measured:
        *parents, leaf = key.split(".")
        node = resolved
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    text = json.dumps(resolved, sort_keys=True, default=str)
    env = environment()
    found = {
        "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "kvbench_version": env["kvbench_version"],
        "git_sha": env["git_sha"],
    }
    changes = source_changes()
    if changes:  # a dirty checkout's sha does not name its code: edits between two runs must show
        found["source_changes"] = changes
    files = input_files(resolved)
    if files:  # only where the point reads one: a fingerprint of before stays the same
        found["input_files"] = files
    plugins = plugin_sources(resolved)
    if plugins:  # only where a plugin from outside kvbench runs: its code is not in kvbench's sha
        found["plugin_sources"] = plugins
    return found


def outside_plugins(resolved: dict) -> dict:
    """kind -> class of the point's allocator, backend or graph mode, for each one a package
    other than kvbench contributes. A name the registry does not know is left to the run to refuse."""
    from kvbench.registry import KINDS, default_registry, from_outside

    found = {}
    for kind in KINDS:
        name = (resolved.get(kind) or {}).get("name") if isinstance(resolved.get(kind), dict) else None
        if not isinstance(name, str):
            continue
        try:
            cls = default_registry().classes(kind).get(name)
        except UserError:
            continue
        if cls is not None and from_outside(cls):
            found[kind] = cls
    return found


def plugin_sources(resolved: dict) -> dict[str, str]:
    """kind -> `module sha256` of the file that defines each outside plugin the point runs
    (outside_plugins): a plugin edited, or upgraded in place, between two runs is run again
    rather than its old row kept. kvbench's own plugins are named by its git sha (and a dirty
    checkout's changes) already."""
    import inspect

    found = {}
    for kind, cls in outside_plugins(resolved).items():
        try:
            path = inspect.getsourcefile(cls)
        except TypeError:  # a class with no source file (built in C, or made at run time)
            continue
        try:
            digest = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else "no source file"
        except OSError:
            digest = "unreadable"
        found[kind] = f"{cls.__module__} {digest}"
    return found


def plugin_options(cfg: DictConfig) -> dict:
    """`kind.key` -> value of every option of each outside plugin the point runs (its package's
    YAML, as resolved), so that its row says how the plugin was set even where the command line
    did not: two runs of a plugin whose YAML changed are two points, not one that regressed.
    kvbench's own plugins' defaults are named by its version; a key set on the command line is
    a column already."""
    from kvbench.registry import KINDS

    chosen = [kind for kind in KINDS if isinstance(cfg.get(kind), DictConfig)]
    resolved = {kind: OmegaConf.to_container(cfg[kind], resolve=True) for kind in chosen}
    return {
        f"{kind}.{key}": value
        for kind in outside_plugins(resolved)
        for key, value in resolved[kind].items()
        if key not in ("name", "block_size") and (value is None or isinstance(value, (bool, int, float, str)))
    }


# the config keys that name a file whose contents shape a point's result (its config names only
# the path: a trace rewritten in place must not leave the old point's row standing)
INPUT_FILE_KEYS = ("workload.path", "executor.profile", "scenario.profile")


def input_files(resolved: dict) -> dict[str, str]:
    """key -> the sha256 of the file it names, for each of INPUT_FILE_KEYS the point sets."""
    files = {}
    for key in INPUT_FILE_KEYS:
        section, leaf = key.split(".")
        path = (resolved.get(section) or {}).get(leaf) if isinstance(resolved.get(section), dict) else None
        if not isinstance(path, str) or not path:
            continue
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            files[key] = digest.hexdigest()
        except OSError:
            files[key] = "unreadable"
    return files


def write_fingerprint(point_dir: Path, current: dict) -> None:
    from kvbench.reporting.results import write_atomic

    write_atomic(Path(point_dir) / FINGERPRINT, json.dumps(current, indent=1) + "\n")


def _read_statuses(metrics: Path) -> list[str]:
    """A finished point's rows' statuses, its rows checked as the sweep's report will check them:
    a cell that is no number there (a file edited by hand, a disk's damage) reruns the point, where
    skipping it would end the sweep in that error."""
    from kvbench.reporting.inputs import check_results  # only a resumed sweep reads a finished point back
    from kvbench.reporting.results import read_csv

    frame = read_csv(metrics)
    if "status" in frame and frame["status"].eq("ok").all():  # a failed point runs again whatever it holds
        check_results(frame, metrics)
    return frame["status"].fillna("").astype(str).tolist() if "status" in frame else [""] * len(frame)


def remove_if_bare(folder: Path, made: tuple[str, ...]) -> None:
    """Remove `folder` where it holds nothing but `made` (what this process made there before it
    refused to go on: Hydra's files, the sweep's lock); anything else in it, it stays."""
    import shutil

    folder = Path(folder)
    try:
        if folder.is_dir() and {entry.name for entry in folder.iterdir()} <= set(made):
            for name in made:
                entry = folder / name
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink(missing_ok=True)
            folder.rmdir()
    except OSError:  # in use, or not ours to remove: left as it is
        pass


def resume(point_dir: Path, current: dict) -> tuple[bool, str]:
    """(skip, why): whether an earlier run of the sweep already finished this point as it is now.
    A point that runs again first loses the temporary files a killed run of it left (a
    half-written requests.jsonl spool: files are written to .NAME.*.tmp and renamed)."""
    skip, why = _resume(point_dir, current)
    if not skip:
        for stale in Path(point_dir).glob(".*.tmp"):
            stale.unlink(missing_ok=True)
    return skip, why


def _resume(point_dir: Path, current: dict) -> tuple[bool, str]:
    metrics = Path(point_dir) / "metrics.csv"
    if not metrics.exists():
        return False, ""
    try:
        statuses = _read_statuses(metrics)
    except UserError as err:  # a result table's own checks, one line that names what is wrong
        said = str(err).removeprefix(str(metrics)).removeprefix(":").strip()
        return False, f"its metrics.csv is unreadable ({said})"
    except (OSError, ValueError) as err:  # pandas' parser and decoding errors are ValueErrors
        return False, f"its metrics.csv is unreadable ({type(err).__name__})"
    if not statuses or any(status not in ("ok", "failed") for status in statuses):
        return False, "its metrics.csv is unreadable (no rows with a status)"
    if any(status != "ok" for status in statuses):
        return False, "it failed last time"
    try:
        stored = json.loads((Path(point_dir) / FINGERPRINT).read_text())
    except (OSError, ValueError):
        return False, "it has no readable fingerprint of what produced it"
    if not isinstance(stored, dict):  # JSON, but not the object a run writes
        return False, "its fingerprint is not one a run wrote (not a JSON object)"

    def what(key: str, value) -> str:
        if key == "config_sha256":
            return "its config"
        if key == "source_changes":
            return "kvbench's uncommitted changes"
        if key == "input_files":
            old = stored[key] if isinstance(stored.get(key), dict) else {}
            return "the file at " + ", ".join(k for k in value if old.get(k) != value[k])
        if key == "plugin_sources":
            old = stored[key] if isinstance(stored.get(key), dict) else {}
            return ", ".join(f"the {k} plugin's code ({value[k].split()[0]})" for k in value if old.get(k) != value[k])
        return f"{key} {stored.get(key)} -> {value}"

    changed = [what(key, value) for key, value in current.items() if stored.get(key) != value]
    if changed:
        return False, f"changed since it ran: {', '.join(changed)}"
    return True, "complete from an earlier run of this sweep"


class SweepLock:
    """An exclusive lock on a sweep directory for the sweep's whole run (released by the OS if
    killed; `release_all` releases what a sweep that ended early in this process still holds)."""

    held: set[SweepLock] = set()

    def __init__(self, sweep_dir: Path):
        self.path = Path(sweep_dir) / LOCK
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise UserError(
                f"{self.path.parent} is in use by another sweep ({holder}); wait for it to "
                f"finish or give another hydra.sweep.dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}\n".encode())
        self.fd = fd
        SweepLock.held.add(self)

    def release(self) -> None:
        if self.fd is not None:
            # the file stays (removing it would let a sweep that opened it lock a name no other
            # finds), emptied: its holder's line named a sweep that has ended
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
        SweepLock.held.discard(self)

    @classmethod
    def release_all(cls) -> None:
        """After `bench` in this process, however it ended (Ctrl-C, a crash): a rerun in the same
        process (a test, a notebook) must find the directory free, as a new process does."""
        for lock in list(cls.held):
            lock.release()


RETRY_S = 0.05  # a deadline's next try after its exception was swallowed


class PointTimeout(UserError):
    """The point ran past sweep.point_timeout_s."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise PointTimeout in the body after `seconds` of wall time (on the main thread of the process
    running the point, which every Hydra launcher gives a job; elsewhere there is no limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    message = f"the point ran longer than sweep.point_timeout_s={seconds:g} s; raise it or shrink the workload"
    expired = False

    # The handler's exception surfaces wherever the main thread is. Inside a finalizer or a
    # weakref callback (which the garbage collector runs at any allocation) Python prints it as
    # "ignored" and carries on, so the handler fires again shortly, and a body that still gets
    # to its end is stopped there.
    def expire(signum, frame):
        nonlocal expired
        expired = True
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)
        raise PointTimeout(message)

    previous = signal.signal(signal.SIGALRM, expire)
    try:  # armed inside: a limit of a microsecond fires before the next line, and the finally must
        signal.setitimer(signal.ITIMER_REAL, seconds)  # cancel its retry (else SIGALRM kills the process)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if expired:
        raise PointTimeout(message)
