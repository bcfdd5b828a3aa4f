"""model.py: every operator form is the math it claims, on both attention paths."""

import math

import pytest
import torch
import torch.nn.functional as F

from common import UserError, model_config
from model import GPT, OPERATORS, CausalSelfAttention, GPTConfig, gamma_delta

FORMS = list(OPERATORS)
LEARNABLE = [name for name, form in OPERATORS.items() if form.learnable]


def reads(operator, **keys):
    """The keys of these that the form's table entry says it reads: a test over every form asks the table which of
    its starts (gamma_init, init_spread, ...) a form takes, so a form with keys of its own runs these tests as is."""
    return {key: value for key, value in keys.items() if key in OPERATORS[operator].keys}


def tiny_config(**overrides):
    return GPTConfig(**{**dict(block_size=16, vocab_size=50, n_layer=2, n_head=4, n_embd=32), **overrides})


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return GPT(tiny_config(**overrides))


def with_weights_of(base, **overrides):
    """A model of another form carrying base's weights (all but the operator scalars)."""
    model = build(**overrides)
    model.load_state_dict(base.state_dict(), strict=False)
    return model


def tokens(B=3, T=16, seed=1, vocab=50):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def train_steps(model, steps=5, lr=1e-2):
    """A few AdamW steps on random data, so that heads (and their scalars) differ."""
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=lr, betas=(0.9, 0.95), device_type='cpu')
    for i in range(steps):
        idx = tokens(seed=100 + i)
        _, loss = model(idx[:, :-1], idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def causal_softmax_by_hand(attn, x):
    """P of every head [B, H, T, T] and V [B, H, T, hs], computed from scratch."""
    B, T, C = x.shape
    H = attn.n_head
    q, k, v = attn.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(C // H)
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1), float('-inf'))
    return scores.softmax(-1), v


def merge_heads_and_project(attn, y):
    B, H, T, hs = y.shape
    return attn.c_proj(y.transpose(1, 2).reshape(B, T, H * hs))


# ----------------------------------------------------------------------------------------- operator identities

def test_corridor_at_gamma0_delta1_is_attention():
    attention = build(operator='attention').eval()
    corridor = with_weights_of(attention, operator='corridor', gamma_init=0.0, delta_init=1.0).eval()
    idx = tokens()
    torch.testing.assert_close(corridor(idx)[0], attention(idx)[0], atol=1e-6, rtol=0)


def test_laplacian_heads_are_identity_minus_P():
    torch.manual_seed(0)
    attn = CausalSelfAttention(tiny_config(operator='laplacian', laplacian_heads=2)).double()
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    P, v = causal_softmax_by_hand(attn, x)
    eye = torch.eye(10, dtype=torch.float64)
    per_head = [P[:, h] if h < 2 else eye - P[:, h] for h in range(4)]  # heads 2, 3 are the last two
    expected = merge_heads_and_project(attn, torch.stack([op @ v[:, h] for h, op in enumerate(per_head)], dim=1))
    torch.testing.assert_close(attn(x)[0], expected)                   # fast path
    torch.testing.assert_close(attn(x, return_probs=True)[0], expected)  # math path


@pytest.mark.parametrize('operator', LEARNABLE)
def test_operator_is_cI_V_plus_cP_PV_with_P_built_by_hand(operator):
    torch.manual_seed(0)
    attn = CausalSelfAttention(tiny_config(operator=operator, **reads(operator, gamma_init=-0.4, delta_init=1.3,
                                                                      init_spread=0.5))).double()
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    P, v = causal_softmax_by_hand(attn, x)
    c_I, c_P = (c.view(1, -1, 1, 1) for c in attn.coefficients())
    expected = merge_heads_and_project(attn, c_I * v + c_P * (P @ v))
    torch.testing.assert_close(attn(x)[0], expected)
    y, probs = attn(x, return_probs=True)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(probs, P)


