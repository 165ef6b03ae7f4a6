"""
Benchmarks, each printed as ratios measured in one run (docs/benchmarks.md quotes them with date
and machine):

    python bench.py                    # CPU: tokens/s and peak memory of attention, laplacian, mix
    python bench.py --ops=attention,mix --impls=sdpa,materialized --block_sizes=128,256,512,1024
    python bench.py --what=nanogpt --nanogpt=PATH/TO/nanoGPT/model.py  # CPU: our step vs nanoGPT's
    python bench.py --what=gpt2_step           # GPU: a compiled GPT-2-small step, triton vs sdpa
    python bench.py --what=sample --repeats=2  # CPU: sampling with generate's KV cache vs without

What the tables mean (ops, nanogpt, sample: contestants take turns and each keeps its best repeat,
as noise only ever slows a step down or adds memory):
- ops: the demo model's training steps per (op, impl, block_size), each in a fresh process.
  tokens/s = steps × batch_size × block_size / seconds, warm-up excluded, the highest; peak MiB
  above baseline = peak resident memory minus resident memory once the model exists (AdamW's
  moments count; Linux only, "-" elsewhere), the lowest. "× attention" divides by the attention row
  with the same impl and block_size.
- nanogpt: ms per training step, the lowest; "× nanoGPT" divides by nanoGPT's.
- gpt2_step: the median ms per step (triton.testing.do_bench); "× sdpa" divides by impl=sdpa's.
Targets: mix ≥ 0.95× attention's tokens/s, peak memory within 5% and linear in block_size on the
SDPA path; at nanoGPT's CPU example config, our attention step ≤ 1.00× nanoGPT's time and mix ≤
1.03×.
"""
import importlib.util
import json
import os
import subprocess
import sys
import time

import torch

from support.configurator import ConfigError, at_least, configure, one_of, require_torch, requires
from support.hardware import keep_freed_memory
from model import GPT, GPTConfig
from support.kernel_check import check_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS = dict(
    what="ops",  # ops (tokens/s, memory), nanogpt (vs nanoGPT's step), gpt2_step (GPU), sample
    ops="attention,laplacian,mix",  # (what=ops) the ops to compare, comma-separated
    impls="sdpa",  # (what=ops) the implementations (sdpa, materialized, triton), comma-separated
    block_sizes="256",  # (what=ops) the sequence lengths, comma-separated
    batch_size=8,  # (what=ops) sequences per step
    iters=20,  # (what=ops, nanogpt) timed training steps per measurement
    repeats=5,  # (what=ops, nanogpt, sample) measurements of each, the best one counts
    nanogpt="",  # (what=nanogpt) the path of nanoGPT's model.py
)
integers = requires(lambda text: all(map(str.isdecimal, text.split(","))),
                    "give integers like 128,256")
RULES = dict(what=one_of("ops", "nanogpt", "gpt2_step", "sample"), batch_size=at_least(1),
             iters=at_least(1), repeats=at_least(1), block_sizes=integers)
DEMO = dict(n_layer=4, n_head=4, n_embd=128, vocab_size=128)  # the demo model
# nanoGPT's CPU example (README of nanoGPT: shakespeare_char on a CPU)
NANOGPT_CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65, bias=False,
                   dropout=0.0)


def memory_mib():
    """(resident, peak resident) MiB of this process so far, as Linux reports them, else None."""
    try:
        import resource  # POSIX only
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (ImportError, OSError):
        return None
    return resident, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def training_step(model, opt, x, grad_clip=1.0):
    """One step as train.py takes it: forward, backward, clipping, AdamW."""
    _, loss = model(x, x)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure(op, impl, block_size, batch_size, iters, warmup=3):
    """One configuration here: tokens/s over `iters` steps, peak MiB above the model's baseline."""
    keep_freed_memory()  # as train.py does on a CPU
    torch.manual_seed(0)
    model = GPT(GPTConfig(**DEMO, block_size=block_size, op=op, impl=impl))
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    x = torch.randint(0, DEMO["vocab_size"], (batch_size, block_size))
    baseline = memory_mib()
    for _ in range(warmup):
        training_step(model, opt, x)
    t0 = time.perf_counter()
    for _ in range(iters):
        training_step(model, opt, x)
    dt = time.perf_counter() - t0
    # peak now − resident before
    peak_mib = None if baseline is None else memory_mib()[1] - baseline[0]
    return {"tokens_per_s": iters * batch_size * block_size / dt, "peak_mib": peak_mib}


