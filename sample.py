"""
Generate text from a trained nanoCorridor run, decoding with the tokenizer its data was prepared
with (the checkpoint carries the dataset's meta.json, so this works from any directory), or from
OpenAI's GPT-2 weights with any op, decoding with tiktoken's GPT-2 BPE.

    python sample.py --out_dir=out/demo --start="The " --num_samples=3 --max_new_tokens=300
    python sample.py --out_dir=out/demo --start=FILE:prompt.txt --temperature=0.8 --top_k=50 --seed=1
    python sample.py --out_dir=out/demo --temperature=0      # greedy: the most likely next token
    python sample.py --init_from=gpt2 --start="The corridor" --op=mix --gamma_init=-0.3  # or gpt2-xl
"""
import os
import sys

import torch

from support.configurator import (SEED, ConfigError, at_least, configure, optional, require_torch,
                                  requires)
from support.dataloader import get_tokenizer
from support.hardware import device_rule, pick_device
from model import GPT
from operators import all_controls
from support.rundir import load_checkpoint
from support.settings import help_from

DEFAULTS = dict(
    init_from="resume",  # resume (out_dir's ckpt.pt), gpt2..gpt2-xl or a local GPT-2 folder
    out_dir="out/demo",  # the run directory holding ckpt.pt
    start="\n",  # the prompt, or FILE:path to read it from a file
    num_samples=3,  # how many texts to generate
    max_new_tokens=300,  # tokens to generate after the prompt
    temperature=0.8,  # < 1: more conservative, > 1: more random, 0: greedy
    top_k=200,  # keep only the top_k most likely tokens (None: all)
    seed=1337,  # seeds the sampling
    device="auto",  # auto (cuda > mps > cpu, as train.py picks), cpu, cuda, cuda:1 or mps
    op="mix",  # GPT-2 only: what its heads apply (a checkpoint keeps its own), with its controls
    **all_controls(),
)


# temperature: 0 (greedy) or at least 0.001: dividing the logits by less overflows them to inf, and
# sampling to NaN
RULES = dict(num_samples=at_least(1), max_new_tokens=at_least(0), seed=SEED, device=device_rule,
             temperature=requires(lambda t: t == 0 or t >= 1e-3, "give 0 (greedy) or a temperature ≥ 0.001"),
             top_k=optional(int, at_least(1)))


def read_prompt(start):
    if not start.startswith("FILE:"):
        return start
    path = start.removeprefix("FILE:")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise ConfigError(f"--start=FILE:{path}: the file is not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"--start=FILE:{path}: {e.strerror.lower()}") from None


def sample(cfg, given=frozenset()):
    device = pick_device(cfg.device)[0]  # as train.py picks it
    # GPT-2's heads only
    op_settings = [k for k in sorted(given) if k == "op" or k in all_controls()]
    if cfg.init_from == "resume":
        if op_settings:
            raise ConfigError(f"--{op_settings[0]} applies to GPT-2 weights (--init_from=gpt2): "
                              "a checkpoint's op is fixed; drop it")
        ckpt = load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))
        model = GPT.from_checkpoint(ckpt, impl="sdpa")  # the kernel is for training
        encode, decode = get_tokenizer(ckpt["meta"])
    else:
        # GPT-2's weights, every head switched to the chosen op (given controls set it, the rest
        # default)
        controls = {k: getattr(cfg, k) for k in op_settings if k != "op"}
        model = GPT.from_pretrained(cfg.init_from, op=cfg.op, controls=controls)
        encode, decode = get_tokenizer({"tokenizer": "gpt2"})
    model.eval().to(device)
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
        require_torch(torch.__version__)
        return sample(*configure(DEFAULTS, argv, RULES, files=False,
                                 help_from=help_from(sys.modules[__name__])))
    except ValueError as e:  # ConfigError, DataError
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # sampling writes nothing
        sys.exit("interrupted")


if __name__ == "__main__":
    main(sys.argv[1:])
