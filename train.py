"""
Train a nanoCorridor GPT on one CPU/GPU, or on many GPUs (and nodes) with DDP.

One device (the README's main job: CPU, ~3 minutes, prepares the offline corpus on the fly):
    python train.py config/train_demo.py
Any setting can be overridden on the command line, after the config file (--help lists them all):
    python train.py config/train_demo.py --op=attention --max_iters=500 --out_dir=out/attn
DDP, one node with 8 GPUs (on CPU, --nproc_per_node=2 uses gloo; several nodes: see the README):
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_owt.py

A run directory (out_dir) gets config.json, log.jsonl and ckpt.pt, which --init_from=resume continues (see
rundir.py); with save_every, also ckpt_NNNNNN.pt copies for later analysis.
"""

import importlib.util
import math
import os
import sys
import time
from dataclasses import fields

import torch

from support import hellaswag
from support.configurator import SEED, ConfigError, at_least, configure, in_range, nonempty, one_of, optional
from support.dataloader import DataError, ShardLoader, ValSet, load_meta, unigram_loss
from support.hardware import ddp_env, device_rule, end_process, exit_status, start_process
from model import GPT, PRETRAINED, GPTConfig
from operators import OPS, all_controls
from prepare_data import ensure_prepared, token_bytes
from support.rundir import (Run, check_same_data, claim_run_dir, load_optimizer_state, model_from_checkpoint,
                    resume_from_checkpoint, save_checkpoints, start_log, unlock_run_dir, why)

# -----------------------------------------------------------------------------
# default settings; config files and --key=value arguments override them
# I/O
out_dir = "out/run"  # the run directory: config.json, log.jsonl, ckpt.pt
eval_interval = 250  # evaluate (and checkpoint) every this many iterations
log_interval = 10  # print and log the training loss every this many iterations
eval_iters = 20  # batches of the train split's loss estimate (the val loss reads val_tokens, below)
val_tokens = 10_485_760  # the val loss: the first val_tokens tokens of the val split (modded-nanogpt's count)
hellaswag_interval = 0  # score HellaSwag every this many iters (a multiple of eval_interval; 0 = never)
eval_only = False  # evaluate the run's checkpoint (or init_from's model) once, print losses, write nothing
always_save_checkpoint = True  # checkpoint at every evaluation; False: only when val loss improves
save_every = 0  # also keep ckpt_NNNNNN.pt every this many iters (a multiple of eval_interval; 0 = never)
init_from = "scratch"  # 'scratch', 'resume' (out_dir/ckpt.pt), 'gpt2'..'gpt2-xl' or a local HF GPT-2 folder
wandb_log = False  # also log to Weights & Biases (needs the wandb package)
wandb_project = "nanocorridor"  # its project
wandb_run_name = "run"  # its run name
# data
dataset = "pydocs"  # a directory under data/ made by prepare_data.py (pydocs is prepared on the fly)
gradient_accumulation_steps = 1  # micro-steps per optimizer step, global: divided among DDP processes
batch_size = 12  # sequences per process and micro-step
# the model: every field of model.GPTConfig (block_size, n_layer, op, ...) and every op's controls
# (gamma_init, learn_gamma, ... in operators.py) is a setting too, with the default it has there
# AdamW, warmup + cosine decay
learning_rate = 6e-4  # peak learning rate, reached after warmup
max_iters = 5000  # optimizer steps in all
weight_decay = 0.1  # AdamW's, on matrices only
beta1 = 0.9  # AdamW's β1
beta2 = 0.95  # AdamW's β2
grad_clip = 1.0  # clip the gradient norm to this; 0 disables clipping
decay_lr = True  # False: learning_rate throughout, no warmup or decay
warmup_iters = 100  # linear warmup over this many steps
lr_decay_iters = None  # cosine decay to min_lr over this many steps; None: max_iters
min_lr = 6e-5  # the learning rate at the end of the decay
op_lr_scale = 1.0  # the operators' per-head scalars (γ, δ, α, β) learn at learning_rate × this
# system
device = "auto"  # auto: cuda > mps > cpu; or e.g. 'cpu', 'cuda:1'
dtype = "auto"  # auto: bfloat16 where supported, else float16 (with a grad scaler) on GPUs; float32 on CPU
compile = None  # torch.compile the model; None: on for CUDA, off elsewhere
seed = 1337  # seeds the initial weights, the data order and dropout
TRAIN_DEFAULTS = {k: v for k, v in globals().items()
                  if not k.startswith("_") and isinstance(v, (int, float, str, type(None)))}
