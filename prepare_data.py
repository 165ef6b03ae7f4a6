"""
Data for nanoCorridor: turn a text corpus into token shards (read back for training by dataloader.py).

    python prepare_data.py pydocs                             # offline default: CPython's own documentation text
    python prepare_data.py shakespeare_char                   # tiny shakespeare (needs internet)
    python prepare_data.py text --input=book.txt              # any UTF-8 file, or a folder of .txt files
    python prepare_data.py openwebtext --num_proc=8           # GPT-2 tokens from the Hugging Face hub

Options: --tokenizer=char|byte|gpt2  --out_dir=data  --shard_size=100000000  --val_fraction=0.1  --num_proc=N
         --input=PATH  --name=NAME (text only)

Output goes to out_dir/NAME/: NAME_val_000000.bin, NAME_train_000001.bin, ... and meta.json (how to decode),
in the llm.c / modded-nanogpt shard format (see dataloader.py).
"""
import glob
import json
import os
import shutil
import sys
import time

import numpy as np

from dataloader import DataError, find_shards, write_shard

DEFAULT_CORPUS = "pydocs"  # needs no download, so the README's main command works anywhere
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
DOC_SEPARATOR = "\n\n"  # char/byte: between documents (gpt2 puts its end-of-text token before each instead)


class ShardWriter:
    """Streams tokens into fixed-size shards of one split, so memory stays flat however big the corpus."""

    def __init__(self, out_dir, name, split, shard_size):
        self.out_dir, self.name, self.split = out_dir, name, split
        self.index = 0 if split == "val" else 1  # llm.c numbering: val is shard 0, train starts at 1
        self.buf, self.fill = np.empty(shard_size, dtype=np.uint16), 0
        self.files, self.tokens = [], 0

    def add(self, tokens):
        tokens = np.asarray(tokens)
        while len(tokens):
            n = min(len(tokens), len(self.buf) - self.fill)
            self.buf[self.fill:self.fill + n] = tokens[:n]
            self.fill, self.tokens, tokens = self.fill + n, self.tokens + n, tokens[n:]
            if self.fill == len(self.buf):
                self.flush()

    def flush(self):
        if self.fill:
            path = os.path.join(self.out_dir, f"{self.name}_{self.split}_{self.index:06d}.bin")
            write_shard(path, self.buf[:self.fill])
            self.files.append(path)
            self.index, self.fill = self.index + 1, 0


# -----------------------------------------------------------------------------
# tokenizers

def gpt2_encoding():
    """tiktoken's GPT-2 BPE (its vocabulary file is downloaded once, then cached by tiktoken)."""
    import tiktoken
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise DataError(f"could not load tiktoken's GPT-2 vocabulary ({type(e).__name__}); it is downloaded "
                        "once and needs internet; offline, use --tokenizer=char or --tokenizer=byte") from None


def encode_gpt2_document(text, enc):
    return [enc.eot_token] + enc.encode_ordinary(text)  # as in llm.c: end-of-text starts every document


def encode_text(text, meta):
    """char/byte encoding of a whole split at once, vectorised with numpy (a Python loop is slow on 100 MB)."""
    if meta["tokenizer"] == "byte":
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
    codepoints = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    vocab = np.frombuffer(meta["chars"].encode("utf-32-le"), dtype="<u4")  # sorted, so searchsorted finds ids
    return np.searchsorted(vocab, codepoints).astype(np.uint16)


def get_tokenizer(meta):
    """(encode, decode) for a dataset's meta: encode str -> list[int], decode list[int] -> str.
    Decoding skips ids beyond the vocabulary: models pad vocab_size, and an untrained one may sample those."""
    kind = meta.get("tokenizer")
    if kind == "char":
        chars = meta["chars"]
        stoi = {c: i for i, c in enumerate(chars)}

        def encode(s):
            missing = sorted(set(s) - stoi.keys())
            if missing:
                raise DataError(f"characters {''.join(missing)!r} are not in this dataset's vocabulary")
            return [stoi[c] for c in s]
        return encode, lambda ids: "".join(chars[i] for i in ids if i < len(chars))
    if kind == "byte":
        return (lambda s: list(s.encode("utf-8")),
                lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", errors="replace"))
    if kind == "gpt2":
        enc = gpt2_encoding()
        return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"}),
                lambda ids: enc.decode([i for i in ids if i < enc.n_vocab]))
    raise DataError(f"unknown tokenizer {kind!r} in meta.json (expected char, byte or gpt2)")


