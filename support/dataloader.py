"""
The token-shard format, the tokenizers that give its ids a meaning, and the loader of batches.

A shard is the llm.c / modded-nanogpt format: a header of 256 little-endian int32 [magic 20240520,
version 1, number of tokens, 0, ...], then the tokens as uint16. A dataset is a folder data/NAME/ of
such shards and a meta.json (tokenizer and vocabulary), as prepare_data.py writes it. train.py reads
it with ShardLoader, and evaluates on ValSet, the first val_tokens tokens of the val split, read in
order:

    loader = ShardLoader("data/pydocs", "train", batch_size=16, block_size=128)
    x, y = loader.next_batch()   # (B, T) int64 inputs and their next-token targets
    for x, y in ValSet("data/pydocs", block_size=128, val_tokens=10_485_760).batches(16): ...
"""
import glob
import json
import os

import numpy as np
import torch

from support.configurator import ConfigError, open_regular, read_regular

MAGIC, VERSION, HEADER_BYTES = 20240520, 1, 256 * 4  # the header: 256 int32
JSON_BYTES = 16 * 2**20  # a meta.json of 65,536 escaped characters (the largest) is < 1 MB


class DataError(ValueError):
    """A problem with the data or the options, explained in one line that says what to do."""


# -----------------------------------------------------------------------------
# the shard format (see the top): prepare_data.write_shard writes it, read_shard reads it

def read_shard(path, vocab_size=None):
    """Validate a shard and return its tokens as a read-only memmap (nothing is loaded into RAM)."""
    try:
        f = open_regular(path)
    except ConfigError as e:  # a link or a FIFO where a shard should be
        raise DataError(f"{e}; prepare the dataset again") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_BYTES:
            raise DataError(f"{path}: {size} bytes is too small for the {HEADER_BYTES}-byte shard "
                            "header")
        magic, version, ntok = np.frombuffer(f.read(12), dtype="<i4")
        if magic != MAGIC:
            raise DataError(f"{path}: wrong magic number {magic} (expected {MAGIC}); not a token "
                            "shard")
        if version != VERSION:
            raise DataError(f"{path}: unsupported shard version {version} (expected {VERSION})")
        if size != HEADER_BYTES + 2 * ntok:
            held = (size - HEADER_BYTES) / 2
            raise DataError(f"{path}: header says {ntok} tokens but the file holds {held:g}; the "
                            "file is truncated or corrupt, prepare it again")
        tokens = np.memmap(f, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(int(ntok),))  # outlives f
    if vocab_size is not None and ntok and int(tokens.max()) >= vocab_size:
        raise DataError(f"{path}: token id {int(tokens.max())} is >= the model's vocab_size "
                        f"{vocab_size}; the data was prepared with a different tokenizer")
    return tokens


def read_json(path):
    """The value in a dataset's JSON file (meta.json, progress.json), a regular file of at most
    JSON_BYTES."""
    try:
        return json.loads(read_regular(path, JSON_BYTES).decode("utf-8"))
    except ConfigError as e:
        raise DataError(f"{e}; prepare the dataset again") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DataError(f"{path} is not valid JSON ({e}); prepare the dataset again") from None


def check_meta(meta, where, remedy="prepare the dataset again"):
    """meta must describe a dataset, as prepare_data.py writes it: a meta.json, or the copy a
    checkpoint keeps. Else (from another version, or from elsewhere) one line naming where it came
    from, ending in what to do."""
    if meta.get("tokenizer") not in ("char", "byte", "gpt2") or "vocab_size" not in meta:
        raise DataError(f"{where} does not describe a dataset (a tokenizer char, byte or gpt2, and "
                        f"its vocab_size): it comes from another version or elsewhere; {remedy}")
    return meta


