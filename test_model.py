"""
Tests for model.py: the operator's identities, fast paths against a float64 materialised reference,
causality, gradients, parameter counts, the γ ≥ gamma_min projection, overfitting, GPT-2 import, bad input.

    python -m pytest -q test_model.py
"""
import math
import os
import subprocess
import sys

import pytest
import torch

from model import GPT, GPTConfig
from operators import OPS, all_controls, causal_softmax, operator_matrix

TINY = dict(block_size=16, vocab_size=32, n_layer=2, n_head=4, n_embd=32)


CONTROLS = all_controls()


def tiny(op, **kw):
    """A tiny config; keyword arguments that are op controls (gamma_init=...) go into controls."""
    controls = {k: v for k, v in kw.items() if k in CONTROLS}
    return GPTConfig(**{**TINY, "op": op, "controls": controls,
                        **{k: v for k, v in kw.items() if k not in CONTROLS}})


def set_corridor(model, gamma, delta):
    """Put model (any mix op) at per-head (γ, δ) of shape (n_layer, n_head), through its own parameters."""
    with torch.no_grad():
        for op, g, d in zip(model.head_operators(), gamma, delta):
            if model.config.op == "mix":
                op.gamma.copy_(g), op.delta.copy_(d)
            elif model.config.op == "mix_alpha":  # α0 = δγ, α1 = δ
                op.alpha0.copy_(d * g), op.alpha1.copy_(d)
            elif model.config.op == "mix_ab":  # β = δγ, α - β = δ
                op.beta.copy_(d * g), op.alpha.copy_(d * (1 + g))


