"""
Tests for prepare_data.py and dataloader.py: tokenizers, the shard format, corpus preparation (the hub corpora
included) and the ShardLoader. No network needed: GPT-2 BPE is replaced by a tiny byte-level tiktoken
encoding, and the Hugging Face hub by FakeHub, which serves small files the tests write.

    python -m pytest -q tests/test_data.py            # -m "not slow" skips the two tiny training runs
"""
import errno
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
from types import SimpleNamespace

import huggingface_hub
from huggingface_hub import errors as hub_errors
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken
import torch

from support import dataloader as dl
from support import rundir
import prepare_data as pd
from support.dataloader import DataError, ShardLoader
from helpers import FakeHub, parquet_bytes, tiny_enc, write_shard  # noqa: F401 (tiny_enc is a fixture)

DOCS = ["Hello world, this is the first document.\nIt has two lines.",
        "The second one: numbers 12345 and ünïcödé ✓.",
        "A third, short one."]


def all_tokens(data_dir, split):
    return np.concatenate([dl.read_shard(f) for f in dl.find_shards(data_dir, split)]).tolist()


def one_line_error(excinfo):
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


REPO_DIR = os.path.dirname(os.path.abspath(pd.__file__))


def run_cli(*args):
    return subprocess.run([sys.executable, os.path.join(REPO_DIR, "prepare_data.py"), *args],
                          capture_output=True, text=True, cwd=REPO_DIR)


# -----------------------------------------------------------------------------
# shard format

def test_header_round_trip(tmp_path):
    path = str(tmp_path / "x_train_000001.bin")
    write_shard(path, [0, 1, 65535, 7])
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[:3].tolist() == [20240520, 1, 4] and not header[3:].any()
    assert os.path.getsize(path) == 256 * 4 + 4 * 2
    assert dl.read_shard(path).tolist() == [0, 1, 65535, 7]
    assert not os.path.exists(path + ".tmp")


def corrupt(path, case):
    """Write a shard at path broken in one way."""
    tokens = np.arange(100, dtype=np.uint16)
    write_shard(path, tokens)
    header = np.fromfile(path, dtype="<i4", count=256)
    if case in ("magic", "version", "count", "extra"):
        header[{"magic": 0, "version": 1, "count": 2, "extra": 2}[case]] += 1 if case != "extra" else -1
        with open(path, "r+b") as f:
            f.write(header.tobytes())
    elif case == "short":
        write_shard(path, tokens[:10])


@pytest.mark.parametrize("case, message", [
    ("magic", "wrong magic number"), ("version", "unsupported shard version"),
    ("count", "header says 101 tokens but the file holds 100"),
    ("extra", "header says 99 tokens but the file holds 100"),
    ("vocab", "token id 99 is >= the model's vocab_size 50"),
    ("short", "10 tokens is shorter than one batch"),
    ("missing", r"no train shards matching \*_train_\*.bin")])
def test_corrupt_shards(tmp_path, case, message):
    if case != "missing":
        corrupt(str(tmp_path / "x_train_000001.bin"), case)
    with pytest.raises(DataError, match=message) as excinfo:
        ShardLoader(str(tmp_path), "train", batch_size=2, block_size=8, vocab_size=50)
    assert case == "missing" or "x_train_000001.bin" in one_line_error(excinfo)


def test_vocab_check_is_exact(tmp_path):
    """A token id equal to vocab_size is already out of range; vocab_size - 1 is the last one allowed."""
    path = str(tmp_path / "x_train_000001.bin")
    write_shard(path, [0, 49, 3])
    assert dl.read_shard(path, vocab_size=50).tolist() == [0, 49, 3]
    write_shard(path, [0, 50, 3])
    with pytest.raises(DataError, match="token id 50 is >= the model's vocab_size 50"):
        dl.read_shard(path, vocab_size=50)


def test_an_empty_shard_is_just_a_header_and_a_shorter_file_is_refused(tmp_path):
    """A shard of 0 tokens is the 1024-byte header alone, read back (vocab check included) as no tokens; a
    file one byte shorter than the header is not a shard."""
    path = str(tmp_path / "x_train_000001.bin")
    write_shard(path, np.array([], dtype=np.uint16))
    assert (os.path.getsize(path) == 1024
            and np.fromfile(path, dtype="<i4", count=3).tolist() == [20240520, 1, 0])
    assert dl.read_shard(path).tolist() == [] and dl.read_shard(path, vocab_size=10).tolist() == []
    with open(path, "r+b") as f:
        f.truncate(1023)
    with pytest.raises(DataError, match="x_train_000001.bin: 1023 bytes is too small for the 1024-byte shard "
                                        "header"
                       ) as excinfo:
        dl.read_shard(path)
    one_line_error(excinfo)


# -----------------------------------------------------------------------------
# corpora and tokenizers

@pytest.mark.parametrize("tokenizer", ["char", "byte", "gpt2"])
def test_round_trip(tmp_path, tiny_enc, tokenizer):
    data_dir = pd.prepare_documents("tiny", DOCS, str(tmp_path), tokenizer, val_fraction=0.3)
    meta = dl.load_meta(data_dir)
    assert meta["tokenizer"] == tokenizer and meta["name"] == "tiny"
    encode, decode = dl.get_tokenizer(meta)
    train, val = pd.split_documents(DOCS, 0.3)
    assert "".join(train + val) == "".join(DOCS) and val[-1] == DOCS[-1]  # the cut falls inside document 2
    for split, docs in (("train", train), ("val", val)):
        tokens = all_tokens(data_dir, split)
        assert meta["tokens"][split] == len(tokens) and max(tokens) < meta["vocab_size"]
        text = ("".join("<|endoftext|>" + d for d in docs) if tokenizer == "gpt2"
                else pd.DOC_SEPARATOR.join(docs))
        assert encode(text) == tokens
        # through the loader: one batch of a single block spans the whole shard
        loader = ShardLoader(data_dir, split, batch_size=1, block_size=len(tokens) - 1,
                             vocab_size=meta["vocab_size"])
        x, y = loader.next_batch()
        assert x.dtype == y.dtype == torch.int64
        assert x[0].tolist() == tokens[:-1] and y[0].tolist() == tokens[1:]  # targets: the next tokens
        assert decode(tokens) == text


def test_char_vocabulary_error():
    encode, decode = dl.get_tokenizer({"tokenizer": "char", "chars": "ab", "vocab_size": 2})
    assert decode(encode("abba") + [5]) == "abba"  # ids past the vocabulary (model padding) are skipped
    with pytest.raises(DataError, match="'z' are not in this dataset's vocabulary"):
        encode("abz")


def test_byte_and_gpt2_decoding_skip_padding_ids(tiny_enc):
    """A model's vocab_size is padded past the tokenizer's: an untrained one samples those ids, and decoding
    skips them; bytes that are not UTF-8 become U+FFFD instead of failing."""
    encode, decode = dl.get_tokenizer({"tokenizer": "byte", "vocab_size": 256})
    assert encode("hé") == [104, 195, 169]
    assert decode([104, 256, 195, 169, 300, 255]) == "hé\ufffd"  # 255 is the last byte: kept, and not UTF-8
    encode, decode = dl.get_tokenizer({"tokenizer": "gpt2", "vocab_size": 257})
    assert encode("<|endoftext|>hi") == [256, 104, 105]
    assert decode([256, 104, 257, 105, 1000]) == "<|endoftext|>hi"  # 256 is end-of-text, the last real id


