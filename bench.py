"""
Benchmarks, each printed as ratios measured in one run (docs/benchmarks.md quotes them with date and machine):

    python bench.py                                   # CPU: tokens/s and peak memory of attention, laplacian, mix
    python bench.py --ops=attention,mix --impls=sdpa,materialized --block_sizes=128,256,512,1024 --repeats=1
    python bench.py --what=nanogpt --nanogpt=PATH/TO/nanoGPT/model.py   # CPU: our training step vs nanoGPT's
    python bench.py --what=gpt2_step                  # GPU: a compiled GPT-2-small step, impl=triton vs sdpa

Targets: mix ≥ 0.95× attention's tokens/s with peak memory within 5%, and memory growing linearly with
block_size on the SDPA path; at nanoGPT's own CPU example config, our attention step ≤ 1.00× nanoGPT's time
and mix ≤ 1.03×. Shared machines are noisy, so every comparison interleaves its contestants and keeps the best
of several repeats.
"""
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time

import torch

from configurator import ConfigError, at_least, configure, one_of
from hardware import keep_freed_memory
from model import GPT, GPTConfig

DEFAULTS = dict(
    what="ops",  # ops (tokens/s and memory of each op), nanogpt (our step vs nanoGPT's), gpt2_step (GPU)
    ops="attention,laplacian,mix",  # (what=ops) the ops to compare, comma-separated
    impls="sdpa",  # (what=ops) the implementations (sdpa, materialized, triton), comma-separated
    block_sizes="256",  # (what=ops) the sequence lengths, comma-separated
    batch_size=8,  # (what=ops) sequences per step
    iters=20,  # (what=ops, nanogpt) timed training steps per measurement
    repeats=5,  # (what=ops, nanogpt) measurements of each, the best one counts
    nanogpt="",  # (what=nanogpt) the path of nanoGPT's model.py
)
RULES = dict(what=one_of("ops", "nanogpt", "gpt2_step"), batch_size=at_least(1), iters=at_least(1), repeats=at_least(1))
DEMO = dict(n_layer=4, n_head=4, n_embd=128, vocab_size=128)  # the demo model
# nanoGPT's CPU example (README of nanoGPT: shakespeare_char on a CPU)
NANOGPT_CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65, bias=False, dropout=0.0)


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def training_step(model, opt, x, grad_clip=1.0):
    """One step as train.py takes it: forward, backward, clipping, AdamW."""
    _, loss = model(x, x)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure(op, impl, block_size, batch_size, iters, warmup=3):
    """One configuration in this process: tokens/s over `iters` steps and peak MiB above the model's baseline."""
    keep_freed_memory()  # as train.py does on a CPU
    torch.manual_seed(0)
    model = GPT(GPTConfig(**DEMO, block_size=block_size, op=op, impl=impl))
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    x = torch.randint(0, DEMO["vocab_size"], (batch_size, block_size))
    base = rss_mib()
    for _ in range(warmup):
        training_step(model, opt, x)
    t0 = time.perf_counter()
    for _ in range(iters):
        training_step(model, opt, x)
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return {"tokens_per_s": iters * batch_size * block_size / dt, "peak_mib": peak - base}


def bench_ops(cfg):
    """Each measurement in a fresh subprocess, so that its peak memory is its own; best of `repeats`."""
    try:
        configs = [(op, impl, int(T)) for T in cfg.block_sizes.split(",") for impl in cfg.impls.split(",")
                   for op in cfg.ops.split(",")]
    except ValueError:
        raise ConfigError(f"block_sizes={cfg.block_sizes!r} is not allowed: give integers like 128,256") from None
    best = {}
    for _ in range(cfg.repeats):
        for op, impl, T in configs:
            code = f"import json, bench; print(json.dumps(bench.measure({op!r}, {impl!r}, {T}, {cfg.batch_size}, {cfg.iters})))"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 cwd=os.path.dirname(os.path.abspath(__file__)))
            if out.returncode:
                raise ConfigError(f"{op}/{impl}/T={T} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
            r, old = json.loads(out.stdout), best.get((op, impl, T))
            best[op, impl, T] = r if old is None else {"tokens_per_s": max(r["tokens_per_s"], old["tokens_per_s"]),
                                                        "peak_mib": min(r["peak_mib"], old["peak_mib"])}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, model {DEMO}, batch {cfg.batch_size}, "
          f"{cfg.iters} steps, best of {cfg.repeats}")
    print("| op | impl | block_size | tokens/s | × attention | peak MiB | × attention |\n|---|---|---|---|---|---|---|")
    for (op, impl, T), r in best.items():
        ref = best.get(("attention", impl, T))
        ratio = lambda k: f"{r[k] / ref[k]:.3f}" if ref else "-"
        print(f"| {op} | {impl} | {T} | {r['tokens_per_s']:,.0f} | {ratio('tokens_per_s')} | {r['peak_mib']:.1f} "
              f"| {ratio('peak_mib')} |")
    return best


