"""
Tests for train.py and sample.py: settings, a tiny end-to-end run of every op, the learning-rate schedule,
gradient accumulation, the γ projection, dropout seeding, exact resume (also after kill -9 at any moment),
eval_only, DDP with torchrun (gloo, 2 CPU processes) against one process, the NaN stops, GPT-2 fine-tuning
start, your own operator through train.py's settings, what a run logs and prints (and its speed), main's
one-line exits, and sampling. Bad inputs: test_bad_inputs.py.

    python -m pytest -q tests/test_train.py
"""
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from support import hardware
import train
from support.configurator import ConfigError, configure
from support.dataloader import unigram_loss
from support.hardware import pick_device_and_dtype
from model import GPT, GPTConfig
from operators import OPS, HeadOperator, register_op
from support.dataloader import get_tokenizer
from train import build_model, corridor_summary, get_lr, parse_config
from helpers import (QUICK, ROOT, TINY, char_dataset, read_log, run, run_argv, workdir,  # noqa: F401
                     write_shard)

def weights(path):
    return torch.load(path, weights_only=True)["model"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# --- settings -----------------------------------------------------------------------------------------------


def test_config_file_and_overrides(tmp_path):
    cfg = tmp_path / "x.py"
    cfg.write_text("import math\nop = 'laplacian'\nn_layer = 3\nlearning_rate = 1e-3\n")
    c, given = parse_config([str(cfg), "--n_layer=5", "--op=mix", "--gamma_min=0", "--compile=False",
                             "--out_dir=2024"])
    assert ((c.op, c.n_layer, c.learning_rate, c.gamma_min, c.compile, c.out_dir)
            == ("mix", 5, 1e-3, 0, False, "2024"))
    assert given == {"op", "n_layer", "learning_rate", "gamma_min", "compile", "out_dir"}
    # defaults: train.py's, the ops'
    assert (c.batch_size, c.gamma_init, c.laplacian_heads) == (12, 0.0, None)


def test_train_py_writes_out_the_model_settings_with_gptconfigs_values():
    """Every model setting is one of train.py's globals, with the value GPTConfig gives it (vocab_size is
    the data's, and the op's controls are operators.py's): a run given none builds GPTConfig's model."""
    model_settings = {f.name: f.default for f in dataclasses.fields(GPTConfig)
                      if f.name not in ("vocab_size", "controls")}
    assert {k: getattr(train, k) for k in model_settings} == model_settings
    cfg = parse_config([])[0]
    assert {k: getattr(cfg, k) for k in model_settings} == model_settings


def test_the_seed_decides_the_initial_weights_and_the_data_order(workdir):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):  # at learning rate 0 the weights stay the initial ones
        run(f"--seed={seed}", "--learning_rate=0", "--min_lr=0", "--max_iters=2", "--eval_interval=2",
            f"--out_dir=out/{name}")
    init = {name: weights(f"out/{name}/ckpt.pt")["lm_head.weight"] for name in "abc"}
    losses = {name: [r["loss"] for r in read_log(f"out/{name}", "train")] for name in "abc"}
    assert torch.equal(init["a"], init["b"]) and not torch.equal(init["a"], init["c"])
    assert losses["a"] == losses["b"] != losses["c"]


def test_evaluation_does_not_disturb_training(workdir):
    """Evaluating every step or only at the end: the same training batches, the same final weights."""
    often = run("--max_iters=4", "--eval_interval=1", "--out_dir=out/often")
    once = run("--max_iters=4", "--eval_interval=4", "--out_dir=out/once")
    assert ([r["loss"] for r in read_log("out/often", "train")]
            == [r["loss"] for r in read_log("out/once", "train")])
    assert all(torch.equal(p, q) for p, q in zip(often.state_dict().values(), once.state_dict().values()))


def test_learning_rate_schedule():
    c, _ = parse_config(["--learning_rate=1.0", "--min_lr=0.1", "--warmup_iters=4", "--max_iters=20",
                         "--lr_decay_iters=14"])
    assert [get_lr(it, c) for it in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.8])  # linear warmup
    assert get_lr(4, c) == pytest.approx(1.0)  # the peak, then cosine down to min_lr at lr_decay_iters
    assert get_lr(9, c) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: the cosine's middle
    assert get_lr(14, c) == pytest.approx(0.1) and get_lr(19, c) == pytest.approx(0.1)
    c.decay_lr = False
    assert get_lr(0, c) == get_lr(19, c) == 1.0


def test_learning_rate_decays_over_max_iters_unless_lr_decay_iters_is_given():
    c, _ = parse_config(["--learning_rate=1.0", "--min_lr=0.1", "--warmup_iters=0", "--max_iters=10"])
    assert get_lr(0, c) == pytest.approx(1.0)  # no warmup: the peak at once
    assert get_lr(5, c) == pytest.approx(0.55) and get_lr(10, c) == pytest.approx(0.1)  # min_lr at max_iters


def test_learning_rate_when_warmup_ends_where_decay_ends():
    """lr_decay_iters = warmup_iters leaves no cosine to divide by: warmup, peak, then min_lr (no crash)."""
    c, _ = parse_config(["--learning_rate=1.0", "--min_lr=0.1", "--warmup_iters=4", "--lr_decay_iters=4"])
    assert [get_lr(it, c) for it in range(7)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 0.1, 0.1])


@pytest.mark.parametrize("args, local_rank, cuda, sm, mps, picked", [
    (["--device=auto"], None, False, None, False, ("cpu", "float32")),  # float32 on CPU
    (["--device=cpu", "--dtype=bfloat16"], None, False, None, False, ("cpu", "bfloat16")),  # allowed on CPU
    (["--device=auto"], None, False, None, True, ("mps", "float32")),  # mps before cpu
    # cuda first, bf16 where the GPU computes it: sm_80 (A100) and newer
    (["--device=auto"], None, True, (8, 0), True, ("cuda", "bfloat16")),
    (["--device=cuda"], None, True, (9, 0), False, ("cuda", "bfloat16")),  # H100
    (["--device=cuda"], None, True, (12, 0), False, ("cuda", "bfloat16")),  # RTX 50x0
    # else fp16 (with a scaler): a T4 (sm_75) only emulates bf16, which torch's is_bf16_supported() counts
    (["--device=cuda"], None, True, (7, 5), False, ("cuda", "float16")),
    (["--device=cuda"], None, True, (7, 0), False, ("cuda", "float16")),  # V100
    (["--device=cuda"], 3, True, (8, 0), False, ("cuda:3", "bfloat16")),  # DDP: the process' own GPU
    (["--device=cuda"], 0, True, (8, 0), False, ("cuda:0", "bfloat16")),  # rank 0's too
    (["--device=cuda:1", "--dtype=float32"], None, True, (8, 0), False, ("cuda:1", "float32")),
])
def test_device_and_dtype_are_picked(monkeypatch, args, local_rank, cuda, sm, mps, picked):
    """The queries a GPU answers, forced: availability, count and each device's compute capability."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    def device_count():
        return 8 if cuda else 0  # cuda:3 is there
    monkeypatch.setattr(torch.cuda, "device_count", device_count)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: sm)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # torch's own
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert pick_device_and_dtype(parse_config(args)[0], local_rank) == picked


def test_one_gpu_named_for_every_torchrun_process_is_refused(monkeypatch):
    """--device=cuda:N under torchrun would put every process on GPU N (NCCL then fails in a traceback):
    each process takes cuda:LOCAL_RANK, as in nanoGPT."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    with pytest.raises(ConfigError, match=r"^device='cuda:0' under torchrun would put every process on one "
                                          r"GPU; use --device=cuda: each process takes cuda:LOCAL_RANK$"):
        pick_device_and_dtype(parse_config(["--device=cuda:0"])[0], 1)