def test_offline_gpt2_is_one_line(monkeypatch):
    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(DataError, match=r"could not load tiktoken's GPT-2 vocabulary \(ConnectionError\); "
                                        r".*needs internet; offline, use a char or byte dataset "
                                        r"\(--tokenizer=char\|byte\)"
                       ) as excinfo:
        dl.get_tokenizer({"tokenizer": "gpt2"})
    one_line_error(excinfo)


@pytest.mark.parametrize("docs, val_fraction, train, val", [
    (["0123456789"], 0.1, ["012345678"], ["9"]),  # one document: cut inside it, 90/10 like nanoGPT
    (["abcd", "efgh"], 0.5, ["abcd"], ["efgh"]),  # the cut falls between documents: none is split, none empty
    (["abc", "defgh"], 0.5, ["abc", "d"], ["efgh"]),  # 8 * 0.5 = 4 characters for train
    (["ab", "cd", "ef", "gh", "ij"], 0.25, ["ab", "cd", "ef", "g"], ["h", "ij"]),  # int(7.5) = 7
    (["abcdefghij"], 0.05, ["abcdefghi"], ["j"])])  # int(9.5) = 9: the cut rounds down, val gets the rest
def test_split_documents_cuts_at_the_last_val_fraction(docs, val_fraction, train, val):
    assert pd.split_documents(docs, val_fraction) == (train, val)


def test_text_folder_without_txt_files(tmp_path):
    (tmp_path / "notes.md").write_text("not a .txt file", encoding="utf-8")
    with pytest.raises(DataError, match=f"^no .txt files in folder {tmp_path}; put one document per .txt "
                                        "file there$"):
        pd.prepare("text", input=str(tmp_path), out_dir=str(tmp_path / "data"))
    assert not os.path.exists(tmp_path / "data")


def test_text_folder(tmp_path):
    folder = tmp_path / "books"
    folder.mkdir()
    (folder / "a.txt").write_text("first book " * 10, encoding="utf-8")
    (folder / "b.txt").write_text("second bk. " * 10, encoding="utf-8")
    (folder / "notes.md").write_text("ignored", encoding="utf-8")
    (folder / "c.TXT").write_text("third bk.. " * 10, encoding="utf-8")  # an upper-case extension counts too
    out = str(tmp_path / "data")
    pd.prepare("text", input=str(folder), out_dir=out, shard_size=30, val_fraction=1 / 3)
    # again: stale shards go
    data_dir = pd.prepare("text", input=str(folder) + "/", out_dir=out, val_fraction=1 / 3)
    assert data_dir == os.path.join(out, "books")  # books/ is named books, like books
    assert sorted(os.listdir(data_dir)) == ["books_train_000001.bin", "books_val_000000.bin", "meta.json"]
    _, decode = dl.get_tokenizer(dl.load_meta(data_dir))
    assert decode(all_tokens(data_dir, "train")) == "first book " * 10 + "\n\n" + "second bk. " * 10
    assert decode(all_tokens(data_dir, "val")) == "third bk.. " * 10
    (folder / "c.txt").write_bytes(b"caf\xe9")
    with pytest.raises(DataError, match="c.txt is not UTF-8"):
        pd.prepare("text", input=str(folder), out_dir=out)
    with pytest.raises(DataError, match="does not exist"):
        pd.prepare("text", input=str(tmp_path / "nope.txt"), out_dir=out)


def test_documents_without_newlines_and_shards_filled_across_documents(tmp_path):
    """The char vocabulary always holds the separator put between documents, even when no document has a
    newline; and a shard filled by several documents holds exactly shard_size tokens before the next one
    starts."""
    data_dir = pd.prepare_documents("x", ["abc", "cab", "bca", "abc"], out_dir=str(tmp_path), shard_size=4,
                                    val_fraction=0.25)
    meta = dl.load_meta(data_dir)
    assert meta["chars"] == "\nabc"
    assert dl.get_tokenizer(meta)[1](all_tokens(data_dir, "train")) == "abc\n\ncab\n\nbca"
    assert [len(dl.read_shard(f)) for f in dl.find_shards(data_dir, "train")] == [4, 4, 4, 1]


def test_char_vocabulary_up_to_65536_symbols(tmp_path):
    """uint16 ids hold 65,536 characters (the separator included): that many is a dataset, one more is refused
    with a way out, and nothing is written."""
    # no newline, no surrogate
    chars = [chr(c) for c in range(0x20, 0x20000) if not 0xD800 <= c < 0xE000][:65536]
    data_dir = pd.prepare_documents("big", ["".join(chars[:65535])], str(tmp_path), val_fraction=0.5)
    meta = dl.load_meta(data_dir)
    assert meta["vocab_size"] == len(meta["chars"]) == 65536
    assert max(all_tokens(data_dir, "val")) == 65535  # the last character gets the last id
    assert dl.get_tokenizer(meta)[1](all_tokens(data_dir, "val")) == "".join(chars[32767:65535])
    with pytest.raises(DataError, match="^big2: 65,537 distinct characters do not fit uint16; use "
                                        "--tokenizer=byte$"):
        pd.prepare_documents("big2", ["".join(chars)], str(tmp_path), val_fraction=0.5)
    assert not os.path.exists(tmp_path / "big2")


@pytest.mark.parametrize("docs, val_fraction, message", [
    ([], 0.1, "^e: the corpus is empty; give it some text$"),
    (["", ""], 0.1, "^e: the corpus is empty; give it some text$"),
    # 1 - 1e-17 == 1
    (["abcdefghij"], 1e-17, "^e: the val split is empty; the corpus is too small for --val_fraction$"),
    # int(0.5)
    (["abcdefghij"], 0.95, "^e: the train split is empty; the corpus is too small for --val_fraction$")])
def test_a_corpus_too_small_to_split_is_one_line(tmp_path, docs, val_fraction, message):
    with pytest.raises(DataError, match=message):
        pd.prepare_documents("e", docs, str(tmp_path), val_fraction=val_fraction)
    assert not os.path.exists(tmp_path / "e") and not os.path.exists(tmp_path / ".e.staging")
    meta = dl.load_meta(pd.prepare_documents("e", ["abcdefghij"], str(tmp_path), val_fraction=0.85))
    assert meta["tokens"] == {"val": 9, "train": 1}  # one character is enough


