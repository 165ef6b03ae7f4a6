"""
The checks of kernel.py's fused kernel, in two parts:

1. What impl='auto' runs at first use on a device: every candidate launch config against float64 (accuracy),
   then the passing ones timed against SDPA + epilogue (time_fwd_bwd), cached per device, dtype and shape.

    usable(q.device, q.dtype, q.shape)   # impl='auto': correct here (float64 check) and faster than SDPA?
    tune(q.device, q.dtype, q.shape)     # (the fastest passing config pair, faster than SDPA?), or None
    fused(q, k, v, a, b)                 # kernel.mix_attention with tune()'s configs

2. The pass/fail gate, `python -m support.kernel_check`; its exit status is 0 only if every part passed.
   The kernel's out and five gradients against float64 (ragged T = 301, the model's layout, a sharp head, a
   cancelling Laplacian head, run twice), for D = 64 and 128 in every launch config the device may pick:
   fp32, fp16 and bf16 on a GPU; on a CPU only that, in fp32 and fp16 in the Triton interpreter (bf16 dots
   are wrong there), 6 minutes on 2 cores. On a GPU also pytest -q tests/test_kernel.py on the real kernels
   (GPT-2-small training steps with impl=triton against impl=sdpa included), and the timing behind
   impl='auto': slower than SDPA is reported, not failed (auto then uses SDPA). About 10 minutes on one H200.

    python -m support.kernel_check --tests=False --timing=False   # only the float64 checks
"""
import functools
import itertools
import os
import subprocess
import sys
import timeit
import warnings

try:  # Ctrl-C while torch and triton load gets one line too
    import torch
    import torch.nn.functional as F

    if __name__ == "__main__" and not torch.cuda.is_available():  # the gate on a CPU: the Triton interpreter,
        os.environ.setdefault("TRITON_INTERPRET", "1")  # chosen before kernel.py defines its kernels

    import triton
    from triton.testing import do_bench

    from support.configurator import ConfigError, configure
    from kernel import HEAD_DIMS, _on, _precision, candidates, mix_attention
except KeyboardInterrupt:
    sys.exit("interrupted: the kernel check did not finish")

# -----------------------------------------------------------------------------
# 1. The checks behind impl='auto', like cudnn.benchmark: on the user's device, at first use, never inside
# CUDA-graph capture. Each takes the function under test, so tests can plant wrong ones.

# Tolerances on max|x - float64| / max|float64|, for out and for the gradients: about 5 and 8-10 unit
# roundoffs u (bf16 2^-8; fp16 and tf32 2^-11; fp32 dots run in tf32 unless TF32 is off, then pass easily).
TOLERANCES = {torch.bfloat16: (2e-2, 3e-2), torch.float16: (2e-3, 5e-3), torch.float32: (2e-3, 5e-3)}
# one head each: sharp attention (its q is scaled up), the Laplacian a = 1, b = -1 (out cancels where P is
# close to I), a corridor head δ(γI + P) with γ = -0.4, δ = 1.3, and a generic mix
CHECK_HEADS = dict(a=[0.0, 1.0, -0.4 * 1.3, 0.3], b=[1.0, -1.0, 1.3, 0.8], q_scale=[8.0, 1.0, 1.0, 1.0])


def model_inputs(B, H, T, D, dtype, device, seed=0):
    """q, k, v as the model makes them (transposed views of one (B, T, 3·H·D) tensor), a, b, and dout as the
    model's backward sends it. H = 4 gives CHECK_HEADS; other H heads ranging from attention to Laplacian."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, 3 * H * D, generator=g)
    a, b = torch.linspace(0, 1, H), torch.linspace(1, -1, H)  # attention ... Laplacian
    if H == len(CHECK_HEADS["a"]):
        a, b = torch.tensor(CHECK_HEADS["a"]), torch.tensor(CHECK_HEADS["b"])
        x[..., :H * D] *= torch.tensor(CHECK_HEADS["q_scale"]).repeat_interleave(D)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in x.to(device, dtype).split(H * D, dim=2))
    dout = torch.randn(B, T, H, D, generator=g).to(device, dtype).transpose(1, 2)
    return [t.detach().requires_grad_() for t in (q, k, v, a.to(device), b.to(device))], dout


# a different computation from the kernel's: PyTorch's SDPA plus the identity term
def reference(q, k, v, a, b):
    return a[:, None, None] * v + b[:, None, None] * F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _fwd_bwd(fn, leaves, dout):  # (out, dq, dk, dv, da, db)
    out = fn(*leaves)
    return (out, *torch.autograd.grad(out, leaves, dout))


def accuracy(fn, device, dtype, D, T=301):
    """fn's out and five gradients against float64 on this device, at a ragged T (full, diagonal and padded
    tiles), and a second run against the first (a race shows up as a difference; dq's atomics vary only its
    last bits). Returns rows (what, error, tolerance): error = max|x - ref| / max|ref|, NaN unless finite."""
    leaves, dout = model_inputs(2, len(CHECK_HEADS["a"]), T, D, dtype, device, seed=T + D)
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    want = _fwd_bwd(reference, ref_leaves, dout.double())
    first, second = _fwd_bwd(fn, leaves, dout), _fwd_bwd(fn, leaves, dout)
    rows = []
    for i, name in enumerate(("out", "dq", "dk", "dv", "da", "db")):
        tol = TOLERANCES[dtype][i > 0]
        rows.append((name, _error(first[i], want[i]), tol))
        rows.append((f"{name} run twice", _error(second[i], first[i].double()), tol / 2))
    return rows


def _error(x, ref):
    err = (x.detach().double() - ref).abs().max() / ref.abs().max().clamp_min(1e-3)
    return err.item() if torch.isfinite(x).all() else float("nan")


def failures(rows):
    return [f"{name} error {err:.1e} > {tol:.0e}" for name, err, tol in rows if not err <= tol]  # NaN fails


def time_fwd_bwd(fn, device, dtype, shape):
    """Median ms of fn's forward + backward at this shape, model layout: do_bench on a GPU, a clock on CPU."""
    B, H, T, D = shape
    leaves, dout = model_inputs(B, H, T, D, dtype, device)

    def step():
        torch.autograd.grad(fn(*leaves), leaves, dout)
    if device.type == "cuda":
        return do_bench(step, warmup=10, rep=40, return_mode="median")
    return sorted(timeit.repeat(step, number=1, repeat=3))[1] * 1000


