"""
The KV-cache GPT.generate, bench.py --what=sample, sample.py --init_from=gpt2 and its temperatures, and a run
trained with the fused kernel sampled where triton is missing.

The reference is nanoGPT's generate, written here again: a full forward over the whole (cropped) context for
every new token. Cached generation must pick the same tokens from the same logits, in float64, for every op
and impl, past block_size (where the cache is rebuilt from the last block_size tokens). No network needed:
GPT-2 is a random tiny one saved locally and tiktoken's GPT-2 BPE is replaced by a tiny byte-level encoding.

    python -m pytest -q tests/test_generate.py
"""
import os
import subprocess
import sys
import types

import pytest
import tiktoken
import torch

import bench
from support.configurator import ConfigError
from support.dataloader import DataError, gpt2_encoding
import sample
import train
from helpers import QUICK, ROOT, char_dataset, workdir  # noqa: F401 (a fixture)
from model import GPT, GPTConfig

BLOCK = 16


def tiny_model(op, impl="sdpa", dtype=torch.float64, **controls):
    """A tiny random model; the mix op gets a random γ and δ per head (so that a·v really matters)."""
    torch.manual_seed(0)
    config = GPTConfig(block_size=BLOCK, vocab_size=32, n_layer=2, n_head=4, n_embd=64, op=op, impl=impl,
                       controls=controls)
    model = GPT(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5)  # sharper attention and logits than GPT-2's init, so that every position matters
        if op == "mix":
            for head_op in model.head_operators():
                head_op.gamma.uniform_(-1.0, 0.5)
                head_op.delta.uniform_(0.5, 1.5)
    return model


def prompts(B=3, T=5):
    return torch.randint(0, 32, (B, T), generator=torch.Generator().manual_seed(1))


