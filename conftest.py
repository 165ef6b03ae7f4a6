"""pytest set-up shared by every test file.

- Triton kernels run under the CPU interpreter when there is no GPU: TRITON_INTERPRET must be set before
  triton is imported (and so before kernel.py defines its kernels).
- `python -m pytest -q` runs the fast spec; `--slow` adds the tests marked slow (DDP, kill -9, the hostile
  batteries, the interpreter's kernel sweeps: the whole suite).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the slow tests (the whole suite)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slower end-to-end test, run with --slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]