def test_alpha_forms_with_parameters_mapped_from_gamma_delta_give_the_corridor():
    corridor = build(operator='corridor', gamma_init=-0.4, delta_init=1.3, init_spread=0.5).eval()
    alpha = with_weights_of(corridor, operator='alpha').eval()
    alpha_beta = with_weights_of(corridor, operator='alpha_beta').eval()
    with torch.no_grad():
        for blocks in zip(corridor.transformer.h, alpha.transformer.h, alpha_beta.transformer.h):
            c, a, ab = (b.attn.coefficients for b in blocks)
            gamma, delta = c.gamma, c.delta
            assert gamma.std() > 0.05  # the heads really differ
            a.alpha0.copy_(delta * gamma)          # α0·I + α1·P = δγ·I + δ·P
            a.alpha1.copy_(delta)
            ab.alpha.copy_(delta * (1 + gamma))    # αP + β(I − P) = β·I + (α − β)·P
            ab.beta.copy_(delta * gamma)
    idx = tokens()
    expected = corridor(idx)[0]
    torch.testing.assert_close(alpha(idx)[0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alpha_beta(idx)[0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('operator', FORMS)
def test_operator_coefficients_follow_the_table(operator):
    gamma0, delta0 = -0.3, 1.5
    coefficients = build(operator=operator, **reads(operator, gamma_init=gamma0, delta_init=delta0,
                                                    laplacian_heads=1)).operator_coefficients()
    assert coefficients.shape == (2, 4, 2) and coefficients.dtype == torch.float32
    assert coefficients.device.type == 'cpu' and not coefficients.requires_grad
    fixed = {'attention': [[0.0, 1.0]] * 4, 'laplacian': [[0.0, 1.0]] * 3 + [[1.0, -1.0]]}
    # the fixed forms' own numbers (a new fixed form's are its own); the learnable ones follow the rule below
    if operator in fixed:
        torch.testing.assert_close(coefficients, torch.tensor([fixed[operator]] * 2))
    gamma, delta = gamma_delta(coefficients)
    if 'gamma_init' in OPERATORS[operator].keys:  # a form that reads γ0 starts there, and at δ0 if δ is one of its two
        torch.testing.assert_close(gamma, torch.full((2, 4), gamma0))
        if len(OPERATORS[operator].params) == 2:
            torch.testing.assert_close(delta, torch.full((2, 4), delta0))
    if operator == 'laplacian':
        assert gamma[:, -1].tolist() == [-1.0, -1.0] and delta[:, -1].tolist() == [-1.0, -1.0]


def test_every_weight_starts_as_gpt2_initialises_it():
    """GPT-2's initialisation, group by group: every Linear and embedding N(0, 0.02), the two residual projections of
    each block N(0, 0.02/√(2·n_layer)) (the residual stream's variance stays O(1) over depth), biases 0, LayerNorms
    (1, 0), the output layer the token embedding itself. Sampled stds within 4 % (each group holds ≥ 16k weights:
    the std's relative sampling error is ≤ 0.6 %)."""
    torch.manual_seed(0)
    n_layer = 6
    model = GPT(GPTConfig(n_layer=n_layer, n_head=4, n_embd=64, block_size=256, vocab_size=300, bias=True,
                          operator='corridor'))
    assert model.lm_head.weight is model.transformer.wte.weight
    residual = 0.02 / math.sqrt(2 * n_layer)
    expected = {'wte': 0.02, 'wpe': 0.02, 'attn.c_attn': 0.02, 'mlp.c_fc': 0.02, 'attn.c_proj': residual,
                'mlp.c_proj': residual}
    groups = {key: [] for key in expected}
    for name, p in model.named_parameters():
        if name.endswith('.bias'):
            assert torch.all(p == 0), name
        elif '.ln_' in name or 'ln_f' in name:
            assert torch.all(p == 1), name
        elif not name.endswith(('coefficients.gamma', 'coefficients.delta')):
            groups[next(key for key in expected if f'{key}.weight' in name)].append(p.detach().flatten())
    for key, std in expected.items():
        weights = torch.cat(groups[key])
        assert weights.numel() >= 16_000 and abs(weights.mean().item()) < 3 * std / math.sqrt(weights.numel())
        assert weights.std().item() == pytest.approx(std, rel=0.04), key
    assert groups['attn.c_proj'] and len(groups['mlp.c_proj']) == n_layer  # every block's, not only the first


def test_init_spread_draws_gamma_around_gamma_init():
    coefficients = build(operator='corridor', gamma_init=-0.5, init_spread=0.25, n_head=8).operator_coefficients()
    gamma, delta = gamma_delta(coefficients)
    assert ((gamma >= -0.75) & (gamma <= -0.25)).all() and gamma.std() > 0.05
    assert (delta == 1.0).all()


def test_init_spread_draws_are_centred_on_gamma_init_and_uniform():
    """γ0 of each head is uniform on gamma_init ± init_spread: over 20,000 heads the mean is gamma_init within 4
    standard errors (spread / √3 / √n) and the draws pass a Kolmogorov–Smirnov test against that uniform law."""
    from scipy import stats
    from model import OperatorCoefficients
    n, centre, spread = 20_000, -0.5, 0.25
    torch.manual_seed(0)
    config = GPTConfig(block_size=8, vocab_size=8, n_layer=1, n_head=n, n_embd=n, operator='corridor',
                       gamma_init=centre, init_spread=spread)
    gamma = OperatorCoefficients(config).gamma.detach().double()
    assert abs(gamma.mean().item() - centre) < 4 * spread / math.sqrt(3) / math.sqrt(n)
    assert stats.kstest(gamma.numpy(), stats.uniform(loc=centre - spread, scale=2 * spread).cdf).pvalue > 1e-3


# ----------------------------------------------------------------------------------------- both paths

@pytest.mark.parametrize('operator', FORMS)
def test_fast_path_equals_math_path(operator):
    model = build(operator=operator, **reads(operator, init_spread=0.3))
    idx = tokens()
    for trained in (False, True):
        if trained:
            train_steps(model)
        model.eval()
        fast, _ = model(idx)
        math_logits, probs = model.forward_with_probs(idx)
        torch.testing.assert_close(fast, math_logits, atol=2e-5, rtol=1e-5)
        assert len(probs) == 2 and probs[0].shape == (3, 4, 16, 16)
        torch.testing.assert_close(probs[0].sum(-1), torch.ones(3, 4, 16))
        model.train()
    if operator in LEARNABLE:  # the steps moved the scalars, differently per head
        assert gamma_delta(model.operator_coefficients())[0].std() > 1e-3


@pytest.mark.parametrize('operator', FORMS)
def test_future_tokens_never_change_the_past(operator):
    model = train_steps(build(operator=operator, **reads(operator, init_spread=0.3))).eval()
    idx = tokens(B=2)
    t = 7
    changed = idx.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1 + torch.arange(8)) % 50
    for run in (lambda i: model(i)[0], lambda i: model.forward_with_probs(i)[0]):
        before, after = run(idx), run(changed)
        torch.testing.assert_close(after[:, :t + 1], before[:, :t + 1], atol=0, rtol=0)
        assert (after[:, t + 1:] - before[:, t + 1:]).abs().max() > 1e-4  # the change did reach the future


def test_vocabulary_is_padded_for_the_matmul_but_logits_cover_only_real_tokens():
    model = build(vocab_size=50)
    assert model.transformer.wte.weight.shape[0] == 64
    logits, loss = model(tokens(), tokens(seed=2))
    assert logits.shape == (3, 16, 50)
    loss.backward()
    assert model.lm_head.weight.grad[50:].abs().max() == 0  # padding rows never get gradient


def test_ignore_index_minus_one_drops_positions_from_the_loss():
    model = build().eval()
    idx, targets = tokens(), tokens(seed=2)
    masked = targets.clone()
    masked[:, 8:] = -1
    logits, loss = model(idx, masked)
    expected = F.cross_entropy(logits[:, :8].reshape(-1, 50), targets[:, :8].reshape(-1))
    torch.testing.assert_close(loss, expected)


# ----------------------------------------------------------------------------------------- gradients

@pytest.mark.parametrize('operator,extra', [(name, {}) for name in LEARNABLE] +
                                           [('corridor', dict(gamma_nonneg=True, gamma_init=0.4))])
def test_operator_scalar_gradients_match_finite_differences(operator, extra):
    extra = {**reads(operator, gamma_init=-0.4, delta_init=1.2, init_spread=0.3), **extra}
    model = build(operator=operator, n_layer=2, n_head=2, n_embd=8, **extra).double()
    idx, targets = tokens(B=2, T=6), tokens(B=2, T=6, seed=2)
    _, loss = model(idx, targets)
    scalars = model.operator_parameters()
    assert len(scalars) == 2 * len(OPERATORS[operator].params)  # 2 layers × the form's scalars, each [n_head]
    grads = torch.autograd.grad(loss, scalars)
    eps = 1e-6
    with torch.no_grad():
        for p, g in zip(scalars, grads):
            assert g.abs().min() > 1e-8  # every scalar of every head gets a gradient
            for h in range(p.numel()):
                p[h] += eps
                up = model(idx, targets)[1].item()
                p[h] -= 2 * eps
                down = model(idx, targets)[1].item()
                p[h] += eps
                assert g[h].item() == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-9)


@pytest.mark.parametrize('return_probs', [False, True])
@pytest.mark.parametrize('operator', ['corridor', 'laplacian'])  # learnt (c_I, c_P); c_P = -1 on the last head
def test_attention_gradients_match_finite_differences_on_both_paths(operator, return_probs):
    """dL/dx reaches Q, K and V through P·V (SDPA's backward on the fast path, P's on the math path) and V through
    the identity term too; the math path's P is exact as well."""
    torch.manual_seed(0)
    extra = dict(gamma_init=-0.4, delta_init=1.3, init_spread=0.3) if operator == 'corridor' else {}
    attn = CausalSelfAttention(tiny_config(operator=operator, n_head=2, n_embd=8, **extra)).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    outputs = (lambda x: attn(x, return_probs=True)) if return_probs else (lambda x: attn(x)[0])
    assert torch.autograd.gradcheck(outputs, (x,), fast_mode=True)  # a random projection of the Jacobian


@pytest.mark.parametrize('operator', FORMS)
def test_fast_path_and_math_path_give_the_same_gradients(operator):
    model = build(operator=operator, **reads(operator, init_spread=0.3)).double()
    idx, targets = tokens(), tokens(seed=2)
    grads = []
    for logits in (model(idx)[0], model.forward_with_probs(idx)[0]):
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        grads.append(torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad]))
    for fast, slow in zip(*grads):
        torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize('overrides', [dict(bias=False), dict(learn_delta=False), dict(learn_gamma=False)],
                         ids=['no-biases', 'delta-fixed', 'gamma-fixed'])
