"""
The head operators: what each attention head applies to its values. The paper's one idea lives here.

For head h and causal query position i, with P = softmax(q·kᵀ/√d) under the causal mask:

    y_i = a_h · v_i  +  b_h · Σ_{j≤i} P_ij v_j        i.e. the head applies (a_h·I + b_h·P) to V

An operator (a HeadOperator registered in OPS under its name, chosen by GPTConfig.op or train.py's
--op) says where each head's (a, b) come from:

    attention   a = 0,    b = 1                   softmax attention P
    laplacian   a = 1,    b = -1                  the Laplacian I - P, on the last `laplacian_heads` heads
    mix         a = δγ,   b = δ                   δ(γI + P), γ and δ learned per head (the paper)
    mix_alpha   a = α0,   b = α1                  α0·I + α1·P
    mix_ab      a = β,    b = α - β               α·P + β·(I - P)

Written the paper's way, every head has an effective γ = a/b and δ = b; for γ ∈ (-1, 0), the "convex
corridor", δ(γI + P) = δ(|γ|(P - I) + (1 - |γ|)P) mixes attention with the negative Laplacian.
Adding an operator is one small class with @register_op (README: "Add your own operator").
`operator_matrix` builds a·I + b·P explicitly: the reference for teaching and tests; training never
materialises the T×T matrix.
"""
import math

import torch
import torch.nn as nn
from torch.nn import functional as F

OPS = {}  # op name -> HeadOperator subclass


def register_op(name):
    """Class decorator: makes an operator available as GPTConfig.op (and train.py's --op) = name."""
    def add(cls):
        OPS[name] = cls
        return cls
    return add


def all_controls():
    """Every registered op's controls with their defaults: the operator settings train.py
    accepts."""
    return {k: v for Op in OPS.values() for k, v in Op.controls.items()}


class HeadOperator(nn.Module):
    """What the heads of one layer apply to their values: head h computes (a_h·I + b_h·P)·V.

    A subclass gives `coefficients()`, its settings with their defaults in `controls` (train.py
    accepts each as --name=value) and their checks in `check`. Its parameters, the per-head scalars,
    get no weight decay and learn at learning_rate × op_lr_scale."""
    controls = {}

    def __init__(self, n_head):
        super().__init__()
        self.n_head = n_head

    @classmethod
    def check(cls, n_head, controls):
        """Raise a ValueError that names the control when a value is not allowed (its type:
        GPTConfig's)."""

    def scalar(self, name, value, learn=True):
        """One value per head: a Parameter when learned, else a buffer (saved, never trained)."""
        t = torch.full((self.n_head,), float(value))
        if learn:
            self.register_parameter(name, nn.Parameter(t))
        else:
            self.register_buffer(name, t)

    def coefficients(self):
        """(a, b), each (nh,)."""
        return self.a, self.b

    def project(self):
        """Called after every optimizer step: keep learned scalars where they are allowed to be."""

    def forward(self, v, PV):  # v and PV = P·V: (B, nh, T, hs)
        a, b = (c.to(v.dtype).view(-1, 1, 1) for c in self.coefficients())
        return a * v + b * PV  # (a·I + b·P)·V


@register_op("attention")
class Attention(HeadOperator):
    """Softmax attention P: a = 0, b = 1 (kept as buffers that follow the model's device, not
    saved)."""

    def __init__(self, n_head):
        super().__init__(n_head)
        self.register_buffer("a", torch.zeros(n_head), persistent=False)
        self.register_buffer("b", torch.ones(n_head), persistent=False)

    def forward(self, v, PV):
        return PV  # nanoGPT's head exactly: no identity term to add


@register_op("laplacian")
class Laplacian(HeadOperator):
    """The Laplacian I - P (Zhang & Papyan) on the last `laplacian_heads` heads, attention P on the
    rest."""
    controls = dict(
        laplacian_heads=None,  # how many heads (the last ones) are Laplacians; None: half
    )

    @classmethod
    def check(cls, n_head, controls):
        n = controls["laplacian_heads"]
        if n is not None and (type(n) is not int or not 0 <= n <= n_head):
            raise ValueError(f"laplacian_heads={n!r} is not allowed: "
                             f"give an integer in 0..n_head={n_head}, or None for half")

    def __init__(self, n_head, laplacian_heads):
        super().__init__(n_head)
        n = n_head // 2 if laplacian_heads is None else laplacian_heads
        is_lap = (torch.arange(n_head) >= n_head - n).float()
        self.register_buffer("a", is_lap, persistent=False)
        self.register_buffer("b", 1.0 - 2.0 * is_lap, persistent=False)


