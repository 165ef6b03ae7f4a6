"""Tests for kernel.py: the fused mix-attention kernel against the float64 materialised reference.

On a CUDA machine the kernels run for real on CUDA tensors in fp32, fp16 and bf16. On a CPU conftest.py sets
TRITON_INTERPRET=1 and they run in the Triton interpreter, in fp32 and fp16 (bf16 dots are wrong there).
Run: python -m pytest -q tests/test_kernel.py
"""
import concurrent.futures
import contextlib
import functools
import importlib
import io
import itertools
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from support import kernel_check
from helpers import ROOT
from operators import operator_matrix

kernel = pytest.importorskip("kernel", exc_type=ImportError)  # kernel.py says which torch it needs
mix_attention = kernel.mix_attention

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 3e-2}
# one head each: attention (0, 1), Laplacian (1, -1), corridor γ=-0.4, δ=1.3 -> (δγ, δ), a generic mix
A_HEADS = [0.0, 1.0, -0.4 * 1.3, 0.3]
B_HEADS = [1.0, -1.0, 1.3, 0.8]
SMALL = [list(cfg) for cfg in kernel.SMALL]  # the interpreter's launch configs, as the custom ops take them


@pytest.fixture(autouse=True)
def poison(monkeypatch, kernel_device):  # kernel_device (conftest.py): every test skips where it cannot run
    monkeypatch.setattr(kernel, "POISON", True)  # outputs start as NaN: unwritten elements fail the checks


def make_inputs(B, T, D, dtype=torch.float32, device=DEVICE, seed=0, layout="model"):
    """q, k, v as the model passes them: (B, H, T, D) transposed views of one (B, T, 3·H·D) tensor, and dout
    as the model's backward sends it, a transposed (B, T, H, D) tensor; layout='contiguous' gives plain
    (B, H, T, D) tensors instead. a, b: (H,) float32, as under autocast."""
    H = len(A_HEADS)
    g = torch.Generator().manual_seed(seed)
    if layout == "model":
        x = torch.randn(B, T, 3 * H * D, generator=g).to(device, dtype)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in x.split(H * D, dim=2))
        dout = torch.randn(B, T, H, D, generator=g).to(device, dtype).transpose(1, 2)
    else:
        q, k, v, dout = (torch.randn(B, H, T, D, generator=g).to(device, dtype) for _ in range(4))
    a, b = torch.tensor(A_HEADS, device=device), torch.tensor(B_HEADS, device=device)
    return (q, k, v, a, b), dout


def reference(q, k, v, a, b):
    return operator_matrix(q, k, a, b) @ v


def rel_err(x, ref):
    """max |x - ref| relative to max |ref|; an all-zero reference (dq, dk at T=1: a softmax over one score has
    no gradient) is compared with absolute tolerance via the floor on the denominator."""
    assert torch.isfinite(x).all(), "non-finite values (unwritten output?)"
    return ((x.detach().cpu().double() - ref).abs().max() / ref.abs().max().clamp_min(1e-3)).item()


def run_and_compare(inputs, dout, tol, fn=mix_attention):
    leaves = [x.detach().requires_grad_() for x in inputs]  # detach keeps the strides of the model's views
    out = fn(*leaves)
    ref_leaves = [x.detach().cpu().double().requires_grad_() for x in inputs]
    ref = reference(*ref_leaves)
    assert out.shape == ref.shape and out.dtype == inputs[0].dtype
    assert rel_err(out, ref) <= tol, f"out: {rel_err(out, ref):.2e}"
    grads = torch.autograd.grad(out, leaves, dout)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.cpu().double())
    for name, g, r in zip("qkvab", grads, ref_grads):
        assert g.shape == r.shape and g.dtype == leaves["qkvab".index(name)].dtype
        assert rel_err(g, r) <= tol, f"d{name}: {rel_err(g, r):.2e}"


SHAPES = [(1, 32), (17, 32), (64, 32), (100, 32), (128, 32), (100, 16), (100, 64), (17, 128)]
CASES = ([(torch.float32, T, D) for T, D in SHAPES]
         + [(torch.float16, T, D) for T, D in [(1, 32), (100, 32), (77, 64)]])
if CUDA:  # the real kernels: bf16 too, and longer sequences that go through many tiles
    CASES += [(dt, T, D) for dt in (torch.float32, torch.float16, torch.bfloat16)
              for T, D in [(1000, 64), (257, 128)]]
    CASES += [(torch.bfloat16, T, D) for T, D in SHAPES]


@pytest.mark.parametrize("dtype,T,D", CASES, ids=lambda x: str(x).replace("torch.", ""))
def test_matches_float64_reference(dtype, T, D):
    inputs, dout = make_inputs(2, T, D, dtype, seed=T * 1000 + D)
    run_and_compare(inputs, dout, TOL[dtype])


def test_any_strides():
    """q, k, v with different strides and a contiguous dout: the op copies what the kernels cannot take."""
    (q, _, v, a, b), dout = make_inputs(2, 37, 32, layout="contiguous", seed=5)
    (_, k, _, _, _), _ = make_inputs(2, 37, 32, seed=6)
    run_and_compare((q, k, v.transpose(0, 1).contiguous().transpose(0, 1), a, b), dout, TOL[torch.float32])
    # q and k share the model's strides, v has its own: the kernels' one set of strides is not v's
    (q, k, _, _, _), _ = make_inputs(2, 37, 32, seed=7)
    run_and_compare((q, k, v, a, b), dout, TOL[torch.float32])
    (q, k, v, a, b), dout = make_inputs(2, 37, 32, torch.float16, seed=8)
    run_and_compare((q, k, v.contiguous(), a, b), dout, TOL[torch.float16])
    # one strides, last 2
    every_other = (torch.randn(2, 4, 37, 64, device=DEVICE)[..., ::2] for _ in range(3))
    run_and_compare((*every_other, a, b), dout, TOL[torch.float32])


