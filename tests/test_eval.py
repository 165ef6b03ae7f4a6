"""
Tests for the evaluation: the fixed val set (dataloader.ValSet and train.py's val loss, the same for every
batch size, seed and number of processes), bits per byte, HellaSwag (prepared from a fake hub, scored against
a hand computation) and what a research run logs (the gradient norm before clipping, every head's γ/δ in
wandb, save_every's checkpoints).

    python -m pytest -q tests/test_eval.py
"""
import importlib.machinery
import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from support import hellaswag
import prepare_data as pd
from support import dataloader as dl
import train
from support.dataloader import DataError, ValSet, read_shard
from model import GPT, GPTConfig
from support.dataloader import token_bytes
from helpers import (QUICK, ROOT, TINY, FakeHub, char_dataset, parquet_bytes, read_log, run,  # noqa: F401
                     tiny_enc, workdir, write_shard)  # (tiny_enc and workdir are fixtures)


def printed_val_loss(out):
    return re.findall(r"step \d+: train loss \d+\.\d+, val loss (\d+\.\d+)", out)


# --- the fixed val set --------------------------------------------------------------------------------------


@pytest.mark.parametrize("val_tokens", [1000, 40, 41])
def test_val_set_predicts_the_first_val_tokens_once_each_whatever_the_batch_and_ranks(tmp_path, val_tokens):
    """Token i of the split has id i: every (x, y) says which positions it reads and predicts."""
    write_shard(str(tmp_path / "d_val_000000.bin"), np.arange(50))
    write_shard(str(tmp_path / "d_val_000001.bin"), np.arange(50, 87))  # the split goes on in the next shard
    count = min(val_tokens, 86)
    for world_size in (1, 2, 3):
        for batch_size in (1, 3, 16):
            predicted = []
            for rank in range(world_size):
                val = ValSet(str(tmp_path), 8, val_tokens, rank=rank, world_size=world_size)  # block_size 8
                assert val.count == count
                for x, y in val.batches(batch_size):
                    assert x.shape == y.shape and x.shape[0] <= batch_size and torch.equal(y, x + 1)
                    predicted += y.flatten().tolist()
            assert sorted(predicted) == list(range(1, count + 1))  # each of tokens 1..count once, in all


def test_val_set_of_one_token_is_refused(tmp_path):
    write_shard(str(tmp_path / "d_val_000000.bin"), [3])
    with pytest.raises(DataError, match="needs at least 2 to predict one"):
        ValSet(str(tmp_path), 8, 100)


@pytest.mark.slow
def test_one_checkpoint_gives_one_val_loss_for_every_batch_size_seed_and_process_count(workdir, capsys):
    run("--max_iters=4", "--eval_interval=4", "--out_dir=out/v")
    logged = f"{read_log('out/v', 'eval')[-1]['val_loss']:.4f}"
    capsys.readouterr()
    train_losses = set()
    for extra in (["--batch_size=3"], ["--batch_size=16"], ["--seed=5"], ["--seed=9"]):
        run("--eval_only=True", "--out_dir=out/v", *extra)
        out = capsys.readouterr().out
        assert printed_val_loss(out) == [logged], extra
        train_losses.add(re.search(r"train loss (\d+\.\d+)", out).group(1))
    assert len(train_losses) > 1  # the train estimate samples batches: the settings do change what it reads
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        os.path.join(ROOT, "train.py"), *TINY, "--eval_only=True",
                        "--gradient_accumulation_steps=2", "--out_dir=out/v"],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert printed_val_loss(p.stdout) == [logged]  # each rank half the windows, their sums added


# --- bits per byte ------------------------------------------------------------------------------------------


def test_token_bytes_of_each_tokenizer(tiny_enc):
    assert token_bytes({"tokenizer": "byte"}).tolist() == [1] * 256
    assert token_bytes({"tokenizer": "char", "chars": "\na é✓"}).tolist() == [1, 1, 1, 2, 3]
    gpt2 = token_bytes({"tokenizer": "gpt2"})
    assert len(gpt2) == 257 and gpt2[:256].tolist() == [1] * 256 and gpt2[256] == 0  # end-of-text: no text