def test_a_device_this_machine_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^device='mps' but this torch has no MPS or sees no such device; "
                                          r"use --device=cpu$"):
        pick_device_and_dtype(parse_config(["--device=mps"])[0], None)


def test_corridor_summary_counts_heads_strictly_inside():
    """γ = -1 and γ = 0 are the corridor's ends, not inside it; per layer: mean γ and mean δ."""
    gamma, delta = torch.tensor([[-1.0, -0.5], [0.0, -0.999]]), torch.tensor([[1.0, 2.0], [0.5, 0.5]])
    assert corridor_summary(gamma, delta) == ("corridor 2/4 heads in (-1,0) | "
                                              "L0:γ-0.75/δ1.50 L1:γ-0.50/δ0.50")


@pytest.mark.parametrize("vocab, padded", [(50257, 50304), (50256, 50256), (103, 103)])
def test_gpt2s_vocabulary_is_padded_to_a_multiple_of_64(vocab, padded):
    cfg, _ = parse_config(TINY)
    model_args = dict(n_layer=2, n_head=2, n_embd=32, block_size=32)
    model = build_model(cfg, model_args, {"tokenizer": "gpt2", "vocab_size": vocab}, None)
    assert model.config.vocab_size == model.lm_head.weight.shape[0] == padded


# --- end to end ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_tiny_run_of_every_op(workdir, op):
    out = f"out/{op}"
    run(f"--op={op}", "--max_iters=6", "--eval_interval=3", f"--out_dir={out}")
    records = read_log(out)
    evals, trains = read_log(out, "eval"), read_log(out, "train")
    assert records[0]["event"] == "start" and records[0]["iter"] == 0
    assert [r["iter"] for r in evals] == [0, 3, 6] and [r["iter"] for r in trains] == [1, 2, 3, 4, 5, 6]
    assert (records[-1]["event"] == "done"
            and records[-1]["best_val_loss"] == min(r["val_loss"] for r in evals[1:]))
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.3  # it learns something
    assert trains[-1]["tokens"] == 6 * 4 * 32
    assert [r["lr"] for r in trains[:3]] == pytest.approx([1e-3, 2e-3, 3e-3])  # warmup: what get_lr says
    gamma = torch.tensor(evals[-1]["gamma"])
    assert gamma.shape == (2, 2)
    assert gamma.eq(0).all() == (op == "attention")  # learned γ moved; laplacian heads sit at -1
    ckpt = torch.load(f"{out}/ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 6 and ckpt["model_args"]["op"] == op and ckpt["meta"]["tokenizer"] == "char"
    assert json.load(open(f"{out}/config.json"))["op"] == op


def test_logged_train_loss_is_the_mean_over_micro_steps(workdir):
    """At learning rate 0 nothing changes, so the logged training loss must match the evaluated one, with or
    without gradient accumulation (forgetting to divide by the micro-steps doubles the logged loss)."""
    for accum in (1, 2):
        out = f"out/accum{accum}"
        run("--learning_rate=0", "--min_lr=0", "--max_iters=4", "--eval_interval=4", "--eval_iters=8",
            f"--gradient_accumulation_steps={accum}", f"--out_dir={out}")
        logged = np.mean([r["loss"] for r in read_log(out, "train")])
        assert abs(logged - read_log(out, "eval")[-1]["train_loss"]) < 0.05


def test_a_run_records_and_prints_what_ran(workdir, capsys):
    run("--op=mix", "--max_iters=5", "--eval_interval=3", "--log_interval=2",
        "--gradient_accumulation_steps=2", "--out_dir=out/rec")
    start, done = read_log("out/rec")[0], read_log("out/rec")[-1]
    assert ((start["event"], start["iter"], start["device"], start["dtype"], start["world_size"],
             start["torch"]) == ("start", 0, "cpu", "float32", 1, torch.__version__) and "commit" in start)
    evals = read_log("out/rec", "eval")
    # 2 × 4 × 32 per iter
    assert [(r["iter"], r["tokens"]) for r in evals] == [(0, 0), (3, 3 * 256), (5, 5 * 256)]
    # every log_interval, and the last one
    assert [r["iter"] for r in read_log("out/rec", "train")] == [2, 4, 5]
    assert (done["event"], done["iter"]) == ("done", 5)
    out = capsys.readouterr().out
    assert ("device cpu, dtype float32, 1 process(es), 256 tokens per iteration, 0.03M parameters, op=mix"
            in out)
    assert f"unigram baseline: val loss {unigram_loss('data/pydocs', 103):.4f} (context-free" in out
    # no torch.compile on CPU
    assert out.count("saved checkpoint to out/rec/ckpt.pt") == 2 and "compiling" not in out
    assert f"step 5: train loss {evals[-1]['train_loss']:.4f}, val loss {evals[-1]['val_loss']:.4f} " \
        f"({evals[-1]['val_bpb']:.4f} bits/byte) | corridor " in out
    assert out.rstrip().endswith(corridor_summary(*torch.tensor([evals[-1]["gamma"], evals[-1]["delta"]])))


def test_speed_is_per_iteration_and_leaves_evaluation_out(workdir, monkeypatch, capsys):
    """On a clock where a step takes 0.5 s, an evaluation's forward pass 10 s and the first training forward
    100 s (compiling, tuning the kernel), every logged iteration took 500 ms and 2 × 4 × 32 tokens / 0.5 s =
    512 tokens/s, whatever log_interval is and wherever evaluations fall."""
    clock, step, forward, compiled = [1000.0], torch.optim.AdamW.step, GPT.forward, []

    def timed_step(self, *args, **kwargs):
        clock[0] += 0.5
        return step(self, *args, **kwargs)

    def timed_forward(self, idx, targets=None):
        if not self.training:
            clock[0] += 10.0
        elif not compiled:  # the first training forward compiles
            clock[0] += 100.0
            compiled.append(True)
        return forward(self, idx, targets)
    monkeypatch.setattr(torch.optim.AdamW, "step", timed_step)
    monkeypatch.setattr(GPT, "forward", timed_forward)
    monkeypatch.setattr(train, "time", SimpleNamespace(time=lambda: clock[0]))  # train.py's clock only
    run("--max_iters=5", "--eval_interval=3", "--log_interval=2", "--gradient_accumulation_steps=2",
        "--out_dir=out/speed")
    trains = read_log("out/speed", "train")
    assert [r["iter"] for r in trains] == [2, 4, 5]
    assert [(r["ms_per_iter"], r["tokens_per_s"], r["mfu"]) for r in trains] == [(500.0, 512.0, None)] * 3
    assert "500.0 ms/iter, 512 tok/s\n" in capsys.readouterr().out  # no MFU on a CPU


def test_a_cpu_run_keeps_the_memory_a_step_frees(workdir, monkeypatch):
    calls = []
    monkeypatch.setattr(hardware, "keep_freed_memory", lambda: calls.append("kept"))
    run("--max_iters=1", "--out_dir=out/keep")
    assert calls == ["kept"]


def test_gradients_are_clipped_before_the_step(workdir, monkeypatch):
    norms, step = [], torch.optim.AdamW.step

    def recording_step(self, *args, **kwargs):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
        return step(self, *args, **kwargs)
    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    run("--grad_clip=0.01", "--max_iters=3", "--eval_interval=3", "--out_dir=out/clip")
    assert len(norms) == 3 and max(norms) <= 0.01 * (1 + 1e-5)
    run("--grad_clip=0", "--max_iters=3", "--eval_interval=3", "--out_dir=out/noclip")  # 0: not clipped
    assert min(norms[3:]) > 0.1


def test_gamma_min_is_kept_by_the_training_loop(workdir):
    free = run("--op=mix", "--max_iters=8", "--eval_interval=8", "--out_dir=out/free")
    assert (free.gamma_delta()[0] < 0).any()  # left alone, some heads move into the corridor ...
    model = run("--op=mix", "--gamma_min=0.0", "--max_iters=8", "--eval_interval=8", "--out_dir=out/nonneg")
    assert (model.gamma_delta()[0] >= 0).all()  # ... which the projection after every step forbids
    assert all((torch.tensor(r["gamma"]) >= 0).all() for r in read_log("out/nonneg", "eval"))


def test_dropout_draws_new_masks_every_step(workdir):
    """Every window of a one-token corpus is the same batch; at learning rate 0 the losses of successive steps
    differ only through their dropout masks, which must change from step to step."""
    os.makedirs("data/same")
    for split, n in (("val", 0), ("train", 1)):
        write_shard(f"data/same/same_{split}_00000{n}.bin", np.full(2000, 7))
    json.dump({"name": "same", "tokenizer": "byte", "vocab_size": 256}, open("data/same/meta.json", "w"))
    for dropout in (0.0, 0.2):
        out = f"out/d{dropout}"
        run("--dataset=same", f"--dropout={dropout}", "--learning_rate=0", "--min_lr=0", "--max_iters=4",
            "--eval_interval=4", f"--out_dir={out}")
        losses = [r["loss"] for r in read_log(out, "train")]
        assert (len(set(losses)) == 1) == (dropout == 0.0), losses


def test_resume_is_exact(workdir):
    common = ["--op=mix", "--dropout=0.1", "--lr_decay_iters=8", "--eval_interval=4",
              "--gradient_accumulation_steps=2"]
    straight = run(*common, "--max_iters=8", "--out_dir=out/straight")
    run(*common, "--max_iters=4", "--out_dir=out/halves")
    with open("out/halves/log.jsonl", "a") as f:  # what a crash after the checkpoint leaves behind
        f.write(json.dumps({"event": "train", "iter": 5, "loss": 9.9}) + '\n{"event": "tr')
    resumed = run(*common, "--max_iters=8", "--out_dir=out/halves", "--init_from=resume")
    assert_same_weights(straight.state_dict(), resumed.state_dict())
    log = read_log("out/halves")
    assert [r["iter"] for r in log if r["event"] == "eval"] == [0, 4, 8]  # no repeated evaluation at iter 4
    # one history, crash leftovers gone
    assert [r["iter"] for r in log if r["event"] == "train"] == list(range(1, 9))
    assert [r["event"] for r in log].count("done") == 1 and 9.9 not in [r.get("loss") for r in log]
    assert [r["iter"] for r in log if r["event"] == "start"] == [0, 4]


KILL_ARGS = TINY + ["--op=mix", "--dropout=0.1", "--max_iters=12", "--eval_interval=3", "--log_interval=1"]
# run train.py in a subprocess; KILL_IN_SAVE kills it (SIGKILL) half way through writing its second checkpoint
# (a resume held once it has read ckpt.pt, until the file HOLD_AFTER_READ.go appears)
RUNNER = """
import os, signal, sys, time
sys.path.insert(0, {here!r})
import torch, train
if os.environ.get("HOLD_AFTER_READ"):
    real_load, hold = torch.load, os.environ["HOLD_AFTER_READ"]
    def load(*args, **kwargs):
        ckpt = real_load(*args, **kwargs)
        open(hold + ".read", "w").close()
        while not os.path.exists(hold + ".go"):
            time.sleep(0.01)
        return ckpt
    torch.load = load
if os.environ.get("KILL_IN_SAVE"):
    real_save, saves = torch.save, []
    def save(obj, f, *args, **kwargs):
        saves.append(f)
        if len(saves) == 2:
            real_save(obj, f, *args, **kwargs)  # f: the temporary file atomic_write opened
            f.truncate(f.tell() // 2)
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        real_save(obj, f, *args, **kwargs)
    torch.save = save
train.main(sys.argv[1:])
"""


def train_process(out, *extra, env=None):
    """train.py in a process of its own, with Python's default Ctrl-C (SIGINT) as in a shell."""
    args = [sys.executable, "-c", RUNNER.format(here=ROOT), *KILL_ARGS, f"--out_dir={out}", *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def kill_when(p, ready, sig=signal.SIGKILL, timeout=60):
    """Send process p sig (kill -9) as soon as ready() holds, and wait for it to end."""
    start = time.time()
    while not ready() and p.poll() is None and time.time() - start < timeout:
        time.sleep(0.01)
    p.send_signal(sig)
    p.wait()


def finish_after_kill(out):
    """What a user does after a crash: resume when there is a checkpoint, else start again."""
    resume = ["--init_from=resume"] if os.path.exists(f"{out}/ckpt.pt") else []
    p = train_process(out, *resume)
    assert p.wait() == 0, p.stderr.read()[-2000:]
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


@pytest.mark.slow
def test_kill_9_at_any_moment_then_resume_is_bit_exact(workdir):
    p = train_process("out/straight")
    assert p.wait() == 0, p.stderr.read()[-2000:]
    straight = weights("out/straight/ckpt.pt")
    def logged(out, text):
        return os.path.exists(f"{out}/log.jsonl") and text in open(f"{out}/log.jsonl").read()
    kill_when(train_process("out/startup"), lambda: os.path.exists("out/startup/lock"))  # during start-up
    kill_when(train_process("out/mid"), lambda: logged("out/mid", '"iter": 7,'))  # mid-training
    p = train_process("out/save", env={"KILL_IN_SAVE": "1"})  # inside the second checkpoint save
    p.wait()
    assert (p.returncode == -signal.SIGKILL
            and torch.load("out/save/ckpt.pt", weights_only=True)["iter_num"] == 3)
    for out in ("out/startup", "out/mid", "out/save"):
        finish_after_kill(out)
        assert_same_weights(straight, weights(f"{out}/ckpt.pt"))
        evals = [r["iter"] for r in read_log(out, "eval")]
        assert evals == sorted(set(evals)) and evals[-1] == 12  # one history: no iteration logged twice


@pytest.mark.slow
def test_two_resumes_of_one_run_never_both_train(workdir):
    """A resume is held just after it has read ckpt.pt while a second resume of the run starts and ends: only
    one of them trains from that checkpoint (here the second is refused: the first holds out_dir's lock),
    never both, the one's finished work replaced by the other's."""
    assert train_process("out/r", "--max_iters=3").wait() == 0
    held = train_process("out/r", "--init_from=resume", "--max_iters=6", env={"HOLD_AFTER_READ": "hold"})
    start = time.time()
    while not os.path.exists("hold.read") and held.poll() is None and time.time() - start < 60:
        time.sleep(0.01)
    assert os.path.exists("hold.read"), held.communicate()
    other = train_process("out/r", "--init_from=resume", "--max_iters=6")
    _, other_err = other.communicate()
    open("hold.go", "w").close()
    _, held_err = held.communicate()
    assert held.returncode == 0, held_err[-2000:]
    assert other.returncode == 1 and other_err.endswith(
        f"error: out/r is in use by another run (process {held.pid}); wait for it to finish or choose "
        "another --out_dir\n"), other_err[-2000:]
    assert [r["iter"] for r in read_log("out/r", "start")] == [0, 3]  # one resume from iter 3
    assert read_log("out/r")[-1]["event"] == "done"


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT])
def test_a_resume_stopped_before_its_first_checkpoint_leaves_the_checkpoints_record(workdir, stop):
    """A resume (at other settings) stopped while it trains towards its first checkpoint: config.json still
    holds the settings ckpt.pt was trained with; the next resume's log holds one start per resume whose work
    ckpt.pt holds, never the stopped one's, and it ends bit-exact with a run that was never stopped."""
    for out in ("out/straight", "out/r"):
        assert train_process(out, "--max_iters=6").wait() == 0
    assert train_process("out/straight", "--init_from=resume").wait() == 0
    config = open("out/r/config.json").read()
    p = train_process("out/r", "--init_from=resume", "--learning_rate=0.01")
    kill_when(p, lambda: '"iter": 7,' in open("out/r/log.jsonl").read(), stop)  # trained on from iter 6
    if stop == signal.SIGINT:
        assert p.returncode == 1 and p.stderr.read().endswith(
            "interrupted: continue from the last checkpoint with --init_from=resume (same --out_dir)\n")
    assert open("out/r/config.json").read() == config
    finish_after_kill("out/r")
    assert_same_weights(weights("out/straight/ckpt.pt"), weights("out/r/ckpt.pt"))
    assert [(r["iter"], r["changed"]) for r in read_log("out/r", "start")] == [(0, {}), (6, {"max_iters": 6})]
    assert [r["iter"] for r in read_log("out/r", "train")] == list(range(1, 13))
    assert json.load(open("out/r/config.json")) == json.load(open("out/straight/config.json")) | {
        "out_dir": "out/r"}


