"""
HellaSwag, completion style: does a lower loss mean a better model of text, not only of the corpus?

Each example is a context and 4 endings, one of them right. The model reads context + " " + ending,
scores each ending by the mean loss of its tokens (length-normalised) and picks the lowest. acc_norm
is the fraction of right picks (chance: 0.25); GPT-2 124M scores 0.2955 on the 10,042 val examples
(build-nanogpt's figure).

    python prepare_data.py hellaswag   # fetch the val set once (needs internet)
    python train.py --init_from=gpt2 --dataset=openwebtext --eval_only=True --hellaswag_interval=1
"""
import json
import os
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from support.configurator import ConfigError, read_regular
from support.dataloader import DataError, get_tokenizer

HELLASWAG_BYTES = 64 * 2**20  # val.jsonl: 10,042 lines, several MB; far larger is not ours


def load_examples(out_dir="data"):
    """The val examples prepare_data.py wrote: [{"ctx": str, "endings": [4 str], "label": 0..3}]."""
    path = os.path.join(out_dir, "hellaswag", "val.jsonl")
    where = "" if out_dir == "data" else f" --out_dir={out_dir}"
    if not os.path.lexists(path):
        raise DataError(f"no HellaSwag at {path}; fetch it with `python prepare_data.py "
                        f"hellaswag{where}`, or set hellaswag_interval=0")
    again = f"delete it and prepare it again with `python prepare_data.py hellaswag{where}`"
    try:
        lines = read_regular(path, HELLASWAG_BYTES).splitlines()
    except ConfigError as e:  # a link, a FIFO, a folder, or far too large
        raise DataError(f"{e}; {again}") from None
    if not lines:
        raise DataError(f"{path} holds no examples; {again}")
    examples = []
    for number, line in enumerate(lines, 1):
        try:  # cut short: not JSON (bytes that are not UTF-8: a ValueError too)
            example = json.loads(line)
        except ValueError:
            example = {}
        # an earlier prepare_data.py wrote the hub's string "0".."3"; the test split has ""
        if example.get("label") not in (0, 1, 2, 3):
            raise DataError(f"{path} line {number} is not an example as prepare_data.py writes it "
                            "(a JSON object: a context ctx, 4 non-empty endings and a label 0..3); "
                            f"{again}")
        examples.append(example)
    return examples


def render(example, encode, block_size):
    """An example as (rows, ending_lengths, label): 4 token rows, context + ending, each at most
    block_size (the oldest context tokens are cut), and how many of each row's last tokens are the
    ending's."""
    context = encode(example["ctx"])
    # the space is the ending's, as in GPT-2's tokens
    endings = [encode(" " + e) for e in example["endings"]]
    rows = [(context + e)[-block_size:] for e in endings]
    return rows, [len(e) for e in endings], example["label"]


def render_all(meta, dataset, block_size):
    """Every val example rendered with the dataset's tokenizer (see render), once for the run."""
    if meta["tokenizer"] == "char":
        raise ConfigError(f"HellaSwag needs a byte or gpt2 dataset: {dataset!r}'s char vocabulary "
                          "lacks most of its characters; use hellaswag_interval=0")
    encode = get_tokenizer(meta)[0]
    return [render(e, encode, block_size) for e in load_examples()]


def batch_tensors(rendered):
    """Rendered examples -> (tokens, mask), both (4·n, L): rows padded on the right with 0 to the
    longest; mask 1 at the positions whose token is an ending's."""
    rows = [torch.tensor(row) for rows, _, _ in rendered for row in rows]
    lengths = [n for _, ending_lengths, _ in rendered for n in ending_lengths]
    # 1 at the row's last n positions (or all)
    mask = [torch.arange(len(row)) >= len(row) - n for row, n in zip(rows, lengths)]
    return pad_sequence(rows, batch_first=True), pad_sequence(mask, batch_first=True).float()


@torch.no_grad()
def ending_losses(model, tokens, mask):
    """Each row's mean loss over its ending tokens, (rows,) (a row's first token is never predicted)."""
    # targets, so that the model returns every position's logits
    logits = model(tokens, tokens)[0].float()  # (rows, L, vocab)
    losses = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(),
                             reduction="none")
    mask = mask[:, 1:]
    return (losses.view(mask.shape) * mask).sum(1) / mask.sum(1)  # (rows,)


def score(model, rendered, batch_size, device, rank=0, world_size=1, ctx=nullcontext()):
    """acc_norm of `model` on the rendered examples, the counts of each rank's share (rank,
    rank + world_size, ...) summed; batch_size examples (4·batch_size rows) at a time, in eval mode
    (then back to its mode)."""
    mine, correct, training = rendered[rank::world_size], 0, model.training
    model.eval()
    for i in range(0, len(mine), batch_size):
        batch = mine[i:i + batch_size]
        tokens, mask = batch_tensors(batch)
        with ctx:
            losses = ending_losses(model, tokens.to(device), mask.to(device))
        labels = torch.tensor([label for _, _, label in batch])
        correct += int((losses.view(-1, 4).argmin(1).cpu() == labels).sum())  # (examples, 4) -> picks
    model.train(training)
    counts = torch.tensor([correct, len(mine)], device=device)  # int64: exact, every backend sums it
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(counts)
    return counts[0].item() / counts[1].item()
