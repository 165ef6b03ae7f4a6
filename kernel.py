"""
Fused causal "mix attention" in Triton: for every head h,

    out = a[h]·v + b[h]·P·v,    P = causal softmax(q·kᵀ/√D)

computed flash-attention style, i.e. without ever storing the T×T matrix P. The a·v term costs nothing extra:
the forward adds it while writing the output tile. The backward is flash-attention-2: recompute P tile by tile
from the saved logsumexp and return gradients for q, k, v, a and b.

    from kernel import mix_attention, usable
    out = mix_attention(q, k, v, a, b)   # q, k, v: (B, H, T, D), any strides with a unit last one; a, b: (H,)
    usable(q.device, q.dtype, D)         # impl='auto': does the kernel compile and run here? (warns once if not)

Outputs and gradients are (B, H, T, D) views of (B, T, H, D) memory, the layout the model re-assembles heads in.
Like SDPA's flash backward, dq is summed with fp32 atomics, so its last bits vary from run to run on a GPU.

Run `python kernel.py`: on a GPU it checks fp32/fp16/bf16 against float64, times the kernel against PyTorch
SDPA and runs `bench.py --gpt2_step`; on a CPU it runs a short self-check under the Triton interpreter
(TRITON_INTERPRET=1, set automatically) and says that timing needs a GPU.
"""
import math
import os
import subprocess
import sys
import warnings

import torch
import torch.nn.functional as F

if __name__ == "__main__" and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must happen before triton kernels are defined

import triton
import triton.language as tl
from triton.testing import do_bench

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
POISON = False  # tests set this: outputs start as NaN, so any element a kernel forgets to write shows up
FORCE_CONFIG = None  # tests set this to {"fwd": cfg, "bwd": cfg} to run one particular launch config
HEAD_DIMS = (16, 32, 64, 128)
PRE_BLOCK = 64  # rows per program of the backward's small pre-pass
LOG2E = 1.4426950408889634  # we use exp2 (fast on GPUs): e^x = 2^(x·log2 e)

# -----------------------------------------------------------------------------
# Triton kernels. A program handles one tile of BLOCK_M query rows (forward) or BLOCK_N key rows (backward) of
# one (batch, head), looping over the tiles of the other side. q, k, v share their strides (stride_b, stride_h,
# stride_t; the last one is 1). Everything the kernels write per row (out, pv, dq, dk, dv) and dout live in
# (B, T, H, D) memory: row t of head h of batch b starts at ((b·T + t)·H + h)·D.


@triton.jit
def _load_rows(ptr, rows, T, stride_t, D: tl.constexpr):  # (len(rows), D) tile; rows past T read as zeros
    return tl.load(ptr + rows[:, None] * stride_t + tl.arange(0, D)[None, :], mask=rows[:, None] < T, other=0.0)


@triton.jit
def _store_rows(ptr, rows, x, T, stride_t, D: tl.constexpr):
    tl.store(ptr + rows[:, None] * stride_t + tl.arange(0, D)[None, :], x.to(ptr.dtype.element_ty), mask=rows[:, None] < T)


@triton.jit
def _fwd_tiles(acc, l, m, q, K, V, rows, lo, hi, T, stride_t, qk_scale,
               D: tl.constexpr, BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr, PREC: tl.constexpr):
    # Online softmax over key tiles lo..hi. For each query row we keep, over the keys seen so far:
    #   m   = running max of the scores (for numerical stability: exp of anything ≤ m is ≤ 1)
    #   l   = running sum of exp(score - m)
    #   acc = running sum of exp(score - m)·v_j
    # When a new key tile raises the max from m to m_new, everything accumulated so far was measured against
    # the old max, so we rescale it by exp(m - m_new). At the end acc / l is exactly softmax(scores)·v.
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        k = _load_rows(K, keys, T, stride_t, D)  # (BLOCK_N, D)
        v = _load_rows(V, keys, T, stride_t, D)  # (BLOCK_N, D)
        s = tl.dot(q, tl.trans(k), input_precision=PREC)  # (BLOCK_M, BLOCK_N) scores, times qk_scale below
        if DIAGONAL:  # only tiles that straddle the diagonal need the causal mask (it also hides keys ≥ T)
            s = tl.where(keys[None, :] <= rows[:, None], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)  # (BLOCK_M,) in log2 units; finite: key 0 comes first
        p = tl.exp2(s * qk_scale - m_new[:, None])  # (BLOCK_M, BLOCK_N) unnormalised probabilities
        rescale = tl.exp2(m - m_new)  # (BLOCK_M,); 0 on the first tile, where m = -inf
        l = l * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)  # (BLOCK_M, D)
        m = m_new
    return acc, l, m


