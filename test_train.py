"""
Tests for train.py and sample.py: config errors, a tiny end-to-end run of every op, exact resume, DDP with
torchrun (gloo, 2 CPU processes) against one process, the NaN stop, GPT-2 fine-tuning start, sampling.

    python -m pytest -q test_train.py
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import train
from operators import OPS
from configurator import ConfigError, configure
from train import parse_config

HERE = os.path.dirname(os.path.abspath(__file__))
# a model small enough that a few iterations take about a second on one CPU core
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=2",
        "--log_interval=1", "--warmup_iters=2", "--learning_rate=3e-3", "--device=cpu"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run in a fresh directory: data/pydocs gets prepared on the fly there, like on a fresh machine."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args):
    return train.train(*parse_config(TINY + list(args)))


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


# --- configuration ------------------------------------------------------------------------------------------------


def test_config_file_and_overrides(tmp_path):
    cfg = tmp_path / "x.py"
    cfg.write_text("import math\nop = 'laplacian'\nn_layer = 3\nlearning_rate = 1e-3\n")
    c, given = parse_config([str(cfg), "--n_layer=5", "--op=mix", "--gamma_min=0", "--compile=False"])
    assert (c.op, c.n_layer, c.learning_rate, c.gamma_min, c.compile) == ("mix", 5, 1e-3, 0, False)
    assert given == {"op", "n_layer", "learning_rate", "gamma_min", "compile"}


@pytest.mark.parametrize("args, words", [
    (["--learning_rat=1e-3"], "unknown setting 'learning_rat'; did you mean learning_rate"),
    (["--n_layer=2.5"], "n_layer=2.5 is not allowed: it must be an integer"),
    (["--decay_lr=yes"], "decay_lr='yes' is not allowed: it must be True or False"),
    (["--op"], "must look like --key=value"),
    (["config/nope.py"], "config file 'config/nope.py' not found"),
])
def test_config_errors(args, words):
    with pytest.raises(ConfigError, match=words):
        parse_config(args)


def test_config_errors_are_one_line_on_the_command_line(workdir):
    p = subprocess.run([sys.executable, os.path.join(HERE, "train.py"), "--max_iter=3"], capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0
    assert "unknown setting 'max_iter'; did you mean max_iters" in p.stderr


def test_bad_model_and_run_settings(workdir):
    with pytest.raises(ValueError, match="op='softmax' is not allowed"):
        run("--op=softmax", "--max_iters=1")
    with pytest.raises(ConfigError, match="no checkpoint at out/none/ckpt.pt"):
        run("--init_from=resume", "--out_dir=out/none")
    with pytest.raises(ConfigError, match="multiple of the number of processes"):
        os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"] = "0", "0", "2"
        try:
            run("--gradient_accumulation_steps=3", "--max_iters=1")
        finally:
            for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
                del os.environ[k]


# --- end to end ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_tiny_run_of_every_op(workdir, op):
    out = f"out/{op}"
    run(f"--op={op}", "--max_iters=6", "--eval_interval=3", f"--out_dir={out}")
    records = read_log(out)
    evals = [r for r in records if r["event"] == "eval"]
    trains = [r for r in records if r["event"] == "train"]
    assert [r["iter"] for r in evals] == [0, 3, 6] and [r["iter"] for r in trains] == [1, 2, 3, 4, 5, 6]
    assert records[-1]["event"] == "done" and records[-1]["best_val_loss"] == min(r["val_loss"] for r in evals[1:])
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]  # it learns something
    assert trains[-1]["tokens"] == 6 * 4 * 32 and trains[-1]["tokens_per_s"] > 0
    gamma = torch.tensor(evals[-1]["gamma"])
    assert gamma.shape == (2, 2)
    if op == "attention":
        assert gamma.eq(0).all()
    if op.startswith("mix"):
        assert not gamma.eq(0).all()  # the learned γ moved
    ckpt = torch.load(f"{out}/ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 6 and ckpt["model_args"]["op"] == op
    assert json.load(open(f"{out}/config.json"))["op"] == op
    with pytest.raises(ConfigError, match="already holds a checkpoint"):  # never overwrite a run by accident
        run(f"--op={op}", "--max_iters=2", f"--out_dir={out}")


def test_resume_is_exact(workdir):
    common = ["--op=mix", "--dropout=0.1", "--lr_decay_iters=8", "--eval_interval=4", "--gradient_accumulation_steps=2"]
    straight = run(*common, "--max_iters=8", "--out_dir=out/straight")
    run(*common, "--max_iters=4", "--out_dir=out/halves")
    with open("out/halves/log.jsonl", "a") as f:  # what a crash after the checkpoint leaves behind
        f.write(json.dumps({"event": "train", "iter": 5, "loss": 9.9}) + '\n{"event": "tr')
    resumed = run(*common, "--max_iters=8", "--out_dir=out/halves", "--init_from=resume")
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    log = read_log("out/halves")
    assert [r["iter"] for r in log if r["event"] == "eval"] == [0, 4, 8]  # no repeated evaluation at iter 4
    assert [r["iter"] for r in log if r["event"] == "train"] == list(range(1, 9))  # one history, crash leftovers gone
    assert [r["event"] for r in log].count("done") == 1 and 9.9 not in [r.get("loss") for r in log]
    with pytest.raises(ConfigError, match="n_layer=3 differs from the checkpoint's 2"):
        run(*common, "--max_iters=9", "--out_dir=out/halves", "--init_from=resume", "--n_layer=3")


def test_corrupt_or_foreign_checkpoint(workdir):
    os.makedirs("out/bad")
    with open("out/bad/ckpt.pt", "wb") as f:
        f.write(b"not a checkpoint")
    with pytest.raises(ConfigError, match="out/bad/ckpt.pt cannot be read"):
        run("--init_from=resume", "--out_dir=out/bad")
    torch.save({"model": {}}, "out/bad/ckpt.pt")
    with pytest.raises(ConfigError, match="lacks best_val_loss, iter_num, loader, meta, model_args, optimizer"):
        run("--init_from=resume", "--out_dir=out/bad")


def test_nan_stops_and_keeps_last_good_checkpoint(workdir, monkeypatch):
    lr = train.get_lr
    monkeypatch.setattr(train, "get_lr", lambda it, c: lr(it, c) if it < 4 else 1e30)  # explodes at iter 4
    with pytest.raises(FloatingPointError, match="became (nan|inf).*last good checkpoint out/nan/ckpt.pt is untouched"):
        run("--max_iters=20", "--eval_interval=2", "--grad_clip=0", "--out_dir=out/nan")
    ckpt = torch.load("out/nan/ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 4 and all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert not os.path.exists("out/nan/ckpt.pt.tmp")


@pytest.mark.slow
def test_ddp_two_processes_match_one(workdir):
    """torchrun, gloo, 2 CPU processes: one step equals one process taking the same global batch."""
    args = TINY + ["--op=mix", "--max_iters=1", "--eval_interval=1", "--gradient_accumulation_steps=2"]
    run(*args[len(TINY):], "--out_dir=out/single")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        os.path.join(HERE, "train.py"), *args, "--out_dir=out/ddp"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    single = torch.load("out/single/ckpt.pt", weights_only=True)["model"]
    ddp = torch.load("out/ddp/ckpt.pt", weights_only=True)["model"]
    for k in single:
        assert torch.allclose(single[k], ddp[k], atol=1e-5), k
    assert p.stdout.count("saved checkpoint") == 1  # only rank 0 prints and saves


def test_finetune_from_local_gpt2_starts_at_attention(workdir):
    transformers = pytest.importorskip("transformers")
    from dataloader import write_shard
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2, vocab_size=100))
    hf.save_pretrained("tiny-gpt2")
    os.makedirs("data/tok")
    for split, n in (("val", 0), ("train", 1)):
        write_shard(f"data/tok/tok_{split}_00000{n}.bin", torch.randint(0, 100, (4000,)).numpy())
    json.dump({"tokenizer": "gpt2", "vocab_size": 100}, open("data/tok/meta.json", "w"))
    model = run("--init_from=tiny-gpt2", "--dataset=tok", "--op=mix", "--max_iters=2", "--eval_interval=2",
                "--out_dir=out/ft")
    assert model.config.block_size == 32  # cropped from 64 to the run's block_size
    first = next(r for r in read_log("out/ft") if r["event"] == "eval")
    assert torch.tensor(first["gamma"]).eq(0).all() and torch.tensor(first["delta"]).eq(1).all()
    with pytest.raises(ConfigError, match="needs GPT-2 tokens"):
        run("--init_from=tiny-gpt2", "--dataset=pydocs", "--max_iters=1", "--out_dir=out/ft2")


def test_sample_decodes_text(workdir, capsys):
    import sample
    run("--max_iters=4", "--eval_interval=4", "--out_dir=out/s")
    c = configure(sample.DEFAULTS, ["--out_dir=out/s", "--start=The ", "--num_samples=2", "--max_new_tokens=20"],
                  sample.RULES, files=False)[0]
    texts = sample.sample(c)
    assert len(texts) == 2 and all(t.startswith("The ") and len(t) == 24 for t in texts)
    assert "---------------" in capsys.readouterr().out


def test_op_lr_scale_reaches_the_optimizer(workdir):
    model = run("--op=mix", "--op_lr_scale=0.0", "--max_iters=3", "--eval_interval=3", "--out_dir=out/z")
    gamma, delta = model.gamma_delta()
    assert gamma.eq(0).all() and delta.eq(1).all()  # learning rate 0 for γ, δ: they stay at their init
    assert [r["lr"] > 0 for r in read_log("out/z") if r["event"] == "train"] == [True] * 3  # the rest trains