def load_meta(data_dir):
    """The dataset's meta.json as a dict: name, tokenizer, vocab_size, tokens per split, ... (how to
    decode). The shards must hold the tokens it records: a dataset that lost a shard does not look
    prepared."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.lexists(path):
        raise DataError(f"{data_dir} has no meta.json, so its shards cannot be trusted or decoded; "
                        "prepare the dataset again with prepare_data.py (it writes meta.json last)")
    meta = check_meta(read_json(path), path)
    for split, n in meta.get("tokens", {}).items():  # a hand-made meta.json may leave them out
        held = sum(len(read_shard(shard)) for shard in find_shards(data_dir, split))
        if held != n:
            raise DataError(f"{data_dir} is damaged: its {split} shards hold {held:,} tokens but "
                            f"meta.json records {n:,} (a shard is missing, extra or replaced); "
                            "prepare the dataset again")
    return meta


def unigram_loss(data_dir, vocab_size):
    """Val loss of predicting the train split's token frequencies (add-one smoothed): the baseline
    to beat."""
    train, val = (sum(np.bincount(read_shard(p), minlength=vocab_size).astype(np.float64)  # (vocab_size,)
                      for p in find_shards(data_dir, split)) for split in ("train", "val"))
    return float(-(val * np.log((train + 1) / (train + 1).sum())).sum() / val.sum())


# -----------------------------------------------------------------------------
# tokenizers: what a dataset's token ids mean, from its meta.json

def gpt2_encoding():
    """tiktoken's GPT-2 BPE (its vocabulary file is downloaded once, then cached by tiktoken)."""
    import tiktoken
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise DataError(f"could not load tiktoken's GPT-2 vocabulary ({type(e).__name__}); "
                        "fetching it needs internet; offline, use a char or byte dataset "
                        "(--tokenizer=char|byte)") from None


def get_tokenizer(meta):
    """(encode, decode) for a dataset's meta: encode str -> list[int], decode list[int] -> str.
    Decoding skips ids beyond the vocabulary: models pad vocab_size, and an untrained one may sample
    those."""
    kind = meta["tokenizer"]
    if kind == "char":
        chars = meta["chars"]
        stoi = {c: i for i, c in enumerate(chars)}

        def encode(s):
            missing = sorted(set(s) - stoi.keys())
            if missing:
                raise DataError(f"characters {''.join(missing)!r} are not in this dataset's "
                                "vocabulary")
            return [stoi[c] for c in s]
        return encode, lambda ids: "".join(chars[i] for i in ids if i < len(chars))
    if kind == "byte":
        return (lambda s: list(s.encode("utf-8")),
                lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", errors="replace"))
    enc = gpt2_encoding()  # gpt2: check_meta let no other tokenizer in
    return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"}),
            lambda ids: enc.decode([i for i in ids if i < enc.n_vocab]))


def token_bytes(meta):
    """The UTF-8 bytes of each token id's text, (vocab_size,) int64, from the tokenizer alone: what
    bits per byte divides by. GPT-2's end-of-text token starts a document, no text of it: 0 bytes
    (as in nanochat)."""
    if meta["tokenizer"] == "byte":
        return np.ones(256, dtype=np.int64)
    if meta["tokenizer"] == "char":
        return np.array([len(c.encode("utf-8")) for c in meta["chars"]], dtype=np.int64)
    enc = gpt2_encoding()
    lengths = [len(enc.decode_single_token_bytes(i)) for i in range(enc.n_vocab)]
    lengths[enc.eot_token] = 0
    return np.array(lengths, dtype=np.int64)


# -----------------------------------------------------------------------------
# the loader

def find_shards(data_dir, split, required=False):
    """The split's shards in data_dir (at least one if required); data/py* is that folder, not a
    pattern."""
    shards = sorted(glob.glob(os.path.join(glob.escape(data_dir), f"*_{split}_*.bin")))
    if required and not shards:
        raise DataError(f"no {split} shards matching *_{split}_*.bin in {data_dir}; prepare the "
                        "dataset with prepare_data.py (python prepare_data.py --help)")
    return shards


def windows(tokens, starts, T):
    """(x, y), both (B, T) int64: the T tokens from each start, and the T after them."""
    buf = torch.from_numpy(np.stack([tokens[s:s + T + 1] for s in starts]).astype(np.int64))  # (B, T+1)
    # compact copies, not views of buf: the layout torch.compile's warm-up saw
    return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()


