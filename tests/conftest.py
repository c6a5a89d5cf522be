"""Shared fixtures: small sequences and requests for allocator and scheduler scenarios."""

import itertools
import os

import torch

# Triton picks interpreter or compiler when a kernel module is first imported, whichever test
# file does that first: without a GPU every test runs the kernels under the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from kvbench.core.sequence import Request, Sequence

_ids = itertools.count()


def make_seq(prompt_len: int, output_len: int, generated: int = 0) -> Sequence:
    request = Request(next(_ids), 0.0, prompt_len, output_len)
    return Sequence(next(_ids), request, prompt_len + generated)


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["torch"] = torch.__version__  # bench-compare flags a change of build


@pytest.fixture
def seq_factory():
    return make_seq