@pytest.mark.slow
def test_bits_per_byte_and_gradient_norm_in_every_record(workdir, capsys):
    """A char vocabulary with 1-, 2- and 3-byte characters: bits per byte = the val loss in bits per token ×
    tokens / the UTF-8 bytes of the predicted characters, counted here by hand."""
    chars = "ab\né✓"
    char_dataset("multi", chars)
    run("--dataset=multi", "--max_iters=4", "--eval_interval=2", "--grad_clip=1e-6", "--out_dir=out/m")
    val = read_shard("data/multi/multi_val_000000.bin")[1:]  # every token but the first is predicted
    n_bytes = sum(len(chars[t].encode("utf-8")) for t in val)
    evals = read_log("out/m", "eval")
    assert [r["iter"] for r in evals] == [0, 2, 4]
    for r in evals:
        assert r["val_tokens"] == len(val)
        assert r["val_bpb"] == pytest.approx(r["val_loss"] / math.log(2) * len(val) / n_bytes, rel=1e-12)
    trains = read_log("out/m", "train")
    assert len(trains) == 4 and all(r["grad_norm"] > 1e-3 for r in trains)  # before clipping to 1e-6
    out = capsys.readouterr().out
    assert f"val loss {evals[-1]['val_loss']:.4f} ({evals[-1]['val_bpb']:.4f} bits/byte)" in out
    assert f"grad norm {trains[-1]['grad_norm']:.3f}," in out
    run("--dataset=multi", "--max_iters=2", "--eval_interval=2", "--grad_clip=0", "--out_dir=out/noclip")
    assert all(r["grad_norm"] > 0 for r in read_log("out/noclip", "train"))  # measured without clipping too


# --- what a research run keeps: γ/δ in wandb, step checkpoints --------------------------------------------


def test_wandb_gets_every_heads_gamma_and_delta(workdir, monkeypatch):
    logged = []
    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # what find_spec reads
    wandb.init = lambda **kwargs: None
    wandb.log = lambda numbers, step: logged.append((step, numbers))
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    run("--op=mix", "--max_iters=2", "--eval_interval=2", "--wandb_log=True", "--out_dir=out/w")
    evals = read_log("out/w", "eval")
    sent = [numbers for step, numbers in logged if "val_loss" in numbers]
    assert len(sent) == len(evals) == 2
    for record, numbers in zip(evals, sent):
        assert numbers["val_loss"] == record["val_loss"] and numbers["val_bpb"] == record["val_bpb"]
        heads = {f"{name}/L{layer}H{head}": record[name][layer][head]
                 for name in ("gamma", "delta") for layer in range(2) for head in range(2)}
        assert {k: numbers[k] for k in heads} == heads
    assert all("grad_norm" in numbers for step, numbers in logged if "loss" in numbers)


@pytest.mark.slow
def test_save_every_keeps_step_checkpoints_and_resume_reads_ckpt(workdir, capsys):
    run("--max_iters=4", "--eval_interval=2", "--save_every=2", "--out_dir=out/s")
    for it in (2, 4):
        assert torch.load(f"out/s/ckpt_{it:06d}.pt", weights_only=True)["iter_num"] == it
    last, step4 = (torch.load(f"out/s/{f}", weights_only=True)["model"]
                   for f in ("ckpt.pt", "ckpt_000004.pt"))
    assert all(torch.equal(last[k], step4[k]) for k in last)
    os.remove("out/s/ckpt_000004.pt")
    run("--max_iters=6", "--init_from=resume", "--out_dir=out/s")  # from ckpt.pt at iter 4
    kept = sorted(f for f in os.listdir("out/s") if f.startswith("ckpt_"))
    assert kept == ["ckpt_000002.pt", "ckpt_000006.pt"]
    with pytest.raises(ValueError, match="save_every=3 must be a multiple of eval_interval=2"):
        run("--max_iters=4", "--eval_interval=2", "--save_every=3", "--out_dir=out/s3")


# --- HellaSwag ----------------------------------------------------------------------------------------------


def hellaswag_rows(n):
    return {"ind": list(range(n)), "ctx": [f"Context {i} ends" for i in range(n)],
            "endings": [[f"ending {i}.{j}" for j in range(4)] for i in range(n)],
            "label": [str(i % 4) for i in range(n)]}  # a string, as in the hub's parquet


