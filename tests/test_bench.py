"""
What bench.py's tables mean: which repeat each column keeps, what "above baseline" subtracts, which row each
ratio divides by, what tokens/s counts. A fake clock, a fake training step and scripted measurements make the
arithmetic exact, so that no test depends on how fast or how busy the machine is.

    python -m pytest -q tests/test_bench.py
"""
import contextlib
import importlib.util
import io
import os
import platform
import subprocess
import sys
import types

import pytest
import torch

import bench
from helpers import ROOT, one_line_error
from model import GPT



@pytest.fixture
def clock(monkeypatch):
    """bench.py's time.perf_counter reads `clock.now` (seconds); only the fake training steps advance it."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    return clock


@pytest.fixture
def stand_in_nanogpt(tmp_path):
    """A stand-in for nanoGPT's model.py: ours, behind nanoGPT's names and optimizer signature."""
    path = tmp_path / "nanogpt" / "model.py"
    path.parent.mkdir()
    path.write_text("import model\nGPTConfig = model.GPTConfig\n"
                    "class GPT(model.GPT):\n"
                    "    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):\n"
                    "        return super().configure_optimizers(weight_decay, learning_rate, betas)\n")
    return path


def fake_steps(monkeypatch, clock, seconds, shapes=None):
    """bench.training_step replaced by one that takes `seconds` on the fake clock; each step appends its
    batch's shape to `shapes`, which it returns."""
    if shapes is None:
        shapes = []

    def step(model, opt, x):
        shapes.append(tuple(x.shape))
        clock.now += seconds
    monkeypatch.setattr(bench, "training_step", step)
    return shapes


# --- the ops table --------------------------------------------------------------------------------------


def test_measure_counts_every_token_of_the_timed_steps(clock, monkeypatch):
    """tokens/s = iters × batch_size × block_size / the seconds of those iters; warm-ups are not timed."""
    shapes = fake_steps(monkeypatch, clock, 0.25)
    r = bench.measure("attention", "sdpa", block_size=32, batch_size=3, iters=4, warmup=2)
    assert r["tokens_per_s"] == 4 * 3 * 32 / (4 * 0.25)
    assert shapes == [(3, 32)] * 6  # (batch_size, block_size), 2 warm-up steps and 4 timed


def test_measure_reports_the_peak_above_the_models_resident_baseline(clock, monkeypatch):
    """peak MiB above baseline = the process's peak resident memory after the last step minus its resident
    memory once the model exists (not minus the peak so far, which torch's import may have set). AdamW's
    moments, allocated at the first step, count above the baseline."""
    events = []
    readings = iter([(300.0, 400.0), (320.0, 450.0)])  # (resident, peak) MiB: before the steps, after

    def memory_mib():
        events.append("memory")
        return next(readings)

    class GPT(bench.GPT):
        def __init__(self, config):
            super().__init__(config)
            events.append("model")
    monkeypatch.setattr(bench, "memory_mib", memory_mib)
    monkeypatch.setattr(bench, "GPT", GPT)
    fake_steps(monkeypatch, clock, 1.0, events)
    r = bench.measure("attention", "sdpa", block_size=8, batch_size=1, iters=2, warmup=1)
    assert r["peak_mib"] == 450 - 300
    assert events == ["model", "memory", (1, 8), (1, 8), (1, 8), "memory"]


def test_memory_is_measured_on_linux_and_left_out_where_resource_is_missing(monkeypatch, clock):
    """On Windows `import resource` fails: bench.py imports and measures tokens/s; the table says '-'."""
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("not Linux")
    resident, _ = bench.memory_mib()
    x = torch.ones(16 * 2**20)  # 64 MiB, written
    resident_now, peak_now = bench.memory_mib()
    assert 63 < resident_now - resident < 66 and resident_now - 1 < peak_now < 100 * resident_now  # MiB, both
    del x
    monkeypatch.setitem(sys.modules, "resource", None)  # now `import resource` raises ImportError
    spec = importlib.util.spec_from_file_location("bench_on_windows", os.path.join(ROOT, "bench.py"))
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert bench.memory_mib() is None
    fake_steps(monkeypatch, clock, 1.0)
    best = {("attention", "sdpa", 8): bench.best_of([bench.measure("attention", "sdpa", 8, 2, iters=1)])}
    assert bench.ops_table(best)[2] == "| attention | sdpa | 8 | 16 | 1.000 | - | - |"