def random_corridor(config, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (config.n_layer, config.n_head)
    u = lambda: torch.rand(shape, generator=g, dtype=torch.float64)
    return u() * 2 - 1.5, u() + 0.5  # γ ∈ (-1.5, 0.5), δ ∈ (0.5, 1.5)


def same_weights(op, source, **kw):
    """A model with another op and the same q/k/v/MLP weights as source (its own γ/δ left at init)."""
    torch.manual_seed(0)
    model = GPT(tiny(op, **kw)).double()
    shared = {k: v for k, v in source.state_dict().items()
              if k in model.state_dict() and v.shape == model.state_dict()[k].shape}
    model.load_state_dict(shared, strict=False)
    return model


def tokens(B=3, T=TINY["block_size"], seed=1):
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def logits(model, idx):
    return model(idx, idx)[0]  # targets given: logits of every position


@pytest.fixture
def attention_model():
    torch.manual_seed(0)
    return GPT(tiny("attention")).double().eval()


# --- identities of the paper --------------------------------------------------------------------------------


def test_mix_at_gamma0_delta1_is_attention(attention_model):
    mix = same_weights("mix", attention_model).eval()
    assert torch.allclose(logits(mix, tokens()), logits(attention_model, tokens()), atol=1e-12)


def test_mix_at_gamma_minus1_delta_minus1_is_all_laplacian(attention_model):
    lap = same_weights("laplacian", attention_model, laplacian_heads=TINY["n_head"]).eval()
    mix = same_weights("mix", attention_model, gamma_init=-1.0, delta_init=-1.0).eval()
    assert torch.allclose(logits(mix, tokens()), logits(lap, tokens()), atol=1e-12)
    gamma, delta = lap.gamma_delta()
    assert (gamma == -1).all() and (delta == -1).all()


@pytest.mark.parametrize("op", ["mix_alpha", "mix_ab"])
def test_alternative_parameterisations_equal_mix(op, attention_model):
    gamma, delta = random_corridor(attention_model.config)
    mix, other = same_weights("mix", attention_model).eval(), same_weights(op, attention_model).eval()
    set_corridor(mix, gamma, delta), set_corridor(other, gamma, delta)
    assert torch.allclose(logits(other, tokens()), logits(mix, tokens()), atol=1e-10)
    for got, want in zip(other.gamma_delta(), (gamma, delta)):
        assert torch.allclose(got.double(), want, atol=1e-6)


def test_corridor_identity_on_materialised_matrices():
    q, k = torch.randn(2, 3, 7, 8, dtype=torch.float64), torch.randn(2, 3, 7, 8, dtype=torch.float64)
    P, I = causal_softmax(q, k), torch.eye(7, dtype=torch.float64)
    for gamma in (-0.9, -0.5, -0.1):
        for delta in (0.7, 1.0, 2.5):
            M = operator_matrix(q, k, torch.full((3,), delta * gamma, dtype=torch.float64),
                                torch.full((3,), delta, dtype=torch.float64))
            convex = delta * (abs(gamma) * (P - I) + (1 - abs(gamma)) * P)  # attention and negative Laplacian
            assert torch.allclose(M, convex, atol=1e-14)
            assert torch.allclose(M.sum(-1), torch.full((2, 3, 7), delta * (1 + gamma), dtype=torch.float64))


def test_attention_dropout_on_the_materialised_path():
    """Dropout acts on P (each weight dropped or scaled by 1/(1-p)), never on the identity term."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 9, 8, dtype=torch.float64), torch.randn(2, 3, 9, 8, dtype=torch.float64)
    a = torch.tensor([0.5, -1.0, 0.2], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0, -0.5], dtype=torch.float64)
    bP = b.view(-1, 1, 1) * causal_softmax(q, k)
    dropped = (operator_matrix(q, k, a, b, dropout_p=0.5)
               - a.view(-1, 1, 1) * torch.eye(9, dtype=torch.float64))
    kept = (dropped - 2 * bP).abs() < 1e-12
    assert (kept | (dropped == 0)).all() and kept[bP != 0].any() and (dropped[bP != 0] == 0).any()


def test_laplacian_rows_sum_to_zero():
    q, k = torch.randn(2, 4, 9, 8, dtype=torch.float64), torch.randn(2, 4, 9, 8, dtype=torch.float64)
    a, b = torch.ones(4, dtype=torch.float64), -torch.ones(4, dtype=torch.float64)  # I - P
    v_const = torch.randn(2, 4, 1, 8, dtype=torch.float64).expand(2, 4, 9, 8)
    assert (operator_matrix(q, k, a, b) @ v_const).abs().max() < 1e-12  # a constant signal has no deviation
    v = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    # the first position sees only itself
    assert (operator_matrix(q, k, a, b) @ v)[:, :, 0].abs().max() < 1e-12
    gamma, delta = -0.3, 1.4  # and a mix head's first position outputs δ(1 + γ)v_0
    y0 = (operator_matrix(q, k, torch.full((4,), delta * gamma, dtype=torch.float64),
                          torch.full((4,), delta, dtype=torch.float64)) @ v)[:, :, 0]
    assert torch.allclose(y0, delta * (1 + gamma) * v[:, :, 0])


def test_laplacian_heads_are_the_trailing_heads():
    model = GPT(tiny("laplacian", n_head=4, laplacian_heads=1))
    gamma, delta = model.gamma_delta()
    assert gamma.tolist() == [[0, 0, 0, -1]] * 2 and delta.tolist() == [[1, 1, 1, -1]] * 2
    assert GPT(tiny("laplacian")).gamma_delta()[0].tolist() == [[0, 0, -1, -1]] * 2  # default: half
    assert (GPT(tiny("laplacian", laplacian_heads=0)).gamma_delta()[0] == 0).all()


# --- fast path == materialised reference, outputs and gradients, every op -----------------------------------


@pytest.mark.parametrize("op", OPS)
def test_sdpa_path_matches_materialised_path(op):
    torch.manual_seed(0)
    fast = GPT(tiny(op, impl="sdpa")).double()
    if op.startswith("mix"):
        set_corridor(fast, *random_corridor(fast.config))
    ref = GPT(tiny(op, impl="materialized")).double()
    ref.load_state_dict(fast.state_dict())
    idx = tokens()
    x = fast.transformer.wte(idx).detach().requires_grad_()  # gradients w.r.t. the block inputs too
    outs = []
    for model in (fast, ref):
        xi = x.detach().clone().requires_grad_()
        h = xi
        for blk in model.transformer.h:
            h = blk(h)
        loss = (h * torch.randn(h.shape, dtype=h.dtype, generator=torch.Generator().manual_seed(3))).sum()
        loss.backward()
        grads = {n: p.grad for n, p in model.transformer.h.named_parameters()}
        outs.append((h.detach(), xi.grad, grads))
    (h1, gx1, g1), (h2, gx2, g2) = outs
    assert torch.allclose(h1, h2, atol=1e-10)
    assert torch.allclose(gx1, gx2, atol=1e-10)
    n_scalars = sum(len(list(head_op.parameters())) for head_op in fast.head_operators())
    # their gradients are compared too
    assert n_scalars == (2 * TINY["n_layer"] if op.startswith("mix") else 0)
    for n in g1:
        assert torch.allclose(g1[n], g2[n], atol=1e-10), n


@pytest.mark.parametrize("op", OPS)
def test_causality(op):
    torch.manual_seed(0)
    model = GPT(tiny(op)).double().eval()
    if op.startswith("mix"):
        set_corridor(model, *random_corridor(model.config))
    idx = tokens(B=2)
    t = 7
    changed = idx.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % TINY["vocab_size"]
    a, b = logits(model, idx), logits(model, changed)
    assert torch.allclose(a[:, :t + 1], b[:, :t + 1], atol=1e-12)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])  # the test can see a change when there is one


# --- parameters, optimizer, projection ----------------------------------------------------------------------


def test_parameter_counts():
    base = GPT(tiny("attention")).get_num_params()
    C, V, L, H, T = TINY["n_embd"], TINY["vocab_size"], TINY["n_layer"], TINY["n_head"], TINY["block_size"]
    per_block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    assert base == V * C + L * per_block + 2 * C  # tied embedding, blocks, ln_f; position embeddings excluded
    assert GPT(tiny("attention")).get_num_params(non_embedding=False) == base + T * C
    assert GPT(tiny("laplacian")).get_num_params() == base
    for op in ("mix", "mix_alpha", "mix_ab"):
        assert GPT(tiny(op)).get_num_params() == base + 2 * L * H
    assert GPT(tiny("mix", learn_gamma=False)).get_num_params() == base + L * H
    frozen = GPT(tiny("mix", gamma_init=-0.5, learn_gamma=False, learn_delta=False))
    assert frozen.get_num_params() == base
    assert frozen.gamma_delta()[0].eq(-0.5).all() and frozen.gamma_delta()[1].eq(1.0).all()


def test_init_is_gpt2s():
    """N(0, 0.02) weights, zero biases, and residual projections scaled by 1/√(2·n_layer), as in GPT-2."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=256, vocab_size=512, block_size=64, op="mix"))
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            assert p.std().item() == pytest.approx(0.02 / math.sqrt(2 * 4), rel=0.05), name
        elif name.endswith(("c_attn.weight", "c_fc.weight", "wte.weight", "wpe.weight")):
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
        elif name.endswith("bias") and "ln_" not in name:
            assert p.eq(0).all(), name


def test_no_weight_decay_on_corridor_scalars_and_their_lr_scale():
    model = GPT(tiny("mix_ab"))
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), op_lr_scale=50.0)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    scaled = {id(p) for g in opt.param_groups if g["lr"] == 5e-2 for p in g["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in decayed) == (p.dim() >= 2), name
        assert (id(p) in scaled) == name.endswith((".alpha", ".beta")), name


def test_gamma_min_holds_after_optimizer_steps():
    torch.manual_seed(0)
    model = GPT(tiny("mix", gamma_min=0.0))
    opt = model.configure_optimizers(0.0, 0.05, (0.9, 0.95))
    idx = tokens()
    went_below = False
    for _ in range(20):
        # pushes γ down
        loss = model(idx, idx)[1] + 10 * sum(op.gamma.sum() for op in model.head_operators())
        opt.zero_grad()
        loss.backward()
        opt.step()
        went_below |= bool((model.gamma_delta()[0] < 0).any())
        model.project()
        assert (model.gamma_delta()[0] >= 0).all()
    assert went_below  # the projection had work to do


def test_frozen_scalars_do_not_move():
    torch.manual_seed(0)
    model = GPT(tiny("mix", gamma_init=-0.5, learn_gamma=False, learn_delta=False))
    opt = model.configure_optimizers(0.0, 0.05, (0.9, 0.95))
    for _ in range(3):
        loss = model(tokens(), tokens())[1]
        opt.zero_grad(), loss.backward(), opt.step()
    gamma, delta = model.gamma_delta()
    assert gamma.eq(-0.5).all() and delta.eq(1.0).all()
    # frozen, yet saved with the model: a checkpoint holds every head's γ and δ, whatever was learned
    state = model.state_dict()
    assert (state["transformer.h.0.attn.op.gamma"].eq(-0.5).all()
            and state["transformer.h.0.attn.op.delta"].eq(1.0).all())


@pytest.mark.parametrize("op", OPS)
def test_every_op_overfits_one_batch(op):
    torch.manual_seed(0)
    model = GPT(tiny(op))
    opt = model.configure_optimizers(0.0, 3e-3, (0.9, 0.95))
    idx = tokens(B=4)
    x, y = idx[:, :-1], idx[:, 1:]
    first = None
    for _ in range(150):
        _, loss = model(x, y)
        first = first or loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > math.log(TINY["vocab_size"]) - 0.2 and loss.item() < 0.2, (first, loss.item())


def kernel_and_sdpa_models(device):
    """The same mix model (head size 16, distinct γ/δ per head) with impl='triton' and impl='sdpa', on the
    device where the kernel runs (conftest.py's kernel_device: the GPU, or a CPU in the interpreter)."""
    torch.manual_seed(0)
    models = [GPT(tiny("mix", impl=impl, n_embd=64)) for impl in ("triton", "sdpa")]
    models[1].load_state_dict(models[0].state_dict())
    for m in models:
        set_corridor(m, *random_corridor(m.config))
    return [m.to(device) for m in models]


def assert_same_loss_and_grads(forwards, models):
    torch.backends.cuda.matmul.allow_tf32 = False  # full fp32 matmuls on both sides
    device = next(models[0].parameters()).device
    losses = [f(tokens().to(device), tokens().to(device))[1] for f in forwards]
    for loss in losses:
        loss.backward()
    assert abs(losses[0].item() - losses[1].item()) < 1e-5
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name


def test_kernel_training_step_equals_sdpa_step(kernel_device):
    """A training step through the fused Triton kernel (CPU interpreter here) gives the loss and the
    gradients of the SDPA step."""
    models = kernel_and_sdpa_models(kernel_device)
    assert_same_loss_and_grads(models, models)
    # and the same optimizer step (plain SGD: AdamW would blow rounding noise in zero gradients up to lr)
    for m in models:
        torch.optim.SGD(m.parameters(), lr=0.1).step()
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_compiled_model_through_the_kernel_equals_eager_sdpa(kernel_device):
    """torch.compile traces around the kernel's custom op (q arrives as a transposed, non-contiguous view)."""
    models = kernel_and_sdpa_models(kernel_device)
    compiled = torch.compile(models[0], backend="aot_eager", fullgraph=True)
    assert_same_loss_and_grads([compiled, models[1]], models)


# --- generation, MFU, demo ----------------------------------------------------------------------------------


def test_generate_samples_from_softmax_of_logits_over_temperature_within_top_k(monkeypatch):
    torch.manual_seed(0)
    model = GPT(tiny("mix")).eval()
    prompt = tokens(B=2, T=4)
    # (B, vocab) the logits of the first new token, from the full forward
    last = logits(model, prompt)[:, -1, :]
    seen = []
    multinomial = torch.multinomial
    def recorded(probs, **kw):
        seen.append(probs.clone())
        return multinomial(probs, **kw)
    monkeypatch.setattr(torch, "multinomial", recorded)
    for temperature, top_k in ((0.5, None), (2.0, None), (1.0, 3)):
        out = model.generate(prompt, max_new_tokens=20, temperature=temperature, top_k=top_k)
        assert out.shape == (2, 24) and torch.equal(out[:, :4], prompt)  # runs past block_size by cropping
        want = last / temperature
        if top_k:
            want = want.masked_fill(want < want.topk(top_k).values[:, [-1]], float("-inf"))
        assert torch.allclose(seen[-20], want.softmax(-1), atol=1e-6)
        if not top_k:  # past block_size the model sees only the last block_size tokens
            window = out[:, -1 - TINY["block_size"]:-1]
            assert torch.allclose(seen[-1], (logits(model, window)[:, -1, :] / temperature).softmax(-1),
                                  atol=1e-6)
        if top_k:
            assert ((seen[-1] > 0).sum(-1) == top_k).all()
    greedy = model.generate(prompt, max_new_tokens=5, temperature=0)
    assert torch.equal(greedy[:, 4], last.argmax(-1))
    assert model.estimate_mfu(1, 0.1, None) is None  # no peak FLOP/s to compare against, as on a CPU


def test_evaluation_is_deterministic_with_dropout():
    torch.manual_seed(0)
    model = GPT(tiny("mix", dropout=0.5, impl="sdpa"))
    model.eval()
    assert torch.equal(logits(model, tokens()), logits(model, tokens()))  # no dropout in eval mode, anywhere
    model.train()
    assert not torch.equal(logits(model, tokens()), logits(model, tokens()))  # the test can see dropout


@pytest.mark.parametrize("op", ["mix", "mix_alpha", "mix_ab"])
def test_every_mix_op_starts_at_gamma_init_delta_init(op):
    gamma, delta = GPT(tiny(op, gamma_init=-0.3, delta_init=1.7)).gamma_delta()
    assert (torch.allclose(gamma, torch.full_like(gamma, -0.3))
            and torch.allclose(delta, torch.full_like(delta, 1.7)))
    with pytest.raises(ValueError, match=r"^delta_init=0 is not allowed: .*γ = a/b is then undefined"):
        tiny(op, delta_init=0)  # every head silenced, its γ = a/b NaN in every log


def test_demo_prints_operator_and_identity(capsys):
    from model import demo
    M = demo("laplacian")
    assert torch.allclose(M[-1].sum(-1), torch.zeros(M.size(-1), dtype=M.dtype), atol=1e-12)
    M = demo("mix", gamma=-0.5)
    assert torch.allclose(M[0].sum(-1), torch.full((M.size(-1),), 0.5, dtype=M.dtype))
    out = capsys.readouterr().out
    assert "row sums" in out and "corridor identity" in out
    p = subprocess.run([sys.executable, "model.py", "--op=laplacian"], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.abspath(__file__)))  # the classroom command itself
    assert p.returncode == 0 and "op=laplacian: head 3 of layer 0" in p.stdout, p.stderr


# --- GPT-2 import, offline ----------------------------------------------------------------------------------


def test_from_pretrained_matches_hf_gpt2(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(n_positions=32, n_embd=48, n_layer=2, n_head=4, vocab_size=100)
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    hf.save_pretrained(tmp_path)
    idx = torch.randint(0, 100, (2, 32))
    want = hf(idx).logits
    model = GPT.from_pretrained(str(tmp_path), op="mix").eval()
    got = model(idx, idx)[0]
    # float32 rounding is ~1e-7; the exact GELU instead of tanh moves 5e-6
    assert (got - want).abs().max() <= 1e-6
    gamma, delta = model.gamma_delta()
    assert gamma.eq(0).all() and delta.eq(1).all()
    model.crop_block_size(16)  # keeps the first 16 positions' embeddings
    assert (model(idx[:, :16], idx[:, :16])[0] - hf(idx[:, :16]).logits).abs().max() <= 1e-6
    lap = GPT.from_pretrained(str(tmp_path), op="laplacian").eval()
    assert (lap(idx, idx)[0] - want).abs().max() > 1e-3  # a different op really computes something else


# --- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, words", [
    (dict(op="softmax"), "op='softmax' is not allowed: choose one of attention"),
    (dict(op="laplacian", laplacian_heads=5), "laplacian_heads=5 is not allowed"),
    (dict(op="laplacian", laplacian_heads=-1), "laplacian_heads=-1 is not allowed"),
    (dict(op="laplacian", laplacian_heads=1.5), "laplacian_heads=1.5 is not allowed"),
    (dict(n_embd=30), "n_embd=30 is not allowed"),
    (dict(n_layer=0), "n_layer=0 is not allowed"),
    (dict(dropout=1.0), "dropout=1.0 is not allowed"),
    (dict(op="attention", gamma_init=-0.5), "gamma_init is not a control of op='attention'"),
    (dict(op="laplacian", learn_delta=False), "learn_delta is not a control of op='laplacian'"),
    (dict(op="mix_alpha", gamma_min=0.0), "gamma_min is not a control of op='mix_alpha'"),
    (dict(op="mix", laplacian_heads=1), "laplacian_heads is not a control of op='mix'"),
    (dict(op="mix", gamma_min=0.0, gamma_init=-0.5), "gamma_init=-0.5 is below gamma_min=0.0"),
    (dict(op="mix", gamma_min="low"), "gamma_min='low' is not allowed"),
    (dict(impl="cuda"), "impl='cuda' is not allowed"),
    (dict(gelu="fast"), "gelu='fast' is not allowed"),
])
def test_bad_config_raises_clear_error(kw, words):
    with pytest.raises(ValueError, match=words):
        tiny(**{"op": "attention", **kw})