def measure_in_subprocess(op, impl, block_size, batch_size, iters):
    """measure() in a fresh process, so its peak memory is its own (started
    here, to import our model.py)."""
    args = f"{op!r}, {impl!r}, {block_size}, {batch_size}, {iters}"
    code = f"import json, bench; print(json.dumps(bench.measure({args})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE)
    if out.returncode:
        last_line = (out.stderr.strip().splitlines() or ["?"])[-1]
        raise ConfigError(f"{op}/{impl}/T={block_size} failed: {last_line}")
    return json.loads(out.stdout)


def best_of(repeats):
    """One configuration's repeats -> each column's best: the highest
    tokens/s, the lowest peak memory."""
    peaks = [r["peak_mib"] for r in repeats]
    return {"tokens_per_s": max(r["tokens_per_s"] for r in repeats),
            "peak_mib": None if None in peaks else min(peaks)}


def ops_table(best):
    """The markdown table of {(op, impl, block_size): best_of(...)}."""
    lines = ["| op | impl | block_size | tokens/s | × attention | peak MiB above baseline "
             "| × attention |", "|---|---|---|---|---|---|---|"]
    for (op, impl, T), r in best.items():
        # the attention row with the same impl and block_size
        ref = best.get(("attention", impl, T))
        # "-": nothing to divide
        ratio = {k: "-" if ref is None or r[k] is None else f"{r[k] / ref[k]:.3f}"
                 for k in ("tokens_per_s", "peak_mib")}
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.1f}"
        lines.append(f"| {op} | {impl} | {T} | {r['tokens_per_s']:,.0f} | {ratio['tokens_per_s']} "
                     f"| {peak} | {ratio['peak_mib']} |")
    return lines


def bench_ops(cfg):
    """Every configuration measured `repeats` times, in turns; the table keeps each column's
    best."""
    configs = [(op, impl, int(T)) for T in cfg.block_sizes.split(",")
               for impl in cfg.impls.split(",") for op in cfg.ops.split(",")]
    # the fused kernel, checked against float64 before it is timed
    if "triton" in cfg.impls.split(","):
        print(check_kernel("cpu", torch.float32, DEMO["n_embd"] // DEMO["n_head"]))
    # in turns: each repeat, every one
    measured = [(c, measure_in_subprocess(*c, cfg.batch_size, cfg.iters))
                for _ in range(cfg.repeats) for c in configs]
    best = {c: best_of([r for k, r in measured if k == c]) for c in configs}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, model {DEMO}, "
          f"batch {cfg.batch_size}, {cfg.iters} steps, best of {cfg.repeats}")
    print("\n".join(ops_table(best)))
    return best


def nanogpt_contestant(path, x):
    """nanoGPT's model and optimizer at its CPU example config, from its
    model.py at `path`, tried once."""
    where = "give the path of nanoGPT's model.py (github.com/karpathy/nanoGPT)"
    if not os.path.isfile(path) or not path.endswith(".py"):
        raise ConfigError(f"nanogpt={path!r} is not a Python file: {where}")
    if os.path.samefile(path, os.path.join(HERE, "model.py")):
        raise ConfigError(f"nanogpt={path!r} is this project's own model.py: {where}")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    nano = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(nano)
    except Exception as e:
        why = type(e).__name__
        raise ConfigError(f"nanogpt={path!r} failed to load ({why}): {where}") from None
    if not hasattr(nano, "GPT") or not hasattr(nano, "GPTConfig"):
        raise ConfigError(f"nanogpt={path!r} defines no GPT and GPTConfig: {where}")
    try:  # someone else's code: whatever it raises, it is not the nanoGPT we compare against
        torch.manual_seed(0)
        model = nano.GPT(nano.GPTConfig(**NANOGPT_CPU))
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
        training_step(model, opt, x)
    except Exception as e:
        what = f"failed to train as nanoGPT's GPT does ({type(e).__name__})"
        raise ConfigError(f"nanogpt={path!r} {what}: {where}") from None
    return model, opt


def bench_nanogpt(cfg):
    """Our training step against nanoGPT's at its CPU example config: every repeat
    times `iters` steps of each in turn, in this process, with the memory allocator set
    as train.py sets it on a CPU."""
    kept = keep_freed_memory()
    B, T = 12, NANOGPT_CPU["block_size"]
    x = torch.randint(0, NANOGPT_CPU["vocab_size"], (B, T))
    contestants = {"nanoGPT": nanogpt_contestant(cfg.nanogpt, x)}
    for op in ("attention", "mix"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**NANOGPT_CPU, op=op))
        contestants[f"ours, op={op}"] = (model, model.configure_optimizers(0.1, 1e-3, (0.9, 0.99)))
    best = {name: float("inf") for name in contestants}
    for _ in range(cfg.repeats):
        for name, (model, opt) in contestants.items():
            training_step(model, opt, x)  # warm up after the others ran
            t0 = time.perf_counter()
            for _ in range(cfg.iters):
                training_step(model, opt, x)
            best[name] = min(best[name], (time.perf_counter() - t0) / cfg.iters * 1000)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {NANOGPT_CPU}, "
          f"batch {B}, best of {cfg.repeats} interleaved repeats of {cfg.iters} steps, "
          f"freed memory kept: {kept}")
    print("| model | ms per training step | × nanoGPT |\n|---|---|---|")
    for name, ms in best.items():
        print(f"| {name} | {ms:.2f} | {ms / best['nanoGPT']:.3f} |")
    return best


