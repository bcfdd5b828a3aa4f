"""walk.py: the fast polynomial diagnostics equal a naive per-edge computation, known walks give known answers, and
the command line writes its tables and plots for a run and for an imported GPT-2."""

import json
import math

import pytest
import torch

from conftest import needs_tokenizer, run_script, synthetic_text
from model import GPT, GPTConfig
from walk import connection_diagnostics, depth_regimes, head_weights


def tiny_model(n_layer=2, n_head=2, n_embd=8, operator='attention', seed=0, **overrides):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=16, vocab_size=30, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                          operator=operator, **overrides)).double().eval()
    with torch.no_grad():  # larger weights than GPT-2's init, so heads attend unevenly and transports differ
        for block in model.transformer.h:
            block.attn.c_attn.weight.normal_(0, 0.5)
            block.attn.c_proj.weight.normal_(0, 0.5)
    return model


def naive_diagnostics(model, idx, drop_sink=False, full_operator=False):
    """The definitions, one edge at a time, with every d×d matrix built explicitly."""
    probs = model.attention_probs(idx)
    N, T = idx.shape
    d = model.config.n_embd
    out = {k: [] for k in ('a_eff_fro', 'drift', 'delta_orth', 'gram_rel', 'gram_diag_mean', 'gram_offdiag_mean')}
    edges = [(i, j) for i in range(T) for j in range(i + 1) if not (drop_sink and j == 0)]
    previous = None
    for block, p in zip(model.transformer.h, probs):
        W_V, W_O = head_weights(block.attn)
        M = [W_V[h] @ W_O[h] for h in range(W_V.shape[0])]
        c_I, c_P = block.attn.coefficients()
        A = torch.stack([c_I[h] * torch.eye(T, dtype=p.dtype) + c_P[h] * p[:, h] for h in range(len(M))], 1) \
            if full_operator else p
        a_eff = A.mean(1)
        vectors = [torch.stack([a_eff[n, i, j] for i, j in edges]) for n in range(N)]
        out['a_eff_fro'].append(sum(v.norm() for v in vectors).item() / N)
        if previous is not None:
            out['drift'].append(sum(1 - (a @ b) / (a.norm() * b.norm()) for a, b in zip(previous, vectors)).item() / N)
        previous = vectors
        delta_orth, gram_rel, gram_sum = [], [], torch.zeros(d, d, dtype=torch.float64)
        for n in range(N):
            for i, j in edges:
                weights = A[n, :, i, j]
                weights = weights / weights.abs().sum()
                O = sum(w * m for w, m in zip(weights, M))
                G = O.T @ O
                mu_I = torch.trace(G) / d * torch.eye(d, dtype=torch.float64)
                delta_orth.append(((G - mu_I).norm() / mu_I.norm()).item())
                gram_rel.append(((G - mu_I).norm() / G.norm()).item())
                gram_sum += G
        out['delta_orth'].append(sum(delta_orth) / len(delta_orth))
        out['gram_rel'].append(sum(gram_rel) / len(gram_rel))
        gram = gram_sum / len(delta_orth)
        out['gram_diag_mean'].append(gram.diagonal().abs().mean().item())
        out['gram_offdiag_mean'].append(((gram.abs().sum() - gram.diagonal().abs().sum()) / (d * d - d)).item())
    return out


@pytest.mark.parametrize('shape', [dict(n_layer=2, n_head=2, n_embd=8), dict(n_layer=3, n_head=3, n_embd=12),
                                   dict(n_layer=2, n_head=4, n_embd=16)])
@pytest.mark.parametrize('drop_sink', [False, True])
def test_fast_diagnostics_equal_the_naive_per_edge_computation(shape, drop_sink):
    model = tiny_model(**shape)
    idx = torch.randint(0, 30, (3, 6), generator=torch.Generator().manual_seed(1))
    fast = connection_diagnostics(model, idx, drop_sink=drop_sink, batch_size=2)  # batches of 2: sums across batches
    naive = naive_diagnostics(model, idx, drop_sink=drop_sink)
    for key, expected in naive.items():
        assert fast[key] == pytest.approx(expected, rel=1e-9, abs=1e-12), key
    assert min(fast['delta_orth']) > 0.01  # a random model is far from isometric: the comparison means something