def test_too_long_sequence_and_unknown_pretrained_name(tmp_path):
    model = GPT(tiny("mix"))
    with pytest.raises(ValueError, match="sequence length 17 is longer than block_size=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown pretrained model 'gpt3'"):
        GPT.from_pretrained("gpt3")
    with pytest.raises(ValueError, match="is not a directory saved with transformers' save_pretrained"):
        GPT.from_pretrained(str(tmp_path))  # an existing directory that holds no model


# --- more of the contract: impl choice, config messages, inference, optimizer groups, MFU, checkpoints ------


@pytest.mark.parametrize("kw, message", [
    (dict(dropout=-0.1), "dropout=-0.1 is not allowed: it must be in [0, 1)"),
    (dict(dropout=1.0), "dropout=1.0 is not allowed: it must be in [0, 1)"),
    (dict(n_layer=0), "n_layer=0 is not allowed: it must be a positive integer"),
    (dict(n_embd=30), "n_embd=30 is not allowed: it must be divisible by n_head=4"),
    (dict(impl="cuda"), "impl='cuda' is not allowed: choose one of sdpa, materialized, triton"),
    (dict(impl="auto"), "impl='auto' is not allowed: choose one of sdpa, materialized, triton"),
    (dict(impl="triton", dropout=0.1),
     "impl='triton' is not allowed: the fused kernel has no attention dropout; use dropout=0.0 or "
     "impl='sdpa'"),
    (dict(gelu="fast"), "gelu='fast' is not allowed: choose one of none, tanh"),
    (dict(op="attention", gamma_init=-0.5),
     "gamma_init is not a control of op='attention' (its controls: none); drop it or change op"),
    (dict(op="mix", laplacian_heads=1), "laplacian_heads is not a control of op='mix' (its controls: "
                                        "gamma_init, "
                                        "delta_init, learn_gamma, learn_delta, gamma_min); drop it or change "
                                        "op"),
    (dict(op="laplacian", laplacian_heads=True),
     "laplacian_heads=True is not allowed: give an integer in 0..n_head=4, or None for half"),
    (dict(op="mix", gamma_min=True), "gamma_min=True is not allowed: give a number (γ is kept ≥ it) or "
                                     "None"),
    (dict(op="mix", gamma_min=0.0, gamma_init=-0.01),
     "gamma_init=-0.01 is below gamma_min=0.0: start γ inside its range"),
    (dict(op="mix", gamma_min=math.nan),
     "gamma_min=nan is not allowed: give a number (γ is kept ≥ it) or None"),
])
def test_bad_config_message_says_what_is_allowed(kw, message):
    with pytest.raises(ValueError) as e:
        tiny(**{"op": "attention", **kw})
    assert str(e.value) == message


