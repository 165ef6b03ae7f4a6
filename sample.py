"""
Generate text from a trained nanoCorridor run, decoding with the tokenizer its data was prepared with (the
checkpoint carries the dataset's meta.json, so this works from any directory).

    python sample.py --out_dir=out/demo --start="The " --num_samples=3 --max_new_tokens=300
    python sample.py --out_dir=out/demo --start=FILE:prompt.txt --temperature=0.8 --top_k=50 --seed=1
    python sample.py --out_dir=out/demo --temperature=0      # greedy: always the most likely next token
"""
import os
import sys

import torch

from configurator import SEED, ConfigError, at_least, configure, optional
from prepare_data import get_tokenizer
from rundir import load_checkpoint, model_from_checkpoint

DEFAULTS = dict(
    out_dir="out/demo",  # the run directory holding ckpt.pt
    start="\n",  # the prompt, or FILE:path to read it from a file
    num_samples=3,  # how many texts to generate
    max_new_tokens=300,  # tokens to generate after the prompt
    temperature=0.8,  # < 1: more conservative, > 1: more random, 0: greedy
    top_k=200,  # keep only the top_k most likely tokens (None: all)
    seed=1337,  # seeds the sampling
    device="cpu",  # where to run: cpu, cuda, cuda:1, mps
)


def temperature_rule(key, value):
    """0, or at least 0.001: dividing the logits by less overflows them to inf (and sampling from them to
    NaN), while at 0.001 sampling already picks the most likely token nearly always, as 0 does exactly."""
    at_least(0.0)(key, value)
    if value != 0 and value < 1e-3:
        raise ConfigError(f"{key}={value!r} is not allowed: give 0 (greedy) or a temperature ≥ 0.001")
    return value


RULES = dict(num_samples=at_least(1), max_new_tokens=at_least(0), temperature=temperature_rule, seed=SEED,
             top_k=optional(int, at_least(1)))


def read_prompt(start):
    if not start.startswith("FILE:"):
        return start
    path = start[len("FILE:"):]
    if os.path.exists(path) and not os.path.isdir(path) and not os.path.isfile(path):  # would hang or never end
        raise ConfigError(f"--start=FILE:{path}: not a regular file (a FIFO or a device); give a text file")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise ConfigError(f"--start=FILE:{path}: the file is not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"--start=FILE:{path}: {e.strerror.lower()}") from None


def sample(cfg):
    try:
        device = torch.device(cfg.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device={cfg.device!r} is not a device to sample on; use cpu, cuda, cuda:N or mps")
    if device.type == "cuda" and not torch.cuda.is_available() or device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device={cfg.device!r} is not available here; use --device=cpu")
    ckpt = load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))
    model = model_from_checkpoint(ckpt, impl="auto").eval().to(device)  # train.py's checks of the weights
    encode, decode = get_tokenizer(ckpt["meta"])
    idx = torch.tensor([encode(read_prompt(cfg.start))], dtype=torch.long, device=device)
    if idx.numel() == 0:
        raise ConfigError("the prompt encodes to no tokens; give a non-empty --start")
    torch.manual_seed(cfg.seed)
    texts = []
    for _ in range(cfg.num_samples):
        out = model.generate(idx, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k)
        texts.append(decode(out[0].tolist()))
        print(texts[-1] + "\n---------------")
    return texts


def main(argv):
    try:
        cfg = configure(DEFAULTS, argv, RULES, files=False, help_from=[("", sys.modules[__name__])])[0]
        return sample(cfg)
    except ValueError as e:  # ConfigError, DataError
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
