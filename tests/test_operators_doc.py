"""docs/operators.md's "Why look beyond P" held to model.py: its three-token table is what the `corridor` and
`laplacian` entries of OPERATORS give through apply_operator, cell for cell, and every identity the section states
holds on a causal P that CausalSelfAttention's math path built."""

import re
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from model import GPTConfig, CausalSelfAttention, OperatorCoefficients, apply_operator

pytestmark = pytest.mark.quick
PAGE = Path(__file__).resolve().parents[1] / 'docs' / 'operators.md'
EXAMPLE = '### By hand: three tokens'


def head_output(P, v, **operator):
    """One head's output rows through model.py: (c_I, c_P) from the form's table entry, as CausalSelfAttention reads
    them, then apply_operator on v [T, d] and P·v, in SDPA's layout [B, T, H, head_size]."""
    c_I, c_P = (c.view(-1, 1).double() for c in OperatorCoefficients(GPTConfig(n_head=1, **operator))())
    return apply_operator(c_I, c_P, v[None, :, None], (P @ v)[None, :, None])[0, :, 0]


def as_cell(x):
    """A number as the page writes it: at most 4 decimals, no trailing zeros, a typographic minus."""
    text = f'{x:.4f}'.rstrip('0').rstrip('.')
    return '0' if text == '-0' else text.replace('-', '−')


def example_table():
    """The header and rows of the first table after the example's heading, cells stripped."""
    text = PAGE.read_text()
    assert EXAMPLE in text, f"docs/operators.md has no '{EXAMPLE}' section"
    lines = text.split(EXAMPLE, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('|'))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith('|')), len(lines))
    header, _, *rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in lines[start:end]]
    return header, rows


def column_form(name):
    """The operator a column header names: 'γ = −0.5 …' is the corridor at that γ with δ = 1, '`laplacian` …' the
    laplacian form's one head."""
    if name.startswith('`laplacian`'):
        return dict(operator='laplacian', laplacian_heads=1)
    gamma = re.match(r'γ = (\S+)', name)
    assert gamma, f"column {name!r} names neither a γ nor `laplacian`"
    return dict(operator='corridor', gamma_init=float(gamma[1].replace('−', '-')), delta_init=1.0)


def test_the_three_token_table_is_what_the_corridor_and_laplacian_entries_give():
    header, rows = example_table()
    assert header[:3] == ['i', 'row i of P', 'v_i'], header
    P = torch.tensor([[float(Fraction(p)) for p in row[1].split(',')] for row in rows], dtype=torch.float64)
    v = torch.tensor([float(row[2]) for row in rows], dtype=torch.float64)
    assert [row[0] for row in rows] == [str(i) for i in range(len(rows))]
    assert torch.equal(P, P.tril()) and torch.allclose(P.sum(-1), torch.ones(len(rows), dtype=torch.float64)), \
        "the example's P must be causal with rows that sum to 1"
    forms = {name: column_form(name) for name in header[3:]}
    assert [form['gamma_init'] for form in forms.values() if 'gamma_init' in form] == [0.0, -0.5, -1.0]
    for i, (name, form) in enumerate(forms.items(), start=3):
        computed = [as_cell(x) for x in head_output(P, v[:, None], **form)[:, 0].tolist()]
        assert [row[i] for row in rows] == computed, f"column {name!r}: the page shows {[row[i] for row in rows]}, " \
                                                      f"model.py gives {computed}"
    # the words under the table: token 0 sees only itself, so at γ = −1 its output is exactly 0
    assert P[0, 0] == 1 and head_output(P, v[:, None], operator='corridor', gamma_init=-1.0)[0, 0] == 0


def test_the_cell_format_is_the_pages():
    assert [as_cell(x) for x in (1.0, 0.5, -1.25, -0.0, 2.75, 1 / 3)] == ['1', '0.5', '−1.25', '0', '2.75', '0.3333']


@pytest.fixture
def causal_P():
    """A causal P [T, T] as model.py's math path builds it (one head, float64), and values v [T, 3]."""
    torch.manual_seed(0)
    attn = CausalSelfAttention(GPTConfig(n_embd=4, n_head=1, bias=False)).double()
    _, probs = attn(torch.randn(1, 6, 4, dtype=torch.float64), return_probs=True)
    return probs[0, 0].detach(), torch.randn(6, 3, dtype=torch.float64)