# -----------------------------------------------------------------------------
# corpora: each returns a list of documents (str)

def pydocs_documents():
    from pydoc_data.topics import topics  # CPython's documentation topics: ~465k characters of English
    return [topics[key] for key in sorted(topics)]


def shakespeare_documents():
    import urllib.request
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=30) as r:
            return [r.read().decode("utf-8")]
    except OSError as e:  # URLError and timeouts are OSErrors too
        raise DataError(f"could not download tiny shakespeare ({getattr(e, 'reason', e)}); offline, fetch "
                        f"{SHAKESPEARE_URL} elsewhere and run `python prepare_data.py text --input=PATH "
                        "--name=shakespeare_char`") from None


def text_documents(path):
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.txt")))
        if not files:
            raise DataError(f"no .txt files in folder {path}; put one document per .txt file there")
    elif os.path.isfile(path):
        files = [path]
    else:
        raise DataError(f"--input={path} does not exist; give a UTF-8 text file or a folder of .txt files")
    docs = []
    for file in files:
        try:
            with open(file, encoding="utf-8") as f:
                docs.append(f.read())
        except UnicodeDecodeError:
            raise DataError(f"{file} is not UTF-8 text; convert it (e.g. iconv -t UTF-8) and retry") from None
    return docs


def split_documents(docs, val_fraction):
    """Deterministic split: the last val_fraction of the characters go to val, as whole documents except for
    the one that straddles the cut (so a one-document corpus is split 90/10 exactly like nanoGPT does)."""
    cut, seen = int(sum(map(len, docs)) * (1 - val_fraction)), 0
    train, val = [], []
    for doc in docs:
        if seen + len(doc) <= cut:
            train.append(doc)
        elif seen >= cut:
            val.append(doc)
        else:
            train.append(doc[:cut - seen])
            val.append(doc[cut - seen:])
        seen += len(doc)
    return train, val


# -----------------------------------------------------------------------------
# preparation

