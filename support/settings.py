"""
train.py's settings beyond their defaults: each value's rule, the settings that only make sense together, what
a resumed run keeps from its checkpoint, and the model settings a checkpoint or a pretrained model fixes.
The model's settings are GPTConfig's fields (train.py passes in their defaults), which GPTConfig checks.
"""
import importlib.util
import os
from dataclasses import fields

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


def defaults(train_defaults, model_defaults):
    """Every setting and its default: train.py's own, the model's (GPTConfig's fields) and every op's controls
    (read now: an op may be registered after train.py is imported)."""
    return {**train_defaults, **model_defaults, **all_controls()}


def continues_checkpoint(cfg):  # out_dir's checkpoint is resumed, or evaluated (eval_only, no other model)
    return cfg.init_from == "resume" or (cfg.eval_only and cfg.init_from == "scratch")


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


def resume_from_checkpoint(cfg, given, train_defaults, model_defaults):
    """(ckpt, changed): the checkpoint in out_dir when this run continues (init_from=resume) or evaluates it
    (eval_only, no other model), else None; it keeps its settings (checked again) but those given: changed."""
    if not continues_checkpoint(cfg):
        return None, []
    everything = defaults(train_defaults, model_defaults)
    ckpt = load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))
    rules = {**RULES, "init_from": nonempty}  # the local folder it was fine-tuned from may have moved since
    changed = []
    if ckpt["config"].get("impl") == "auto" and "impl" not in given:  # impl='auto' is gone: SDPA is default
        ckpt["config"]["impl"] = cfg.impl = "sdpa"
        changed.append("impl='sdpa' (was 'auto', which no longer exists)")
    for k, v in ckpt["config"].items():
        if k not in vars(cfg) or k in ("out_dir", "eval_only"):
            continue
        if k == "init_from" or k not in given:
            setattr(cfg, k, check(k, v, everything, rules))
        elif getattr(cfg, k) != v:
            changed.append(f"{k}={getattr(cfg, k)!r} (was {v!r})")
    if not cfg.eval_only and ckpt["iter_num"] >= cfg.max_iters:
        raise ConfigError(f"the checkpoint is at iter {ckpt['iter_num']} already; "
                          "raise --max_iters to train on")
    return ckpt, changed


def check_same_data(ckpt, meta, dataset):
    """A resumed run reads data of the tokenizer and vocabulary it was trained with."""
    keys = ("tokenizer", "vocab_size", "chars")
    if any(ckpt["meta"].get(k) != meta.get(k) for k in keys):
        trained_on = ckpt["config"].get("dataset")
        fix = f"use --dataset={trained_on}"
        if trained_on in (None, dataset):  # the same name, prepared again since (with another vocabulary)
            fix = "prepare it again as it was when the run began, or start a new run in another --out_dir"
        raise ConfigError(f"dataset {dataset!r} is not the one the checkpoint was trained on (another "
                          f"tokenizer or vocabulary); {fix}")


def model_settings(cfg, given, model_defaults):
    """GPTConfig's arguments as cfg sets them: the model's settings, and the chosen op's controls (those given
    too, which GPTConfig refuses if they are another op's)."""
    chosen = OPS[cfg.op].controls if cfg.op in OPS else {}  # an unknown op: GPTConfig names it
    controls = {k: getattr(cfg, k) for k in all_controls() if k in chosen or k in given}
    return {**{k: getattr(cfg, k) for k in model_defaults}, "controls": controls}


def adopt_model_settings(cfg, given, config, source):
    """A checkpoint or GPT-2 (source) fixes the architecture: a model setting given explicitly that differs
    from it is refused, never silently ignored; cfg is then set to what runs (config: the model's config)."""
    keys = [f.name for f in fields(config) if f.name not in ("vocab_size", "controls")]
    built = {**{k: getattr(config, k) for k in keys}, **config.controls}
    for k in sorted(given & (set(keys) | set(all_controls())) - set(RESUME_MAY_CHANGE)):
        if k not in built:
            raise ConfigError(f"{k} is not a control of the {source}'s op={config.op!r}; drop it")
        if getattr(cfg, k) != built[k]:
            raise ConfigError(f"{k}={getattr(cfg, k)!r} differs from the {source}'s {built[k]!r}; its model "
                              "is fixed, drop that setting")
    for k, v in built.items():
        setattr(cfg, k, v)
