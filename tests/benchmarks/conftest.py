"""Benchmark fixtures: the build in machine_info, and an injected slowdown to test the gate with.

KVBENCH_TEST_SLOWDOWN=F makes every benchmarked call take (1 + F) times as long, by spinning
after it for F times its own duration: a slower hot path without editing one. It lets the
regression gate be checked end to end (bench-compare --against REF --current-env
KVBENCH_TEST_SLOWDOWN=0.25 must report the slowdown).
"""

from __future__ import annotations

import functools
import os
import time

import pytest
import torch


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["torch"] = torch.__version__


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


class SlowedBenchmark:
    """The benchmark fixture with every timed function slowed by `factor`."""

    def __init__(self, benchmark, factor: float):
        self._benchmark, self._factor = benchmark, factor

    def __call__(self, fn, *args, **kwargs):
        return self._benchmark(slowed(fn, self._factor), *args, **kwargs)

    def pedantic(self, target, *args, **kwargs):
        return self._benchmark.pedantic(slowed(target, self._factor), *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._benchmark, name)


@pytest.fixture
def benchmark(benchmark):
    factor = float(os.environ.get("KVBENCH_TEST_SLOWDOWN", "0") or 0)
    return SlowedBenchmark(benchmark, factor) if factor else benchmark