def test_meta_of_each_tokenizer(tmp_path, tiny_enc, capsys):
    """What sample.py and train.py need to decode and size the model, and the summary printed at the end."""
    metas = {tok: dl.load_meta(pd.prepare_documents(tok, DOCS, str(tmp_path), tok, val_fraction=0.3))
             for tok in ("char", "byte", "gpt2")}
    assert (metas["byte"]["vocab_size"] == 256 and "chars" not in metas["byte"]
            and "eot_token" not in metas["byte"])
    assert (metas["gpt2"]["vocab_size"] == 257 and metas["gpt2"]["eot_token"] == 256
            and "chars" not in metas["gpt2"])
    assert metas["char"]["chars"] == "".join(sorted(set("\n".join(DOCS))))
    train, val = pd.split_documents(DOCS, 0.3)
    assert metas["byte"]["tokens"] == {"val": len("\n\n".join(val).encode()),
                                       "train": len("\n\n".join(train).encode())}
    out = capsys.readouterr().out
    chars = [sum(map(len, split)) for split in (train, val)]
    assert f"char: 3 documents, {chars[0]} train / {chars[1]} val characters" in out
    n = metas["char"]["tokens"]
    assert (f"char: {n['val']} val tokens, {n['train']} train tokens; vocabulary char with "
            f"{len(metas['char']['chars'])} symbols\nwrote 2 shards + meta.json to "
            f"{tmp_path / 'char'} in ") in out


def test_shards_number_val_from_0_and_train_from_1(tmp_path):
    """llm.c's numbering: NAME_val_000000.bin, NAME_val_000001.bin, ...; NAME_train_000001.bin, ...; every
    shard but the last is full, and a split that fills its shards exactly never gets an empty one."""
    data_dir = pd.prepare_documents("n", ["abcdefghi", "jklmnopqr"], str(tmp_path), "byte", shard_size=3,
                                    val_fraction=0.5)
    for split, first, text in (("val", 0, b"jklmnopqr"), ("train", 1, b"abcdefghi")):
        shards = dl.find_shards(data_dir, split)
        assert [os.path.basename(f) for f in shards] == [f"n_{split}_{first + i:06d}.bin" for i in range(3)]
        assert [dl.read_shard(f).tolist() for f in shards] == [list(text[i:i + 3]) for i in (0, 3, 6)]
    assert sorted(os.listdir(data_dir)) == ["meta.json"] + [f"n_train_00000{i}.bin" for i in (1, 2, 3)] + \
        [f"n_val_00000{i}.bin" for i in (0, 1, 2)]  # no .tmp, no empty shard


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
    with pytest.raises(DataError,
                       match=r"`python prepare_data.py text --input=PATH --name=mybooks --out_dir="):
        pd.ensure_prepared("mybooks", out_dir=out)
    with pytest.raises(DataError, match=r"dataset .* `python prepare_data.py fineweb10B --out_dir="):
        pd.ensure_prepared("fineweb10B", out_dir=out)


class Killed(BaseException):
    """The process dies here (like KeyboardInterrupt, nothing catches it)."""


def test_an_interrupted_publish_never_looks_prepared(tmp_path, monkeypatch):
    """Kill write_dataset at each of its file moves in turn: the dataset is either the old one, whole, or a
    folder without meta.json (which ensure_prepared and load_meta refuse), never a mix that looks whole."""
    out, data_dir = str(tmp_path), str(tmp_path / "t")
    old_tokens = dl.load_meta(pd.prepare("text", input=__file__, name="t", out_dir=out,
                                         shard_size=5000))["tokens"]
    real_replace, moves = os.replace, []
    def recorded(a, b):
        moves.append(b)
        real_replace(a, b)
    monkeypatch.setattr(os, "replace", recorded)
    pd.prepare("text", input=__file__, name="t", out_dir=out, shard_size=7000)
    assert len(moves) > 4  # shards renamed in staging, moved, then meta.json
    for k in range(len(moves)):
        def killed(a, b, count=iter(range(len(moves)))):
            if next(count) == k:
                raise Killed
            real_replace(a, b)
        monkeypatch.setattr(os, "replace", killed)
        with pytest.raises(Killed):
            pd.prepare("text", input=__file__, name="t", out_dir=out, shard_size=5000 + 2000 * (k % 2))
        if os.path.exists(os.path.join(data_dir, "meta.json")):  # then it is a whole dataset
            for split in ("train", "val"):
                assert len(all_tokens(data_dir, split)) == dl.load_meta(data_dir)["tokens"][split]
        else:
            with pytest.raises(DataError, match="has no meta.json, so it is not a finished dataset"):
                pd.ensure_prepared("t", out_dir=out)
    monkeypatch.setattr(os, "replace", real_replace)
    assert dl.load_meta(pd.prepare("text", input=__file__, name="t", out_dir=out))["tokens"] == old_tokens


def test_two_processes_preparing_pydocs_take_turns(tmp_path, capsys):
    """While one process holds the dataset's lock, a second ensure_prepared waits, then uses its result."""
    out, result = str(tmp_path), []
    with pd.preparing(out, "pydocs"):  # "the first process": it holds the lock
        second = threading.Thread(target=lambda: result.append(pd.ensure_prepared("pydocs", out_dir=out)))
        second.start()
        time.sleep(0.5)
        assert second.is_alive() and not os.path.exists(tmp_path / "pydocs")  # waiting, not preparing
        pd.prepare_documents("pydocs", pd.pydocs_documents(), out)
    second.join(timeout=60)
    assert result == [os.path.join(out, "pydocs")]
    output = capsys.readouterr().out
    assert "waiting for it to finish" in output and "preparing the offline default corpus" not in output


def test_disk_full_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch):
    real_open = rundir.open_regular  # atomic_write's

    def open_regular(path, *args, **kwargs):  # the second shard finds the disk full
        f = real_open(path, *args, **kwargs)
        return FullDiskFile(f) if os.path.basename(path).startswith(".pydocs_train_") else f
    monkeypatch.setattr(rundir, "open_regular", open_regular)
    with pytest.raises(DataError, match="no space left on device in .*run the same command again") as excinfo:
        pd.prepare("pydocs", out_dir=str(tmp_path))
    one_line_error(excinfo)
    assert os.listdir(tmp_path) == [".pydocs.lock"]  # no staging folder, no .tmp, no dataset


class FullDiskFile:
    """open_regular's file, whose writes fail as on a full disk."""
    def __init__(self, file):
        self.file = file

    def __enter__(self):
        return self

    def __exit__(self, *error):
        self.file.close()

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")


class CloseFails(FullDiskFile):
    """Its data only fails to reach the disk when it is closed (a full disk may show there)."""
    def write(self, data):
        self.file.write(data)

    def __exit__(self, *error):
        self.file.close()
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("kind", [FullDiskFile, CloseFails])
def test_a_shard_on_a_full_disk_leaves_nothing_and_says_so(tmp_path, monkeypatch, kind):
    real_open = rundir.open_regular
    monkeypatch.setattr(rundir, "open_regular", lambda path, *a, **k: kind(real_open(path, *a, **k)))
    with pytest.raises(OSError, match="No space left") as excinfo:
        pd.write_shard(str(tmp_path / "x_train_000001.bin"), [1, 2, 3])
    assert excinfo.value.errno == errno.ENOSPC  # what prepare_data.py's full-disk line is told by
    assert os.listdir(tmp_path) == []  # neither a temporary nor a shard under the real name


def test_disk_full_while_meta_json_is_written_leaves_no_tmp(tmp_path, monkeypatch):
    """The line says the unfinished file was removed: meta.json's too, the last file a preparation writes."""
    real_open = rundir.open_regular  # atomic_write's

    def open_regular(path, *args, **kwargs):
        f = real_open(path, *args, **kwargs)
        return FullDiskFile(f) if os.path.basename(path).startswith(".meta.json.") else f
    monkeypatch.setattr(rundir, "open_regular", open_regular)
    with pytest.raises(DataError, match="no space left on device in .*the unfinished file was removed"):
        pd.prepare("text", input=__file__, name="t", out_dir=str(tmp_path))
    assert [f for f in os.listdir(tmp_path / "t") if f.endswith(".tmp")] == []