@triton.jit(do_not_specialize=["T"])
def _fwd_kernel(Q, K, V, A, Bc, Out, PV, LSE, T, H, stride_b, stride_h, stride_t, qk_scale,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(0)  # B·H on axis 0, which has no 65535 limit
    start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M  # the longest rows start first
    b_idx, h = bh // H, bh % H
    qkv = b_idx.to(tl.int64) * stride_b + h * stride_h  # this head in q, k, v
    own = (b_idx.to(tl.int64) * T * H + h) * D  # this head in out, pv: (B, T, H, D) memory
    rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    q = _load_rows(Q + qkv, rows, T, stride_t, D)  # (BLOCK_M, D)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # (BLOCK_M,)
    l = tl.zeros([BLOCK_M], tl.float32)  # (BLOCK_M,)
    acc = tl.zeros([BLOCK_M, D], tl.float32)  # (BLOCK_M, D)
    # keys before this tile's first row are visible to all its rows: no mask. Then the diagonal tiles, masked.
    acc, l, m = _fwd_tiles(acc, l, m, q, K + qkv, V + qkv, rows, 0, start_m, T, stride_t, qk_scale,
                           D, BLOCK_N, False, PREC)
    acc, l, m = _fwd_tiles(acc, l, m, q, K + qkv, V + qkv, rows, start_m, tl.minimum(start_m + BLOCK_M, T), T,
                           stride_t, qk_scale, D, BLOCK_N, True, PREC)
    pv = acc / l[:, None]  # (BLOCK_M, D) = P·v for these rows
    a, b = tl.load(A + h).to(tl.float32), tl.load(Bc + h).to(tl.float32)
    v_own = _load_rows(V + qkv, rows, T, stride_t, D).to(tl.float32)  # (BLOCK_M, D) the I·v term
    _store_rows(Out + own, rows, a * v_own + b * pv, T, H * D, D)
    _store_rows(PV + own, rows, pv, T, H * D, D)
    tl.store(LSE + bh.to(tl.int64) * T + rows, m + tl.log2(l), mask=rows < T)  # log2-sum-exp2 of the scores


# Backward. With out = a·v + b·PV and dout the gradient of out, the gradient reaching PV is b·dout, so
#   dv = a·dout + b·Pᵀ·dout,   da = Σ dout∘v,   db = Σ dout∘PV,
# and for the scores s = q·kᵀ/√D (flash-attention-2): dP = b·dout·vᵀ, dS = P∘(dP - Δ) with the row sums
#   Δ_i = Σ_j P_ij·dP_ij = b·rowsum(dout∘PV)_i,   then  dq = dS·k/√D,  dk = dSᵀ·q/√D.
# Δ, da and db are O(T·D): a small kernel computes them first. The main kernel then holds one key tile and
# walks the query tiles that can see it, computing Pᵀ and dPᵀ directly (sᵀ = k·qᵀ) so nothing is transposed
# in registers: 5 matmuls per tile, dk and dv summed in registers, dq added to an fp32 buffer with atomics.


@triton.jit(do_not_specialize=["T"])
def _bwd_pre_kernel(DO, PV, V, Bc, Delta, DQ, Sums, T, H, stride_b, stride_h, stride_t, sm_scale,
                    D: tl.constexpr, BLOCK: tl.constexpr):
    bh, pid = tl.program_id(0), tl.program_id(1)
    b_idx, h = bh // H, bh % H
    own = (b_idx.to(tl.int64) * T * H + h) * D
    rows = pid * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
    do = _load_rows(DO + own, rows, T, H * D, D).to(tl.float32)  # (BLOCK, D)
    pv = _load_rows(PV + own, rows, T, H * D, D).to(tl.float32)  # (BLOCK, D)
    v = _load_rows(V + b_idx.to(tl.int64) * stride_b + h * stride_h, rows, T, stride_t, D).to(tl.float32)
    r = tl.sum(do * pv, 1)  # (BLOCK,) rowsum(dout∘PV)
    tl.store(Delta + bh.to(tl.int64) * T + rows, tl.load(Bc + h).to(tl.float32) * sm_scale * r, mask=rows < T)
    _store_rows(DQ + own, rows, tl.zeros([BLOCK, D], tl.float32), T, H * D, D)  # zero the dq accumulator
    sums = Sums + bh * tl.num_programs(1) + pid  # this program's share of da[h], then of db[h]
    tl.store(sums, tl.sum(tl.sum(do * v, 1), 0))
    tl.store(sums + tl.num_programs(0) * tl.num_programs(1), tl.sum(r, 0))


@triton.jit
def _bwd_tiles(dk, dv, k, v, Q, DO, DQ, LSE, Delta, keys, lo, hi, T, HD, stride_t, qk_scale, dp_scale,
               D: tl.constexpr, BLOCK_M: tl.constexpr, DIAGONAL: tl.constexpr, PREC: tl.constexpr):
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
        q = _load_rows(Q, rows, T, stride_t, D)  # (BLOCK_M, D)
        do = _load_rows(DO, rows, T, HD, D)  # (BLOCK_M, D)
        lse = tl.load(LSE + rows, mask=rows < T, other=float("inf"))  # (BLOCK_M,); rows past T get P = 0
        delta = tl.load(Delta + rows, mask=rows < T, other=0.0)  # (BLOCK_M,) Δ/√D
        pT = tl.exp2(tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale - lse[None, :])  # (BLOCK_N, BLOCK_M)
        if DIAGONAL:
            pT = tl.where(keys[:, None] <= rows[None, :], pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do, input_precision=PREC)  # (BLOCK_N, D) Pᵀ·dout
        dpT = tl.dot(v, tl.trans(do), input_precision=PREC)  # (BLOCK_N, BLOCK_M) (dout·vᵀ)ᵀ
        dsT = pT * (dp_scale * dpT - delta[None, :])  # (BLOCK_N, BLOCK_M) dSᵀ/√D  (dp_scale = b/√D)
        dk += tl.dot(dsT.to(q.dtype), q, input_precision=PREC)  # (BLOCK_N, D)
        dqT = tl.dot(tl.trans(k), dsT.to(k.dtype), input_precision=PREC)  # (D, BLOCK_M) this key tile's share of dq
        tl.atomic_add(DQ + rows[None, :] * HD + tl.arange(0, D)[:, None], dqT, mask=rows[None, :] < T, sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=["T"])
def _bwd_kernel(Q, K, V, A, Bc, DO, LSE, Delta, DQ, DK, DV, T, H, stride_b, stride_h, stride_t, qk_scale, sm_scale,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    bh, start_n = tl.program_id(0), tl.program_id(1) * BLOCK_N  # early key tiles see the most rows: they start first
    b_idx, h = bh // H, bh % H
    qkv = b_idx.to(tl.int64) * stride_b + h * stride_h
    own = (b_idx.to(tl.int64) * T * H + h) * D
    keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    k = _load_rows(K + qkv, keys, T, stride_t, D)  # (BLOCK_N, D)
    v = _load_rows(V + qkv, keys, T, stride_t, D)  # (BLOCK_N, D)
    a, b = tl.load(A + h).to(tl.float32), tl.load(Bc + h).to(tl.float32)
    dk = tl.zeros([BLOCK_N, D], tl.float32)  # (BLOCK_N, D) dSᵀ·q/√D
    dv = tl.zeros([BLOCK_N, D], tl.float32)  # (BLOCK_N, D) Pᵀ·dout; times b at the end
    Q, DO, DQ, LSE, Delta = Q + qkv, DO + own, DQ + own, LSE + bh.to(tl.int64) * T, Delta + bh.to(tl.int64) * T
    # the query tiles on the diagonal need the causal mask; all later rows see every key of this tile
    dk, dv = _bwd_tiles(dk, dv, k, v, Q, DO, DQ, LSE, Delta, keys, start_n, tl.minimum(start_n + BLOCK_N, T), T,
                        H * D, stride_t, qk_scale, b * sm_scale, D, BLOCK_M, True, PREC)
    dk, dv = _bwd_tiles(dk, dv, k, v, Q, DO, DQ, LSE, Delta, keys, start_n + BLOCK_N, T, T,
                        H * D, stride_t, qk_scale, b * sm_scale, D, BLOCK_M, False, PREC)
    do_own = _load_rows(DO, keys, T, H * D, D).to(tl.float32)  # the a·I path
    _store_rows(DV + own, keys, a * do_own + b * dv, T, H * D, D)
    _store_rows(DK + own, keys, dk, T, H * D, D)

# -----------------------------------------------------------------------------
# PyTorch side: launch configs and their lazy autotuning, custom ops (so torch.compile treats the kernel as
# one opaque op), input checks, and usable() for impl='auto'.


def configs(kind, D, hopper=True):
    """Every launch config (BLOCK_M, BLOCK_N, num_warps, num_stages) a GPU may use: in bf16 and fp16 each
    compiles for its architecture (sm_90 if hopper, else sm_80) within shared memory and without register
    spills (test_compiles_for_hopper_and_ampere_without_spills). The last one is small enough for fp32."""
    if kind == "fwd":  # BLOCK_N divides BLOCK_M: the diagonal is whole key tiles
        return [(128, 64, 8, 3), (128, 128, 8, 3 if D <= 64 else 2) if hopper else (64, 64, 4, 3), (64, 32, 4, 2)]
    if hopper:  # BLOCK_M divides BLOCK_N; BLOCK_M ≥ 32 and D ≥ 64 keep every matmul on Hopper's wgmma
        return [(64, 128, 8, 2), (64, 64, 8, 2), (32, 128, 8, 2)] if D <= 64 else [(64, 64, 8, 2), (32, 128, 8, 2), (32, 64, 8, 2)]
    return [(32, 128, 8, 3), (32, 64, 4, 2)] if D <= 64 else [(16, 64, 8, 2), (16, 32, 4, 2)]


INTERPRET_CONFIGS = {"fwd": (32, 16, 4, 1), "bwd": (16, 32, 4, 1)}  # small, unequal tiles: quick on CPU
_tuned = {}  # (kind, device, D, dtype, precision, bucket of T) -> fastest config, measured on first use


def _pick(kind, q, prec, launch):
    """The config to launch with: under the interpreter the small one; on a GPU the fastest of configs(), timed
    once per (device, D, dtype, T up to the next power of 2, capped at 8192); configs that fail are skipped."""
    if FORCE_CONFIG is not None or INTERPRET:
        return (FORCE_CONFIG or INTERPRET_CONFIGS)[kind]
    key = (kind, q.device, q.shape[-1], q.dtype, prec, min(triton.next_power_of_2(q.shape[2]), 8192))
    if key not in _tuned:
        times, error = {}, None
        for cfg in configs(kind, q.shape[-1], torch.cuda.get_device_capability(q.device)[0] >= 9):
            try:
                times[cfg] = do_bench(lambda: launch(cfg), warmup=5, rep=20)
            except Exception as e:  # e.g. out of shared memory on a smaller GPU
                error = e
        if not times:
            raise error
        _tuned[key] = min(times, key=times.get)
    return _tuned[key]


def _kw(cfg):
    return dict(BLOCK_M=cfg[0], BLOCK_N=cfg[1], num_warps=cfg[2], num_stages=cfg[3])


def _prec(q):  # fp32 follows torch's TF32 switch; 16-bit dots ignore it
    return "tf32" if q.dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _new(q, dtype=None):  # (B, H, T, D) view of fresh (B, T, H, D) memory
    B, H, T, D = q.shape
    x = q.new_empty((B, T, H, D), dtype=dtype or q.dtype).transpose(1, 2)
    return x.fill_(float("nan")) if POISON else x


def _qkv(q, k, v):  # the kernels take one set of strides for q, k, v, with a unit last stride
    if q.stride() == k.stride() == v.stride() and q.stride(-1) == 1:
        return q, k, v
    return q.contiguous(), k.contiguous(), v.contiguous()


@torch.library.custom_op("nanocorridor::mix_attention_fwd", mutates_args=())
def _mix_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = _qkv(q, k, v)
    B, H, T, D = q.shape
    out, pv = _new(q), _new(q)
    lse = q.new_empty((B, H, T), dtype=torch.float32)
    prec = _prec(q)

    def launch(cfg):
        _fwd_kernel[(B * H, triton.cdiv(T, cfg[0]))](q, k, v, a.contiguous(), b.contiguous(), out, pv, lse, T, H,
                                                     *q.stride()[:3], LOG2E / math.sqrt(D), D=D, PREC=prec, **_kw(cfg))
    launch(_pick("fwd", q, prec, launch))
    return out, pv, lse  # (B, H, T, D) mixed output, (B, H, T, D) P·v, (B, H, T) log2-sum-exp2 of the scores


@_mix_fwd.register_fake  # shapes and strides only, for torch.compile: the same as the real op's
def _(q, k, v, a, b):
    return _new(q), _new(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("nanocorridor::mix_attention_bwd", mutates_args=())
def _mix_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
             b: torch.Tensor, pv: torch.Tensor, lse: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = _qkv(q, k, v)
    B, H, T, D = q.shape
    if dout.stride() != pv.stride() or dout.dtype != q.dtype:  # in the model dout already has pv's layout
        dout = _new(q).copy_(dout)
    a, b = a.contiguous(), b.contiguous()
    dq, dk, dv = _new(q, torch.float32), _new(q), _new(q)  # dq: an fp32 accumulator
    delta = q.new_empty((B, H, T), dtype=torch.float32)
    sums = q.new_empty((2, B, H, triton.cdiv(T, PRE_BLOCK)), dtype=torch.float32)
    prec, strides, scale = _prec(q), q.stride()[:3], 1.0 / math.sqrt(D)

    def launch(cfg):
        _bwd_kernel[(B * H, triton.cdiv(T, cfg[1]))](q, k, v, a, b, dout, lse, delta, dq, dk, dv, T, H, *strides,
                                                     LOG2E * scale, scale, D=D, PREC=prec, **_kw(cfg))
    cfg = _pick("bwd", q, prec, launch)  # may time launch() on unset buffers: the pre-pass below resets them
    _bwd_pre_kernel[(B * H, triton.cdiv(T, PRE_BLOCK))](dout, pv, v, b, delta, dq, sums, T, H, *strides, scale, D=D,
                                                         BLOCK=PRE_BLOCK)
    launch(cfg)
    da, db = sums[0].sum((0, 2)).to(a.dtype), sums[1].sum((0, 2)).to(b.dtype)  # (H,): in a fixed order
    return dq.to(q.dtype), dk, dv, da, db


@_mix_bwd.register_fake
def _(dout, q, k, v, a, b, pv, lse):
    return _new(q), _new(q), _new(q), a.new_empty(a.shape), b.new_empty(b.shape)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output[1], output[2])  # q, k, v, a, b, PV, LSE


def _backward(ctx, dout, _d_pv, _d_lse):  # PV and LSE are internal outputs; only `out` gets gradients
    return _mix_bwd(dout, *ctx.saved_tensors)


_mix_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check_inputs(q, k, v, a, b):
    for name, x in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"mix_attention: {name} must be a torch.Tensor, got {type(x).__name__}.")
    if q.dim() != 4:
        raise ValueError(f"mix_attention: q, k, v must be 4-D (B, H, T, D), got q with shape {tuple(q.shape)}.")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"mix_attention: q, k, v must have the same shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}.")
    B, H, T, D = q.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"mix_attention: head dim D must be one of {HEAD_DIMS}, got {D}.")
    if T < 1 or B < 1 or H < 1:
        raise ValueError(f"mix_attention: B, H, T must be at least 1, got shape {tuple(q.shape)}.")
    for name, x in (("a", a), ("b", b)):
        if x.dim() != 1 or x.shape[0] != H:
            raise ValueError(f"mix_attention: {name} must be 1-D of length H={H}, got shape {tuple(x.shape)}.")
        if not x.is_floating_point():
            raise ValueError(f"mix_attention: {name} must be a floating-point tensor, got {x.dtype}.")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"mix_attention: q, k, v must share one dtype among float16, bfloat16, float32, "
                         f"got {q.dtype}, {k.dtype}, {v.dtype}.")
    if len({x.device for x in (q, k, v, a, b)}) != 1:
        raise ValueError(f"mix_attention: q, k, v, a, b must be on one device, got "
                         f"{[str(x.device) for x in (q, k, v, a, b)]}.")
    if q.device.type == "cpu" and not INTERPRET:
        raise ValueError("mix_attention: CPU tensors need TRITON_INTERPRET=1 set before kernel.py is imported.")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"mix_attention: tensors must be on cuda (or cpu under the interpreter), got {q.device}.")