def _launch_configs():
    """(dtype, D, forward, backward): on a GPU the configs it gets; in the interpreter every table entry."""
    if CUDA:
        for dtype, D in itertools.product((torch.bfloat16, torch.float16, torch.float32), (64, 128)):
            yield (dtype, D, *kernel.launch_configs(torch.device("cuda"), dtype, D))
    else:  # in fp32: the interpreter's bf16 dots are wrong
        entries = dict.fromkeys((small_d, pair) for (_, small_d), pair in kernel.LAUNCH_CONFIGS.items())
        yield from ((torch.float32, 64 if small_d else 128, *pair) for small_d, pair in entries)


@pytest.mark.parametrize("dtype,D,fwd,bwd", list(_launch_configs()), ids=str)
def test_every_launch_config(dtype, D, fwd, bwd):
    """The tile shapes of the GPU configs, also in the interpreter: T = 161 crosses every tile boundary."""
    inputs, dout = make_inputs(1, 161, D, dtype, seed=D)
    run_and_compare(inputs, dout, TOL[dtype], fn=functools.partial(mix_attention, configs=(fwd, bwd)))


def test_pure_attention_and_laplacian_heads():
    # sanity of the two endpoints: b=1,a=0 is plain causal attention; a Laplacian head's first position is 0
    (q, k, v, a, b), _ = make_inputs(1, 33, 16, seed=3)
    out = mix_attention(q, k, v, a, b)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out[:, 0], sdpa[:, 0], atol=1e-5, rtol=1e-5)
    assert out[:, 1, 0].abs().max().item() < 1e-5


def test_torch_compile():
    """torch.compile traces around the custom ops (aot_eager: no Inductor codegen, so it also runs on a CPU);
    the compiled function is checked against the float64 reference, not against the kernel itself."""
    inputs, dout = make_inputs(1, 40, 32, seed=11)

    def f(q, k, v, a, b):
        return 2.0 * mix_attention(q, k, v, a, b) + 1.0

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    run_and_compare(inputs, 2.0 * dout, TOL[torch.float32], fn=lambda *x: (compiled(*x) - 1.0) / 2.0)


def test_custom_ops_pass_opcheck():
    """torch.library.opcheck: schema, autograd registration, and fake ops whose shapes and strides are the
    real ops' (torch.compile plans memory with the fakes; aot_eager alone would not notice a wrong stride)."""
    (q, k, v, a, b), dout = make_inputs(1, 9, 16, seed=2)
    torch.library.opcheck(kernel._mix_fwd, (q, k, v, a, b, *SMALL))
    _, pv, lse = kernel._mix_fwd(q, k, v, a, b, *SMALL)
    torch.library.opcheck(kernel._mix_bwd, (dout, q, k, v, a, b, pv, lse, SMALL[1]))


def _bad_inputs():
    (q, k, v, a, b), _ = make_inputs(1, 8, 16, device="cpu")
    H = q.shape[1]
    return [
        ("4-D", (q[0], k[0], v[0], a, b)),
        ("same shape", (q, k[:, :, :4], v, a, b)),
        ("head dim", (q[..., :8], k[..., :8], v[..., :8], a, b)),
        ("head dim", (torch.randn(1, H, 8, 48), torch.randn(1, H, 8, 48), torch.randn(1, H, 8, 48), a, b)),
        ("a must be 1-D", (q, k, v, a.view(1, H), b)),
        ("b must be 1-D", (q, k, v, a, b[:2])),
        ("floating-point", (q, k, v, a.long(), b)),
        ("dtype", (q, k.half(), v, a, b)),
        ("dtype", (q.double(), k.double(), v.double(), a, b)),
        ("one device", (q, k, v, a.to("meta"), b)),
    ]


@pytest.mark.parametrize("i", range(len(_bad_inputs())))
def test_bad_inputs_raise_value_error(i):
    match, args = _bad_inputs()[i]
    with pytest.raises(ValueError, match=match):
        mix_attention(*args)

# -----------------------------------------------------------------------------
# kernel_check.py's float64 check: accuracy() and check_kernel(). Planted kernels, built on the
# float64-accurate SDPA reference so that they run fast on a CPU, each carry a bug the check must catch.

CPU = torch.device("cpu")


def exact(q, k, v, a, b):  # a kernel with no bug
    return kernel_check.reference(q, k, v, a, b)


def one_percent_off(q, k, v, a, b):
    return 1.01 * kernel_check.reference(q, k, v, a, b)


def dv_without_identity_term(q, k, v, a, b):  # out is right; dv misses a·dout
    pv = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return a[:, None, None] * v.detach() + b[:, None, None] * pv


def b_sign_flipped(q, k, v, a, b):  # a·v - b·P·v
    return kernel_check.reference(q, k, v, a, -b)


def nan_output(q, k, v, a, b):
    return kernel_check.reference(q, k, v, a, b) * float("nan")


def racy():
    """Right on its first run; its second run is 1.5e-5 off (as a race between programs would be): within
    fp32's tolerance against float64, beyond what two runs of one kernel may differ by."""
    calls = []

    def fn(q, k, v, a, b):
        calls.append(1)
        return (1.0 + 1.5e-5 * (len(calls) > 1)) * kernel_check.reference(q, k, v, a, b)
    return fn


