"""
Train a nanoCorridor GPT on one CPU/GPU, or on many GPUs (and nodes) with DDP.

One device (the README's main job: CPU, ~3 minutes, prepares the offline corpus on the fly):
    python train.py config/train_demo.py
Any setting can be overridden on the command line, after the config file (--help lists them all):
    python train.py config/train_demo.py --op=attention --max_iters=500 --out_dir=out/attn
DDP, one node with 8 GPUs (on CPU, --nproc_per_node=2 uses gloo; several nodes: see the README):
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_owt.py

A run directory (out_dir) gets config.json, log.jsonl and ckpt.pt (the dict `checkpoint` in
train()), which --init_from=resume continues (save_every keeps ckpt_NNNNNN.pt copies). Each check is
one call into support/.
"""
import math
import sys
import time

import torch

from model import GPT, GPTConfig
from operators import OPS, all_controls
from prepare_data import ensure_prepared
from support import hellaswag, kernel_check, rundir, settings
from support.configurator import configure, require_torch
from support.dataloader import DataError, ShardLoader, ValSet, load_meta, token_bytes, unigram_loss
from support.hardware import (compiled_wrapped_warmed, end_process, exit_status, peak_flops,
                              start_process)

# -----------------------------------------------------------------------------
# default settings; config files and --key=value arguments override them
# I/O
out_dir = "out/run"  # the run directory: config.json, log.jsonl, ckpt.pt
eval_interval = 250  # evaluate (and checkpoint) every this many iterations
log_interval = 10  # print and log the training loss every this many iterations
eval_iters = 20  # batches of the train split's loss estimate (the val loss reads val_tokens, below)
val_tokens = 10_485_760  # the val loss reads the val split's first val_tokens (modded-nanogpt's)
hellaswag_interval = 0  # score HellaSwag every this many iters (times eval_interval; 0: never)
eval_only = False  # evaluate the checkpoint (or init_from's model) once, print, write nothing
always_save_checkpoint = True  # checkpoint at every evaluation; False: only when val loss improves
save_every = 0  # also keep ckpt_NNNNNN.pt every this many iters (times eval_interval; 0: never)
init_from = "scratch"  # scratch, resume (out_dir/ckpt.pt), gpt2..gpt2-xl or a local GPT-2 folder
wandb_log = False  # also log to Weights & Biases (needs the wandb package)
wandb_project = "nanocorridor"  # its project
wandb_run_name = "run"  # its run name
# data
dataset = "pydocs"  # a folder in data/ made by prepare_data.py (pydocs is prepared on the fly)
gradient_accumulation_steps = 1  # micro-steps per optimizer step, shared by the DDP processes
batch_size = 12  # sequences per process and micro-step
block_size = 1024  # the context length T, in tokens
# model (its vocab_size is the data's; each op's controls, gamma_init ..., are settings too:
# operators.py)
n_layer = 12  # transformer blocks
n_head = 12  # heads per block
n_embd = 768  # the width C; each head has C / n_head dimensions
dropout = 0.0  # dropout on attention, residual and embeddings (0: off)
bias = True  # biases in Linears and LayerNorms, like GPT-2
op = "mix"  # what every head applies to its values: a name in operators.OPS (attention, mix, ...)
impl = "sdpa"  # how heads compute (a·I + b·P)V: sdpa, materialized (teaching) or triton (kernel.py)
gelu = "none"  # the GELU: none (exact, faster on CPUs) or tanh (GPT-2's, which its weights need)
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
device = "auto"  # auto: cuda > mps > cpu; or cpu, cuda:1... (torchrun: cuda, one GPU per process)
dtype = "auto"  # auto: bfloat16 on sm_80+ GPUs, else float16 (grad scaler) on GPUs; float32 on CPU
compile = None  # torch.compile the model; None: on for CUDA, off elsewhere
seed = 1337  # seeds the initial weights, the data order and dropout
DEFAULTS = {k: v for k, v in globals().items()
            if not k.startswith("_") and isinstance(v, (int, float, str, type(None)))}
# -----------------------------------------------------------------------------


def parse_config(argv):
    """(cfg, given): train.py's settings and every op's controls (an op may be registered after this
    import), after config files and --key=value, checked by support/settings.py's rules; given: the
    keys set."""
    return configure({**DEFAULTS, **all_controls()}, argv, settings.RULES,
                     help_from=settings.help_from(sys.modules[__name__]))


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
    """One console line: how many heads sit in the convex corridor γ ∈ (-1, 0); per-layer mean γ,
    δ."""
    inside = ((gamma > -1) & (gamma < 0)).sum().item()
    means = enumerate(zip(gamma.mean(1), delta.mean(1)))
    layers = " ".join(f"L{i}:γ{g:+.2f}/δ{d:.2f}" for i, (g, d) in means)
    return f"corridor {inside}/{gamma.numel()} heads in (-1,0) | {layers}"