def test_a_resume_that_diverges_leaves_config_json_and_one_history(workdir):
    """The same for a resume whose loss turns NaN (one line, ckpt.pt kept): config.json keeps the settings of
    ckpt.pt, and the next resume's log has no trace of the attempt."""
    run("--max_iters=4", "--eval_interval=4", "--out_dir=out/r")
    config = open("out/r/config.json").read()
    with pytest.raises(FloatingPointError, match="the last good checkpoint out/r/ckpt.pt is untouched"):
        run("--init_from=resume", "--max_iters=8", "--learning_rate=1e6", "--grad_clip=0.0",
            "--out_dir=out/r")
    assert open("out/r/config.json").read() == config
    run("--init_from=resume", "--max_iters=8", "--out_dir=out/r")
    assert [r["iter"] for r in read_log("out/r", "start")] == [0, 4]
    assert [r["iter"] for r in read_log("out/r", "train")] == list(range(1, 9))
    assert json.load(open("out/r/config.json"))["max_iters"] == 8


def test_a_resume_records_what_it_changed_in_its_start_record(workdir, capsys):
    run("--max_iters=2", "--eval_interval=2", "--out_dir=out/c")
    capsys.readouterr()
    run("--init_from=resume", "--max_iters=4", "--seed=7", "--learning_rate=1e-3", "--out_dir=out/c")
    assert [r["changed"] for r in read_log("out/c", "start")] == [
        {}, {"learning_rate": 3e-3, "max_iters": 2, "seed": 1337}]  # the values before the resume
    assert ("resumed with settings changed from the checkpoint's: learning_rate=0.001 (was 0.003), "
            "max_iters=4 (was 2), seed=7 (was 1337)") in capsys.readouterr().out