@pytest.mark.parametrize('drop_sink', [False, True])
def test_full_operator_with_signed_weights_equals_the_naive_computation(drop_sink):
    model = tiny_model(n_layer=2, n_head=3, n_embd=12, operator='corridor')
    with torch.no_grad():  # heads on both sides of the corridor, one with δ < 0: signed walk weights
        for block in model.transformer.h:
            block.attn.coefficients.gamma.copy_(torch.tensor([-0.5, 0.3, -1.4]))
            block.attn.coefficients.delta.copy_(torch.tensor([1.2, -0.8, 0.9]))
    idx = torch.randint(0, 30, (2, 5), generator=torch.Generator().manual_seed(2))
    fast = connection_diagnostics(model, idx, drop_sink=drop_sink, full_operator=True)
    naive = naive_diagnostics(model, idx, drop_sink=drop_sink, full_operator=True)
    for key, expected in naive.items():
        assert fast[key] == pytest.approx(expected, rel=1e-6, abs=1e-12), key
    attention_part = connection_diagnostics(model, idx, drop_sink=drop_sink)
    assert attention_part['delta_orth'] != pytest.approx(fast['delta_orth'], rel=1e-3)  # the identity term counts


def test_identical_heads_make_the_transport_the_head_matrix():
    model = tiny_model(n_layer=1, n_head=3, n_embd=12)
    attn = model.transformer.h[0].attn
    with torch.no_grad():  # every head a copy of head 0: q, k, v blocks and c_proj columns
        for part in range(3):
            rows = attn.c_attn.weight[part * 12:(part + 1) * 12]
            rows[4:8], rows[8:12] = rows[0:4].clone(), rows[0:4].clone()
            bias = attn.c_attn.bias[part * 12:(part + 1) * 12]
            bias[4:8], bias[8:12] = bias[0:4].clone(), bias[0:4].clone()
        attn.c_proj.weight[:, 4:8] = attn.c_proj.weight[:, 0:4]
        attn.c_proj.weight[:, 8:12] = attn.c_proj.weight[:, 0:4]
    W_V, W_O = head_weights(attn)
    M = W_V[0] @ W_O[0]
    G = M.T @ M
    mu_I = torch.trace(G) / 12 * torch.eye(12, dtype=torch.float64)
    expected = ((G - mu_I).norm() / mu_I.norm()).item()
    out = connection_diagnostics(model, torch.randint(0, 30, (2, 7), generator=torch.Generator().manual_seed(3)))
    assert out['delta_orth'][0] == pytest.approx(expected, rel=1e-9)  # every edge: O = M
    torch.testing.assert_close(out['gram'][0].double(), G, rtol=1e-5, atol=1e-6)


def test_orthogonal_transport_with_equal_head_weights_has_zero_delta_orth():
    model = tiny_model(n_layer=2, n_head=4, n_embd=16)
    idx = torch.randint(0, 30, (2, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for block in model.transformer.h:
            attn = block.attn
            attn.c_attn.weight[:32] = 0  # q = k = 0: every head attends uniformly, so all head weights are equal
            attn.c_attn.bias[:32] = 0
            Q1, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))
            Q2, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))
            attn.c_attn.weight[32:] = 3.0 * Q1   # W_V = [W_V^1 … W_V^4] scaled orthogonal, W_O orthogonal:
            attn.c_proj.weight.copy_(Q2)         # O = (1/H) Σ_h M_h = (3/H) W_V W_O, a scaled isometry
    out = connection_diagnostics(model, idx)
    # zero up to float64 rounding: ‖G − μI‖² = ‖G‖² − tr(G)²/d cancels, leaving √(1e-16) ≈ 1e-8
    assert max(out['delta_orth']) < 1e-7 and max(out['gram_rel']) < 1e-7
    # and the uniform causal walk: no drift, rows summing to 1, ‖A_eff‖_F² = Σ_i 1/(i+1) per sequence
    assert max(out['drift']) < 1e-12
    torch.testing.assert_close(out['a_eff'].sum(-1), torch.ones(2, 8))
    assert out['a_eff_fro'][0] == pytest.approx(math.sqrt(sum(1 / (i + 1) for i in range(8))), rel=1e-9)
    # unequal head weights break the isometry
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight[:32].normal_(0, 2.0)
    assert connection_diagnostics(model, idx)['delta_orth'][0] > 1e-3


