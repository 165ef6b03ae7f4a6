"""
A run directory, as train.py writes it and sample.py and corridor.py read it:

    config.json   the settings that ran
    log.jsonl     one JSON record per line: start (commit, versions), train (loss, gradient norm, lr,
                  speed), eval (losses, bits per byte, HellaSwag when scored, every head's γ and δ), done
    ckpt.pt       model, optimizer, settings, iteration, loader position and the dataset's meta
    ckpt_NNNNNN.pt  the same at iteration NNNNNN, with save_every (for analysis; resuming reads ckpt.pt)
    lock          held by the process that writes the run, so that two runs never share a directory

Every file is written to a temporary name and renamed, so a crash or a full disk never leaves a broken one.
"""
import json
import os
import subprocess
from pathlib import Path

import filelock
import torch

from configurator import ConfigError

_held = {}  # run directory -> (its filelock.FileLock, [that lock's descriptor]) while this process holds it


def lock_run_dir(out):
    """Lock out/lock while this process writes the run: a second writer is refused, told which process holds
    it (the file's first line). filelock.FileLock is the operating system's lock: flock on Linux and macOS,
    LockFileEx on Windows. The OS releases it when the process ends, even by kill -9, so a stale lock never
    blocks the next run. Where there is no OS lock, FileLock is a marker file that names its process on the
    first line, and filelock takes it over once that process is gone."""
    key = os.path.realpath(out)
    if key in _held:  # already ours (several runs in one process, as in the tests)
        return
    path = os.path.join(out, "lock")
    fds, options = [], {}  # fds: the OS lock's own descriptor, once acquired; a marker file has none
    if filelock.FileLock is not filelock.SoftFileLock:  # an OS lock: the file is ours to write, and it stays
        options = dict(preserve_lock_file=True, on_acquired=fds.append)
    lock = filelock.FileLock(path, blocking=False, **options)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise ConfigError(f"{out} is in use by another run (process {_holder(path)}); wait for it to "
                          "finish or choose another --out_dir") from None
    for fd in fds:  # write through the lock's descriptor: on Windows the lock keeps other handles out
        previous = os.read(fd, 100).decode(errors="replace").strip()  # a run that finishes empties the file
        if previous and previous != str(os.getpid()):
            print(f"note: the previous run in {out} (process {previous}) stopped before finishing; "
                  "its lock went with it")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, str(os.getpid()).encode())
    _held[key] = lock, fds


