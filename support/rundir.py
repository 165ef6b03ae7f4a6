"""
A run directory, as train.py writes it and sample.py and corridor.py read it:

    config.json   the settings of ckpt.pt (written with it)
    log.jsonl     one JSON record per line: start (its settings, what a resume changed), train,
                  eval, checkpoint (ckpt.pt and config.json written), done
    ckpt.pt       train.py's dict `checkpoint`: model, optimizer, settings, counters, loader
                  position, meta
    ckpt_NNNNNN.pt  the same at iteration NNNNNN, with save_every (for analysis; resume: ckpt.pt)
    lock          held by the process that writes the run: two runs never share a directory

Every file is written to a fresh temporary name and renamed, so a crash or a full disk never leaves
a broken one. A run directory may come from someone else: nothing here follows a symbolic link or
opens a FIFO or device, and a checkpoint is checked against the model before use."""
import contextlib
import json
import math
import os
import re
import subprocess

import filelock
import torch

from support.configurator import ConfigError, open_regular, read_regular, refuse_unless_regular, why
from support.dataloader import check_meta

# what train.py writes into a run directory, and (below) the copies save_every keeps
RUN_FILES = ("lock", "log.jsonl", "config.json", "ckpt.pt")
KEPT_CHECKPOINT = re.compile(r"ckpt_\d{6,}\.pt")

# run directory -> (its filelock.FileLock, [that lock's descriptor]) while this process holds it
_held = {}


def lock_run_dir(out):
    """Lock out/lock while this process writes the run; a second writer is refused, told which
    process holds it (the file's first line). The OS lock (flock, LockFileEx) goes with its process,
    even on kill -9; where there is none, filelock's marker file names its process and is taken over
    once that one is gone."""
    key = os.path.realpath(out)
    if key in _held:  # already ours (several runs in one process, as in the tests)
        return
    path = os.path.join(out, "lock")
    # fds: the OS lock's own descriptor, once acquired; a marker file has none
    fds, options = [], {}
    # an OS lock: the file is ours to write, and it stays
    if filelock.FileLock is not filelock.SoftFileLock:
        options = dict(preserve_lock_file=True, on_acquired=fds.append)
    lock = filelock.FileLock(path, blocking=False, **options)
    try:
        lock.acquire()
    except filelock.Timeout:
        holder = "?"  # on Windows the holder's lock keeps others from reading the file
        with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
            holder = f.readline().strip() or "?"
        raise ConfigError(
            f"{out} is in use by another run (process {holder}); wait for it to "
            "finish or choose another --out_dir"
        ) from None
    # write through the lock's descriptor: on Windows the lock keeps other handles out
    for fd in fds:
        # a run that finishes empties the file
        previous = os.read(fd, 100).decode(errors="replace").strip()
        if previous and previous != str(os.getpid()):
            print(
                f"note: the previous run in {out} (process {previous}) stopped before finishing; "
                "its lock went with it"
            )
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, str(os.getpid()).encode())
    _held[key] = lock, fds


def unlock_run_dir(out):
    lock, fds = _held.pop(os.path.realpath(out))
    for fd in fds:
        os.ftruncate(fd, 0)  # a run that finished leaves no process behind in the lock file
    lock.release()


def unlock_run_dirs():
    """Unlock what this process still locks, however it ends: only a killed process leaves its id
    behind."""
    for out in list(_held):
        unlock_run_dir(out)


def atomic_write(path, write):
    """write(f) (f: a binary file) into a fresh temporary beside path, created with O_EXCL (it fails on
    anything there, a link included), then rename it over path, which must be a regular file if there."""
    refuse_unless_regular(path)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.urandom(6).hex()}.tmp")
    try:
        with open_regular(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)  # replaces the name path, never a file a link might lead to
    except BaseException as e:  # OSError, torch.save's RuntimeError on a full disk, Ctrl-C mid-file
        if os.path.lexists(tmp):
            os.remove(tmp)
        if not isinstance(e, Exception):  # Ctrl-C: the caller says so, and path is as it was
            raise
        kept = "the previous one is intact" if os.path.isfile(path) else "nothing was written"
        reason = e.strerror if isinstance(e, OSError) and e.strerror else why(e)
        error = OSError(f"{reason} while writing {path}; {kept}")
        error.errno = getattr(e, "errno", None)  # ENOSPC stays ENOSPC: the caller's full-disk line needs it
        raise error from None


