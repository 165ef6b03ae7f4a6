"""
Train a nanoCorridor GPT on one CPU/GPU, or on many GPUs (and nodes) with DDP.

One device (the README's main job: CPU, ~5 minutes, prepares the offline corpus on the fly):
    python train.py config/train_demo.py
Any setting can be overridden on the command line, after the config file:
    python train.py config/train_demo.py --op=attention --max_iters=500 --out_dir=out/attn
DDP, one node with 8 GPUs (on CPU, --nproc_per_node=2 uses gloo):
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_owt.py
DDP, two nodes (run on each, with --node_rank=0 on the master, whose IP is 123.456.123.456):
    torchrun --nproc_per_node=8 --nnodes=2 --node_rank=0 --master_addr=123.456.123.456 --master_port=1234 \\
        train.py config/train_gpt2_owt.py

A run directory (out_dir) gets config.json (the resolved config), log.jsonl (one JSON record per log line:
losses, lr, speed and every head's (γ, δ)) and ckpt.pt (written atomically; --init_from=resume continues it).
"""

import difflib
import json
import math
import os
import subprocess
import sys
import time
from ast import literal_eval
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch

from configurator import ConfigError, configure, one_of
from model import GPT, OPS, GPTConfig
from dataloader import ShardLoader, load_meta, unigram_loss
from prepare_data import ensure_prepared

# -----------------------------------------------------------------------------
# default config values; a config file and --key=value arguments override them
# I/O
out_dir = "out/run"
eval_interval = 250
log_interval = 10
eval_iters = 20
eval_only = False  # evaluate once and exit
always_save_checkpoint = True  # else only when val loss improves
init_from = "scratch"  # 'scratch', 'resume' (from out_dir/ckpt.pt), 'gpt2'..'gpt2-xl' or a local HF GPT-2 directory
wandb_log = False
wandb_project = "nanocorridor"
wandb_run_name = "run"
# data
dataset = "pydocs"  # a directory under data/ made by prepare_data.py (pydocs is prepared on the fly)
gradient_accumulation_steps = 1  # global: divided among DDP processes
batch_size = 12  # per process and micro-step
block_size = 256
# model (see model.GPTConfig)
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.0
bias = True
op = "mix"  # attention | laplacian | mix | mix_alpha | mix_ab (model.OPS), with its controls (e.g. gamma_init)
impl = "auto"
gelu = "none"
# AdamW, warmup + cosine decay
learning_rate = 6e-4
max_iters = 5000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables clipping
decay_lr = True
warmup_iters = 100
lr_decay_iters = None  # None: max_iters
min_lr = 6e-5
op_lr_scale = 1.0  # the per-head γ, δ, α, β learn at learning_rate × this (e.g. 100 when fine-tuning)
# system
device = "auto"  # auto: cuda > mps > cpu; or e.g. 'cpu', 'cuda:1'
dtype = "auto"  # auto: bfloat16 where supported, else float16 (with a gradient scaler) on GPUs; float32 on CPU
compile = None  # None: on for CUDA, off elsewhere
seed = 1337
DEFAULTS = {k: v for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str, type(None)))}
CONTROLS = {k: v for Op in OPS.values() for k, v in Op.controls.items()}  # every op's settings, e.g. gamma_init
# -----------------------------------------------------------------------------


def parse_config(argv):
    c, _ = configure({**DEFAULTS, **CONTROLS}, argv, {"op": one_of(*OPS)})
    return vars(c)


def get_lr(it, c):
    """Linear warmup, then cosine decay from learning_rate to min_lr at lr_decay_iters."""
    if not c["decay_lr"]:
        return c["learning_rate"]
    decay_iters = c["lr_decay_iters"] or c["max_iters"]
    if it < c["warmup_iters"]:
        return c["learning_rate"] * (it + 1) / (c["warmup_iters"] + 1)
    if it > decay_iters:
        return c["min_lr"]
    ratio = (it - c["warmup_iters"]) / max(1, decay_iters - c["warmup_iters"])
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c["learning_rate"] - c["min_lr"])


def pick_device_and_dtype(c, local_rank):
    """cuda > mps > cpu, without touching CUDA on a machine that has none; bf16 where supported."""
    dev = c["device"]
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if dev == "cuda" and local_rank is not None:
        dev = f"cuda:{local_rank}"
    device_type = dev.split(":")[0]
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={dev!r} but this torch has no CUDA; use --device=cpu (or auto)")
    dt = c["dtype"]
    if dt == "auto":
        dt = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if device_type == "cuda" else "float32"
    if dt not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype={dt!r} is not allowed: use float32, bfloat16, float16 or auto")
    if device_type == "cpu" and dt == "float16":
        raise ConfigError("dtype='float16' is not supported on CPU; use float32 or bfloat16")
    return dev, device_type, dt


