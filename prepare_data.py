"""
Prepare a dataset for nanoCorridor: documents -> train/val split -> tokens -> shards + meta.json.

    python prepare_data.py pydocs                         # offline default: CPython's documentation
    python prepare_data.py shakespeare_char               # tiny shakespeare (needs internet)
    python prepare_data.py text --input=book.txt          # a UTF-8 file, or a folder of .txt files
    python prepare_data.py openwebtext --num_proc=8       # OpenWebText in GPT-2 tokens (~9B)
    python prepare_data.py fineweb10B --train_shards=103  # FineWeb in GPT-2 tokens: 100M a shard
    python prepare_data.py hellaswag                      # HellaSwag's val set (hellaswag_interval)

`python prepare_data.py NAME --help` lists the options NAME takes.

Output goes to out_dir/NAME/: NAME_val_000000.bin, NAME_train_000001.bin, ... (the llm.c shard
format, see support/dataloader.py) and meta.json, written last: a folder without it is not a
dataset. The same command again finishes an interrupted preparation; openwebtext and fineweb10B keep
every finished file. A second preparation of the same dataset waits on the lock file
out_dir/.NAME.lock, then uses the result.

The hub corpora are pinned to one revision each, so they are the same wherever they are prepared:
- openwebtext: the 80 parquet files of Skylion007/openwebtext. A document goes to val when a hash of
  its text (BLAKE2b, as a number in [0, 1)) is below --val_fraction: the same split on any machine.
- fineweb10B: kjj0/fineweb10B-gpt2 as modded-nanogpt uses it, each file checked (size, header, ids).
- hellaswag: Rowan/hellaswag's val split (10,042 examples) as text in out_dir/hellaswag/val.jsonl.
"""
import argparse
import errno
import hashlib
import json
import os
import re
import shutil
import sys
import time
from contextlib import contextmanager
from functools import partial
from itertools import chain
from pathlib import Path

import filelock
import numpy as np
from tqdm import tqdm

from support.configurator import open_regular, refuse_unless_regular
from support.dataloader import (HEADER_BYTES, MAGIC, VERSION, DataError, find_shards, gpt2_encoding,
                                load_meta, read_json, read_shard)
from support.rundir import atomic_write

DEFAULT_CORPUS = "pydocs"  # needs no download, so the README's main command works anywhere
SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                   "tinyshakespeare/input.txt")
DOC_SEPARATOR = "\n\n"  # char/byte: between documents (gpt2 puts end-of-text before each instead)
NAME_LENGTH = 50  # characters: NAME_train_000001.bin.tmp stays within 255 bytes, at 4 bytes a char

OWT_REPO, OWT_REVISION = "Skylion007/openwebtext", "79d93d786212f7344586290adb811d4ae6a1762c"
OWT_FILES = [f"plain_text/train-{i:05d}-of-00080.parquet" for i in range(80)]
OWT_DOCUMENTS = 8_013_769  # in that revision
OWT_TOKENS = 9.0e9  # nanoGPT's count of its GPT-2 tokens (~9.0B train, ~4.4M val): for the disk
OWT_BATCH = 8192  # documents read and tokenised at a time (~40 MB of text)
FINEWEB_REPO, FINEWEB_REVISION = "kjj0/fineweb10B-gpt2", "889765ea1f903759787add96995d81171b632d0c"
FINEWEB_TRAIN_FILES = 103  # fineweb_train_000001.bin .. 000103.bin, 100M tokens each
HELLASWAG_REPO, HELLASWAG_REVISION = "Rowan/hellaswag", "218ec52e09a7e7462a5400043bb9a69a41d06b76"
HELLASWAG_FILE = "data/validation-00000-of-00001.parquet"


# -----------------------------------------------------------------------------
# the core: documents -> split -> tokens -> shards -> meta.json