def is_run_file(name):
    return name in RUN_FILES or KEPT_CHECKPOINT.fullmatch(name) is not None


def is_temporary(name):
    """Whether name is an atomic_write temporary (.NAME.HEX.tmp) of a run file (a kill -9 may leave
    one)."""
    return (
        name.startswith(".") and name.endswith(".tmp") and is_run_file(name[1:].rsplit(".", 2)[0])
    )


def check_run_dir(out_dir, resuming):
    """Refuse an out_dir that holds what no run wrote, before anything is written there. A run
    writes only RUN_FILES, as regular files, its log before its config: for a new run, anything
    else, a config.json without a log.jsonl or a lock naming no process is someone else's; a resumed
    run's are left alone."""
    for name in RUN_FILES:
        refuse_unless_regular(os.path.join(out_dir, name))
    # a run that a new one must not overwrite: train.py says so
    if resuming or holds_a_run(out_dir):
        return
    names = os.listdir(out_dir)
    foreign = [n for n in sorted(names) if not is_run_file(n) and not is_temporary(n)]
    if "config.json" in names and "log.jsonl" not in names:
        foreign.append("config.json")
    if "lock" in names:
        marker = read_regular(os.path.join(out_dir, "lock"), 4096).decode(errors="replace").strip()
        # a run's lock starts with its process id
        if marker and not marker.splitlines()[0].strip().isdigit():
            foreign.append("lock")
    if foreign:
        raise ConfigError(
            f"out_dir={out_dir!r} holds files that no run wrote ({few(foreign)}); a run writes "
            "only into a new or empty directory or its own: choose another --out_dir"
        )