@pytest.mark.parametrize("error, message", [
    (PermissionError(errno.EACCES, "Permission denied", "/somewhere/x.bin"),
     "^Permission denied: /somewhere/x.bin$"),
    (OSError(errno.EIO, "Input/output error"), "^Input/output error: {out}$")])  # no file named: the out_dir
def test_other_file_system_errors_are_one_line(tmp_path, monkeypatch, error, message):
    def write_shard(path, tokens):
        raise error
    monkeypatch.setattr(pd, "write_shard", write_shard)
    with pytest.raises(DataError, match=message.format(out=re.escape(str(tmp_path)))):
        pd.prepare("text", input=__file__, name="t", out_dir=str(tmp_path))
    assert os.listdir(tmp_path) == [".t.lock"]


def test_ensure_prepared_says_how_to_prepare(tmp_path, monkeypatch):
    """Run from a project folder with the default out_dir=data, the command to run needs no --out_dir; a
    folder without meta.json is named as such."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"^dataset data/mybooks does not exist; prepare it with `python "
                                        r"prepare_data.py text --input=PATH --name=mybooks`$"):
        pd.ensure_prepared("mybooks")
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    with pytest.raises(DataError, match=r"^dataset data/shakespeare_char has no meta.json, so it is not a "
                                        r"finished dataset; prepare it with `python prepare_data.py "
                                        r"shakespeare_char`$"):
        pd.ensure_prepared("shakespeare_char")
    assert os.listdir(tmp_path / "data") == ["shakespeare_char"]  # only pydocs is prepared on the fly


def test_missing_meta_is_an_error(tmp_path):
    write_shard(str(tmp_path / "x_train_000001.bin"), [1, 2, 3])
    with pytest.raises(DataError, match="has no meta.json"):
        dl.load_meta(str(tmp_path))


META_REFUSED = "does not describe a dataset .a tokenizer char, byte or gpt2, and its vocab_size"


@pytest.mark.parametrize("meta, ok", [  # what another version or another tool might write
    ({"tokenizer": "char", "chars": "\nab", "vocab_size": 3}, True),
    ({"tokenizer": "byte", "vocab_size": 256}, True), ({"tokenizer": "gpt2", "vocab_size": 50257}, True),
    ({"tokenizer": "gpt2"}, False), ({"tokenizer": "bpe", "vocab_size": 256}, False),
    ({"vocab_size": 256}, False)])
def test_load_meta_accepts_only_what_describes_a_dataset(tmp_path, meta, ok):
    (tmp_path / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    if ok:
        assert dl.load_meta(str(tmp_path)) == meta
        return
    with pytest.raises(DataError, match=META_REFUSED) as excinfo:
        dl.load_meta(str(tmp_path))
    assert one_line_error(excinfo).endswith("prepare the dataset again")


@pytest.mark.parametrize("content", [b'{"tokenizer": "byte", ', b'\xff\xfe{}'])
def test_load_meta_of_broken_json_is_one_line(tmp_path, content):
    (tmp_path / "meta.json").write_bytes(content)
    with pytest.raises(DataError,
                       match=r"meta.json is not valid JSON \(.*\); prepare the dataset again") as excinfo:
        dl.load_meta(str(tmp_path))
    one_line_error(excinfo)
    # a broken meta.json is not a finished dataset
    assert not pd.prepared_from(str(tmp_path), {"any": "source"})


# -----------------------------------------------------------------------------
# the hub corpora, offline: FakeHub serves the files

RESPONSE = SimpleNamespace(headers={}, request=None)  # what the hub's HTTP errors carry


OWT_DOCS = [[f"file {f}, document {i}: " + "words and more words " * ((7 * i + f) % 5 + 1) for i in range(30)]
            for f in range(4)]


def in_val(doc, val_fraction=0.1):
    """The documented split: BLAKE2b-64 of the text, read as a number in [0, 1), below val_fraction."""
    import hashlib
    return int.from_bytes(hashlib.blake2b(doc.encode(), digest_size=8).digest(), "big") < val_fraction * 2**64


@pytest.fixture
def owt_hub(monkeypatch, tiny_enc):
    """OpenWebText as 4 small parquet files with the real names, read 8 documents at a time."""
    monkeypatch.setattr(pd, "OWT_FILES", pd.OWT_FILES[:4])
    monkeypatch.setattr(pd, "OWT_BATCH", 8)
    return FakeHub(monkeypatch,
                   {file: parquet_bytes({"text": docs}) for file, docs in zip(pd.OWT_FILES, OWT_DOCS)})


def test_openwebtext_end_to_end(tmp_path, owt_hub, tiny_enc):
    out = str(tmp_path / "data")
    data_dir = pd.prepare("openwebtext", out_dir=out, val_fraction=0.1, num_proc=2)
    meta = dl.load_meta(data_dir)
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 257 and meta["documents"] == 120
    assert [os.path.basename(f) for f in dl.find_shards(data_dir, "train")] == \
        [f"openwebtext_train_00000{i}.bin" for i in (1, 2, 3, 4)]  # one train shard per parquet file
    assert len(dl.find_shards(data_dir, "val")) == 1
    texts = {}
    for split in ("train", "val"):
        tokens = all_tokens(data_dir, split)
        assert len(tokens) == meta["tokens"][split] and tokens[0] == 256
        texts[split] = tiny_enc.decode(tokens).split("<|endoftext|>")[1:]
    docs = [doc for file in OWT_DOCS for doc in file]
    assert texts["val"] == [doc for doc in docs if in_val(doc)] and 5 < len(texts["val"]) < 25
    assert texts["train"] == [doc for doc in docs if not in_val(doc)]  # in order, nothing lost or doubled
    assert owt_hub.downloads == pd.OWT_FILES
    assert sorted(os.listdir(out)) == [".openwebtext.lock", "openwebtext"]  # staging and downloads are gone
    pd.prepare("openwebtext", out_dir=out, val_fraction=0.1)  # again: nothing to do
    assert owt_hub.downloads == pd.OWT_FILES


class FailingEncoding:
    """An encoding that fails on one document: a preparation interrupted while tokenising a file."""

    def __init__(self, enc, doc):
        self.enc, self.doc = enc, doc
        self.name, self.n_vocab, self.eot_token = enc.name, enc.n_vocab, enc.eot_token

    def encode_ordinary(self, text):
        if text == self.doc:
            raise RuntimeError("killed while tokenising")
        return self.enc.encode_ordinary(text)


def test_openwebtext_interrupted_twice_redoes_only_what_was_not_finished(tmp_path, owt_hub, tiny_enc):
    reference = pd.prepare("openwebtext", out_dir=str(tmp_path / "reference"), val_fraction=0.1, num_proc=2)
    out = str(tmp_path / "data")
    data_dir, staging = os.path.join(out, "openwebtext"), os.path.join(out, ".openwebtext.staging")
    # 1. the network goes down at the third file
    owt_hub.downloads, owt_hub.fail_at, owt_hub.error = [], 2, ConnectionError("network down")
    with pytest.raises(DataError, match="could not reach the Hugging Face hub for plain_text/train-00002"):
        pd.prepare("openwebtext", out_dir=out, val_fraction=0.1, num_proc=2)
    assert sorted(os.listdir(data_dir)) == ["openwebtext_train_000001.bin", "openwebtext_train_000002.bin"]
    with pytest.raises(DataError, match=r"\.openwebtext\.staging/ is left from an interrupted preparation"):
        pd.ensure_prepared("openwebtext", out_dir=out)
    # 2. started again, it dies in the middle of the fourth file (a batch of it is already written)
    owt_hub.downloads, owt_hub.fail_at = [], None
    with pytest.MonkeyPatch.context() as m, pytest.raises(RuntimeError, match="killed while tokenising"):
        m.setattr(pd, "gpt2_encoding", lambda: FailingEncoding(tiny_enc, OWT_DOCS[3][20]))
        pd.prepare("openwebtext", out_dir=out, val_fraction=0.1, num_proc=2)
    assert owt_hub.downloads == pd.OWT_FILES[2:]
    # no 4, no .tmp
    assert sorted(os.listdir(data_dir)) == [f"openwebtext_train_00000{i}.bin" for i in (1, 2, 3)]
    # 3. started once more, it does only the fourth file, and ends exactly as an uninterrupted run
    owt_hub.downloads = []
    data_dir = pd.prepare("openwebtext", out_dir=out, val_fraction=0.1, num_proc=2)
    assert owt_hub.downloads == pd.OWT_FILES[3:]
    assert dl.load_meta(data_dir) == dl.load_meta(reference) and not os.path.exists(staging)
    for split in ("train", "val"):
        assert all_tokens(data_dir, split) == all_tokens(reference, split)


def test_openwebtext_with_no_document_in_val_is_refused(tmp_path, owt_hub):
    """A val_fraction so small that no document's hash is below it leaves val empty: one line, no dataset."""
    out = str(tmp_path / "data")
    with pytest.raises(DataError, match=r"^openwebtext: the val split is empty; raise --val_fraction$"):
        pd.prepare("openwebtext", out_dir=out, val_fraction=1e-12, num_proc=1)
    assert not os.path.exists(os.path.join(out, "openwebtext", "meta.json"))
    assert not os.path.exists(os.path.join(out, "openwebtext", "openwebtext_val_000000.bin"))