def without_triton(monkeypatch):
    """This process as where triton is not installed: `import triton` (and kernel.py) fails."""
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "kernel", raising=False)


def test_impl_triton_without_triton_is_refused_by_the_config(monkeypatch):
    without_triton(monkeypatch)
    with pytest.raises(ValueError) as e:
        tiny("mix", impl="triton")
    assert str(e.value) == ("impl='triton' is not allowed: the triton package is not installed (Linux only); "
                            "use impl='sdpa'")


def test_impl_triton_takes_exactly_the_kernels_head_sizes():
    """GPTConfig refuses impl='triton' with a head size the kernel has no launch config for at once, where the
    config is made (before a run prepares data), and takes every head size kernel.py's table has."""
    kernel = pytest.importorskip("kernel", exc_type=ImportError)
    for head_size in range(1, 257):
        if head_size in kernel.HEAD_DIMS:
            GPTConfig(n_head=2, n_embd=2 * head_size, impl="triton")
        else:
            with pytest.raises(ValueError, match=f"not n_embd / n_head = {head_size}; use impl='sdpa'"):
                GPTConfig(n_head=2, n_embd=2 * head_size, impl="triton")
    with pytest.raises(ValueError) as e:
        tiny("attention", impl="triton", n_embd=192, n_head=4)
    assert str(e.value) == ("impl='triton' is not allowed: the fused kernel takes head sizes 16, 32, 64 and "
                            "128, not n_embd / n_head = 48; use impl='sdpa'")