def test_fast_path_and_math_path_give_the_same_gradients_without_biases_or_with_one_scalar_fixed(overrides):
    """train.py's default bias=False, and a corridor with δ (or γ) a fixed buffer: the learnable scalar still gets
    the math path's gradient, and the fixed one none."""
    model = build(operator='corridor', gamma_init=-0.3, init_spread=0.2, **overrides).double()
    idx, targets = tokens(), tokens(seed=2)
    trained = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for logits in (model(idx)[0], model.forward_with_probs(idx)[0]):
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        grads.append(torch.autograd.grad(loss, trained))
    for fast, slow in zip(*grads):
        torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-12)
    scalars = {id(p) for p in model.operator_parameters()}
    assert scalars and all(g.abs().min() > 0 for p, g in zip(trained, grads[0]) if id(p) in scalars)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_coefficient_gradients_are_float32_sums_under_autocast(dtype):
    """dL/dc sums B·T·head_size products per head: in float32 (the scalars' dtype, which autocast leaves to
    elementwise products), not rounded to the autocast dtype (bf16 keeps 3 significant digits; float16 overflows
    past 65504, and a grad scaler multiplies the gradient by 2^16). The layer's own gradients, against float64 sums
    of the same bf16 / fp16 activations."""
    torch.manual_seed(0)
    attn = CausalSelfAttention(tiny_config(operator='corridor', n_head=4, n_embd=64, block_size=64, gamma_init=-0.3))
    with torch.no_grad():  # positive weights, inputs and gradients: sums without cancellation to hide an error in
        attn.c_attn.weight.uniform_(0, 0.1)
        attn.c_proj.weight.uniform_(0, 1)
    x = torch.rand(4, 64, 64)
    captured = {}
    attn.c_proj.register_forward_pre_hook(lambda module, args: captured.update(y=args[0]))
    with torch.autocast('cpu', dtype=dtype):
        out = attn(x)[0]
    grad = torch.rand_like(out) * 16  # as if scaled by a grad scaler: sums reach ~1e5
    out.backward(grad.to(out.dtype))
    coefficients = attn.coefficients
    for name in ('gamma', 'delta'):
        assert getattr(coefficients, name).grad.dtype == torch.float32
    # by hand: dL/dy, then dL/dc_I = Σ dL/dy·v and dL/dc_P = Σ dL/dy·(P·V), in float64 from the autocast activations
    with torch.autocast('cpu', dtype=dtype):
        q, k, v = attn.c_attn(x).split(64, dim=2)
    q, k, v = (t.view(4, 64, 4, 16).transpose(1, 2) for t in (q, k, v))
    pv = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).double()
    grad_y = (grad.to(dtype).double() @ attn.c_proj.weight.to(dtype).double()).view(4, 64, 4, 16)
    d_cI = (grad_y * v.transpose(1, 2).double()).sum((0, 1, 3))
    d_cP = (grad_y * pv).sum((0, 1, 3))
    assert d_cP.abs().min() > 65504  # beyond float16, where a sum in the autocast dtype overflows
    gamma, delta = coefficients.gamma.double(), coefficients.delta.double()
    # c_I = δγ, c_P = δ: dL/dγ = δ·dL/dc_I, dL/dδ = γ·dL/dc_I + dL/dc_P
    torch.testing.assert_close(coefficients.gamma.grad.double(), delta * d_cI, rtol=2e-3, atol=0)
    torch.testing.assert_close(coefficients.delta.grad.double(), gamma * d_cI + d_cP, rtol=2e-3, atol=0)
    assert captured['y'].dtype == torch.float32  # the operator's sum in float32: c_proj's autocast rounds it