def prepare_documents(name, docs, out_dir="data", tokenizer="char", shard_size=100_000_000,
                      val_fraction=0.1):
    """Tokenise in-memory documents into shards in the staging folder, then make them out_dir/name
    (returned): meta.json goes first and comes back last: a kill in between leaves no dataset."""
    start = time.time()
    if not any(docs):
        raise DataError(f"{name}: the corpus is empty; give it some text")
    # split: the last val_fraction of the text is val
    train, val = split_documents(docs, val_fraction)
    chars = [sum(map(len, split)) for split in (train, val)]
    print(f"{name}: {len(docs):,} documents, {chars[0]:,} train / {chars[1]:,} val characters")
    # pydocs: 79 documents, 418,473 train / 46,497 val characters
    # the vocabulary: the corpus's characters (char), the 256 bytes, or GPT-2's 50,257 BPE tokens
    meta = {"name": name, "tokenizer": tokenizer, "tokens": {}}
    if tokenizer == "char":
        meta["chars"] = "".join(sorted(set(DOC_SEPARATOR).union(*docs)))
        meta["vocab_size"] = len(meta["chars"])
    elif tokenizer == "byte":
        meta["vocab_size"] = 256
    else:
        enc = gpt2_encoding()
        meta["vocab_size"], meta["eot_token"] = enc.n_vocab, enc.eot_token
    if meta["vocab_size"] > 2**16:
        raise DataError(f"{name}: {meta['vocab_size']:,} distinct characters do not fit uint16; "
                        "use --tokenizer=byte")
    data_dir, staging = dataset_dirs(out_dir, name)
    shutil.rmtree(staging, ignore_errors=True)  # an interrupted run's (the lock keeps others out)
    os.makedirs(staging)
    try:
        # tokens, then shards of shard_size tokens, numbered as llm.c's: NAME_val_000000,
        # NAME_train_000001, ...
        for split, split_docs, first in (("val", val, 0), ("train", train, 1)):
            tokens = encode_split(split_docs, meta, f"tokenising {split}")
            if len(tokens) == 0:
                raise DataError(f"{name}: the {split} split is empty; the corpus is too small for "
                                "--val_fraction")
            for i, at in enumerate(range(0, len(tokens), shard_size), first):
                path = os.path.join(staging, f"{name}_{split}_{i:06d}.bin")
                write_shard(path, tokens[at:at + shard_size])
            meta["tokens"][split] = len(tokens)
        # publish: the old meta.json goes first, the shards move in, the new meta.json comes last
        files = publish(staging, data_dir)
        write_json(os.path.join(data_dir, "meta.json"), meta)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    counts = ", ".join(f"{n:,} {split} tokens" for split, n in meta["tokens"].items())
    print(f"{name}: {counts}; vocabulary {meta['tokenizer']} with {meta['vocab_size']:,} symbols")
    print(f"wrote {len(files)} shards + meta.json to {data_dir} in {time.time() - start:.1f}s")
    # pydocs: 46,513 val tokens, 418,613 train tokens; vocabulary char with 103 symbols
    # wrote 2 shards + meta.json to data/pydocs in 0.1s
    return data_dir


def split_documents(docs, val_fraction):
    """Deterministic split: the last val_fraction of the characters go to val, as whole documents
    except for the one that straddles the cut (so a one-document corpus is split 90/10 exactly like
    nanoGPT does)."""
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


def encode_split(docs, meta, desc):
    """A split's documents as one uint16 array (gpt2's is smaller than their text, in memory
    already): gpt2 document by document, char and byte joined by DOC_SEPARATOR in numpy (a Python
    loop is slow on 100 MB)."""
    if meta["tokenizer"] == "gpt2":
        enc, docs = gpt2_encoding(), tqdm(docs, desc=desc, unit="doc", disable=len(docs) < 1000)
        tokens = chain.from_iterable(encode_gpt2_document(doc, enc) for doc in docs)
        return np.fromiter(tokens, np.uint16)
    text = DOC_SEPARATOR.join(docs)
    if meta["tokenizer"] == "byte":
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
    codepoints = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    # the vocabulary is sorted, so searchsorted finds each character's id
    vocab = np.frombuffer(meta["chars"].encode("utf-32-le"), dtype="<u4")
    return np.searchsorted(vocab, codepoints).astype(np.uint16)


def write_shard(path, tokens):
    """A shard: a header of 256 int32 [magic, version, number of tokens, 0, ...], then the tokens as
    uint16 (vocab_size <= 2**16), written whole or not at all."""
    header = np.zeros(HEADER_BYTES // 4, dtype="<i4")
    header[:3] = MAGIC, VERSION, len(tokens)

    def write(f):
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())
    atomic_write(path, write)


def encode_gpt2_document(text, enc):
    return [enc.eot_token] + enc.encode_ordinary(text)  # as llm.c: end-of-text starts a document