class FromGammaDelta(HeadOperator):
    """The ops whose heads start at δ(γI + P) from their gamma_init and delta_init: mix, mix_alpha,
    mix_ab."""
    controls = dict(
        gamma_init=0.0,  # every head's γ at the start (0 with δ = 1: attention)
        delta_init=1.0,  # every head's δ at the start
    )

    @classmethod
    def check(cls, n_head, controls):
        if controls["delta_init"] == 0:  # δ = b: its heads would be silent
            raise ValueError("delta_init=0 is not allowed: it silences every head (γ = a/b is then "
                             "undefined); give a non-zero δ, e.g. 1 (attention's)")


@register_op("mix")
class Mix(FromGammaDelta):
    """δ(γI + P), γ and δ per head (the paper): learned from gamma_init, delta_init, or frozen
    there."""
    controls = FromGammaDelta.controls | dict(
        learn_gamma=True,  # False: γ stays at gamma_init
        learn_delta=True,  # False: δ stays at delta_init
        gamma_min=None,  # after every step γ is projected to ≥ gamma_min (the paper's γ ≥ 0 control)
    )

    @classmethod
    def check(cls, n_head, controls):
        super().check(n_head, controls)
        g_min = controls["gamma_min"]
        if g_min is not None and not (type(g_min) in (int, float) and math.isfinite(g_min)):
            raise ValueError(f"gamma_min={g_min!r} is not allowed: give a number (γ is kept ≥ it) or None")
        if g_min is not None and controls["gamma_init"] < g_min:
            raise ValueError(f"gamma_init={controls['gamma_init']} is below gamma_min={g_min}: "
                             "start γ inside its range")

    def __init__(self, n_head, gamma_init, delta_init, learn_gamma, learn_delta, gamma_min):
        super().__init__(n_head)
        self.scalar("gamma", gamma_init, learn_gamma)
        self.scalar("delta", delta_init, learn_delta)
        self.gamma_min = gamma_min

    def coefficients(self):
        return self.delta * self.gamma, self.delta

    @torch.no_grad()
    def project(self):
        if self.gamma_min is not None:
            self.gamma.clamp_(min=self.gamma_min)


@register_op("mix_alpha")
class MixAlpha(FromGammaDelta):
    """α0·I + α1·P, both learned, started where δ(γI + P) starts: α0 = δγ, α1 = δ."""

    def __init__(self, n_head, gamma_init, delta_init):
        super().__init__(n_head)
        self.scalar("alpha0", delta_init * gamma_init)
        self.scalar("alpha1", delta_init)

    def coefficients(self):
        return self.alpha0, self.alpha1


@register_op("mix_ab")
class MixAB(FromGammaDelta):
    """α·P + β(I - P) = β·I + (α - β)·P, learned, started where δ(γI + P) starts: α = δ(1 + γ), β =
    δγ."""

    def __init__(self, n_head, gamma_init, delta_init):
        super().__init__(n_head)
        self.scalar("alpha", delta_init * (1 + gamma_init))
        self.scalar("beta", delta_init * gamma_init)

    def coefficients(self):
        return self.beta, self.alpha - self.beta


# -----------------------------------------------------------------------------
# The materialised reference (teaching, plots, tests)


def causal_softmax(q, k):
    """P = softmax(q·kᵀ/√d) with the causal mask, materialised: (B, nh, T, T)."""
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return att.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def operator_matrix(q, k, a, b, dropout_p=0.0):
    """Every head's operator a·I + b·P, materialised: (B, nh, T, T). a, b: (nh,). Memory grows with
    T²."""
    P = F.dropout(causal_softmax(q, k), dropout_p)  # (B, nh, T, T)
    I = torch.eye(q.size(-2), dtype=P.dtype, device=P.device)  # (T, T)
    return a.to(P.dtype).view(-1, 1, 1) * I + b.to(P.dtype).view(-1, 1, 1) * P