def claim_run_dir(out_dir, resuming):
    """Everything is checked: from here on this process owns out_dir (no other run may hold it)."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        check_run_dir(out_dir, resuming)  # before the lock: nothing is written into others' folders
        lock_run_dir(out_dir)
        for name in filter(is_temporary, os.listdir(out_dir)):  # a killed run left them
            # a link is removed itself, never what it points to
            os.remove(os.path.join(out_dir, name))
    except OSError as e:
        raise ConfigError(
            f"out_dir={out_dir!r} cannot hold a run: {e.strerror}; " "choose another --out_dir"
        ) from None
    # checked under the lock: no other run can be finishing
    if not resuming and holds_a_run(out_dir):
        unlock_run_dir(out_dir)
        go_on = "continue it with --init_from=resume, evaluate it with --eval_only=True,"
        if not os.path.exists(os.path.join(out_dir, "ckpt.pt")):
            go_on = "its ckpt.pt is gone, so it cannot be resumed:"
        raise ConfigError(
            f"{out_dir} already holds a run; {go_on} or choose another --out_dir "
            f"(rm -r {out_dir} to start over)"
        )


def holds_a_run(out_dir):
    """Whether out_dir holds a run that a new one would destroy: a checkpoint, or a log that records
    more than a start, training steps and the evaluation at iteration 0 (nothing to resume), or is
    unreadable."""
    if os.path.exists(os.path.join(out_dir, "ckpt.pt")):
        return True
    log = os.path.join(out_dir, "log.jsonl")
    if not os.path.lexists(log):
        return False
    with open_regular(log) as f:  # stray bytes in a log: still a log
        return any(line.strip() and not before_first_checkpoint(line) for line in f)


def before_first_checkpoint(line):
    try:
        record = json.loads(line)
    except ValueError:  # not JSON
        return False
    event = record["event"]
    return event in ("start", "train") or (event == "eval" and record["iter"] == 0)


def interrupted(cfg):
    """What Ctrl-C says: how to go on from what out_dir holds (cfg None: stopped while reading
    settings)."""
    if cfg is not None and cfg.eval_only:
        return "interrupted: eval_only writes nothing (nothing is lost): run the same command again"
    if cfg is not None and os.path.exists(os.path.join(cfg.out_dir, "ckpt.pt")):
        return ("interrupted: continue from the last checkpoint with --init_from=resume "
                "(same --out_dir)")
    return ("interrupted before any checkpoint was written (nothing is lost): "
            "run the same command again")


# what a checkpoint holds (train.py's dict `checkpoint`)
CHECKPOINT = (
    "model", "optimizer", "model_args", "iter_num", "best_val_loss", "tokens", "loader", "meta", "config",
)


def load_checkpoint(path):
    if not os.path.lexists(path):  # (a folder there is open_regular's one line)
        raise ConfigError(f"no checkpoint at {path}; train a run there first (--init_from=scratch) "
                          "or point --out_dir at an existing run")
    with open_regular(path) as f:
        try:  # weights_only: tensors, numbers, strings and dicts, never code to run
            ckpt = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ConfigError(f"checkpoint {path} cannot be read safely ({e.__class__.__name__}): "
                              "it is corrupt, not a nanoCorridor checkpoint, or carries code") from None
    missing = set(CHECKPOINT) - set(ckpt)
    if missing:  # another version's file, or not a checkpoint at all
        raise ConfigError(f"checkpoint {path} lacks {', '.join(sorted(missing))}; "
                          "it was not written by this train.py")
    check_meta(ckpt["meta"], f"checkpoint {path}'s copy of meta.json",
               "it was not written by this train.py")
    check_sizes(ckpt["model_args"], ckpt["model"])
    weights = ckpt["model"].items()  # GPT.from_checkpoint checks their names and shapes
    not_finite = [k for k, t in weights if not torch.isfinite(t).all()]
    if not_finite:  # a run that diverged between two evaluations
        raise ConfigError(f"the checkpoint's weights are not finite (NaN or inf in "
                          f"{few(not_finite)}); use an earlier checkpoint of the run")
    return ckpt


SIZES = ("vocab_size", "block_size", "n_embd", "n_layer")  # what a model's memory grows with


def check_sizes(args, weights):
    """The sizes model_args claim against the shapes of the weights, before any model is built (a
    file that claims far more than it holds would take minutes and gigabytes to build): the
    embeddings give vocab_size, block_size and n_embd, the blocks' names n_layer."""
    embeddings = ("transformer.wte.weight", "transformer.wpe.weight")
    held = [tuple(weights[k].shape) if k in weights else None for k in embeddings]
    held.append(len({k.split(".")[2] for k in weights if k.startswith("transformer.h.")}))
    vocab_size, block_size, n_embd, n_layer = (args.get(k) for k in SIZES)
    claimed = [(vocab_size, n_embd), (block_size, n_embd), n_layer]
    if held != claimed:
        raise ConfigError(f"the checkpoint does not fit this code (model_args give wte, wpe, "
                          f"blocks {claimed}, its weights {held}); it comes from another version or "
                          "was edited")


def few(names):
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def load_optimizer_state(optimizer, ckpt):
    """Restore AdamW's moments, each checked first against its parameter's shape (another version's
    parameters in another order would crash the fused optimizer); the param groups keep this run's
    settings (weight decay, betas, lr_scale), not the saved ones."""
    saved, built = ckpt["optimizer"], optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if [g["params"] for g in saved["param_groups"]] != [g["params"] for g in built["param_groups"]]:
        raise ConfigError("the checkpoint's optimizer state does not fit this model (other "
                          "parameter groups); it comes from another version")
    for i, entry in saved["state"].items():  # keyed by the parameter's place in the groups
        if not all(entry[k].shape == params[i].shape for k in ("exp_avg", "exp_avg_sq")):
            raise ConfigError(f"the checkpoint's optimizer state does not fit this model (the entry "
                              f"of parameter {i!r} must hold two moments shaped like the parameter); "
                              "it comes from another version")
    optimizer.load_state_dict({"state": saved["state"], "param_groups": built["param_groups"]})


def restore(ckpt, optimizer, train_loader):
    """(iter_num, tokens, best_val_loss) where the checkpoint's run stopped; optimizer and loader
    restored."""
    if ckpt is None:
        return 0, 0, float("inf")
    load_optimizer_state(optimizer, ckpt)
    train_loader.load_state_dict(ckpt["loader"])
    return ckpt["iter_num"], ckpt["tokens"], ckpt["best_val_loss"]


