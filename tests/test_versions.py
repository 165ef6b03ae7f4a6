"""
The torch a user already has. Below the oldest torch nanoCorridor runs on (README: 2.6), every script stops at
its start with one line naming the version it needs; below the fused kernel's (2.8), so does impl=triton. And
the test run of a GPU machine: no test runs the kernel on a CPU there, where no interpreter is on.

    python -m pytest -q tests/test_versions.py
"""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT

# python -c AS_IF VERSION SCRIPT ARGS...: `python SCRIPT ARGS` (or `python -m MODULE ARGS` for SCRIPT
# -m:MODULE) under a torch that says it is VERSION
AS_IF = """
import runpy, sys, torch
torch.__version__, script, sys.argv = sys.argv[1], sys.argv[2], sys.argv[2:]
if script.startswith("-m:"):
    runpy.run_module(script[3:], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(script, run_name="__main__")
"""
TOO_OLD = "error: nanoCorridor needs torch >= 2.6, this is torch 2.4.1: pip install -U torch"
KERNEL_TOO_OLD = "the fused kernel needs torch >= 2.8 (pip install -U torch), this is torch 2.7.1; use " \
                 "impl=sdpa"
RUNS = [  # (the torch it says it is, the script and its arguments, the start of its one line)
    ("2.4.1", ["train.py", "config/train_demo.py"], TOO_OLD),
    ("2.4.1", ["sample.py", "--out_dir=out/demo"], TOO_OLD),
    ("2.4.1", ["corridor.py", "out/demo"], TOO_OLD),
    ("2.4.1", ["model.py", "--op=laplacian"], TOO_OLD),
    ("2.4.1", ["bench.py"], TOO_OLD),
    ("2.7.1", ["train.py", "--impl=triton"], "error: " + KERNEL_TOO_OLD),
    ("2.7.1", ["-m:support.kernel_check"], "error: " + KERNEL_TOO_OLD),
]


def test_a_torch_too_old_gets_one_line_when_a_script_starts(tmp_path):
    """Each script, run as a user runs it in a fresh folder: one line on stderr, nothing else, exit status 1
    or 2, no run directory, no data prepared."""
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    runs = []
    for version, (script, *args), _ in RUNS:  # all at once: each imports torch
        where = script if script.startswith("-m:") else os.path.join(ROOT, script)
        runs.append(subprocess.Popen([sys.executable, "-c", AS_IF, version, where, *args], cwd=tmp_path,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for (version, cmd, line), p in zip(RUNS, runs):
        out, err = p.communicate(timeout=300)
        if "fused kernel" in line and importlib.util.find_spec("triton") is None:
            continue  # without triton, impl=triton gets another line (test_model.py checks it)
        assert p.returncode in (1, 2) and out == "" and err.startswith(line) and err.count("\n") == 1, \
            (cmd, p.returncode, out, err)
    assert os.listdir(tmp_path) == []


# A pytest plugin (-p) that makes this CPU machine look like a GPU machine to conftest.py and the tests, runs
# only the tests whose code names the kernel or triton, and notes each that hands the fused kernel CPU
# tensors: there the interpreter is off, so the kernel refuses them
GPU_MACHINE = """
import inspect, os, re, torch, kernel
torch.cuda.is_available = lambda: True
run_kernel = kernel.mix_attention


def pytest_collection_modifyitems(items):
    items[:] = [item for item in items if re.search("kernel|triton", inspect.getsource(item.function))]


def mix_attention(q, *args, **kw):
    if q.device.type == "cpu":
        with open(os.environ["CPU_KERNEL_CALLS"], "a") as f:
            f.write(os.environ["PYTEST_CURRENT_TEST"] + "\\n")
    return run_kernel(q, *args, **kw)


kernel.mix_attention = mix_attention
"""


def test_on_a_gpu_machine_no_test_runs_the_kernel_on_a_cpu(tmp_path):
    """Every test whose code names the kernel or triton (but tests/test_kernel.py's, whose CPU calls are its
    refusals, and the notebook's), run as on a GPU machine: CUDA available, TRITON_INTERPRET unset. None
    hands the kernel CPU tensors; here those that run it fail at once on the CUDA that is not there, which
    this test does not mind."""
    pytest.importorskip("kernel", exc_type=ImportError)
    (tmp_path / "gpu_machine.py").write_text(GPU_MACHINE)
    calls = tmp_path / "cpu_kernel_calls"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(tmp_path), CPU_KERNEL_CALLS=str(calls))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "--slow", "-p", "gpu_machine", "-p",
                        "no:cacheprovider", "test_model.py", "tests", "--ignore=tests/test_kernel.py",
                        "--ignore=tests/test_notebook.py",  # its kernel is Jupyter's (the lesson uses sdpa)
                        f"--ignore={__file__}"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode in (0, 1) and re.search(r"\d+ (passed|failed)", p.stdout), p.stdout[-3000:]
    assert not calls.exists(), calls.read_text()
