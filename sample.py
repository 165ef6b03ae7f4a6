"""
Generate text from a trained nanoCorridor run, decoding with the tokenizer its data was prepared with.

    python sample.py --out_dir=out/demo --start="The " --num_samples=3 --max_new_tokens=300
    python sample.py --out_dir=out/demo --start=FILE:prompt.txt --temperature=0.8 --top_k=50 --seed=1
"""
import os
import sys

import torch

from model import GPT, GPTConfig
from dataloader import load_meta
from prepare_data import get_tokenizer
from configurator import ConfigError, configure, optional
from train import load_checkpoint

DEFAULTS = dict(
    out_dir="out/demo",  # the run directory holding ckpt.pt
    data_root="data",  # where prepare_data.py wrote the run's dataset
    start="\n",  # the prompt, or FILE:path to read it from a file
    num_samples=3,
    max_new_tokens=300,
    temperature=0.8,  # < 1: more conservative, > 1: more random
    top_k=200,  # keep only the top_k most likely tokens (None: all)
    seed=1337,
    device="cpu",
)


def sample(c):
    ckpt = load_checkpoint(os.path.join(c["out_dir"], "ckpt.pt"))
    model = GPT(GPTConfig(**{**ckpt["model_args"], "impl": "auto"}))
    model.load_state_dict(ckpt["model"])
    model.eval().to(c["device"])
    encode, decode = get_tokenizer(load_meta(os.path.join(c["data_root"], ckpt["config"]["dataset"])))
    start = c["start"]
    if start.startswith("FILE:"):
        with open(start[5:], encoding="utf-8") as f:
            start = f.read()
    idx = torch.tensor([encode(start)], dtype=torch.long, device=c["device"])
    if idx.numel() == 0:
        raise ConfigError("the prompt encodes to no tokens; give a non-empty --start")
    torch.manual_seed(c["seed"])
    texts = []
    for _ in range(c["num_samples"]):
        out = model.generate(idx, c["max_new_tokens"], temperature=c["temperature"], top_k=c["top_k"])
        texts.append(decode(out[0].tolist()))
        print(texts[-1] + "\n---------------")
    return texts


if __name__ == "__main__":
    try:
        sample(vars(configure(DEFAULTS, sys.argv[1:], {"top_k": optional(int)}, files=False)[0]))
    except ValueError as e:
        sys.exit(f"error: {e}")