def _holder(path):
    """The process id on the lock file's first line, or '?'."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip() or "?"
    except OSError:  # on Windows the holder's lock keeps others from reading the byte it locks
        return "?"


def unlock_run_dir(out):
    lock, fds = _held.pop(os.path.realpath(out), (None, []))
    for fd in fds:
        os.ftruncate(fd, 0)  # a run that finished leaves no process behind in the lock file
    if lock is not None:
        lock.release()


def atomic_write(path, write):
    """write(tmp_path), then rename: a crash or a full disk never leaves a broken file under the real name."""
    tmp = path + ".tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except Exception as e:  # OSError, and torch.save's RuntimeError when the disk fills up mid-file
        if os.path.isfile(tmp):
            os.remove(tmp)
        kept = "the previous one is intact" if os.path.isfile(path) else "nothing was written"
        reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        raise OSError(f"{reason} while writing {path}; {kept}") from None


def holds_a_run(out_dir):
    """Whether out_dir holds a run that a new one would destroy: a checkpoint, or a log that recorded any training.
    A run killed while starting up has logged only its "start" record: starting again there loses nothing."""
    if os.path.exists(os.path.join(out_dir, "ckpt.pt")):
        return True
    log = os.path.join(out_dir, "log.jsonl")
    if not os.path.isfile(log):
        return False
    with open(log, encoding="utf-8", errors="replace") as f:  # stray bytes in a log: still a log
        return any(line.strip() and not is_start_record(line) for line in f)


def is_start_record(line):
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("event") == "start"


def save_checkpoint(path, ckpt):
    atomic_write(path, lambda tmp: torch.save(ckpt, tmp))


def save_config(out_dir, settings):
    atomic_write(os.path.join(out_dir, "config.json"), lambda tmp: Path(tmp).write_text(json.dumps(settings, indent=1)))


# what a checkpoint holds, and the type of each entry: checked before anything uses it
CHECKPOINT = {"model": dict, "optimizer": dict, "model_args": dict, "iter_num": int, "best_val_loss": float,
              "tokens": int, "loader": dict, "meta": dict, "config": dict}


def load_checkpoint(path):
    if not os.path.isfile(path):
        raise ConfigError(f"no checkpoint at {path}; train a run there first (--init_from=scratch) "
                          "or point --out_dir at an existing run")
    try:  # weights_only: a checkpoint holds tensors, numbers, strings and dicts, never code to run
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(f"checkpoint {path} cannot be read safely ({e.__class__.__name__}): it is corrupt, "
                          "not a nanoCorridor checkpoint, or carries code") from None
    missing = set(CHECKPOINT) - set(ckpt) if isinstance(ckpt, dict) else set(CHECKPOINT)
    if missing:
        raise ConfigError(f"checkpoint {path} lacks {', '.join(sorted(missing))}; it was not written by this train.py")
    wrong = [k for k, kind in CHECKPOINT.items() if not isinstance(ckpt[k], kind) or isinstance(ckpt[k], bool)]
    if wrong or not {"epoch", "shard", "pos"} <= set(ckpt["loader"]) or "init_from" not in ckpt["config"]:
        raise ConfigError(f"checkpoint {path} has entries this train.py did not write ({', '.join(wrong) or 'loader, config'}); "
                          "it comes from another version or was edited")
    return ckpt


def trim_log(path, iter_num):
    """On resume, drop what the stopped run logged after its checkpoint (and its 'done'), so the log tells
    the one history that the resumed run continues. Only a last line cut off by a crash may be unreadable."""
    with open(path, "rb") as f:
        lines = [line for line in f if line.strip()]
    keep = []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            before = record["iter"] <= iter_num and record["event"] != "done"
        except (ValueError, TypeError, KeyError):  # not JSON, not UTF-8, not a record of ours
            if n == len(lines):
                break  # a line cut off by a crash
            raise ConfigError(f"{path}: line {n} is not a record train.py wrote; remove that line, then resume") from None
        if before:
            keep.append(line.rstrip(b"\n") + b"\n")
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(b"".join(keep)))


def git_commit():
    """The commit of the code that runs ('+' when tracked files differ from it), or None outside git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        git = lambda *args: subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10)
        sha, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("+" if dirty else "") if sha.returncode == 0 else None


class RunLog:
    """log.jsonl, one record per line, flushed at once: a killed run loses at most its last line. A resumed run
    first drops what was logged after its checkpoint (see trim_log) and appends from there."""

    def __init__(self, out_dir, resume_iter=None, wandb_run=None):
        path = os.path.join(out_dir, "log.jsonl")
        if resume_iter is not None and os.path.exists(path):
            trim_log(path, resume_iter)
        self.file = open(path, "w" if resume_iter is None else "a")
        self.wandb = None
        if wandb_run is not None:  # also send the numbers to Weights & Biases: wandb.init's arguments
            import wandb  # lazy: optional
            self.wandb = wandb
            wandb.init(**wandb_run)

    def write(self, record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.wandb is not None and record["event"] in ("train", "eval"):
            self.wandb.log(wandb_numbers(record), step=record["iter"])


def wandb_numbers(record):
    """A log record as wandb charts it: its numbers, and every head's γ and δ as gamma/L{layer}H{head}, ..."""
    numbers = {k: v for k, v in record.items() if k not in ("event", "gamma", "delta")}
    for name in ("gamma", "delta"):
        for layer, heads in enumerate(record.get(name, [])):
            for head, value in enumerate(heads):
                numbers[f"{name}/L{layer}H{head}"] = value
    return numbers