def build_model(cfg, model_args, meta, ckpt):
    """The model that cfg.init_from asks for: the checkpoint's (its settings but dropout and impl,
    cfg's), a new one of model_args, or GPT-2's weights with the heads of cfg's op."""
    if ckpt is not None:
        model = GPT.from_checkpoint(ckpt, dropout=cfg.dropout, impl=cfg.impl)
        settings.check_same_data(ckpt, meta, cfg.dataset)
        return model
    if cfg.init_from == "scratch":
        # GPT-2's: a multiple of 64
        vocab = 50304 if meta["vocab_size"] == 50257 else meta["vocab_size"]
        return GPT(GPTConfig(**model_args, vocab_size=vocab))
    # GPT-2 weights, heads of the chosen op
    settings.check_gpt2_tokens(cfg.init_from, cfg.dataset, meta)
    model = GPT.from_pretrained(cfg.init_from, op=cfg.op, controls=model_args["controls"],
                                dropout=cfg.dropout, impl=cfg.impl)
    model.crop_block_size(cfg.block_size)  # at most GPT-2's 1024 (settings.work_out)
    return model


def evaluator(cfg, run, data_dir, meta, vocab_size):
    """evaluate(model, iter_num, tokens): what is evaluated at every eval_interval, printed and
    logged: the val loss over the fixed val set (the same tokens on every machine, for every seed,
    batch size and process count: dataloader.ValSet), in nats per token and in bits per byte (which
    compares tokenizers); the train loss over the same eval_iters sampled batches every time;
    HellaSwag's acc_norm when due; every head's (γ, δ)."""
    val_set = ValSet(data_dir, cfg.block_size, cfg.val_tokens, run.rank, run.world_size, vocab_size)
    train_batches = ShardLoader(data_dir, "train", cfg.batch_size, cfg.block_size, run.rank,
                                run.world_size, vocab_size, cfg.seed)
    try:  # bits per byte: the val loss in bits over the UTF-8 bytes of the text val predicts
        val_bytes = int(token_bytes(meta)[val_set.tokens[1:]].sum())
    except DataError as e:  # GPT-2's vocabulary is not downloaded, and this machine is offline
        val_bytes = None
        run.say(f"note: no bits per byte in this run: {e}")
    examples = (hellaswag.render_all(meta, cfg.dataset, cfg.block_size)  # HellaSwag's, token rows
                if cfg.hellaswag_interval else None)

    @torch.no_grad()
    def losses(model):
        model.eval()
        val_sum = 0.0
        for x, y in val_set.batches(cfg.batch_size):
            with run.ctx:
                _, loss = model(x.to(run.dev), y.to(run.dev))
            val_sum += loss.item() * y.numel()  # (loss: the batch's mean)
        train_sum = 0.0
        train_batches.reset()  # the same batches at every evaluation
        for _ in range(cfg.eval_iters):
            with run.ctx:
                _, loss = model(*train_batches.next_batch(run.dev))
            train_sum += loss.item()
        model.train()
        sums = torch.tensor([val_sum, train_sum], dtype=torch.float64,
                            device=run.dev if run.ddp else "cpu")
        if run.ddp:
            torch.distributed.all_reduce(sums)
        val_total, train_total = sums.tolist()
        return val_total / val_set.count, train_total / (cfg.eval_iters * run.world_size)

    def evaluate(model, iter_num, tokens):
        """Evaluate, print and log; returns the val loss (NaN or inf: the loop stops the run)."""
        val_loss, train_loss = losses(model)
        record = {"event": "eval", "iter": iter_num, "tokens": tokens, "train_loss": train_loss,
                  "val_loss": val_loss, "val_tokens": val_set.count}
        line = f"step {iter_num}: train loss {train_loss:.4f}, val loss {val_loss:.4f}"
        if val_bytes:  # nats per token -> bits per byte
            record["val_bpb"] = val_loss / math.log(2) * val_set.count / val_bytes
            line += f" ({record['val_bpb']:.4f} bits/byte)"
        # HellaSwag when due, and at the end
        if examples and (cfg.eval_only or iter_num == cfg.max_iters
                         or iter_num % cfg.hellaswag_interval == 0):
            record["hellaswag"] = hellaswag.score(model, examples, cfg.batch_size, run.dev, run.rank,
                                                  run.world_size, run.ctx)
            line += f", hellaswag acc_norm {record['hellaswag']:.4f} ({len(examples):,} examples)"
        gamma, delta = model.gamma_delta()
        run.say(f"{line} | {corridor_summary(gamma, delta)}")
        run.log({**record, "gamma": gamma.tolist(), "delta": delta.tolist()})
        return val_loss

    return evaluate