def test_corridor_trains_under_bf16_autocast_like_float32():
    model = build(operator='corridor', gamma_init=-0.3, init_spread=0.2)
    idx = tokens()
    grads = {}
    for dtype in (torch.float32, torch.bfloat16):
        model.zero_grad()
        with torch.autocast('cpu', dtype=dtype, enabled=dtype != torch.float32):
            _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        grads[dtype] = [p.grad.clone() for p in model.parameters()]
        assert all(g.dtype == torch.float32 for g in grads[dtype])  # gradients land in the parameters' dtype
    for g32, g16 in zip(grads[torch.float32], grads[torch.bfloat16]):
        assert (g16 - g32).norm() <= 0.05 * g32.norm() + 1e-6


def saved_activation_bytes(model, idx):
    """Bytes autograd keeps for backward in one training step (deduplicated by storage)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return sum(storages.values())


@pytest.mark.parametrize('compiled', [False, True], ids=['eager', 'compiled'])
def test_corridor_keeps_one_activation_per_layer_more_than_attention_at_most(compiled):
    """The cost of the plain operator line: autograd keeps its sum for c_proj's backward, one [B, T, C] float32
    activation per layer beyond what attention keeps (SDPA keeps V and P·V anyway), and a few [n_head] vectors of
    scalars; compiled, Inductor may recompute the sum instead of keeping it. Never more."""
    idx = tokens(B=2, T=16)
    saved = {}
    # a fresh Dynamo: after another test compiled GPT.forward at other sizes in this process, it would compile these
    # graphs dynamic in the batch, and Inductor would choose what to keep for backward differently
    torch._dynamo.reset()
    for operator in ('attention', 'corridor'):
        model = build(operator=operator, gamma_init=-0.3) if operator == 'corridor' else build()
        saved[operator] = saved_activation_bytes(torch.compile(model) if compiled else model, idx)
    config = tiny_config()
    activation = 2 * 15 * config.n_embd * 4  # [B, T, C] float32 (T = 15: the inputs and targets are shifted)
    extra = saved['corridor'] - saved['attention']
    assert 0 <= extra <= config.n_layer * (activation + 8 * 4 * config.n_head)
    if not compiled:  # eager: exactly the sum of every layer, kept
        assert extra >= config.n_layer * activation


# ----------------------------------------------------------------------------------------- constraints, optimizer

def c_I_total(model):
    return sum(block.attn.coefficients()[0].sum() for block in model.transformer.h)


def test_gamma_nonneg_holds_under_large_steps_pushing_gamma_negative_and_can_leave_zero():
    model = build(operator='corridor', gamma_nonneg=True, gamma_init=0.5, learn_delta=False)
    optimizer = model.configure_optimizers(0.0, 0.2, (0.9, 0.95), 'cpu')
    for _ in range(200):  # loss = Σ c_I = Σ γ (δ fixed at 1): the gradient pushes every γ down, hard
        optimizer.zero_grad()
        c_I_total(model).backward()
        optimizer.step()
        gamma, _ = gamma_delta(model.operator_coefficients())
        assert (gamma >= 0).all()
    assert (gamma == 0).all()
    raw_gamma = [block.attn.coefficients.parametrizations.gamma.original for block in model.transformer.h]
    # momentum carried raw a little past the boundary, but the blocked gradient stopped it sinking further
    assert all(((raw < 0) & (raw > -20 * 0.2)).all() for raw in raw_gamma)
    for _ in range(40):  # the gradient turns: γ leaves 0 again, promptly
        optimizer.zero_grad()
        (-c_I_total(model)).backward()
        optimizer.step()
    assert (gamma_delta(model.operator_coefficients())[0] > 0).all()


@pytest.mark.parametrize('raw', [0.0, -0.1, 0.2])
def test_gamma_nonneg_blocks_a_push_below_zero_at_and_past_the_boundary_and_passes_the_pull_back(raw):
    """γ = max(raw, 0): where raw ≤ 0 a gradient that would lower raw (dL/dγ > 0, of any size) is blocked and one
    that raises it passes; where raw > 0 both pass unchanged."""
    coefficients = build(operator='corridor', gamma_nonneg=True, learn_delta=False).transformer.h[0].attn.coefficients
    original = coefficients.parametrizations.gamma.original
    with torch.no_grad():
        original.fill_(raw)
    for slope in (0.5, -0.5):  # loss = slope · Σ γ
        original.grad = None
        (slope * coefficients.gamma.sum()).backward()
        blocked = raw <= 0 and slope > 0
        assert torch.equal(original.grad, torch.full_like(original, 0.0 if blocked else slope))


def test_fixed_gamma_delta_never_move_and_are_saved():
    model = build(operator='corridor', gamma_init=-0.5, delta_init=1.0, learn_gamma=False, learn_delta=False)
    assert model.operator_parameters() == []
    before = model.operator_coefficients()
    train_steps(model, steps=10, lr=0.1)
    torch.testing.assert_close(model.operator_coefficients(), before, atol=0, rtol=0)
    assert 'transformer.h.0.attn.coefficients.gamma' in model.state_dict()
    # one fixed, one learnt
    model = build(operator='corridor', gamma_init=-0.5, learn_gamma=False)
    before = gamma_delta(model.operator_coefficients())
    after = gamma_delta(train_steps(model, steps=10, lr=0.1).operator_coefficients())
    torch.testing.assert_close(after[0], before[0], atol=0, rtol=0)
    assert (after[1] - before[1]).abs().max() > 1e-3


def test_the_laplacian_and_attention_have_no_learnable_scalars_and_never_move():
    """The fixed forms: their (γ, δ) are buffers (saved, never handed to the optimizer), whatever learn_gamma and
    learn_delta say, and training leaves the laplacian's I − P heads exactly where they started."""
    for operator in ('laplacian', 'attention'):
        model = build(operator=operator, laplacian_heads=2) if operator == 'laplacian' else build(operator=operator)
        assert model.operator_parameters() == []
        before = model.operator_coefficients()
        train_steps(model, steps=5, lr=0.1)
        torch.testing.assert_close(model.operator_coefficients(), before, atol=0, rtol=0)
    laplacian = build(operator='laplacian')
    assert {'transformer.h.0.attn.coefficients.gamma', 'transformer.h.0.attn.coefficients.delta'} <= \
        set(dict(laplacian.named_buffers()))