def test_from_checkpoint_rebuilds_the_model_and_refuses_weights_that_do_not_fit():
    """GPT.from_checkpoint: the same model from train.py's dict; load_state_dict(strict=True) refuses a
    missing, an unexpected or a mis-shaped weight."""
    model = GPT(tiny("mix", gamma_init=-0.3))
    ckpt = {"model": model.state_dict(), "model_args": vars(model.config)}
    again = GPT.from_checkpoint(ckpt, dropout=0.1)
    assert again.config.dropout == 0.1 and again.config.controls == model.config.controls
    x = torch.randint(0, 32, (2, 16))
    assert torch.equal(again.eval()(x, x)[1], model.eval()(x, x)[1])
    for edit, words in ((lambda sd: sd.pop("lm_head.weight"), "Missing key"),
                        (lambda sd: sd.update(extra=torch.zeros(1)), "Unexpected key"),
                        (lambda sd: sd.update({"transformer.ln_f.weight": torch.zeros(8)}),
                         "size mismatch for transformer.ln_f.weight"),
                        (lambda sd: sd.update({"transformer.wpe.weight": torch.zeros(8, 32)}),
                         "size mismatch for transformer.wpe.weight"),
                        (lambda sd: sd.pop("transformer.h.1.ln_1.weight"), "Missing key")):
        weights = dict(model.state_dict())
        edit(weights)
        unfit = r"^the checkpoint does not fit this code \(RuntimeError: .*"
        with pytest.raises(ValueError, match=unfit + words):
            GPT.from_checkpoint({"model": weights, "model_args": vars(model.config)})