def ensure_prepared(name, out_dir="data"):
    """The data dir of dataset `name`, once it is prepared (a valid meta.json, and shards that hold
    the tokens it records). The offline default corpus is prepared on the fly, again if it is
    damaged."""
    data_dir, staging = dataset_dirs(out_dir, check_dataset_name("dataset", name))
    if name == DEFAULT_CORPUS:
        if not prepared_from(data_dir, None):
            with preparing(out_dir, name):
                # else another process prepared it while we waited
                if not prepared_from(data_dir, None):
                    print(f"{data_dir} is not prepared (or is damaged): preparing the offline "
                          f"default corpus {name} first")
                    prepare_documents(name, pydocs_documents(), out_dir)
        return data_dir
    if os.path.lexists(os.path.join(data_dir, "meta.json")):
        load_meta(data_dir)  # a damaged dataset (a shard missing, meta.json broken) is refused
        return data_dir
    where = "" if out_dir == "data" else f" --out_dir={out_dir}"
    how = f"{name}{where}" if name in CORPORA else f"text --input=PATH --name={name}{where}"
    leftover = (f"; {staging}/ is left from an interrupted preparation, which the same command "
                "finishes"
                if os.path.isdir(staging) else "")
    what = ("has no meta.json, so it is not a finished dataset" if os.path.isdir(data_dir) else
            "is not a folder" if os.path.lexists(data_dir) else "does not exist")
    raise DataError(f"dataset {data_dir} {what}{leftover}; prepare it with `python prepare_data.py "
                    f"{how}`")


# -----------------------------------------------------------------------------
# corpora small enough to hold in memory: their documents

def pydocs_documents():
    from pydoc_data.topics import topics  # CPython's documentation: ~465k characters of English
    return [topics[key] for key in sorted(topics)]


def shakespeare_documents():
    import urllib.request
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=30) as r:
            return [r.read().decode("utf-8")]
    except OSError as e:  # URLError and timeouts are OSErrors too
        raise DataError(f"could not download tiny shakespeare ({getattr(e, 'reason', e)}); "
                        f"offline, fetch {SHAKESPEARE_URL} elsewhere and run `python "
                        "prepare_data.py text --input=PATH --name=shakespeare_char`") from None


def text_documents(path):
    if not os.path.lexists(path):
        raise DataError(f"--input={path} does not exist; give a UTF-8 text file or a folder of "
                        ".txt files")
    files = [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if f.lower().endswith(".txt"))
        if not files:
            raise DataError(f"no .txt files in folder {path}; put one document per .txt file there")
    for file in files:
        try:
            with open_regular(file, encoding="utf-8") as f:
                yield f.read()
        except UnicodeDecodeError:
            raise DataError(f"{file} is not UTF-8 text; convert it (e.g. iconv -t UTF-8) and "
                            "retry") from None


# -----------------------------------------------------------------------------
# corpora on the Hugging Face hub, at pinned revisions, prepared a file at a time

