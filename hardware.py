"""
hardware.py: what nanoCorridor needs to know about the machine it runs on, apart from the model.

- `peak_flops(device)`: the dense bf16 peak FLOP/s of the GPU in use, which `GPT.estimate_mfu` divides by;
- `keep_freed_memory()`: a process setting for training on a CPU (glibc's allocator, through ctypes).
"""
import ctypes

import torch

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
