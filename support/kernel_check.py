"""
The checks of kernel.py's fused kernel: its out and five gradients against float64.

    check_kernel(device, dtype, head_size)   # one line for the log, or a one-line ValueError

train.py calls check_kernel once at set-up when a run asks for impl=triton: kernel.mix_attention as
the model calls it (the launch configs of kernel.py's table for this device), on the run's device,
dtype and head size; in the Triton interpreter on a CPU, at a shorter T, in seconds. This file
imports triton only inside its functions: it loads where triton is not installed.

The pass/fail gate, `python -m support.kernel_check`, exits 0 only if every part passed. The
same float64 check (ragged T = 301, the model's layout, a sharp head, a cancelling Laplacian
head, run twice) for D = 64 and 128 in every launch config this device may use: fp32, fp16 and
bf16 on a GPU; on a CPU only that, in fp32 and fp16 in the Triton interpreter (bf16 dots are
wrong there), about 1.5 minutes on 2 cores. On a GPU also pytest -q tests/test_kernel.py on the
real kernels (GPT-2-small training steps with impl=triton against impl=sdpa included), and the
kernel's time against SDPA + epilogue.

    python -m support.kernel_check --tests=False --timing=False   # only the float64 checks
"""
import itertools
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from support.configurator import ConfigError, configure

# -----------------------------------------------------------------------------
# The float64 check. It takes the function under test, so that tests can plant wrong ones.

# Tolerances on max|x - float64| / max|float64|, for out and for the gradients: 3.6 to 6× the
# largest errors of a correct kernel at T = 301, D = 16 to 128, in the interpreter with a GPU's
# arithmetic (each dot a sequential fp32 FMA chain, bf16 rounded to nearest: test_kernel.py's
# gpu_like). bf16: out 3.3e-3, the gradients 6.9e-3; fp16: 3.8e-4, 1.2e-3; fp32: 3.3e-6, 7.9e-6, and
# 10× below TF32's errors (~5e-4).
TOLERANCES = {torch.bfloat16: (1.2e-2, 2.5e-2), torch.float16: (2e-3, 5e-3), torch.float32: (2e-5, 4e-5)}
# (a, b, the scale of q) of one head each: sharp attention (its q is scaled up), the Laplacian
# a = 1, b = -1 (out cancels where P is close to I), a corridor head δ(γI + P) with γ = -0.4,
# δ = 1.3, and a generic mix
CHECK_HEADS = [(0.0, 1.0, 8.0), (1.0, -1.0, 1.0), (-0.4 * 1.3, 1.3, 1.0), (0.3, 0.8, 1.0)]