def prepare_openwebtext(out_dir="data", val_fraction=0.0005, num_proc=None):
    """OpenWebText -> GPT-2 tokens, one parquet file at a time: fetched, tokenised in num_proc
    processes into its train shard and val share, noted in progress.json."""
    from multiprocessing import Pool
    start, name = time.time(), "openwebtext"
    num_proc = num_proc or max(1, (os.cpu_count() or 2) // 2)
    enc = gpt2_encoding()  # first: it fails fast, the download does not
    data_dir, staging = dataset_dirs(out_dir, name)
    source = {"repo": OWT_REPO, "revision": OWT_REVISION, "tokenizer": enc.name,
              "val_fraction": val_fraction}
    if prepared_from(data_dir, source):
        print(f"{data_dir} is already prepared; delete it to prepare it again")
        return data_dir
    sizes = hub_sizes(OWT_REPO, OWT_REVISION, OWT_FILES)
    # progress.json: the files finished by an interrupted run with these settings (else start over)
    progress_path = os.path.join(staging, "progress.json")
    progress = read_json(progress_path) if os.path.lexists(progress_path) else {}
    if progress.get("source") != source:
        progress = {"source": source, "done": {}}  # done: file -> its documents and tokens
    done = progress["done"]
    todo = [file for file in OWT_FILES if file not in done]
    os.makedirs(staging, exist_ok=True)
    unfinished(data_dir)
    shards = 2 * OWT_TOKENS * sum(sizes[file] for file in todo) / sum(sizes.values())
    print(f"{name}: {len(todo)} of {len(OWT_FILES)} parquet files to tokenise, in {num_proc} "
          "processes; disk needed "
          f"~{gigabytes(shards + max((sizes[file] for file in todo), default=0))} (the shards, and "
          f"one parquet file at a time); {gigabytes(shutil.disk_usage(out_dir).free)} free")
    val_share = lambda i: os.path.join(staging, f"val_{i:05d}.bin")
    # tiktoken's encoding pickles by name
    encode = partial(encode_in_worker, enc=enc, val_fraction=val_fraction)
    with Pool(num_proc) as pool, \
            tqdm(total=OWT_DOCUMENTS, initial=sum(d["docs"] for d in done.values()), unit="doc",
                 desc=f"tokenising {name}") as bar:
        for i, file in enumerate(OWT_FILES):
            if file in done:
                continue
            path = hub_download(OWT_REPO, OWT_REVISION, file, sizes[file], staging)
            split = {False: [], True: []}  # in val? -> the file's documents as tokens (~220 MB)
            for texts in (batch["text"] for batch in parquet_columns(path, file, ["text"])):
                # one batch at a time through map: imap over every document would queue the file
                for tokens, in_val in pool.map(encode, texts, chunksize=64):
                    split[in_val].append(tokens)
                bar.update(len(texts))
            train, val = (np.concatenate([np.empty(0, np.uint16), *split[k]]) for k in (False, True))
            write_shard(os.path.join(data_dir, f"{name}_train_{i + 1:06d}.bin"), train)
            write_shard(val_share(i), val)
            done[file] = {"docs": sum(map(len, split.values())), "train": len(train),
                          "val": len(val)}
            write_json(progress_path, progress)  # from here on this file counts as done
            os.remove(path)
    meta = {"name": name, "tokenizer": "gpt2", "vocab_size": enc.n_vocab,
            "eot_token": enc.eot_token,
            "source": source, "documents": sum(d["docs"] for d in done.values()),
            "tokens": {split: sum(d[split] for d in done.values()) for split in ("val", "train")}}
    if meta["tokens"]["val"] == 0:
        raise DataError(f"{name}: the val split is empty; raise --val_fraction")
    # the val shares, in file order, make the val shard
    val = np.concatenate([read_shard(val_share(i)) for i in range(len(OWT_FILES))])
    write_shard(os.path.join(data_dir, f"{name}_val_000000.bin"), val)
    write_json(os.path.join(data_dir, "meta.json"), meta)
    shutil.rmtree(staging)
    print(f"{name}: {meta['documents']:,} documents, {meta['tokens']['train']:,} train / "
          f"{meta['tokens']['val']:,} val tokens in {data_dir} ({time.time() - start:.0f}s)")
    return data_dir


def encode_in_worker(text, enc, val_fraction):
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()  # same on any machine
    in_val = int.from_bytes(digest, "big") / 2**64 < val_fraction
    return np.array(encode_gpt2_document(text, enc), dtype=np.uint16), in_val


def prepare_fineweb(out_dir="data", train_shards=FINEWEB_TRAIN_FILES):
    """FineWeb's val shard and its first train_shards train shards (GPT-2 tokens), checked."""
    start, name = time.time(), "fineweb10B"
    data_dir, staging = dataset_dirs(out_dir, name)
    files = ["fineweb_val_000000.bin"]
    files += [f"fineweb_train_{i:06d}.bin" for i in range(1, train_shards + 1)]
    source = {"repo": FINEWEB_REPO, "revision": FINEWEB_REVISION, "train_shards": train_shards}
    if prepared_from(data_dir, source):
        print(f"{data_dir} is already prepared; delete it to prepare it again")
        return data_dir
    extra = sorted({os.path.basename(p) for p in find_shards(data_dir, "train")} - set(files))
    if extra:
        raise DataError(f"{data_dir} holds {len(extra)} train shards beyond "
                        f"--train_shards={train_shards} ({extra[0]} ...), which training reads "
                        "too; delete them or raise --train_shards")
    sizes = hub_sizes(FINEWEB_REPO, FINEWEB_REVISION, files)
    final = lambda file: os.path.join(data_dir, file)  # only a checked download gets its final name
    todo = [file for file in files if os.path.islink(final(file)) or not os.path.isfile(final(file)) or
            os.path.getsize(final(file)) != sizes[file]]  # files already here, whole, are kept
    unfinished(data_dir)
    print(f"{name}: {len(files) - len(todo)} of {len(files)} files already here; downloading "
          f"{len(todo)} needs {gigabytes(sum(map(sizes.get, todo)))} "
          f"({gigabytes(shutil.disk_usage(out_dir).free)} free)")
    for file in tqdm(todo, desc=f"downloading {name}", unit="file"):
        path = hub_download(FINEWEB_REPO, FINEWEB_REVISION, file, sizes[file], staging)
        try:
            read_shard(path, vocab_size=50257)  # the header, the size it implies, every token id
        except DataError as e:
            os.remove(path)
            raise DataError(f"{e} (deleted it: run the same command again to fetch it "
                            "anew)") from None
        os.replace(path, final(file))
    tokens = {split: sum(len(read_shard(final(file))) for file in files if f"_{split}_" in file)
              for split in ("val", "train")}
    write_json(final("meta.json"), {"name": name, "tokenizer": "gpt2", "vocab_size": 50257,
                                    "eot_token": 50256, "source": source, "tokens": tokens})
    shutil.rmtree(staging, ignore_errors=True)
    print(f"{name}: {tokens['train']:,} train / {tokens['val']:,} val tokens in {data_dir} "
          f"({time.time() - start:.0f}s)")
    return data_dir


def prepare_hellaswag(out_dir="data"):
    """HellaSwag's val split -> out_dir/hellaswag/val.jsonl: ctx, endings, label, one a line."""
    data_dir, staging = dataset_dirs(out_dir, "hellaswag")
    path = os.path.join(data_dir, "val.jsonl")
    if os.path.exists(path):
        print(f"{path} is already prepared; delete it to prepare it again")
        return data_dir
    size = hub_sizes(HELLASWAG_REPO, HELLASWAG_REVISION, [HELLASWAG_FILE])[HELLASWAG_FILE]
    download = hub_download(HELLASWAG_REPO, HELLASWAG_REVISION, HELLASWAG_FILE, size, staging)
    examples = []
    for batch in parquet_columns(download, HELLASWAG_FILE, ["ctx", "endings", "label"]):
        for ctx, endings, label in zip(batch["ctx"], batch["endings"], batch["label"]):
            example = {"ctx": ctx, "endings": endings, "label": int(label)}  # "0".."3" in the parquet
            examples.append(json.dumps(example) + "\n")
    os.makedirs(data_dir, exist_ok=True)
    atomic_write(path, lambda f: f.write("".join(examples).encode("utf-8")))  # whole or not at all
    shutil.rmtree(staging)
    print(f"hellaswag: {len(examples):,} val examples in {path}")
    return data_dir


# -----------------------------------------------------------------------------
# the table of corpora, and the command line it makes: `python prepare_data.py NAME --help`

def between(kind, low, high):
    """argparse's type for a number strictly between low and high."""
    def parse(text):
        value = kind(text)
        if not low < value < high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low} and {high}")
        return value
    parse.__name__ = kind.__name__  # for argparse's "invalid int value: 'abc'"
    return parse


