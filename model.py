"""
nanoCorridor's GPT: nanoGPT's model with one new idea, the operator each head applies to its values.

For head h and causal query position i, with P = softmax(q·kᵀ/√d) under the causal mask:

    y_i = a_h · v_i  +  b_h · Σ_{j≤i} P_ij v_j        i.e. the head applies (a_h·I + b_h·P) to V

`GPTConfig.op` chooses (a, b) per head:

    attention   a = 0,    b = 1                   softmax attention P
    laplacian   a = 1,    b = -1                  the Laplacian I - P, on the last `laplacian_heads` heads
    mix         a = δγ,   b = δ                   δ(γI + P), γ and δ learned per head (the paper)
    mix_alpha   a = α0,   b = α1                  α0·I + α1·P
    mix_ab      a = β,    b = α - β               α·P + β·(I - P)

Every op is the same (a, b) per head, so one function computes them all (`corridor_op`). Written the
paper's way, every head has an effective γ = a/b and δ = b (`GPT.corridor()`); for γ ∈ (-1, 0), the
"convex corridor", δ(γI + P) = δ(|γ|(P - I) + (1 - |γ|)P) mixes attention with the negative Laplacian.

Classroom demo (prints one head's T×T operator and checks the corridor identity):
    python model.py --op=laplacian
"""

import math
import os
import sys
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F

OPS = ("attention", "laplacian", "mix", "mix_alpha", "mix_ab")
CORRIDOR_SCALARS = ("gamma", "delta", "alpha0", "alpha1", "alpha", "beta", "a", "b")  # per-head operator tensors
IMPLS = ("auto", "sdpa", "materialized", "triton")


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, like GPT-2
    op: str = "attention"  # one of OPS
    laplacian_heads: int = None  # op=laplacian: how many trailing heads per layer use I - P (None: half)
    gamma_init: float = 0.0  # op=mix*: the operator starts at δ(γI + P) with these values
    delta_init: float = 1.0
    learn_gamma: bool = True  # op=mix: False freezes γ at gamma_init
    learn_delta: bool = True  # op=mix: False freezes δ at delta_init
    gamma_min: float = None  # op=mix: γ is projected to ≥ gamma_min after every optimizer step
    impl: str = "auto"  # auto: fused Triton kernel on CUDA, else SDPA; or sdpa | materialized | triton

    def __post_init__(self):
        def bad(field, allowed):
            raise ValueError(f"GPTConfig.{field}={getattr(self, field)!r} is not allowed: {allowed}")

        if self.op not in OPS:
            bad("op", f"choose one of {', '.join(OPS)}")
        if self.impl not in IMPLS:
            bad("impl", f"choose one of {', '.join(IMPLS)}")
        for field in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if not isinstance(getattr(self, field), int) or getattr(self, field) < 1:
                bad(field, "it must be a positive integer")
        if self.n_embd % self.n_head:
            bad("n_embd", f"it must be divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            bad("dropout", "it must be in [0, 1)")
        if self.laplacian_heads is not None:
            if self.op != "laplacian":
                bad("laplacian_heads", "it is only used with op='laplacian'")
            if not isinstance(self.laplacian_heads, int) or not 0 <= self.laplacian_heads <= self.n_head:
                bad("laplacian_heads", f"it must be an integer in 0..n_head={self.n_head}")
        # the controls of the paper's experiments: each names the ops that have it
        controls = {"gamma_init": (0.0, ("mix", "mix_alpha", "mix_ab")),
                    "delta_init": (1.0, ("mix", "mix_alpha", "mix_ab")),
                    "learn_gamma": (True, ("mix",)), "learn_delta": (True, ("mix",)),
                    "gamma_min": (None, ("mix",))}
        for field, (default, ops) in controls.items():
            if getattr(self, field) != default and self.op not in ops:
                bad(field, f"op={self.op!r} has no such control; it applies to op in {ops}")
        if self.op == "mix" and self.gamma_min is not None and self.gamma_init < self.gamma_min:
            bad("gamma_init", f"it is below gamma_min={self.gamma_min}")
        if self.op in ("mix_alpha", "mix_ab") and self.delta_init == 0:
            bad("delta_init", "δ=0 makes the head output zero; use a nonzero value")

    @property
    def n_laplacian(self):
        if self.op != "laplacian":
            return 0
        return self.n_head // 2 if self.laplacian_heads is None else self.laplacian_heads


# -----------------------------------------------------------------------------
# The operator: the one place that says what a head computes


def causal_softmax(q, k):
    """P = softmax(q·kᵀ/√d) with the causal mask, materialised: (B, nh, T, T). For teaching and tests."""
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return att.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def corridor_matrix(q, k, a, b):
    """The operator a·I + b·P of every head, materialised: (B, nh, T, T). a, b: (nh,)."""
    P = causal_softmax(q, k)  # (B, nh, T, T)
    I = torch.eye(q.size(-2), dtype=P.dtype, device=P.device)  # (T, T)
    return a.view(-1, 1, 1) * I + b.view(-1, 1, 1) * P


def corridor_op(q, k, v, a, b, impl="sdpa", dropout_p=0.0):
    """y = (a·I + b·P)·v for every head. q, k, v: (B, nh, T, hs); a, b: (nh,) -> (B, nh, T, hs).

    The training paths never build the T×T matrix: P·v comes from flash attention (SDPA) and the
    identity term is just a·v, or the fused Triton kernel does both in one pass.
    """
    if impl == "materialized":
        P = causal_softmax(q, k)  # (B, nh, T, T)
        PV = F.dropout(P, dropout_p) @ v  # (B, nh, T, hs)
    elif impl == "triton":
        from kernel import mix_attention  # lazy: triton is only needed here
        return mix_attention(q, k, v, a, b)
    else:
        PV = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)  # (B, nh, T, hs)
    return a.view(-1, 1, 1) * v + b.view(-1, 1, 1) * PV


