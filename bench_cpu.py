"""
CPU benchmark: training throughput and peak memory of attention, laplacian and mix at the same model size,
all measured in one run, printed as ratios to attention. Each measurement runs in a fresh subprocess so
its peak memory (max RSS above the process's size after building the model) is its own.

    python bench_cpu.py                    # the README's table: tokens/s and peak memory, block_size 256
    python bench_cpu.py --block_sizes=128,256,512,1024 --ops=mix,attention --impls=sdpa,materialized

Targets: mix ≥ 0.95× attention's tokens/s, peak memory within 5% of attention's, and memory growing
linearly (not quadratically) with block_size on the SDPA path; the materialised path shows the T×T cost.
"""
import json
import os
import resource
import subprocess
import sys
import time

import torch

from model import GPT, GPTConfig

SIZE = dict(n_layer=4, n_head=4, n_embd=128, vocab_size=128)  # the demo model


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(op, impl, block_size, batch_size, iters, warmup=3):
    """One training configuration in this process: tokens/s over `iters` AdamW steps and peak MiB above baseline."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SIZE, block_size=block_size, op=op, impl=impl))
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    x = torch.randint(0, SIZE["vocab_size"], (batch_size, block_size))
    base = rss_mib()

    def step():
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return {"op": op, "impl": impl, "block_size": block_size, "tokens_per_s": iters * batch_size * block_size / dt,
            "peak_mib": peak - base}


def main(argv):
    opts = {"ops": "attention,laplacian,mix", "impls": "sdpa", "block_sizes": "256", "batch_size": "8",
            "iters": "20", "repeats": "5"}
    for arg in argv:
        key, _, value = arg.removeprefix("--").partition("=")
        if key not in opts or not arg.startswith("--"):
            sys.exit(f"error: unknown option {arg!r}; options: {', '.join('--' + k for k in opts)}")
        opts[key] = value
    rows = []
    # interleave the configurations and keep each one's best of `repeats` runs, so slow phases of a
    # shared machine do not land on one op only
    configs = [(op, impl, int(T)) for T in opts["block_sizes"].split(",") for impl in opts["impls"].split(",")
               for op in opts["ops"].split(",")]
    best = {}
    for _ in range(int(opts["repeats"])):
        for op, impl, T in configs:
            code = (f"import json, bench_cpu; print(json.dumps(bench_cpu.measure({op!r}, {impl!r}, {T}, "
                    f"{opts['batch_size']}, {opts['iters']})))")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 cwd=os.path.dirname(os.path.abspath(__file__)))
            if out.returncode:
                sys.exit(f"error: {op}/{impl}/T={T} failed: {out.stderr.strip().splitlines()[-1]}")
            r = json.loads(out.stdout)
            key = (op, impl, T)
            best[key] = r if key not in best else {**r, "tokens_per_s": max(r["tokens_per_s"], best[key]["tokens_per_s"]),
                                                   "peak_mib": min(r["peak_mib"], best[key]["peak_mib"])}
    rows = [best[k] for k in configs]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, model {SIZE}, batch {opts['batch_size']}, "
          f"{opts['iters']} steps, best of {opts['repeats']}")
    print("| op | impl | block_size | tokens/s | × attention | peak MiB | × attention |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ref = best.get(("attention", r["impl"], r["block_size"]))
        ratio = (lambda k: f"{r[k] / ref[k]:.3f}" if ref else "-")
        print(f"| {r['op']} | {r['impl']} | {r['block_size']} | {r['tokens_per_s']:,.0f} | {ratio('tokens_per_s')} "
              f"| {r['peak_mib']:.1f} | {ratio('peak_mib')} |")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