def write_dataset(out_dir, name, split_tokens, meta, shard_size, start):
    """Write the shards of each split (split -> iterable of token arrays) and meta.json into a staging folder,
    then move them into out_dir/name: an interrupted run never leaves a half-prepared dataset behind."""
    data_dir, staging = os.path.join(out_dir, name), os.path.join(out_dir, f".{name}.staging")
    shutil.rmtree(staging, ignore_errors=True)  # left over from an interrupted run
    os.makedirs(staging)
    try:
        files, meta["tokens"] = [], {}
        for split, chunks in split_tokens.items():
            writer = ShardWriter(staging, name, split, shard_size)
            for tokens in chunks:
                writer.add(tokens)
            writer.flush()
            if writer.tokens == 0:
                raise DataError(f"{name}: the {split} split is empty; the corpus is too small for --val_fraction")
            files += writer.files
            meta["tokens"][split] = writer.tokens
        with open(os.path.join(staging, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        os.makedirs(data_dir, exist_ok=True)
        for old in glob.glob(os.path.join(data_dir, f"{name}_*_*.bin")):  # stale shards of an earlier preparation
            os.remove(old)
        for file in os.listdir(staging):
            os.replace(os.path.join(staging, file), os.path.join(data_dir, file))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    counts = ", ".join(f"{n:,} {split} tokens" for split, n in meta["tokens"].items())
    print(f"{name}: {counts}; vocabulary {meta['tokenizer']} with {meta['vocab_size']:,} symbols")
    print(f"wrote {len(files)} shards + meta.json to {data_dir} in {time.time() - start:.1f}s")
    return data_dir


def prepare_documents(name, docs, out_dir="data", tokenizer="char", shard_size=100_000_000, val_fraction=0.1):
    """Tokenise an in-memory list of documents and write its shards; returns the data dir."""
    from tqdm import tqdm
    start = time.time()
    if not any(docs):
        raise DataError(f"{name}: the corpus is empty; give it some text")
    train, val = split_documents(docs, val_fraction)
    meta = {"name": name, "tokenizer": tokenizer}
    if tokenizer == "char":
        meta["chars"] = "".join(sorted(set(DOC_SEPARATOR).union(*docs)))
        meta["vocab_size"] = len(meta["chars"])
    elif tokenizer == "byte":
        meta["vocab_size"] = 256
    else:
        enc = gpt2_encoding()
        meta["vocab_size"], meta["eot_token"] = enc.n_vocab, enc.eot_token
    if meta["vocab_size"] > 2**16:
        raise DataError(f"{name}: {meta['vocab_size']:,} distinct characters do not fit uint16; use --tokenizer=byte")
    chars = [sum(map(len, split)) for split in (train, val)]
    print(f"{name}: {len(docs):,} documents, {chars[0]:,} train / {chars[1]:,} val characters")

    def tokens(split_docs, split):
        if tokenizer == "gpt2":
            for doc in tqdm(split_docs, desc=f"tokenising {split}", unit="doc", disable=len(split_docs) < 1000):
                yield encode_gpt2_document(doc, enc)
        else:
            yield encode_text(DOC_SEPARATOR.join(split_docs), meta)
    splits = {"val": tokens(val, "val"), "train": tokens(train, "train")}
    return write_dataset(out_dir, name, splits, meta, shard_size, start)


_worker_enc = None  # the encoding inside each tokenising process, set once by the pool's initializer


def _init_worker(enc):
    global _worker_enc
    _worker_enc = enc


def _encode_for_worker(text):
    return np.array(encode_gpt2_document(text, _worker_enc), dtype=np.uint16)


def prepare_openwebtext(out_dir="data", shard_size=100_000_000, val_fraction=0.0005, num_proc=None,
                        dataset=None, encoding=None, name="openwebtext"):
    """OpenWebText -> GPT-2 tokens, tokenised in num_proc processes and streamed into shards. dataset (a
    datasets.Dataset with a "text" column) and encoding (a tiktoken.Encoding) default to the real ones."""
    from multiprocessing import Pool
    from tqdm import tqdm
    start = time.time()
    num_proc = num_proc or max(1, (os.cpu_count() or 2) // 2)
    enc = encoding or gpt2_encoding()  # first: it fails fast, the download does not
    if dataset is None:
        import datasets
        try:
            dataset = datasets.load_dataset("openwebtext", num_proc=num_proc)["train"]
        except Exception as e:  # no network, hub changes (e.g. "Dataset scripts are no longer supported"), ...
            reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            raise DataError(f"could not load openwebtext from the Hugging Face hub ({reason}); it needs internet "
                            f"(~54 GB); offline, use `python prepare_data.py {DEFAULT_CORPUS}`") from None
    splits = dataset.train_test_split(test_size=val_fraction, seed=2357, shuffle=True)  # nanoGPT's val split
    meta = {"name": name, "tokenizer": "gpt2", "vocab_size": enc.n_vocab, "eot_token": enc.eot_token}
    print(f"{name}: {len(splits['train']):,} train / {len(splits['test']):,} val documents, {num_proc} processes")
    with Pool(num_proc, initializer=_init_worker, initargs=(enc,)) as pool:
        def tokens(ds, split):
            # one batch of documents at a time: Pool.imap would read the whole corpus ahead into its task queue
            with tqdm(total=len(ds), desc=f"tokenising {split}", unit="doc") as bar:
                for batch in ds.iter(batch_size=1024 * num_proc):
                    for toks in pool.map(_encode_for_worker, batch["text"], chunksize=64):
                        yield toks
                    bar.update(len(batch["text"]))
        return write_dataset(out_dir, name, {"val": tokens(splits["test"], "val"),
                                             "train": tokens(splits["train"], "train")}, meta, shard_size, start)


PREPARERS = {"pydocs": "char", "shakespeare_char": "char", "text": "char", "openwebtext": "gpt2"}  # -> tokenizer


def prepare(corpus, input=None, name=None, tokenizer=None, out_dir="data", shard_size=100_000_000,
            val_fraction=None, num_proc=None):
    """The function behind the command line: prepare `corpus` into out_dir/name and return that data dir."""
    if corpus not in PREPARERS:
        raise DataError(f"unknown dataset {corpus!r}; choose one of: {', '.join(PREPARERS)}")
    if corpus == "text" and input is None:
        raise DataError("text needs --input=PATH: a UTF-8 text file or a folder of .txt files")
    if corpus != "text" and input is not None:
        raise DataError(f"--input is for text: `python prepare_data.py text --input={input}`")
    if name is None and corpus == "text":  # the file's or folder's name: books/ -> books, moby.txt -> moby
        name = os.path.splitext(os.path.basename(os.path.normpath(input)))[0]
    name = name or corpus
    if name.startswith(".") or os.sep in name or "_train_" in name or "_val_" in name:  # would confuse the globs
        raise DataError(f"--name={name!r} must be a plain folder name (without '/', '_train_' or '_val_')")
    tokenizer = tokenizer or PREPARERS[corpus]
    if tokenizer not in ("char", "byte", "gpt2"):
        raise DataError(f"unknown --tokenizer={tokenizer}; choose char, byte or gpt2")
    if shard_size <= 0:
        raise DataError(f"--shard_size={shard_size} must be a positive number of tokens")
    if val_fraction is not None and not 0 < val_fraction < 1:
        raise DataError(f"--val_fraction={val_fraction} must be between 0 and 1")
    if corpus == "openwebtext":
        if tokenizer != "gpt2":
            raise DataError("openwebtext is only prepared with --tokenizer=gpt2")
        return prepare_openwebtext(out_dir, shard_size, val_fraction or 0.0005, num_proc, name=name)
    docs = {"pydocs": pydocs_documents, "shakespeare_char": shakespeare_documents,
            "text": lambda: text_documents(input)}[corpus]()
    return prepare_documents(name, docs, out_dir, tokenizer, shard_size, val_fraction or 0.1)


def ensure_prepared(name, out_dir="data"):
    """The data dir of dataset `name`; the offline default corpus is prepared on the fly when missing."""
    data_dir = os.path.join(out_dir, name)
    if find_shards(data_dir, "train"):
        return data_dir
    if name == DEFAULT_CORPUS:
        print(f"{data_dir} has no shards yet: preparing the offline default corpus {name} first")
        return prepare(name, out_dir=out_dir)
    where = "" if out_dir == "data" else f" --out_dir={out_dir}"
    how = f"{name}{where}" if name in PREPARERS else f"text --input=PATH --name={name}{where}"
    raise DataError(f"no token shards in {data_dir}; prepare them with `python prepare_data.py {how}` "
                    f"(or put pre-tokenised {name}_train_*.bin / {name}_val_*.bin shards there)")


# -----------------------------------------------------------------------------

OPTIONS = {"input": str, "name": str, "tokenizer": str, "out_dir": str, "shard_size": int, "val_fraction": float,
           "num_proc": int}

if __name__ == "__main__":
    try:
        if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
            raise DataError(f"usage: python prepare_data.py NAME [--key=value ...], NAME one of {', '.join(PREPARERS)}")
        options = {}
        for arg in sys.argv[2:]:
            key, eq, value = arg.removeprefix("--").partition("=")
            if not arg.startswith("--") or not eq or key not in OPTIONS:
                raise DataError(f"bad option {arg!r}; use --key=value with key one of {', '.join(OPTIONS)}")
            try:
                options[key] = OPTIONS[key](value)
            except ValueError:
                kind = "a whole number like 100000000" if OPTIONS[key] is int else "a number like 0.1"
                raise DataError(f"--{key}={value} should be {kind}") from None
        prepare(sys.argv[1], **options)
    except DataError as e:
        sys.exit(f"error: {e}")