def resolve_impl(impl, q, dropout_p):
    """'auto' picks the fused kernel on CUDA when triton is installed and supports the head size (and there
    is no attention dropout, which the kernel does not do); SDPA otherwise."""
    if impl != "auto":
        return impl
    if q.is_cuda and dropout_p == 0.0:
        try:
            from kernel import HEAD_DIMS  # lazy: imports triton
        except ImportError:
            return "sdpa"
        if q.size(-1) in HEAD_DIMS:
            return "triton"
    return "sdpa"


# -----------------------------------------------------------------------------
# The model


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.n_head, self.dropout, self.impl, self.op = config.n_head, config.dropout, config.impl, config.op
        self.gamma_min = config.gamma_min
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v projections
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        nh, g, d = config.n_head, config.gamma_init, config.delta_init

        def scalar(name, value, learn=True):
            # one value per head; a frozen scalar is a buffer: saved with the model, never trained
            t = torch.full((nh,), float(value))
            if learn:
                setattr(self, name, nn.Parameter(t))
            else:
                self.register_buffer(name, t)

        if config.op == "laplacian":  # fixed: the last n_laplacian heads use I - P
            is_lap = torch.arange(nh) >= nh - config.n_laplacian
            self.register_buffer("a", is_lap.float())
            self.register_buffer("b", 1.0 - 2.0 * is_lap.float())
        elif config.op == "mix":  # δ(γI + P)
            scalar("gamma", g, config.learn_gamma)
            scalar("delta", d, config.learn_delta)
        elif config.op == "mix_alpha":  # α0·I + α1·P, started where δ(γI + P) starts
            scalar("alpha0", d * g)
            scalar("alpha1", d)
        elif config.op == "mix_ab":  # α·P + β(I - P) = β·I + (α - β)·P
            scalar("alpha", d * (1 + g))
            scalar("beta", d * g)

    def coefficients(self):
        """(a, b), each (nh,): this layer's heads apply a·I + b·P."""
        if self.op == "attention":
            ones = self.c_attn.weight.new_ones(self.n_head)
            return 0 * ones, ones
        if self.op == "laplacian":
            return self.a, self.b
        if self.op == "mix":
            return self.delta * self.gamma, self.delta
        if self.op == "mix_alpha":
            return self.alpha0, self.alpha1
        return self.beta, self.alpha - self.beta  # mix_ab

    @torch.no_grad()
    def project_gamma(self):
        if self.op == "mix" and self.gamma_min is not None:
            self.gamma.clamp_(min=self.gamma_min)

    def qkv(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        return [t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)]  # (B, nh, T, hs)

    def operator_matrix(self, x):
        """Every head's T×T operator a·I + b·P for input x (B, T, C), materialised: (B, nh, T, T)."""
        q, k, _ = self.qkv(x)
        return corridor_matrix(q, k, *self.coefficients())

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x)  # (B, nh, T, hs)
        a, b = self.coefficients()
        dropout_p = self.dropout if self.training else 0.0
        y = corridor_op(q, k, v, a.to(q.dtype), b.to(q.dtype), resolve_impl(self.impl, q, dropout_p), dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by 1/√(2·n_layer)
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding=True):
        """Trainable parameters (frozen γ/δ are buffers, not counted); minus position embeddings by default."""
        n = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None):
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} is longer than block_size={self.config.block_size}; "
                             "crop the input or build the model with a larger block_size")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is None:  # inference: only the last position's logits are needed
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)  # (B, T, vocab_size)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
        return logits, loss

    def crop_block_size(self, block_size):
        """Shrink the context (e.g. GPT-2's 1024) to a smaller block_size by cutting the position table."""
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    @torch.no_grad()
    def corridor(self):
        """Effective (γ, δ) of every head, each (n_layer, n_head): a·I + b·P = δ(γI + P) with γ = a/b, δ = b."""
        a, b = (torch.stack(t).float().cpu() for t in zip(*(blk.attn.coefficients() for blk in self.transformer.h)))
        return a / b, b

    def project_gamma(self):
        """Keep γ ≥ gamma_min (the paper's 'γ ≥ 0' control). Call after every optimizer step."""
        for block in self.transformer.h:
            block.attn.project_gamma()

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, corridor_lr_scale=1.0):
        """AdamW; weight decay only on 2-D weights (matmuls, embeddings), never on γ, δ, α, β, norms, biases.
        The corridor scalars get learning_rate × corridor_lr_scale (group key "lr_scale", which the training
        loop applies): Adam moves each by about its lr per step, too little to see at fine-tuning rates."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        is_scalar = lambda n: n.rsplit(".", 1)[-1] in CORRIDOR_SCALARS
        groups = [{"params": [p for n, p in named if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for n, p in named if p.dim() < 2 and not is_scalar(n)], "weight_decay": 0.0},
                  {"params": [p for n, p in named if is_scalar(n)], "weight_decay": 0.0, "lr_scale": corridor_lr_scale}]
        groups = [g for g in groups if g["params"]]
        for g in groups:
            g["lr"] = learning_rate * g.get("lr_scale", 1.0)
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")

    def estimate_mfu(self, fwdbwd_per_iter, dt):
        """Model FLOPs utilisation against the peak bf16 FLOP/s of the GPU in use; None on CPU/unknown devices."""
        peak = peak_flops(self.lm_head.weight.device)
        if peak is None:
            return None
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        flops_per_token = 6 * self.get_num_params() + 12 * L * H * Q * T  # PaLM appendix B
        return flops_per_token * T * fwdbwd_per_iter / dt / peak

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Continue idx (B, T) by max_new_tokens tokens, sampling each from the model's distribution."""
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    @classmethod
    def from_pretrained(cls, name_or_path, **overrides):
        """OpenAI GPT-2 weights (a hub name or a local directory saved by transformers), for any op.

        With op='mix' at γ=0, δ=1 (the defaults) the model computes exactly what GPT-2 computes, so
        fine-tuning starts from attention and the heads are free to move into the corridor.
        """
        for key in overrides:
            if key not in PRETRAINED_OVERRIDES:
                raise ValueError(f"from_pretrained cannot override {key!r}: the checkpoint fixes it; "
                                 f"allowed are {', '.join(PRETRAINED_OVERRIDES)}")
        if name_or_path not in PRETRAINED and not os.path.isdir(name_or_path):
            raise ValueError(f"unknown pretrained model {name_or_path!r}: use one of {', '.join(PRETRAINED)} "
                             "or a local directory saved with transformers' save_pretrained")
        from transformers import GPT2LMHeadModel  # lazy: only needed here
        try:
            hf = GPT2LMHeadModel.from_pretrained(name_or_path)
        except OSError as e:
            raise ValueError(f"could not load {name_or_path!r} from the Hugging Face hub ({e.__class__.__name__}); "
                             "offline, pass a local directory saved with save_pretrained instead") from None
        c = hf.config
        config = GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                           n_embd=c.n_embd, bias=True, **overrides)
        model = cls(config)
        sd, sd_hf = model.state_dict(), hf.state_dict()
        # HF's GPT-2 uses Conv1D modules, whose weights are the transpose of a Linear's
        transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        missing = [k for k in sd if k not in sd_hf and k.rsplit(".", 1)[-1] not in CORRIDOR_SCALARS]
        if missing:
            raise ValueError(f"{name_or_path!r} is not a GPT-2 checkpoint: it lacks {missing[0]}")
        for key, w in sd_hf.items():
            if key not in sd:
                continue  # e.g. the causal-mask buffers that older transformers versions saved
            w = w.t() if key.endswith(transposed) else w
            if w.shape != sd[key].shape:
                raise ValueError(f"pretrained tensor {key} has shape {tuple(w.shape)}, expected {tuple(sd[key].shape)}")
            with torch.no_grad():
                sd[key].copy_(w)
        return model