def bench_nanogpt(cfg):
    """Our training step against nanoGPT's model.py at nanoGPT's CPU example config, interleaved: every repeat
    times `iters` steps of each contestant in turn; the table keeps each one's best repeat. Both run in this
    process, with the memory allocator set as train.py sets it on a CPU."""
    where = "give the path of nanoGPT's model.py (github.com/karpathy/nanoGPT)"
    if not os.path.isfile(cfg.nanogpt) or not cfg.nanogpt.endswith(".py"):
        raise ConfigError(f"nanogpt={cfg.nanogpt!r} is not a Python file: {where}")
    spec = importlib.util.spec_from_file_location("nanogpt_model", cfg.nanogpt)
    nano = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(nano)
    except Exception as e:
        raise ConfigError(f"nanogpt={cfg.nanogpt!r} failed to load ({type(e).__name__}): {where}") from None
    if not hasattr(nano, "GPT") or not hasattr(nano, "GPTConfig"):
        raise ConfigError(f"nanogpt={cfg.nanogpt!r} defines no GPT and GPTConfig: {where}")
    kept = keep_freed_memory()
    B, T = 12, NANOGPT_CPU["block_size"]
    contestants = {}
    for name, make in (("nanoGPT", lambda: nano.GPT(nano.GPTConfig(**NANOGPT_CPU))),
                       ("ours, op=attention", lambda: GPT(GPTConfig(**NANOGPT_CPU, op="attention"))),
                       ("ours, op=mix", lambda: GPT(GPTConfig(**NANOGPT_CPU, op="mix")))):
        torch.manual_seed(0)
        model = make()
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu") if name == "nanoGPT" else \
            model.configure_optimizers(0.1, 1e-3, (0.9, 0.99))
        contestants[name] = (model, opt)
    x = torch.randint(0, NANOGPT_CPU["vocab_size"], (B, T))
    best = {name: float("inf") for name in contestants}
    for _ in range(cfg.repeats):
        for name, (model, opt) in contestants.items():
            training_step(model, opt, x)  # warm up after the others ran
            t0 = time.perf_counter()
            for _ in range(cfg.iters):
                training_step(model, opt, x)
            best[name] = min(best[name], (time.perf_counter() - t0) / cfg.iters * 1000)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {NANOGPT_CPU}, batch {B}, "
          f"best of {cfg.repeats} interleaved repeats of {cfg.iters} steps, freed memory kept: {kept}")
    print("| model | ms per training step | × nanoGPT |\n|---|---|---|")
    for name, ms in best.items():
        print(f"| {name} | {ms:.2f} | {ms / best['nanoGPT']:.3f} |")
    return best


def bench_gpt2_step(cfg):
    """GPT-2 small (124M), op=mix, bf16, torch.compile: ms per training step with the fused kernel and with SDPA."""
    if not torch.cuda.is_available():
        raise ConfigError("what=gpt2_step needs a CUDA GPU")
    from triton.testing import do_bench
    x = torch.randint(0, 50304, (8, 1024), device="cuda")
    times = {}
    for impl in ("triton", "sdpa"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(op="mix", impl=impl)).cuda()
        opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
        step = torch.compile(model)

        def train_step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                training_step(step, opt, x)
        for _ in range(3):
            train_step()  # compiles
        times[impl] = do_bench(train_step, warmup=1000, rep=3000, return_mode="median")  # milliseconds
    print("| GPT-2 small step (B=8, T=1024, bf16, compiled) | ms | × sdpa |\n|---|---|---|")
    for impl, ms in times.items():
        print(f"| impl={impl} | {ms:.1f} | {ms / times['sdpa']:.3f} |")
    return times


def main(argv):
    try:
        cfg = configure(DEFAULTS, argv, RULES, files=False, help_from=[("", sys.modules[__name__])])[0]
        return {"ops": bench_ops, "nanogpt": bench_nanogpt, "gpt2_step": bench_gpt2_step}[cfg.what](cfg)
    except ValueError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