class HellaSwagHub(FakeHub):
    def get_paths_info(self, repo_id, paths, repo_type, revision):
        assert (repo_id, repo_type, revision) == (pd.HELLASWAG_REPO, "dataset", pd.HELLASWAG_REVISION)
        return [SimpleNamespace(path=p, size=len(self.files[p])) for p in paths if p in self.files]


def test_prepare_hellaswag_from_the_hub(tmp_path, monkeypatch, capsys):
    hub = HellaSwagHub(monkeypatch, {pd.HELLASWAG_FILE: parquet_bytes(hellaswag_rows(10))})
    out = str(tmp_path / "data")
    pd.prepare("hellaswag", out_dir=out)
    examples = hellaswag.load_examples(out)
    assert examples[3] == {"ctx": "Context 3 ends", "endings": [f"ending 3.{j}" for j in range(4)],
                           "label": 3}
    assert len(examples) == 10 and hub.downloads == [pd.HELLASWAG_FILE]
    assert set(os.listdir(out)) == {"hellaswag", ".hellaswag.lock"}  # the staging folder is gone
    pd.prepare("hellaswag", out_dir=out)
    assert hub.downloads == [pd.HELLASWAG_FILE] and "already prepared" in capsys.readouterr().out


@pytest.mark.parametrize("case, message", [("short", "the download has .* bytes but the hub lists")])
def test_a_broken_hellaswag_download_is_deleted_not_used(tmp_path, monkeypatch, case, message):
    good = parquet_bytes(hellaswag_rows(3))
    hub = HellaSwagHub(monkeypatch, {pd.HELLASWAG_FILE: good})
    hub.served[pd.HELLASWAG_FILE] = good[:-10]
    out = tmp_path / "data"
    with pytest.raises(DataError, match=message):
        pd.prepare("hellaswag", out_dir=str(out))
    assert not (out / "hellaswag" / "val.jsonl").exists()
    assert not list((out / ".hellaswag.staging").rglob("*.parquet"))  # deleted: the next run fetches it again
    with pytest.raises(DataError, match=r"no HellaSwag at .*; fetch it with `python prepare_data.py hellasw"):
        hellaswag.load_examples(str(out))


VOCAB = " abc"  # the hand computation's tokenizer: one token per character
encode = lambda s: [VOCAB.index(c) for c in s]  # noqa: E731


class Bigram(torch.nn.Module):
    """A model whose next-token logits at a position depend only on that position's token: W[token]. It
    records whether it ran in training mode."""

    def __init__(self, W):
        super().__init__()
        self.W = torch.nn.Parameter(torch.tensor(W, dtype=torch.float32))
        self.modes = []

    def forward(self, idx, targets=None):
        self.modes.append(self.training)
        return self.W[idx], None


W = [[0.0, 1.0, 0.5, -1.0], [2.0, -0.5, 0.0, 1.0], [0.3, 0.0, 1.5, -0.2], [-1.0, 0.7, 0.1, 0.9]]
EXAMPLES = [{"ctx": "ab", "endings": ["a", "bc", "cab", "ca"], "label": 1},
            {"ctx": "c", "endings": ["cc", "b", "abab", "a"], "label": 3},
            {"ctx": "ba ca", "endings": ["bca", "ab", "c", "bb"], "label": 0}]


def hand_mean_loss(context, ending, block_size):
    """The mean of -log p(token | previous token) over the ending's tokens, with plain floats."""
    text = (context + " " + ending)[-block_size:]
    n_ending = min(len(ending) + 1, block_size - 1)  # " " + ending; a row's first token is not predicted
    losses = []
    for p in range(len(text) - n_ending, len(text)):
        row = W[VOCAB.index(text[p - 1])]
        losses.append(math.log(sum(math.exp(v) for v in row)) - row[VOCAB.index(text[p])])
    return sum(losses) / len(losses)