def test_eval_only_evaluates_the_checkpoint_and_changes_nothing(workdir, capsys):
    run("--max_iters=4", "--eval_interval=4", "--out_dir=out/e")
    files = {f: open(f"out/e/{f}", "rb").read() for f in os.listdir("out/e")}
    last = read_log("out/e", "eval")[-1]
    capsys.readouterr()
    for extra in ([], ["--init_from=resume"], ["--compile=True"]):  # evaluation runs the model uncompiled
        run("--max_iters=4", "--eval_only=True", "--out_dir=out/e", *extra)
        out = capsys.readouterr().out
        assert f"step 4: train loss {last['train_loss']:.4f}, val loss {last['val_loss']:.4f}" in out
        assert "compiling" not in out
        assert {f: open(f"out/e/{f}", "rb").read() for f in os.listdir("out/e")} == files


def test_resume_keeps_the_runs_settings_unless_given(workdir):
    run("--max_iters=2", "--eval_interval=2", "--learning_rate=1e-4", "--batch_size=2", "--seed=5",
        "--out_dir=out/k")
    # nothing else given
    run_argv(["--init_from=resume", "--max_iters=4", "--out_dir=out/k"])
    config = json.load(open("out/k/config.json"))
    assert ((config["learning_rate"], config["batch_size"], config["seed"], config["n_layer"])
            == (1e-4, 2, 5, 2))
    assert [r["tokens"] for r in read_log("out/k", "train")] == [64 * i for i in (1, 2, 3, 4)]
    run_argv(["--init_from=resume", "--max_iters=5", "--out_dir=out/k", "--batch_size=4"])
    assert json.load(open("out/k/config.json"))["batch_size"] == 4  # what is given wins
    assert read_log("out/k", "train")[-1]["tokens"] == 4 * 64 + 128  # tokens seen, not iter × today's batch


