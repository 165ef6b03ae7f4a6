"""
Tests for prepare_data.py: tokenizers, the shard format, corpus preparation and the ShardLoader.
No network needed (GPT-2 BPE is replaced by a tiny byte-level tiktoken encoding).

    python -m pytest -q test_data.py
"""
import json
import os
import subprocess
import sys
import urllib.error

import numpy as np
import pytest
import tiktoken
import torch

import dataloader as dl
import prepare_data as pd
from dataloader import DataError, ShardLoader

DOCS = ["Hello world, this is the first document.\nIt has two lines.",
        "The second one: numbers 12345 and ünïcödé ✓.",
        "A third, short one."]


@pytest.fixture
def tiny_enc(monkeypatch):
    """A GPT-2-shaped encoding without a download: 256 byte tokens + end-of-text 256."""
    enc = tiktoken.Encoding(
        name="tiny", pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
        mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={"<|endoftext|>": 256})
    monkeypatch.setattr(pd, "gpt2_encoding", lambda: enc)
    return enc


def all_tokens(data_dir, split):
    return np.concatenate([dl.read_shard(f) for f in dl.find_shards(data_dir, split)]).tolist()


def one_line_error(excinfo):
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


# -----------------------------------------------------------------------------
# shard format

def test_header_round_trip(tmp_path):
    path = str(tmp_path / "x_train_000001.bin")
    dl.write_shard(path, [0, 1, 65535, 7])
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[:3].tolist() == [20240520, 1, 4] and not header[3:].any()
    assert os.path.getsize(path) == 256 * 4 + 4 * 2
    assert dl.read_shard(path).tolist() == [0, 1, 65535, 7]
    assert not os.path.exists(path + ".tmp")


def corrupt(path, case):
    """Write a shard at path broken in one way."""
    tokens = np.arange(100, dtype=np.uint16)
    dl.write_shard(path, tokens)
    header = np.fromfile(path, dtype="<i4", count=256)
    if case in ("magic", "version", "count"):
        header[{"magic": 0, "version": 1, "count": 2}[case]] += 1
        with open(path, "r+b") as f:
            f.write(header.tobytes())
    elif case == "short":
        dl.write_shard(path, tokens[:10])


@pytest.mark.parametrize("case, message", [
    ("magic", "wrong magic number"), ("version", "unsupported shard version"),
    ("count", "header says 101 tokens but the file holds 100"),
    ("vocab", "token id 99 is >= the model's vocab_size 50"),
    ("short", "10 tokens is shorter than one batch"), ("missing", r"no train shards matching \*_train_\*.bin")])
def test_corrupt_shards(tmp_path, case, message):
    if case != "missing":
        corrupt(str(tmp_path / "x_train_000001.bin"), case)
    with pytest.raises(DataError, match=message) as excinfo:
        ShardLoader(str(tmp_path), "train", batch_size=2, block_size=8, vocab_size=50)
    assert case == "missing" or "x_train_000001.bin" in one_line_error(excinfo)


# -----------------------------------------------------------------------------
# corpora and tokenizers

@pytest.mark.parametrize("tokenizer", ["char", "byte", "gpt2"])
def test_round_trip(tmp_path, tiny_enc, tokenizer):
    data_dir = pd.prepare_documents("tiny", DOCS, str(tmp_path), tokenizer, val_fraction=0.3)
    meta = dl.load_meta(data_dir)
    assert meta["tokenizer"] == tokenizer and meta["name"] == "tiny"
    encode, decode = pd.get_tokenizer(meta)
    train, val = pd.split_documents(DOCS, 0.3)
    assert "".join(train + val) == "".join(DOCS) and val[-1] == DOCS[-1]  # the cut falls inside document 2
    for split, docs in (("train", train), ("val", val)):
        tokens = all_tokens(data_dir, split)
        assert meta["tokens"][split] == len(tokens) and max(tokens) < meta["vocab_size"]
        text = "".join("<|endoftext|>" + d for d in docs) if tokenizer == "gpt2" else pd.DOC_SEPARATOR.join(docs)
        assert encode(text) == tokens
        # through the loader: one batch of a single block spans the whole shard
        loader = ShardLoader(data_dir, split, batch_size=1, block_size=len(tokens) - 1, vocab_size=meta["vocab_size"])
        x, y = loader.next_batch()
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (1, len(tokens) - 1)
        assert (x[0, 1:] == y[0, :-1]).all()
        assert decode(x[0].tolist() + y[0, -1:].tolist()) == text


