"""
The numbers users trust, recomputed by hand: each test states one promise of the README or a module
docstring and checks it against a float64 (or pencil-and-paper) reference on a tiny model or tiny data.
Each was written against a planted bug that the rest of the fast suite let through (named in its
docstring).

    python -m pytest -q tests/test_promises.py
"""
import math

import numpy as np
import pytest
import torch

from model import GPT, GPTConfig
from support.dataloader import read_shard
from helpers import char_dataset, read_log, run, workdir  # noqa: F401  (workdir is a fixture)


def float64_loss(model, tokens):
    """The summed next-token loss of every token but the first, in float64: tokens (T+1,)."""
    x, y = tokens[None, :-1], tokens[None, 1:]
    logits, _ = model(x, y)
    return torch.nn.functional.cross_entropy(logits[0], y[0], reduction="sum").item()


# --- the val loss and bits per byte -------------------------------------------------------------------------


def test_val_loss_is_nats_per_token_and_bpb_divides_by_the_utf8_bytes(workdir):
    """README: the val loss is the mean over the first val_tokens of the val split, read in order
    (block_size windows, the last shorter); val_bpb = val_loss / ln 2 × tokens / bytes, the bytes of
    the predicted characters (1, 2 and 3 of them here). Planted bugs it catches: a short last window
    weighted as a full one, ln 2 dropped, tokens/bytes inverted, the unpredicted first token's bytes
    counted, one val token too few."""
    chars = "ab\né✓"
    char_dataset("multi", chars)
    run("--dataset=multi", "--max_iters=2", "--eval_interval=2", "--val_tokens=1000", "--out_dir=out/m")
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


# --- what a training step logs ------------------------------------------------------------------------------


def test_mfu_counts_every_micro_step_by_the_palm_formula(workdir, monkeypatch):
    """model.py: MFU = (6N + 12·L·H·Q·T) FLOPs a token × T tokens a sequence × the sequences of an
    iteration (batch_size × gradient_accumulation_steps) / its seconds / the GPU's peak. A CPU has no
    peak, so the run is told one. Planted bugs it catches: one micro-step's sequences, 6 for 12."""
    monkeypatch.setattr("train.peak_flops", lambda device: 1e12)  # as a GPU of 1 TFLOP/s would be
    model = run("--max_iters=3", "--eval_interval=3", "--gradient_accumulation_steps=2", "--out_dir=out/mfu")
    N, (L, H, C, T) = model.get_num_params(), (2, 2, 32, 32)  # TINY's sizes
    flops_per_iter = (6 * N + 12 * L * H * (C // H) * T) * T * 2 * 4  # 2 micro-steps of 4 sequences
    for r in read_log("out/mfu", "train"):
        assert r["mfu"] == pytest.approx(flops_per_iter / (r["ms_per_iter"] / 1000) / 1e12, rel=1e-9)