class ShardLoader:
    """Batches of block_size+1-token windows from memory-mapped shards, in a seeded shuffled order.

    Each shard is cut into windows at stride block_size, visited every epoch in a fresh seeded order
    (random batches, as nanoGPT's: text read in order makes consecutive batches correlated). At each
    step the ranks take the next world_size*batch_size windows, batch_size each: ranks never share
    tokens, and gradient accumulation in one process sees what a DDP job's ranks see. From epoch 1
    on the windows start at a seeded offset in [0, block_size), so a small corpus is not cut into
    the same blocks again. (epoch, shard, pos) is the whole state: a resumed run continues on
    exactly the same data."""

    def __init__(self, data_dir, split, batch_size, block_size, rank=0, world_size=1, vocab_size=None,
                 seed=0):
        self.shards = find_shards(data_dir, split, required=True)
        self.B, self.T, self.rank = batch_size, block_size, rank
        self.vocab_size, self.seed = vocab_size, seed
        self.step = world_size * batch_size  # windows the whole world consumes per batch
        self.shard = None
        self.reset()

    def reset(self):
        self.load_state_dict({"epoch": 0, "shard": 0, "pos": 0})

    def state_dict(self):
        return {"epoch": self.epoch, "shard": self.shard, "pos": self.pos}

    def load_state_dict(self, state):
        """Continue from state (state_dict's, kept in a checkpoint): it must point into the data."""
        if not 0 <= state["shard"] < len(self.shards):
            raise DataError(f"loader state points at shard {state['shard']} but there are only "
                            f"{len(self.shards)} shards; the data changed since the checkpoint")
        # one memmap is open, for the current shard only, and dropped when we move on: memory stays flat;
        # reset() before every evaluation does not validate the shard again
        if state["shard"] != self.shard:
            self.shard = state["shard"]
            self.tokens = read_shard(self.shards[self.shard], self.vocab_size)
            if len(self.tokens) < self.step * self.T + 1:
                raise DataError(f"{self.shards[self.shard]}: {len(self.tokens)} tokens is shorter "
                                "than one batch of world_size*batch_size*block_size+1 = "
                                f"{self.step * self.T + 1}; use a smaller batch or block, or "
                                "prepare the data with a larger --shard_size")
        self.epoch = state["epoch"]
        rng = np.random.default_rng([self.seed, self.epoch, self.shard])  # this (epoch, shard)'s window order
        offset = int(rng.integers(self.T)) if self.epoch > 0 else 0
        offset = min(offset, len(self.tokens) - 1 - self.step * self.T)  # one batch must still fit
        self.starts = offset + self.T * rng.permutation((len(self.tokens) - 1 - offset) // self.T)
        if state["pos"] > len(self.starts):
            raise DataError(f"loader state points at window {state['pos']} of "
                            f"{self.shards[self.shard]}, which has {len(self.starts)} windows of "
                            f"block_size {self.T}; the data changed since the checkpoint")
        self.pos = state["pos"]

    def next_batch(self, device="cpu"):
        """This rank's next (x, y), both (B, T) on device."""
        # this shard is used up: the next shard, or after the last one (wrapped = 1) the next epoch
        if self.pos + self.step > len(self.starts):
            wrapped, shard = divmod(self.shard + 1, len(self.shards))
            self.load_state_dict({"epoch": self.epoch + wrapped, "shard": shard, "pos": 0})
        at = self.pos + self.rank * self.B  # this rank's batch_size windows of the world's step
        mine = self.starts[at:at + self.B]
        self.pos += self.step
        x, y = windows(self.tokens, mine, self.T)
        if device.startswith("cuda"):
            x, y = x.pin_memory(), y.pin_memory()
            return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        return x.to(device), y.to(device)


class ValSet:
    """The val set: the first val_tokens tokens of the val split (all when shorter), as block_size
    windows tokens[i*T : i*T+T+1] (the last may be shorter); rank r takes windows r, r + world_size,
    ..., and the per-token losses summed over all ranks, divided by `count`, are the val loss
    (docs/evaluation.md)."""

    def __init__(self, data_dir, block_size, val_tokens, rank=0, world_size=1, vocab_size=None):
        parts, wanted = [], val_tokens + 1  # +1: the first token is only read, never predicted
        # one stream of tokens, the shards in order
        for path in find_shards(data_dir, "val", required=True):
            part = read_shard(path, vocab_size)[:wanted - sum(map(len, parts))]
            parts.append(np.array(part))  # a copy: at most val_tokens+1 uint16, and no memmap left open
        self.tokens = np.concatenate(parts)
        self.count = len(self.tokens) - 1  # the tokens predicted, over all ranks
        if self.count < 1:
            raise DataError(f"the val split of {data_dir} has {len(self.tokens)} tokens; it needs "
                            "at least 2 to predict one: prepare the data with a larger "
                            "--val_fraction")
        self.T, self.starts = block_size, list(range(0, self.count, block_size))[rank::world_size]

    def batches(self, batch_size):
        """This rank's windows as (x, y) int64 batches of up to batch_size; a short last window
        alone."""
        full = [s for s in self.starts if s + self.T <= self.count]
        for i in range(0, len(full), batch_size):
            yield windows(self.tokens, full[i:i + batch_size], self.T)
        for s in self.starts[len(full):]:  # at most one: the split's last window, shorter than T
            yield windows(self.tokens, [s], self.count - s)
