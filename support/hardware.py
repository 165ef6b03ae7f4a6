"""
hardware.py: the machine a run uses and the processes on it: this process's Run (its place in a DDP
run, device, dtype, autocast context and printer), the DDP group, the model compiled and wrapped for
it, and CPU memory.
"""
import ctypes
import os
import re
from contextlib import nullcontext

import torch

from support.configurator import ConfigError, requires, why


def ddp_env():
    """(rank, local_rank, world_size) from the environment torchrun sets, or (0, None, 1) outside
    torchrun."""
    if "RANK" not in os.environ:
        return 0, None, 1
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])


def exit_status(e):
    """What sys.exit gets as this process stops on e: its one line, naming its rank under torchrun,
    so that a rank failing alone (a file damaged on one node, say) says why, not only torchrun's
    summary."""
    rank = os.environ.get("RANK", "0")
    return f"error: {e}" if rank == "0" else f"error: rank {rank}: {e}"


device_rule = requires(lambda value: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value),
                       "use auto, cpu, mps, cuda or cuda:N")


def pick_device(dev, local_rank=None):
    """(device, its type) for a device setting: auto is cuda > mps > cpu, without touching CUDA on a
    machine that has none; under torchrun, cuda is this process's GPU."""
    # in order of preference, for auto
    available = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available(), "cpu": True}
    if dev == "auto":
        dev = next(kind for kind, ok in available.items() if ok)
    if dev == "cuda" and local_rank is not None:
        dev = f"cuda:{local_rank}"
    device_type, _, index = dev.partition(":")  # an index: cuda's (device_rule)
    if not available[device_type]:
        raise ConfigError(f"device={dev!r} but this torch has no {device_type.upper()} or sees no such "
                          "device; use --device=cpu")
    if index and int(index) >= torch.cuda.device_count():
        raise ConfigError(f"device={dev!r} but this machine has {torch.cuda.device_count()} GPU(s): choose "
                          "one of them (under torchrun, start no more processes per node than GPUs)")
    return dev, device_type


def pick_device_and_dtype(cfg, local_rank):
    """(device, dtype): the device (pick_device) and its dtype: bf16 where the GPU computes it
    (sm_80 and newer; a T4, sm_75, only emulates it), else fp16 (with a grad scaler) on GPUs;
    float32 on CPU."""
    # as in nanoGPT, process LOCAL_RANK takes its own GPU
    if local_rank is not None and ":" in cfg.device:
        raise ConfigError(f"device={cfg.device!r} under torchrun would put every process on one GPU; use "
                          "--device=cuda: each process takes cuda:LOCAL_RANK")
    dev, device_type = pick_device(cfg.device, local_rank)
    if cfg.dtype == "auto" and device_type == "cuda":
        return dev, "bfloat16" if torch.cuda.get_device_capability(dev)[0] >= 8 else "float16"
    if device_type == "cpu" and cfg.dtype == "float16":
        raise ConfigError("dtype='float16' is not supported on CPU; use float32 or bfloat16")
    return dev, "float32" if cfg.dtype == "auto" else cfg.dtype


class Run:
    """This process's part of a run: its place among the DDP processes (local_rank: None outside
    torchrun), device, dtype and autocast context. say prints on the master; log writes log.jsonl,
    once rundir.start_run_dir has opened it (on the master, unless eval_only: it changes nothing on
    disk)."""

    def __init__(self, rank, local_rank, world_size, dev, dtype, eval_only=False):
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.dev, self.dtype = dev, dtype
        self.device_type = dev.split(":")[0]
        self.ctx = nullcontext()  # float32: no autocast
        if dtype != "float32":  # bf16/fp16 matmuls, float32 where precision needs it
            self.ctx = torch.autocast(self.device_type, dtype=getattr(torch, dtype))
        self.ddp = local_rank is not None  # started by torchrun
        self.master = rank == 0  # only the master prints
        self.writes = rank == 0 and not eval_only  # the process that writes the run directory
        self.run_log = None

    def say(self, *args):
        if self.master:
            print(*args)

    def log(self, record):
        if self.run_log is not None:
            self.run_log.write(record)

    def master_first(self, fn, *args):
        """fn(*args) on the master first, while the other processes wait; then on every process
        (preparing data once, say, which the others then find done): its result."""
        if self.master:
            fn(*args)
        if self.ddp:
            torch.distributed.barrier()
        return fn(*args)