@pytest.mark.parametrize('operator', LEARNABLE)
def test_weight_decay_never_reaches_the_operator_scalars(operator):
    model = build(operator=operator, **reads(operator, gamma_init=-0.5, delta_init=1.5))
    optimizer = model.configure_optimizers(weight_decay=0.5, learning_rate=0.1, betas=(0.9, 0.95), device_type='cpu')
    scalars_before = [p.detach().clone() for p in model.operator_parameters()]
    weight_before = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient: only decoupled weight decay can move a parameter
    optimizer.step()
    for p, before in zip(model.operator_parameters(), scalars_before):
        torch.testing.assert_close(p.detach(), before, atol=0, rtol=0)
    torch.testing.assert_close(model.transformer.h[0].mlp.c_fc.weight.detach(), weight_before * (1 - 0.1 * 0.5))


def test_weight_decay_reaches_exactly_the_matrices_and_every_parameter_is_in_one_group():
    """AdamW's groups: every trainable parameter exactly once; decay on the 2-D weights (embeddings, Linear
    matrices) and on nothing else: LayerNorm gains, biases and the operator scalars get none. Checked by name and by
    a step with zero gradients, where only decoupled weight decay moves anything."""
    model = build(operator='corridor', gamma_init=-0.5)
    lr, wd = 0.1, 0.5
    optimizer = model.configure_optimizers(weight_decay=wd, learning_rate=lr, betas=(0.9, 0.95), device_type='cpu')
    grouped = [id(p) for g in optimizer.param_groups for p in g['params']]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters()) and len(set(grouped)) == len(grouped)
    decay = {id(p): g['weight_decay'] for g in optimizer.param_groups for p in g['params']}
    names = dict(model.named_parameters())
    matrices = [n for n in names if n.endswith('.weight') and '.ln_' not in n and not n.startswith('transformer.ln_f')]
    assert set(matrices) == {n for n, p in names.items() if p.dim() == 2}  # wte (tied to lm_head), wpe, Linears
    assert any('.ln_1.' in n for n in names) and any(n.endswith('.bias') for n in names)
    scalars = {id(p) for p in model.operator_parameters()}
    for name, p in names.items():
        assert decay[id(p)] == (wd if name in matrices else 0.0), name
    for g in optimizer.param_groups:  # the scalars' own multiplier (1 here); every other group the schedule's lr
        assert g['lr_mult'] == 1.0 and g['lr'] == lr
    assert [g['params'] for g in optimizer.param_groups if scalars & {id(p) for p in g['params']}] == \
        [model.operator_parameters()]
    before = {n: p.detach().clone() for n, p in names.items()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for name, p in names.items():
        expected = before[name] * (1 - lr * wd) if name in matrices else before[name]
        torch.testing.assert_close(p.detach(), expected, atol=0, rtol=1e-7, msg=name)


def test_operator_lr_mult_scales_the_scalars_step():
    steps = []
    for mult in (1.0, 3.0):
        model = build(operator='corridor', gamma_init=-0.5, operator_lr_mult=mult)
        optimizer = model.configure_optimizers(0.0, 1e-3, (0.9, 0.95), 'cpu')
        before = [p.detach().clone() for p in model.parameters()]
        _, loss = model(tokens(), tokens(seed=2))
        loss.backward()
        optimizer.step()
        after = dict(zip([id(p) for p in model.parameters()], before))
        scalar_ids = {id(p) for p in model.operator_parameters()}
        steps.append({('scalar' if id(p) in scalar_ids else 'weight', i): (p.detach() - after[id(p)]).abs().max()
                      for i, p in enumerate(model.parameters())})
    for key in steps[0]:
        ratio = (steps[1][key] / steps[0][key]).item()
        assert ratio == pytest.approx(3.0 if key[0] == 'scalar' else 1.0, rel=1e-4)


# ----------------------------------------------------------------------------------------- config errors

@pytest.mark.parametrize('overrides,message', [
    (dict(operator='corridr'), "unknown operator 'corridr'"),
    (dict(n_embd=30), "divisible by n_head"),
    (dict(operator='laplacian', laplacian_heads=5), "laplacian_heads must be in [1, n_head=4]"),
    (dict(operator='attention', gamma_init=-0.5), "operator='attention' does not read gamma_init"),
    (dict(operator='alpha', gamma_nonneg=True), "operator='alpha' does not read gamma_nonneg"),
    (dict(operator='alpha_beta', learn_gamma=False), "learn_gamma is read by corridor"),
    (dict(operator='corridor', gamma_nonneg=True, gamma_init=-0.2), "gamma_nonneg needs gamma_init"),
    (dict(operator='corridor', gamma_nonneg=True, gamma_init=0.1, init_spread=0.2), "gamma_nonneg needs"),
    (dict(init_spread=-1.0, operator='corridor'), "init_spread must be >= 0"),
])
def test_impossible_configs_fail_when_a_run_config_becomes_a_model_config(overrides, message):
    with pytest.raises(UserError) as error:
        model_config({**vars(tiny_config()), **overrides})
    assert message in str(error.value)


# ----------------------------------------------------------------------------------------- compile, generation

def test_compiled_model_equals_eager_on_cpu():
    model = build(operator='corridor', gamma_init=-0.4, init_spread=0.3)
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: a graph break in the operator code fails here
    idx, targets = tokens(), tokens(seed=2)
    eager_logits, eager_loss = model(idx, targets)
    eager_grads = torch.autograd.grad(eager_loss, model.operator_parameters())
    logits, loss = compiled(idx, targets)
    grads = torch.autograd.grad(loss, model.operator_parameters())
    torch.testing.assert_close(logits, eager_logits, atol=1e-5, rtol=1e-5)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize('operator', FORMS)
def test_kv_cached_generation_equals_recomputing_every_position(operator):
    # float32 on the CPU: the logits agree to ~1e-6 (the test below states the tolerance per dtype), far inside
    # the gaps between this model's top logits, so the sampled tokens are equal exactly
    model = train_steps(build(operator=operator, **reads(operator, init_spread=0.3))).eval()
    prompt = tokens(B=2, T=5)
    # 20 new tokens run past block_size=16, so the cropped-context rebuild is covered too
    cached = model.generate(prompt, 20, temperature=0, use_cache=True)
    uncached = model.generate(prompt, 20, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)
    g1, g2 = (torch.Generator().manual_seed(7) for _ in range(2))
    assert torch.equal(model.generate(prompt, 12, temperature=1.0, top_k=10, generator=g1, use_cache=True),
                       model.generate(prompt, 12, temperature=1.0, top_k=10, generator=g2, use_cache=False))


# Cached and recomputed logits are the same sums in another order (one new query against cached keys, versus
# every query at once), so they agree to the dtype's rounding, not bit for bit: on a GPU, SDPA picks other kernels
# for T = 1 than for the whole sequence, and bf16 / fp16 round every product to 8 / 11 bits of mantissa. Float64
# and float32 are held tight; bf16 and fp16 to a few of their own steps (eps 7.8e-3 and 9.8e-4) on O(1) logits.
KV_CACHE_TOLERANCE = {torch.float64: dict(atol=1e-12, rtol=1e-12), torch.float32: dict(atol=1e-5, rtol=1e-5),
                      torch.bfloat16: dict(atol=6e-2, rtol=3e-2), torch.float16: dict(atol=1e-2, rtol=5e-3)}


def with_every_heads_own_coefficients(model, seed=0):
    """model with each form scalar of every head scaled by 1 ± 0.3 and moved by ± 0.2 (fixed ones too): no head at
    the (0, 1) of attention or at its init, whatever the form."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.transformer.h:
            for name in block.attn.coefficients.form.params:
                p = getattr(block.attn.coefficients, name)
                p.mul_(1 + 0.3 * torch.randn(p.shape, generator=g)).add_(0.2 * torch.randn(p.shape, generator=g))
    return model


@pytest.mark.parametrize('dtype', list(KV_CACHE_TOLERANCE), ids=str)
@pytest.mark.parametrize('operator', FORMS)
def test_kv_cached_logits_equal_recomputed_logits_within_the_dtypes_tolerance(operator, dtype):
    """Feeding tokens one at a time through the KV cache gives, at every position, the logits of recomputing the
    whole prefix, within KV_CACHE_TOLERANCE[dtype] (on the GPU too, where it runs when there is one), for every form
    of OPERATORS with every head's own (c_I, c_P). Logits, not sampled tokens: a form the cache can't hold (one with
    a c_2·P²V term) moved them by up to half their spread while greedy tokens stayed the same."""
    from model import KVCache
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    model = with_every_heads_own_coefficients(train_steps(build(operator=operator))).eval()
    c_I = model.operator_coefficients()[..., 0]
    assert operator == 'attention' or (c_I != 0).all(), c_I  # the identity term counts in every head
    model = model.to(device=device, dtype=dtype)
    idx = tokens(B=2, T=12).to(device)
    cache = KVCache(model.config.n_layer)
    with torch.no_grad():
        x, _ = model._trunk(idx[:, :4], cache=cache)
        cached = [model._logits(x[:, -1])]
        for t in range(4, 12):
            x, _ = model._trunk(idx[:, t:t + 1], cache=cache)
            cached.append(model._logits(x[:, -1]))
        recomputed = [model(idx[:, :t])[0][:, -1] for t in range(4, 13)]
    assert len(cache) == 12
    for a, b in zip(cached, recomputed):
        torch.testing.assert_close(a.double(), b.double(), **KV_CACHE_TOLERANCE[dtype])


def test_generate_by_default_samples_at_temperature_1_from_every_token():
    """generate(idx, n) with a generator is generate(idx, n, temperature=1.0, top_k=None) with an equal one."""
    model = train_steps(build(operator='corridor')).eval()
    prompt = tokens(B=3, T=4)
    default = model.generate(prompt, 10, generator=torch.Generator().manual_seed(5))
    explicit = model.generate(prompt, 10, temperature=1.0, top_k=None, generator=torch.Generator().manual_seed(5))
    assert torch.equal(default, explicit)
    assert not torch.equal(default, model.generate(prompt, 10, temperature=2.0, generator=torch.Generator().manual_seed(5)))


def test_top_k_1_is_greedy():
    model = train_steps(build(operator='corridor')).eval()
    prompt = tokens(B=2, T=5)
    greedy = model.generate(prompt, 12, temperature=0)
    for temperature in (0.5, 1.0, 3.0):
        assert torch.equal(model.generate(prompt, 12, temperature=temperature, top_k=1,
                                          generator=torch.Generator().manual_seed(0)), greedy)


@pytest.mark.parametrize('temperature,top_k', [(1.0, None), (0.5, None), (2.0, 3), (1.0, 1000)])
def test_sampling_frequencies_follow_softmax_of_logits_over_temperature_within_the_top_k(temperature, top_k,
                                                                                          monkeypatch):
    """A fixed logit vector (the model's head replaced), 20,000 one-token samples from a seeded generator: each
    token's frequency is softmax(logits / T) renormalised over the k largest logits, by hand, and 0 outside them."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0] + [-30.0] * 44)
    model = build().eval()
    monkeypatch.setattr(model, '_logits', lambda x: logits.expand(len(x), -1).clone())
    n = 20_000
    sampled = model.generate(torch.zeros(n, 1, dtype=torch.long), 1, temperature=temperature, top_k=top_k,
                             generator=torch.Generator().manual_seed(0))[:, 1]
    frequency = torch.bincount(sampled, minlength=50).double() / n
    kept = logits.tolist()[:top_k or 50]  # the logits are sorted: the top k are the first k
    weights = [math.exp(z / temperature) for z in kept]
    expected = [w / sum(weights) for w in weights] + [0.0] * (50 - len(kept))
    assert frequency.tolist() == pytest.approx(expected, abs=0.012)  # ~3.5 binomial standard deviations
    if top_k:
        assert frequency[top_k:].sum() == 0


def test_gpt2_weights_import_gives_gpt2_logits(tmp_path):
    pytest.importorskip('transformers')
    from lab.gpt2 import gpt2
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_positions=32, n_embd=48, n_layer=2, n_head=3, vocab_size=100, bos_token_id=0, eos_token_id=0)).eval()
    hf.save_pretrained(tmp_path)
    idx = tokens(B=2, T=20, vocab=100)
    expected = hf(idx).logits
    for operator in ('attention', 'corridor'):  # the corridor at γ = 0, δ = 1 is GPT-2 exactly
        model = gpt2(str(tmp_path), operator=operator).eval()
        assert model.config.vocab_size == 100 and model.config.block_size == 32
        torch.testing.assert_close(model(idx)[0], expected, atol=1e-4, rtol=0)


