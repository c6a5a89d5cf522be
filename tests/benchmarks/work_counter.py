"""Work a hot path does, counted by a tracer: Python calls and lines per step, not seconds.

Wall time on a shared host moves by tens of percent between identical runs; the number of
Python function calls and lines a step executes does not move at all for the same code and
state, so it is gated exactly. A scan over the whole KV pool hidden in a step shows up here as
thousands more lines even when the clock cannot see it.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable


def count_work(step: Callable[[], object], steps: int) -> tuple[float, float]:
    """(calls, lines) per call of `step`, averaged over `steps` calls."""
    calls = lines = 0

    def tracer(frame, event, arg):
        nonlocal calls, lines
        if event == "call":
            calls += 1
        elif event == "line":
            lines += 1
        return tracer

    # A garbage collection inside the counted steps would run finalizers of objects that earlier
    # code left behind (a weakref.finalize is Python code): collect first, and not while counting.
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.settrace(previous)
        if collecting:
            gc.enable()
    return calls / steps, lines / steps
