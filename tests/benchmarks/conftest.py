"""Benchmark fixtures: the build in machine_info, and an injected slowdown to test the gate with.

KVBENCH_TEST_SLOWDOWN=F makes every benchmarked call take (1 + F) times as long
(tests/slowdown.py): a slower hot path without editing one. It lets the
regression gate be checked end to end (bench-compare --against REF --current-env
KVBENCH_TEST_SLOWDOWN=0.25 must report the slowdown).
"""

from __future__ import annotations

import os

import pytest
import torch
from pytest_benchmark.fixture import BenchmarkFixture
from slowdown import slowed


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["torch"] = torch.__version__


class SlowedBenchmark(BenchmarkFixture):
    """The benchmark fixture with every timed function slowed by `slowdown`."""

    slowdown = 0.0

    def __call__(self, function_to_benchmark, *args, **kwargs):
        return super().__call__(slowed(function_to_benchmark, self.slowdown), *args, **kwargs)

    def pedantic(self, target, *args, **kwargs):
        return super().pedantic(slowed(target, self.slowdown), *args, **kwargs)


@pytest.fixture
def benchmark(benchmark):
    factor = float(os.environ.get("KVBENCH_TEST_SLOWDOWN", "0") or 0)
    if factor:  # pytest-benchmark accepts only its own fixture class, so the instance is recast
        benchmark.__class__ = SlowedBenchmark
        benchmark.slowdown = factor
    return benchmark