# the options, as argparse takes them; only those given reach prepare: each corpus has its defaults
POSITIVE, FRACTION = between(int, 0, np.inf), between(float, 0, 1)
INPUT = "--input", dict(required=True, help="a UTF-8 text file, or a folder of .txt files")
TEXT = [("--name", dict(help="the dataset's name (default: the corpus's, or the input's)")),
        ("--tokenizer", dict(choices=["char", "byte", "gpt2"],
                             help="char (the corpus's characters; the default), byte or gpt2")),
        ("--shard_size", dict(type=POSITIVE, help="tokens per shard (default 100,000,000)")),
        ("--val_fraction", dict(type=FRACTION, help="the share of the text, at its end, that goes "
                                "to val (default 0.1)"))]
OWT = [("--val_fraction", dict(type=FRACTION, help="the share of documents that go to val, by a "
                               "hash of their text (default 0.0005)")),
       ("--num_proc", dict(type=POSITIVE, help="tokenising processes (default: half the CPUs)"))]
FINEWEB = [("--train_shards", dict(type=between(int, 0, FINEWEB_TRAIN_FILES + 1),
                                   help="train shards of 100M tokens to fetch, 1 to 103 (default: "
                                   "all)"))]
# name -> (its documents, held in memory, or the function that prepares it; its options)
CORPORA = {
    "pydocs": ("documents", pydocs_documents, TEXT),
    "shakespeare_char": ("documents", shakespeare_documents, TEXT),
    "text": ("documents", text_documents, [INPUT, *TEXT]),
    "openwebtext": ("prepared", prepare_openwebtext, OWT),
    "fineweb10B": ("prepared", prepare_fineweb, FINEWEB),
    "hellaswag": ("prepared", prepare_hellaswag, []),
}