def test_openwebtext_restarted_with_other_settings_starts_over(tmp_path, owt_hub):
    reference = pd.prepare("openwebtext", out_dir=str(tmp_path / "reference"), val_fraction=0.2, num_proc=2)
    out = str(tmp_path / "data")
    owt_hub.downloads, owt_hub.fail_at, owt_hub.error = [], 2, ConnectionError("network down")
    with pytest.raises(DataError, match="could not reach the Hugging Face hub"):
        pd.prepare("openwebtext", out_dir=out, val_fraction=0.1, num_proc=2)
    owt_hub.downloads, owt_hub.fail_at = [], None
    data_dir = pd.prepare("openwebtext", out_dir=out, val_fraction=0.2, num_proc=2)
    assert owt_hub.downloads == pd.OWT_FILES  # none of the 0.1 split's work is reused
    assert dl.load_meta(data_dir) == dl.load_meta(reference)
    assert all_tokens(data_dir, "val") == all_tokens(reference, "val")


@pytest.mark.parametrize("case, message", [
    ("short", "the download has .* bytes but the hub lists"), ("garbage", "cannot be read as parquet")])
def test_openwebtext_broken_download_is_deleted_not_used(tmp_path, owt_hub, case, message):
    out, file = str(tmp_path / "data"), pd.OWT_FILES[1]
    good = owt_hub.files[file]
    bad = {"short": good[:len(good) // 2], "garbage": bytes(len(good))}[case]
    owt_hub.served[file] = bad
    if case != "short":
        owt_hub.files[file] = bad  # the hub lists it at that size: only reading it shows the damage
    with pytest.raises(DataError, match=f"{file}: {message}|{file} {message}") as excinfo:
        pd.prepare("openwebtext", out_dir=out, val_fraction=0.1, num_proc=2)
    assert "deleted it, run the same command again" in one_line_error(excinfo)
    assert not os.path.exists(os.path.join(out, ".openwebtext.staging", "download", file))
    # no shard 2, no meta
    assert os.listdir(os.path.join(out, "openwebtext")) == ["openwebtext_train_000001.bin"]
    owt_hub.served, owt_hub.files[file], owt_hub.downloads = {}, good, []
    pd.prepare("openwebtext", out_dir=out, val_fraction=0.1, num_proc=2)
    assert owt_hub.downloads == pd.OWT_FILES[1:]


def shard_bytes(tokens, count=None, magic=20240520):
    """A shard in the llm.c format, built here from the spec rather than with dataloader.py."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, 1, len(tokens) if count is None else count
    return header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes()


def fineweb_files():
    """A val shard and three train shards (the last one shorter, as on the hub) of GPT-2-sized token ids."""
    rng = np.random.default_rng(0)
    names = ["fineweb_val_000000.bin"] + [f"fineweb_train_{i:06d}.bin" for i in (1, 2, 3)]
    return {name: shard_bytes(np.r_[50256, rng.integers(0, 50257, n - 1)])
            for name, n in zip(names, (2000, 2000, 2000, 1500))}


def test_fineweb_interrupted_restarted_and_complete(tmp_path, monkeypatch):
    hub = FakeHub(monkeypatch, fineweb_files())
    out = str(tmp_path / "data")
    data_dir = os.path.join(out, "fineweb10B")
    hub.fail_at, hub.error = 2, ConnectionError("network down")
    with pytest.raises(DataError, match="could not reach the Hugging Face hub for fineweb_train_000002.bin"):
        pd.prepare("fineweb10B", out_dir=out, train_shards=3)
    # no meta.json
    assert sorted(os.listdir(data_dir)) == ["fineweb_train_000001.bin", "fineweb_val_000000.bin"]
    hub.downloads, hub.fail_at = [], None
    assert pd.prepare("fineweb10B", out_dir=out, train_shards=3) == data_dir
    assert hub.downloads == ["fineweb_train_000002.bin", "fineweb_train_000003.bin"]  # the rest only
    for name, content in hub.files.items():
        with open(os.path.join(data_dir, name), "rb") as f:
            assert f.read() == content
    meta = dl.load_meta(data_dir)
    assert meta["tokens"] == {"val": 2000, "train": 5500} and meta["vocab_size"] == 50257
    assert meta["tokenizer"] == "gpt2" and meta["eot_token"] == 50256
    assert sorted(os.listdir(out)) == [".fineweb10B.lock", "fineweb10B"]
    hub.info_error = ConnectionError("offline")  # a finished dataset needs no network
    assert pd.prepare("fineweb10B", out_dir=out, train_shards=3) == data_dir and hub.downloads[2:] == []
    with pytest.raises(DataError, match="holds 1 train shards beyond --train_shards=2 "
                                        ".fineweb_train_000003.bin"):
        pd.prepare("fineweb10B", out_dir=out, train_shards=2)


@pytest.mark.parametrize("case, message", [
    ("short", "the download has 4,024 bytes but the hub lists 5,024"),
    ("long", "the download has 5,025 bytes but the hub lists 5,024"), ("magic", "wrong magic number"),
    ("count", "header says 2001 tokens but the file holds 2000"),
    ("token", "token id 50257 is >= the model's vocab_size")])
def test_fineweb_broken_download_is_deleted_not_used(tmp_path, monkeypatch, case, message):
    hub = FakeHub(monkeypatch, fineweb_files())
    out, file = str(tmp_path / "data"), "fineweb_train_000002.bin"
    good, tokens = hub.files[file], np.frombuffer(hub.files[file][1024:], dtype="<u2")
    hub.served[file] = {"short": good[:-1000], "long": good + b"\0",
                        "magic": shard_bytes(tokens, magic=20240521),
                        "count": shard_bytes(tokens, count=2001),
                        "token": shard_bytes(np.r_[tokens[:-1], 50257])}[case]
    if case not in ("short", "long"):
        hub.files[file] = hub.served[file]
    with pytest.raises(DataError, match=message) as excinfo:
        pd.prepare("fineweb10B", out_dir=out, train_shards=3)
    assert file in one_line_error(excinfo) and "deleted" in str(excinfo.value)
    assert sorted(os.listdir(os.path.join(out, "fineweb10B"))) == ["fineweb_train_000001.bin",
                                                                   "fineweb_val_000000.bin"]
    assert not os.path.exists(os.path.join(out, ".fineweb10B.staging", "download", file))


@pytest.mark.parametrize("where, error, message", [
    ("listing", ConnectionError("[Errno -2] Name or service not known"),
     "could not reach the Hugging Face hub for kjj0/fineweb10B-gpt2 at revision 889765ea.* "
     ".ConnectionError.; this needs internet"),
    ("listing", hub_errors.OfflineModeIsEnabled("offline mode is enabled"),
     "could not reach the Hugging Face hub"),
    ("listing", hub_errors.RepositoryNotFoundError("404", response=RESPONSE),
     "the hub has no dataset repository kjj0"),
    ("listing", hub_errors.RevisionNotFoundError("404", response=RESPONSE),
     "the hub refused kjj0/fineweb10B-gpt2 at revision 889765ea.*: 404$"),
    ("download", hub_errors.LocalEntryNotFoundError("cannot find the requested files"),
     "could not reach the Hugging Face hub for fineweb_val_000000.bin of kjj0"),
    ("download", hub_errors.RemoteEntryNotFoundError("404", response=RESPONSE),
     "the hub refused fineweb_val_000000.bin of kjj0/fineweb10B-gpt2 at revision 889765ea.*: 404$"),
    ("download", hub_errors.HfHubHTTPError("500 Server Error\ndetails", response=RESPONSE),
     "the hub refused .*: 500 Server Error$"),
    ("download", OSError(errno.ENOSPC, "No space left on device"),
     "no space left on device in .*finished ones are kept")])
def test_hub_failures_are_one_line(tmp_path, monkeypatch, where, error, message):
    hub = FakeHub(monkeypatch, fineweb_files())
    if where == "listing":
        hub.info_error = error
    else:
        hub.fail_at, hub.error = 0, error
    with pytest.raises(DataError, match=message) as excinfo:
        pd.prepare("fineweb10B", out_dir=str(tmp_path), train_shards=3)
    one_line_error(excinfo)
    assert not os.path.exists(tmp_path / "fineweb10B" / "meta.json")
    partial = tmp_path / ".fineweb10B.staging" / "download" / "partial.incomplete"
    disk_full = getattr(error, "errno", None) == errno.ENOSPC
    # kept for the hub to resume, unless disk full
    assert partial.exists() == (where == "download" and not disk_full)


@pytest.mark.slow
@pytest.mark.parametrize("corpus", ["openwebtext", "fineweb10B"])
def test_tiny_training_run_on_a_hub_corpus(tmp_path, monkeypatch, request, corpus):
    """Prepared offline, then trained on by train.py itself, run as a user would (data/ under its cwd)."""
    if corpus == "openwebtext":
        request.getfixturevalue("owt_hub")
        pd.prepare(corpus, out_dir=str(tmp_path / "data"), val_fraction=0.1, num_proc=2)
    else:
        FakeHub(monkeypatch, fineweb_files())
        pd.prepare(corpus, out_dir=str(tmp_path / "data"), train_shards=3)
    result = subprocess.run(
        [sys.executable, os.path.join(REPO_DIR, "train.py"), f"--dataset={corpus}", "--n_layer=1",
         "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=2", "--max_iters=2",
         "--eval_interval=2", "--eval_iters=1", "--device=cpu", "--compile=False",
         f"--out_dir={tmp_path}/out"],
        cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.path.exists(tmp_path / "out" / "ckpt.pt")


# -----------------------------------------------------------------------------
# the command line: every bad input is one line

@pytest.mark.parametrize("argv, message", [
    (["nope"], "argument NAME: invalid choice: 'nope' (choose from 'pydocs', 'shakespeare_char', 'text', "
               "'openwebtext', 'fineweb10B', 'hellaswag')"),
    (["--out_dir=x"], "the following arguments are required: NAME"),  # options come after the corpus
    (["pydocs", "--shard_sise=5"], "unrecognized arguments: --shard_sise=5"),
    (["pydocs", "shard_size=5"], "unrecognized arguments: shard_size=5"),
    (["pydocs", "--shard_size=abc"], "argument --shard_size: invalid int value: 'abc'"),
    (["pydocs", "--shard_size=0"], "argument --shard_size: 0 is not between 0 and inf"),
    (["pydocs", "--val_fraction=1"], "argument --val_fraction: 1.0 is not between 0 and 1"),
    (["pydocs", "--val_fraction=0"], "argument --val_fraction: 0.0 is not between 0 and 1"),
    (["pydocs", "--val_fraction=-0.1"], "argument --val_fraction: -0.1 is not between 0 and 1"),
    (["openwebtext", "--val_fraction=0"], "argument --val_fraction: 0.0 is not between 0 and 1"),
    (["fineweb10B", "--train_shards=0"], "argument --train_shards: 0 is not between 0 and 104"),
    (["pydocs", "--tokenizer=bpe"], "argument --tokenizer: invalid choice: 'bpe' (choose from 'char', "
                                    "'byte', 'gpt2')"),
    (["pydocs", "--input=book.txt"], "unrecognized arguments: --input=book.txt"),  # not pydocs' option
    (["text"], "the following arguments are required: --input"),
    (["openwebtext", "--shard_size=5"], "unrecognized arguments: --shard_size=5"),
    (["openwebtext", "--num_proc=0"], "argument --num_proc: 0 is not between 0 and inf"),
    (["fineweb10B", "--train_shards=104"], "argument --train_shards: 104 is not between 0 and 104"),
    (["fineweb10B", "--val_fraction=0.1"], "unrecognized arguments: --val_fraction=0.1")])
def test_bad_options_are_refused_by_argparse(capsys, argv, message):
    """argparse's refusal: the usage of the corpus named (the options it takes), then one error line."""
    with pytest.raises(SystemExit) as e:
        pd.main(argv)
    *usage, error = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and error.endswith(f"error: {message}")
    if argv[0] in pd.CORPORA:  # the usage names the corpus and every option it takes
        flags = ["--out_dir"] + [flag for flag, _ in pd.CORPORA[argv[0]][2]]
        assert f" {argv[0]} [-h]" in usage[0] and all(flag in " ".join(usage) for flag in flags)


@pytest.mark.parametrize("argv, message", [
    (["text", "--input=a.txt", "--name=../x"], "--name='../x' must be a plain folder name")])
def test_bad_options_are_one_line(argv, message):
    with pytest.raises(DataError) as excinfo:
        pd.main(argv)
    assert one_line_error(excinfo).startswith(message)


@pytest.mark.parametrize("argv, options", [
    # just above 0 and just below 1: allowed
    (["pydocs", "--val_fraction=0.0001"], dict(val_fraction=0.0001)),
    (["pydocs", "--val_fraction=0.9999", "--shard_size=1"], dict(val_fraction=0.9999, shard_size=1)),
    (["openwebtext", "--val_fraction=0.5", "--num_proc=1"], dict(val_fraction=0.5, num_proc=1)),
    (["fineweb10B", "--train_shards=103"], dict(train_shards=103)),  # every train file the hub has
    (["fineweb10B", "--train_shards=1"], dict(train_shards=1)),
    (["text", "--input=a.txt", "--tokenizer=byte"], dict(input="a.txt", tokenizer="byte")),
    (["text", "--name", "x", "--input=a.txt"], dict(name="x", input="a.txt")),  # a space, as argparse takes
    (["pydocs"], dict())])  # only the options given are passed on: each corpus keeps its own defaults
def test_last_allowed_options_reach_prepare(monkeypatch, argv, options):
    calls = []
    monkeypatch.setattr(pd, "prepare", lambda corpus, **kwargs: calls.append((corpus, kwargs)))
    pd.main(argv)
    assert calls == [(argv[0], options)]


@pytest.mark.parametrize("name, allowed", [
    (".hidden", False), ("a" + os.sep + "b", False), ("my_train_set", False), ("my_val_set", False),
    ("my_train", False), ("my_val", False),  # my_train_val_000000.bin would match *_train_*.bin
    ("train_set", True), ("val_data", True), ("my-val", True), ("my_training", True)])
def test_a_name_that_would_confuse_the_shard_globs_is_refused(tmp_path, name, allowed):
    """--name becomes the folder and the shards' prefix: '_train_' or '_val_' in it would make one split's
    shards match the other's glob, so it is refused; a name merely starting with train or val is fine."""
    book = tmp_path / "book.txt"
    book.write_text("a small book of words. " * 20, encoding="utf-8")
    out = str(tmp_path / "data")
    if not allowed:
        with pytest.raises(DataError, match=f"--name={name!r} must be a plain folder name") as excinfo:
            pd.prepare("text", input=str(book), name=name, out_dir=out)
        one_line_error(excinfo)
        assert not os.path.exists(out)  # refused before anything is written
        return
    data_dir = pd.prepare("text", input=str(book), name=name, out_dir=out)
    assert data_dir == os.path.join(out, name)
    assert [os.path.basename(f) for f in dl.find_shards(data_dir, "train")] == [f"{name}_train_000001.bin"]
    assert [os.path.basename(f) for f in dl.find_shards(data_dir, "val")] == [f"{name}_val_000000.bin"]


def test_text_dataset_is_named_after_its_file(tmp_path):
    """moby.txt -> data/moby/moby_*.bin; --name overrides it."""
    book = tmp_path / "moby.txt"
    book.write_text("Call me Ishmael. " * 20, encoding="utf-8")
    out = str(tmp_path / "data")
    data_dir = pd.prepare("text", input=str(book), out_dir=out)
    assert data_dir == os.path.join(out, "moby") and dl.load_meta(data_dir)["name"] == "moby"
    assert sorted(os.listdir(data_dir)) == ["meta.json", "moby_train_000001.bin", "moby_val_000000.bin"]
    (tmp_path / "book_train.txt").write_text("a book. " * 20, encoding="utf-8")
    # named after the file
    with pytest.raises(DataError, match="--name='book_train' must be a plain folder name"):
        pd.prepare("text", input=str(tmp_path / "book_train.txt"), out_dir=out)
    assert pd.prepare("text", input=str(book), out_dir=out, name="whale") == os.path.join(out, "whale")


@pytest.mark.parametrize("argv", [[], ["-h"], ["--help"]])
def test_help_prints_the_usage_and_prepares_nothing(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "__main__", pd)  # as `python prepare_data.py` runs it
    with pytest.raises(SystemExit) as e:
        pd.main(argv)
    assert e.value.code == 0
    assert pd.__doc__.strip().splitlines()[0] in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("case", ["a file", "under a file", "read-only"])
def test_unusable_out_dir_is_one_line(tmp_path, monkeypatch, case):
    (tmp_path / "f").write_text("not a folder")
    out = str({"a file": tmp_path / "f", "under a file": tmp_path / "f" / "data",
               "read-only": tmp_path / "ro"}[case])
    if case == "read-only":  # root writes anywhere, so chmod cannot make one: fail as the file system would
        def read_only(path, *args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        monkeypatch.setattr(os, "makedirs", read_only)
    message = {"a file": "is a file; move it away", "under a file": "cannot be written to .Not a directory",
               "read-only": "cannot be written to .Permission denied"}[case]
    with pytest.raises(DataError, match=f"the data folder {out} {message}") as excinfo:  # not a flag
        pd.prepare("pydocs", out_dir=out)
    one_line_error(excinfo)


@pytest.mark.slow
def test_cli_errors_are_one_line(tmp_path):
    (tmp_path / "f").write_text("not a folder")
    for args, start in ([["text", f"--input={tmp_path}/nope"], "error: --input="],
                        [["fineweb10B", f"--out_dir={tmp_path}/f"], "error: the data folder "]):
        result = run_cli(*args)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.startswith(start) and result.stderr.count("\n") == 1


# -----------------------------------------------------------------------------
# the loader

def write_counting_shards(data_dir, sizes):
    """Shards whose tokens count up 0, 1, 2, ... across them all, so every token says where it came from."""
    start = 0
    for i, n in enumerate(sizes):
        write_shard(os.path.join(data_dir, f"c_train_{i + 1:06d}.bin"), np.arange(start, start + n))
        start += n


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_never_overlap(tmp_path, world_size):
    write_counting_shards(str(tmp_path), [1000, 700])
    loaders = [ShardLoader(str(tmp_path), "train", 2, 16, rank, world_size) for rank in range(world_size)]
    for step in range(12):
        xs = [loader.next_batch()[0] for loader in loaders]
        seen = [t for x in xs for t in x.flatten().tolist()]
        assert len(set(seen)) == len(seen)  # disjoint
        # rows are windows
        assert all((row == torch.arange(row[0], row[0] + 16)).all() for x in xs for row in x)


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
    # 32 windows of 10 + 1 tokens
    firsts = [row[0].item() for _ in range(16) for row in loader.next_batch()[0]]
    assert sorted(firsts) == list(range(0, 320, 10)) and firsts != sorted(firsts)
    assert loader.state_dict()["epoch"] == 0
    later = [row[0].item() for _ in range(15) for row in loader.next_batch()[0]]
    # one seeded offset per epoch
    assert loader.state_dict()["epoch"] == 1 and len({t % 10 for t in later}) == 1
    epochs = [[row[0].item() for _ in range(15) for row in loader.next_batch()[0]] for _ in range(3)]
    assert len({tuple(e) for e in [later] + epochs}) == 4  # every epoch its own order (and offset)


def test_unigram_baseline_by_hand(tmp_path):
    """Train counts of token 0, 1: 3, 1 (add-one smoothed: 4/6, 2/6); val holds one 0 and one 1."""
    write_shard(str(tmp_path / "u_train_000001.bin"), [0, 0, 0, 1])
    write_shard(str(tmp_path / "u_val_000000.bin"), [0, 1])
    assert dl.unigram_loss(str(tmp_path), vocab_size=2) == pytest.approx(-(np.log(4 / 6) + np.log(2 / 6)) / 2)


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
        assert (x == x2).all() and (y == y2).all() and (y == x + 1).all()  # the tokens count up: y is next
    resumed.reset()
    assert all((x == resumed.next_batch()[0]).all() for x, _ in first)
    with pytest.raises(DataError, match="loader state points at shard 3 but there are only 3 shards"):
        # one past the last: the data changed since the checkpoint
        resumed.load_state_dict({**state, "shard": 3})


def test_shuffle_follows_the_seed(tmp_path):
    write_counting_shards(str(tmp_path), [1000])
    def firsts(seed):
        return [ShardLoader(str(tmp_path), "train", 8, 10, seed=seed).next_batch()[0][:, 0].tolist()]
    assert firsts(0) == firsts(0) and firsts(0) != firsts(1)


def test_epoch_advances_after_the_last_shard_only(tmp_path):
    write_counting_shards(str(tmp_path), [300, 200, 250])  # 7, 4 and 6 batches of 2 windows of 20 + 1 tokens
    loader = ShardLoader(str(tmp_path), "train", batch_size=2, block_size=20)
    states = []
    for _ in range(18):
        loader.next_batch()
        states.append((loader.state_dict()["epoch"], loader.state_dict()["shard"]))
    assert states == [(0, 0)] * 7 + [(0, 1)] * 4 + [(0, 2)] * 6 + [(1, 0)]


@pytest.mark.parametrize("settings", [dict(rank=1, world_size=2), dict(rank=0, world_size=1),
                                      dict(batch_size=1), dict(block_size=1)])
def test_loader_at_the_smallest_settings(tmp_path, settings):
    """The settings arrive checked (train.py's rules, GPTConfig; torchrun's ranks): the smallest ones work."""
    write_counting_shards(str(tmp_path), [200])
    kwargs = {"batch_size": 2, "block_size": 8, **settings}
    x, y = ShardLoader(str(tmp_path), "train", **kwargs).next_batch()
    assert x.shape == (kwargs["batch_size"], kwargs["block_size"]) and (y == x + 1).all()


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_shard_of_exactly_one_batch_is_enough(tmp_path, world_size):
    """world_size*batch_size*block_size + 1 tokens hold one step of the whole world: accepted, and every epoch
    (whatever its seeded offset) still gives full windows; one token fewer is refused, naming the minimum."""
    need = world_size * 2 * 8 + 1
    write_counting_shards(str(tmp_path), [need])
    loaders = [ShardLoader(str(tmp_path), "train", 2, 8, rank, world_size, seed=1)
               for rank in range(world_size)]
    for epoch in range(6):
        xs = [loader.next_batch() for loader in loaders]
        assert all(loader.state_dict() == {"epoch": epoch, "shard": 0, "pos": world_size * 2}
                   for loader in loaders)
        firsts = sorted(x[i, 0].item() for x, _ in xs for i in range(2))
        assert firsts == list(range(0, need - 1, 8))  # the only windows there are, offset clamped to 0
        assert all((y == x + 1).all() and x.shape == (2, 8) for x, y in xs)
    write_shard(str(tmp_path / "c_train_000001.bin"), np.arange(need - 1))
    with pytest.raises(DataError, match=f"c_train_000001.bin: {need - 1} tokens is shorter than one batch of "
                                        f"world_size\\*batch_size\\*block_size\\+1 = {need}; use a smaller "
                                        "batch or block, or prepare the data with a larger --shard_size$"
                       ) as excinfo:
        ShardLoader(str(tmp_path), "train", 2, 8, world_size - 1, world_size)
    one_line_error(excinfo)


def test_later_epochs_start_at_an_offset_that_still_fits(tmp_path):
    """From epoch 1 on windows start at a seeded offset < block_size: every window is whole (block_size + 1
    tokens inside the shard) and no window is read twice in an epoch. 105 tokens hold 10 windows of 10 + 1 at
    offsets 0..4 and 9 at 5..9: 3 batches of 3 every epoch."""
    write_counting_shards(str(tmp_path), [105])
    loader = ShardLoader(str(tmp_path), "train", batch_size=3, block_size=10, seed=5)
    epochs = {}
    for _ in range(3 * 60):
        x, y = loader.next_batch()
        assert (y == x + 1).all() and y.max().item() <= 104
        epochs.setdefault(loader.state_dict()["epoch"], []).extend(x[:, 0].tolist())
    assert sorted(epochs) == list(range(60))
    for starts in epochs.values():
        assert len(set(starts)) == len(starts) == 9 and len({s % 10 for s in starts}) == 1
    offsets = [starts[0] % 10 for starts in epochs.values()]
    assert offsets[0] == 0 and set(offsets[1:]) == set(range(10))  # epoch 0 at 0, then any offset in [0, 10)


def test_load_state_dict_refuses_a_negative_shard(tmp_path):
    write_counting_shards(str(tmp_path), [300, 200])
    loader = ShardLoader(str(tmp_path), "train", batch_size=2, block_size=20)
    with pytest.raises(DataError, match="^loader state points at shard -1 but there are only 2 shards; the "
                                        "data changed since the checkpoint$"):
        loader.load_state_dict({"epoch": 0, "shard": -1, "pos": 0})
    loader.load_state_dict({"epoch": 0, "shard": 1, "pos": 0})  # the last shard is fine
    assert loader.next_batch()[0].min().item() >= 300


def test_unigram_baseline_smooths_over_the_whole_vocabulary(tmp_path):
    """Tokens that never occur still get add-one mass: vocab_size 4, train counts 2, 1, 0, 0 -> p = 3/7, 2/7,
    1/7, 1/7; val holds 0, 1 and the unseen 3, across two val shards."""
    write_shard(str(tmp_path / "u_train_000001.bin"), [0, 1])
    write_shard(str(tmp_path / "u_train_000002.bin"), [0])
    write_shard(str(tmp_path / "u_val_000000.bin"), [0, 1])
    write_shard(str(tmp_path / "u_val_000001.bin"), [3])
    expected = -(np.log(3 / 7) + np.log(2 / 7) + np.log(1 / 7)) / 3
    assert dl.unigram_loss(str(tmp_path), vocab_size=4) == pytest.approx(expected, rel=1e-12)
