"""
Fused causal "mix attention" in Triton: for every head h,

    out = a[h]·v + b[h]·P·v,    P = causal softmax(q·kᵀ/√D)

computed flash-attention style, without ever storing the T×T matrix P; the forward adds the
a·v term while writing the output tile. The backward is flash-attention-2: recompute P tile by
tile from the saved logsumexp.

    out = mix_attention(q, k, v, a, b)   # q, k, v: (B, H, T, D), any strides, a unit last one; a, b: (H,)

The launch configs come from a fixed table per GPU generation (NVIDIA sm_80 or newer; older GPUs and
ROCm are refused), and on a CPU, under TRITON_INTERPRET=1, from the interpreter's small ones.
Outputs and gradients are (B, H, T, D) views of (B, T, H, D) memory, where the model re-assembles
the heads. Like SDPA's flash backward, dq is summed with fp32 atomics: its last bits vary. This file
imports only torch and triton. Its checks, against float64 in every launch config this machine may
use: python -m support.kernel_check
"""
import contextlib
import math
import os

import torch
# torch.library.custom_op with list[int] arguments needs torch 2.8
if tuple(int(n) for n in torch.__version__.split(".")[:2]) < (2, 8):
    raise ImportError(f"the fused kernel needs torch >= 2.8 (pip install -U torch), this is torch "
                      f"{torch.__version__}; use impl=sdpa")
import triton
import triton.language as tl
from torch import Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# tests set this: outputs start as NaN, so any element a kernel forgets to write shows up
POISON = False
HEAD_DIMS = (16, 32, 64, 128)
PRE_BLOCK = 64  # rows per program of the backward's pre-pass
LOG2E = 1.4426950408889634  # we use exp2 (fast on GPUs): e^x = 2^(x·log2 e)

# -----------------------------------------------------------------------------
# Triton kernels. A program handles one tile of BLOCK_M query rows (forward) or BLOCK_N key rows
# (backward) of one (batch, head) and loops over the tiles of the other side. q, k, v share
# their strides (stride_b, stride_h, stride_t; the last one is 1: _qkv copies them where they do
# not). What the kernels write per row (out, pv, dq, dk, dv) and dout live in (B, T, H, D)
# memory: row t of head h in batch b starts at ((b·T + t)·H + h)·D.


@triton.jit
def _load_rows(ptr, rows, T, stride, D: tl.constexpr):  # (len(rows), D) tile; rows past T read as 0
    return tl.load(ptr + rows[:, None] * stride + tl.arange(0, D)[None, :], mask=rows[:, None] < T,
                   other=0.0)


@triton.jit
def _store_rows(ptr, rows, x, T, stride, D: tl.constexpr):
    tl.store(ptr + rows[:, None] * stride + tl.arange(0, D)[None, :], x.to(ptr.dtype.element_ty),
             rows[:, None] < T)


@triton.jit
def _fwd_tiles(acc, l, m, q, K, V, rows, lo, hi, T, stride_t, qk_scale,
               D: tl.constexpr, BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr, PREC: tl.constexpr):
    # Online softmax over the key tiles lo..hi. For each query row we keep, over the keys seen:
    #   m   = running max of the scores (for numerical stability: exp of anything ≤ m is ≤ 1)
    #   l   = running sum of exp(score - m)
    #   acc = running sum of exp(score - m)·v_j
    # When a new key tile raises the max from m to m_new, everything accumulated so far
    # was measured against the old max, so we rescale it by exp(m - m_new). At the end acc
    # / l is exactly softmax(scores)·v.
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        k = _load_rows(K, keys, T, stride_t, D)  # (BLOCK_N, D)
        v = _load_rows(V, keys, T, stride_t, D)  # (BLOCK_N, D)
        # (BLOCK_M, BLOCK_N) scores, times qk_scale below
        s = tl.dot(q, tl.trans(k), input_precision=PREC)
        if DIAGONAL:  # only the tiles on the diagonal need the causal mask (it also hides keys ≥ T)
            s = tl.where(keys[None, :] <= rows[:, None], s, float("-inf"))
        # (BLOCK_M,) in log2 units; finite: key 0 comes first
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])  # (BLOCK_M, BLOCK_N) unnormalised probabilities
        rescale = tl.exp2(m - m_new)  # (BLOCK_M,); 0 on the first tile, where m = -inf
        l = l * rescale + tl.sum(p, 1)
        # (BLOCK_M, D)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m = m_new
    return acc, l, m