PRETRAINED = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
# what GPT.from_pretrained may set on top of the GPT-2 checkpoint: the operator, its controls, the implementation
PRETRAINED_OVERRIDES = ("op", "laplacian_heads", "gamma_init", "delta_init", "learn_gamma", "learn_delta",
                        "gamma_min", "impl", "dropout")

# dense bf16 peak FLOP/s of common GPUs, matched against torch.cuda.get_device_name()
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
                   "A10G": 70e12, "A10": 125e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12,
                   "T4": 65e12}


def peak_flops(device):
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


# -----------------------------------------------------------------------------
# Classroom demo: python model.py --op=laplacian


@torch.no_grad()
def demo(op="mix", gamma=-0.5, T=6, seed=0):
    torch.manual_seed(seed)
    controls = {"gamma_init": gamma} if op.startswith("mix") else {}
    config = GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=4, n_embd=32, op=op, **controls)
    model = GPT(config).double().eval()
    x = torch.randn(1, T, config.n_embd, dtype=torch.float64)
    M = model.transformer.h[0].attn.operator_matrix(x)[0]  # (nh, T, T)
    gamma_h, delta_h = model.corridor()
    h = config.n_head - 1  # the last head: a Laplacian head for op=laplacian
    torch.set_printoptions(precision=3, sci_mode=False, linewidth=120)
    print(f"op={op}: head {h} of layer 0 applies a·I + b·P with γ = {gamma_h[0, h]:.3f}, δ = {delta_h[0, h]:.3f}")
    print(f"its {T}×{T} operator (row i mixes the values v_0..v_i of the positions it may see):")
    print(M[h])
    print("row sums:", M[h].sum(-1), f"  (each row of δ(γI + P) sums to δ(1 + γ) = {delta_h[0, h] * (1 + gamma_h[0, h]):.3f})")

    # the convex corridor: for γ in (-1, 0), δ(γI + P) = δ(|γ|(P - I) + (1 - |γ|)P)
    g, d = -0.3, 1.7
    q, k, _ = model.transformer.h[0].attn.qkv(x)
    P = causal_softmax(q, k)[0, 0]  # (T, T)
    I = torch.eye(T, dtype=P.dtype)
    lhs, rhs = d * (g * I + P), d * (abs(g) * (P - I) + (1 - abs(g)) * P)
    print(f"corridor identity at γ={g}, δ={d}: max |δ(γI+P) - δ(|γ|(P-I) + (1-|γ|)P)| = {(lhs - rhs).abs().max():.1e}")
    return M


if __name__ == "__main__":
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    unknown = [a for a in sys.argv[1:] if not (a.startswith("--") and "=" in a)] + \
              [k for k in args if k not in ("op", "gamma")]
    if unknown:
        sys.exit(f"unknown argument {unknown[0]!r}: usage: python model.py --op={{{','.join(OPS)}}} [--gamma=-0.5]")
    try:
        demo(args.get("op", "mix"), float(args.get("gamma", -0.5)))
    except ValueError as e:
        sys.exit(f"error: {e}")