MODEL_KEYS = [f.name for f in fields(GPTConfig) if f.name not in ("vocab_size", "controls")]
RESUME_MAY_CHANGE = ("dropout", "impl")  # model settings that are not part of the weights


def init_from_rule(key, value):
    if value not in ("scratch", "resume", *PRETRAINED) and not os.path.isdir(value):
        raise ConfigError(f"{key}={value!r} is not allowed: use scratch, resume, {', '.join(PRETRAINED)} "
                          "or a local directory saved with transformers' save_pretrained")
    return value


RULES = dict(eval_interval=at_least(1), log_interval=at_least(1), eval_iters=at_least(1),
             val_tokens=at_least(1), hellaswag_interval=at_least(0), save_every=at_least(0), out_dir=nonempty,
             init_from=init_from_rule, dataset=nonempty, gradient_accumulation_steps=at_least(1),
             batch_size=at_least(1), block_size=at_least(1), op=lambda key, value: one_of(*OPS)(key, value),
             learning_rate=at_least(0.0), max_iters=at_least(1), weight_decay=at_least(0.0),
             beta1=in_range(0.0, 1.0), beta2=in_range(0.0, 1.0), grad_clip=at_least(0.0),
             warmup_iters=at_least(0), lr_decay_iters=optional(int, at_least(1)), min_lr=at_least(0.0),
             op_lr_scale=at_least(0.0), device=device_rule, compile=optional(bool), seed=SEED,
             dtype=one_of("auto", "float32", "bfloat16", "float16"))


def defaults():
    """train.py's own settings, GPTConfig's fields and every op's controls (read now: ops may come later)."""
    model = {f.name: f.default for f in fields(GPTConfig) if f.name in MODEL_KEYS}
    return {**TRAIN_DEFAULTS, **model, **all_controls()}


def parse_config(argv):
    """(cfg, given): the settings, and the keys that a config file or the command line set."""
    help_from = [("", sys.modules[__name__]), ("", GPTConfig)] + [(f"(op={n}) ", Op) for n, Op in OPS.items()]
    return configure(defaults(), argv, RULES, help_from=help_from)


def get_lr(it, cfg):
    """Linear warmup, then cosine decay from learning_rate to min_lr at lr_decay_iters."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it > decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def corridor_summary(gamma, delta):
    """One console line: how many heads sit in the convex corridor γ ∈ (-1, 0); per-layer mean γ, δ."""
    inside = ((gamma > -1) & (gamma < 0)).sum().item()
    means = enumerate(zip(gamma.mean(1), delta.mean(1)))
    layers = " ".join(f"L{i}:γ{g:+.2f}/δ{d:.2f}" for i, (g, d) in means)
    return f"corridor {inside}/{gamma.numel()} heads in (-1,0) | {layers}"


def build_model(cfg, given, meta, ckpt):
    """The model that init_from asks for. A checkpoint or GPT-2 fixes the architecture: a model setting given
    explicitly that differs from it is refused, never silently ignored; cfg is then set to what runs."""
    controls = {k: getattr(cfg, k) for k in all_controls() if k in OPS[cfg.op].controls or k in given}
    if ckpt is None and cfg.init_from != "scratch":  # GPT-2 weights, heads switched to the chosen op
        if meta["tokenizer"] != "gpt2":
            raise ConfigError(f"init_from={cfg.init_from!r} needs GPT-2 tokens but dataset {cfg.dataset!r} "
                              f"uses the {meta['tokenizer']!r} tokenizer; prepare it with --tokenizer=gpt2")
        model = GPT.from_pretrained(cfg.init_from, op=cfg.op, controls=controls, dropout=cfg.dropout,
                                    impl=cfg.impl)
        if cfg.block_size < model.config.block_size:
            model.crop_block_size(cfg.block_size)
    elif ckpt is not None:
        model = model_from_checkpoint(ckpt, **{k: getattr(cfg, k) for k in RESUME_MAY_CHANGE})
    else:  # from scratch, with GPT-2's vocabulary padded to a multiple of 64
        vocab = 50304 if meta["vocab_size"] == 50257 else meta["vocab_size"]
        try:
            settings = {k: getattr(cfg, k) for k in MODEL_KEYS}
            model = GPT(GPTConfig(vocab_size=vocab, controls=controls, **settings))
        except (TypeError, RuntimeError, MemoryError) as e:  # a model too large for this machine
            raise ConfigError(f"the model cannot be built ({why(e)})") from None
    built = {**{k: getattr(model.config, k) for k in MODEL_KEYS}, **model.config.controls}
    source = "checkpoint" if ckpt is not None else "pretrained model"
    for k in sorted(given & (set(MODEL_KEYS) | set(all_controls())) - set(RESUME_MAY_CHANGE)):
        if k not in built:
            raise ConfigError(f"{k} is not a control of the {source}'s op={model.config.op!r}; drop it")
        if getattr(cfg, k) != built[k]:
            raise ConfigError(f"{k}={getattr(cfg, k)!r} differs from the {source}'s {built[k]!r}; its model "
                              "is fixed, drop that setting")
    for k, v in built.items():
        setattr(cfg, k, v)
    return model


def check_schedule(cfg, world_size):
    """Settings that only make sense together: checked before any device or file is touched."""
    if cfg.gradient_accumulation_steps % world_size:
        raise ConfigError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} must be a multiple "
                          f"of the number of processes ({world_size})")
    for k in ("hellaswag_interval", "save_every"):
        if getattr(cfg, k) % cfg.eval_interval and not cfg.eval_only:
            raise ConfigError(f"{k}={getattr(cfg, k)} must be a multiple of "
                              f"eval_interval={cfg.eval_interval}: it happens at evaluations")
    if cfg.wandb_log and importlib.util.find_spec("wandb") is None:
        raise ConfigError("wandb_log=True needs the wandb package: pip install wandb (or --wandb_log=False)")


def prepare(cfg, master, ddp):
    """The dataset's directory and meta: prepared once by the master while the others wait."""
    if master:
        ensure_prepared(cfg.dataset)
    if ddp:
        torch.distributed.barrier()
    data_dir = ensure_prepared(cfg.dataset)
    return data_dir, load_meta(data_dir)


