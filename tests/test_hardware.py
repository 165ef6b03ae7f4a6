"""
Tests for hardware.py: keeping freed memory on glibc, the peak FLOP/s of a GPU, the DDP start's one line.

    python -m pytest -q tests/test_hardware.py
"""
import json
import os
import platform
import subprocess
import sys

import pytest
import torch

import model
from helpers import QUICK, ROOT, run_argv, workdir  # noqa: F401 (a fixture)
from support.configurator import ConfigError
from support.hardware import Run, join_group, peak_flops


# In a fresh process, 128 MiB in 8 MiB blocks (the size of a step's activations) are written and freed, after
# keep_freed_memory() when the argument is "keep". Prints the MiB handed back to the OS.
HANDED_BACK = """if 1:
    import ctypes, os, sys
    from support.hardware import keep_freed_memory
    if sys.argv[1] == "keep":
        assert keep_freed_memory()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def resident_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def handed_back():
        blocks = [libc.malloc(8 << 20) for _ in range(16)]
        for block in blocks:
            ctypes.memset(block, 1, 8 << 20)
        before = resident_mib()
        for block in blocks:
            libc.free(block)
        return before - resident_mib()
    print(handed_back())"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc")
@pytest.mark.slow
def test_keep_freed_memory_keeps_what_is_freed():
    """The mechanism, which no load changes: by default glibc returns large freed blocks to the OS (unmapping
    them, or trimming the heap's free top); after keep_freed_memory() it keeps them for the next malloc."""
    def handed_back(setting):
        p = subprocess.run([sys.executable, "-c", HANDED_BACK, setting], capture_output=True, text=True,
                           check=True, cwd=ROOT)
        return float(p.stdout)
    default, kept = handed_back("default"), handed_back("keep")
    assert default > 120 and kept < 8, (default, kept)  # MiB of the 128 freed


# Training steps of a small GPT in one fresh process: blocks of 5 steps with glibc's default, then blocks of 5
# after keep_freed_memory(). Prints the minor page faults of each block: {"default": [...], "kept": [...]}.
PAGE_FAULTS = """if 1:
    import json, resource, torch
    torch.set_num_threads(1)  # on a busy machine two threads waiting on each other made each step ~5x slower
    from support.hardware import keep_freed_memory
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=65))
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99))
    x = torch.randint(0, 65, (12, 64))

    def faults(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(steps):
            model(x, x)[1].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    faults(10)  # the first steps allocate what every later step reuses, with either setting
    default = [faults(5) for _ in range(6)]
    assert keep_freed_memory()
    faults(5)
    print(json.dumps({"default": default, "kept": [faults(5) for _ in range(6)]}))"""


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc")
def test_keep_freed_memory_stops_the_page_faults_between_training_steps():
    """What the mechanism is for: by default glibc hands the activations' memory back to the OS after a
    step and page-faults it in again at the next; after keep_freed_memory() the steps reuse it. Both settings
    run in one process, on one thread, and the default must show 4 times the faults kept (measured on a
    machine with 5x more work than cores: 14-88x; 0.7-1.4x when keep_freed_memory does nothing). How many
    faults glibc's default makes varies, and stray faults come with what else the machine does; so a fresh
    process tries again, at most 3 times, and a failure shows every try."""
    tries = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", PAGE_FAULTS], capture_output=True, text=True, check=True,
                             cwd=ROOT).stdout
        faults = json.loads(out)
        tries.append(faults)
        if sum(faults["default"]) >= 4 * (sum(faults["kept"]) + 100):
            return
    pytest.fail(f"after keep_freed_memory() the steps page-faulted more than a quarter as often as by "
                f"default, in each of 3 fresh processes: {tries}")


@pytest.mark.parametrize("name, flops", [
    ("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A10G", 70e12), ("NVIDIA A10", 125e12), ("NVIDIA L40S", 362e12), ("NVIDIA L40", 181e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA GeForce RTX 4090", 165e12), ("Tesla T4", 65e12), ("NVIDIA B200", None),
])
def test_peak_flops_by_gpu_name(monkeypatch, name, flops):
    """The first matching name wins, longer names first (an A10G is no A10, an A100 neither, an L40 no L4)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda")) == peak_flops("cuda:1") == flops  # a device or its name
    assert peak_flops(torch.device("cpu")) is None


def test_an_nccl_error_at_the_start_of_the_group_is_one_line(monkeypatch):
    """On GPUs the group binds NCCL to this process's GPU at once: its errors (DistBackendError, a
    RuntimeError, often of several lines) come out of join_group as one line naming the first."""
    cause = ("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error\nncclUnhandledCudaError: Call "
             "to CUDA function failed.\nLast error:\nCuda failure 'out of memory'")

    def nccl_fails(*args, **kwargs):
        raise torch.distributed.DistBackendError(cause)
    monkeypatch.setattr(torch.distributed, "init_process_group", nccl_fails)
    with pytest.raises(ConfigError) as e:
        join_group(Run(rank=1, local_rank=1, world_size=2, dev="cuda:1", dtype="float32"))
    assert str(e.value) == ("the DDP process group could not start (DistBackendError: NCCL error in: "
                            "ProcessGroupNCCL.cpp:1970, unhandled cuda error); check MASTER_ADDR, choose a "
                            "free MASTER_PORT and, on CPUs, check GLOO_SOCKET_IFNAME (a network interface "
                            "here)")


def test_bfloat16_on_a_cpu_runs_under_autocast_in_bfloat16(workdir, monkeypatch, capsys):
    """dtype=bfloat16 on a CPU: the forward computes in bfloat16 (autocast), as the start line says; the
    default there is float32, without autocast."""
    seen = []
    qkv = model.CausalSelfAttention.qkv
    monkeypatch.setattr(model.CausalSelfAttention, "qkv",
                        lambda self, x: seen.append(qkv(self, x)[0].dtype) or qkv(self, x))
    run_argv(QUICK + ["--val_tokens=64", "--dtype=bfloat16", "--out_dir=out/bf16"])
    assert "device cpu, dtype bfloat16," in capsys.readouterr().out
    assert seen and set(seen) == {torch.bfloat16}  # every forward: the warm-up, the steps, the evaluations
    seen.clear()
    run_argv(QUICK + ["--val_tokens=64", "--out_dir=out/fp32"])
    assert "device cpu, dtype float32," in capsys.readouterr().out
    assert seen and set(seen) == {torch.float32}


def test_a_gpu_index_must_be_one_this_machine_has(monkeypatch):
    """--device=cuda:N names one of the machine's GPUs: cuda:N past the last is one line."""
    from support.hardware import pick_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda:1") == ("cuda:1", "cuda") and pick_device("cuda") == ("cuda", "cuda")
    with pytest.raises(ConfigError, match=r"^device='cuda:2' but this machine has 2 GPU\(s\): choose one"):
        pick_device("cuda:2")
    assert pick_device("cpu") == ("cpu", "cpu")