def test_char_vocabulary_error():
    encode, decode = pd.get_tokenizer({"tokenizer": "char", "chars": "ab", "vocab_size": 2})
    assert decode(encode("abba") + [5]) == "abba"  # ids past the vocabulary (model padding) are skipped
    with pytest.raises(DataError, match="'z' are not in this dataset's vocabulary"):
        encode("abz")


def test_text_folder(tmp_path):
    folder = tmp_path / "books"
    folder.mkdir()
    (folder / "a.txt").write_text("first book " * 10, encoding="utf-8")
    (folder / "b.txt").write_text("second bk. " * 10, encoding="utf-8")
    (folder / "notes.md").write_text("ignored", encoding="utf-8")
    out = str(tmp_path / "data")
    pd.prepare("text", input=str(folder), out_dir=out, shard_size=30, val_fraction=0.5)
    data_dir = pd.prepare("text", input=str(folder), out_dir=out, val_fraction=0.5)  # again: stale shards go
    assert data_dir == os.path.join(out, "books")
    assert sorted(os.listdir(data_dir)) == ["books_train_000001.bin", "books_val_000000.bin", "meta.json"]
    _, decode = pd.get_tokenizer(dl.load_meta(data_dir))
    assert decode(all_tokens(data_dir, "train")) == "first book " * 10
    assert decode(all_tokens(data_dir, "val")) == "second bk. " * 10
    (folder / "c.txt").write_bytes(b"caf\xe9")
    with pytest.raises(DataError, match="c.txt is not UTF-8"):
        pd.prepare("text", input=str(folder), out_dir=out)
    with pytest.raises(DataError, match="does not exist"):
        pd.prepare("text", input=str(tmp_path / "nope.txt"), out_dir=out)


def test_shakespeare_offline(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")
    monkeypatch.setattr("urllib.request.urlopen", offline)
    with pytest.raises(DataError, match=r"python prepare_data.py text --input=PATH") as excinfo:
        pd.prepare("shakespeare_char", out_dir=str(tmp_path))
    assert "no network" in one_line_error(excinfo)
    assert not os.path.exists(tmp_path / "shakespeare_char")


def test_pydocs_and_ensure_prepared(tmp_path, capsys):
    out = str(tmp_path)
    data_dir = pd.ensure_prepared("pydocs", out_dir=out)  # prepared on the fly: it needs no download
    assert "preparing the offline default corpus" in capsys.readouterr().out
    meta = dl.load_meta(data_dir)
    assert meta["tokenizer"] == "char" and sum(meta["tokens"].values()) > 200_000
    assert 0.05 < meta["tokens"]["val"] / meta["tokens"]["train"] < 0.15
    assert pd.ensure_prepared("pydocs", out_dir=out) == data_dir and capsys.readouterr().out == ""
    with pytest.raises(DataError, match=r"`python prepare_data.py text --input=PATH --name=mybooks --out_dir="):
        pd.ensure_prepared("mybooks", out_dir=out)
    with pytest.raises(DataError, match=r"`python prepare_data.py shakespeare_char`"):
        pd.ensure_prepared("shakespeare_char")


def test_missing_meta_is_an_error(tmp_path):
    dl.write_shard(str(tmp_path / "x_train_000001.bin"), [1, 2, 3])
    with pytest.raises(DataError, match="has no meta.json"):
        dl.load_meta(str(tmp_path))


def test_openwebtext_offline_pipeline(tmp_path, tiny_enc):
    import datasets
    docs = [f"document {i}: " + "words and more words " * (i % 7 + 1) for i in range(200)]
    data_dir = pd.prepare_openwebtext(str(tmp_path), shard_size=2000, val_fraction=0.05, num_proc=2,
                                      dataset=datasets.Dataset.from_dict({"text": docs}), encoding=tiny_enc)
    meta = dl.load_meta(data_dir)
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 257
    assert len(dl.find_shards(data_dir, "train")) > 3 and len(dl.find_shards(data_dir, "val")) == 1
    assert dl.find_shards(data_dir, "train")[0].endswith("openwebtext_train_000001.bin")
    texts = {}
    for split in ("train", "val"):
        tokens = all_tokens(data_dir, split)
        assert len(tokens) == meta["tokens"][split] and tokens[0] == 256
        texts[split] = tiny_enc.decode(tokens).split("<|endoftext|>")[1:]
    assert len(texts["val"]) == 10 and sorted(texts["train"] + texts["val"]) == sorted(docs)


def test_cli_errors_are_one_line(tmp_path):
    result = subprocess.run([sys.executable, "prepare_data.py", "text", f"--input={tmp_path}/nope"],
                            capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(pd.__file__)))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("error: --input=") and result.stderr.count("\n") == 1


