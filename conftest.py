"""pytest set-up shared by every test file: run Triton kernels under the CPU interpreter when there is no GPU.

TRITON_INTERPRET must be set before any @triton.jit function is defined, i.e. before kernel.py is imported.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slower end-to-end test (still runs in CI)")