@triton.jit(do_not_specialize=["T"])
def _fwd_kernel(Q, K, V, A, Bc, Out, PV, LSE, T, H, stride_b, stride_h, stride_t, qk_scale,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(0)  # B·H on grid axis 0, which has no 65535 limit
    start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M  # the longest rows start first
    b_idx, h = bh // H, bh % H
    qkv = b_idx.to(tl.int64) * stride_b + h * stride_h  # this head in q, k, v
    own = (b_idx.to(tl.int64) * T * H + h) * D  # this head in out, pv
    rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    Q, K, V = Q + qkv, K + qkv, V + qkv
    q = _load_rows(Q, rows, T, stride_t, D)  # (BLOCK_M, D)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # (BLOCK_M,)
    # (BLOCK_M,), (BLOCK_M, D)
    l, acc = tl.zeros([BLOCK_M], tl.float32), tl.zeros([BLOCK_M, D], tl.float32)
    # keys before the tile's first row are visible to all its rows: no mask.
    # Then the diagonal tiles, masked.
    acc, l, m = _fwd_tiles(acc, l, m, q, K, V, rows, 0, start_m, T, stride_t, qk_scale,
                           D, BLOCK_N, False, PREC)
    hi = tl.minimum(start_m + BLOCK_M, T)
    acc, l, m = _fwd_tiles(acc, l, m, q, K, V, rows, start_m, hi, T, stride_t, qk_scale,
                           D, BLOCK_N, True, PREC)
    pv = acc / l[:, None]  # (BLOCK_M, D) = P·v for these rows
    a, b = tl.load(A + h).to(tl.float32), tl.load(Bc + h).to(tl.float32)
    v_own = _load_rows(V, rows, T, stride_t, D).to(tl.float32)  # (BLOCK_M, D) the I·v term
    _store_rows(Out + own, rows, a * v_own + b * pv, T, H * D, D)
    _store_rows(PV + own, rows, pv, T, H * D, D)
    # log2-sum-exp2 of the scores
    tl.store(LSE + bh.to(tl.int64) * T + rows, m + tl.log2(l), mask=rows < T)


# Backward. With out = a·v + b·PV and dout the gradient of out, PV's gradient is b·dout, so
#   dv = a·dout + b·Pᵀ·dout,   da = Σ dout∘v,   db = Σ dout∘PV,
# and for the scores s = q·kᵀ/√D (flash-attention-2): dP = b·dout·vᵀ, dS = P∘(dP - Δ), row sums
#   Δ_i = Σ_j P_ij·dP_ij = b·rowsum(dout∘PV)_i,   then  dq = dS·k/√D,  dk = dSᵀ·q/√D.
# Δ, da and db are O(T·D): a small kernel computes them first. The main kernel then holds one
# key tile and walks the query tiles that can see it, computing Pᵀ and dPᵀ directly (sᵀ =
# k·qᵀ) so nothing is transposed in registers: 5 matmuls per tile, dk and dv summed in
# registers, dq atomically added in fp32.


@triton.jit(do_not_specialize=["T"])
def _bwd_pre_kernel(DO, PV, V, Bc, Delta, DQ, Sums, T, H, stride_b, stride_h, stride_t, sm_scale,
                    D: tl.constexpr, BLOCK: tl.constexpr):
    bh, pid = tl.program_id(0), tl.program_id(1)
    b_idx, h = bh // H, bh % H
    own = (b_idx.to(tl.int64) * T * H + h) * D
    rows = pid * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
    do = _load_rows(DO + own, rows, T, H * D, D).to(tl.float32)  # (BLOCK, D)
    pv = _load_rows(PV + own, rows, T, H * D, D).to(tl.float32)  # (BLOCK, D)
    V = V + b_idx.to(tl.int64) * stride_b + h * stride_h
    v = _load_rows(V, rows, T, stride_t, D).to(tl.float32)
    r = tl.sum(do * pv, 1)  # (BLOCK,) rowsum(dout∘PV)
    b = tl.load(Bc + h).to(tl.float32)
    tl.store(Delta + bh.to(tl.int64) * T + rows, b * sm_scale * r, mask=rows < T)
    # zero the dq accumulator
    _store_rows(DQ + own, rows, tl.zeros([BLOCK, D], tl.float32), T, H * D, D)
    sums = Sums + bh * tl.num_programs(1) + pid  # this program's share of da[h], then of db[h]
    tl.store(sums, tl.sum(tl.sum(do * v, 1), 0))
    tl.store(sums + tl.num_programs(0) * tl.num_programs(1), tl.sum(r, 0))


@triton.jit
def _bwd_tiles(dk, dv, k, v, Q, DO, DQ, LSE, Delta, keys, lo, hi, T, HD, stride_t, qk_scale,
               dp_scale,
               D: tl.constexpr, BLOCK_M: tl.constexpr, DIAGONAL: tl.constexpr, PREC: tl.constexpr):
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
        q = _load_rows(Q, rows, T, stride_t, D)  # (BLOCK_M, D)
        do = _load_rows(DO, rows, T, HD, D)  # (BLOCK_M, D)
        # (BLOCK_M,); rows past T get P = 0
        lse = tl.load(LSE + rows, mask=rows < T, other=float("inf"))
        delta = tl.load(Delta + rows, mask=rows < T, other=0.0)  # (BLOCK_M,) Δ/√D
        # (BLOCK_N, BLOCK_M)
        pT = tl.exp2(tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale - lse[None, :])
        if DIAGONAL:
            pT = tl.where(keys[:, None] <= rows[None, :], pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do, input_precision=PREC)  # (BLOCK_N, D) Pᵀ·dout
        dpT = tl.dot(v, tl.trans(do), input_precision=PREC)  # (BLOCK_N, BLOCK_M) (dout·vᵀ)ᵀ
        dsT = pT * (dp_scale * dpT - delta[None, :])  # (BLOCK_N, BLOCK_M) dSᵀ/√D  (dp_scale = b/√D)
        dk += tl.dot(dsT.to(q.dtype), q, input_precision=PREC)  # (BLOCK_N, D)
        # (D, BLOCK_M): this tile's dq share
        dqT = tl.dot(tl.trans(k), dsT.to(k.dtype), input_precision=PREC)
        dq_tile = DQ + rows[None, :] * HD + tl.arange(0, D)[:, None]  # (D, BLOCK_M) addresses
        tl.atomic_add(dq_tile, dqT, mask=rows[None, :] < T, sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=["T"])
def _bwd_kernel(Q, K, V, A, Bc, DO, LSE, Delta, DQ, DK, DV, T, H, stride_b, stride_h, stride_t,
                qk_scale, sm_scale,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    # early key tiles see the most rows: they go first
    bh, start_n = tl.program_id(0), tl.program_id(1) * BLOCK_N
    b_idx, h = bh // H, bh % H
    qkv = b_idx.to(tl.int64) * stride_b + h * stride_h
    own = (b_idx.to(tl.int64) * T * H + h) * D
    keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    k = _load_rows(K + qkv, keys, T, stride_t, D)  # (BLOCK_N, D)
    v = _load_rows(V + qkv, keys, T, stride_t, D)  # (BLOCK_N, D)
    a, b = tl.load(A + h).to(tl.float32), tl.load(Bc + h).to(tl.float32)
    dk = tl.zeros([BLOCK_N, D], tl.float32)  # dSᵀ·q/√D
    dv = tl.zeros([BLOCK_N, D], tl.float32)  # Pᵀ·dout
    rows_of_bh = bh.to(tl.int64) * T  # this (batch, head) in LSE and Delta
    Q, DO, DQ, LSE, Delta = Q + qkv, DO + own, DQ + own, LSE + rows_of_bh, Delta + rows_of_bh
    # the query tiles on the diagonal need the causal mask; later rows see every key of this tile
    diagonal_end = tl.minimum(start_n + BLOCK_N, T)
    dk, dv = _bwd_tiles(dk, dv, k, v, Q, DO, DQ, LSE, Delta, keys, start_n, diagonal_end, T,
                        H * D, stride_t, qk_scale, b * sm_scale, D, BLOCK_M, True, PREC)
    dk, dv = _bwd_tiles(dk, dv, k, v, Q, DO, DQ, LSE, Delta, keys, start_n + BLOCK_N, T, T,
                        H * D, stride_t, qk_scale, b * sm_scale, D, BLOCK_M, False, PREC)
    do_own = _load_rows(DO, keys, T, H * D, D).to(tl.float32)  # the a·I path
    _store_rows(DV + own, keys, a * do_own + b * dv, T, H * D, D)
    _store_rows(DK + own, keys, dk, T, H * D, D)
# -----------------------------------------------------------------------------
# PyTorch side: launch configs, custom ops (torch.compile sees one opaque op), input checks.

# One launch config per GPU generation, dtype and head size: (BLOCK_M, BLOCK_N, num_warps,
# num_stages) of the forward, then of the backward. Forward: BLOCK_N divides BLOCK_M (the diagonal
# is whole key tiles). Backward: BLOCK_M divides BLOCK_N. test_kernel.py compiles every entry for
# its GPUs and checks that it fits their shared memory without register spills: Hopper (sm_90) and
# B200 (sm_100) have 227 KB a block, an A100 (sm_80) 163 KB, every other GPU from sm_80 on (sm_86,
# sm_89, sm_120 ...) about 99 KB.
LAUNCH_CONFIGS = {  # (generation for bf16 and fp16, or "fp32"; D ≤ 64) -> (forward, backward)
    ("sm_90", True): ((128, 64, 8, 3), (32, 128, 8, 2)),  # Hopper: all 5 backward matmuls on wgmma
    ("sm_90", False): ((128, 64, 8, 3), (16, 128, 8, 2)),
    # B200: Hopper's but for the D ≤ 64 backward, which spills there (the A100's does not)
    ("sm_100", True): ((128, 64, 8, 3), (32, 128, 8, 3)),
    ("sm_100", False): ((128, 64, 8, 3), (16, 128, 8, 2)),
    ("sm_80", True): ((128, 64, 8, 3), (32, 128, 8, 3)),
    ("sm_80", False): ((128, 32, 8, 3), (16, 64, 8, 2)),
    # ~99 KB: the A100's but for the D = 128 backward
    ("sm_86", True): ((128, 64, 8, 3), (32, 128, 8, 3)),
    ("sm_86", False): ((128, 32, 8, 3), (16, 32, 4, 2)),
    # any GPU: fp32 is for checks; its IEEE dots run on CUDA cores and need many registers: small tiles
    ("fp32", True): ((32, 16, 8, 2), (16, 32, 4, 2)),
    ("fp32", False): ((32, 16, 8, 2), (16, 16, 4, 2)),
}
# the interpreter's (forward, backward) configs: small, unequal
SMALL = ((32, 16, 4, 1), (16, 32, 4, 1))


def launch_configs(device, dtype, D):
    """The (forward, backward) launch configs mix_attention uses on this device, dtype and head size."""
    if device.type != "cuda":
        return SMALL
    if torch.version.hip:  # Triton's AMD backend needs other configs (and an MI250 reports sm_90)
        raise ValueError("mix_attention: the fused kernel is built for NVIDIA GPUs, not ROCm; "
                         "use impl=sdpa")
    gpu = torch.cuda.get_device_properties(device)  # torch.compile reads it as a constant
    if gpu.major < 8:
        raise ValueError(f"mix_attention: the fused kernel needs an sm_80 or newer GPU, this is "
                         f"sm_{gpu.major}{gpu.minor}; use impl=sdpa")
    generations = {(9, 0): "sm_90", (10, 0): "sm_100", (8, 0): "sm_80"}
    generation = generations.get((gpu.major, gpu.minor), "sm_86")
    return LAUNCH_CONFIGS["fp32" if dtype == torch.float32 else generation, D <= 64]


def _kw(cfg, q):  # launch keywords; 16-bit dots ignore PREC
    # fp32: IEEE, whatever torch's TF32 switch says
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    return dict(BLOCK_M=cfg[0], BLOCK_N=cfg[1], num_warps=cfg[2], num_stages=cfg[3], PREC=prec)


# Triton launches on the current CUDA device: make it q's (a run on cuda:1 launches there)
def _on(device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _new(q, dtype=None):  # (B, H, T, D) view of fresh (B, T, H, D) memory
    B, H, T, D = q.shape
    x = q.new_empty((B, T, H, D), dtype=dtype or q.dtype).transpose(1, 2)
    return x.fill_(float("nan")) if POISON else x


def _qkv(q, k, v):  # the kernels take one set of strides for q, k, v, with a unit last stride
    shared = q.stride() == k.stride() == v.stride() and q.stride(-1) == 1
    return (q, k, v) if shared else (q.contiguous(), k.contiguous(), v.contiguous())


@torch.library.custom_op("nanocorridor::mix_attention_fwd", mutates_args=())
def _mix_fwd(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, fwd_cfg: list[int],
             bwd_cfg: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    q, k, v = _qkv(q, k, v)
    B, H, T, D = q.shape
    out, pv, lse = _new(q), _new(q), q.new_empty((B, H, T), dtype=torch.float32)
    with _on(q.device):
        _fwd_kernel[(B * H, triton.cdiv(T, fwd_cfg[0]))](
            q, k, v, a.contiguous(), b.contiguous(), out, pv, lse, T, H, *q.stride()[:3],
            LOG2E / math.sqrt(D), D=D, **_kw(fwd_cfg, q))
    # (B, H, T, D) mixed output, (B, H, T, D) P·v, (B, H, T) log2-sum-exp2 of the scores
    return out, pv, lse


@torch.library.custom_op("nanocorridor::mix_attention_bwd", mutates_args=())
def _mix_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, pv: Tensor,
             lse: Tensor, bwd_cfg: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    q, k, v = _qkv(q, k, v)
    B, H, T, D = q.shape
    strides, a, b = q.stride()[:3], a.contiguous(), b.contiguous()
    # the kernels read dout and pv as (B, T, H, D) memory, lse as (B, H, T)
    layout = _new(q).stride()
    # in the model dout already has this layout, and so has the forward's pv, unless a compiler
    # moved it
    dout, pv = (x if x.stride() == layout and x.dtype == q.dtype else _new(q).copy_(x)
                for x in (dout, pv))
    lse = lse.contiguous().float()
    dq, dk, dv = _new(q, torch.float32), _new(q), _new(q)  # dq: an fp32 accumulator
    delta, scale = q.new_empty((B, H, T), dtype=torch.float32), 1.0 / math.sqrt(D)
    sums = q.new_empty((2, B, H, triton.cdiv(T, PRE_BLOCK)), dtype=torch.float32)
    with _on(q.device):
        _bwd_pre_kernel[(B * H, triton.cdiv(T, PRE_BLOCK))](
            dout, pv, v, b, delta, dq, sums, T, H, *strides, scale, D=D, BLOCK=PRE_BLOCK)
        _bwd_kernel[(B * H, triton.cdiv(T, bwd_cfg[1]))](
            q, k, v, a, b, dout, lse, delta, dq, dk, dv, T, H, *strides, LOG2E * scale, scale,
            D=D, **_kw(bwd_cfg, q))
    # (H,): in a fixed order
    da, db = sums[0].sum((0, 2)).to(a.dtype), sums[1].sum((0, 2)).to(b.dtype)
    return dq.to(q.dtype), dk, dv, da, db


# For torch.compile: fake ops with the real ops' output shapes and strides. For autograd: save
# q, k, v, a, b, PV and LSE, and the backward's launch config; only `out` gets gradients (PV
# and LSE are internal outputs).
@_mix_fwd.register_fake
def _(q, k, v, a, b, fwd_cfg, bwd_cfg):
    return _new(q), _new(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@_mix_bwd.register_fake
def _(dout, q, k, v, a, b, pv, lse, bwd_cfg):
    return _new(q), _new(q), _new(q), a.clone(), b.clone()


def _save(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5], *output[1:])
    ctx.bwd_cfg = inputs[6]


def _backward(ctx, dout, *_):  # gradients of q, k, v, a, b; none of the launch configs
    return *_mix_bwd(dout, *ctx.saved_tensors, ctx.bwd_cfg), None, None


_mix_fwd.register_autograd(_backward, setup_context=_save)


def _check_inputs(q, k, v, a, b):
    def require(ok, msg):
        if not ok:
            raise ValueError(f"mix_attention: {msg}.")
    require(q.dim() == 4, f"q, k, v must be 4-D (B, H, T, D), got q with shape {tuple(q.shape)}")
    shapes = ", ".join(str(tuple(x.shape)) for x in (q, k, v))
    require(q.shape == k.shape == v.shape, f"q, k, v must have the same shape, got {shapes}")
    B, H, T, D = q.shape
    require(D in HEAD_DIMS, f"head dim D must be one of {HEAD_DIMS}, got {D}")
    for name, x in (("a", a), ("b", b)):
        require(x.shape == (H,) and x.is_floating_point(),
                f"{name} must be 1-D of length H={H} and floating-point, got {tuple(x.shape)} "
                f"{x.dtype}")
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    require(q.dtype == k.dtype == v.dtype and q.dtype in dtypes,
            "q, k, v must share one dtype among float16, bfloat16, float32, "
            f"got {q.dtype}, {k.dtype}, {v.dtype}")
    require(len({x.device for x in (q, k, v, a, b)}) == 1,
            f"q, k, v, a, b must be on one device, got {[str(x.device) for x in (q, k, v, a, b)]}")
    require(q.device.type == "cuda" or (q.device.type == "cpu" and INTERPRET),
            "tensors must be on cuda (cpu needs TRITON_INTERPRET=1 set before triton is imported), "
            f"got {q.device}")


def mix_attention(q, k, v, a, b, configs=None):
    """out = a·v + b·P·v per head, differentiable (P: causal softmax). q, k, v: (B, H, T,
    D); a, b: (H,). configs: the (forward, backward) launch configs; None takes
    launch_configs() for q (tests pass others)."""
    _check_inputs(q, k, v, a, b)
    fwd_cfg, bwd_cfg = configs or launch_configs(q.device, q.dtype, q.shape[-1])
    return _mix_fwd(q, k, v, a, b, list(fwd_cfg), list(bwd_cfg))[0]  # (B, H, T, D)


if __name__ == "__main__":  # the checks import this file, never the reverse
    raise SystemExit("kernel.py is a module; its pass/fail gate is python -m support.kernel_check")