def test_the_corridor_is_a_convex_mix_of_P_and_P_minus_I(causal_P):
    P, v = causal_P
    I = torch.eye(len(P), dtype=P.dtype)
    for gamma in (-1.0, -0.7, -0.2, 0.0, 0.5):
        assert torch.allclose(gamma * I + P, (1 + gamma) * P - gamma * (P - I), atol=1e-14)
        for delta in (1.0, 1.7):  # model.py's corridor entry is that mix, scaled by δ
            out = head_output(P, v, operator='corridor', gamma_init=gamma, delta_init=delta)
            assert torch.allclose(out, delta * ((1 + gamma) * P + (-gamma) * (P - I)) @ v, atol=1e-6)
            # out_i = δ(Σ_j P_ij v_j + γ v_i): token 0 sees only itself and gets δ(1 + γ)·v_0
            assert torch.allclose(out[0], delta * (1 + gamma) * v[0], atol=1e-6)


def test_P_minus_I_is_each_tokens_weighted_difference_from_its_context(causal_P):
    P, v = causal_P
    assert torch.allclose(P.sum(-1), torch.ones(len(P), dtype=P.dtype))  # what the identity stands on
    differences = (P[:, :, None] * (v[None, :, :] - v[:, None, :])).sum(1)  # Σ_j P_ij (v_j − v_i)
    assert torch.allclose((P - torch.eye(len(P), dtype=P.dtype)) @ v, differences)
    assert torch.allclose(head_output(P, v, operator='corridor', gamma_init=-1.0), differences, atol=1e-6)
    shared = torch.ones_like(v) * torch.randn(3, dtype=v.dtype)  # a value every token shares: removed at γ = −1
    assert torch.allclose(head_output(P, shared, operator='corridor', gamma_init=-1.0), torch.zeros_like(v), atol=1e-6)


def test_delta_sets_the_gain_that_gamma_takes_from_a_shared_value(causal_P):
    P, v = causal_P
    shared = torch.ones_like(v) * torch.randn(3, dtype=v.dtype)
    for gamma in (-0.9, -0.5, -0.1):
        assert torch.allclose((gamma * torch.eye(len(P), dtype=P.dtype) + P).sum(-1), torch.full((len(P),), 1 + gamma,
                                                                                               dtype=P.dtype))
        scaled = head_output(P, shared, operator='corridor', gamma_init=gamma)
        assert torch.allclose(scaled, (1 + gamma) * shared, atol=1e-6)
        whole = head_output(P, shared, operator='corridor', gamma_init=gamma, delta_init=1 / (1 + gamma))
        assert torch.allclose(whole, shared, atol=1e-6)


def test_a_positive_gamma_is_the_lazy_walk_still_an_average(causal_P):
    P, _ = causal_P
    for gamma in (0.1, 0.5, 2.0):
        lazy = (gamma * torch.eye(len(P), dtype=P.dtype) + P) / (1 + gamma)
        assert (lazy >= 0).all() and torch.allclose(lazy.sum(-1), torch.ones(len(P), dtype=P.dtype))


def test_laplacian_is_I_minus_P_with_eigenvalues_one_minus_the_diagonal(causal_P):
    P, v = causal_P
    L = torch.eye(len(P), dtype=P.dtype) - P
    assert torch.allclose(head_output(P, v, operator='laplacian', laplacian_heads=1), L @ v)
    assert torch.allclose(head_output(P, v, operator='laplacian', laplacian_heads=1),
                          -head_output(P, v, operator='corridor', gamma_init=-1.0))  # the γ = −1 end, sign flipped
    # a causal P is lower triangular: its eigenvalues are its diagonal, in (0, 1]; L's are 1 − P_ii, non-negative
    eigenvalues = torch.linalg.eigvals(P)
    assert torch.allclose(eigenvalues.imag, torch.zeros(len(P), dtype=P.dtype))
    assert torch.allclose(eigenvalues.real.sort().values, P.diagonal().sort().values)
    assert (P.diagonal() > 0).all() and (P.diagonal() <= 1).all() and P[0, 0] == 1
    assert torch.allclose(torch.linalg.eigvals(L).real.sort().values, (1 - P.diagonal()).sort().values)