def join_group(run):
    """init_process_group with env:// rendezvous, as nanoGPT starts it: rank 0's address and port
    come from the variables torchrun sets (which also reports a node that never starts); NCCL is
    bound to this process's GPU at once, so that its errors come here. The failure is one line."""
    backend, device_id = ("nccl", torch.device(run.dev)) if run.device_type == "cuda" else ("gloo", None)
    try:
        torch.distributed.init_process_group(backend, rank=run.rank, world_size=run.world_size,
                                             device_id=device_id)
    except RuntimeError as e:  # torch.distributed's errors (DistError) subclass it
        raise ConfigError(f"the DDP process group could not start ({why(e)}); check MASTER_ADDR, choose a "
                          "free MASTER_PORT and, on CPUs, check GLOO_SOCKET_IFNAME (a network interface "
                          "here)") from None


def start_process(cfg):
    """This process's Run, with the DDP group joined (if torchrun started it) and the seed set."""
    rank, local_rank, world_size = ddp_env()
    run = Run(rank, local_rank, world_size, *pick_device_and_dtype(cfg, local_rank), cfg.eval_only)
    if run.ddp:
        if run.device_type == "cuda":
            torch.cuda.set_device(run.dev)
        join_group(run)
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if run.device_type == "cpu":
        keep_freed_memory()  # fewer page faults per step
    return run


def compiled_wrapped_warmed(model, cfg, run):
    """torch.compile (None: on for CUDA, off elsewhere) and DDP; then one untimed forward and
    backward, whose gradients are dropped (no weight changes): compilation happens here, on batches
    shaped as the loop's."""
    if cfg.eval_only:  # evaluation runs the model as it is (the raw model: see the loop)
        return model
    if cfg.compile or (cfg.compile is None and run.device_type == "cuda"):
        run.say("compiling the model... (takes a minute)")
        model = torch.compile(model)
    if run.ddp:  # DDP syncs the gradients of the processes
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[run.local_rank] if run.device_type == "cuda" else None)
    # inputs and targets as the loop feeds them: two contiguous (B, T) tensors (one tensor for both
    # would compile a graph for aliased arguments, and the loop's first step would compile again)
    x = torch.zeros(cfg.batch_size, cfg.block_size, dtype=torch.long, device=run.dev)
    with run.ctx:
        model(x, torch.zeros_like(x))[1].backward()
    model.zero_grad(set_to_none=True)
    return model


def end_process():
    """Leave the DDP group, if this process joined one: at every exit, error or not (else torch
    warns)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# dense bf16 peak FLOP/s of common GPUs, for estimate_mfu
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L40": 181e12,
              "L4": 121e12, "A10G": 70e12, "A10": 125e12, "RTX 4090": 165e12, "RTX 3090": 71e12,
              "V100": 125e12, "T4": 65e12}


def peak_flops(device):
    """A GPU's entry in PEAK_FLOPS, matched in order against its name (an L40S is no L4); None on
    CPUs."""
    name = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else ""
    return next((flops for gpu, flops in PEAK_FLOPS.items() if gpu in name), None)


def keep_freed_memory():
    """Training on a CPU: let glibc keep the memory a step frees for the next, not page-fault it in
    again each step (docs/benchmarks.md; process-wide, from now on). False where the C library is
    not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, TypeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    # blocks below 32 MiB (glibc's largest threshold) come from the heap, and its free top stays
    # mapped
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20) and mallopt(M_TRIM_THRESHOLD, 1 << 30))