def test_identical_adjacent_layers_have_zero_drift(monkeypatch):
    model = tiny_model(n_layer=3, n_head=2, n_embd=8)
    idx = torch.randint(0, 30, (2, 6), generator=torch.Generator().manual_seed(5))
    probs = model.attention_probs(idx)
    monkeypatch.setattr(model, 'attention_probs', lambda idx: [probs[0], probs[0].clone(), probs[2]])
    drift = connection_diagnostics(model, idx)['drift']
    assert drift[0] == pytest.approx(0, abs=1e-12) and drift[1] > 1e-3


def test_rows_of_the_walk_sum_to_one():
    model = tiny_model(n_layer=2, n_head=3, n_embd=12)
    out = connection_diagnostics(model, torch.randint(0, 30, (4, 9), generator=torch.Generator().manual_seed(6)))
    torch.testing.assert_close(out['a_eff'].sum(-1), torch.ones(2, 9))
    assert (out['a_eff'].triu(1) == 0).all()  # causal


def test_depth_regimes_split_layers_20_60_20_symmetrically():
    assert depth_regimes(list(range(10))) == dict(initial=0.5, middle=4.5, final=8.5)
    assert depth_regimes(list(range(12))) == dict(initial=1.0, middle=5.5, final=10.0)  # 0–2, 3–8, 9–11


def test_head_weights_rebuild_the_attention_output():
    """Independent of the diagnostics: Σ_h P_h · x W_V^h W_O^h is the attention module's output (no biases)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=30, n_layer=1, n_head=3, n_embd=12, bias=False)).double()
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 8, 12, dtype=torch.float64)
    y, probs = attn(x, return_probs=True)
    W_V, W_O = head_weights(attn)
    rebuilt = sum(probs[:, h] @ x @ W_V[h] @ W_O[h] for h in range(3))
    torch.testing.assert_close(y, rebuilt)


def test_an_operator_with_no_walk_in_one_layer_leaves_the_others_defined():
    model = tiny_model(n_layer=2, n_head=2, n_embd=8, operator='corridor')
    with torch.no_grad():
        model.transformer.h[0].attn.coefficients.delta.zero_()  # c_I = c_P = 0: no edge has a transport
    out = connection_diagnostics(model, torch.randint(0, 30, (2, 5), generator=torch.Generator().manual_seed(7)),
                                 full_operator=True)
    assert math.isnan(out['delta_orth'][0]) and math.isfinite(out['delta_orth'][1]) and out['delta_orth'][1] > 0


# ---------------------------------------------------------------------------------------------- command line

def test_diagnostics_cli_on_a_corridor_run(trained_run, tmp_path):
    (tmp_path / 'text.txt').write_text(synthetic_text(300, seed=9))
    result = run_script('walk.py', trained_run, '--text', tmp_path / 'text.txt', '--n_seqs', '8',
                        '--seq_len', '16', '--context_sweep', '--drop_sink', '--out', tmp_path / 'diag', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / 'diag' / 'diagnostics.json').read_text())
    run = saved[trained_run.name]
    assert run['sequences'] == 8 and saved['settings']['drop_sink']
    for part in ('attention', 'operator'):  # a corridor model: the attention part and the full operator
        assert len(run[part]['drift']) == 1 and len(run[part]['delta_orth']) == 2
        assert set(run[part]['context_sweep']) == {'16', '32'}  # up to block_size
    for name in ('walk_layers.png', 'context_sweep.png', f'a_eff_{trained_run.name}_attention.png',
                 f'gram_{trained_run.name}_operator.png'):
        assert (tmp_path / 'diag' / name).stat().st_size > 1000
    assert '| 1 | – |' in (tmp_path / 'diag' / 'diagnostics.md').read_text()  # the last layer has no drift


@needs_tokenizer
def test_diagnostics_cli_on_an_imported_gpt2(tmp_path):
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=64, n_embd=24, n_layer=2, n_head=3))
    hf.save_pretrained(tmp_path / 'tiny-gpt2')
    (tmp_path / 'text.txt').write_text(synthetic_text(100))
    result = run_script('walk.py', tmp_path / 'tiny-gpt2', '--text', tmp_path / 'text.txt',
                        '--n_seqs', '4', '--seq_len', '32', '--out', tmp_path / 'diag', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / 'diag' / 'diagnostics.json').read_text())
    assert set(saved['tiny-gpt2']) == {'sequences', 'seq_len', 'attention'}  # plain attention: one part
    assert len(saved['tiny-gpt2']['attention']['a_eff_fro']) == 2