def off_by(out_err, grad_err):
    """A kernel exact but for a relative error out_err in its output and grad_err in every gradient: float64
    SDPA times (1 + out_err) forward and (1 + grad_err) backward, rounded to the inputs' dtype."""
    def fn(q, k, v, a, b):
        ref = kernel_check.reference(q.double(), k.double(), v.double(), a.double(), b.double())
        return ((1 + out_err) * ref.detach() + (1 + grad_err) * (ref - ref.detach())).to(q.dtype)
    return fn


def wrong_in_a_ragged_last_tile(q, k, v, a, b):
    """Right but for the rows of a last, partly filled tile (1% off there), in every interpreter config."""
    tile = max(max(cfg[:2]) for cfg in kernel.SMALL)  # every tile of the interpreter's configs divides it
    out = kernel_check.reference(q, k, v, a, b)
    T = q.shape[2]
    return torch.cat([out[:, :, :T // tile * tile], 1.01 * out[:, :, T // tile * tile:]], 2)


def caught(fn, dtype, D=16, T=77):  # what the float64 check finds wrong in fn: "out, dq, ..."
    bad = kernel_check.failures(kernel_check.accuracy(fn, CPU, dtype, D, T))
    return ", ".join(b.split(" error ")[0] for b in bad)


@pytest.mark.parametrize("planted, names", [
    (one_percent_off, "out, dq, dk, dv, da, db"),  # the error is 1.0e-02 in each
    (dv_without_identity_term, "dv"),
    (nan_output, "out, out run twice, dq, dq run twice, dk, dk run twice, dv, dv run twice, da, "
                 "da run twice, db, db run twice"),
    (racy(), "out run twice"),
])
def test_accuracy_refuses_planted_kernels(planted, names):
    assert caught(planted, torch.float32, 16, T=70) == names
    assert caught(exact, torch.float32, 16, T=70) == ""


# The tolerances (out, gradients) of the float64 check, as the spec: set from a GPU-like arithmetic (see
# test_a_correct_kernel_passes_with_a_3x_margin_under_gpu_like_arithmetic; the figures: docs/benchmarks.md).
PINNED = {torch.float32: (2e-5, 4e-5), torch.float16: (2e-3, 5e-3), torch.bfloat16: (1.2e-2, 2.5e-2)}


@pytest.mark.parametrize("dtype", PINNED, ids=str)
def test_each_dtypes_tolerances_are_pinned_from_both_sides(dtype):
    """For out and for the gradients: an error one eps of the dtype above the tolerance fails the check (the
    planted kernel's rounding to dtype moves its error by at most eps/2), a third of the tolerance passes."""
    out_tol, grad_tol = PINNED[dtype]
    eps = torch.finfo(dtype).eps
    assert caught(off_by(out_tol + eps, 0.0), dtype) == "out"
    assert caught(off_by(0.0, grad_tol + eps), dtype) == "dq, dk, dv, da, db"
    assert caught(off_by(out_tol / 3, grad_tol / 3), dtype) == ""


def test_check_kernel_passes_the_kernel():
    """The real kernel (in the interpreter on a CPU) passes, in one line, also when the caller is in inference
    mode under autocast; the device may be a torch.device, the dtype its name."""
    with torch.inference_mode(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        line = kernel_check.check_kernel(torch.device(DEVICE), "float32", 16)
    assert re.fullmatch(r"kernel check: the fused Triton kernel matches float64 on (cpu|cuda:\d+), float32, "
                        r"head size 16 \(out error \S+ ≤ 2\.0e-05, worst gradient error \S+ ≤ 4\.0e-05\)",
                        line), line


def test_check_kernels_line_gives_the_errors_of_out_and_of_the_gradients(monkeypatch):
    """The line for the log gives out's error and the worst gradient's, each beside its tolerance."""
    monkeypatch.setattr(kernel, "mix_attention", off_by(5e-6, 1.2e-5))
    line = kernel_check.check_kernel("cpu", torch.float32, 64)
    figures = re.fullmatch(r"kernel check: the fused Triton kernel matches float64 on cpu, float32, head "
                           r"size 64 \(out error (\S+) ≤ 2\.0e-05, worst gradient error (\S+) ≤ 4\.0e-05\)",
                           line)
    assert figures and [float(x) for x in figures.groups()] == pytest.approx([5e-6, 1.2e-5], rel=0.05), line


def check_kernel_refuses(*args, module=kernel_check):  # its message: one line ending "; use impl=sdpa"
    with pytest.raises(ValueError) as e:
        module.check_kernel(*args)
    message = str(e.value)
    assert "\n" not in message and message.endswith("; use impl=sdpa") and message.count("impl=sdpa") == 1
    return message


def test_check_kernel_refuses_a_planted_bug(monkeypatch):
    """A 1% error in the forward's output, planted in kernel.mix_attention (which the model calls too)."""
    real = kernel.mix_attention
    monkeypatch.setattr(kernel, "mix_attention", lambda *args, **kw: 1.01 * real(*args, **kw))
    message = check_kernel_refuses(DEVICE, torch.float32, 16)
    assert re.fullmatch(r"kernel check: the fused Triton kernel failed on (cpu|cuda:\d+), float32, head size "
                        r"16: out error 1\.0e-02 > 2\.0e-05; use impl=sdpa", message), message


def test_check_kernel_and_the_gate_check_a_ragged_last_tile(monkeypatch, capsys):
    """A kernel wrong only in a last tile that T does not fill is refused by both checks."""
    if CUDA:
        pytest.skip("the interpreter's configs")
    monkeypatch.setattr(kernel, "mix_attention", wrong_in_a_ragged_last_tile)
    assert "out error 1.0e-02 > 2.0e-05" in check_kernel_refuses("cpu", torch.float32, 16)
    assert kernel_check.main(GATE_CPU_PARTS, fn=wrong_in_a_ragged_last_tile) == 1
    assert "| FAIL: out error 1.0e-02" in capsys.readouterr().out


def test_a_config_that_fails_to_launch_is_a_fail_row_of_the_gate(monkeypatch, capsys):
    """Tiles of 24 rows (not a power of 2: tl.arange refuses them) fail every row, not with a traceback."""
    monkeypatch.setattr(kernel, "launch_configs", lambda device, dtype, D: ((24, 16, 4, 1), (16, 24, 4, 1)))
    accuracy = kernel_check.accuracy
    monkeypatch.setattr(kernel_check, "accuracy", lambda fn, device, dtype, D: accuracy(fn, device, dtype, D,
                                                                                      T=40))  # quicker
    assert kernel_check.main(GATE_CPU_PARTS) == 1
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| float", "| bfloat"))]
    assert len(rows) >= 4 and all("| FAIL: " in row for row in rows), rows


def test_check_kernel_refuses_bf16_on_a_cpu_and_says_why():
    """Triton's interpreter computes bf16 dots wrongly (errors ~1e10): on a CPU, dtype=bfloat16 is refused
    with that reason, not with the huge error it would show."""
    assert check_kernel_refuses("cpu", "bfloat16", 16) == (
        "kernel check: the fused Triton kernel failed on cpu, bfloat16, head size 16: ValueError: on a CPU, "
        "Triton's interpreter computes bf16 dots wrongly (float32 is right); use impl=sdpa")


def test_check_kernel_refuses_where_the_kernel_cannot_run(monkeypatch):
    """A head size the kernel is not built for, a CPU without the interpreter, a GPU older than sm_80: one
    line each, naming the reason."""
    message = check_kernel_refuses(DEVICE, "float32", 48)
    assert message.endswith("head size 48: ValueError: mix_attention: head dim D must be one of (16, 32, 64, "
                            "128), got 48; use impl=sdpa"), message
    interpret = kernel.INTERPRET
    monkeypatch.setattr(kernel, "INTERPRET", False)
    assert "tensors must be on cuda" in check_kernel_refuses("cpu", torch.float32, 16)
    monkeypatch.setattr(kernel, "INTERPRET", interpret)

    def turing(device, dtype, D):  # what launch_configs says on a T4 (test_launch_configs_per_gpu checks it)
        raise ValueError("mix_attention: the fused kernel needs an sm_80 or newer GPU, this is sm_75; "
                         "use impl=sdpa")
    monkeypatch.setattr(kernel, "launch_configs", turing)
    assert check_kernel_refuses(DEVICE, torch.float16, 64).endswith(
        "float16, head size 64: ValueError: mix_attention: the fused kernel needs an sm_80 or newer GPU, "
        "this is sm_75; use impl=sdpa")


@pytest.mark.parametrize("cause", [
    "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously "
    "reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider "
    "passing CUDA_LAUNCH_BLOCKING=1",
    "at 42:8:\n    acc = tl.dot(p, v, acc)\n          ^\nincompatible types in dot",  # a Triton compile error
])
def test_check_kernels_line_names_the_first_line_of_an_error_of_several(monkeypatch, cause):
    """The error under a refusal may span several lines: the refusal stays one line, naming the error's type
    and its first line."""
    def failing(*args, **kwargs):
        raise RuntimeError(cause)
    monkeypatch.setattr(kernel, "mix_attention", failing)
    first = cause.splitlines()[0]
    assert check_kernel_refuses(DEVICE, torch.float32, 16).endswith(
        f"float32, head size 16: RuntimeError: {first.rstrip('.')}; use impl=sdpa")

def test_kernel_check_loads_no_triton():
    """Importing kernel_check loads no triton: train.py pays nothing for it, and the gate can still choose the
    interpreter (triton reads TRITON_INTERPRET when it loads)."""
    program = "import sys, support.kernel_check; print('triton' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert run.stdout == "False\n", run.stderr


def test_check_kernel_without_triton(monkeypatch):
    """kernel_check.py loads where triton is not installed (train.py imports it on every OS); check_kernel
    then refuses in one line."""
    import support
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.delitem(sys.modules, "kernel")  # kernel.py must be imported afresh, and fail
    monkeypatch.delitem(sys.modules, "support.kernel_check")
    monkeypatch.setattr(support, "kernel_check", kernel_check)  # put back after the fresh import below
    fresh = importlib.import_module("support.kernel_check")
    assert fresh is not kernel_check
    message = check_kernel_refuses("cpu", "float32", 16, module=fresh)
    assert message == ("kernel check: the fused Triton kernel failed on cpu, float32, head size 16: "
                       "ModuleNotFoundError: import of triton halted; None in sys.modules; use impl=sdpa")


# -----------------------------------------------------------------------------
# The tolerances against a GPU's arithmetic, in the interpreter. Its tl.dot is numpy's matmul, which sums more
# accurately than a GPU, and it truncates fp32 to bf16. The gpu_like fixture makes both a GPU's: each dot a
# sequential chain of fused multiply-adds in fp32 over k (Triton's IEEE fp32 dot on NVIDIA GPUs; bf16 inputs
# read right, which the interpreter's own dot misreads), and fp32 -> bf16 rounded to nearest even.


def _float64(x):  # an interpreter tensor's values; bf16 is stored as its 16 bits, the top half of an fp32's
    if x.data.dtype == np.uint16:
        return (x.data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.data.astype(np.float64)


@pytest.fixture
def gpu_like(monkeypatch):
    """The interpreter's tl.dot and its fp32 -> bf16 casts replaced by a GPU's, for one test."""
    import triton.language as tl
    from triton.runtime import interpreter
    Builder, Handle = interpreter.InterpreterBuilder, interpreter.TensorHandle
    cast = Builder.cast_impl

    def dot(self, a, b, acc, input_precision, max_num_imprecise_acc):
        a, b = _float64(a), _float64(b)  # (M, K), (K, N)
        out = acc.data.astype(np.float32)  # (M, N)
        for k in range(a.shape[1]):  # a fused multiply-add: the product exact (float64), the sum rounded once
            out = (out + np.outer(a[:, k], b[k])).astype(np.float32)
        return Handle(out, acc.dtype.scalar)

    def round_to_bf16(self, x, dtype):  # to nearest even: add just under half a kept unit, plus the last bit
        if not (x.dtype.scalar == tl.float32 and dtype.scalar == tl.bfloat16):
            return cast(self, x, dtype)
        bits = x.data.astype(np.float32).view(np.uint32)
        return Handle(((bits + 0x7FFF + (bits >> 16 & 1)) >> 16).astype(np.uint16), tl.bfloat16)
    monkeypatch.setattr(Builder, "create_dot", dot)
    monkeypatch.setattr(Builder, "cast_impl", round_to_bf16)


@pytest.mark.slow
@pytest.mark.skipif(CUDA, reason="emulates a GPU's arithmetic in the CPU's Triton interpreter")
@pytest.mark.parametrize("dtype, D", list(itertools.product((torch.float32, torch.bfloat16), (64, 128))),
                         ids=str)
def test_a_correct_kernel_passes_with_a_3x_margin_under_gpu_like_arithmetic(gpu_like, dtype, D):
    """The real kernel under gpu_like, in a GPU's launch configs (fp32's; bf16: the ~99 KB GPUs'), at the
    GPU check's T = 301: every error at most a third of its tolerance. In fp32 a 1e-3 error (TF32's) fails."""
    configs = kernel.LAUNCH_CONFIGS["fp32" if dtype == torch.float32 else "sm_86", D <= 64]
    rows = kernel_check.accuracy(functools.partial(mix_attention, configs=configs), CPU, dtype, D, T=301)
    print(", ".join(f"{name} {err:.2e}" for name, err, _ in rows[::2]))  # pytest -s shows the errors
    assert max(err / tol for _, err, tol in rows) <= 1 / 3, rows
    if dtype == torch.float32:
        assert caught(off_by(1e-3, 1e-3), dtype, D) == "out, dq, dk, dv, da, db"

# -----------------------------------------------------------------------------
# Compiling for real GPUs (no GPU needed): every kernel in every launch config of the table, for its GPUs.

# the GPUs compiled for, and the shared memory bytes a block may use there: 163 KB, 99 KB or 227 KB
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 120: 101376}
FP32_ARGS = {"LSE", "Delta", "DQ", "Sums"}  # pointer arguments that are fp32 whatever the input dtype


def _ptxas():
    import triton
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    paths = [os.path.join(bin_dir, name) for name in ("ptxas", "ptxas-blackwell")]
    return next((p for p in paths if os.path.isfile(p)), None)


def _compile(name, constexprs, options, dtype, cc):
    """Compile one kernel for sm_<cc> exactly as a launch would (pointers and strides 16-byte aligned; triton
    runs its own ptxas with its own flags) and return (shared memory bytes, registers, spill bytes), read from
    the ptxas log that triton prints. Runs in a worker with TRITON_DUMP_PTXAS_LOG=1 and an empty cache."""
    import triton
    from triton.backends.compiler import GPUTarget
    fn = getattr(kernel, name)
    sig = {}
    for arg in fn.arg_names:
        if arg in constexprs:
            sig[arg] = "constexpr"
        elif arg in ("T", "H") or arg.startswith("stride"):
            sig[arg] = "i32"
        elif arg.endswith("scale"):
            sig[arg] = "fp32"
        else:
            sig[arg] = "*fp32" if arg in FP32_ARGS else "*" + dtype
    aligned = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(fn.arg_names)
               if sig[arg].startswith("*") or arg.startswith("stride")}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=aligned)
    with contextlib.redirect_stdout(io.StringIO()) as log:
        compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
    regs = int(re.search(r"Used (\d+) registers", log.getvalue()).group(1))
    spills = sum(map(int, re.findall(r"(\d+) bytes spill (?:stores|loads)", log.getvalue())))
    return compiled.metadata.shared, regs, spills


def compile_jobs(monkeypatch):
    """(kernel, constexprs, options, dtype, cc) for every kernel in the launch configs that each GPU of
    SHARED_LIMIT gets from launch_configs (its capability forced), in bf16, fp16 and fp32 (IEEE dots)."""
    for cc, dtype, D in itertools.product(SHARED_LIMIT, ("bf16", "fp16", "fp32"), (64, 128)):
        gpu = types.SimpleNamespace(major=cc // 10, minor=cc % 10)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: gpu)
        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        configs = kernel.launch_configs(torch.device("cuda", 0), torch_dtype, D)  # (forward, backward)
        for name, (bm, bn, warps, stages) in zip(("_fwd_kernel", "_bwd_kernel"), configs):
            consts = dict(D=D, BLOCK_M=bm, BLOCK_N=bn, PREC="ieee" if dtype == "fp32" else "tf32")
            yield name, consts, dict(num_warps=warps, num_stages=stages), dtype, cc
        yield "_bwd_pre_kernel", dict(D=D, BLOCK=kernel.PRE_BLOCK), {}, dtype, cc


@pytest.mark.slow
def test_every_launch_config_compiles_for_its_gpus_without_spills(monkeypatch, tmp_path):
    """What each GPU gets from launch_configs (sm_80, 86, 89, 90, 100, 120) compiles for it without register
    spills, within its shared memory; every row of the table is among them (2 to 5 minutes on 2 cores)."""
    if _ptxas() is None:
        pytest.skip("this triton wheel ships no ptxas (triton/backends/nvidia/bin)")
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # workers import kernel.py with real @triton.jit kernels
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when unset; 1 is what launches use
    monkeypatch.setenv("TRITON_DUMP_PTXAS_LOG", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a cached kernel would skip ptxas and its log
    jobs = list(compile_jobs(monkeypatch))
    compiled = {(name, c["D"] <= 64, (c["BLOCK_M"], c["BLOCK_N"], o["num_warps"], o["num_stages"]))
                for name, c, o, _, _ in jobs if name != "_bwd_pre_kernel"}
    for (_, small_d), (fwd, bwd) in kernel.LAUNCH_CONFIGS.items():  # every row of the table, for some GPU
        assert {("_fwd_kernel", small_d, fwd), ("_bwd_kernel", small_d, bwd)} <= compiled
    workers = max(1, min(4, os.cpu_count() or 1))
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=spawn) as pool:
        results = list(pool.map(_compile, *zip(*jobs)))
    failures = []
    for (name, consts, options, dtype, cc), (shared, regs, spills) in zip(jobs, results):
        label = f"sm_{cc} {dtype} {name} {consts} {options}"
        print(f"{label}: {regs} registers, {spills} B spilled, {shared} B shared")
        if spills or shared > SHARED_LIMIT[cc]:
            failures.append(f"{label}: {spills} B spilled, {shared} B shared")
    assert not failures, "\n".join(failures)


# -----------------------------------------------------------------------------
# More of the contract: exact messages, where the kernel refuses to run, output layout, launch settings


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_inputs_accepted_in_every_supported_dtype(dtype):
    """fp16, bf16 and fp32 q, k, v pass the input checks (a, b may stay fp32, as under autocast)."""
    (q, k, v, a, b), _ = make_inputs(1, 8, 16, dtype, device="cpu")
    kernel._check_inputs(q, k, v, a, b)  # raises ValueError otherwise


def test_bad_input_messages_name_the_problem():
    (q, k, v, a, b), _ = make_inputs(1, 8, 16, device="cpu")
    cases = [((q[..., :8], k[..., :8], v[..., :8], a, b),
              "head dim D must be one of (16, 32, 64, 128), got 8"),
             ((q, k, v, a[:2], b), "a must be 1-D of length H=4 and floating-point, got (2,) torch.float32"),
             ((q, k.half(), v, a, b), "q, k, v must share one dtype among float16, bfloat16, float32, "
                                      "got torch.float32, torch.float16, torch.float32"),
             ((q, k, v[:, :, :5], a, b), "q, k, v must have the same shape, got (1, 4, 8, 16), "
                                         "(1, 4, 8, 16), (1, 4, 5, 16)")]
    for args, message in cases:
        with pytest.raises(ValueError) as e:
            mix_attention(*args)
        assert str(e.value) == f"mix_attention: {message}."


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    """Without TRITON_INTERPRET=1 the kernel cannot run on a CPU: a clear error says how to make it."""
    monkeypatch.setattr(kernel, "INTERPRET", False)
    (q, k, v, a, b), _ = make_inputs(1, 8, 16, device="cpu")
    with pytest.raises(ValueError) as e:
        mix_attention(q, k, v, a, b)
    assert str(e.value) == ("mix_attention: tensors must be on cuda (cpu needs TRITON_INTERPRET=1 set before "
                            "triton is imported), got cpu.")


def test_outputs_and_gradients_are_views_of_model_layout_memory():
    """out, dq, dk, dv are (B, H, T, D) views of (B, T, H, D) memory, where the model re-assembles the heads
    without a copy."""
    (q, k, v, a, b), dout = make_inputs(2, 20, 16, seed=4)
    leaves = [x.detach().requires_grad_() for x in (q, k, v, a, b)]
    out = mix_attention(*leaves)
    dq, dk, dv, _, _ = torch.autograd.grad(out, leaves, dout)
    for x in (out, dq, dk, dv):
        assert x.shape == (2, 4, 20, 16) and x.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("cc, generation", [((7, 5), None), ((8, 0), "sm_80"), ((8, 6), "sm_86"),
                                           ((8, 9), "sm_86"), ((9, 0), "sm_90"), ((10, 0), "sm_100"),
                                           ((12, 0), "sm_86")])
def test_launch_configs_per_gpu(monkeypatch, cc, generation):
    """One table entry per GPU generation, dtype and head size: Hopper's, the B200's, the A100's, and the
    ~99 KB ones for every other GPU from sm_80 on; fp32's on every GPU. Older GPUs are refused in one line."""
    gpu = types.SimpleNamespace(major=cc[0], minor=cc[1])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: gpu)
    cuda = torch.device("cuda", 0)
    if generation is None:
        with pytest.raises(ValueError) as e:
            kernel.launch_configs(cuda, torch.bfloat16, 64)
        assert str(e.value) == ("mix_attention: the fused kernel needs an sm_80 or newer GPU, this is sm_75; "
                                "use impl=sdpa")
        return
    for D in (16, 64, 128):
        for dtype in (torch.bfloat16, torch.float16):
            assert kernel.launch_configs(cuda, dtype, D) == kernel.LAUNCH_CONFIGS[generation, D <= 64]
        assert kernel.launch_configs(cuda, torch.float32, D) == kernel.LAUNCH_CONFIGS["fp32", D <= 64]
    assert kernel.launch_configs(CPU, torch.float32, 64) == kernel.SMALL  # the interpreter's


def test_rocm_is_refused_in_one_line(monkeypatch):
    """The kernel is built and checked for NVIDIA GPUs only. A ROCm GPU is refused in one line naming ROCm,
    and never gets a table row by its capability: an MI250 (gfx90a) reports Hopper's (9, 0)."""
    mi250 = types.SimpleNamespace(major=9, minor=0, gcnArchName="gfx90a")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: mi250)
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        with pytest.raises(ValueError) as e:
            kernel.launch_configs(torch.device("cuda", 0), dtype, 64)
        assert str(e.value) == ("mix_attention: the fused kernel is built for NVIDIA GPUs, not ROCm; "
                                "use impl=sdpa")


def test_fp32_dots_are_ieee():
    """fp32 is for checks: its dots are IEEE, never TF32 (errors ~5e-4), whatever torch's TF32 switch says.
    16-bit dots run on tensor cores (PREC means nothing to them)."""
    q = torch.zeros(1, 1, 8, 16)
    cfg = (64, 32, 4, 2)
    tf32 = torch.backends.cuda.matmul.allow_tf32  # served by __getattr__: monkeypatch cannot undo it
    try:
        for allowed in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allowed
            assert kernel._kw(cfg, q) == dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2, PREC="ieee")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert kernel._kw(cfg, q.half())["PREC"] == kernel._kw(cfg, q.bfloat16())["PREC"] == "tf32"