def test_from_checkpoint_names_the_callers_own_setting_not_the_checkpoint():
    """A setting the caller changes is checked as the caller's (GPTConfig's own line: a triton run resumed
    with dropout is the user's choice, not a damaged checkpoint); the checkpoint's own ones as the file's."""
    pytest.importorskip("kernel", exc_type=ImportError)  # kernel.py says which torch it needs
    model = GPT(tiny("mix", impl="triton", n_head=2))  # head size 16, which the kernel takes
    ckpt = {"model": model.state_dict(), "model_args": vars(model.config)}
    with pytest.raises(ValueError) as e:
        GPT.from_checkpoint(ckpt, dropout=0.1)
    assert str(e.value) == ("impl='triton' is not allowed: the fused kernel has no attention dropout; "
                            "use dropout=0.0 or impl='sdpa'")
    assert GPT.from_checkpoint(ckpt, dropout=0.1, impl="sdpa").config.dropout == 0.1
    with pytest.raises(ValueError, match=r"^n_embd=32 is not allowed: it must be divisible by n_head=3$"):
        GPT.from_checkpoint({**ckpt, "model_args": {**ckpt["model_args"], "n_head": 3}}, dropout=0.1)


def test_from_checkpoint_of_a_triton_run_loads_with_sdpa_where_triton_is_missing(monkeypatch):
    """A run trained with the fused kernel, loaded where triton is not installed: impl='sdpa', the caller's
    change, replaces the checkpoint's impl before anything is checked against this machine."""
    model = GPT(tiny("mix", n_head=2))  # head size 16, which the kernel takes
    ckpt = {"model": model.state_dict(), "model_args": {**vars(model.config), "impl": "triton"}}
    without_triton(monkeypatch)
    with pytest.raises(ValueError, match="the triton package is not installed"):  # as the file says
        GPT.from_checkpoint(ckpt)
    again = GPT.from_checkpoint(ckpt, impl="sdpa")
    assert again.config.impl == "sdpa" and again.config.controls == model.config.controls