def test_resume_refuses_a_different_model_and_config_json_says_what_ran(workdir):
    cfg_file = workdir / "small.py"
    cfg_file.write_text("n_layer = 2\nop = 'mix'\n")
    run(str(cfg_file), "--max_iters=2", "--eval_interval=2", "--out_dir=out/r")
    with pytest.raises(ValueError, match="n_layer=6 differs from the checkpoint's 2"):
        run("--n_layer=6", "--init_from=resume", "--max_iters=4", "--out_dir=out/r")
    with pytest.raises(ValueError, match="laplacian_heads is not a control of the checkpoint's op='mix'"):
        run("--laplacian_heads=1", "--init_from=resume", "--max_iters=4", "--out_dir=out/r")
    # the last one wins
    run("--n_layer=12", "--init_from=resume", "--max_iters=4", "--out_dir=out/r", "--n_layer=2")
    # the same model
    run("--init_from=resume", "--max_iters=6", "--out_dir=out/r", "--n_head=2", "--dropout=0.1")
    config = json.load(open("out/r/config.json"))
    assert (config["n_layer"], config["n_head"], config["dropout"], config["max_iters"]) == (2, 2, 0.1, 6)
    assert config["init_from"] == "scratch"  # how the run began; the log's start records show the resumes


def test_resume_takes_a_control_given_that_means_the_saved_one(workdir):
    """A laplacian run saved with laplacian_heads=None (half its heads): given 1 on its 2 heads, the model is
    the same and the resume runs; given 2, it is another model, refused with what None means."""
    run("--op=laplacian", "--max_iters=2", "--eval_interval=2", "--out_dir=out/l")
    run("--laplacian_heads=1", "--init_from=resume", "--max_iters=4", "--out_dir=out/l")
    assert read_log("out/l", "start")[-1]["changed"] == {"max_iters": 2}
    refusal = ("^laplacian_heads=2 differs from the checkpoint's None, which means 1 on its 2 heads; "
               "its model is fixed, drop that setting$")
    with pytest.raises(ValueError, match=refusal):
        run("--laplacian_heads=2", "--init_from=resume", "--max_iters=6", "--out_dir=out/l")


def test_resume_refuses_another_alphabet_of_the_same_size(workdir):
    """Same tokenizer, same vocab_size, other characters: every token id would mean another character."""
    char_dataset("abc", "abc")
    char_dataset("xyz", "xyz")
    char_dataset("abc_copy", "abc")  # another name, the same vocabulary
    run("--dataset=abc", "--max_iters=2", "--eval_interval=2", "--out_dir=out/c")
    with pytest.raises(ConfigError, match=r"^dataset 'xyz' is not the one the checkpoint was trained on "
                                          r"\(another tokenizer or vocabulary\); use --dataset=abc$"):
        run("--dataset=xyz", "--init_from=resume", "--max_iters=4", "--out_dir=out/c")
    run("--dataset=abc_copy", "--init_from=resume", "--max_iters=4", "--out_dir=out/c")
    assert torch.load("out/c/ckpt.pt", weights_only=True)["meta"]["chars"] == "abc"
    run("--dataset=abc", "--max_iters=2", "--eval_interval=2", "--out_dir=out/d")
    shutil.rmtree("data/abc")  # prepared again under its own name, with a larger alphabet
    char_dataset("abc", "abcd")
    fix = r"; prepare it again as it was when the run began, or start a new run in another --out_dir$"
    with pytest.raises(ConfigError, match=r"not the one the checkpoint was trained on .*" + fix):
        run("--dataset=abc", "--init_from=resume", "--max_iters=4", "--out_dir=out/d")  # not --dataset=abc


def test_resume_keeps_the_best_val_loss_and_the_token_count(workdir):
    """At learning rate 0 the resumed run's val loss equals the checkpoint's best: no improvement, no save."""
    common = ["--learning_rate=0", "--min_lr=0", "--eval_interval=2", "--always_save_checkpoint=False",
              "--out_dir=out/b"]
    run(*common, "--max_iters=2")
    best = torch.load("out/b/ckpt.pt", weights_only=True)["best_val_loss"]
    run(*common, "--max_iters=4", "--init_from=resume")
    assert torch.load("out/b/ckpt.pt", weights_only=True)["iter_num"] == 2
    evals = read_log("out/b", "eval")
    assert ([(r["iter"], r["tokens"]) for r in evals] == [(0, 0), (2, 256), (4, 512)]
            and evals[-1]["val_loss"] == best)
    assert read_log("out/b", "done")[-1]["best_val_loss"] == best


def test_a_moved_run_resumes_where_it_now_is(workdir):
    """out_dir is where the run is today, never the one in its checkpoint's settings."""
    run("--max_iters=2", "--eval_interval=2", "--out_dir=out/old")
    os.rename("out/old", "out/run")  # train.py's default out_dir
    run_argv(TINY + ["--max_iters=4", "--eval_interval=2", "--init_from=resume"])
    assert not os.path.exists("out/old")
    assert torch.load("out/run/ckpt.pt", weights_only=True)["iter_num"] == 4
    assert json.load(open("out/run/config.json"))["out_dir"] == "out/run"


@pytest.mark.parametrize("always", [True, False])
def test_checkpoint_is_saved_always_or_only_when_val_improves(workdir, always):
    """At learning rate 0 the val loss never improves after the first evaluation."""
    run("--learning_rate=0", "--min_lr=0", "--max_iters=6", "--eval_interval=2",
        f"--always_save_checkpoint={always}", "--out_dir=out/a")
    assert torch.load("out/a/ckpt.pt", weights_only=True)["iter_num"] == (6 if always else 2)


def test_best_val_loss_stays_the_best_when_every_evaluation_saves(workdir):
    run("--learning_rate=0.1", "--max_iters=8", "--eval_interval=1", "--always_save_checkpoint=True",
        "--out_dir=out/a")
    val = [r["val_loss"] for r in read_log("out/a", "eval")]
    assert min(val) < val[-1]  # at this learning rate the loss jumps after iter 2: the last is not the best
    assert torch.load("out/a/ckpt.pt", weights_only=True)["best_val_loss"] == min(val)


def test_the_last_iteration_is_always_evaluated_and_saved(workdir):
    run("--max_iters=5", "--eval_interval=2", "--out_dir=out/a")  # 5 is no multiple of 2
    assert [r["iter"] for r in read_log("out/a", "eval")] == [0, 2, 4, 5]
    assert torch.load("out/a/ckpt.pt", weights_only=True)["iter_num"] == 5


