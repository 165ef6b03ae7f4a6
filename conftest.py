"""pytest set-up shared by every test file.

- Triton kernels run under the CPU interpreter when there is no GPU: TRITON_INTERPRET must be set
before
  triton is imported (and so before kernel.py defines its kernels). A test that runs the fused
  kernel takes the fixture `kernel_device`: "cuda" on a GPU machine, else "cpu" (the interpreter),
  or it skips saying why.
- `python -m pytest -q` runs the fast spec; `--slow` adds the tests marked slow (DDP, kill -9, the
hostile
  batteries, the interpreter's kernel sweeps: the whole suite).
"""
import importlib.util
import os

import numpy as np
import pytest
import torch

from support.configurator import version

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def kernel_device():
    """Where a test runs the fused kernel (its --device): the GPU, or a CPU in the Triton
    interpreter. Where the kernel cannot run here, the test skips and says what is missing."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("the fused kernel needs triton, which is not installed (Linux only)")
    pytest.importorskip("kernel", exc_type=ImportError)  # kernel.py says which torch it needs
    import triton
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the fused kernel on a CPU needs TRITON_INTERPRET=1, set before triton is "
                    "imported")
    if version(triton.__version__) < (3, 7) and version(np.__version__) >= (2, 4):
        pytest.skip(f"the Triton interpreter of triton {triton.__version__} fails under numpy "
                    f"{np.__version__} (only 0-dimensional arrays can be converted): numpy < 2.4 or "
                    "triton >= 3.7 runs it")
    return "cpu"


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true",
                     help="also run the slow tests (the whole suite)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slower end-to-end test, run with --slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]

