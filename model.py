"""
nanoCorridor's GPT: nanoGPT's model with one new idea, the operator each head applies to its values.

Head h computes (a_h·I + b_h·P)·V instead of attention's P·V, with (a, b) from the HeadOperator that
`GPTConfig.op` names (operators.py: attention, laplacian, mix = δ(γI + P), mix_alpha, mix_ab). The
one new line is in CausalSelfAttention.heads. `GPT.gamma_delta()` reports every head's effective γ =
a/b, δ = b.

Classroom demo (prints one head's T×T operator and checks the corridor identity):
    python model.py --op=laplacian
"""

import math
import sys
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.nn import functional as F

from operators import OPS, causal_softmax, operator_matrix


@dataclass
class GPTConfig:
    block_size: int = 1024  # the context length T, in tokens
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # heads per block
    n_embd: int = 768  # the width C; each head has C / n_head dimensions
    dropout: float = 0.0  # dropout on attention, residual and embeddings (0: off)
    bias: bool = True  # biases in Linears and LayerNorms, like GPT-2
    op: str = "mix"  # what every head applies to its values: a name in OPS (operators.py)
    controls: dict = field(default_factory=dict)  # the op's settings (OPS[op].controls)
    impl: str = "sdpa"  # how heads compute (a·I + b·P)V: sdpa, materialized (teaching) or triton
    gelu: str = "none"  # the GELU: none (exact, faster on CPUs) or tanh (GPT-2's weights need it)

    def __post_init__(self):
        check_config(self)  # below GPT: a ValueError names the setting and what is allowed
        # the op's controls not given: defaults
        self.controls = {**OPS[self.op].controls, **self.controls}


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.dropout, self.impl = config.dropout, config.impl
        # q, k, v projections
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.op = OPS[config.op](config.n_head, **config.controls)
        # lazy: triton is imported only by the runs that ask for the kernel
        if config.impl == "triton":
            from kernel import mix_attention
            self.kernel = mix_attention

    def qkv(self, x):
        B, T, C = x.size()
        qkv = self.c_attn(x).split(self.n_embd, dim=2)  # q, k, v: (B, T, C) each
        # (B, nh, T, hs)
        return [t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in qkv]

    def forward(self, x, cache=None):
        """x: (B, T, C). cache, only while generating: this layer's keys and values of the positions
        before x, extended here by x's (none yet, {}: x is the prompt; else x is the one new
        token)."""
        B, T, C = x.size()
        q, k, v = self.qkv(x)  # (B, nh, T, hs)
        if cache is None:
            y = self.heads(q, k, v)  # (B, nh, T, hs)
        else:  # generating, SDPA for every impl: the prompt (causal), or one new token (every key)
            K = torch.cat((cache["k"], k), dim=2) if "k" in cache else k  # (B, nh, t, hs) every key
            V = torch.cat((cache["v"], v), dim=2) if "v" in cache else v  # (B, nh, t, hs) and value
            cache.update(k=K, v=V)  # kept for the tokens to come
            y = self.op(v, F.scaled_dot_product_attention(q, K, V, is_causal=T > 1))  # a·v: x's v
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # all head outputs side by side
        return self.resid_dropout(self.c_proj(y))

    def heads(self, q, k, v):
        """Every head's (a·I + b·P)·V at all T positions, by the implementation config.impl
        names."""
        dropout_p = self.dropout if self.training else 0.0
        # the fused kernel computes P·V and applies the operator in one pass
        if self.impl == "triton":
            return self.kernel(q, k, v, *self.op.coefficients())
        if self.impl == "materialized":  # the T×T operator itself: for teaching and tests
            return operator_matrix(q, k, *self.op.coefficients(), dropout_p) @ v
        # P·V, flash
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        return self.op(v, y)  # (a·I + b·P)·V: the one new line


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu)
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

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache)
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
        # GPT-2: scale residual projections by 1/√(2·n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def get_num_params(self, non_embedding=True):
        """Trainable parameters (frozen γ/δ are buffers), minus the position embeddings by
        default."""
        n = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None, cache=None):
        """idx (B, T) → logits (and the loss with targets). cache, only when generating: one dict
        per layer, all empty (idx is the prompt) or all holding the keys and values of the positions
        before idx."""
        B, T = idx.size()
        # idx: after the cached positions
        t0 = cache[0]["k"].size(2) if cache and "k" in cache[0] else 0
        if t0 + T > self.config.block_size:
            raise ValueError(f"sequence length {t0 + T} is longer than block_size={self.config.block_size}; "
                             "crop the input or build the model with a larger block_size")
        pos = torch.arange(t0, t0 + T, dtype=torch.long, device=idx.device)
        # (B, T, C)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for i, block in enumerate(self.transformer.h):
            x = block(x, cache[i] if cache else None)
        x = self.transformer.ln_f(x)
        if targets is None:  # inference: only the last position's logits are needed
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)  # (B, T, vocab_size)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
        return logits, loss

    def crop_block_size(self, block_size):
        """Shrink the context (e.g. GPT-2's 1024) to a smaller block_size by cutting the position
        table."""
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    def head_operators(self):
        return [block.attn.op for block in self.transformer.h]

    @torch.no_grad()
    def gamma_delta(self):
        """Every head's (γ, δ), each (n_layer, n_head): a·I + b·P = δ(γI + P), so γ = a/b, δ = b."""
        coefficients = [op.coefficients() for op in self.head_operators()]  # one (a, b) per layer
        a, b = (torch.stack(t).float().cpu() for t in zip(*coefficients))
        return a / b, b

    def project(self):
        """Apply every operator's constraint (e.g. γ ≥ gamma_min). Call after every optimizer
        step."""
        for op in self.head_operators():
            op.project()

    def configure_optimizers(self, weight_decay, learning_rate, betas, op_lr_scale=1.0):
        """AdamW; weight decay only on 2-D weights (matmuls, embeddings), never on norms, biases or
        the operators' per-head scalars. Those learn at learning_rate × op_lr_scale (group key
        "lr_scale", which the training loop applies): Adam moves each by ~its lr per step, too
        little to see in fine-tuning."""
        op_scalars = {p for op in self.head_operators() for p in op.parameters()}
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [dict(params=[p for p in params if p.dim() >= 2], weight_decay=weight_decay,
                       lr=learning_rate),
                  dict(params=[p for p in params if p.dim() < 2 and p not in op_scalars],
                       weight_decay=0.0, lr=learning_rate),
                  dict(params=[p for p in params if p in op_scalars], weight_decay=0.0,
                       lr=learning_rate * op_lr_scale, lr_scale=op_lr_scale)]
        return torch.optim.AdamW([g for g in groups if g["params"]], betas=betas, fused=True)

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak):
        """Model FLOPs utilisation: the FLOP/s of fwdbwd_per_iter sequences in dt seconds over peak,
        the GPU's dense bf16 peak FLOP/s (None where it is not known, as on CPUs: then None)."""
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        flops_per_token = 6 * self.get_num_params() + 12 * L * H * Q * T  # PaLM appendix B
        return flops_per_token * T * fwdbwd_per_iter / dt / peak if peak else None

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """Continue idx (B, T) by max_new_tokens tokens drawn from the model's distribution,
        sharpened by temperature (0: the most likely) and cut to the top_k most likely. A KV cache
        keeps every layer's keys and values: a new token computes only its own q, k, v and head
        outputs, as decoders really do. use_cache=False: a full forward over the whole (cropped)
        context per token, as nanoGPT's generate."""
        block_size, cache = self.config.block_size, None
        for _ in range(max_new_tokens):
            # wpe is absolute: a full cache restarts from the last block_size tokens, as nanoGPT
            # crops
            if cache is None or cache[0]["k"].size(2) == block_size:
                cache = [{} for _ in self.transformer.h] if use_cache else None
                logits, _ = self(idx[:, -block_size:], cache=cache)  # (once full: for every token)
            else:  # the cache holds every position but the newest token's
                logits, _ = self(idx[:, -1:], cache=cache)
            logits = logits[:, -1, :]  # (B, vocab_size)
            if temperature == 0:
                idx_next = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    @classmethod
    def from_pretrained(cls, name_or_path, **changes):
        """OpenAI GPT-2 weights (a hub name or a local directory saved by transformers), with the
        caller's changes (GPTConfig's op, controls, dropout, impl): any op. With op='mix' at γ=0,
        δ=1 (the defaults) the model computes exactly what GPT-2 computes, so fine-tuning starts
        from attention and the heads are free to move into the corridor."""
        # lazy: reads and checks the folder or the hub's files
        from support.pretrained import gpt2_weights
        # checked against config.json before anything is built
        sizes, weights = gpt2_weights(name_or_path)
        model = cls(GPTConfig(**sizes, bias=True, gelu="tanh", **changes))
        # OpenAI's checkpoints use a Conv1D module, which stores these weights transposed from
        # nn.Linear's
        transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                      "mlp.c_proj.weight")
        weights = {k: w.t() if k.endswith(transposed) else w for k, w in weights.items()}
        # all but the operators' own scalars (and the tied head)
        model.load_state_dict(weights, strict=False)
        return model

    @classmethod
    def from_checkpoint(cls, ckpt, **changes):
        """The GPT of train.py's checkpoint dict, with the caller's changes (dropout, impl); a file
        from another version (or edited) is one ValueError line. rundir.load_checkpoint has compared
        the sizes model_args claim with the weights' shapes: a file never builds more than it holds."""
        try:  # TypeError: a setting we do not know; RuntimeError: a weight's name or shape
            model = cls(GPTConfig(**{**ckpt["model_args"], **changes}))
            model.load_state_dict(ckpt["model"])
        except (TypeError, RuntimeError) as e:
            message = " ".join(str(e).split())[:300]  # load_state_dict's: a line per misfit
            raise ValueError(f"the checkpoint does not fit this code ({type(e).__name__}: {message}); "
                             "it comes from another version or was edited") from None
        return model