def mix_attention(q, k, v, a, b):
    """out = a·v + b·causal_softmax(q·kᵀ/√D)·v per head. q, k, v: (B, H, T, D); a, b: (H,). Differentiable."""
    _check_inputs(q, k, v, a, b)
    return _mix_fwd(q, k, v, a, b)[0]  # (B, H, T, D)


_usable = {}  # (device, dtype, head size) -> bool


@torch.compiler.assume_constant_result  # torch.compile calls it once while tracing and keeps the answer
def usable(device, dtype, head_dim) -> bool:
    """For impl='auto': True if the fused kernel compiles and runs forward and backward here. The first call
    per (device, dtype, head size) tries it on a small input; on any error it warns once, in one line, and
    answers False from then on, so the model uses SDPA instead. Never raises."""
    key = (str(device), dtype, int(head_dim))
    if key not in _usable:
        if key[2] not in HEAD_DIMS:
            _usable[key] = False  # not an error: the kernel is just not built for this head size
            return False
        try:
            with torch.enable_grad():
                x = torch.randn(1, 70, 3, 2, key[2], device=device).to(dtype).transpose(1, 3)  # model-like views
                q, k, v = (t.detach().requires_grad_() for t in x.unbind(2))
                a, b = (torch.tensor(c, device=device, dtype=dtype, requires_grad=True) for c in ([0.5, 0], [1, -1]))
                out = mix_attention(q, k, v, a, b)
                grads = torch.autograd.grad(out.float().square().sum(), (q, k, v, a, b))
            if not all(torch.isfinite(t).all() for t in (out, *grads)):
                raise FloatingPointError("non-finite output or gradient")
            _usable[key] = True
        except Exception as e:
            warnings.warn(f"kernel.usable: the fused Triton kernel failed on {key[0]}, {dtype}, head size {key[2]} "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); using SDPA instead.")
            _usable[key] = False
    return _usable[key]