def prepare(corpus, out_dir="data", **options):
    """Prepare `corpus` with the options CORPORA gives it, as the command line does: its data dir."""
    kind, source, _ = CORPORA[corpus]
    # a hub corpus, too large for memory: its own function prepares it file by file
    if kind == "prepared":
        with preparing(out_dir, corpus):
            return source(out_dir, **options)
    input = options.pop("input", None)
    # the name: the input's for text (books/ -> books, moby.txt -> moby), else the corpus's
    name = check_dataset_name("name", options.pop("name", Path(input).stem if input else corpus))
    docs = list(source(input) if input else source())
    with preparing(out_dir, name):
        return prepare_documents(name, docs, out_dir, **options)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    names = parser.add_subparsers(dest="corpus", metavar="NAME", required=True)
    for corpus, (_, _, options) in CORPORA.items():
        sub = names.add_parser(corpus, argument_default=argparse.SUPPRESS)
        sub.add_argument("--out_dir", help="datasets go to OUT_DIR/NAME/ (default: data)")
        for flag, settings in options:
            sub.add_argument(flag, **settings)
    args, unknown = parser.parse_known_args(argv or ["--help"])
    if unknown:  # refused by the corpus's own parser, whose usage line lists the options it takes
        names.choices[args.corpus].error(f"unrecognized arguments: {' '.join(unknown)}")
    options = vars(args)
    prepare(options.pop("corpus"), **options)


# -----------------------------------------------------------------------------
# publishing: a dataset appears whole or not at all, one preparation at a time

def check_dataset_name(key, name):
    """The one check of a dataset's name (--name, train.py --dataset), the folder out_dir/NAME and
    its shards' prefix: no '/', '..', glob ('py*' is pydocs too), '_train' or '_val' (the other
    split's shards match)."""
    plain = re.fullmatch(r"[^\W_][\w.-]*", name) and len(name) <= NAME_LENGTH
    if not plain or any(f"_{split}_" in name + "_" for split in ("train", "val")):
        raise DataError(f"--{key}={name!r} must be a plain folder name: up to {NAME_LENGTH} "
                        "letters, digits, '_', '-' and '.', starting with a letter or digit, not "
                        f"containing or ending in '_train' or '_val'; give another --{key}")
    return name


def dataset_dirs(out_dir, name):
    """The dataset's folder and the hidden folder where its unfinished parts wait."""
    return os.path.join(out_dir, name), os.path.join(out_dir, f".{name}.staging")


def write_json(path, value):
    atomic_write(path, lambda f: f.write(json.dumps(value, indent=1).encode("utf-8")))


def unfinished(data_dir):
    """Make data_dir if missing, and remove its meta.json: not a dataset until it is finished."""
    os.makedirs(data_dir, exist_ok=True)
    Path(data_dir, "meta.json").unlink(missing_ok=True)


def publish(staging, data_dir):
    """Move staging's shards into data_dir in place of an earlier preparation's, its meta.json
    removed first: a kill on the way leaves a folder without meta.json, which is not a dataset.
    Returns the files moved."""
    unfinished(data_dir)
    for old in find_shards(data_dir, "train") + find_shards(data_dir, "val"):
        os.remove(old)
    files = sorted(os.listdir(staging))
    for file in files:
        os.replace(os.path.join(staging, file), os.path.join(data_dir, file))
    return files


def prepared_from(data_dir, source):
    """Whether data_dir holds a finished, whole dataset made from `source` (None: in-memory docs)."""
    try:
        return load_meta(data_dir).get("source") == source
    except DataError:  # no meta.json, a broken one, or shards that do not hold what it records
        return False