# -----------------------------------------------------------------------------
# the loader

def write_counting_shards(data_dir, sizes):
    """Shards whose tokens count up 0, 1, 2, ... across all of them, so every token says where it came from."""
    start = 0
    for i, n in enumerate(sizes):
        dl.write_shard(os.path.join(data_dir, f"c_train_{i + 1:06d}.bin"), np.arange(start, start + n))
        start += n


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_never_overlap(tmp_path, world_size):
    write_counting_shards(str(tmp_path), [1000, 700])
    loaders = [ShardLoader(str(tmp_path), "train", 2, 16, rank, world_size) for rank in range(world_size)]
    for step in range(12):
        xs = [loader.next_batch()[0] for loader in loaders]
        seen = [t for x in xs for t in x.flatten().tolist()]
        assert len(set(seen)) == len(seen)  # disjoint
        assert all((row == torch.arange(row[0], row[0] + 16)).all() for x in xs for row in x)  # rows are windows


def test_one_process_sees_what_the_ranks_see(tmp_path):
    """Gradient accumulation over world_size micro-steps reads exactly the windows of one DDP step (within a
    shard: at a shard's end the two may drop different leftovers)."""
    write_counting_shards(str(tmp_path), [1000, 700])
    single = ShardLoader(str(tmp_path), "train", 2, 16)
    ranks = [ShardLoader(str(tmp_path), "train", 2, 16, rank, 2) for rank in range(2)]
    for step in range(62 // 4):  # the first shard holds 62 windows of 16 + 1 tokens
        for rank in ranks:
            assert torch.equal(single.next_batch()[0], rank.next_batch()[0])


def test_an_epoch_visits_every_window_once_in_shuffled_order(tmp_path):
    write_counting_shards(str(tmp_path), [321])
    loader = ShardLoader(str(tmp_path), "train", batch_size=2, block_size=10)
    firsts = [row[0].item() for _ in range(16) for row in loader.next_batch()[0]]  # 32 windows of 10 + 1 tokens
    assert sorted(firsts) == list(range(0, 320, 10)) and firsts != sorted(firsts)
    assert loader.state_dict()["epoch"] == 0
    later = [row[0].item() for _ in range(15) for row in loader.next_batch()[0]]
    assert loader.state_dict()["epoch"] == 1 and len({t % 10 for t in later}) == 1  # one seeded offset per epoch


def test_loader_state_resumes_across_shards_and_epochs(tmp_path):
    write_counting_shards(str(tmp_path), [300, 200, 250])
    loader = ShardLoader(str(tmp_path), "train", batch_size=2, block_size=20, seed=3)
    first = [loader.next_batch() for _ in range(5)]
    state = json.loads(json.dumps(loader.state_dict()))  # a checkpoint stores it as JSON
    rest = [loader.next_batch() for _ in range(40)]
    assert loader.state_dict()["epoch"] >= 2  # crossed shard and epoch boundaries
    offsets = {x[0, 0].item() % 20 for x, _ in rest if x[0, 0].item() < 300}  # windows of the first shard
    assert offsets - {0}  # a later epoch starts at a seeded offset, not at the same block boundaries
    resumed = ShardLoader(str(tmp_path), "train", batch_size=2, block_size=20, seed=3)
    resumed.load_state_dict(state)
    for (x, y), (x2, y2) in zip(rest, (resumed.next_batch() for _ in rest)):
        assert (x == x2).all() and (y == y2).all() and (y[:, :-1] == x[:, 1:]).all()
    resumed.reset()
    assert all((x == resumed.next_batch()[0]).all() for x, _ in first)