def test_nan_stops_and_keeps_last_good_checkpoint(workdir, monkeypatch):
    lr = train.get_lr
    def explodes_at_iter_4(it, c):
        if it < 4:
            return lr(it, c)
        return 1e30
    monkeypatch.setattr(train, "get_lr", explodes_at_iter_4)
    with pytest.raises(FloatingPointError, match=r"the training loss became (nan|inf) at iter \d+; stopping "
                                                 r"\(the last good checkpoint out/nan/ckpt.pt is untouched"):
        run("--max_iters=20", "--eval_interval=2", "--grad_clip=0", "--out_dir=out/nan")
    ckpt = torch.load("out/nan/ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 4 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_nan_in_the_validation_loss_alone_stops_too(workdir, monkeypatch):
    forward = GPT.forward
    def nan_in_evaluation(self, idx, targets=None):
        if self.training:
            return forward(self, idx, targets)
        return None, torch.tensor(float("nan"))
    monkeypatch.setattr(GPT, "forward", nan_in_evaluation)
    with pytest.raises(FloatingPointError,
                       match="the validation loss became nan at iter 0; stopping .no checkpoint"):
        run("--max_iters=4", "--eval_interval=2", "--out_dir=out/vnan")


def test_a_process_on_a_second_node_takes_its_gpu_from_local_rank(monkeypatch):
    """Node 2 of 2, GPU 1 of 2 (queries forced): RANK 3 of 4 says which share of the data, LOCAL_RANK 1 which
    GPU; CUDA's current device is set to it before the group starts."""
    for k, v in dict(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # autocast's
    current = []
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(hardware, "join_group", lambda run: current.append(f"joined as rank {run.rank}"))
    run = hardware.start_process(parse_config(["--device=cuda"])[0])
    assert (run.rank, run.local_rank, run.world_size, run.dev, run.dtype) == (3, 1, 4, "cuda:1", "bfloat16")
    assert current == ["cuda:1", "joined as rank 3"] and run.ddp and not run.master


@pytest.mark.parametrize("dev, backend, device_id", [("cuda:1", "nccl", torch.device("cuda:1")),
                                                     ("cpu", "gloo", None)])
def test_nccl_is_bound_to_the_process_gpu_when_the_group_starts(monkeypatch, dev, backend, device_id):
    """NCCL gets device_id, so that the communicator forms (and fails, in join_group's one line) at once,
    not at the first collective; gloo gets none."""
    calls = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: calls.append((a, k)))
    hardware.join_group(hardware.Run(rank=3, local_rank=1, world_size=4, dev=dev, dtype="float32"))
    assert calls == [((backend,), dict(rank=3, world_size=4, device_id=device_id))]


@pytest.fixture
def group_of_one(monkeypatch):
    """What torchrun sets for a DDP run of one process (gloo, here); no group is left to the next test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    torchrun_sets = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    for k, v in torchrun_sets.items():
        monkeypatch.setenv(k, v)
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("stop", ["error", "Ctrl-C", "finished"])
def test_every_exit_leaves_the_ddp_group(workdir, group_of_one, monkeypatch, stop):
    """Once the group has started, main leaves it at every exit, error or not: torch warns on every rank
    otherwise (gloo does not, so the test watches the call)."""
    destroy, left = torch.distributed.destroy_process_group, []
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: left.append(destroy()))
    def ctrl_c(dataset):
        raise KeyboardInterrupt
    if stop == "Ctrl-C":
        monkeypatch.setattr(train, "ensure_prepared", ctrl_c)
    argv = QUICK + ["--dataset=nothing_here" if stop == "error" else "--out_dir=out/ddp"]
    try:
        train.main(argv)
    except SystemExit as e:
        assert e.code.startswith({"error": "error: dataset data/nothing_here", "Ctrl-C": "interrupted"}[stop])
    assert left == [None] and not torch.distributed.is_initialized()


def test_ddp_needs_accumulation_steps_divisible_among_the_processes(workdir, monkeypatch):
    class Started(Exception):
        pass

    def join_group(run):
        raise Started(f"{run.device_type}, rank {run.rank} of {run.world_size}")
    monkeypatch.setattr(hardware, "join_group", join_group)
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")):  # what torchrun sets, 2 processes
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=r"^gradient_accumulation_steps=3 must be a multiple of the number "
                                          r"of processes \(2\)$"):
        run("--gradient_accumulation_steps=3", "--max_iters=1", "--out_dir=out/ddp")
    # 4 = 2 × 2: accepted, the group starts (gloo on CPU)
    with pytest.raises(Started, match="^cpu, rank 0 of 2$"):
        run("--gradient_accumulation_steps=4", "--max_iters=1", "--out_dir=out/ddp")
    assert not os.path.exists("out/ddp")


@pytest.mark.parametrize("rank, code", [(None, "error: max_iters=0 is not allowed: it must be ≥ 1"),
                                        ("0", "error: max_iters=0 is not allowed: it must be ≥ 1"),
                                        # under torchrun every failing rank says why, with its rank
                                        ("1", "error: rank 1: max_iters=0 is not allowed: it must be ≥ 1"),
                                        ("3", "error: rank 3: max_iters=0 is not allowed: it must be ≥ 1")])
def test_main_says_a_bad_setting_in_one_line(monkeypatch, rank, code):
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit) as e:
        train.main(["--max_iters=0"])
    assert e.value.code == code


def test_main_on_ctrl_c_says_how_to_continue(workdir, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(train, "train", interrupted)
    with pytest.raises(SystemExit) as e:
        train.main(["--max_iters=2"])
    assert e.value.code.startswith("interrupted before any checkpoint was written")  # none in out/run


def test_main_stops_a_nan_with_one_line_before_saving_it(workdir, monkeypatch):
    """The command line's path: a NaN is an `error: ...` line, not a traceback; a NaN validation loss at the
    first evaluation that would save is never saved."""
    forward, trained = GPT.forward, []

    def nan_after_the_first_evaluation(self, idx, targets=None):
        if self.training:
            trained.append(1)
        elif len(trained) > 1:  # an evaluation after some training (the first is the warm-up's): iter 2's
            return None, torch.tensor(float("nan"))
        return forward(self, idx, targets)
    monkeypatch.setattr(GPT, "forward", nan_after_the_first_evaluation)
    with pytest.raises(SystemExit) as e:
        train.main(TINY + ["--max_iters=4", "--eval_interval=2", "--out_dir=out/nan"])
    assert e.value.code == ("error: the validation loss became nan at iter 2; stopping (no checkpoint was "
                            "written). Try a lower learning_rate, grad_clip=1.0 or dtype=bfloat16/float32.")
    assert not os.path.exists("out/nan/ckpt.pt")
    assert [r["iter"] for r in read_log("out/nan", "eval")] == [0, 2]  # the NaN evaluation is in the log


# --- the fused kernel: asked for with impl=triton, checked against float64 before the first step ------------


def test_a_run_with_the_fused_kernel_checks_it_before_its_first_step(workdir, capsys, kernel_device):
    """On the GPU, or in the Triton interpreter on a CPU (conftest.py): one line says the check passed,
    before any training step; then the run trains."""
    run("--impl=triton", "--max_iters=2", "--eval_interval=2", "--val_tokens=256", "--eval_iters=1",
        "--out_dir=out/k", f"--device={kernel_device}", "--dtype=float32")  # the interpreter is slow: small
    out = capsys.readouterr().out
    assert out.index("kernel check: ") < out.index("iter 1:")
    assert "float32, head size 16" in out.split("kernel check: ")[1].splitlines()[0]
    assert [r["iter"] for r in read_log("out/k", "train")] == [1, 2]


def test_a_kernel_one_percent_off_stops_the_run_before_anything_is_written(workdir, monkeypatch,
                                                                          kernel_device):
    """A planted 1% error in the kernel's forward output: one line naming device, dtype and head size, no
    traceback, no step, no run directory."""
    import kernel
    right = kernel.mix_attention
    monkeypatch.setattr(kernel, "mix_attention", lambda *args, **kw: 1.01 * right(*args, **kw))
    steps = []
    monkeypatch.setattr(train, "log_train", lambda *args, **record: steps.append(record))
    with pytest.raises(SystemExit) as e:
        train.main(TINY + ["--impl=triton", "--max_iters=2", "--out_dir=out/k", f"--device={kernel_device}",
                           "--dtype=float32"])
    line = str(e.value.code)
    assert line.startswith("error: ") and "\n" not in line and "float32, head size 16: out error 1" in line
    assert steps == [] and not os.path.exists("out/k")


@pytest.mark.parametrize("resumed", [False, True])
def test_a_resumed_run_is_checked_as_a_new_one(workdir, monkeypatch, resumed, kernel_device):
    """The set-up checks a run that continues a checkpoint as it checks a new one: settings that must agree,
    the model's settings (GPTConfig), and the fused kernel against float64 (here planted 1% off), each in one
    line before any step; the run directory is as it was."""
    import kernel
    device = [f"--device={kernel_device}", "--dtype=float32"]  # the kernel on the GPU, or in the interpreter
    if resumed:
        run("--max_iters=2", "--eval_interval=2", "--out_dir=out/r", *device)
    before = {f: open(f"out/r/{f}", "rb").read() for f in os.listdir("out/r")} if resumed else {}
    args = TINY + ["--max_iters=4", "--out_dir=out/r", *device] + (["--init_from=resume"] if resumed else [])
    right = kernel.mix_attention
    monkeypatch.setattr(kernel, "mix_attention", lambda *a, **kw: 1.01 * right(*a, **kw))
    for given, says in ((["--save_every=3", "--eval_interval=2"], "save_every=3 must be a multiple of "),
                        (["--impl=triton", "--dropout=0.1"], "impl='triton' is not allowed: the fused kernel "
                                                             "has no attention dropout"),
                        (["--impl=triton"], "kernel check: the fused Triton kernel failed on ")):
        with pytest.raises(SystemExit) as e:
            train.main(args + given)
        assert str(e.value.code).startswith("error: " + says), e.value.code
    assert "float32, head size 16: out error" in str(e.value.code)  # the planted 1%, in the run's dtype
    after = {f: open(f"out/r/{f}", "rb").read() for f in os.listdir("out/r")} if resumed else {}
    assert after == before and os.path.exists("out/r") == resumed


def test_a_checkpoint_saved_with_impl_auto_resumes_as_sdpa_and_says_so(workdir, capsys):
    """impl='auto' is gone: a run saved with it continues with impl='sdpa' (the default), and prints that."""
    run("--max_iters=2", "--eval_interval=2", "--out_dir=out/old")
    ckpt = torch.load("out/old/ckpt.pt", weights_only=True)
    ckpt["config"]["impl"] = ckpt["model_args"]["impl"] = "auto"
    torch.save(ckpt, "out/old/ckpt.pt")
    capsys.readouterr()
    run_argv(["--init_from=resume", "--max_iters=4", "--out_dir=out/old"])
    out = capsys.readouterr().out
    assert "resumed with settings changed from the checkpoint's: impl='sdpa' (was 'auto')" in out
    assert json.load(open("out/old/config.json"))["impl"] == "sdpa"


@pytest.mark.slow
def test_cpu_compile_compiles_once(workdir):
    """--compile=True on a CPU: the warm-up step and the loop's batches have one layout, so torch.compile
    never recompiles (the loader's batches were strided views of one buffer)."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY, "--compile=True",
                        "--max_iters=3", "--eval_interval=3", "--out_dir=out/c"],
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "TORCH_LOGS": "recompiles"})
    assert p.returncode == 0, p.stderr
    assert "iter 3:" in p.stdout and "ecompil" not in p.stderr, p.stderr