def test_model_imports_and_builds_where_triton_is_missing():
    """model.py imports kernel.py (and with it triton) only for impl='triton': where triton is missing an
    SDPA model builds, and impl='triton' is refused by the config in one line."""
    code = ("import sys\n"
            "sys.modules['triton'] = None  # `import triton` raises ImportError, as without triton\n"
            "from model import GPT, GPTConfig\n"
            "GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=32))\n"
            "try:\n"
            "    GPTConfig(impl='triton')\n"
            "except ValueError as e:\n"
            "    print(e)\n"
            "print('kernel' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert p.returncode == 0, p.stderr
    assert p.stdout == ("impl='triton' is not allowed: the triton package is not installed (Linux only); "
                        "use impl='sdpa'\nFalse\n")


def test_the_config_takes_the_head_sizes_from_the_kernels_table(monkeypatch):
    """The head-size rule is kernel.HEAD_DIMS, said once: the config's refusal follows the table."""
    kernel = pytest.importorskip("kernel", exc_type=ImportError)
    monkeypatch.setattr(kernel, "HEAD_DIMS", (16, 32, 48))
    assert GPTConfig(n_head=2, n_embd=96, impl="triton").n_embd == 96  # head size 48, now in the table
    with pytest.raises(ValueError) as e:
        GPTConfig(n_head=2, n_embd=128, impl="triton")
    assert str(e.value) == ("impl='triton' is not allowed: the fused kernel takes head sizes 16, 32 and 48, "
                            "not n_embd / n_head = 64; use impl='sdpa'")


@pytest.mark.parametrize("kw", [dict(dropout=0.0), dict(dropout=0.99), dict(n_layer=1, n_head=1, n_embd=1),
                                dict(op="laplacian", laplacian_heads=4),
                                dict(op="mix", gamma_min=-1, gamma_init=-1),
                                dict(op="mix_ab", gamma_init=0, delta_init=2)])
def test_config_boundaries_are_accepted(kw):
    """The last allowed values: dropout just under 1, sizes of 1, all heads Laplacian, γ at gamma_min."""
    tiny(**{"op": "attention", **kw})


def test_integer_controls_make_float_scalars():
    """gamma_init=0, delta_init=1 written as integers: the scalars are float32, the learned ones learn."""
    for op in ("mix", "mix_alpha", "mix_ab"):
        head_op = OPS[op](4, **{**OPS[op].controls, "gamma_init": 0, "delta_init": 1})
        assert all(p.dtype == torch.float32 and p.requires_grad for p in head_op.parameters())
    frozen = OPS["mix"](4, **{**OPS["mix"].controls, "gamma_init": -1, "learn_gamma": False})
    assert frozen.gamma.dtype == torch.float32 and frozen.gamma.tolist() == [-1.0] * 4


def test_inference_returns_only_the_last_position():
    """Without targets the model returns the logits of the last position only, (B, 1, vocab), and no loss."""
    torch.manual_seed(0)
    model = GPT(tiny("mix")).double().eval()
    idx = tokens(B=2, T=9)
    out, loss = model(idx)
    assert loss is None and out.shape == (2, 1, TINY["vocab_size"])
    assert torch.allclose(out[:, 0], logits(model, idx)[:, -1], atol=1e-12)


def test_targets_of_minus_one_are_ignored():
    """Target -1 marks a position without a target: the loss is the mean cross-entropy over the others."""
    torch.manual_seed(0)
    model = GPT(tiny("mix")).double().eval()
    idx = tokens(B=2, T=8)
    targets = tokens(B=2, T=8, seed=2)
    targets[0, :3] = -1
    targets[1, 5] = -1
    full, loss = model(idx, targets)
    keep = targets != -1
    want = -full.log_softmax(-1)[keep].gather(-1, targets[keep][:, None]).mean()
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)  # the loss is computed in float32