def log_train(run, **record):
    """A training step's console line and log record (iter, loss, grad_norm, lr, ms_per_iter,
    ...)."""
    line = ("iter {iter}: loss {loss:.4f}, grad norm {grad_norm:.3f}, lr {lr:.2e}, "
            "{ms_per_iter:.1f} ms/iter, {tokens_per_s:,.0f} tok/s").format(**record)
    if record["mfu"]:
        line += f", mfu {record['mfu'] * 100:.1f}%"
    run.say(line)
    run.log({"event": "train", **record})


def say_what_runs(run, cfg, changed, model, tokens_per_iter, data_dir, meta):
    """What nanoGPT prints before its loop: the settings that run (changed: those a resume changed),
    the device, the tokens per iteration and the model's size; and the val loss of unigram
    frequencies."""
    counted = meta.get("tokens")  # tokens per split, as prepare_data.py counted them
    if run.master and counted is not None and sum(counted.values()) < 1e8:  # quick enough to count
        run.say(f"unigram baseline: val loss {unigram_loss(data_dir, meta['vocab_size']):.4f} "
                "(context-free token frequencies)")
    run.say("config:", " ".join(f"{k}={v!r}" for k, v in vars(cfg).items()))
    if changed:  # all of them run: the optimizer's settings too (rundir.load_optimizer_state)
        run.say("resumed with settings changed from the checkpoint's:",
                ", ".join(f"{k}={getattr(cfg, k)!r} (was {was!r})" for k, was in changed.items()))
    run.say(f"device {run.dev}, dtype {run.dtype}, {run.world_size} process(es), {tokens_per_iter:,} tokens "
            f"per iteration, {model.get_num_params() / 1e6:.2f}M parameters, op={cfg.op}")