def stop_if_not_finite(run, what, value):
    if math.isfinite(value):
        return
    last = "no checkpoint was written"
    if os.path.exists(run.ckpt_path):
        last = f"the last good checkpoint {run.ckpt_path} is untouched"
    raise FloatingPointError(f"{what} became {value} at iter {run.iter_num}; stopping ({last}). "
                             "Try a lower learning_rate, grad_clip=1.0 or dtype=bfloat16/float32.")


@torch.no_grad()
def estimate_loss(run, model, val_set, eval_loader):
    """The val loss: the mean over the fixed val set (dataloader.ValSet: the same tokens on every machine, for
    every seed, batch size and number of processes), every rank's share summed. The train loss: the mean of
    the same eval_iters sampled batches every time (the split is too large to read whole) over the ranks."""
    cfg, dev = run.cfg, run.dev
    model.eval()
    val_sum = 0.0
    for x, y in val_set.batches(cfg.batch_size):
        with run.ctx:
            val_sum += model(x.to(dev), y.to(dev))[1].item() * y.numel()  # the loss: the batch's mean
    train_sum = torch.zeros((), device=dev)
    eval_loader.reset()  # the same batches at every evaluation
    for _ in range(cfg.eval_iters):
        with run.ctx:
            train_sum += model(*eval_loader.next_batch(dev))[1].float()
    model.train()
    sums = torch.tensor([val_sum, train_sum.item()], dtype=torch.float64, device=dev if run.ddp else "cpu")
    if run.ddp:
        torch.distributed.all_reduce(sums)
    val_total, train_total = sums.tolist()
    return {"val": val_total / val_set.count, "train": train_total / (cfg.eval_iters * run.world_size)}


def evaluate(run, model, val_set, eval_loader, val_bytes, rendered):
    """Losses, bits per byte, HellaSwag when due, every head's (γ, δ), printed and logged: the val loss."""
    cfg = run.cfg
    losses = estimate_loss(run, model, val_set, eval_loader)
    record = {"event": "eval", "iter": run.iter_num, "tokens": run.tokens, "train_loss": losses["train"],
              "val_loss": losses["val"], "val_tokens": val_set.count}
    line = f"step {run.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
    if val_bytes:  # nats per token -> bits per byte
        record["val_bpb"] = losses["val"] / math.log(2) * val_set.count / val_bytes
        line += f" ({record['val_bpb']:.4f} bits/byte)"
    hellaswag_due = cfg.eval_only or run.iter_num == cfg.max_iters
    if rendered is not None and (hellaswag_due or run.iter_num % cfg.hellaswag_interval == 0):
        record["hellaswag"] = hellaswag.score(model, rendered, cfg.batch_size, run.dev, run.rank,
                                              run.world_size, run.ctx)
        line += f", hellaswag acc_norm {record['hellaswag']:.4f} ({len(rendered):,} examples)"
    gamma, delta = model.gamma_delta()
    run.say(f"{line} | {corridor_summary(gamma, delta)}")
    run.log({**record, "gamma": gamma.tolist(), "delta": delta.tolist()})
    stop_if_not_finite(run, "the validation loss", losses["val"])
    return losses["val"]