def read_log(path):
    """log.jsonl's records, and a warning if its last line was cut short by a crash (then left out:
    the one line ever skipped). Any other line that is not JSON (a crash under an older version,
    which kept such a line when it resumed) is one line."""
    with open_regular(path) as f:
        lines = [line for line in f if line.strip()]
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError:  # not JSON, or not UTF-8
            if n == len(lines):  # RunLog writes whole lines: only a crash leaves part of one
                return records, f"{path}: line {n} was cut short (a crash), left out"
            raise ConfigError(
                f"{path}: line {n} is not a record train.py wrote; remove that line"
            ) from None
    return records, None


def trim_log(path, iter_num):
    """On resume, keep the history of what the checkpoint at iter_num holds: its training,
    evaluations and earlier starts (one at iter_num saved nothing)."""
    keep = [
        r
        for r in read_log(path)[0]
        if r["event"] != "done" and r["iter"] <= iter_num - (r["event"] == "start")
    ]
    atomic_write(path, lambda f: f.write(b"".join(json.dumps(r).encode() + b"\n" for r in keep)))


def load_run(path):
    """One run's history, as corridor.py reads it: config.json (the settings of ckpt.pt), the
    records up to the checkpoint's iteration (what ckpt.pt holds) and every start: the iteration it
    resumed at, the settings it ran with ('config') and what it changed ('changes': {setting:
    (before, after)}); a start at the checkpoint's iteration ('ckpt_iter') saved nothing. Records
    logged after it (to 'logged_to') are left out: no checkpoint holds them. A damaged or missing
    file is one ValueError line."""
    cfg_path, log_path = os.path.join(path, "config.json"), os.path.join(path, "log.jsonl")
    missing = " and ".join(
        os.path.basename(p) for p in (cfg_path, log_path) if not os.path.lexists(p)
    )
    if missing:
        raise ConfigError(
            f"{path}: not a run directory, missing {missing} (train.py writes log.jsonl as "
            "it starts, config.json with its first checkpoint)"
        )
    try:  # a few kB of flat settings
        config = json.loads(read_regular(cfg_path, 1 << 20))
    except ValueError as e:  # cut short, or not UTF-8
        raise ConfigError(f"{cfg_path}: not the JSON train.py writes ({e})") from None
    records, cut = read_log(log_path)
    logged_to = max([r["iter"] for r in records], default=0)
    # logged after ckpt.pt is written
    saved = [r["iter"] for r in records if r["event"] == "checkpoint"]
    # older logs record no checkpoint: every record counts as saved
    ckpt_iter = max(saved, default=logged_to)
    starts = [r for r in records if r["event"] == "start"]
    # the settings of the start that wrote ckpt.pt; before each start, the earlier one's
    after = config
    for start in reversed(starts):
        start.setdefault("config", after)  # older logs record only what a start changed
        after = {**start["config"], **start.get("changed", {})}
        start["changes"] = {
            k: (was, start["config"].get(k))
            for k, was in start.get("changed", {}).items()
            if was != start["config"].get(k)
        }
    records = [r for r in records if r["iter"] <= ckpt_iter]
    evals = [r for r in records if r["event"] == "eval"]
    if not evals:
        raise ConfigError(f"{log_path}: no eval record yet (train.py logs the first one at iter 0)")
    warnings = [cut] if cut else []
    if not math.isfinite(evals[-1]["val_loss"]):
        warnings.append(
            f"{log_path}: the val loss became {evals[-1]['val_loss']} at iter "
            f"{evals[-1]['iter']}: the run diverged"
        )
    return {
        "name": os.path.basename(os.path.normpath(path)),
        "path": path,
        "config": config,
        "records": records,
        "evals": evals,
        "starts": starts,
        "ckpt_iter": ckpt_iter,
        "logged_to": logged_to,
        "warnings": warnings,
    }


