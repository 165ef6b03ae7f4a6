"""
train.py's settings beyond their defaults: each value's rule, the settings that only make sense together, what
a resumed run keeps from its checkpoint, and the model settings a checkpoint or GPT-2 fixes. The model's own
settings (train.py's model_args) are checked by GPTConfig.
"""
import importlib.util
import os
from types import SimpleNamespace

from operators import OPS, all_controls
from support.configurator import (SEED, ConfigError, at_least, check, in_range, nonempty, one_of,
                                  optional, requires)
from support.hardware import ddp_env, device_rule
from support.pretrained import PRETRAINED, gpt2_sizes
from support.rundir import claim_run_dir, load_checkpoint

RESUME_MAY_CHANGE = ("dropout", "impl")  # model settings that are not part of the weights


init_from_rule = requires(lambda value: value in ("scratch", "resume", *PRETRAINED) or os.path.isdir(value),
                          f"use scratch, resume, {', '.join(PRETRAINED)} or a local directory saved with "
                          "transformers' save_pretrained")
RULES = dict(eval_interval=at_least(1), log_interval=at_least(1), eval_iters=at_least(1),
             val_tokens=at_least(1), hellaswag_interval=at_least(0), save_every=at_least(0), out_dir=nonempty,
             init_from=init_from_rule, dataset=nonempty, gradient_accumulation_steps=at_least(1),
             batch_size=at_least(1), learning_rate=at_least(0.0), max_iters=at_least(1),
             weight_decay=at_least(0.0), beta1=in_range(0.0, 1.0), beta2=in_range(0.0, 1.0),
             grad_clip=at_least(0.0), warmup_iters=at_least(0), lr_decay_iters=optional(int, at_least(1)),
             min_lr=at_least(0.0), op_lr_scale=at_least(0.0), device=device_rule, compile=optional(bool),
             seed=SEED, dtype=one_of("auto", "float32", "bfloat16", "float16"),
             op=lambda key, value: one_of(*OPS)(key, value))  # the ops registered by now


def check_schedule(cfg):
    """Settings that only make sense together (with the number of DDP processes too): checked before any
    device or file is touched."""
    world_size = ddp_env()[2]
    if cfg.gradient_accumulation_steps % world_size and not cfg.eval_only:  # evaluation accumulates nothing
        raise ConfigError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} must be a multiple "
                          f"of the number of processes ({world_size})")
    for k in ("hellaswag_interval", "save_every"):
        if getattr(cfg, k) % cfg.eval_interval and not cfg.eval_only:
            raise ConfigError(f"{k}={getattr(cfg, k)} must be a multiple of "
                              f"eval_interval={cfg.eval_interval}: it happens at evaluations")
    if cfg.wandb_log and importlib.util.find_spec("wandb") is None:
        raise ConfigError("wandb_log=True needs the wandb package: pip install wandb (or --wandb_log=False)")