def log_train(run, loss, grad_norm, lr, dt_iter, mfu, tokens_per_iter):
    """The console line and log record of a training step; loss and grad_norm are read here."""
    lossf = loss.item()  # a sync with the device: only every log_interval
    stop_if_not_finite(run, "the training loss", lossf)
    grad_normf = grad_norm.item()  # this iteration's, before clipping
    line = (f"iter {run.iter_num}: loss {lossf:.4f}, grad norm {grad_normf:.3f}, lr {lr:.2e}, "
            f"{dt_iter * 1000:.1f} ms/iter, {tokens_per_iter / dt_iter:,.0f} tok/s")
    if mfu:
        line += f", mfu {mfu * 100:.1f}%"
    run.say(line)
    run.log({"event": "train", "iter": run.iter_num, "tokens": run.tokens, "loss": lossf,
             "grad_norm": grad_normf, "lr": lr, "ms_per_iter": dt_iter * 1000,
             "tokens_per_s": tokens_per_iter / dt_iter, "mfu": mfu})


def train(cfg, given=frozenset()):
    # --- set-up: the checkpoint to continue, processes, device, data, model ---------------------------------
    rank, local_rank, world_size = ddp_env()
    ddp = local_rank is not None  # started by torchrun
    ckpt, changed = resume_from_checkpoint(cfg, given, defaults(), RULES)
    check_schedule(cfg, world_size)
    dev, device_type, dt, ctx = start_process(cfg, local_rank)
    run = Run(cfg, rank, world_size, ddp, dev, ctx)
    grad_accum = cfg.gradient_accumulation_steps // world_size
    tokens_per_iter = grad_accum * world_size * cfg.batch_size * cfg.block_size
    data_dir, meta = prepare(cfg, run.master, ddp)
    model = build_model(cfg, given, meta, ckpt).to(dev)
    check_same_data(ckpt, meta, cfg.dataset)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2),
                                           cfg.op_lr_scale)
    loader_args = (cfg.batch_size, cfg.block_size, rank, world_size, model.config.vocab_size, cfg.seed)
    train_loader = ShardLoader(data_dir, "train", *loader_args)
    eval_loader = ShardLoader(data_dir, "train", *loader_args)
    val_set = ValSet(data_dir, cfg.block_size, cfg.val_tokens, rank, world_size, model.config.vocab_size)
    try:  # bits per byte: the val loss in bits over the UTF-8 bytes of the text val predicts, counted once
        val_bytes = int(token_bytes(meta)[val_set.tokens[1:]].sum())
    except DataError as e:  # GPT-2's vocabulary is not downloaded, and this machine is offline
        val_bytes = None
        run.say(f"note: no bits per byte in this run: {e}")
    rendered = None  # HellaSwag's examples as token rows
    if cfg.hellaswag_interval:
        rendered = hellaswag.render_all(meta, cfg.dataset, cfg.block_size)
    resuming = ckpt is not None
    if resuming:
        load_optimizer_state(optimizer, ckpt)
        run.iter_num, run.best_val_loss, run.tokens = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["tokens"]
        train_loader.load_state_dict(ckpt["loader"])
        ckpt = None  # free the memory
    if run.writes:
        claim_run_dir(cfg.out_dir, resuming)
    start_iter, raw_model = run.iter_num, model
    scaler = torch.amp.GradScaler(device_type, enabled=(dt == "float16"))
    if cfg.compile or (cfg.compile is None and device_type == "cuda"):  # None: on for CUDA, off elsewhere
        run.say("compiling the model... (takes a minute)")
        model = torch.compile(model)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)

    # --- logging --------------------------------------------------------------------------------------------
    if run.writes:
        start_log(run, dt, resuming)
    run.say("config:", " ".join(f"{k}={v!r}" for k, v in vars(cfg).items()))
    if changed:  # all of them run: the optimizer's settings too (rundir.load_optimizer_state)
        run.say("resumed with settings changed from the checkpoint's:", ", ".join(changed))
    run.say(f"device {dev}, dtype {dt}, {world_size} process(es), {tokens_per_iter:,} tokens per iteration, "
            f"{raw_model.get_num_params() / 1e6:.2f}M parameters, op={cfg.op}")
    if run.master and sum(meta.get("tokens", {"": float("inf")}).values()) < 1e8:  # quick enough to count
        run.say(f"unigram baseline: val loss {unigram_loss(data_dir, meta['vocab_size']):.4f} "
                "(context-free token frequencies)")

    # --- the training loop ----------------------------------------------------------------------------------
    if not cfg.eval_only:  # untimed warm-up: torch.compile compiles, impl='auto' checks and times the kernel
        zeros = torch.zeros(cfg.batch_size, cfg.block_size, dtype=torch.long, device=dev)
        with ctx:  # one forward and backward; its gradients are dropped, so no weight changes
            model(zeros, zeros)[1].backward()
        optimizer.zero_grad(set_to_none=True)
    t0, iter0 = time.time(), run.iter_num
    while True:
        due = run.iter_num % cfg.eval_interval == 0 or run.iter_num == cfg.max_iters
        not_saved_yet = run.iter_num > start_iter or run.iter_num == 0  # a resumed run was evaluated before
        if cfg.eval_only or (due and not_saved_yet):
            val_loss = evaluate(run, raw_model, val_set, eval_loader, val_bytes, rendered)
            if run.writes and run.iter_num > 0:
                save_checkpoints(run, raw_model, optimizer, train_loader, meta, val_loss)
            t0, iter0 = time.time(), run.iter_num  # keep evaluation out of the speed measurement
        if run.iter_num >= cfg.max_iters or cfg.eval_only:
            break
        lr = get_lr(run.iter_num, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        # dropout depends only on (seed, iteration, rank): a resumed run draws what an uninterrupted one would
        torch.manual_seed(cfg.seed + 1000003 * run.iter_num + rank)
        loss_sum = 0.0
        for micro_step in range(grad_accum):
            if ddp:  # sync gradients only at the last micro-step
                model.require_backward_grad_sync = micro_step == grad_accum - 1
            with ctx:
                loss = model(*train_loader.next_batch(dev))[1] / grad_accum  # the mean over all micro-steps
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        scaler.unscale_(optimizer)  # the true gradients (fp16's scaler multiplies them), to measure and clip
        # the norm before clipping, logged: its spikes warn of instability (max_norm=inf: measure, never clip)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or math.inf)
        scaler.step(optimizer)
        scaler.update()
        raw_model.project()  # e.g. γ ≥ gamma_min
        optimizer.zero_grad(set_to_none=True)
        run.iter_num, run.tokens = run.iter_num + 1, run.tokens + tokens_per_iter
        if run.iter_num % cfg.log_interval == 0 or run.iter_num == cfg.max_iters:
            dt_iter = (time.time() - t0) / (run.iter_num - iter0)
            mfu = raw_model.estimate_mfu(cfg.batch_size * grad_accum, dt_iter)
            log_train(run, loss_sum, grad_norm, lr, dt_iter, mfu, tokens_per_iter)
            t0, iter0 = time.time(), run.iter_num

    # --- the end --------------------------------------------------------------------------------------------
    gamma, delta = raw_model.gamma_delta()
    torch.set_printoptions(precision=2, sci_mode=False, linewidth=140)
    run.say(f"final per-head γ (rows: layers, columns: heads):\n{gamma}\nfinal per-head δ:\n{delta}")
    run.say(corridor_summary(gamma, delta))
    if run.writes:
        run.log({"event": "done", "iter": run.iter_num, "best_val_loss": run.best_val_loss})
        unlock_run_dir(cfg.out_dir)
    end_process(ddp)
    return raw_model


def main(argv=None):
    try:
        return train(*parse_config(sys.argv[1:] if argv is None else argv))
    except (ValueError, FloatingPointError, OSError) as e:  # ConfigError, DataError, the model's checks, I/O
        sys.exit(exit_status(e))
    except KeyboardInterrupt:
        sys.exit("interrupted: continue from the last checkpoint with --init_from=resume (same --out_dir)")


if __name__ == "__main__":
    main()