def full_forward_per_token(model, idx, max_new_tokens, temperature=0, top_k=None):
    """nanoGPT's generate: the tokens, and the logits each was drawn from."""
    seen = []
    for _ in range(max_new_tokens):
        logits = model(idx[:, -model.config.block_size:])[0][:, -1, :]  # (B, vocab)
        seen.append(logits)
        if temperature == 0:
            next_token = logits.argmax(-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                logits = logits.masked_fill(logits < logits.topk(top_k).values[:, [-1]], float("-inf"))
            next_token = torch.multinomial(logits.softmax(-1), num_samples=1)
        idx = torch.cat((idx, next_token), dim=1)
    return idx, seen


def generate_recorded(model, monkeypatch, idx, max_new_tokens, **kw):
    """model.generate(...), and what it fed the model each step (the lengths) and the logits it got back."""
    lengths, seen = [], []
    forward = model.forward

    def recording(idx, *args, **kwargs):
        lengths.append(idx.size(1))
        logits, loss = forward(idx, *args, **kwargs)
        seen.append(logits[:, -1, :])
        return logits, loss
    monkeypatch.setattr(model, "forward", recording)
    out = model.generate(idx, max_new_tokens, **kw)
    monkeypatch.undo()
    return out, lengths, seen


# --- generation with the cache equals a full forward per token ----------------------------------------------


@pytest.mark.parametrize("impl", ["sdpa", "materialized"])
@pytest.mark.parametrize("op", ["mix", "laplacian", "attention"])
def test_greedy_generation_equals_a_full_forward_per_token(monkeypatch, op, impl):
    """Through two crossings of block_size: the context grows to 5 + 40 = 45 tokens > 2·block_size."""
    model, idx, n = tiny_model(op, impl), prompts(), 40
    got, lengths, seen = generate_recorded(model, monkeypatch, idx, n, temperature=0)
    want, want_seen = full_forward_per_token(model, idx, n)
    assert torch.equal(got, want)
    for step, (logits, reference) in enumerate(zip(seen, want_seen)):
        assert (logits - reference).abs().max() < 1e-10, f"step {step}"
    # the cache is really used: the prompt, then one token at a time until the context fills block_size; from
    # then on (positions are absolute) each token's forward is over the last block_size tokens
    assert lengths == [5] + [1] * (BLOCK - 5) + [BLOCK] * (n - 1 - (BLOCK - 5))


@pytest.mark.slow
def test_triton_prompt_then_cached_tokens_equal_its_full_forward(monkeypatch, kernel_device):
    """impl=triton computes the prompt with the fused kernel; one-token queries go through SDPA."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model = tiny_model("mix", impl="triton", dtype=torch.float32).to(kernel_device)
    idx, n = prompts(B=2).to(kernel_device), BLOCK - 5 + 3  # the prompt, 10 cached tokens, 3 rebuilt caches
    got, _, seen = generate_recorded(model, monkeypatch, idx, n, temperature=0)
    want, want_seen = full_forward_per_token(model, idx, n)
    assert torch.equal(got, want)
    for step, (logits, reference) in enumerate(zip(seen, want_seen)):
        assert torch.allclose(logits, reference, rtol=1e-4, atol=1e-4), f"step {step}"


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.7, 5)])
@pytest.mark.slow
def test_sampling_with_a_seed_gives_the_uncached_tokens(temperature, top_k):
    model, idx, n = tiny_model("mix"), prompts(), 2 * BLOCK + 5
    torch.manual_seed(7)
    got = model.generate(idx, n, temperature=temperature, top_k=top_k)
    torch.manual_seed(7)
    want, _ = full_forward_per_token(model, idx, n, temperature=temperature, top_k=top_k)
    assert torch.equal(got, want)
    assert len(set(got[:, 5:].flatten().tolist())) > 3  # really sampled, not stuck on one token


def test_a_batch_of_prompts_generates_what_each_prompt_generates_alone():
    model, idx = tiny_model("laplacian"), prompts()
    batch = model.generate(idx, 25, temperature=0)
    for b in range(idx.size(0)):
        assert torch.equal(batch[b:b + 1], model.generate(idx[b:b + 1], 25, temperature=0))
    assert not torch.equal(batch[0], batch[1])  # different prompts, different continuations


def test_a_prompt_longer_than_block_size_is_cropped_as_nanogpt_does():
    model, idx = tiny_model("mix"), prompts(T=BLOCK + 3)
    assert torch.equal(model.generate(idx, 4, temperature=0), full_forward_per_token(model, idx, 4)[0])


# --- bench.py --what=sample ---------------------------------------------------------------------------------


def test_bench_sample_reports_the_ratio_of_the_times_it_measured(monkeypatch, capsys):
    """A fake clock that ticks once per token the model is fed: the cached generate feeds the prompt and then
    each new token once (n tokens), a full forward per token feeds the whole context every time
    (1 + 2 + ... + n). The second repeat runs on a machine twice as busy: the bench keeps the best of each."""
    clock = types.SimpleNamespace(now=0.0, calls=0)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    forward = GPT.forward

    def ticking(model, idx, *args, **kwargs):
        clock.calls += 1
        clock.now += idx.numel() * (2 if clock.calls > 2 * n else 1)  # each repeat calls forward 2n times
        return forward(model, idx, *args, **kwargs)
    n = 10
    monkeypatch.setattr(GPT, "forward", ticking)
    monkeypatch.setattr(bench, "SAMPLE_MODELS", {"tiny": dict(n_layer=1, n_head=2, n_embd=16, vocab_size=64)})
    monkeypatch.setattr(bench, "SAMPLE_NEW_TOKENS", n)
    rows = bench.main(["--what=sample", "--repeats=2"])
    r = rows["tiny"]
    assert r["cached_s"] == n and r["full_s"] == n * (n + 1) / 2 and r["speedup"] == (n + 1) / 2
    assert r["same_tokens"] is True
    out = capsys.readouterr().out
    assert f"{n} new tokens" in out and "best of 2" in out
    assert (f"| tiny | {n / n * 1000:.2f} | {n * (n + 1) / 2 / n * 1000:.2f} | {(n + 1) / 2:.2f}× | True |"
            in out)


# --- sample.py --init_from=gpt2 -----------------------------------------------------------------------------


@pytest.fixture
def tiny_gpt2(tmp_path, monkeypatch):
    """A random tiny GPT-2 saved by transformers, and a byte-level stand-in for tiktoken's GPT-2 BPE."""
    transformers = pytest.importorskip("transformers")
    enc = tiktoken.Encoding(
        name="tiny",
        pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
        mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={"<|endoftext|>": 256})
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: enc)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=32, n_embd=32, n_layer=2, n_head=4, vocab_size=enc.n_vocab)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.mul_(5)  # sharper than GPT-2's init, so that greedy text depends on the op
    hf.save_pretrained(tmp_path / "gpt2")
    return hf, str(tmp_path / "gpt2"), enc