@pytest.mark.parametrize("block_size", [64, 5, 4])  # 5: the oldest context tokens cut; 4: some endings' too
def test_hellaswag_scores_what_the_hand_computation_says(block_size):
    rendered = [hellaswag.render(e, encode, block_size) for e in EXAMPLES]
    hand = [[hand_mean_loss(e["ctx"], ending, block_size) for ending in e["endings"]] for e in EXAMPLES]
    tokens, mask = hellaswag.batch_tensors(rendered)  # all three examples in one padded batch
    got = hellaswag.ending_losses(Bigram(W), tokens, mask).view(3, 4)
    assert got.flatten().tolist() == pytest.approx(sum(hand, []), rel=1e-5)
    picks = [min(range(4), key=row.__getitem__) for row in hand]
    want = sum(pick == e["label"] for pick, e in zip(picks, EXAMPLES)) / 3
    assert 0 < want < 1  # some right, some wrong: the score has to be counted, not guessed
    for batch_size in (1, 2, 3):
        assert hellaswag.score(Bigram(W), rendered, batch_size, "cpu") == pytest.approx(want)
    halves = [hellaswag.score(Bigram(W), rendered, 1, "cpu", rank, 2) for rank in (0, 1)]  # examples 0, 2 | 1
    assert halves[0] * 2 + halves[1] * 1 == pytest.approx(want * 3)


def test_hellaswag_length_normalisation_is_what_decides():
    """Per token, ending 1 ('bb...') is likelier; in total, the short ending 0 is: acc_norm must pick 1."""
    W = [[0.0] * 4, [0.0] * 4, [0.0, 0.0, 3.0, 0.0], [0.0] * 4]  # after 'b', 'b' is likely; else uniform
    example = {"ctx": "a", "endings": ["a", "bbbbbbbb", "c", "ab"], "label": 1}
    rendered = [hellaswag.render(example, encode, 64)]
    assert hellaswag.score(Bigram(W), rendered, 1, "cpu") == 1.0


def test_a_model_that_prefers_the_right_ending_scores_100_percent():
    """A model that always expects 'c' next: the right ending is the one made of c's."""
    prefers_c = [[0.0, 0.0, 0.0, 5.0]] * 4
    examples = [{"ctx": "ab a", "endings": ["ccc" if j == k else "ab"[j % 2] * 3 for j in range(4)],
                 "label": k} for k in (0, 1, 2, 3, 2)]
    rendered = [hellaswag.render(e, encode, 64) for e in examples]
    model = Bigram(prefers_c)  # in training mode, as train.py's model between evaluations
    assert hellaswag.score(model, rendered, 2, "cpu") == 1.0
    assert model.modes == [False] * 3 and model.training  # scored in eval mode (no dropout), then given back
    prefers_b = [[0.0, 0.0, 5.0, 0.0]] * 4
    assert hellaswag.score(Bigram(prefers_b), rendered, 2, "cpu") < 0.5


def test_each_ending_is_scored_at_its_true_positions():
    """A real GPT (its positions matter, a Bigram's do not) scores each row of a padded batch as it scores
    that row alone: rows are padded on the right, so a shorter ending is never read after pad tokens."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=4, n_layer=1, n_head=2, n_embd=16)).eval()
    rendered = [hellaswag.render(e, encode, 16) for e in EXAMPLES]  # endings of 1 to 4 characters
    tokens, mask = hellaswag.batch_tensors(rendered)  # (12, L): rows of 3 to 10 tokens, padded to L
    batch = hellaswag.ending_losses(model, tokens, mask)
    alone = [hellaswag.ending_losses(model, *hellaswag.batch_tensors([([row], [n], 0)]))
             for rows, lengths, _ in rendered for row, n in zip(rows, lengths)]
    assert batch.tolist() == pytest.approx(torch.cat(alone).tolist(), rel=1e-5)


def test_a_real_size_hellaswag_file_is_written_and_read(tmp_path, monkeypatch):
    """10,042 examples of HellaSwag's lengths (a context of ~60 words, endings of ~25): several MB."""
    n, words = 10_042, "the man then walks across the room and picks up a ball".split()
    rows = {"ctx": [" ".join(words[i % 7:] * 6) for i in range(n)],
            "endings": [[" ".join(words[j:] * 3) for j in range(4)] for i in range(n)],
            "label": [str(i % 4) for i in range(n)]}
    HellaSwagHub(monkeypatch, {pd.HELLASWAG_FILE: parquet_bytes(rows)})
    out = str(tmp_path / "data")
    pd.prepare("hellaswag", out_dir=out)
    assert os.path.getsize(os.path.join(out, "hellaswag", "val.jsonl")) > 5e6
    examples = hellaswag.load_examples(out)
    assert len(examples) == n and examples[-1]["label"] == (n - 1) % 4