def git_commit():
    """The commit of the code that runs ('+' when tracked files differ from it), or None outside
    git."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*args, **options):
        return subprocess.run(
            ["git", *args], cwd=here, capture_output=True, text=True, timeout=10, **options
        )

    try:
        sha = git("rev-parse", "HEAD", check=True).stdout.strip()  # fails outside a git repository
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):  # no git here, one that hangs, or no repository
        return None
    return sha + ("+" if dirty else "")


class RunLog:
    """log.jsonl, one record per line, flushed at once: a killed run loses at most its last line."""

    def __init__(self, out_dir, resume_iter=None, wandb_run=None):
        path = os.path.join(out_dir, "log.jsonl")
        if resume_iter is None:
            atomic_write(path, lambda f: None)  # a new run starts a new, empty log
        elif os.path.lexists(path):
            trim_log(path, resume_iter)
        self.file = open_regular(path, "ab+")
        self.wandb = None
        # also send the numbers to Weights & Biases: wandb.init's arguments
        if wandb_run is not None:
            import wandb  # lazy: optional

            self.wandb = wandb
            wandb.init(**wandb_run)

    def write(self, record):
        self.file.write((json.dumps(record) + "\n").encode())
        self.file.flush()
        if self.wandb is not None and record["event"] in ("train", "eval"):
            numbers = {k: v for k, v in record.items() if k not in ("event", "gamma", "delta")}
            for name in ("gamma", "delta"):  # every head's γ, δ on its own: gamma/L{layer}H{head}
                for layer, heads in enumerate(record.get(name, [])):
                    numbers.update(
                        {f"{name}/L{layer}H{head}": value for head, value in enumerate(heads)}
                    )
            self.wandb.log(numbers, step=record["iter"])


# -----------------------------------------------------------------------------
# what a run (hardware.Run, train.py's process) writes into the run directory


def start_run_dir(run, cfg, resume_iter, changed):
    """On the writing process: claim cfg.out_dir, start its log with a start record (resume_iter:
    the checkpoint's iteration, None for a new run; changed: {each setting a resume changed: its old
    value})."""
    if not run.writes:
        return
    claim_run_dir(cfg.out_dir, resume_iter is not None)
    wandb_run = dict(project=cfg.wandb_project, name=cfg.wandb_run_name, config=vars(cfg))
    run.run_log = RunLog(
        cfg.out_dir, resume_iter=resume_iter, wandb_run=wandb_run if cfg.wandb_log else None
    )
    run.log(
        {
            "event": "start",
            "iter": resume_iter or 0,
            "config": vars(cfg),
            "changed": changed,
            "commit": git_commit(),
            "torch": torch.__version__,
            "device": run.dev,
            "dtype": run.dtype,
            "world_size": run.world_size,
        }
    )


def save_checkpoint(run, checkpoint, write_ckpt_pt):
    """train.py's checkpoint as ckpt.pt if write_ckpt_pt and as ckpt_NNNNNN.pt if save_every is due;
    after ckpt.pt, config.json: its settings, which every reader takes (so written only once they
    are saved)."""
    cfg, iter_num = checkpoint["config"], checkpoint["iter_num"]
    paths = [os.path.join(cfg["out_dir"], "ckpt.pt")] if write_ckpt_pt else []
    # for analysis; resume reads ckpt.pt
    if cfg["save_every"] and iter_num % cfg["save_every"] == 0:
        paths.append(os.path.join(cfg["out_dir"], f"ckpt_{iter_num:06d}.pt"))
    for path in paths:
        atomic_write(path, lambda f: torch.save(checkpoint, f))
        run.say(f"saved checkpoint to {path}")
    # (after the log's first lines: a config.json without a log is no run's, check_run_dir)
    if write_ckpt_pt:
        settings = json.dumps(cfg, indent=1).encode()
        atomic_write(os.path.join(cfg["out_dir"], "config.json"), lambda f: f.write(settings))
        # after it: what ckpt.pt holds (load_run)
        run.log({"event": "checkpoint", "iter": iter_num})


def stop_if_not_finite(what, value, iter_num, out_dir):
    """A loss that is NaN or inf stops the run, before anything is saved from it."""
    if math.isfinite(value):
        return
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    last = (
        f"the last good checkpoint {ckpt_path} is untouched"
        if os.path.exists(ckpt_path)
        else "no checkpoint was written"
    )
    raise FloatingPointError(
        f"{what} became {value} at iter {iter_num}; stopping ({last}). "
        "Try a lower learning_rate, grad_clip=1.0 or dtype=bfloat16/float32."
    )
