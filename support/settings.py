"""
train.py's settings beyond their defaults: each value's rule, and work_out: what a resumed run keeps
from its checkpoint, the model settings a checkpoint or GPT-2 fixes, the settings that only make
sense together. The model's own settings (train.py's model_args) are checked by GPTConfig.
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


init_from_rule = requires(lambda v: v in ("scratch", "resume", *PRETRAINED) or os.path.isdir(v),
                          f"use scratch, resume, {', '.join(PRETRAINED)} or a local directory "
                          "saved with transformers' save_pretrained")
RULES = dict(eval_interval=at_least(1), log_interval=at_least(1), eval_iters=at_least(1),
             val_tokens=at_least(1), hellaswag_interval=at_least(0), save_every=at_least(0),
             out_dir=nonempty, init_from=init_from_rule, dataset=nonempty,
             gradient_accumulation_steps=at_least(1), batch_size=at_least(1),
             learning_rate=at_least(0.0), max_iters=at_least(1), weight_decay=at_least(0.0),
             beta1=in_range(0.0, 1.0), beta2=in_range(0.0, 1.0), grad_clip=at_least(0.0),
             warmup_iters=at_least(0), lr_decay_iters=optional(int, at_least(1)),
             min_lr=at_least(0.0), op_lr_scale=at_least(0.0), device=device_rule,
             compile=optional(bool), seed=SEED,
             dtype=one_of("auto", "float32", "bfloat16", "float16"),
             op=lambda key, value: one_of(*OPS)(key, value))  # the ops registered by now


def work_out(args, given, defaults):
    """(cfg, ckpt, changed): the settings that run, worked out once before any device or data is
    touched, from args as given (given: the keys set). A run of out_dir's checkpoint keeps its
    settings but those given (changed: {key: old value}); a checkpoint or GPT-2 fixes the model. The
    writer locks out_dir first."""
    ckpt, kept, changed, fixed = None, {}, {}, {}
    if args.init_from == "resume" or (args.eval_only and args.init_from == "scratch"):
        path = os.path.join(args.out_dir, "ckpt.pt")
        if os.path.lexists(path) and not args.eval_only and ddp_env()[0] == 0:
            claim_run_dir(args.out_dir, resuming=True)
        ckpt = load_checkpoint(path)
        model = ckpt["model_args"]  # as cfg holds them: each of its op's controls a setting
        # the model is fixed, but for its data's vocab_size and what is not part of the weights
        fixed = {k: v for k, v in model.items()
                 if k not in ("vocab_size", "controls", "dropout", "impl")}
        fixed.update(model.get("controls", {}))  # (another version's may have none)
        saved = {k: v for k, v in ckpt["config"].items()
                 if k in vars(args) and k not in ("out_dir", "eval_only")}
        # impl='auto' is gone: SDPA is the default
        if saved.get("impl") == "auto" and "impl" not in given:
            saved["impl"] = "sdpa"
            changed["impl"] = "auto"
        # the folder it was fine-tuned from may have moved since
        rules = {**RULES, "init_from": nonempty}
        for k, v in saved.items():
            same = means(fixed, k, getattr(args, k)) == means(fixed, k, v)
            if k == "init_from" or k not in given or same:
                kept[k] = check(k, v, {**defaults, **all_controls()}, rules)
            else:
                changed[k] = v
        if not args.eval_only and ckpt["iter_num"] >= kept.get("max_iters", args.max_iters):
            raise ConfigError(f"the checkpoint is at iter {ckpt['iter_num']} already; "
                              "raise --max_iters to train on")
    elif args.init_from != "scratch":
        # GPT-2's settings run
        kept = fixed = {**gpt2_sizes(args.init_from), "bias": True, "gelu": "tanh"}
        # a shorter context: its wpe cut
        fixed["block_size"] = min(args.block_size, fixed["block_size"])
    for k in sorted(given & {*fixed, *all_controls()}):
        if k in fixed:
            meant = means(fixed, k, fixed[k])  # laplacian_heads=None: half the heads
            if means(fixed, k, getattr(args, k)) != meant:
                also = ""
                if meant != fixed[k]:
                    also = f", which means {meant!r} on its {fixed['n_head']} heads"
                whose = "checkpoint" if ckpt else "pretrained model"
                raise ConfigError(f"{k}={getattr(args, k)!r} differs from the {whose}'s "
                                  f"{fixed[k]!r}{also}; its model is fixed, drop that setting")
        elif ckpt is not None:
            raise ConfigError(f"{k} is not a control of the checkpoint's op={fixed['op']!r}; drop it")
        elif k not in OPS[args.op].controls:
            raise ConfigError(f"{k} is not a control of op={args.op!r} (its controls: "
                              f"{', '.join(OPS[args.op].controls) or 'none'}); drop it or change op")
    cfg = SimpleNamespace(**{**vars(args), **kept})
    # settings that only make sense together, with the number of DDP processes too
    world_size = ddp_env()[2]
    accumulated = cfg.gradient_accumulation_steps
    if accumulated % world_size and not cfg.eval_only:  # evaluation accumulates nothing
        raise ConfigError(f"gradient_accumulation_steps={accumulated} must be a multiple of the "
                          f"number of processes ({world_size})")
    for k in ("hellaswag_interval", "save_every"):
        if getattr(cfg, k) % cfg.eval_interval and not cfg.eval_only:
            raise ConfigError(f"{k}={getattr(cfg, k)} must be a multiple of "
                              f"eval_interval={cfg.eval_interval}: it happens at evaluations")
    if cfg.wandb_log and importlib.util.find_spec("wandb") is None:
        raise ConfigError("wandb_log=True needs the wandb package: pip install wandb "
                          "(or --wandb_log=False)")
    return cfg, ckpt, changed


def help_from(script):
    """--help's sources of each setting's comment: the script's module, then every op's controls
    (configurator.print_help)."""
    return [("", script)] + [(f"(op={name}) ", Op) for name, Op in OPS.items()]


def means(fixed, k, value):
    """A model setting as the model reads it: laplacian_heads=None is half the heads
    (operators.py)."""
    return fixed["n_head"] // 2 if k == "laplacian_heads" and value is None else value


def check_gpt2_tokens(init_from, dataset, meta):
    """GPT-2's weights read GPT-2's tokens."""
    if meta["tokenizer"] != "gpt2":
        raise ConfigError(f"init_from={init_from!r} needs GPT-2 tokens but dataset {dataset!r} uses the "
                          f"{meta['tokenizer']!r} tokenizer; prepare it with --tokenizer=gpt2")


def check_same_data(ckpt, meta, dataset):
    """A resumed run reads data of the tokenizer and vocabulary it was trained with."""
    if any(ckpt["meta"].get(k) != meta.get(k) for k in ("tokenizer", "vocab_size", "chars")):
        trained_on = ckpt["config"]["dataset"]
        fix = f"use --dataset={trained_on}"
        # the same name, prepared again since (with another vocabulary)
        if trained_on == dataset:
            fix = ("prepare it again as it was when the run began, or start a new run in another "
                   "--out_dir")
        raise ConfigError(f"dataset {dataset!r} is not the one the checkpoint was trained on (another "
                          f"tokenizer or vocabulary); {fix}")