def check_config(config):
    """GPTConfig's checks, wherever one is made (train.py makes one before any file or device is
    touched): a ValueError names the setting and what is allowed."""
    def bad(key, allowed):
        raise ValueError(f"{key}={getattr(config, key)!r} is not allowed: {allowed}")
    choices = dict(op=OPS, impl=("sdpa", "materialized", "triton"), gelu=("none", "tanh"))
    for key, allowed in choices.items():
        if getattr(config, key) not in allowed:
            bad(key, f"choose one of {', '.join(allowed)}")
    for key in ("block_size", "n_layer", "n_head", "n_embd"):  # (vocab_size: the data's)
        if getattr(config, key) < 1:
            bad(key, "it must be a positive integer")
    if config.n_embd % config.n_head:
        bad("n_embd", f"it must be divisible by n_head={config.n_head}")
    if not 0.0 <= config.dropout < 1.0:
        bad("dropout", "it must be in [0, 1)")
    # the fused kernel (kernel.py): Linux only, no dropout, its head sizes
    if config.impl == "triton":
        try:  # an ImportError names the torch it needs
            from kernel import HEAD_DIMS
        except ModuleNotFoundError:  # no triton
            bad("impl", "the triton package is not installed (Linux only); use impl='sdpa'")
        if config.dropout:
            bad("impl", "the fused kernel has no attention dropout; use dropout=0.0 or impl='sdpa'")
        if config.n_embd // config.n_head not in HEAD_DIMS:
            bad("impl", f"the fused kernel takes head sizes {', '.join(map(str, HEAD_DIMS[:-1]))} "
                        f"and {HEAD_DIMS[-1]}, not n_embd / n_head = "
                        f"{config.n_embd // config.n_head}; use impl='sdpa'")
    # the op's controls: each one of its own, their values as the op allows
    Op = OPS[config.op]
    for key in config.controls:
        if key not in Op.controls:
            raise ValueError(f"{key} is not a control of op={config.op!r} (its controls: "
                             f"{', '.join(Op.controls) or 'none'}); drop it or change op")
    Op.check(config.n_head, {**Op.controls, **config.controls})