@pytest.mark.skipif(not CUDA, reason="TF32 exists on a GPU")
def test_fp32_passes_its_ieee_tolerance_with_tf32_allowed():
    """With TF32 allowed in torch's matmuls, the kernel's fp32 still passes check_kernel, whose tolerances
    (2e-5, 4e-5) TF32's roundoff (2^-11) would exceed many times over."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        for D in (64, 128):
            kernel_check.check_kernel("cuda", torch.float32, D)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def test_backward_checks_the_layout_of_pv_and_lse():
    """The backward reads pv as (B, T, H, D) memory and lse as (B, H, T): other layouts are copied into these,
    not misread."""
    (q, k, v, a, b), dout = make_inputs(1, 9, 16, seed=2)
    _, pv, lse = kernel._mix_fwd(q, k, v, a, b, *SMALL)
    want = kernel._mix_bwd(dout, q, k, v, a, b, pv, lse, SMALL[1])
    lse_strided = lse.transpose(1, 2).contiguous().transpose(1, 2)
    for other_pv, other_lse in ((pv.contiguous(), lse), (pv, lse_strided)):
        for x, y in zip(kernel._mix_bwd(dout, q, k, v, a, b, other_pv, other_lse, SMALL[1]), want):
            torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-6)  # dq's atomics may vary its last bits

# -----------------------------------------------------------------------------
# python -m support.kernel_check: a pass/fail gate

GATE_CPU_PARTS = ["--tests=False", "--timing=False"]  # on a GPU: only the float64 checks


def test_kernel_check_exits_nonzero_on_a_planted_kernel(capsys):
    """The gate's exit status: 1 when the kernel under test is wrong, 0 when it is right (planted kernels, so
    that this runs in seconds; `python -m support.kernel_check` on a CPU checks the real kernel in the
    interpreter)."""
    assert kernel_check.main(GATE_CPU_PARTS, fn=dv_without_identity_term) == 1
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| float", "| bfloat"))]  # a row per config
    assert len(rows) >= 4 and all("| FAIL: dv error" in row for row in rows), out  # fp32, fp16; D = 64, 128
    assert out.endswith("kernel check FAILED\n")
    assert kernel_check.main(GATE_CPU_PARTS, fn=one_percent_off) == 1  # the forward output 1% off
    assert "| FAIL: out error 1.0e-02" in capsys.readouterr().out
    assert kernel_check.main(GATE_CPU_PARTS, fn=exact) == 0
    assert capsys.readouterr().out.endswith("kernel check passed\n")
    assert kernel_check.main(["--tests=3"], fn=exact) == 2
    assert "tests=3 is not allowed" in capsys.readouterr().err


@pytest.mark.slow
def test_kernel_check_help_prints_help_and_checks_nothing():
    run = subprocess.run([sys.executable, "-m", "support.kernel_check", "--help"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("The checks of kernel.py's fused kernel")
    settings = run.stdout.split("settings and their defaults:\n")[1].splitlines()
    assert [line.split()[0] for line in settings] == ["--tests=True", "--timing=True"]
    old = subprocess.run([sys.executable, "kernel.py"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert old.returncode == 1 and "python -m support.kernel_check" in old.stderr  # never a silent pass


@pytest.mark.slow
@pytest.mark.skipif(os.name == "nt", reason="sends SIGINT, which Windows' Popen cannot")
def test_ctrl_c_in_the_kernel_gate_is_one_line():
    """Ctrl-C while the gate checks: one line, exit status 1. SIGINT goes once the gate has printed its
    table's header, just before its checks start (minutes on a CPU); the timeouts allow for a busy machine.
    The gate gets Python's default SIGINT handling, as in a shell, also where pytest started with SIGINT
    ignored (in the background), which children inherit."""
    gate = subprocess.Popen([sys.executable, "-m", "support.kernel_check", "--tests=False", "--timing=False"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    watchdog = threading.Timer(600, gate.kill)  # a gate that never prints its header fails, not hangs
    watchdog.start()
    try:
        assert any(line.startswith("| dtype |") for line in iter(gate.stdout.readline, ""))
        gate.send_signal(signal.SIGINT)
        _, err = gate.communicate(timeout=300)
    finally:
        watchdog.cancel()
        gate.kill()
    assert gate.returncode == 1 and err == "interrupted: the kernel check did not finish\n", err


@pytest.mark.slow
@pytest.mark.skipif(CUDA, reason="the gate's CPU path")
def test_the_gate_passes_the_kernel_as_a_user_runs_it_on_a_cpu():
    """python -m support.kernel_check in a plain shell on a CPU: no TRITON_INTERPRET in its environment (the
    gate sets it; conftest.py sets it for every other child), the real kernel in the interpreter, exit
    status 0 (1.5 to 3.5 minutes on 2 cores)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    gate = subprocess.run([sys.executable, "-m", "support.kernel_check", *GATE_CPU_PARTS],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=1200)
    rows = [line for line in gate.stdout.splitlines() if line.startswith("| float")]
    assert len(rows) == 4 and all(row.endswith("| pass |") for row in rows), gate.stdout + gate.stderr
    assert gate.returncode == 0 and gate.stdout.endswith("kernel check passed\n"), gate.stdout + gate.stderr