# -----------------------------------------------------------------------------
# python kernel.py: correctness against float64 everywhere; timing on a GPU.


def model_inputs(B, H, T, D, dtype, device, seed=0):
    """q, k, v as the model makes them (transposed views of one (B, T, 3·H·D) tensor), a, b, and dout."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, 3 * H * D, generator=g).to(device, dtype)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in x.split(H * D, dim=2))  # (B, H, T, D)
    a, b = torch.linspace(0, 1, H, device=device), torch.linspace(1, -1, H, device=device)  # attention ... Laplacian
    dout = torch.randn(B, T, H, D, generator=g).to(device, dtype).transpose(1, 2)
    return (q, k, v, a, b), dout


def reference(q, k, v, a, b):  # a different computation: PyTorch's SDPA plus the identity term
    H = q.shape[1]
    return a.view(1, H, 1, 1) * v + b.view(1, H, 1, 1) * F.scaled_dot_product_attention(q, k, v, is_causal=True)


def check(dtypes, Ts, B=2, H=4, D=64):
    """Max error of out and the five gradients relative to the float64 value's largest magnitude."""
    tols, all_ok = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 3e-2}, True
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"correctness against float64 (B={B}, H={H}, D={D}, model-layout views; error = max|x - ref| / max|ref|)")
    print("| dtype | T | out | dq | dk | dv | da | db | tolerance | result |\n|---|---|---|---|---|---|---|---|---|---|")
    for dtype in dtypes:
        for T in Ts:
            inputs, dout = model_inputs(B, H, T, D, dtype, device, seed=T)
            leaves = [x.detach().requires_grad_() for x in inputs]
            out = mix_attention(*leaves)
            got = (out, *torch.autograd.grad(out, leaves, dout))
            ref_leaves = [x.detach().double().requires_grad_() for x in inputs]
            ref = reference(*ref_leaves)
            want = (ref, *torch.autograd.grad(ref, ref_leaves, dout.double()))
            errs = [((x.double() - r).abs().max() / r.abs().max().clamp_min(1e-3)).item() for x, r in zip(got, want)]
            ok = all(e <= tols[dtype] for e in errs)  # NaN fails too
            all_ok &= ok
            print(f"| {str(dtype)[6:]} | {T} | " + " | ".join(f"{e:.1e}" for e in errs) +
                  f" | {tols[dtype]:.0e} | {'pass' if ok else 'FAIL'} |")
    return all_ok