# -----------------------------------------------------------------------------
# Classroom demo: python model.py --op=laplacian


@torch.no_grad()
def demo(op="mix", gamma=-0.5, T=6, seed=0):
    torch.manual_seed(seed)
    controls = {"gamma_init": gamma} if "gamma_init" in OPS[op].controls else {}
    config = GPTConfig(n_head=4, n_embd=32, op=op, controls=controls)
    attn = CausalSelfAttention(config).double()  # one layer's heads
    q, k, _ = attn.qkv(torch.randn(1, T, config.n_embd, dtype=torch.float64))
    a, b = attn.op.coefficients()  # (nh,) each
    M = operator_matrix(q, k, a, b)[0]  # (nh, T, T)
    h = config.n_head - 1  # the last head: a Laplacian head for op=laplacian
    gamma_h, delta_h = a[h] / b[h], b[h]  # head h's own (γ, δ)
    torch.set_printoptions(precision=3, sci_mode=False, linewidth=120)
    print(f"op={op}: head {h} of layer 0 applies a·I + b·P with γ = {gamma_h:.3f}, δ = {delta_h:.3f}")
    print(f"its {T}×{T} operator (row i mixes the values v_0..v_i of the positions it may see):")
    print(M[h])
    print("row sums:", M[h].sum(-1),
          f"  (each row of δ(γI + P) sums to δ(1 + γ) = {delta_h * (1 + gamma_h):.3f})")

    # the convex corridor: for γ in (-1, 0), δ(γI + P) = δ(|γ|(P - I) + (1 - |γ|)P)
    g, d = -0.3, 1.7
    P = causal_softmax(q, k)[0, 0]  # (T, T)
    I = torch.eye(T, dtype=P.dtype)
    lhs, rhs = d * (g * I + P), d * (abs(g) * (P - I) + (1 - abs(g)) * P)
    print(f"corridor identity at γ={g}, δ={d}: max |δ(γI+P) - δ(|γ|(P-I) + (1-|γ|)P)| = "
          f"{(lhs - rhs).abs().max():.1e}")
    return M


if __name__ == "__main__":
    from support.configurator import configure, one_of, require_torch
    try:
        require_torch(torch.__version__)
        cfg, given = configure(dict(op="mix", gamma=-0.5), sys.argv[1:], {"op": one_of(*OPS)},
                               files=False)
        # its heads have no γ to set
        if "gamma" in given and "gamma_init" not in OPS[cfg.op].controls:
            raise ValueError(f"gamma is not a control of op={cfg.op!r}; drop it or choose an op with a γ")
        demo(cfg.op, cfg.gamma)
    except ValueError as e:  # ConfigError's one line too
        sys.exit(f"error: {e}")