@contextmanager
def preparing(out_dir, name):
    """Hold the dataset's lock while preparing it, and turn a failing file system into one line."""
    lock_path = os.path.join(out_dir, f".{name}.lock")
    # the OS's lock (flock, LockFileEx), as rundir.lock_run_dir's: released when the process dies,
    # even by kill -9, and its file stays. Where the OS has none, filelock's marker file must be
    # removed to release it.
    os_lock = filelock.FileLock is not filelock.SoftFileLock
    lock = filelock.FileLock(lock_path, preserve_lock_file=os_lock)
    try:
        os.makedirs(out_dir, exist_ok=True)
        refuse_unless_regular(lock_path)  # a link, a folder or a FIFO there: refused, not followed
        try:
            lock.acquire(blocking=False)
        except filelock.Timeout:
            print(f"another process is preparing {name} (it holds {lock_path}): waiting for it to "
                  "finish")
            lock.acquire()
    except FileExistsError:
        raise DataError(f"the data folder {out_dir} is a file; move it away, or prepare into "
                        "another folder with prepare_data.py NAME --out_dir=DIR") from None
    except OSError as e:
        raise DataError(f"the data folder {out_dir} cannot be written to ({e.strerror}: "
                        f"{e.filename}); use another one with prepare_data.py NAME "
                        "--out_dir=DIR") from None
    try:
        staging = dataset_dirs(out_dir, name)[1]
        if os.path.islink(staging):  # the hidden folder is ours: a link there is removed
            os.remove(staging)
        yield
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise DataError(f"no space left on device in {out_dir}; the unfinished file was "
                            "removed and the finished ones are kept: free space and run the same "
                            "command again") from None
        raise DataError(f"{e.strerror or e}: {e.filename or out_dir}") from None
    finally:
        lock.release()


def hub_sizes(repo, revision, files):
    """{file: bytes} as the hub lists them. One request, before anything else: offline, or a wrong
    repository or revision, fails at once, and the sizes give the disk needed and the check of every
    download."""
    import huggingface_hub
    try:
        infos = huggingface_hub.get_paths_info(repo, files, repo_type="dataset", revision=revision)
    except Exception as e:  # a network failure comes as any of several libraries' exceptions
        raise hub_error(e, repo, revision) from None
    return {info.path: info.size for info in infos}


def hub_download(repo, revision, file, size, staging):
    """Fetch one file into staging/download (resumed if interrupted): its path, once its size is
    the hub's."""
    import huggingface_hub
    download_dir = os.path.join(staging, "download")
    try:
        path = huggingface_hub.hf_hub_download(repo, file, repo_type="dataset", revision=revision,
                                               local_dir=download_dir)
    except Exception as e:
        if getattr(e, "errno", None) == errno.ENOSPC:
            shutil.rmtree(download_dir, ignore_errors=True)  # the partial download's space
            raise
        raise hub_error(e, repo, revision, file) from None
    got = os.path.getsize(path)
    if got != size:
        os.remove(path)
        raise DataError(f"{file}: the download has {got:,} bytes but the hub lists {size:,}; "
                        "deleted it, run the same command again to fetch it anew")
    return path


def hub_error(e, repo, revision, filename=None):
    from huggingface_hub import errors
    what = f"{filename + ' of ' if filename else ''}{repo} at revision {revision}"
    if isinstance(e, errors.RepositoryNotFoundError):
        return DataError(f"the hub has no dataset repository {repo} (or it is private)")
    if isinstance(e, errors.HfHubHTTPError):
        return DataError(f"the hub refused {what}: {str(e).splitlines()[0]}")
    return DataError(f"could not reach the Hugging Face hub for {what} ({type(e).__name__}); "
                     "this needs internet")


def parquet_columns(path, file, columns):
    """`columns` of a downloaded parquet file as {column: values}, OWT_BATCH rows at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=OWT_BATCH, columns=columns):
            yield batch.to_pydict()
    except pa.ArrowException as e:
        os.remove(path)
        raise DataError(f"{file} cannot be read as parquet ({str(e).splitlines()[0]}); deleted it, "
                        "run the same command again to fetch it anew") from None


def gigabytes(n):
    return f"{n / 1e9:.1f} GB"


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ValueError as e:  # DataError and ConfigError: one line that says what to do
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted: run the same command again to finish (finished files are kept)")