def test_crop_block_size():
    """Cropping keeps the first positions' embeddings (same logits) and refuses inputs beyond the new size."""
    torch.manual_seed(0)
    model = GPT(tiny("mix")).double().eval()
    idx = tokens(B=2, T=8)
    before = logits(model, idx)
    model.crop_block_size(8)
    assert model.config.block_size == 8 and model.transformer.wpe.weight.shape == (8, TINY["n_embd"])
    assert torch.allclose(logits(model, idx), before, atol=1e-12)
    with pytest.raises(ValueError, match="sequence length 9 is longer than block_size=8"):
        model(tokens(B=1, T=9))


@pytest.mark.parametrize("op", ["mix", "attention"])
def test_optimizer_groups_exactly(op):
    """Every trainable parameter in exactly one group: 2-D weights decayed at the base lr; norms and biases
    undecayed at the base lr; the operator's scalars undecayed at lr × op_lr_scale; no empty groups."""
    model = GPT(tiny(op, learn_delta=False) if op == "mix" else tiny(op))
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), op_lr_scale=50.0)
    where = {}
    for g in opt.param_groups:
        assert g["params"] and g["betas"] == (0.9, 0.95)
        for p in g["params"]:
            assert id(p) not in where
            where[id(p)] = (g["weight_decay"], g["lr"])
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert len(where) == len(params)
    for name, p in params:
        if ".attn.op." in name:
            assert name.endswith(".gamma") and where[id(p)] == (0.0, 5e-2), name  # δ is frozen: a buffer
        else:
            assert where[id(p)] == ((0.1, 1e-3) if p.dim() >= 2 else (0.0, 1e-3)), name
    assert [g.get("lr_scale") for g in opt.param_groups] == [None, None] + ([50.0] if op == "mix" else [])


def test_estimate_mfu_against_the_palm_formula():
    """MFU = (6N + 12·L·H·Q·T) FLOPs per token × T tokens × sequences per iteration / seconds
    / peak FLOP/s."""
    model = GPT(tiny("mix"))
    N = model.get_num_params()
    L, H, Q, T = 2, 4, 8, 16  # TINY: n_layer, n_head, n_embd / n_head, block_size
    flops_per_s = (6 * N + 12 * L * H * Q * T) * T * 3 / 0.5
    assert model.estimate_mfu(3, 0.5, 1e12) == pytest.approx(flops_per_s / 1e12, rel=1e-12)


@pytest.mark.parametrize("op, saved", [
    ("attention", []), ("laplacian", []),  # fixed coefficients follow from the config: not in the checkpoint
    ("mix", ["gamma", "delta"]), ("mix_alpha", ["alpha0", "alpha1"]), ("mix_ab", ["alpha", "beta"]),
])
def test_checkpoint_holds_exactly_the_operators_scalars(op, saved):
    state = GPT(tiny(op)).state_dict()
    assert ([k for k in state if ".attn.op." in k]
            == [f"transformer.h.{i}.attn.op.{s}" for i in range(2) for s in saved])


@pytest.mark.parametrize("op", OPS)
def test_head_operator_keeps_the_values_dtype(op):
    """Under bf16 autocast v and P·V are bf16, the scalars stay fp32: the output is bf16, a·v + b·PV."""
    torch.manual_seed(0)
    head_op = OPS[op](4, **OPS[op].controls)
    if op.startswith("mix"):
        with torch.no_grad():
            for p in head_op.parameters():
                p.copy_(torch.tensor([0.5, -1.0, 1.5, -0.25]))
    v, pv = torch.randn(2, 4, 5, 16).bfloat16(), torch.randn(2, 4, 5, 16).bfloat16()
    y = head_op(v, pv)
    a, b = (c.double().view(-1, 1, 1) for c in head_op.coefficients())
    assert y.dtype == torch.bfloat16 and y.shape == v.shape
    assert torch.allclose(y.double(), a * v.double() + b * pv.double(), atol=0.05)


@pytest.mark.parametrize("impl", ["sdpa", "materialized"])
def test_attention_dropout_acts_in_training_on_every_path(impl):
    torch.manual_seed(0)
    model = GPT(tiny("mix", dropout=0.5, impl=impl))
    model.transformer.drop.p = 0.0  # only attention (and residual) dropout: switch off the embedding dropout
    for block in model.transformer.h:
        block.attn.resid_dropout.p = block.mlp.dropout.p = 0.0
    model.eval()
    assert torch.equal(logits(model, tokens()), logits(model, tokens()))
    model.train()
    assert not torch.equal(logits(model, tokens()), logits(model, tokens()))


def test_generate_with_top_k_one_or_beyond_the_vocabulary():
    """top_k=1 samples the most likely token (greedy); a top_k above the vocabulary size keeps every token."""
    torch.manual_seed(0)
    model = GPT(tiny("mix")).eval()
    prompt = tokens(B=2, T=4)
    assert torch.equal(model.generate(prompt, 6, top_k=1), model.generate(prompt, 6, temperature=0))
    assert model.generate(prompt, 2, top_k=10 * TINY["vocab_size"]).shape == (2, 6)