def write_hellaswag(examples):
    os.makedirs("data/hellaswag", exist_ok=True)
    with open("data/hellaswag/val.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in examples)


def checkpoint_model(out):
    ckpt = torch.load(f"{out}/ckpt.pt", weights_only=True)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    return model.eval()


@pytest.mark.slow
def test_train_scores_hellaswag_when_asked(workdir, capsys):
    """In training (at multiples of hellaswag_interval, logged) and with eval_only on the checkpoint: the
    score is hellaswag.score's on that model. A char dataset is refused: its vocabulary lacks HellaSwag's
    text."""
    pd.prepare_documents("bytes", pd.pydocs_documents()[:20], "data", tokenizer="byte")
    endings = ["is a function.", "returns None.", "xyz qq", "raises."]
    examples = [{"ctx": f"The {w} of the module", "endings": endings, "label": i % 4}
                for i, w in enumerate(["name", "value", "type", "size", "body"])]
    write_hellaswag(examples)
    run("--dataset=bytes", "--max_iters=4", "--eval_interval=2", "--hellaswag_interval=4", "--out_dir=out/h")
    evals = read_log("out/h", "eval")
    assert ["hellaswag" in r for r in evals] == [True, False, True]  # iters 0 and 4
    rendered = [hellaswag.render(e, dl.get_tokenizer({"tokenizer": "byte"})[0], 32) for e in examples]
    want = hellaswag.score(checkpoint_model("out/h"), rendered, 4, "cpu")
    assert evals[-1]["hellaswag"] == want
    capsys.readouterr()
    run("--eval_only=True", "--hellaswag_interval=1", "--out_dir=out/h")
    assert f"hellaswag acc_norm {want:.4f} (5 examples)" in capsys.readouterr().out
    run("--eval_only=True", "--out_dir=out/h")  # the run's own setting
    assert f"hellaswag acc_norm {want:.4f} (5 examples)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="HellaSwag needs a byte or gpt2 dataset"):
        run("--max_iters=2", "--eval_interval=2", "--hellaswag_interval=2", "--out_dir=out/c")
    with pytest.raises(ValueError, match="hellaswag_interval=3 must be a multiple of eval_interval=2"):
        run("--dataset=bytes", "--max_iters=2", "--eval_interval=2", "--hellaswag_interval=3",
            "--out_dir=out/c")


def test_eval_only_on_a_local_gpt2_reports_hellaswag(workdir, tiny_enc, capsys):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                                              vocab_size=300))
    hf.save_pretrained("tiny-gpt2")
    pd.prepare_documents("tok", pd.pydocs_documents()[:10], "data", tokenizer="gpt2")  # tiny_enc's tokens
    write_hellaswag(EXAMPLES)
    run("--init_from=tiny-gpt2", "--dataset=tok", "--eval_only=True", "--hellaswag_interval=1",
        "--out_dir=out/g")
    out = capsys.readouterr().out
    model = GPT.from_pretrained("tiny-gpt2").eval()
    model.crop_block_size(32)
    rendered = [hellaswag.render(e, dl.get_tokenizer({"tokenizer": "gpt2"})[0], 32) for e in EXAMPLES]
    want = hellaswag.score(model, rendered, 4, "cpu")
    assert f"hellaswag acc_norm {want:.4f} (3 examples)" in out and "bits/byte" in out
    assert not os.path.exists("out/g")  # eval_only writes nothing


# --- a val.jsonl that is not what prepare_data.py writes: one line naming the file and the line -------------

GOOD = json.dumps({"ctx": "The name of the module", "endings": ["is a.", "b.", "c c", "d."], "label": 1})


def with_line_2(text):
    """A val.jsonl of 3 lines, the second one `text` (a dict is written as JSON)."""
    return "\n".join([GOOD, text if isinstance(text, str) else json.dumps(text), GOOD]) + "\n"