def test_gpt2_import_without_weights_is_one_clear_error(tmp_path):
    pytest.importorskip('transformers')
    from lab.gpt2 import gpt2
    pytest.importorskip('transformers')
    with pytest.raises(UserError, match="cannot load GPT-2 weights"):
        gpt2(str(tmp_path / 'nowhere'))


# ----------------------------------------------------------------------------------------- the code that trains

OPERATOR_LINE = 'return c_I * v + c_P * pv'  # model.apply_operator's body


def model_module_with(tmp_path, old, new):
    """model.py with one line changed, imported under another name (the repo's own model module stays as it is)."""
    import importlib.util
    from conftest import REPO
    source = (REPO / 'model.py').read_text()
    assert source.count(old) == 1, old
    path = tmp_path / 'model_edited.py'
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location('model_edited', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def training_losses(module, compiled=False, steps=3):
    torch.manual_seed(0)
    model = module.GPT(module.GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=4, n_embd=32,
                                        operator='corridor', gamma_init=-0.3))
    step = torch.compile(model) if compiled else model
    optimizer = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95), 'cpu')
    losses = []
    for i in range(steps):
        idx = tokens(seed=100 + i)
        _, loss = step(idx[:, :-1], idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize('compiled', [False, True], ids=['eager', 'compiled'])
def test_editing_the_operator_line_changes_what_trains(tmp_path, compiled):
    """The line a reader meets is the line training runs, on the fast path (eager and compiled): 2·c_P instead of
    c_P changes the training loss from the first step, and the unedited copy trains exactly as model.py does."""
    import model as model_py
    same = model_module_with(tmp_path, OPERATOR_LINE, OPERATOR_LINE)
    edited = model_module_with(tmp_path, OPERATOR_LINE, 'return c_I * v + 2 * c_P * pv')
    reference = training_losses(model_py, compiled)
    assert training_losses(same, compiled) == reference
    changed = training_losses(edited, compiled)
    assert all(abs(a - b) > 1e-3 for a, b in zip(changed, reference))


def test_both_attention_paths_meet_in_one_operator_line_and_no_custom_function_computes_attention():
    from conftest import REPO
    code = [line.strip() for line in (REPO / 'model.py').read_text().splitlines()]
    assert sum(line.startswith(OPERATOR_LINE) for line in code) == 1
    import model as model_py
    functions = {name for name, value in vars(model_py).items() if isinstance(value, type)
                 and issubclass(value, torch.autograd.Function)}
    nested = {f'{name}.{inner}' for name, value in vars(model_py).items() if isinstance(value, type)
              for inner, v in vars(value).items() if isinstance(v, type) and issubclass(v, torch.autograd.Function)}
    assert functions == set() and nested == {'NonNegative.Clamp'}  # the γ ≥ 0 constraint's, on a [n_head] vector


def test_checkpoints_hold_the_weights_and_the_operator_scalars_and_nothing_else():
    """The empty buffer that moves attention's constants (0, 1) with the model is not persistent: a checkpoint of any
    form holds exactly its parameters and fixed scalars."""
    for operator in FORMS:
        model = build(operator=operator, **({'learn_gamma': False} if operator == 'corridor' else {}))
        assert set(model.state_dict()) == {name for name, _ in model.named_parameters(remove_duplicate=False)} | \
            {name for name, _ in model.named_buffers() if not name.endswith('anchor')}
        assert not any(key.endswith('anchor') for key in model.state_dict())


# named as no user names a form: a user's own 'mix' or docs/operators.md's 'bounded' must not break this test
NEW_FORMS = '''
    'testonly_mix': OperatorForm(('a', 'b'), learnable=True, init=lambda g0, d0, config: (d0 * g0, d0),
                               coefficients=lambda a, b: (a, b), keys=START),
    'testonly_bounded': OperatorForm(params=('theta',), learnable=True,
                               init=lambda gamma0, delta0, config: (torch.atanh(gamma0),),
                               coefficients=lambda theta: (torch.tanh(theta), torch.ones_like(theta)),
                               keys=('gamma_init', 'init_spread', 'operator_lr_mult')),
}'''


def test_one_more_table_entry_and_nothing_else_passes_every_test_over_the_table(tmp_path):
    """A hacker's first edit, in a copy of the repo: a two-scalar form and docs/operators.md's one-scalar example
    added to OPERATORS, nothing else, and every test that runs over the table passes for them (no test names the
    table's forms or counts them)."""
    import shutil
    import subprocess
    import sys
    from conftest import REPO
    copy = tmp_path / 'repo'
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns('.git', 'data', '__pycache__', '.pytest_cache'))
    source = (copy / 'model.py').read_text()
    end = source.index('\n}', source.index('OPERATORS = {'))
    (copy / 'model.py').write_text(source[:end] + NEW_FORMS + source[end + 2:])
    result = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-n', '0', '-p', 'no:cacheprovider',
                             'tests/test_model.py', 'tests/test_device.py', '-k', 'testonly or checkpoints_hold'],
                            cwd=copy, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
    import re
    assert int(re.search(r'(\d+) passed', result.stdout).group(1)) >= 20  # the new forms' tests ran