def test_sdpa_backend_is_named():
    (q, k, v, _, _), _ = make_inputs(1, 16, 16)
    assert kernel_check.sdpa_backend(q, k, v) not in ("", "unknown")


# -----------------------------------------------------------------------------
# Training steps with the fused kernel against SDPA: GPT-2 small on a GPU (in the gate), a tiny model here

def compare_gpt2(steps, batch_size=4, device="cuda", dtypes=(torch.bfloat16, torch.float16), **model_args):
    """GPT-2 small (124M; model_args change it), op=mix, from the same weights on the same batch: impl=triton
    against impl=sdpa, in bf16 and in fp16 with the gradient scaler. True if at every step the losses agree
    within 1% and the gradient norms, the whole one and each parameter's, within 5%."""
    from model import GPT, GPTConfig
    config = GPTConfig(op="mix", **model_args)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, config.vocab_size, (2, batch_size, config.block_size), generator=g).to(device)
    print(f"\n{config.n_layer} layers × {config.n_head} heads × {config.n_embd}, op=mix, "
          f"{steps} training steps "
          f"(B={batch_size}, T={config.block_size}): impl=triton against impl=sdpa")
    print("| dtype | step | loss triton | loss sdpa | grad norm triton | grad norm sdpa | worst parameter's "
          "grad norm, triton / sdpa - 1 | result |")
    print("|---" * 8 + "|")
    all_ok = True
    for dtype in dtypes:
        curves = {}
        for impl in ("triton", "sdpa"):
            torch.manual_seed(0)
            model = GPT(GPTConfig(**{**vars(config), "impl": impl})).to(device)
            opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
            scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
            curves[impl] = []
            for _ in range(steps):
                with torch.autocast(device, dtype=dtype):
                    loss = model(x, y)[1]
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                norms = torch.stack([p.grad.norm() for p in model.parameters()])  # (number of parameters,)
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
                curves[impl].append((loss.item(), norm.item(), norms.float()))
        for step, ((lt, nt, pt), (ls, ns, ps)) in enumerate(zip(curves["triton"], curves["sdpa"])):
            worst = ((pt - ps).abs() / ps.clamp_min(1e-12)).max().item()
            # a NaN anywhere fails every comparison
            ok = abs(lt - ls) <= 0.01 * abs(ls) and abs(nt - ns) <= 0.05 * abs(ns) and worst <= 0.05
            all_ok &= ok
            result = "pass" if ok else "FAIL"
            print(f"| {str(dtype)[6:]} | {step} | {lt:.4f} | {ls:.4f} | {nt:.4f} | {ns:.4f} "
                  f"| {worst:.1e} | {result} |")
    return all_ok


@pytest.mark.skipif(not CUDA, reason="GPT-2 small's training steps need a GPU")
def test_gpt2_small_trains_alike_with_the_fused_kernel(capsys):
    with capsys.disabled():  # the gate shows the table
        assert compare_gpt2(3)


def test_fused_kernel_trains_alike_on_a_tiny_model(monkeypatch):
    """compare_gpt2 on a tiny model: impl=triton and impl=sdpa train alike (fp16 with the scaler; in the
    interpreter bf16 dots are wrong), and a kernel with b's sign flipped fails it."""
    tiny = dict(n_layer=1, n_head=2, n_embd=32, block_size=24, vocab_size=64)
    assert compare_gpt2(2, batch_size=2, device=DEVICE, dtypes=(torch.float16,), **tiny)
    monkeypatch.setattr(kernel, "mix_attention", b_sign_flipped)  # the kernel the model calls
    assert not compare_gpt2(2, batch_size=2, device=DEVICE, dtypes=(torch.float16,), **tiny)
