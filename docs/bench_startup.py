"""
What sample.py costs to start, beyond torch itself: the CPU time (user + system, children included) of
`python sample.py` on a run's checkpoint, generating one token, minus that of `python -c "import torch"`,
each the median of 3 runs. Issue 61 asks for at most 1.0 s on the demo's checkpoint.

    python docs/bench_startup.py                      # out/demo, from the repository's root
    python docs/bench_startup.py --out_dir=out/other --runs=5
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_seconds(argv):
    """The CPU time of one child process running argv (it must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out_dir", default="out/demo", help="the run whose ckpt.pt sample.py reads")
    parser.add_argument("--runs", type=int, default=3, help="runs of each, the median is kept")
    args = parser.parse_args()
    sample = [sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={args.out_dir}",
              "--num_samples=1", "--max_new_tokens=1", "--device=cpu"]
    torch = statistics.median(cpu_seconds([sys.executable, "-c", "import torch"]) for _ in range(args.runs))
    total = statistics.median(cpu_seconds(sample) for _ in range(args.runs))
    print(f"import torch: {torch:.2f} s CPU; sample.py: {total:.2f} s CPU; "
          f"sample.py beyond import torch: {total - torch:.2f} s (median of {args.runs})")


if __name__ == "__main__":
    main()