def work_out(args, given, defaults):
    """(cfg, ckpt, changed): the settings this run runs with, worked out once, before any device or data is
    touched. args: train.py's settings as given (given: the keys set), defaults: train.py's. A resumed run
    keeps its checkpoint's settings but those given (changed: what they change); a checkpoint or GPT-2 fixes
    the model, so a model setting given that differs from it is refused, never silently ignored."""
    ckpt, kept, changed = resume_from_checkpoint(args, given, defaults)
    fixed, source = {}, "checkpoint"
    if ckpt is not None:
        saved = ckpt["model_args"]  # as cfg holds them: each of its op's controls a setting of its own
        fixed = {k: v for k, v in saved.items() if k not in ("vocab_size", "controls", *RESUME_MAY_CHANGE)}
        if isinstance(saved.get("controls"), dict):  # else the file is damaged: GPT.from_checkpoint says so
            fixed.update(saved["controls"])
    elif args.init_from != "scratch":
        fixed, source = {**gpt2_sizes(args.init_from), "bias": True, "gelu": "tanh"}, "pretrained model"
        fixed["block_size"] = min(args.block_size, fixed["block_size"])  # a shorter context: its wpe cut
    for k in sorted(given & {*fixed, *all_controls()}):
        if ckpt is None and k not in {*fixed, *OPS[args.op].controls}:
            raise ConfigError(f"{k} is not a control of op={args.op!r} (its controls: "
                              f"{', '.join(OPS[args.op].controls) or 'none'}); drop it or change op")
        if k not in fixed and ckpt is not None:
            raise ConfigError(f"{k} is not a control of the checkpoint's op={fixed.get('op')!r}; drop it")
        if k in fixed and getattr(args, k) != fixed[k]:
            raise ConfigError(f"{k}={getattr(args, k)!r} differs from the {source}'s {fixed[k]!r}; its model "
                              "is fixed, drop that setting")
    cfg = SimpleNamespace(**{**vars(args), **kept, **fixed})
    check_schedule(cfg)
    return cfg, ckpt, changed


def resume_from_checkpoint(cfg, given, defaults):
    """(ckpt, kept, changed) when this run continues out_dir's checkpoint (init_from=resume) or evaluates it
    (eval_only, no other model): the checkpoint, the settings it keeps (each not given, checked again against
    defaults) and what the settings given change; else (None, {}, []). The process that will write the run
    locks out_dir before it reads the checkpoint, so that a second resume of one run cannot train as well."""
    if cfg.init_from != "resume" and not (cfg.eval_only and cfg.init_from == "scratch"):
        return None, {}, []
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    if os.path.lexists(path) and not cfg.eval_only and ddp_env()[0] == 0:
        claim_run_dir(cfg.out_dir, resuming=True)
    ckpt = load_checkpoint(path)
    saved = {k: v for k, v in ckpt["config"].items() if k in vars(cfg) and k not in ("out_dir", "eval_only")}
    kept, changed = {}, []
    if saved.get("impl") == "auto" and "impl" not in given:  # impl='auto' is gone: SDPA is the default
        saved["impl"] = "sdpa"
        changed.append("impl='sdpa' (was 'auto', which no longer exists)")
    rules = {**RULES, "init_from": nonempty}  # the local folder it was fine-tuned from may have moved since
    for k, v in saved.items():
        if k == "init_from" or k not in given:
            kept[k] = check(k, v, {**defaults, **all_controls()}, rules)
        elif getattr(cfg, k) != v:
            changed.append(f"{k}={getattr(cfg, k)!r} (was {v!r})")
    if not cfg.eval_only and ckpt["iter_num"] >= kept.get("max_iters", cfg.max_iters):
        raise ConfigError(f"the checkpoint is at iter {ckpt['iter_num']} already; "
                          "raise --max_iters to train on")
    return ckpt, kept, changed


def check_gpt2_tokens(init_from, dataset, meta):
    """GPT-2's weights read GPT-2's tokens."""
    if meta["tokenizer"] != "gpt2":
        raise ConfigError(f"init_from={init_from!r} needs GPT-2 tokens but dataset {dataset!r} uses the "
                          f"{meta['tokenizer']!r} tokenizer; prepare it with --tokenizer=gpt2")


def check_same_data(ckpt, meta, dataset):
    """A resumed run reads data of the tokenizer and vocabulary it was trained with."""
    if any(ckpt["meta"].get(k) != meta.get(k) for k in ("tokenizer", "vocab_size", "chars")):
        trained_on = ckpt["config"].get("dataset")
        fix = f"use --dataset={trained_on}"
        if trained_on in (None, dataset):  # the same name, prepared again since (with another vocabulary)
            fix = "prepare it again as it was when the run began, or start a new run in another --out_dir"
        raise ConfigError(f"dataset {dataset!r} is not the one the checkpoint was trained on (another "
                          f"tokenizer or vocabulary); {fix}")