def gpt2_step_ms(impl):
    """The median ms of a compiled GPT-2-small (124M, op=mix) training step in bf16, B=8, T=1024."""
    from triton.testing import do_bench
    torch.manual_seed(0)  # the same batch and weights for each impl
    x = torch.randint(0, 50304, (8, 1024), device="cuda")
    model = GPT(GPTConfig(op="mix", impl=impl)).cuda()
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
    step = torch.compile(model)

    def train_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            training_step(step, opt, x)
    for _ in range(3):
        train_step()  # compiles
    return do_bench(train_step, warmup=1000, rep=3000, return_mode="median")


def bench_gpt2_step(cfg):
    """GPT-2 small: ms per compiled training step, impl=triton vs sdpa (sdpa
    alone if triton is refused)."""
    if not torch.cuda.is_available():
        raise ConfigError("what=gpt2_step needs a CUDA GPU")
    impls = ["triton", "sdpa"]
    try:
        # the fused kernel, checked against float64 first
        print(check_kernel("cuda", torch.bfloat16, 64))
    except ValueError as e:
        print(f"{str(e).removesuffix('; use impl=sdpa')}: impl=triton is skipped")
        impls.remove("triton")
    times = {impl: gpt2_step_ms(impl) for impl in impls}
    print("| GPT-2 small step (B=8, T=1024, bf16, compiled) | ms | × sdpa |\n|---|---|---|")
    for impl, ms in times.items():
        print(f"| impl={impl} | {ms:.1f} | {ms / times['sdpa']:.3f} |")
    return times


SAMPLE_NEW_TOKENS = 300
# GPT-2's vocabulary and block_size (1024)
SAMPLE_MODELS = {"4×256": dict(n_layer=4, n_head=4, n_embd=256),
                 "GPT-2 small, 12×768": dict(n_layer=12, n_head=12, n_embd=768)}


def bench_sample(cfg):
    """Greedy sampling of SAMPLE_NEW_TOKENS tokens, batch 1, op=mix: generate with its KV
    cache against use_cache=False, a full forward per token as nanoGPT's; same output layer,
    so the ratio is the cache's."""
    prompt = torch.zeros((1, 1), dtype=torch.long)
    n, rows = SAMPLE_NEW_TOKENS, {}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {n} new tokens, greedy, "
          f"batch 1, op=mix, best of {cfg.repeats} interleaved repeats")
    print("| model | ms per token, KV cache | ms per token, full forward | speedup | same tokens |")
    print("|---|---|---|---|---|")
    for name, shape in SAMPLE_MODELS.items():
        torch.manual_seed(0)
        model = GPT(GPTConfig(**shape, op="mix")).eval()
        cached_s = full_s = float("inf")
        for _ in range(cfg.repeats):
            t0 = time.perf_counter()
            cached = model.generate(prompt, n, temperature=0)
            t1 = time.perf_counter()
            full = model.generate(prompt, n, temperature=0, use_cache=False)
            cached_s, full_s = min(cached_s, t1 - t0), min(full_s, time.perf_counter() - t1)
        same = torch.equal(cached, full)
        speedup = full_s / cached_s
        rows[name] = dict(cached_s=cached_s, full_s=full_s, speedup=speedup, same_tokens=same)
        print(f"| {name} | {cached_s / n * 1000:.2f} | {full_s / n * 1000:.2f} | {speedup:.2f}× "
              f"| {same} |")
    return rows


def main(argv):
    try:
        require_torch(torch.__version__)
        cfg = configure(DEFAULTS, argv, RULES, files=False,
                        help_from=[("", sys.modules[__name__])])[0]
        return {"ops": bench_ops, "nanogpt": bench_nanogpt, "gpt2_step": bench_gpt2_step,
                "sample": bench_sample}[cfg.what](cfg)
    except ValueError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # a benchmark writes nothing
        sys.exit("interrupted")


if __name__ == "__main__":
    main(sys.argv[1:])