_verified = {}  # (device, dtype, D, dot precision) -> the candidate config pairs that pass accuracy()
_tuned = {}  # (device, dtype, D, dot precision, B·H, T bucket) -> (fastest verified pair, faster than SDPA?)


def _verify(device, dtype, D, kernel):
    """The candidate config pairs whose kernel passes accuracy() here; if none does, warns, in one line."""
    passed, why = [], "no launch config"
    for pair in candidates(device, dtype, D):
        try:
            bad = failures(accuracy(functools.partial(kernel, configs=pair), device, dtype, D))
        except Exception as e:  # e.g. out of shared memory on a smaller GPU
            bad = [f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"]
        if bad:
            why = f"config {pair}: {bad[0]}"
        else:
            passed.append(pair)
    if not passed:
        warnings.warn(f"kernel_check.usable: the fused Triton kernel failed its float64 check on {device}, "
                      f"{dtype}, head size {D} ({why}); using SDPA instead.")
    return passed


def tuning_key(device, dtype, shape):  # (device, dtype, D, dot precision, B·H, T rounded up to a power of 2)
    B, H, T, D = shape
    return str(device), dtype, D, _precision(dtype), B * H, min(triton.next_power_of_2(T), 8192)


@torch.compiler.assume_constant_result  # torch.compile calls it once while tracing and keeps the answer
def tune(device, dtype, shape, kernel=mix_attention):
    """For q of this shape (B, H, T, D): (the fastest config pair that passes accuracy(), whether it beats
    SDPA + epilogue), or None where none passes. Checked once per (device, dtype, D), timed once per
    tuning_key. RuntimeError inside CUDA-graph capture: checks and timings need synchronisation."""
    device = _device(device)
    D, key = shape[-1], tuning_key(device, dtype, shape)
    if key in _tuned:
        return _tuned[key]
    if _capturing(device):
        raise RuntimeError("kernel_check.tune: cannot check or time the kernel inside CUDA-graph capture; "
                           "run the model once before capturing")
    with _on(device), torch.inference_mode(False), torch.enable_grad():  # whatever mode the caller is in
        if key[:4] not in _verified:
            _verified[key[:4]] = _verify(device, dtype, D, kernel)
        times = {pair: time_fwd_bwd(functools.partial(kernel, configs=pair), device, dtype, shape)
                 for pair in _verified[key[:4]]}
        if times:
            fastest = min(times, key=times.get)
            _tuned[key] = (fastest, times[fastest] < time_fwd_bwd(reference, device, dtype, shape))
        else:
            _tuned[key] = None
    return _tuned[key]


@torch.compiler.assume_constant_result
def usable(device, dtype, shape, kernel=mix_attention) -> bool:
    """For impl='auto': is the kernel correct and faster than SDPA + epilogue here, for q of this shape?
    (tune()) False for head sizes the kernel is not built for, and inside CUDA-graph capture before tune()."""
    device, shape = _device(device), tuple(shape)
    if shape[-1] not in HEAD_DIMS or (_capturing(device) and tuning_key(device, dtype, shape) not in _tuned):
        return False  # SDPA is right, always
    tuned = tune(device, dtype, shape, kernel)
    return tuned is not None and tuned[1]


def fused(q, k, v, a, b):
    """kernel.mix_attention with the launch configs tune() picked for q's device and shape (the interpreter's
    own on a CPU). A ValueError where no config passed the float64 check: never a wrong number."""
    if not q.is_cuda:
        return mix_attention(q, k, v, a, b)
    tuned = tune(q.device, q.dtype, tuple(q.shape))
    if tuned is None:
        raise ValueError(f"mix_attention: no launch config passed the float64 check on {q.device}, "
                         f"{q.dtype}, head size {q.shape[-1]} (see the warning above); use impl='sdpa'")
    return mix_attention(q, k, v, a, b, configs=tuned[0])


def _device(device):  # "cuda" means the current CUDA device: name its index, so that it has one tuning key
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _capturing(device):
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


# -----------------------------------------------------------------------------
# 2. The pass/fail gate: `python -m support.kernel_check`

DEFAULTS = dict(
    tests=True,  # (GPU) run pytest -q tests/test_kernel.py on the real kernels, GPT-2-small steps included
    timing=True,  # (GPU) time the kernel against SDPA + epilogue, as impl='auto' does
)
TIMED_SHAPES = [(8, 12, 1024, 64), (8, 12, 1024, 128), (2, 12, 4096, 64), (2, 12, 4096, 128)]  # (B, H, T, D)


def check_accuracy(fn, device):
    """accuracy() for every dtype, head size and candidate config pair: a row each. True if all pass."""
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device.type == "cuda" else [])
    print(f"float64 check on {device} (kernel_check.accuracy; error = max|x - ref| / max|ref|, "
          "'twice' = the worst difference between two runs relative to its tolerance)")
    print("| dtype | D | configs (fwd, bwd) | out | dq | dk | dv | da | db | twice | result |")
    print("|---" * 11 + "|")
    all_ok = True
    for dtype, D in itertools.product(dtypes, (64, 128)):
        for pair in candidates(device, dtype, D):
            try:
                rows = accuracy(functools.partial(fn, configs=pair), device, dtype, D)
                bad = failures(rows)
                twice = max(err / tol for _, err, tol in rows[1::2])
                cells = [f"{err:.1e}" for _, err, _ in rows[::2]] + [f"{twice:.2f}"]
            except Exception as e:  # a config that fails to compile or launch fails the check
                bad, cells = [f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"], ["-"] * 7
            all_ok &= not bad
            result = f"FAIL: {bad[0]}" if bad else "pass"
            print(f"| {str(dtype)[6:]} | {D} | {pair} | " + " | ".join(cells) + f" | {result} |")
    return all_ok


def sdpa_backend(q, k, v):
    """The SDPA backend (flash, cudnn, efficient, math, ...) that ran, from the aten op the profiler saw."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ops = sorted({e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product_")})
    return ", ".join(op.removeprefix("aten::_scaled_dot_product_") for op in ops) or "unknown"


def timing():
    """What impl='auto' decides at each timed shape in bf16, after clearing the tuning cache."""
    _tuned.clear()
    device, dtype = torch.device("cuda"), torch.bfloat16
    (q, k, v, _, _), _ = model_inputs(*TIMED_SHAPES[0], dtype, device)
    print(f"\ntiming, bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}: fused forward+backward against SDPA + epilogue (median ms), "
          f"SDPA backend: {sdpa_backend(q, k, v)}")
    print("| B, H, T, D | config (fwd, bwd) | fused ms | SDPA+epilogue ms | ratio | impl='auto' uses |")
    print("|---" * 6 + "|")
    for shape in TIMED_SHAPES:
        tuned = tune(device, dtype, shape)
        if tuned is None:
            print(f"| {shape} | none passed the float64 check | | | | sdpa |")
            continue
        fused = time_fwd_bwd(functools.partial(mix_attention, configs=tuned[0]), device, dtype, shape)
        sdpa = time_fwd_bwd(reference, device, dtype, shape)
        print(f"| {shape} | {tuned[0]} | {fused:.3f} | {sdpa:.3f} | {fused / sdpa:.2f} | "
              f"{'triton' if tuned[1] else 'sdpa'} |")


def main(argv, fn=mix_attention):
    """Every check for this machine; returns the exit status. fn: the kernel under test (tests plant bugs)."""
    try:
        cfg = configure(DEFAULTS, argv, files=False, help_from=[("", sys.modules[__name__])])[0]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    passed = [check_accuracy(fn, torch.device("cuda" if cuda else "cpu"))]
    if cuda and cfg.tests:
        print("\npytest -q tests/test_kernel.py on the real kernels:", flush=True)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        pytest = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_kernel.py"], cwd=root)
        passed.append(pytest.returncode == 0)
    if cuda and cfg.timing:
        timing()
    if not cuda:
        print("no GPU here: only the float64 checks ran, in the Triton interpreter")
    print("kernel check " + ("passed" if all(passed) else "FAILED"))
    return 0 if all(passed) else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit("interrupted: the kernel check did not finish")
