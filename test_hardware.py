"""
Tests for hardware.py: the peak-FLOPs table by GPU name, and keeping freed memory on glibc.

    python -m pytest -q test_hardware.py
"""
import os
import platform
import subprocess
import sys

import pytest
import torch

from hardware import peak_flops


@pytest.mark.parametrize("name, flops", [
    ("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A10G", 70e12), ("NVIDIA A10", 125e12), ("NVIDIA L40S", 362e12), ("NVIDIA L40", 181e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA GeForce RTX 4090", 165e12), ("Tesla T4", 65e12), ("NVIDIA B200", None),
])
def test_peak_flops_by_gpu_name(monkeypatch, name, flops):
    """The first matching name wins, longer names first (an A10G is no A10, an A100 neither, an L40 no L4)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda")) == flops
    assert peak_flops(torch.device("cpu")) is None


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc")
def test_keep_freed_memory_stops_the_page_faults_between_training_steps():
    """Twenty training steps of a small GPT in a fresh process, after ten to warm up: by default glibc hands
    the activations' memory back to the OS after each step and page-faults it in again at the next; after
    keep_freed_memory() the steps reuse it."""
    code = """if 1:
        import resource, torch
        from hardware import keep_freed_memory
        from model import GPT, GPTConfig
        assert keep_freed_memory() if {keep} else True
        model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=65))
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99))
        x = torch.randint(0, 65, (12, 64))
        for step in range(30):
            if step == 10:
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            model(x, x)[1].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)"""
    here = os.path.dirname(os.path.abspath(__file__))
    faults = {keep: int(subprocess.run([sys.executable, "-c", code.format(keep=keep)], capture_output=True,
                                       text=True, check=True, cwd=here).stdout)
              for keep in (False, True)}
    # ~900 per step by default, and a few stray ones once freed memory is kept
    assert faults[False] > 2000 and faults[True] * 5 < faults[False], faults
