"""
The pass/fail check that `python kernel.py` runs; its exit status is 0 only if every part passed.

- The fused kernel's out and five gradients against float64 (kernel.accuracy: ragged T = 301, q, k, v in the
  model's layout, a sharp head, a cancelling Laplacian head, run twice), for D = 64 and 128 in every launch config
  the device may pick: fp32, fp16 and bf16 on a GPU; fp32 and fp16 in the Triton interpreter on a CPU (bf16 dots
  are wrong there). On a CPU that is all: 6 minutes on a shared 2-core machine.
- On a GPU also: `pytest -q test_kernel.py` on the real kernels; a few GPT-2-small training steps with
  impl=triton against impl=sdpa, in bf16 and in fp16 with the gradient scaler (losses within 1%, gradient norms
  within 5%); and, with the tuning cache cleared, the timing behind impl='auto', naming the SDPA backend it ran
  against. Slower than SDPA is reported, not failed: auto then uses SDPA. Meant to fit in 10 minutes on one H200.

    python kernel.py --tests=False --gpt2_steps=0 --timing=False   # only the float64 checks
"""
import functools
import itertools
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

import kernel
from configurator import ConfigError, at_least, configure

DEFAULTS = dict(tests=True, gpt2_steps=3, timing=True)
TIMED_SHAPES = [(8, 12, 1024, 64), (8, 12, 1024, 128), (2, 12, 4096, 64), (2, 12, 4096, 128)]  # (B, H, T, D)


def check_accuracy(fn, device):
    """kernel.accuracy for every dtype, head size and candidate config pair: one row each. True if all pass."""
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device.type == "cuda" else [])
    print(f"float64 check on {device} (kernel.accuracy; error = max|x - ref| / max|ref|, "
          "'twice' = the worst difference between two runs relative to its tolerance)")
    print("| dtype | D | configs (fwd, bwd) | out | dq | dk | dv | da | db | twice | result |\n" + "|---" * 11 + "|")
    all_ok = True
    for dtype, D in itertools.product(dtypes, (64, 128)):
        for pair in kernel.candidates(device, dtype, D):
            try:
                rows = kernel.accuracy(functools.partial(fn, configs=pair), device, dtype, D)
                bad = kernel.failures(rows)
                cells = [f"{err:.1e}" for _, err, _ in rows[::2]] + [f"{max(e / t for _, e, t in rows[1::2]):.2f}"]
            except Exception as e:  # a config that fails to compile or launch fails the check
                bad, cells = [f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"], ["-"] * 7
            all_ok &= not bad
            print(f"| {str(dtype)[6:]} | {D} | {pair} | " + " | ".join(cells) + f" | {'FAIL: ' + bad[0] if bad else 'pass'} |")
    return all_ok


def run_tests():
    print("\npytest -q test_kernel.py on the real kernels:", flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "test_kernel.py"], cwd=here).returncode == 0


def compare_gpt2(steps, batch_size=4):
    """GPT-2 small (124M), op=mix, from the same weights on the same batch: impl=triton against impl=sdpa, in bf16
    and in fp16 with the gradient scaler. True if every step's loss agrees within 1% and gradient norm within 5%."""
    from model import GPT, GPTConfig
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 50257, (2, batch_size, 1024), generator=g).cuda()
    print(f"\nGPT-2 small, op=mix, {steps} training steps (B={batch_size}, T=1024): impl=triton against impl=sdpa")
    print("| dtype | step | loss triton | loss sdpa | grad norm triton | grad norm sdpa | result |\n" + "|---" * 7 + "|")
    all_ok = True
    for dtype in (torch.bfloat16, torch.float16):
        curves = {}
        for impl in ("triton", "sdpa"):
            torch.manual_seed(0)
            model = GPT(GPTConfig(op="mix", impl=impl)).cuda()
            opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
            scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
            curves[impl] = []
            for _ in range(steps):
                with torch.autocast("cuda", dtype=dtype):
                    loss = model(x, y)[1]
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
                curves[impl].append((loss.item(), norm.item()))
        for step, ((lt, nt), (ls, ns)) in enumerate(zip(curves["triton"], curves["sdpa"])):
            ok = abs(lt - ls) <= 0.01 * abs(ls) and abs(nt - ns) <= 0.05 * abs(ns)  # NaN fails
            all_ok &= ok
            print(f"| {str(dtype)[6:]} | {step} | {lt:.4f} | {ls:.4f} | {nt:.4f} | {ns:.4f} | {'pass' if ok else 'FAIL'} |")
    return all_ok


def sdpa_backend(q, k, v):
    """The SDPA backend (flash, cudnn, efficient, math, ...) that ran, from the aten op the profiler saw."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ops = sorted({e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product_")})
    return ", ".join(op.removeprefix("aten::_scaled_dot_product_") for op in ops) or "unknown"


def timing():
    """What impl='auto' decides at each timed shape in bf16, after clearing the tuning cache."""
    kernel._tuned.clear()
    device, dtype = torch.device("cuda"), torch.bfloat16
    (q, k, v, _, _), _ = kernel.model_inputs(*TIMED_SHAPES[0], dtype, device)
    print(f"\ntiming, bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {kernel.triton.__version__}"
          f": fused forward+backward against SDPA + epilogue, SDPA backend: {sdpa_backend(q, k, v)}")
    print("| B, H, T, D | config picked (fwd, bwd) | fused ms | SDPA+epilogue ms | ratio | impl='auto' uses |\n"
          + "|---" * 6 + "|")
    for shape in TIMED_SHAPES:
        tuned = kernel.tune(device, dtype, shape)
        if tuned is None:
            print(f"| {shape} | none passed the float64 check | | | | sdpa |")
            continue
        fused = kernel.time_fwd_bwd(functools.partial(kernel.mix_attention, configs=tuned[0]), device, dtype, shape)
        sdpa = kernel.time_fwd_bwd(kernel.reference, device, dtype, shape)
        print(f"| {shape} | {tuned[0]} | {fused:.3f} | {sdpa:.3f} | {fused / sdpa:.2f} | "
              f"{'triton' if tuned[1] else 'sdpa'} |")


def main(argv, fn=kernel.mix_attention):
    """Every check for this machine; returns the exit status. fn: the kernel under test (tests plant wrong ones)."""
    try:
        cfg = configure(DEFAULTS, argv, dict(gpt2_steps=at_least(0)), files=False)[0]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    passed = [check_accuracy(fn, torch.device("cuda" if cuda else "cpu"))]
    if cuda and cfg.tests:
        passed.append(run_tests())
    if cuda and cfg.gpt2_steps:
        passed.append(compare_gpt2(cfg.gpt2_steps))
    if cuda and cfg.timing:
        timing()
    if not cuda:
        print("no GPU here: only the float64 checks ran, in the Triton interpreter")
    print("kernel check " + ("passed" if all(passed) else "FAILED"))
    return 0 if all(passed) else 1