def test_each_measurement_process_measures_the_configuration_it_was_given(monkeypatch):
    """The code that measure_in_subprocess hands a fresh Python, run here instead: it measures the settings
    given, each in its place, and its result comes back as printed."""
    calls = []

    def measure(*args):
        calls.append(args)
        return {"tokens_per_s": 1.5, "peak_mib": 2.5}

    def run(argv, **kwargs):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(argv[argv.index("-c") + 1], {})  # its `import bench` finds this one, `measure` replaced
        return subprocess.CompletedProcess(argv, 0, out.getvalue(), "")
    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench.subprocess, "run", run)
    r = bench.measure_in_subprocess("mix", "materialized", 64, 3, 5)
    assert r == {"tokens_per_s": 1.5, "peak_mib": 2.5}
    assert calls == [("mix", "materialized", 64, 3, 5)]  # op, impl, block_size, batch_size, iters


def scripted(monkeypatch, results):
    """measure_in_subprocess replaced: the k-th measurement of (op, impl, block_size) gives results[...][k], a
    pair (tokens/s, peak MiB). Returns the list of calls, in order."""
    calls = []

    def measure(op, impl, block_size, batch_size, iters):
        k = calls.count((op, impl, block_size, batch_size, iters))
        calls.append((op, impl, block_size, batch_size, iters))
        tokens_per_s, peak_mib = results[op, impl, block_size][k]
        return {"tokens_per_s": tokens_per_s, "peak_mib": peak_mib}
    monkeypatch.setattr(bench, "measure_in_subprocess", measure)
    return calls