def benchmark():
    BH, H, dt = 96, 12, torch.bfloat16
    print(f"\ntiming (bf16, B·H = {BH}, median ms of triton.testing.do_bench, {torch.cuda.get_device_name()})")
    print("| D | T | fused fwd | SDPA fwd | SDPA+epilogue fwd | fused fwd+bwd | SDPA fwd+bwd | SDPA+epilogue fwd+bwd |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for D in (64, 128):
        for T in (1024, 2048, 4096):
            (q, k, v, a, b), dout = model_inputs(BH // H, H, T, D, dt, "cuda")
            leaves = [x.detach().requires_grad_() for x in (q, k, v, a, b)]
            q, k, v, a, b = leaves
            A, Bv = (lambda: a.to(dt).view(H, 1, 1)), (lambda: b.to(dt).view(H, 1, 1))
            methods = [lambda: mix_attention(q, k, v, a, b),
                       lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                       lambda: A() * v + Bv() * F.scaled_dot_product_attention(q, k, v, is_causal=True)]
            fwd = [do_bench(f, return_mode="median") for f in methods]
            fb = [do_bench(lambda: f().backward(dout), grad_to_none=leaves, return_mode="median") for f in methods]
            print(f"| {D} | {T} | " + " | ".join(f"{t:.3f}" for t in fwd + fb) + " |")
            ratios.append((D, T, fwd[0] / fwd[1], fwd[0] / fwd[2], fb[0] / fb[1], fb[0] / fb[2]))
    print("\nratios (fused time / other time; targets: fwd+bwd ≤ 1.10× SDPA, ≤ 1.0× SDPA+epilogue, fwd ≤ 1.0× SDPA)")
    print("| D | T | fwd / SDPA | fwd / SDPA+epi | fwd+bwd / SDPA | fwd+bwd / SDPA+epi | targets |")
    print("|---|---|---|---|---|---|---|")
    for D, T, r1, r2, r3, r4 in ratios:
        ok = r1 <= 1.0 and r2 <= 1.0 and r3 <= 1.10 and r4 <= 1.0
        print(f"| {D} | {T} | {r1:.2f} | {r2:.2f} | {r3:.2f} | {r4:.2f} | {'pass' if ok else 'FAIL'} |")


if __name__ == "__main__":
    if torch.cuda.is_available():
        check((torch.float32, torch.float16, torch.bfloat16), (1, 1000, 2048))
        benchmark()
        print("\ncompiled GPT-2-small training step, impl=triton against impl=sdpa (bench.py --gpt2_step):", flush=True)
        subprocess.run([sys.executable, "bench.py", "--gpt2_step"], cwd=os.path.dirname(os.path.abspath(__file__)))
    else:
        passed = check((torch.float32, torch.float16), (1, 77), D=32)
        print("self-check", "passed" if passed else "FAILED")
        print("timing needs a GPU: on this CPU machine only the correctness self-check ran (Triton interpreter).")
