"""
The numbers users trust, recomputed by hand: each test states one promise of the README or a module
docstring and checks it against a float64 (or pencil-and-paper) reference on a tiny model or tiny data.
Each was written against a planted bug that the rest of the fast suite let through (named in its
docstring).

    python -m pytest -q tests/test_promises.py
"""
import json
import math
import os
import socket

import numpy as np
import pytest
import torch

import train
from model import GPT, GPTConfig
from support import hardware
from support.dataloader import read_shard
from helpers import (TINY, char_dataset, read_log, run, workdir,  # noqa: F401 (workdir: a fixture)
                     write_shard)


def float64_loss(model, tokens):
    """The summed next-token loss of every token but the first, in float64: tokens (T+1,)."""
    x, y = tokens[None, :-1], tokens[None, 1:]
    logits, _ = model(x, y)
    return torch.nn.functional.cross_entropy(logits[0], y[0], reduction="sum").item()


def one_token_dataset():
    """data/same: one token repeated, so every window is the same batch: at learning rate 0 every
    step has the same loss and gradient, and every rank of a DDP run reads what the others read
    (the sum of a statistic over 2 ranks is twice one rank's)."""
    os.makedirs("data/same")
    for split, n in (("val", 0), ("train", 1)):
        write_shard(f"data/same/same_{split}_00000{n}.bin", np.full(2000, 7))
    json.dump({"name": "same", "tokenizer": "byte", "vocab_size": 256}, open("data/same/meta.json", "w"))


# --- the val loss and bits per byte -------------------------------------------------------------------------


def test_val_loss_is_nats_per_token_and_bpb_divides_by_the_utf8_bytes(workdir):
    """README: the val loss is the mean over the first val_tokens of the val split, read in order
    (block_size windows, the last shorter); val_bpb = val_loss / ln 2 × tokens / bytes, the bytes of
    the predicted characters (1, 2 and 3 of them here). Planted bugs it catches: a short last window
    weighted as a full one, ln 2 dropped, tokens/bytes inverted, the unpredicted first token's bytes
    counted, one val token too few."""
    chars = "ab\né✓"
    char_dataset("multi", chars)
    run("--dataset=multi", "--max_iters=1", "--eval_interval=1", "--val_tokens=1000", "--out_dir=out/m")
    record = read_log("out/m", "eval")[-1]
    model = GPT.from_checkpoint(torch.load("out/m/ckpt.pt", weights_only=True)).double().eval()
    val = read_shard("data/multi/multi_val_000000.bin")[:1001].astype(np.int64)  # token 0 is only read
    tokens = torch.from_numpy(val)
    with torch.no_grad():  # windows of block_size 32 from token 0: 31 whole ones and one of 8 tokens
        nats = sum(float64_loss(model, tokens[s:s + 33]) for s in range(0, 1000, 32))
    assert record["val_tokens"] == 1000
    assert record["val_loss"] == pytest.approx(nats / 1000, rel=1e-5)
    n_bytes = sum(len(chars[t].encode("utf-8")) for t in val[1:])
    assert record["val_bpb"] == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)


# --- the operators ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_head, n_laplacian", [(4, 2), (3, 1), (1, 0)])
def test_laplacian_heads_default_to_half_rounded_down_at_the_end(n_head, n_laplacian):
    """operators.py: laplacian_heads=None means n_head // 2 Laplacian heads, the last ones. Planted
    bug it catches: half rounded up."""
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=n_head, n_embd=4 * n_head,
                          op="laplacian"))
    gamma, delta = model.gamma_delta()
    expected = [0.0] * (n_head - n_laplacian) + [-1.0] * n_laplacian
    assert gamma[0].tolist() == expected and delta[0].tolist() == [1.0 + 2 * g for g in expected]



def test_gamma_min_projects_gamma_onto_the_bound_it_names():
    """operators.py: after every step γ is projected to ≥ gamma_min, whatever gamma_min is (the
    paper's control is 0; -0.3 keeps a head inside the corridor's upper part). Planted bug it
    catches: a clamp to 0 whatever gamma_min says."""
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=3, n_embd=12, op="mix",
                          controls=dict(gamma_init=-0.1, gamma_min=-0.3)))
    with torch.no_grad():  # where an optimizer step might leave the heads
        model.head_operators()[0].gamma.copy_(torch.tensor([-0.9, -0.1, 0.4]))
    model.project()
    assert model.gamma_delta()[0][0].tolist() == pytest.approx([-0.3, -0.1, 0.4])



