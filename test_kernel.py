"""Tests for kernel.py: the fused mix-attention kernel against the float64 materialised reference.

On a CPU machine conftest.py sets TRITON_INTERPRET=1, so the Triton kernels run in the interpreter.
Run: python -m pytest -q test_kernel.py
"""
import pytest
import torch

import kernel
from kernel import mix_attention
from operators import operator_matrix

# one head each: attention (0, 1), Laplacian (1, -1), corridor γ=-0.4, δ=1.3 -> (δγ, δ), and a generic mix
A_HEADS = [0.0, 1.0, -0.4 * 1.3, 0.3]
B_HEADS = [1.0, -1.0, 1.3, 0.8]


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(kernel, "POISON", True)  # outputs start as NaN: unwritten elements fail the checks


def make_inputs(B, T, D, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(B, len(A_HEADS), T, D, generator=g).to(device, dtype) for _ in range(4))
    a, b = torch.tensor(A_HEADS, device=device), torch.tensor(B_HEADS, device=device)
    return (q, k, v, a, b), dout


def reference(q, k, v, a, b):
    return operator_matrix(q, k, a, b) @ v


def rel_err(x, ref):
    """max |x - ref| relative to max |ref|; an all-zero reference (dq, dk at T=1: a softmax over one score has
    no gradient) is compared with absolute tolerance via the floor on the denominator."""
    assert torch.isfinite(x).all(), "non-finite values (unwritten output?)"
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-3)).item()


def run_and_compare(inputs, dout, tol, fn=mix_attention, backward=True):
    leaves = [x.clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    ref_leaves = [x.detach().cpu().double().requires_grad_() for x in inputs]
    ref = reference(*ref_leaves)
    assert out.shape == ref.shape and out.dtype == inputs[0].dtype
    assert rel_err(out, ref) <= tol, f"out: {rel_err(out, ref):.2e}"
    if backward:
        grads = torch.autograd.grad(out, leaves, dout)
        ref_grads = torch.autograd.grad(ref, ref_leaves, dout.cpu().double())
        for name, g, r in zip("qkvab", grads, ref_grads):
            assert g.shape == r.shape
            assert rel_err(g, r) <= tol, f"d{name}: {rel_err(g, r):.2e}"


@pytest.mark.parametrize("T,D", [(T, 32) for T in (1, 17, 64, 100, 128)] + [(100, 16), (100, 64), (17, 128)])
def test_matches_reference_fp32(T, D):
    inputs, dout = make_inputs(2, T, D, seed=T * 1000 + D)
    run_and_compare(inputs, dout, tol=1e-3)


def test_fp16():
    inputs, dout = make_inputs(1, 100, 32, dtype=torch.float16, seed=7)
    run_and_compare(inputs, dout, tol=1e-2)


def test_pure_attention_and_laplacian_heads():
    # sanity of the two endpoints: b=1,a=0 is plain causal attention; the first position of a Laplacian head is 0
    (q, k, v, a, b), _ = make_inputs(1, 33, 16, seed=3)
    out = mix_attention(q, k, v, a, b)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out[:, 0], sdpa[:, 0], atol=1e-5, rtol=1e-5)
    assert out[:, 1, 0].abs().max().item() < 1e-5


def test_torch_compile():
    inputs, dout = make_inputs(1, 40, 32, seed=11)

    def f(q, k, v, a, b):
        return 2.0 * mix_attention(q, k, v, a, b) + 1.0

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    leaves = [x.clone().requires_grad_() for x in inputs]
    eager_leaves = [x.clone().requires_grad_() for x in inputs]
    out, eager_out = compiled(*leaves), f(*eager_leaves)
    torch.testing.assert_close(out, eager_out)
    for g, ge in zip(torch.autograd.grad(out, leaves, dout), torch.autograd.grad(eager_out, eager_leaves, dout)):
        torch.testing.assert_close(g, ge)


def _bad_inputs():
    (q, k, v, a, b), _ = make_inputs(1, 8, 16)
    H = q.shape[1]
    return [
        ("4-D", (q[0], k[0], v[0], a, b)),
        ("same shape", (q, k[:, :, :4], v, a, b)),
        ("head dim", (q[..., :8], k[..., :8], v[..., :8], a, b)),
        ("head dim", (torch.randn(1, H, 8, 48), torch.randn(1, H, 8, 48), torch.randn(1, H, 8, 48), a, b)),
        ("a must be 1-D", (q, k, v, a.view(1, H), b)),
        ("b must be 1-D", (q, k, v, a, b[:2])),
        ("floating-point", (q, k, v, a.long(), b)),
        ("dtype", (q, k.half(), v, a, b)),
        ("dtype", (q.double(), k.double(), v.double(), a, b)),
        ("one device", (q, k, v, a.to("meta"), b)),
        ("torch.Tensor", (q, k, v, 0.5, b)),
    ]


@pytest.mark.parametrize("i", range(len(_bad_inputs())))
def test_bad_inputs_raise_value_error(i):
    match, args = _bad_inputs()[i]
    with pytest.raises(ValueError, match=match):
        mix_attention(*args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("T,D", [(1, 64), (100, 64), (1000, 64), (257, 128), (300, 16)])
def test_gpu_bf16(T, D):
    inputs, dout = make_inputs(2, T, D, dtype=torch.bfloat16, device="cuda", seed=T + D)
    run_and_compare(inputs, dout, tol=2e-2)