def atomic_save(obj, path):
    """Write to a temporary file, then rename: a crash mid-save never leaves a broken or missing file."""
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path):
    if not os.path.isfile(path):
        raise ConfigError(f"no checkpoint at {path}; train a run there first (--init_from=scratch) "
                          "or point --out_dir at an existing run")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ConfigError(f"checkpoint {path} cannot be read ({e.__class__.__name__}); it is corrupt or "
                          "not a nanoCorridor checkpoint") from None
    missing = {"model", "optimizer", "model_args", "iter_num", "best_val_loss", "loader"} - set(ckpt)
    if missing:
        raise ConfigError(f"checkpoint {path} lacks {', '.join(sorted(missing))}; it was not written by train.py")
    return ckpt


def trim_log(path, iter_num):
    """On resume, drop what the stopped run logged after its checkpoint (and its 'done'), so the log tells
    the one history that the resumed run continues."""
    keep = []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut off by a crash
            if record["iter"] <= iter_num and record["event"] != "done":
                keep.append(line)
    with open(path + ".tmp", "w") as f:
        f.writelines(keep)
    os.replace(path + ".tmp", path)


def git_commit():
    """The commit of the code that runs (with '+' if files differ from it), or None outside a git checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        run = lambda *args: subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10)
        sha = run("rev-parse", "HEAD")
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("+" if dirty else "") if sha.returncode == 0 else None


def corridor_line(gamma, delta):
    """One console line: per-layer mean γ and δ, and how many heads sit in the convex corridor γ ∈ (-1, 0)."""
    inside = ((gamma > -1) & (gamma < 0)).sum().item()
    layers = " ".join(f"L{i}:γ{g:+.2f}/δ{d:.2f}" for i, (g, d) in enumerate(zip(gamma.mean(1), delta.mean(1))))
    return f"corridor {inside}/{gamma.numel()} heads in (-1,0) | {layers}"


def train(c):
    # --- distributed set-up: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE -----------------------------------------
    ddp = int(os.environ.get("RANK", -1)) != -1
    rank, local_rank, world_size = 0, None, 1
    if ddp:
        rank, local_rank, world_size = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if c["gradient_accumulation_steps"] % world_size:
        raise ConfigError(f"gradient_accumulation_steps={c['gradient_accumulation_steps']} must be a multiple of "
                          f"the number of processes ({world_size})")
    dev, device_type, dt = pick_device_and_dtype(c, local_rank)
    if ddp:
        from torch.distributed import init_process_group
        if device_type == "cuda":
            torch.cuda.set_device(dev)
        init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    master = rank == 0
    grad_accum = c["gradient_accumulation_steps"] // world_size
    tokens_per_iter = grad_accum * world_size * c["batch_size"] * c["block_size"]
    out = c["out_dir"]
    ckpt_path = os.path.join(out, "ckpt.pt")
    if c["init_from"] != "resume" and os.path.exists(ckpt_path) and not c["eval_only"]:
        raise ConfigError(f"{out} already holds a checkpoint; continue it with --init_from=resume, or choose "
                          f"another --out_dir (rm -r {out} to start over)")
    torch.manual_seed(c["seed"])
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    ctx = nullcontext() if dt == "float32" else torch.autocast(device_type, dtype=getattr(torch, dt))

    # --- data: prepared once by the master, the others wait ----------------------------------------------------------
    if master:
        ensure_prepared(c["dataset"])
    if ddp:
        torch.distributed.barrier()
    data_dir = ensure_prepared(c["dataset"])
    meta = load_meta(data_dir)

    # --- model ----------------------------------------------------------------------------------------------------
    arch_keys = ("block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "op", "impl", "gelu")
    controls = {k: c[k] for k in CONTROLS if k in OPS[c["op"]].controls or c[k] != CONTROLS[k]}
    ckpt = None
    if c["init_from"] == "scratch":
        vocab = meta["vocab_size"]
        vocab = 50304 if vocab == 50257 else vocab  # pad GPT-2's vocabulary to a multiple of 64 for speed
        model = GPT(GPTConfig(vocab_size=vocab, controls=controls, **{k: c[k] for k in arch_keys}))
    elif c["init_from"] == "resume":
        ckpt = load_checkpoint(ckpt_path)
        model_args = ckpt["model_args"]
        for k in arch_keys:  # the checkpoint fixes the model; say so instead of silently ignoring overrides
            if k not in ("impl", "dropout") and c[k] != model_args[k] and c[k] != DEFAULTS.get(k):
                raise ConfigError(f"{k}={c[k]!r} differs from the checkpoint's {model_args[k]!r}; "
                                  "a resumed run keeps its model, drop that override")
        model = GPT(GPTConfig(**{**model_args, "impl": c["impl"], "dropout": c["dropout"]}))
        model.load_state_dict(ckpt["model"])
    else:  # GPT-2 weights, heads switched to the chosen op
        if meta["tokenizer"] != "gpt2":
            raise ConfigError(f"init_from={c['init_from']!r} needs GPT-2 tokens but dataset {c['dataset']!r} uses "
                              f"the {meta['tokenizer']!r} tokenizer; prepare it with --tokenizer=gpt2")
        model = GPT.from_pretrained(c["init_from"], op=c["op"], controls=controls, dropout=c["dropout"], impl=c["impl"])
        if c["block_size"] < model.config.block_size:
            model.crop_block_size(c["block_size"])
    if c["block_size"] > model.config.block_size:
        raise ConfigError(f"block_size={c['block_size']} exceeds the model's {model.config.block_size}")
    model_args = asdict(model.config)
    model.to(dev)
    optimizer = model.configure_optimizers(c["weight_decay"], c["learning_rate"], (c["beta1"], c["beta2"]), c["op_lr_scale"])
    iter_num, best_val_loss = 0, float("inf")

    # loaders: each rank reads its own stripe; the train loader's position is part of the checkpoint
    vocab = model.config.vocab_size
    train_loader = ShardLoader(data_dir, "train", c["batch_size"], c["block_size"], rank, world_size, vocab, c["seed"])
    eval_loaders = {split: ShardLoader(data_dir, split, c["batch_size"], c["block_size"], rank, world_size, vocab, c["seed"])
                    for split in ("train", "val")}
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
        train_loader.load_state_dict(ckpt["loader"])
        ckpt = None  # free the memory
    start_iter = iter_num

    scaler = torch.amp.GradScaler(device_type, enabled=(dt == "float16"))
    raw_model = model
    if c["compile"] if c["compile"] is not None else device_type == "cuda":
        if master:
            print("compiling the model... (takes a minute)")
        model = torch.compile(model)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)

    def batch(loader):
        x, y = loader.next_batch()
        if device_type == "cuda":
            return x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)
        return x.to(dev), y.to(dev)

    @torch.no_grad()
    def estimate_loss():
        """Mean loss over the same eval_iters batches of each split every time (averaged over ranks)."""
        raw_model.eval()
        losses = {}
        for split, loader in eval_loaders.items():
            loader.reset()
            total = torch.zeros((), device=dev)
            for _ in range(c["eval_iters"]):
                x, y = batch(loader)
                with ctx:
                    total += raw_model(x, y)[1].float()
            if ddp:
                torch.distributed.all_reduce(total)
            losses[split] = total.item() / (c["eval_iters"] * world_size)
        raw_model.train()
        return losses

    # --- logging ----------------------------------------------------------------------------------------------------
    log_file = None
    if master:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(c, f, indent=1)
        log_path = os.path.join(out, "log.jsonl")
        if c["init_from"] == "resume" and os.path.exists(log_path):
            trim_log(log_path, iter_num)
        log_file = open(log_path, "a" if c["init_from"] == "resume" else "w")
        print("config:", " ".join(f"{k}={v!r}" for k, v in c.items()), f"(saved to {out}/config.json)")
        print(f"device {dev}, dtype {dt}, {world_size} process(es), {tokens_per_iter:,} tokens per iteration, "
              f"{raw_model.get_num_params() / 1e6:.2f}M parameters, op={raw_model.config.op}")
        if sum(meta.get("tokens", {"": float("inf")}).values()) < 1e8:
            print(f"unigram baseline: val loss {unigram_loss(data_dir, vocab):.4f} (context-free token frequencies)")
    if master and c["wandb_log"]:
        import wandb
        wandb.init(project=c["wandb_project"], name=c["wandb_run_name"], config=c)

    def log(record):
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()
        if c["wandb_log"]:
            wandb.log({k: v for k, v in record.items() if k not in ("gamma", "delta")}, step=record["iter"])

    if master:
        log({"event": "start", "iter": iter_num, "commit": git_commit(), "torch": torch.__version__, "device": dev})

    def stop_not_finite(what, value):
        last = f"the last good checkpoint {ckpt_path} is untouched" if os.path.exists(ckpt_path) else "no checkpoint was written"
        raise FloatingPointError(f"{what} became {value} at iter {iter_num}; stopping ({last}). "
                                 "Try a lower learning_rate, grad_clip=1.0 or dtype=bfloat16/float32.")

    # --- the training loop --------------------------------------------------------------------------------------
    t0, iter0, running_mfu = time.time(), iter_num, -1.0
    while True:
        lr = get_lr(iter_num, c)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

        if (iter_num % c["eval_interval"] == 0 or iter_num == c["max_iters"]) and (iter_num != start_iter or iter_num == 0):
            losses = estimate_loss()
            if master:
                gamma, delta = raw_model.gamma_delta()
                print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} | "
                      f"{corridor_line(gamma, delta)}")
                log({"event": "eval", "iter": iter_num, "tokens": iter_num * tokens_per_iter,
                     "train_loss": losses["train"], "val_loss": losses["val"],
                     "gamma": gamma.tolist(), "delta": delta.tolist()})
            if not math.isfinite(losses["val"]):
                stop_not_finite("the validation loss", losses["val"])
            if master and iter_num > 0 and (losses["val"] < best_val_loss or c["always_save_checkpoint"]):
                best_val_loss = min(best_val_loss, losses["val"])
                atomic_save({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                             "model_args": model_args, "iter_num": iter_num, "best_val_loss": best_val_loss,
                             "config": c, "loader": train_loader.state_dict()}, ckpt_path)
                print(f"saved checkpoint to {ckpt_path}")
            t0, iter0 = time.time(), iter_num  # keep evaluation out of the speed measurement
        if iter_num >= c["max_iters"] or c["eval_only"]:
            break

        # dropout's randomness depends only on (seed, iteration, rank), so a resumed run draws what an
        # uninterrupted one would have drawn
        torch.manual_seed(c["seed"] + 1000003 * iter_num + rank)
        for micro_step in range(grad_accum):
            if ddp:  # sync gradients only at the last micro-step
                model.require_backward_grad_sync = micro_step == grad_accum - 1
            x, y = batch(train_loader)
            with ctx:
                _, loss = model(x, y)
                loss = loss / grad_accum
            scaler.scale(loss).backward()
        if c["grad_clip"] != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), c["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        raw_model.project()  # e.g. γ ≥ gamma_min
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1

        if iter_num % c["log_interval"] == 0 or iter_num == c["max_iters"]:
            lossf = loss.item() * grad_accum  # a sync with the device: only every log_interval
            if not math.isfinite(lossf):
                stop_not_finite("the training loss", lossf)
            dt_iter = (time.time() - t0) / (iter_num - iter0)
            t0, iter0 = time.time(), iter_num
            if master:
                mfu = raw_model.estimate_mfu(c["batch_size"] * grad_accum, dt_iter)
                if mfu is not None:
                    running_mfu = mfu if running_mfu < 0 else 0.9 * running_mfu + 0.1 * mfu
                print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt_iter * 1000:.1f} ms/iter, "
                      f"{tokens_per_iter / dt_iter:,.0f} tok/s" + (f", mfu {running_mfu * 100:.1f}%" if mfu else ""))
                log({"event": "train", "iter": iter_num, "tokens": iter_num * tokens_per_iter, "loss": lossf,
                     "lr": lr, "ms_per_iter": dt_iter * 1000, "tokens_per_s": tokens_per_iter / dt_iter,
                     "mfu": mfu})

    if master:
        if not c["eval_only"]:
            log({"event": "done", "iter": iter_num, "best_val_loss": best_val_loss})
        gamma, delta = raw_model.gamma_delta()
        torch.set_printoptions(precision=2, sci_mode=False, linewidth=140)
        print(f"final per-head γ (rows: layers, columns: heads):\n{gamma}\nfinal per-head δ:\n{delta}")
        print(corridor_line(gamma, delta))
        log_file.close()
    if ddp:
        torch.distributed.destroy_process_group()
    return raw_model


def main(argv=None):
    try:
        return train(parse_config(sys.argv[1:] if argv is None else argv))
    except (ValueError, FloatingPointError) as e:  # ConfigError, DataError and the model's ValueErrors
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted: continue from the last checkpoint with --init_from=resume (same --out_dir)")


if __name__ == "__main__":
    main()
