"""
What the test files share: the repository's root, tiny training settings, running train.py in a fresh folder,
reading a run's log, one-line errors, a tiny GPT-2-shaped tokenizer and a fake Hugging Face hub.
No test file imports another; they import from here.
"""
import hashlib
import json
import os
from types import SimpleNamespace

import huggingface_hub
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken

import prepare_data as pd
import train
from support import rundir, settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where train.py and the scripts are
# a model small enough that a few iterations take about a second on one CPU core
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=2",
        "--val_tokens=4096", "--log_interval=1", "--warmup_iters=2", "--learning_rate=3e-3", "--device=cpu"]
# smaller still, and finished after 2 iterations: for inputs that must be refused (or survived) quickly
QUICK = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=2", "--eval_iters=1",
         "--eval_interval=2", "--max_iters=2", "--device=cpu"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run in a fresh directory: data/pydocs gets prepared on the fly there, like on a fresh machine."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args):
    return run_argv(TINY + list(args))


def run_argv(argv):
    """train.py's main() without its exit: errors are raised, as they come."""
    try:
        return train.train(*settings.work_out(*train.parse_config(argv), train.DEFAULTS))
    finally:
        rundir.unlock_run_dirs()  # as main does, however the run ended


def read_log(out_dir, event=None):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if event is None or r["event"] == event]


def write_shard(path, tokens):
    """One shard holding tokens, as prepare_data.py writes shards."""
    pd.write_shard(path, tokens)


def char_dataset(name, chars, n=3000):
    """data/<name>: a char-level dataset over the alphabet `chars` (random text, enough for TINY's runs)."""
    os.makedirs(f"data/{name}")
    for split, i in (("val", 0), ("train", 1)):
        write_shard(f"data/{name}/{name}_{split}_00000{i}.bin",
                    np.random.RandomState(i).randint(0, len(chars), n))
    json.dump({"name": name, "tokenizer": "char", "chars": chars, "vocab_size": len(chars)},
              open(f"data/{name}/meta.json", "w"))


def one_line_error(main, argv):
    """Run a script's main(argv); it must stop with exactly one 'error: ...' line. Returns that line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    message = str(e.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def train_error(*args):
    return one_line_error(train.main, QUICK + list(args))


@pytest.fixture
def finished_run(workdir):
    train.main(QUICK + ["--out_dir=out/done"])
    return "out/done"


@pytest.fixture
def tiny_enc(monkeypatch):
    """A GPT-2-shaped encoding without a download: 256 byte tokens + end-of-text 256."""
    enc = tiktoken.Encoding(
        name="tiny",
        pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
        mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={"<|endoftext|>": 256})
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: enc)  # what every GPT-2 tokenizer call gets
    return enc


class FakeHub:
    """Stands in for the Hugging Face hub (get_paths_info and hf_hub_download): lists and serves the files a
    test wrote (served[name] replaces a file's content in downloads only), records every download, and fails
    on request: info_error on the listing, error at download number fail_at. A download into local_dir is a
    regular file there, as the hub writes it; one without goes into the cache folder `cache` as
    huggingface_hub lays it out: the bytes in blobs/, named by their hash, and snapshots/<commit>/<name> a
    relative link to that blob; refs/main (the revision) names the commit."""

    def __init__(self, monkeypatch, files, cache=None):
        self.files, self.served, self.downloads, self.cache = files, {}, [], cache
        self.info_error = self.error = self.fail_at = None
        # huggingface_hub serves its names through a module __getattr__: the fakes go into the module's dict,
        # and undoing that deletes them again, whatever monkeypatch.setattr's undo does for dynamic attributes
        monkeypatch.setitem(vars(huggingface_hub), "get_paths_info", self.get_paths_info)
        monkeypatch.setitem(vars(huggingface_hub), "hf_hub_download", self.hf_hub_download)

    def get_paths_info(self, repo_id, paths, repo_type, revision):
        assert repo_type == "dataset" and (repo_id, revision) in ((pd.OWT_REPO, pd.OWT_REVISION),
                                                                  (pd.FINEWEB_REPO, pd.FINEWEB_REVISION))
        if self.info_error:
            raise self.info_error
        return [SimpleNamespace(path=p, size=len(self.files[p])) for p in paths if p in self.files]

    def hf_hub_download(self, repo_id, filename, repo_type="model", revision=None, local_dir=None):
        if local_dir is None:
            return self.download_to_cache(repo_id, filename, repo_type, revision or "main")
        path = os.path.join(local_dir, filename)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if len(self.downloads) == self.fail_at:
            open(os.path.join(local_dir, "partial.incomplete"), "wb").close()  # as the hub leaves one
            raise self.error
        self.downloads.append(filename)
        with open(path, "wb") as f:
            f.write(self.served.get(filename, self.files[filename]))
        return path

    def download_to_cache(self, repo_id, filename, repo_type, revision):
        """Into the cache as huggingface_hub lays it out; the path huggingface_hub itself then finds there."""
        data = self.served.get(filename, self.files[filename])
        repo = os.path.join(self.cache, f"{repo_type}s--{repo_id.replace('/', '--')}")
        # an LFS file's blob is named by its sha256, a small file's by its git blob hash (sha1)
        lfs = filename.endswith(".safetensors")
        blob = os.path.join(repo, "blobs", hashlib.sha256(data).hexdigest() if lfs else
                            hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        commit = hashlib.sha1(repo_id.encode()).hexdigest()  # any 40 hex digits
        link = os.path.join(repo, "snapshots", commit, filename)
        for folder in (os.path.dirname(blob), os.path.join(repo, "refs"), os.path.dirname(link)):
            os.makedirs(folder, exist_ok=True)
        if len(self.downloads) == self.fail_at:
            open(blob + ".incomplete", "wb").close()  # as the hub leaves one
            raise self.error
        self.downloads.append(filename)
        with open(blob, "wb") as f:
            f.write(data)
        with open(os.path.join(repo, "refs", revision), "w") as f:
            f.write(commit)
        if not os.path.lexists(link):
            os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)  # ../../blobs/<hash>
        found = huggingface_hub.try_to_load_from_cache(repo_id, filename, cache_dir=self.cache,
                                                       revision=revision, repo_type=repo_type)
        assert found == link, found  # the layout is the one huggingface_hub reads
        return found


def parquet_bytes(columns):
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink, row_group_size=7)
    return sink.getvalue().to_pybytes()