@pytest.mark.parametrize("frozen", ["gamma", "delta"])
def test_each_learn_flag_freezes_its_own_scalar_only(frozen):
    """README: learn_gamma=False / learn_delta=False freeze that scalar at its init while the other
    learns (the paper's controls, one at a time). Planted bug it catches: learn_delta deciding
    whether γ learns."""
    torch.manual_seed(0)
    controls = dict(gamma_init=-0.5, delta_init=1.5, learn_gamma=frozen != "gamma",
                    learn_delta=frozen != "delta")
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8, op="mix",
                          controls=controls))
    optimizer = model.configure_optimizers(0.0, 0.05, (0.9, 0.95))
    x = torch.randint(0, 16, (4, 8))
    for _ in range(2):
        model(x, x)[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    gamma, delta = model.gamma_delta()
    moved = {"gamma": not gamma.eq(-0.5).all(), "delta": not delta.eq(1.5).all()}
    assert moved == {"gamma": frozen != "gamma", "delta": frozen != "delta"}


# --- what a training step logs ------------------------------------------------------------------------------


def test_mfu_counts_every_micro_step_by_the_palm_formula(workdir, monkeypatch):
    """model.py: MFU = (6N + 12·L·H·Q·T) FLOPs a token × T tokens a sequence × the sequences of an
    iteration (batch_size × gradient_accumulation_steps) / its seconds / the GPU's peak. A CPU has no
    peak, so the run is told one. Planted bugs it catches: one micro-step's sequences, 6 for 12."""
    monkeypatch.setattr("train.peak_flops", lambda device: 1e12)  # as a GPU of 1 TFLOP/s would be
    char_dataset("abc", "abc")
    model = run("--dataset=abc", "--max_iters=2", "--eval_interval=2", "--gradient_accumulation_steps=2",
                "--out_dir=out/mfu")
    N, (L, H, C, T) = model.get_num_params(), (2, 2, 32, 32)  # TINY's sizes
    flops_per_iter = (6 * N + 12 * L * H * (C // H) * T) * T * 2 * 4  # 2 micro-steps of 4 sequences
    for r in read_log("out/mfu", "train"):
        assert r["mfu"] == pytest.approx(flops_per_iter / (r["ms_per_iter"] / 1000) / 1e12, rel=1e-9)



def test_the_logged_gradient_norm_is_the_norm_before_clipping(workdir):
    """README/train.py: the log's grad_norm is the gradient's norm before clipping (its spikes warn
    of instability). At learning rate 0 on data/same every step has the same gradient, recomputed
    here in float64; clipping to 1e-6 must not show. Planted bug it catches: the clipped norm logged.
    (Only the slow suite checked it.)"""
    one_token_dataset()
    run("--dataset=same", "--learning_rate=0", "--min_lr=0", "--max_iters=2", "--eval_interval=2",
        "--grad_clip=1e-6", "--val_tokens=64", "--out_dir=out/g")
    model = GPT.from_checkpoint(torch.load("out/g/ckpt.pt", weights_only=True)).double()
    x = torch.full((4, 32), 7)  # TINY's batch: 4 windows of 32 tokens, all 7
    model(x, x)[1].backward()
    norm = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters() if p.grad is not None))
    assert [r["grad_norm"] for r in read_log("out/g", "train")] == pytest.approx([norm] * 2, rel=1e-4)


# --- one process of a DDP run -------------------------------------------------------------------------------


@pytest.fixture
def rank_of_two(monkeypatch):
    """as_rank(r): train.main then runs as torchrun's rank r of 2 processes, alone: the group it joins
    is a gloo group of one, whose all_reduce adds the other rank's (equal, on data/same) share."""
    def as_rank(rank):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        torchrun_sets = dict(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=port)
        for k, v in torchrun_sets.items():
            monkeypatch.setenv(k, str(v))
        monkeypatch.setattr(hardware, "join_group",
                            lambda run: torch.distributed.init_process_group("gloo", rank=0, world_size=1))
        reduce = torch.distributed.all_reduce
        monkeypatch.setattr(torch.distributed, "all_reduce", lambda t, *a, **k: reduce(t.mul_(2), *a, **k))
    yield as_rank
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture
def training_losses(monkeypatch):
    """The loss of every training forward (micro-steps and the warm-up), in order."""
    losses, forward = [], GPT.forward

    def recording_forward(self, *args, **kwargs):
        logits, loss = forward(self, *args, **kwargs)
        if self.training and loss is not None:
            losses.append(loss.item())
        return logits, loss
    monkeypatch.setattr(GPT, "forward", recording_forward)
    return losses


def test_a_rank_of_two_takes_half_the_micro_steps_and_logs_the_worlds_tokens_and_losses(
        workdir, rank_of_two, training_losses):
    """README: gradient_accumulation_steps is shared by the DDP processes, each taking its share of
    the micro-steps; the tokens per iteration count every process's, and the logged losses are the
    world's means. Rank 0 of 2 on data/same logs what one process logs. Planted bugs it catches: each
    rank taking every micro-step, tokens of one rank, the train-loss estimate summed over ranks but
    not divided by their number."""
    one_token_dataset()
    args = TINY + ["--dataset=same", "--learning_rate=0", "--min_lr=0", "--max_iters=1", "--eval_interval=1",
                   "--gradient_accumulation_steps=4", "--val_tokens=640"]  # 20 whole windows, 10 a rank
    train.main(args + ["--out_dir=out/one"])
    assert len(training_losses) == 1 + 4  # the warm-up, then 4 micro-steps an iteration
    training_losses.clear()
    rank_of_two(0)
    train.main(args + ["--out_dir=out/rank0"])
    assert len(training_losses) == 1 + 2  # 2 of the 4 micro-steps: the other rank takes 2
    for key, event in (("tokens", "train"), ("loss", "train"), ("tokens", "eval"), ("val_loss", "eval"),
                       ("train_loss", "eval")):
        one, rank0 = ([r[key] for r in read_log(out, event)] for out in ("out/one", "out/rank0"))
        assert rank0 == pytest.approx(one, rel=1e-6), key
    assert read_log("out/rank0", "train")[-1]["tokens"] == 4 * 4 * 32  # micro-steps × B × T


def test_each_rank_draws_its_own_dropout_masks(workdir, rank_of_two, training_losses):
    """train.py: dropout's seed depends on (seed, iteration, rank): on the same batch, at learning
    rate 0, ranks 0 and 1 of a run lose differently at every step (the same masks on every rank
    would waste dropout's noise). Planted bug it catches: the rank left out of the seed."""
    one_token_dataset()
    args = TINY + ["--dataset=same", "--dropout=0.2", "--learning_rate=0", "--min_lr=0", "--max_iters=2",
                   "--eval_interval=2", "--gradient_accumulation_steps=2", "--val_tokens=64"]
    steps = {}
    for rank in (0, 1):
        rank_of_two(rank)
        train.main(args + [f"--out_dir=out/rank{rank}"])
        steps[rank] = training_losses[1:]  # after the warm-up, which every rank does alike
        training_losses.clear()
        torch.distributed.destroy_process_group() if torch.distributed.is_initialized() else None
    assert len(steps[0]) == len(steps[1]) == 2
    assert all(a != b for a, b in zip(steps[0], steps[1])), steps


# --- the run directory --------------------------------------------------------------------------------------


def test_save_every_keeps_the_checkpoints_of_its_iterations_only(workdir):
    """train.py: save_every keeps ckpt_NNNNNN.pt at every save_every-th iteration (evaluated there),
    beside ckpt.pt; the last of them holds what ckpt.pt holds. Planted bug it catches: the copies
    kept at the other evaluations. (The slow suite also resumes from such a run.)"""
    char_dataset("abc", "abc")
    run("--dataset=abc", "--max_iters=4", "--eval_interval=1", "--save_every=2", "--out_dir=out/s")
    assert sorted(f for f in os.listdir("out/s") if f.startswith("ckpt_")) == ["ckpt_000002.pt",
                                                                                "ckpt_000004.pt"]
    two, four, last = (torch.load(f"out/s/{f}", weights_only=True)
                       for f in ("ckpt_000002.pt", "ckpt_000004.pt", "ckpt.pt"))
    assert (two["iter_num"], four["iter_num"], last["iter_num"]) == (2, 4, 4)
    assert all(torch.equal(four["model"][k], last["model"][k]) for k in last["model"])
    assert not all(torch.equal(two["model"][k], last["model"][k]) for k in last["model"])  # it trained on