def model_inputs(B, H, T, D, dtype, device, seed=0):
    """q, k, v as the model makes them (transposed views of one (B, T, 3·H·D) tensor), a, b,
    and dout as the model's backward sends it. H = 4 gives CHECK_HEADS; other H heads ranging
    from attention to Laplacian."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, 3 * H * D, generator=g)
    a, b = torch.linspace(0, 1, H), torch.linspace(1, -1, H)  # attention ... Laplacian
    if H == len(CHECK_HEADS):
        a, b, q_scale = torch.tensor(CHECK_HEADS).T.contiguous()  # (H,) each
        x[..., :H * D] *= q_scale.repeat_interleave(D)
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
    """fn's out and five gradients against float64 on this device, at a ragged T (full, diagonal and
    padded tiles), and a second run against the first (a race shows up as a difference; dq's atomics
    vary only its last bits). Returns rows (what, error, tolerance): error = max|x - ref| /
    max|ref|, NaN unless finite."""
    leaves, dout = model_inputs(2, len(CHECK_HEADS), T, D, dtype, device, seed=T + D)
    want = _fwd_bwd(reference, [x.detach().double().requires_grad_() for x in leaves], dout.double())
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
    # NaN fails
    return [f"{name} error {err:.1e} > {tol:.1e}" for name, err, tol in rows if not err <= tol]


def _first_line(e):  # an exception in one line, without the advice check_kernel adds itself
    line = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    return line.removesuffix("; use impl=sdpa").rstrip(".")


def check_kernel(device, dtype, head_size):
    """kernel.mix_attention, with the launch configs the model gets, against float64 on this device
    (a name or a torch.device), dtype (torch.bfloat16 or "bfloat16") and head size. Returns one line
    for the log. Raises a one-line ValueError that ends "use impl=sdpa" where the kernel is wrong
    here or cannot run (triton missing, a CPU in bf16 or without TRITON_INTERPRET=1, ROCm, a GPU
    before sm_80, a head size)."""
    name = str(dtype).removeprefix("torch.")
    try:
        # here, not at the top: train.py imports this file where triton may be missing
        import kernel
        device = torch.device(device)
        # the current CUDA device: name its index
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.type == "cpu" and name == "bfloat16":  # the gate leaves bf16 out on a CPU too
            raise ValueError("on a CPU, Triton's interpreter computes bf16 dots wrongly (float32 is right)")
        # ragged, several tiles; shorter in the slow interpreter
        T = 301 if device.type == "cuda" else 77
        with torch.autocast(device.type, enabled=False), torch.inference_mode(False), torch.enable_grad():
            rows = accuracy(kernel.mix_attention, device, getattr(torch, name), head_size, T)
        bad = failures(rows)
    except Exception as e:
        bad = [_first_line(e)]
    where = f"{device}, {name}, head size {head_size}"
    if bad:
        raise ValueError(f"kernel check: the fused Triton kernel failed on {where}: {bad[0]}; use impl=sdpa")
    (_, out, out_tol), (_, _, grad_tol) = rows[0], rows[2]
    worst = max(err for _, err, _ in rows[2::2])  # of the five gradients
    return (f"kernel check: the fused Triton kernel matches float64 on {where} "
            f"(out error {out:.1e} ≤ {out_tol:.1e}, worst gradient error {worst:.1e} ≤ {grad_tol:.1e})")


# -----------------------------------------------------------------------------
# The pass/fail gate: `python -m support.kernel_check`

DEFAULTS = dict(
    tests=True,  # (GPU) run pytest -q tests/test_kernel.py on the real kernels, GPT-2 steps too
    timing=True,  # (GPU) time the kernel against SDPA + epilogue in bf16, the SDPA backend named
)
TIMED_SHAPES = [(8, 12, 1024, 64), (8, 12, 1024, 128), (2, 12, 4096, 64), (2, 12, 4096, 128)]  # B, H, T, D


def check_accuracy(fn, device):
    """accuracy() of fn in this device's launch configs, a row per dtype and
    head size; True if all pass."""
    import kernel
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device.type == "cuda" else [])
    print(f"float64 check on {device} (kernel_check.accuracy; error = max|x - ref| / max|ref|, "
          "'twice' = the worst difference between two runs relative to its tolerance)")
    print("| dtype | D | configs (fwd, bwd) | out | dq | dk | dv | da | db | twice | result |")
    print("|---" * 11 + "|")
    all_ok = True
    for dtype, D in itertools.product(dtypes, (64, 128)):
        configs, cells = "-", ["-"] * 7
        try:
            configs = kernel.launch_configs(device, dtype, D)
            rows = accuracy(fn, device, dtype, D)
            bad = failures(rows)
            twice = max(err / tol for _, err, tol in rows[1::2])
            cells = [f"{err:.1e}" for _, err, _ in rows[::2]] + [f"{twice:.2f}"]
        except Exception as e:  # a config that fails to compile or launch fails the check
            bad = [_first_line(e)]
        all_ok &= not bad
        result = f"FAIL: {bad[0]}" if bad else "pass"
        print(f"| {str(dtype)[6:]} | {D} | {configs} | " + " | ".join(cells) + f" | {result} |")
    return all_ok


def time_fwd_bwd(fn, device, dtype, shape):
    """Median ms of fn's forward + backward on this GPU at this shape, in
    the model's layout (do_bench)."""
    from triton.testing import do_bench
    leaves, dout = model_inputs(*shape, dtype, device)
    return do_bench(lambda: torch.autograd.grad(fn(*leaves), leaves, dout), warmup=10, rep=40,
                    return_mode="median")


def sdpa_backend(q, k, v):
    """The SDPA backend (flash, cudnn, efficient, math, ...) that ran, from
    the aten op the profiler saw."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ops = sorted({e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product_")})
    return ", ".join(op.removeprefix("aten::_scaled_dot_product_") for op in ops) or "unknown"


def timing(fn):
    """fn, in the launch configs this GPU gets, against SDPA + epilogue at each timed shape, in
    bf16."""
    import kernel
    import triton
    device, dtype = torch.device("cuda"), torch.bfloat16
    (q, k, v, _, _), _ = model_inputs(*TIMED_SHAPES[0], dtype, device)
    print(f"\ntiming, bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}: fused forward+backward against SDPA + epilogue (median ms), "
          f"SDPA backend: {sdpa_backend(q, k, v)}")
    print("| B, H, T, D | configs (fwd, bwd) | fused ms | SDPA+epilogue ms | fused / SDPA |")
    print("|---" * 5 + "|")
    for shape in TIMED_SHAPES:
        fused, sdpa = (time_fwd_bwd(f, device, dtype, shape) for f in (fn, reference))
        configs = kernel.launch_configs(device, dtype, shape[-1])
        print(f"| {shape} | {configs} | {fused:.3f} | {sdpa:.3f} | {fused / sdpa:.2f} |")


def main(argv, fn=None):
    """Every check for this machine; returns the exit status. fn: the kernel
    under test (tests plant bugs)."""
    try:
        cfg = configure(DEFAULTS, argv, files=False, help_from=[("", sys.modules[__name__])])[0]
        if fn is None:
            from kernel import mix_attention as fn  # kernel.py says which torch it needs
    except (ConfigError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    passed = [check_accuracy(fn, torch.device("cuda" if cuda else "cpu"))]
    if cuda and cfg.tests:
        print("\npytest -q tests/test_kernel.py on the real kernels:", flush=True)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        pytest = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_kernel.py"], cwd=root)
        passed.append(pytest.returncode == 0)
    # the time of a kernel that failed its check means nothing
    if cuda and cfg.timing and passed[0]:
        timing(fn)
    if not cuda:
        print("no GPU here: only the float64 checks ran, in the Triton interpreter")
    print("kernel check " + ("passed" if all(passed) else "FAILED"))
    return 0 if all(passed) else 1


if __name__ == "__main__":
    if not torch.cuda.is_available():  # on a CPU the Triton interpreter, chosen before triton loads
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit("interrupted: the kernel check did not finish")