def test_ops_table_keeps_each_columns_best_repeat_and_divides_by_its_impls_attention(monkeypatch, capsys):
    """Best of 4: the highest tokens/s and the lowest peak, each from its own repeat (here neither the first
    nor the last); each × attention divides by the attention row of the same impl."""
    calls = scripted(monkeypatch, {
        ("attention", "sdpa", 16): [(100, 45), (300, 50), (200, 40), (250, 48)],
        ("mix", "sdpa", 16): [(90, 60), (270, 52), (180, 50), (200, 44)],
        ("attention", "materialized", 16): [(50, 90), (100, 80), (80, 85), (60, 88)],
        ("mix", "materialized", 16): [(40, 100), (80, 120), (95, 96), (60, 110)],
    })
    bench.main(["--ops=attention,mix", "--impls=sdpa,materialized", "--block_sizes=16", "--batch_size=2",
                "--iters=7", "--repeats=4"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(", batch 2, 7 steps, best of 4")
    assert out[1] == ("| op | impl | block_size | tokens/s | × attention | peak MiB above baseline "
                      "| × attention |")
    assert out[2:] == ["|---|---|---|---|---|---|---|",
                       "| attention | sdpa | 16 | 300 | 1.000 | 40.0 | 1.000 |",
                       "| mix | sdpa | 16 | 270 | 0.900 | 44.0 | 1.100 |",
                       "| attention | materialized | 16 | 100 | 1.000 | 80.0 | 1.000 |",
                       "| mix | materialized | 16 | 95 | 0.950 | 96.0 | 1.200 |"]
    one_round = [(op, impl, 16, 2, 7) for impl in ("sdpa", "materialized") for op in ("attention", "mix")]
    assert calls == one_round * 4  # in turns, so that a busy spell slows every configuration alike


def test_ops_ratios_divide_by_attention_at_the_same_block_size_or_say_there_is_none():
    best = {("attention", "sdpa", 128): {"tokens_per_s": 400.0, "peak_mib": 10.0},
            ("mix", "sdpa", 128): {"tokens_per_s": 380.0, "peak_mib": 11.0},
            ("attention", "sdpa", 256): {"tokens_per_s": 200.0, "peak_mib": 20.0},
            ("mix", "sdpa", 256): {"tokens_per_s": 150.0, "peak_mib": 30.0},
            ("mix", "materialized", 256): {"tokens_per_s": 1234.0, "peak_mib": 50.0}}
    assert bench.ops_table(best)[2:] == ["| attention | sdpa | 128 | 400 | 1.000 | 10.0 | 1.000 |",
                                         "| mix | sdpa | 128 | 380 | 0.950 | 11.0 | 1.100 |",
                                         "| attention | sdpa | 256 | 200 | 1.000 | 20.0 | 1.000 |",
                                         "| mix | sdpa | 256 | 150 | 0.750 | 30.0 | 1.500 |",
                                         "| mix | materialized | 256 | 1,234 | - | 50.0 | - |"]


@pytest.mark.parametrize("impls", ["triton", "sdpa,triton"])
def test_ops_checks_the_kernel_in_the_dtype_and_head_size_it_then_times(clock, monkeypatch, impls):
    """impl=triton, alone or beside others: before any timing, the fused kernel is checked against float64
    on the device, in the dtype (float32, no autocast) and at the head size of the steps then timed. The
    measurement processes run here; each fake step notes what it computes in."""
    pytest.importorskip("kernel", exc_type=ImportError)  # the demo model with impl=triton imports kernel.py
    events = []

    def check(device, dtype, head_size):
        events.append(("check", str(device), dtype, head_size))
        return "kernel check: passed"

    def step(model, opt, x):
        weights = next(model.parameters())
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else weights.dtype
        events.append(("time", weights.device.type, dtype, model.config.n_embd // model.config.n_head))
        clock.now += 1.0
    monkeypatch.setattr(bench, "check_kernel", check)
    monkeypatch.setattr(bench, "training_step", step)
    monkeypatch.setattr(bench, "measure_in_subprocess", bench.measure)
    bench.main(["--ops=mix", f"--impls={impls}", "--block_sizes=8", "--batch_size=1", "--iters=2",
                "--repeats=1"])
    assert events[0] == ("check", "cpu", torch.float32, 32)
    n = len(impls.split(","))  # configurations timed: warm-up and timed steps each
    assert events[1:] == [("time", "cpu", torch.float32, 32)] * (3 + 2) * n


def test_measure_keeps_freed_memory_as_train_py_does_on_a_cpu(clock, monkeypatch):
    events = []

    class GPT(bench.GPT):
        def __init__(self, config):
            super().__init__(config)
            events.append("model")
    monkeypatch.setattr(bench, "keep_freed_memory", lambda: events.append("kept"))
    monkeypatch.setattr(bench, "GPT", GPT)
    fake_steps(monkeypatch, clock, 1.0)
    bench.measure("attention", "sdpa", block_size=8, batch_size=1, iters=1, warmup=0)
    assert events == ["kept", "model"]


@pytest.mark.slow
def test_runs_from_any_working_directory(tmp_path):
    """`python /path/to/bench.py` from elsewhere: its measurement processes import the bench.py and model.py
    beside it, not the caller's."""
    for name in ("bench.py", "model.py"):
        (tmp_path / name).write_text("raise SystemExit(\"the caller's directory was imported from\")\n")
    argv = ["--ops=attention", "--block_sizes=8", "--batch_size=1", "--iters=1", "--repeats=1"]
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench.py"), *argv], cwd=tmp_path,
                       capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.splitlines()[-1].startswith("| attention | sdpa | 8 | "), p.stderr


# --- our training step against nanoGPT's ---------------------------------------------------------------


def test_nanogpt_table_keeps_each_contestants_best_repeat(clock, monkeypatch, stand_in_nanogpt, capsys):
    """Best of 3 interleaved repeats: each contestant's lowest ms per step (whichever repeat it came from),
    each divided by nanoGPT's lowest."""
    ms = {"nanoGPT": [40, 30, 35], "ours, op=attention": [33, 36, 29], "ours, op=mix": [31, 34, 32]}
    rounds = types.SimpleNamespace(k=0, last=None)

    def step(model, opt, x):
        """Costs ms[contestant][k] in round k; a round begins each time the steps come back to nanoGPT's."""
        name = f"ours, op={model.config.op}"
        if type(model).__module__ == "nanogpt_model":
            name = "nanoGPT"
        if name == "nanoGPT" and rounds.last != "nanoGPT":
            rounds.k += 1
        rounds.last = name
        clock.now += ms[name][rounds.k - 1] / 1000
    monkeypatch.setattr(bench, "training_step", step)
    best = bench.main(["--what=nanogpt", f"--nanogpt={stand_in_nanogpt}", "--repeats=3", "--iters=2"])
    assert rounds.k == 3
    assert best == pytest.approx({"nanoGPT": 30, "ours, op=attention": 29, "ours, op=mix": 31})
    assert capsys.readouterr().out.splitlines()[3:] == ["| nanoGPT | 30.00 | 1.000 |",
                                                        "| ours, op=attention | 29.00 | 0.967 |",
                                                        "| ours, op=mix | 31.00 | 1.033 |"]


@pytest.mark.slow
def test_nanogpt_comparison_runs_end_to_end(stand_in_nanogpt, capsys):
    """Real training steps (one timed repeat of one step each) against the stand-in, with the real clock."""
    best = bench.main(["--what=nanogpt", f"--nanogpt={stand_in_nanogpt}", "--repeats=1", "--iters=1"])
    out = capsys.readouterr().out.splitlines()
    glibc = platform.libc_ver()[0] == "glibc"
    assert out[0].endswith(f"batch 12, best of 1 interleaved repeats of 1 steps, freed memory kept: {glibc}")
    assert list(best) == ["nanoGPT", "ours, op=attention", "ours, op=mix"]
    assert all(ms > 0 for ms in best.values())
    assert out[3:] == [f"| {name} | {ms:.2f} | {ms / best['nanoGPT']:.3f} |" for name, ms in best.items()]


def test_a_nanogpt_that_cannot_train_is_refused_in_one_line_before_any_timing(clock, monkeypatch,
                                                                            stand_in_nanogpt, capsys):
    """Its training step is tried once first: an error there is one line, before any table is printed."""
    with open(stand_in_nanogpt, "a") as f:
        f.write("    def forward(self, idx, targets=None):\n"
                "        raise RuntimeError('mat1 and mat2 shapes cannot be multiplied')\n")
    assert one_line_error(bench.main, ["--what=nanogpt", f"--nanogpt={stand_in_nanogpt}"]) == (
        f"error: nanogpt={str(stand_in_nanogpt)!r} failed to train as nanoGPT's GPT does (RuntimeError): "
        "give the path of nanoGPT's model.py (github.com/karpathy/nanoGPT)")
    assert capsys.readouterr().out == "" and clock.now == 0


# --- a compiled GPT-2-small step on a GPU ---------------------------------------------------------------


def test_gpt2_step_measures_sdpa_alone_where_the_kernel_is_refused(monkeypatch, capsys):
    """Where the fused kernel passes its check, both impls are measured; where it is refused (a T4: sm_75),
    one line says impl=triton is skipped, and SDPA is measured. CUDA and the steps' timings are faked."""
    t4 = ("kernel check: the fused Triton kernel failed on cuda:0, bfloat16, head size 64: ValueError: "
          "mix_attention: the fused kernel needs an sm_80 or newer GPU, this is sm_75; use impl=sdpa")

    def on_a_t4(device, dtype, head_size):
        raise ValueError(t4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "gpt2_step_ms", {"triton": 30.0, "sdpa": 40.0}.get)
    monkeypatch.setattr(bench, "check_kernel", lambda device, dtype, head_size: "kernel check: passed")
    assert bench.main(["--what=gpt2_step"]) == {"triton": 30.0, "sdpa": 40.0}
    assert capsys.readouterr().out.splitlines()[-2:] == ["| impl=triton | 30.0 | 0.750 |",
                                                         "| impl=sdpa | 40.0 | 1.000 |"]
    monkeypatch.setattr(bench, "check_kernel", on_a_t4)
    assert bench.main(["--what=gpt2_step"]) == {"sdpa": 40.0}
    assert capsys.readouterr().out.splitlines() == [
        t4.removesuffix("; use impl=sdpa") + ": impl=triton is skipped",
        "| GPT-2 small step (B=8, T=1024, bf16, compiled) | ms | × sdpa |", "|---|---|---|",
        "| impl=sdpa | 40.0 | 1.000 |"]


def test_sample_tables_same_tokens_compares_the_cached_generation_with_the_full_forwards(monkeypatch):
    """A full forward that picks another last token: the row says False."""
    generate = GPT.generate

    def full_differs(model, idx, n, temperature=1.0, use_cache=True, **kwargs):
        out = generate(model, idx, n, temperature=temperature, use_cache=use_cache, **kwargs)
        return out if use_cache else torch.cat([out[:, :-1], (out[:, -1:] + 1) % 64], 1)
    monkeypatch.setattr(GPT, "generate", full_differs)
    monkeypatch.setattr(bench, "SAMPLE_MODELS", {"tiny": dict(n_layer=1, n_head=2, n_embd=16, vocab_size=64)})
    monkeypatch.setattr(bench, "SAMPLE_NEW_TOKENS", 4)
    assert bench.main(["--what=sample", "--repeats=1"])["tiny"]["same_tokens"] is False
