"""
hardware.py: the machine a run uses and the processes on it, apart from the model.

- `ddp_env()`: this process's place in a DDP run, from the environment torchrun sets;
- `pick_device_and_dtype(cfg, local_rank)` and `start_process(cfg, local_rank)`: the device, its dtype and
  autocast context, and the DDP group;
- `peak_flops(device)`: the dense bf16 peak FLOP/s of the GPU in use, which `GPT.estimate_mfu` divides by;
- `keep_freed_memory()`: a process setting for training on a CPU (glibc's allocator, through ctypes).
"""
import ctypes
import os
from contextlib import nullcontext

import torch

from support.configurator import ConfigError, why


class RankError(ConfigError):
    """A failure of this process alone (its environment, its device): it says so itself, whatever its rank."""


USE_TORCHRUN = "start DDP runs with torchrun, which sets RANK, LOCAL_RANK and WORLD_SIZE (or unset RANK)"


def ddp_env():
    """(rank, local_rank, world_size) from the environment torchrun sets, or (0, None, 1) outside torchrun."""
    if "RANK" not in os.environ:
        return 0, None, 1
    values = []
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        text = os.environ.get(key)
        if text is None:
            raise RankError(f"RANK is set but {key} is not; {USE_TORCHRUN}")
        if not text.strip().isdigit():
            raise RankError(f"{key}={text!r} is not a whole number; {USE_TORCHRUN}")
        values.append(int(text))
    rank, local_rank, world_size = values
    port = os.environ.get("MASTER_PORT", "0")
    if not (port.strip().isdigit() and int(port) < 65536):
        raise RankError(f"MASTER_PORT={port!r} is not a port number (0-65535); {USE_TORCHRUN}")
    if not local_rank <= rank < world_size:
        raise RankError(f"RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world_size}: a process needs "
                        f"LOCAL_RANK ≤ RANK < WORLD_SIZE; {USE_TORCHRUN}")
    return rank, local_rank, world_size


def exit_status(e):
    """What sys.exit gets as this process stops on e: its one-line message, or 1 to stop silently. Every rank
    reads the same settings and files: such an error (a ValueError) is said once, by rank 0. A failure of
    one process alone (a RankError, an OSError, a loss that is not finite) is said by its rank."""
    rank = os.environ.get("RANK", "0")
    if rank == "0":
        return f"error: {e}"
    shared = isinstance(e, ValueError) and not isinstance(e, RankError)
    return 1 if shared else f"error: rank {rank}: {e}"


def device_rule(key, value):
    """The configurator's check of a device setting."""
    kind, _, index = value.partition(":")
    if value not in ("auto", "cpu", "mps", "cuda") and not (kind == "cuda" and index.isdigit()):
        raise ConfigError(f"{key}={value!r} is not allowed: use auto, cpu, mps, cuda or cuda:N")
    return value


def pick_device_and_dtype(cfg, local_rank):
    """cuda > mps > cpu, without touching CUDA on a machine that has none; bf16 where supported."""
    dev = cfg.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if dev == "cuda" and local_rank is not None:
        dev = f"cuda:{local_rank}"
    device_type = dev.split(":")[0]
    available = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available(), "cpu": True}
    if not available[device_type]:
        raise ConfigError(f"device={dev!r} but this torch has no {device_type.upper()} or sees no such "
                          "device; use --device=cpu")
    if device_type == "cuda" and ":" in dev and int(dev.split(":")[1]) >= torch.cuda.device_count():
        raise RankError(f"device={dev!r} but this machine has {torch.cuda.device_count()} GPU(s): start "
                        "no more processes per node than it has GPUs")
    dt = cfg.dtype
    if dt == "auto" and device_type == "cuda":
        dt = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    elif dt == "auto":
        dt = "float32"
    if device_type == "cpu" and dt == "float16":
        raise ConfigError("dtype='float16' is not supported on CPU; use float32 or bfloat16")
    return dev, device_type, dt


def start_process(cfg, local_rank):
    """The device, its dtype and autocast context; the DDP group when torchrun started us; the seed."""
    dev, device_type, dt = pick_device_and_dtype(cfg, local_rank)
    if local_rank is not None:
        from torch.distributed import init_process_group
        if device_type == "cuda":
            torch.cuda.set_device(dev)
        try:
            init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
        except (RuntimeError, ValueError, OSError) as e:  # torch.distributed's errors subclass these
            raise RankError(f"the DDP process group could not start ({why(e)}); check MASTER_ADDR, "
                            "MASTER_PORT and, on CPUs, GLOO_SOCKET_IFNAME (a network interface here)"
                            ) from None
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if device_type == "cpu":
        keep_freed_memory()  # fewer page faults per step
    ctx = nullcontext()
    if dt != "float32":
        ctx = torch.autocast(device_type, dtype=getattr(torch, dt))
    return dev, device_type, dt, ctx


def end_process(ddp):
    """Every rank reaches the end before the DDP group goes: gloo aborts a process whose peers are gone."""
    if ddp:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()

# dense bf16 peak FLOP/s of common GPUs, matched in this order against torch.cuda.get_device_name()
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L40": 181e12,
                   "L4": 121e12, "A10G": 70e12, "A10": 125e12, "RTX 4090": 165e12, "RTX 3090": 71e12,
                   "V100": 125e12, "T4": 65e12}


def peak_flops(device):
    """The dense bf16 peak FLOP/s of `device`: None on a CPU or a GPU not in the table."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def keep_freed_memory():
    """Training on a CPU: let glibc keep the memory a step frees for the next step (process-wide, from now
    on). By default it hands large freed blocks back to the OS and page-faults them in again: at nanoGPT's CPU
    size, 500-1800 faults and 1-3 ms of kernel time per 35 ms step. False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, TypeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    # blocks below 32 MiB (glibc's largest threshold) come from the heap, and its free top stays mapped
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20) and mallopt(M_TRIM_THRESHOLD, 1 << 30))
