"""
The pass/fail check that `python kernel.py` runs; its exit status is 0 only if every part passed.

- The fused kernel's out and five gradients against float64 (kernel.accuracy: ragged T = 301, q, k, v in the
  model's layout, a sharp head, a cancelling Laplacian head, run twice), for D = 64 and 128 in every launch
  config the device may pick: fp32, fp16 and bf16 on a GPU; fp32 and fp16 in the Triton interpreter on a CPU
  (bf16 dots are wrong there). On a CPU that is all: 6 minutes on a shared 2-core machine.
- On a GPU also: `pytest -q test_kernel.py` on the real kernels; a few GPT-2-small training steps with
  impl=triton against impl=sdpa, in bf16 and in fp16 with the gradient scaler (losses within 1%, gradient
  norms within 5%); and, with the tuning cache cleared, the timing behind impl='auto', naming the SDPA backend
  it ran against. Slower than SDPA is reported, not failed: auto then uses SDPA. Meant to fit in 10 minutes on
  one H200.

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

DEFAULTS = dict(
    tests=True,  # (GPU) run pytest -q test_kernel.py on the real kernels
    gpt2_steps=3,  # (GPU) GPT-2-small training steps to compare, impl=triton against impl=sdpa; 0: none
    timing=True,  # (GPU) time the kernel against SDPA + epilogue, as impl='auto' does
)
TIMED_SHAPES = [(8, 12, 1024, 64), (8, 12, 1024, 128), (2, 12, 4096, 64), (2, 12, 4096, 128)]  # (B, H, T, D)


def check_accuracy(fn, device):
    """kernel.accuracy for every dtype, head size and candidate config pair: a row each. True if all pass."""
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device.type == "cuda" else [])
    print(f"float64 check on {device} (kernel.accuracy; error = max|x - ref| / max|ref|, "
          "'twice' = the worst difference between two runs relative to its tolerance)")
    print("| dtype | D | configs (fwd, bwd) | out | dq | dk | dv | da | db | twice | result |")
    print("|---" * 11 + "|")
    all_ok = True
    for dtype, D in itertools.product(dtypes, (64, 128)):
        for pair in kernel.candidates(device, dtype, D):
            try:
                rows = kernel.accuracy(functools.partial(fn, configs=pair), device, dtype, D)
                bad = kernel.failures(rows)
                twice = max(err / tol for _, err, tol in rows[1::2])
                cells = [f"{err:.1e}" for _, err, _ in rows[::2]] + [f"{twice:.2f}"]
            except Exception as e:  # a config that fails to compile or launch fails the check
                bad, cells = [f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"], ["-"] * 7
            all_ok &= not bad
            result = f"FAIL: {bad[0]}" if bad else "pass"
            print(f"| {str(dtype)[6:]} | {D} | {pair} | " + " | ".join(cells) + f" | {result} |")
    return all_ok


def run_tests():
    print("\npytest -q test_kernel.py on the real kernels:", flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "test_kernel.py"], cwd=here).returncode == 0


def compare_gpt2(steps, batch_size=4, device="cuda", dtypes=(torch.bfloat16, torch.float16), **model_args):
    """GPT-2 small (124M; model_args change it), op=mix, from the same weights on the same batch: impl=triton
    against impl=sdpa, in bf16 and in fp16 with the gradient scaler. True if at every step the losses agree
    within 1% and the gradient norms, the whole one and each parameter's, within 5%."""
    from model import GPT, GPTConfig
    config = GPTConfig(op="mix", **model_args)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, config.vocab_size, (2, batch_size, config.block_size), generator=g).to(device)
    print(f"\n{config.n_layer} layers × {config.n_head} heads × {config.n_embd}, op=mix, {steps} training steps "
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
            ok = abs(lt - ls) <= 0.01 * abs(ls) and abs(nt - ns) <= 0.05 * abs(ns) and worst <= 0.05  # NaN fails
            all_ok &= ok
            result = "pass" if ok else "FAIL"
            print(f"| {str(dtype)[6:]} | {step} | {lt:.4f} | {ls:.4f} | {nt:.4f} | {ns:.4f} | {worst:.1e} | {result} |")
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
    print(f"\ntiming, bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{kernel.triton.__version__}: fused forward+backward against SDPA + epilogue (median ms), "
          f"SDPA backend: {sdpa_backend(q, k, v)}")
    print("| B, H, T, D | config (fwd, bwd) | fused ms | SDPA+epilogue ms | ratio | impl='auto' uses |")
    print("|---" * 6 + "|")
    for shape in TIMED_SHAPES:
        tuned = kernel.tune(device, dtype, shape)
        if tuned is None:
            print(f"| {shape} | none passed the float64 check | | | | sdpa |")
            continue
        picked = functools.partial(kernel.mix_attention, configs=tuned[0])
        fused = kernel.time_fwd_bwd(picked, device, dtype, shape)
        sdpa = kernel.time_fwd_bwd(kernel.reference, device, dtype, shape)
        print(f"| {shape} | {tuned[0]} | {fused:.3f} | {sdpa:.3f} | {fused / sdpa:.2f} | "
              f"{'triton' if tuned[1] else 'sdpa'} |")


def main(argv, fn=kernel.mix_attention):
    """Every check for this machine; returns the exit status. fn: the kernel under test (tests plant bugs)."""
    try:
        cfg = configure(DEFAULTS, argv, dict(gpt2_steps=at_least(0)), files=False,
                        help_from=[("", sys.modules[__name__])])[0]
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