def two_nodes(args, env):
    """2 processes as torchrun starts one on each of two nodes: RANK 0 and 1, both LOCAL_RANK 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ranks = [subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**env, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
             for rank in (0, 1)]
    out = [p.communicate(timeout=300) for p in ranks]
    return SimpleNamespace(returncode=max(p.returncode for p in ranks), stdout=out[0][0],
                           stderr="".join(err for _, err in out))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one node", "two nodes"])
def test_ddp_two_processes_match_one(workdir, layout):
    """gloo, 2 CPU processes, started by torchrun on one node, or as on two nodes (RANK ≠ LOCAL_RANK: the data
    is RANK's share, the device LOCAL_RANK's): a step and an evaluation equal one process's, same global
    batch."""
    args = TINY + ["--op=mix", "--max_iters=2", "--eval_interval=2", "--gradient_accumulation_steps=2"]
    # the windows that 2 ranks × 2 batches see
    run(*args[len(TINY):], "--eval_iters=4", "--out_dir=out/single")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if layout == "one node":
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        p = subprocess.run([*torchrun, os.path.join(ROOT, "train.py"), *args, "--out_dir=out/ddp"],
                           capture_output=True, text=True, env=env, timeout=300)
    else:
        p = two_nodes(args + ["--out_dir=out/ddp"], env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "destroy_process_group" not in p.stderr  # torch's warning when a process leaves the group behind
    single, ddp = weights("out/single/ckpt.pt"), weights("out/ddp/ckpt.pt")
    for k in single:
        assert torch.allclose(single[k], ddp[k], atol=1e-5), k
    for a, b in zip(read_log("out/single", "eval"), read_log("out/ddp", "eval")):
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-5)  # the ranks share the val set
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
    # only rank 0 prints, saves
    assert p.stdout.count("saved checkpoint") == 1 and p.stdout.count("step 2:") == 1
    assert ([r["tokens"] for r in read_log("out/ddp", "train")]
            == [r["tokens"] for r in read_log("out/single", "train")])



@pytest.mark.slow
def test_eval_only_under_torchrun_with_the_default_accumulation(workdir):
    """Evaluation accumulates nothing: 2 torchrun processes evaluate a one-process run whose settings are the
    defaults (gradient_accumulation_steps=1, which training with 2 processes refuses), as one process did."""
    run("--max_iters=2", "--eval_interval=2", "--out_dir=out/one")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        os.path.join(ROOT, "train.py"), *TINY, "--eval_only=True", "--out_dir=out/one"],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    val = float(re.search(r"step 2: train loss [0-9.]+, val loss ([0-9.]+)", p.stdout).group(1))
    assert val == pytest.approx(read_log("out/one", "eval")[-1]["val_loss"], abs=1e-4)

def test_finetune_from_local_gpt2_starts_at_attention(workdir):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                                              vocab_size=100))
    hf.save_pretrained("tiny-gpt2")
    os.makedirs("data/tok")
    for split, n in (("val", 0), ("train", 1)):
        write_shard(f"data/tok/tok_{split}_00000{n}.bin", torch.randint(0, 100, (4000,)).numpy())
    json.dump({"name": "tok", "tokenizer": "gpt2", "vocab_size": 100}, open("data/tok/meta.json", "w"))
    model = run("--init_from=tiny-gpt2", "--dataset=tok", "--op=mix", "--max_iters=2", "--eval_interval=2",
                "--out_dir=out/ft", "--n_head=2")  # n_head agrees with the pretrained model: allowed
    assert model.config.block_size == 32 and model.config.gelu == "tanh"  # cropped from 64; GPT-2's GELU
    first = read_log("out/ft", "eval")[0]
    assert torch.tensor(first["gamma"]).eq(0).all() and torch.tensor(first["delta"]).eq(1).all()
    assert json.load(open("out/ft/config.json"))["gelu"] == "tanh"  # config.json says what ran
    with pytest.raises(ValueError, match="n_layer=4 differs from the pretrained model's 2"):
        run("--init_from=tiny-gpt2", "--dataset=tok", "--n_layer=4", "--max_iters=1", "--out_dir=out/ft3")
    with pytest.raises(ValueError, match="needs GPT-2 tokens"):
        run("--init_from=tiny-gpt2", "--dataset=pydocs", "--max_iters=1", "--out_dir=out/ft2")


def test_op_lr_scale_reaches_the_optimizer(workdir):
    model = run("--op=mix", "--op_lr_scale=0.0", "--max_iters=3", "--eval_interval=3", "--out_dir=out/z")
    gamma, delta = model.gamma_delta()
    assert gamma.eq(0).all() and delta.eq(1).all()  # learning rate 0 for γ, δ: they stay at their init
    assert [r["lr"] > 0 for r in read_log("out/z", "train")] == [True] * 3  # the rest trains


def test_add_your_own_operator(workdir, request, capsys):
    """The README's example, written the same way: one class, registered, trained with train.py's settings."""
    @register_op("corridor_gate")
    class CorridorGate(HeadOperator):
        """δ(γI + P) with γ = -sigmoid(w): a head that can never leave the convex corridor."""
        controls = dict(
            w_init=0.0,  # every head's w at the start
        )

        def __init__(self, n_head, w_init):
            super().__init__(n_head)
            self.scalar("w", w_init)
            self.scalar("delta", 1.0)

        def coefficients(self):
            return -torch.sigmoid(self.w) * self.delta, self.delta
    request.addfinalizer(lambda: OPS.pop("corridor_gate"))
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    assert "  (op=corridor_gate) every head's w at the start\n" in capsys.readouterr().out

    model = run("--op=corridor_gate", "--w_init=2.0", "--max_iters=4", "--eval_interval=4",
                "--out_dir=out/gate")
    gamma = torch.tensor(read_log("out/gate", "eval")[0]["gamma"])
    # γ = -sigmoid(2) at the start
    assert torch.allclose(gamma, torch.full((2, 2), -1 / (1 + math.exp(-2.0))))
    assert (model.gamma_delta()[0] > -1).all() and (model.gamma_delta()[0] < 0).all()
    assert read_log("out/gate", "eval")[-1]["val_loss"] < read_log("out/gate", "eval")[0]["val_loss"]


def test_an_op_defined_again_under_its_name_is_the_new_class(workdir, request, capsys):
    """A notebook cell that registers an op, edited and run again: the name means the new class, for the
    model, the settings train.py takes and --help."""
    def cell(control):  # the cell as first written, then edited
        @register_op("edited")
        class Edited(HeadOperator):
            controls = {control: 0.0}  # every head's a at the start

            def __init__(self, n_head, **controls):
                super().__init__(n_head)
                self.scalar(control, controls[control])
                self.scalar("b", 1.0)

            def coefficients(self):
                return getattr(self, control), self.b
        return Edited
    request.addfinalizer(lambda: OPS.pop("edited"))
    cell("old_init")
    new = cell("new_init")
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    assert "--new_init=0.0" in capsys.readouterr().out
    model = run("--op=edited", "--new_init=0.5", "--max_iters=2", "--eval_interval=2", "--out_dir=out/e")
    assert all(type(op) is new for op in model.head_operators())
    assert read_log("out/e", "eval")[0]["gamma"] == [[0.5, 0.5]] * 2  # γ = a/b at the start
    with pytest.raises(ValueError, match="unknown setting 'old_init'"):
        parse_config(["--op=edited", "--old_init=0.5"])


def test_sample_decodes_text_from_any_directory(workdir, capsys, monkeypatch):
    import sample
    run("--max_iters=4", "--eval_interval=4", "--out_dir=out/s")
    monkeypatch.chdir(workdir / "out")  # no data/ here: the checkpoint carries what decoding needs
    args = ["--out_dir=s", "--start=The ", "--num_samples=2", "--max_new_tokens=20"]
    def draw(*more):
        return sample.sample(configure(sample.DEFAULTS, args + list(more), sample.RULES, files=False)[0])
    texts = draw()
    assert (len(texts) == 2 and all(t.startswith("The ") and len(t) == 24 for t in texts)
            and texts[0] != texts[1])
    assert draw() == texts and draw("--seed=7") != texts  # the seed decides the samples
    greedy = [draw("--temperature=0", f"--seed={s}") for s in (1, 2)]
    # temperature 0: the most likely token, always
    assert greedy[0] == greedy[1] and greedy[0][0] == greedy[0][1]
    assert "---------------" in capsys.readouterr().out


@pytest.fixture
def draw(workdir):
    """sample.sample on a run trained with dropout 0.5 (which sampling must switch off)."""
    import sample
    run("--dropout=0.5", "--max_iters=2", "--eval_interval=2", "--out_dir=out/d")
    def draw(*args):
        settings = ["--out_dir=out/d", "--num_samples=2", "--max_new_tokens=20", *args]
        return sample.sample(configure(sample.DEFAULTS, settings, sample.RULES, files=False)[0])
    return draw


def test_sample_draws_from_the_model_in_eval_mode(draw):
    """The samples are the checkpoint's model's own, dropout off: greedy is its argmax path, and a seed gives
    what that model draws after torch.manual_seed(seed)."""
    ckpt = torch.load("out/d/ckpt.pt", weights_only=True)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    encode, decode = get_tokenizer(ckpt["meta"])
    prompt = torch.tensor([encode("The ")])
    greedy = decode(model.generate(prompt, 20, temperature=0)[0].tolist())
    torch.manual_seed(3)
    seeded = [decode(model.generate(prompt, 20, temperature=0.8, top_k=200)[0].tolist()) for _ in range(2)]
    assert (draw("--start=The ", "--temperature=0", "--seed=1")
            == draw("--start=The ", "--temperature=0", "--seed=2") == [greedy, greedy])
    assert draw("--start=The ", "--seed=3") == seeded


def test_sample_prompt_file_top_k_and_no_new_tokens(draw, capsys):
    open("prompt.txt", "w", encoding="utf-8").write("def f(x):\n")
    greedy = draw("--start=def f(x):\n", "--temperature=0")
    # FILE: reads the prompt from the file
    assert draw("--start=FILE:prompt.txt", "--temperature=0") == greedy
    # top_k=1 (the least allowed) keeps only the argmax
    assert draw("--start=def f(x):\n", "--top_k=1") == greedy
    # 0 allowed: the prompt
    assert draw("--start=FILE:prompt.txt", "--max_new_tokens=0") == ["def f(x):\n"] * 2
    capsys.readouterr()
    texts = draw("--seed=5")
    assert capsys.readouterr().out == "".join(t + "\n---------------\n" for t in texts)  # printed as returned