def train(cfg, ckpt, changed):
    # --- set-up: cfg's model (ckpt: the checkpoint it continues), this process, data, optimizer, out_dir
    model_args = {k: getattr(cfg, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "bias",
                                                "dropout", "op", "impl", "gelu")}
    model_args["controls"] = {k: getattr(cfg, k) for k in OPS[cfg.op].controls}  # operators.py
    GPTConfig(**model_args)  # its checks (the data's vocab_size yet unknown), before any file or device
    run = start_process(cfg)  # this process: rank, device, dtype, autocast; DDP; the seed
    data_dir = run.master_first(ensure_prepared, cfg.dataset)  # prepared once, the others waiting
    meta = load_meta(data_dir)
    model = build_model(cfg, model_args, meta, ckpt).to(run.dev)
    grad_accum = max(1, cfg.gradient_accumulation_steps // run.world_size)  # this process's
    tokens_per_iter = grad_accum * run.world_size * cfg.batch_size * cfg.block_size
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate,
                                           (cfg.beta1, cfg.beta2), cfg.op_lr_scale)
    if cfg.impl == "triton":  # the fused kernel, checked against float64 here before any step
        run.say(kernel_check.check_kernel(run.dev, run.dtype, cfg.n_embd // cfg.n_head))
    train_loader = ShardLoader(data_dir, "train", cfg.batch_size, cfg.block_size, run.rank,
                               run.world_size, model.config.vocab_size, cfg.seed)
    evaluate = evaluator(cfg, run, data_dir, meta, model.config.vocab_size)  # (model, iter, tokens)
    iter_num, tokens, best_val_loss = rundir.restore(ckpt, optimizer, train_loader)  # the counters
    rundir.start_run_dir(run, cfg, iter_num if ckpt is not None else None, changed)  # lock, log
    first_iter = iter_num  # a resumed run was evaluated there before it stopped
    del ckpt  # its memory (at GPT-2's scale, gigabytes of optimizer state)
    say_what_runs(run, cfg, changed, model, tokens_per_iter, data_dir, meta)
    raw_model, model = model, compiled_wrapped_warmed(model, cfg, run)  # compile, DDP, warm-up
    scaler = torch.amp.GradScaler(run.device_type, enabled=(run.dtype == "float16"))
    peak = peak_flops(run.dev)  # the GPU's FLOP/s, for the MFU (None on CPUs)

    # --- the training loop -----------------------------------------------------------------------
    t0, timed_from = time.time(), iter_num  # the clock, and the iteration it started at
    while True:
        due = iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters
        if cfg.eval_only or (due and (iter_num > first_iter or iter_num == 0)):
            val_loss = evaluate(raw_model, iter_num, tokens)  # printed and logged
            rundir.stop_if_not_finite("the validation loss", val_loss, iter_num, cfg.out_dir)
            if run.writes and iter_num > 0:
                write_ckpt_pt = val_loss < best_val_loss or cfg.always_save_checkpoint
                best_val_loss = min(best_val_loss, val_loss)
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "model_args": vars(raw_model.config),  # what GPT.from_checkpoint builds
                    "iter_num": iter_num, "tokens": tokens, "best_val_loss": best_val_loss,
                    "config": vars(cfg),  # every setting, as config.json shows them
                    "loader": train_loader.state_dict(),  # where the data order goes on
                    "meta": meta,  # the data's tokenizer: sample.py decodes from any folder
                }
                rundir.save_checkpoint(run, checkpoint, write_ckpt_pt)  # and ckpt_NNNNNN.pt if due
            t0, timed_from = time.time(), iter_num  # keep evaluation out of the speed measurement
        if iter_num >= cfg.max_iters or cfg.eval_only:
            break
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:  # the operators' scalars: lr × op_lr_scale
            group["lr"] = lr * group.get("lr_scale", 1.0)
        # dropout depends only on (seed, iteration, rank): a resumed run draws as an unbroken one would
        torch.manual_seed(cfg.seed + 1000003 * iter_num + run.rank)
        loss_sum = 0.0
        for micro_step in range(grad_accum):
            if run.ddp:  # sync gradients only at the last micro-step
                model.require_backward_grad_sync = micro_step == grad_accum - 1
            X, Y = train_loader.next_batch(run.dev)
            with run.ctx:
                logits, loss = model(X, Y)
                loss = loss / grad_accum  # the mean over micro-steps
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        scaler.unscale_(optimizer)  # the true gradients (fp16's scaler multiplies them)
        # the norm before clipping, logged: its spikes warn of instability (grad_clip=0: never clip)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or math.inf)
        scaler.step(optimizer)
        scaler.update()
        raw_model.project()  # e.g. γ ≥ gamma_min
        optimizer.zero_grad(set_to_none=True)
        iter_num, tokens = iter_num + 1, tokens + tokens_per_iter
        if iter_num % cfg.log_interval == 0 or iter_num == cfg.max_iters:
            dt = (time.time() - t0) / (iter_num - timed_from)  # seconds per iteration, lately
            mean_loss = loss_sum.item()  # .item() waits for the GPU: only at log lines
            rundir.stop_if_not_finite("the training loss", mean_loss, iter_num, cfg.out_dir)
            log_train(run, iter=iter_num, tokens=tokens, loss=mean_loss, lr=lr, grad_norm=grad_norm.item(),
                      ms_per_iter=dt * 1000, tokens_per_s=tokens_per_iter / dt,
                      mfu=raw_model.estimate_mfu(grad_accum * cfg.batch_size, dt, peak))
            t0, timed_from = time.time(), iter_num

    # --- the end: every head's final γ and δ, and how many sit in the corridor; the log's last record
    gamma, delta = raw_model.gamma_delta()
    torch.set_printoptions(precision=2, sci_mode=False, linewidth=140)
    run.say(f"final per-head γ (rows: layers, columns: heads):\n{gamma}\nfinal per-head δ:\n{delta}\n"
            + corridor_summary(gamma, delta))
    if run.writes:
        run.log({"event": "done", "iter": iter_num, "best_val_loss": best_val_loss})
    # every rank gets here before main leaves the group: gloo aborts a process whose peers left
    if run.ddp:
        torch.distributed.barrier()
    return raw_model


def main(argv):
    args = None
    try:
        require_torch(torch.__version__)  # the oldest torch measured; older ones get this one line
        args, given = parse_config(argv)
        return train(*settings.work_out(args, given, DEFAULTS))  # (cfg, ckpt, changed)
    except (ValueError, ImportError, FloatingPointError, OSError) as e:  # ours, kernel.py's, I/O
        sys.exit(exit_status(e))
    except KeyboardInterrupt:
        # says how to go on: resume from the checkpoint, or run it again
        sys.exit(rundir.interrupted(args))
    finally:
        rundir.unlock_run_dirs()  # however the run ended: out_dir is free again
        end_process()  # the DDP group goes at every exit, error or not


if __name__ == "__main__":
    main(sys.argv[1:])
