"""A slower hot path without editing one: wrap a function so each call takes (1 + factor) times
as long, by spinning after it for `factor` times its own duration (a fixture for the gate)."""

from __future__ import annotations

import functools
import time


def slowed(fn, factor: float):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        until = start + (time.perf_counter() - start) * (1 + factor)
        while time.perf_counter() < until:
            pass
        return result

    return call