EXAMPLE = json.loads(GOOD)
# Damage only: a hand edit (five endings, a list where an object goes) gets Python's own error
BROKEN_HELLASWAG = {  # case -> (the file's text, the line the message must name; None: the file as a whole)
    "no label": (with_line_2({"ctx": "x", "endings": ["a", "b", "c", "d"]}), 2),
    "label 4": (with_line_2({**EXAMPLE, "label": 4}), 2),
    "label -1": (with_line_2({**EXAMPLE, "label": -1}), 2),  # would never be picked: scored as wrong
    "label as a string": (with_line_2({**EXAMPLE, "label": "1"}), 2),  # an earlier prepare_data.py's
    "not JSON": (with_line_2('{"ctx": "The name of'), 2),  # cut short
    "blank line": (GOOD + "\n\n" + GOOD + "\n", 2),
    "empty file": ("", None)}


def data_files():
    return {p: p.read_bytes() for p in Path("data").rglob("*") if p.is_file() and not p.is_symlink()}


def hellaswag_refusal():
    """train.py's main on data/hellaswag/val.jsonl as it stands: it must stop with one `error: ...` line,
    returned, having changed nothing under data/ and written no run."""
    before = data_files()
    with pytest.raises(SystemExit) as e:
        train.main(QUICK + ["--dataset=bytes", "--hellaswag_interval=2", "--out_dir=out"])
    message = str(e.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    assert data_files() == before
    assert not os.path.exists("out")
    return message


@pytest.mark.parametrize("case", BROKEN_HELLASWAG)
def test_a_broken_hellaswag_file_is_refused_with_its_line(workdir, case):
    text, line = BROKEN_HELLASWAG[case]
    pd.prepare_documents("bytes", pd.pydocs_documents()[:5], "data", tokenizer="byte")
    os.makedirs("data/hellaswag")
    Path("data/hellaswag/val.jsonl").write_text(text, encoding="utf-8")
    message = hellaswag_refusal()
    assert "data/hellaswag/val.jsonl" in message and "python prepare_data.py hellaswag" in message
    if line is not None:
        assert re.search(rf"\bline {line}\b", message), message
        assert all(field in message for field in ("ctx", "endings", "label"))  # what a line must be
    assert "line 1 " not in message and "line 3" not in message  # only the bad line is named


def limit_memory():
    import resource  # POSIX only, as are the FIFO and /dev/zero these tests plant
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a read of /dev/zero fails here, not the host


@pytest.mark.slow
@pytest.mark.parametrize("kind, words", [("FIFO", "is a FIFO"), ("link to /dev/zero", "is a symbolic link")])
def test_a_hellaswag_fifo_or_device_link_is_refused_not_read(workdir, kind, words):
    """train.py in a process of its own, with a timeout and a memory limit: a FIFO that is waited on, or
    /dev/zero read until memory runs out, fails the test instead of hanging the suite or the machine."""
    pd.prepare_documents("bytes", pd.pydocs_documents()[:5], "data", tokenizer="byte")
    os.makedirs("data/hellaswag")
    path = "data/hellaswag/val.jsonl"
    if kind == "FIFO":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)
    argv = [sys.executable, os.path.join(ROOT, "train.py"), *QUICK, "--dataset=bytes",
            "--hellaswag_interval=2", "--out_dir=out"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, preexec_fn=limit_memory,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode != 0 and len(p.stderr.splitlines()) == 1, p.stderr[-3000:]
    assert p.stderr.startswith(f"error: {path} {words}") and "python prepare_data.py hellaswag" in p.stderr
    assert not os.path.exists("out")


def test_a_hellaswag_file_far_larger_than_prepare_writes_is_refused(workdir, monkeypatch):
    pd.prepare_documents("bytes", pd.pydocs_documents()[:5], "data", tokenizer="byte")
    os.makedirs("data/hellaswag")
    Path("data/hellaswag/val.jsonl").write_text(3 * (GOOD + "\n"), encoding="utf-8")
    monkeypatch.setattr(hellaswag, "HELLASWAG_BYTES", 100)  # the file is 3 lines of about 90 bytes
    message = hellaswag_refusal()
    assert "data/hellaswag/val.jsonl is larger than 100 bytes" in message
    assert "python prepare_data.py hellaswag" in message