def one_line_error(argv):
    with pytest.raises(SystemExit) as e:
        sample.main(argv)
    message = str(e.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def test_sample_from_gpt2_weights_continues_as_gpt2_does(tiny_gpt2):
    hf, path, enc = tiny_gpt2
    idx = torch.tensor([enc.encode("Hello")])
    with torch.no_grad():
        for _ in range(10):  # greedy, with transformers' own model
            idx = torch.cat((idx, hf(idx).logits[:, -1, :].argmax(-1, keepdim=True)), dim=1)
    args = [f"--init_from={path}", "--start=Hello", "--num_samples=1", "--max_new_tokens=10",
            "--temperature=0"]
    assert sample.main(args) == [enc.decode(idx[0].tolist())]
    laplacian = sample.main(args + ["--op=laplacian", "--laplacian_heads=2"])
    mix = sample.main(args + ["--op=mix", "--gamma_init=-0.8"])
    assert len({laplacian[0], mix[0], enc.decode(idx[0].tolist())}) == 3  # each op computes something else
    assert all(text.startswith("Hello") for text in laplacian + mix)
    assert one_line_error(args + ["--op=softmax"]).startswith(
        "error: op='softmax' is not allowed: choose one of")


def test_temperature_takes_its_documented_least_value_and_refuses_below_it(tiny_gpt2):
    """0.001, the least temperature sample.py takes, samples (so sharp a distribution draws the greedy
    tokens); 0.0009 is refused by the one line that names the rule; 0 is greedy, whatever the seed."""
    hf, path, enc = tiny_gpt2
    idx = torch.tensor([enc.encode("Hello")])
    with torch.no_grad():
        for _ in range(10):  # greedy, with transformers' own model
            idx = torch.cat((idx, hf(idx).logits[:, -1, :].argmax(-1, keepdim=True)), dim=1)
    args = [f"--init_from={path}", "--start=Hello", "--num_samples=2", "--max_new_tokens=10"]
    greedy = [enc.decode(idx[0].tolist())] * 2
    assert sample.main(args + ["--temperature=0", "--seed=1"]) == sample.main(args + ["--temperature=0"]) \
        == greedy
    assert sample.main(args + ["--temperature=0.001"]) == greedy
    assert one_line_error(args + ["--temperature=0.0009"]) == (
        "error: temperature=0.0009 is not allowed: give 0 (greedy) or a temperature ≥ 0.001")


def test_the_seed_decides_the_samples(tiny_gpt2):
    """--seed seeds the sampling: the same seed draws the same texts again, another seed other texts."""
    args = [f"--init_from={tiny_gpt2[1]}", "--start=Hello", "--num_samples=2", "--max_new_tokens=20"]
    texts = sample.main(args + ["--seed=1"])
    assert sample.main(args + ["--seed=1"]) == texts != sample.main(args + ["--seed=2"])


@pytest.mark.parametrize("start", ['"a\\nb"', "a\\nb", "'x'"])
def test_the_prompt_is_taken_as_typed(tiny_gpt2, start):
    """--start is text: its quotes and backslashes stay (no Python literal is read in it)."""
    args = [f"--init_from={tiny_gpt2[1]}", f"--start={start}", "--num_samples=1", "--max_new_tokens=0"]
    assert sample.main(args) == [start]


def test_sample_from_gpt2_offline_gives_the_data_preparers_error(tiny_gpt2, monkeypatch):
    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(DataError) as e:
        gpt2_encoding()
    assert one_line_error([f"--init_from={tiny_gpt2[1]}"]) == f"error: {e.value}"


@pytest.mark.parametrize("args, words", [
    (["--op=laplacian"],
     "error: --op applies to GPT-2 weights (--init_from=gpt2): a checkpoint's op is fixed"),
    (["--gamma_init=-0.5"], "error: --gamma_init applies to GPT-2 weights"),
    (["--init_from=gpt3"], "error: unknown pretrained model 'gpt3': use one of gpt2, gpt2-medium"),
])
def test_sample_op_settings_need_gpt2_weights(args, words):
    assert one_line_error(args).startswith(words)


def test_sample_picks_its_device_as_train_does(monkeypatch):
    """No --device: auto, train.py's rule (cuda > mps > cpu), so that a GPU user samples on the GPU."""
    picked = []
    def pick_device(dev, local_rank=None):
        picked.append(dev)
        raise ConfigError("picked")
    monkeypatch.setattr(sample, "pick_device", pick_device)
    assert one_line_error([]) == "error: picked" and picked == ["auto"]


@pytest.mark.parametrize("op", ["attention", "laplacian"])
def test_a_checkpoint_checked_on_the_meta_device_gives_a_whole_model(op):
    """sample.py's start-up: the checkpoint's shapes are checked on the meta device first (which, since its
    random initialisation needs it, imports torch._dynamo: about 1.5 s of CPU); the model it then returns
    holds real tensors only, its tied head and the buffers no checkpoint saves (an op's a, b) included."""
    config = GPTConfig(block_size=BLOCK, vocab_size=32, n_layer=2, n_head=4, n_embd=64, op=op)
    model = GPT(config).eval()
    again = GPT.from_checkpoint({"model": model.state_dict(), "model_args": vars(config)}).eval()
    assert not any(t.is_meta for t in [*again.parameters(), *again.buffers()])
    assert again.lm_head.weight is again.transformer.wte.weight
    idx = torch.randint(0, 32, (2, BLOCK))
    assert torch.equal(model(idx)[0], again(idx)[0])


CHARS = "abcdefghij ()=:\n"  # the tiny run's char vocabulary


# --- a run trained with the fused kernel, sampled where triton is missing -----------------------------------

# Runs a script (argv[1], then its arguments) as `python script ...` does, in a Python where triton cannot be
# imported, as on a laptop without it: `import triton` fails and importlib finds no triton package.
WITHOUT_TRITON = """if 1:
    import os, runpy, sys
    sys.modules["triton"] = None
    script = sys.argv.pop(1)
    sys.argv[0], sys.path[0] = script, os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")"""


@pytest.mark.slow
def test_a_run_trained_with_the_kernel_samples_and_draws_where_triton_is_missing(workdir, kernel_device):
    """A run trained with impl=triton (on a CPU in the interpreter), handed to a machine without triton and
    without TRITON_INTERPRET: sample.py and corridor.py --text, run as a user runs them, use SDPA."""
    char_dataset("tiny", CHARS)
    train.main(QUICK + ["--impl=triton", "--dataset=tiny", "--val_tokens=64", "--out_dir=run",
                        f"--device={kernel_device}"])
    assert torch.load("run/ckpt.pt", weights_only=True)["model_args"]["impl"] == "triton"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}

    def user_runs(script, *args):
        return subprocess.run([sys.executable, "-c", WITHOUT_TRITON, os.path.join(ROOT, script), *args],
                              capture_output=True, text=True, env=env, timeout=300)
    args = ["--out_dir=run", "--start=if a", "--num_samples=2", "--max_new_tokens=12"]
    p = user_runs("sample.py", *args)
    assert p.returncode == 0 and p.stderr == "", p.stderr[-2000:]
    assert p.stdout == "".join(t + "\n---------------\n" for t in sample.main(args))  # the SDPA model's
    p = user_runs("corridor.py", "run", "--text=if a(b): c", "--out=figs")
    assert p.returncode == 0 and p.stderr == "", p.stderr[-2000:]
    assert open("figs/operators.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
