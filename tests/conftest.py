"""pytest set-up: kernels under the Triton interpreter without a GPU, and the `gpu` marker.

Helpers that test files share live in tests/helpers, imported by name (`from helpers.sequences
import make_seq`); this file holds only what pytest itself must see.
"""

import logging
import os

import pytest
import torch

# Triton picks interpreter or compiler when a kernel module is first imported, and conftest is
# imported before any test file: without a GPU every test runs the kernels under the interpreter
# (unless TRITON_INTERPRET is already set, e.g. to 0 to see the refusal).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from helpers.sequences import make_seq  # noqa: E402  (after the interpreter choice, like every kvbench import)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need a CUDA device: without one they are skipped, saying so."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["torch"] = torch.__version__  # bench-compare flags a change of build


@pytest.fixture
def seq_factory():
    return make_seq


@pytest.fixture(autouse=True)
def _no_logging_into_a_closed_capture():
    """An in-process run lets Hydra configure logging: the root logger's handler then writes to
    that test's captured stdout. A later run with hydra/job_logging=none configures nothing and
    would log into the closed capture ("--- Logging error ---" on stderr, a traceback)."""
    yield
    root = logging.getLogger()
    for handler in root.handlers[:]:
        if getattr(getattr(handler, "stream", None), "closed", False):
            root.removeHandler(handler)


@pytest.fixture(autouse=True)
def no_hydra_config_left_over():
    """A command run in-process that stops before its job (a sweep refused before its first point)
    leaves Hydra's config of the run it set up, whose output folder is not yet set: a test that
    runs a point without Hydra after it would take that config for its own."""
    yield
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().cfg = None
