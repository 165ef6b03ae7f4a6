"""
train.py's settings beyond their defaults: each value's rule, the settings that only make sense together, what
a resumed run keeps from its checkpoint, and the model settings a checkpoint or GPT-2 fixes. The model's own
settings (train.py's model_args) are checked by GPTConfig.
"""
import importlib.util
import os

from operators import OPS, all_controls
from support.configurator import (SEED, ConfigError, at_least, check, in_range, nonempty, one_of,
                                  optional, requires)
from support.hardware import ddp_env, device_rule
from support.pretrained import PRETRAINED
from support.rundir import load_checkpoint

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
             seed=SEED, dtype=one_of("auto", "float32", "bfloat16", "float16"))


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


def resume_from_checkpoint(cfg, given, defaults):
    """(ckpt, kept, changed) when this run continues out_dir's checkpoint (init_from=resume) or evaluates it
    (eval_only, no other model): the checkpoint, the settings it keeps (each not given, checked again against
    defaults: train.py's) and what the settings given change; else (None, {}, [])."""
    if cfg.init_from != "resume" and not (cfg.eval_only and cfg.init_from == "scratch"):
        return None, {}, []
    ckpt = load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))
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


def op_controls(cfg, given):
    """The controls of cfg's op as cfg sets them, and any other op's control given (GPTConfig refuses it)."""
    chosen = OPS[cfg.op].controls if cfg.op in OPS else {}  # an unknown op: GPTConfig names it
    return {k: getattr(cfg, k) for k in all_controls() if k in chosen or k in given}


def as_settings(model_args):
    """A model's settings as train.py names them: model_args (or a GPTConfig as a dict) without the data's
    vocab_size, and the op's controls each a setting of its own."""
    return {**{k: v for k, v in model_args.items() if k not in ("vocab_size", "controls")},
            **model_args["controls"]}


def refuse_another_model(given, model_args, built, resumed):
    """A checkpoint (resumed) or GPT-2 fixes the model: a model setting given (in model_args) that differs
    from the model built from it (built: its GPTConfig as a dict) is refused, never silently ignored."""
    source = "checkpoint" if resumed else "pretrained model"
    asked, fixed = as_settings(model_args), as_settings(built)
    for k in sorted(given & asked.keys() - set(RESUME_MAY_CHANGE)):
        if k not in fixed:
            raise ConfigError(f"{k} is not a control of the {source}'s op={built['op']!r}; drop it")
        if asked[k] != fixed[k]:
            raise ConfigError(f"{k}={asked[k]!r} differs from the {source}'s {fixed[k]!r}; its model is "
                              "fixed, drop that setting")
