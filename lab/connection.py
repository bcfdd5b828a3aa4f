"""
Connection-walk diagnostics: multi-head attention read as one walk over token positions.

For one layer with heads h = 1..H, model width d and head size d_h (row-vector convention, x ↦ x·M):
  A_h          head h's walk weights on the layer's edges (i, j): its attention probabilities P_h, or for the
               full operator c_I,h·I + c_P,h·P_h (signed when c_I,h or c_P,h < 0). Edges: the causal ones, i ≥ j,
               for a decoder; for an encoder (BERT) every pair of non-special tokens ([CLS], [SEP] removed)
  A_eff        = mean_h A_h
  M_h          = W_V^h W_O^h (d×d): head h's value map times its rows of the output projection, biases excluded
               (grouped-query attention: the query heads of one KV group share its W_V block)
  O_ij         = Σ_h w_ij^h M_h,  w_ij^h = A_h[i,j] / Σ_h' |A_h'[i,j]|   (the edge's transport)
  G_ij         = O_ijᵀ O_ij,  μ_ij = tr(G_ij) / d
  δ_orth       = mean over edges of ‖G_ij − μ_ij I‖_F / ‖μ_ij I‖_F   (0: O_ij is a scaled isometry)
  δ_orth_trace = mean over edges of ‖G_ij − μ_ij I‖_F / tr G_ij = δ_orth / √d   (the paper's scale, see below)
  gram_rel     = mean over edges of ‖G_ij − μ_ij I‖_F / ‖G_ij‖_F
  drift(ℓ)     = 1 − cos(A_eff^ℓ, A_eff^(ℓ+1)) over the edges
  Gram dominance, two readings: mean |diagonal| and mean |off-diagonal| entry of Ḡ = mean over edges of G_ij
               ("|mean G|", exact), and the same entries' magnitudes averaged per edge ("mean |G|", on a sample)
Every per-sequence quantity is averaged over the sequences; drop_sink removes a decoder's edges to the first token
(j = 0), which soak up much of the attention in trained models, from every quantity.

Two scales of δ_orth. Ours divides by ‖μI‖_F = tr G/√d: a Gaussian transport gives 1, and a transport of rank r
at least √(d/r − 1). Dividing by tr G instead (δ_orth_trace) puts the same geometry on a scale √d times smaller,
the one on which the paper's numbers (0.05 … 0.15) lie; the README compares both with random baselines.

Null model (closed form). With Gaussian W_V and W_O, independent across KV groups and heads (as at initialisation,
and independent of the attention weights that set w), free probability gives for large d

    δ_orth(edge)² → 1 + (d / d_h) · Σ_g (Σ_{h∈g} w_h²)² / (Σ_h w_h²)²        (g: KV groups; g = h without GQA)

= 1 + H / H_eff for plain multi-head attention (H_eff = (Σw²)²/Σw⁴, the number of heads the edge really mixes):
√2 for equal weights, √(1 + d/d_h) for one head, √5 for Llama-3's 4 query heads per KV head. delta_orth_null is its
mean over the model's own edges, and a Gaussian-like Gram has diagonal / off-diagonal ≈ √(πd/2) / δ_orth (a
Gaussian transport: √(πd/2)). Both agree with Monte Carlo to ~1 % at d ≥ 128 (tests).

Exact and fast: no d×d matrix per edge. tr(G) and ‖G‖_F² are polynomials of degree 2 and 4 in the edge's
head weights w, with coefficients computed once per layer from head-sized (d_h×d_h) blocks:
  tr(M_aᵀ M_b)             = tr(P_ab Q_ba)
  tr(M_aᵀ M_b M_cᵀ M_d)    = tr(P_ab Q_bc P_cd Q_da),   P_ab = W_V^aᵀ W_V^b,  Q_ab = W_O^a W_O^bᵀ
so each edge costs O(H⁴) (H²(H+1)²/4 multiply-adds with the symmetry used below) instead of O(d³), and the
moments O(H³d_h³ + H⁴d_h²) once per layer. In float64 the result is exact to rounding, except that
‖G − μI‖² = ‖G‖² − tr(G)²/d cancels near an isometry: δ_orth below ~1e-8 reads as ~1e-8.


Every per-layer diagnostic is one entry of DIAGNOSTICS: how it is computed, and how lab/walk.py prints and plots it
and lab/figures.py draws it over training. Used by train.py (walk_interval), lab/bench.py and lab/walk.py, the
command line that writes tables and plots.
"""

import math
from contextlib import contextmanager
from typing import Callable, NamedTuple, Optional

import torch
from tqdm import tqdm

from model import GPT


# ---------------------------------------------------------------------------------------------- walk sources

class TextCodec(NamedTuple):
    """How a model reads text: its content tokens, and the special tokens its tokenizer puts around a sequence
    (lab/walk.py samples sequences with it; lab/hf_walk.py builds one for each Hugging Face tokenizer)."""
    encode: Callable          # text -> token ids, no special tokens
    prefix: tuple = ()        # e.g. BERT's [CLS], Llama's <|begin_of_text|>
    suffix: tuple = ()        # e.g. BERT's [SEP]

    def wrap(self, ids):
        return list(self.prefix) + list(ids) + list(self.suffix)


class WalkLayer(NamedTuple):
    """What the walk reads from one attention layer."""
    W_V: torch.Tensor                  # [H, d, d_h]: query head h's value map (GQA: its KV head's block)
    W_O: torch.Tensor                  # [H, d_h, d]: head h's rows of the output projection
    kv_head: torch.Tensor              # [H]: the KV head each query head reads (arange(H) without GQA)
    c_I: Optional[torch.Tensor] = None  # [H]: the operator family's coefficients, None for plain attention
    c_P: Optional[torch.Tensor] = None


def head_weights(attn):
    """W_V [H, d, d_h] and W_O [H, d_h, d] of one CausalSelfAttention, so that M_h = W_V[h] @ W_O[h]."""
    H, d = attn.n_head, attn.n_embd
    d_h = d // H
    w_v = attn.c_attn.weight[2 * d:3 * d]            # v = x @ w_v.T, head h's values are columns h·d_h ...
    W_V = w_v.view(H, d_h, d).transpose(1, 2)          # [H, d, d_h]
    W_O = attn.c_proj.weight.t().reshape(H, d_h, d)    # y = z @ c_proj.weight.T, z = heads concatenated
    return W_V, W_O


class GPTWalk:
    """Our GPT (a run folder, or OpenAI's GPT-2 read through sources.load_model) as a walk source. A walk source
    gives: `module` (its nn.Module), `causal`, `specials` (how many positions at the start and the end of every
    sequence are special tokens, left out of an encoder's edges), `layers()` (a WalkLayer per layer) and
    `attention_probs(idx)` (every layer's P [B, H, T, T]). hf_walk.HFWalk is the other one."""
    causal = True
    specials = (0, 0)

    def __init__(self, model):
        self.module = model

    def layers(self):
        out = []
        for block in self.module.transformer.h:
            W_V, W_O = head_weights(block.attn)
            out.append(WalkLayer(W_V, W_O, torch.arange(W_V.shape[0]), *block.attn.coefficients()))
        return out

    def attention_probs(self, idx):
        return self.module.forward_with_probs(idx)[1]


# ---------------------------------------------------------------------------------------------- the fast moments

def transport_moments(W_V, W_O):
    """T2 [H, H] with T2[a,b] = tr(M_aᵀ M_b), T4 [H, H, H, H] with T4[a,b,c,d] = tr(M_aᵀ M_b M_cᵀ M_d), and the
    value Grams P [H, H, d_h, d_h] they are built from (Ḡ needs them again)."""
    P = torch.einsum('aib,cid->acbd', W_V, W_V)  # P[a,c] = W_V^aᵀ W_V^c, [H, H, d_h, d_h]
    Q = torch.einsum('aib,cdb->acid', W_O, W_O)  # Q[a,c] = W_O^a W_O^cᵀ
    T2 = torch.einsum('abij,baji->ab', P, Q)
    H = W_V.shape[0]
    T4 = torch.empty(H, H, H, H, dtype=W_V.dtype, device=W_V.device)
    for a in range(H):  # one head at a time keeps memory at H² head-sized blocks
        R = torch.einsum('bij,bcjk->bcik', P[a], Q)         # R[b,c] = P_ab Q_bc
        S = torch.einsum('cdkl,dli->cdki', P, Q[:, a])      # S[c,d] = P_cd Q_da
        T4[a] = torch.einsum('bcik,cdki->bcd', R, S)
    return T2, T4, P


def pair_form(T4):
    """(K, ia, ib): the quartic form Σ T4[a,b,c,d] w_a w_b w_c w_d as uᵀ K u over the pairs a ≤ b, u_p = w_a w_b."""
    H = T4.shape[0]
    ia, ib = torch.triu_indices(H, H)
    sym = (T4 + T4.transpose(0, 1) + T4.transpose(2, 3) + T4.transpose(0, 1).transpose(2, 3)) / 4
    multiplicity = torch.where(ia == ib, 1.0, 2.0).to(T4)  # w_a w_b appears twice when a ≠ b
    K = sym[ia, ib][:, ia, ib] * multiplicity[:, None] * multiplicity[None, :]
    return K, ia.to(T4.device), ib.to(T4.device)


def layer_moments(layer, device, full_operator):
    """Everything an edge's geometry needs from one layer, computed once, in float64."""
    f64 = torch.float64
    W_V, W_O = layer.W_V.to(device, f64), layer.W_O.to(device, f64)
    T2, T4, P = transport_moments(W_V, W_O)
    K, ia, ib = pair_form(T4)
    c = (layer.c_I.to(device, f64), layer.c_P.to(device, f64)) if full_operator and layer.c_I is not None else None
    # n_kv read here, on the host: on the device it would be a synchronisation per batch and layer
    return dict(W_V=W_V, W_O=W_O, P=P, T2=T2, K=K, ia=ia, ib=ib, kv_head=layer.kv_head.to(device),
                n_kv=int(layer.kv_head.max()) + 1, c=c)


def walk_weights(probs, c=None):
    """Per-head walk weights [B, H, T, T]: the attention probabilities, or with c = (c_I, c_P) [H] each the full
    operator c_I·I + c_P·P."""
    if c is None:
        return probs
    c_I, c_P = c
    eye = torch.eye(probs.shape[-1], dtype=probs.dtype, device=probs.device)
    return c_I.view(-1, 1, 1) * eye + c_P.view(-1, 1, 1) * probs


def walk_edges(T, causal, specials=(0, 0), drop_sink=False, device=None):
    """(i, j) of the edges that count: causal i ≥ j (drop_sink: j > 0) for a decoder; for an encoder every pair of
    positions outside the special tokens at both ends (its sinks, [CLS] and [SEP], are among them)."""
    first, last = specials[0], T - specials[1]
    if causal:
        i, j = torch.tril_indices(T, T, device=device)
        keep = (j > 0) if drop_sink else torch.ones_like(i, dtype=torch.bool)
        return i[keep], j[keep]
    positions = torch.arange(first, last, device=device)
    return positions.repeat_interleave(len(positions)), positions.repeat(len(positions))


def edge_geometry(w, m, d):
    """Per edge, for head weights w [E, H] (normalised by Σ|w|): tr G, δ_orth and gram_rel (NaN where O_ij = 0,
    which no head walks), and the closed-form null δ_orth of Gaussian W_V, W_O on the same weights."""
    trace = ((w @ m['T2']) * w).sum(1)                                   # tr(G)
    fro2 = torch.empty_like(trace)
    rows = max(1, 2 ** 23 // len(m['ia']))  # the pair products u of a chunk stay near 64 MB
    for s in range(0, len(w), rows):
        u = w[s:s + rows, m['ia']] * w[s:s + rows, m['ib']]
        fro2[s:s + rows] = ((u @ m['K']) * u).sum(1)                     # ‖G‖_F²
    off = (fro2 - trace ** 2 / d).clamp(min=0).sqrt()                    # ‖G − μI‖_F, ≥ 0 up to rounding
    ok = trace > 1e-12 * trace.max().clamp(min=1e-300)
    nan = torch.full_like(trace, float('nan'))
    w2 = w ** 2
    group = torch.zeros(len(w), m['n_kv'], dtype=w.dtype, device=w.device)
    group.index_add_(1, m['kv_head'], w2)                                # Σ_{h∈g} w_h² per KV group
    d_h = m['W_V'].shape[2]
    null = (1 + d / d_h * (group ** 2).sum(1) / w2.sum(1) ** 2).sqrt()
    return dict(trace=trace, delta=torch.where(ok, off / (trace / math.sqrt(d)), nan),
                rel=torch.where(ok, off / fro2.sqrt(), nan), null=torch.where(ok, null, nan))


GRAM_COLUMNS = 512  # the per-edge Gram reading looks at most this many columns of each G_ij (all of them for d ≤ 512)


def sampled_gram_entries(w, m, d, columns):
    """Mean |diagonal| and mean |off-diagonal| entry of each sampled edge's G ([E] each). The diagonal is exact,
    tr G / d (G_kk ≥ 0); the off-diagonal mean is taken over G's principal submatrix on `columns`: exact when they
    are all d columns, else an unbiased estimate that costs d·H·d_h·|columns| per edge instead of ~2d³."""
    H, _, d_h = m['W_V'].shape
    W_V = m['W_V'].permute(1, 0, 2).reshape(d, H * d_h)                 # [W_V^1 … W_V^H]
    W_O = m['W_O'].reshape(H * d_h, d)[:, columns]
    s = len(columns)
    off = []
    for chunk in w.split(16):
        O = (W_V * chunk.repeat_interleave(d_h, dim=1)[:, None, :]) @ W_O   # Σ_h w_h W_V^h W_O^h, its columns, [e, d, s]
        G = O.transpose(1, 2) @ O
        off.append((G.abs().sum((1, 2)) - G.diagonal(dim1=1, dim2=2).abs().sum(1)) / (s * s - s))
    return ((w @ m['T2']) * w).sum(1) / d, torch.cat(off)


# ---------------------------------------------------------------------------------------------- the diagnostics

class WalkStep(NamedTuple):
    """What the walk has computed for one layer and one batch of B sequences, for a diagnostic's value to read."""
    A: torch.Tensor                  # [B, H, T, T]: every head's walk weights
    edges: torch.Tensor              # [B, E]: A_eff on the edges that count
    previous: Optional[torch.Tensor]  # [B, E]: the layer before's, None in the first layer
    w: torch.Tensor                  # [B·E, H]: each edge's head weights w_ij^h, normalised by Σ_h |A_h[i,j]|
    geometry: dict                   # [B·E] each (edge_geometry): trace (tr G), delta, rel, null; NaN where O_ij = 0
    d: int                           # the model's width


class Diagnostic(NamedTuple):
    """One per-layer diagnostic of the walk: how it is computed, and how lab/walk.py and lab/figures.py show it.
    What value is given and returns, for `per`:
      'sequence'  value(step: WalkStep) -> [B], a number per sequence (None in a layer that has none: drift in the
                  first); the result is the mean over the sequences
      'edge'      value(step) -> [B·E], a number per edge, NaN where it is undefined; the mean over the defined edges
      'walk'      value(r, d) -> [L], after the walk, from its results r: every 'sequence' and 'edge' entry's, the
                  'walk' entries' above it, and r['gram'] (Ḡ [L, d, d])
      'shown'     value(r) -> [L], or None where r lacks its inputs: computed when shown (a table, a plot, a log's
                  figure), neither returned by connection_diagnostics nor logged"""
    name: str
    per: str
    value: Callable
    sem: bool = False                # its standard error over sequences in the results' 'sem' ('walk': value applied
                                     # to the standard errors of what it reads, so only for a linear function of them)
    column: Optional[tuple] = None   # (header, format) of its column in lab/walk.py's per-layer table
    plot: Optional[str] = None       # title of its panel in lab/walk.py's walk_layers.png
    panel: Optional[str] = None      # title of its row in lab/figures.py's walk during training (and of the geometry
                                     # study's rows, lab/study_figures.py)


def _drift(step):
    if step.previous is None:
        return None
    cos = (step.previous * step.edges).sum(1) / (step.previous.norm(dim=1) * step.edges.norm(dim=1))
    return 1 - cos


def _gram_entries(gram):
    """Mean |diagonal| and mean |off-diagonal| entry of every layer's Ḡ [L, d, d]."""
    d = gram.shape[-1]
    diag = gram.diagonal(dim1=1, dim2=2).abs()
    return diag.mean(1), (gram.abs().sum((1, 2)) - diag.sum(1)) / (d * d - d)


def _ratio(r, diagonal, off_diagonal):
    return [a / b for a, b in zip(r[diagonal], r[off_diagonal])] if diagonal in r else None


# Every per-layer diagnostic, in the order of lab/walk.py's table columns and plot panels: a new one is one entry here
# (docs/diagnostics.md, "Adding a diagnostic"). The sampled per-edge Gram reading (gram_edges) is outside it: an option
# that builds some edges' G, which no other diagnostic needs.
DIAGNOSTICS = (
    Diagnostic('drift', 'sequence', _drift, sem=True, column=('drift to next', '.4f'),
               plot='drift 1 − cos(A_eff^ℓ, A_eff^ℓ+1)', panel='drift to the next layer'),
    Diagnostic('a_eff_fro', 'sequence', lambda step: step.edges.norm(dim=1), sem=True, column=('‖A_eff‖_F', '.3f'),
               plot='‖A_eff‖_F', panel='‖A_eff‖_F'),
    Diagnostic('delta_orth_trace', 'walk', lambda r, d: [x / math.sqrt(d) for x in r['delta_orth']], sem=True,
               column=('δ_orth/√d', '.4f'), plot='δ_orth/√d = ‖G − μI‖_F / tr G'),
    Diagnostic('delta_orth', 'edge', lambda step: step.geometry['delta'], sem=True, column=('δ_orth', '.3f'),
               panel='δ_orth'),
    Diagnostic('delta_orth_null', 'edge', lambda step: step.geometry['null'], column=('δ_orth null', '.3f')),
    Diagnostic('gram_rel', 'edge', lambda step: step.geometry['rel'], column=('‖G−μI‖/‖G‖', '.3f')),
    Diagnostic('gram_diag_mean', 'walk', lambda r, d: _gram_entries(r['gram'])[0].tolist()),
    Diagnostic('gram_offdiag_mean', 'walk', lambda r, d: _gram_entries(r['gram'])[1].tolist()),
    Diagnostic('gram_ratio', 'shown', lambda r: _ratio(r, 'gram_diag_mean', 'gram_offdiag_mean'),
               column=('Ḡ ratio', '.1f'), plot='Gram diag / off-diag of Ḡ',
               panel='Ḡ diagonal / off-diagonal (mean abs)'),
    Diagnostic('gram_edge_ratio', 'shown', lambda r: _ratio(r, 'gram_edge_diag_mean', 'gram_edge_offdiag_mean'),
               column=('per-edge ratio', '.1f'), plot='Gram diag / off-diag, per edge'),
)

# Two orders that files already written keep, whatever the registry's: the results' (log.jsonl's 'walk' lists, which
# running studies read, and diagnostics.json's), and the rows of the walk during training (the geometry study's
# report rows, which docs/results_recomputed.py reads). An entry not named here comes after these, in registry order.
RESULT_ORDER = ('a_eff_fro', 'drift', 'delta_orth', 'delta_orth_trace', 'gram_rel', 'gram_diag_mean',
                'gram_offdiag_mean', 'delta_orth_null')
PANEL_ORDER = ('drift', 'delta_orth', 'a_eff_fro', 'gram_ratio')


def in_order(entries, first):
    """entries, those named in `first` first and in its order, then the others in registry order."""
    return sorted(entries, key=lambda e: first.index(e.name) if e.name in first else len(first))


def diagnostic(name):
    """The registry's entry called `name`, None when there is none."""
    return next((e for e in DIAGNOSTICS if e.name == name), None)


def per_layer():
    """The names of the per-layer lists connection_diagnostics returns and train.py logs (walk_interval), in order."""
    return [e.name for e in in_order([e for e in DIAGNOSTICS if e.per != 'shown'], RESULT_ORDER)]


def shown(numbers):
    """{name: per-layer list} of the 'shown' diagnostics that `numbers` (a walk's results, or a log's) has the inputs
    of."""
    values = {e.name: e.value(numbers) for e in DIAGNOSTICS if e.per == 'shown'}
    return {k: v for k, v in values.items() if v is not None}


def to_host(t):
    """Every result leaves the device through here (the tests stand a host copy of the right shape in for it when
    the model sits on the meta device, so that a tensor left on the CPU is caught without a GPU)."""
    return t.cpu()


@contextmanager
def exact_float32_matmuls():
    """TF32 off inside: train.py turns it on for speed on a GPU, and its ~1e-3 relative error would make the
    geometry logged during GPU training incomparable with the CPU studies' (float32 matmuls there are exact)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@torch.no_grad()
@exact_float32_matmuls()
def connection_diagnostics(model, idx, drop_sink=False, full_operator=False, batch_size=None, progress=False,
                           gram_edges=0, seed=0):
    """Per-layer connection-walk diagnostics of `model` (our GPT, or a walk source such as hf_walk.HFWalk) on token
    sequences idx [N, T] (see the module docstring). An encoder's sequences must all be [CLS] … [SEP], unpadded.

    full_operator: walk weights c_I·I + c_P·P of the operator instead of the attention probabilities alone.
    gram_edges: also the per-edge reading of Gram dominance, from this many edges drawn at random (seeded; all of
    them when there are fewer), each edge's G built explicitly (up to GRAM_COLUMNS of its columns); 0 skips it.
    Returns a dict of per-layer lists, one per entry of DIAGNOSTICS that is not 'shown' (per_layer() names them):
    a_eff_fro [L], drift [L−1], delta_orth [L], delta_orth_trace [L] (δ_orth / √d), gram_rel [L], gram_diag_mean [L],
    gram_offdiag_mean [L] (Ḡ), delta_orth_null [L] (closed form); with gram_edges, gram_edge_diag_mean and
    gram_edge_offdiag_mean [L] and gram_edges (how many); sem: the standard error over sequences of the entries with
    sem (a_eff_fro, drift, delta_orth, delta_orth_trace); tensors a_eff [L, T, T] (mean over sequences) and gram
    [L, d, d] (Ḡ) for plots. The model is left in the mode it was in."""
    source = GPTWalk(model) if isinstance(model, GPT) else model
    was_training = source.module.training
    source.module.eval()
    N, T = idx.shape
    device = idx.device
    f64 = torch.float64
    layers = [layer_moments(layer, device, full_operator) for layer in source.layers()]
    L, (H, d) = len(layers), layers[0]['W_V'].shape[:2]
    # index tensors are built on the host and sent once: no data-dependent shapes computed on the device
    ei, ej = (e.to(device) for e in walk_edges(T, source.causal, source.specials, drop_sink))
    E = len(ei)
    if E == 0:
        raise ValueError(f"sequences of {T} token(s) have no edges once the sink / special tokens are removed")
    computed = [e for e in DIAGNOSTICS if e.per in ('sequence', 'edge')]
    # per sequence and layer (NaN in a layer where a diagnostic has none); per edge, their sum and count per layer
    per_sequence = {e.name: torch.full((N, L), float('nan'), dtype=f64) for e in computed}
    defined = {e.name: torch.zeros(L, dtype=torch.bool) for e in computed}
    sums = {e.name: torch.zeros(L, dtype=f64) for e in computed if e.per == 'edge'}
    counts = {e.name: torch.zeros(L, dtype=f64) for e in computed if e.per == 'edge'}
    sums.update(edge_diag=torch.zeros(L, dtype=f64), edge_off=torch.zeros(L, dtype=f64),
                a_eff=torch.zeros(L, T, T, dtype=f64), C=torch.zeros(L, H, H, dtype=f64))
    picked = None  # the edges (flat index sequence·E + edge) whose G is built for the per-edge Gram reading
    if gram_edges:
        generator = torch.Generator().manual_seed(seed)  # its own generator: the caller's random stream is untouched
        picked = torch.arange(N * E) if gram_edges >= N * E else torch.randperm(N * E, generator=generator)[:gram_edges]
        columns = torch.arange(d) if d <= GRAM_COLUMNS else torch.randperm(d, generator=generator)[:GRAM_COLUMNS]
    # keep each batch's probabilities (L·H·T² per sequence) to a few hundred MB
    batch_size = batch_size or max(1, 2 ** 25 // (L * H * T * T))
    for start in tqdm(range(0, N, batch_size), desc='connection walk', disable=not progress, unit='batch'):
        batch = idx[start:start + batch_size]
        B = len(batch)
        previous = None
        for l, (p, m) in enumerate(zip(source.attention_probs(batch), layers)):
            A = walk_weights(p.to(f64), m['c'])                 # [B, H, T, T]
            a_eff = A.mean(1)
            sums['a_eff'][l] += to_host(a_eff.sum(0))
            edges = a_eff[:, ei, ej]                            # [B, E]
            w = A[:, :, ei, ej].permute(0, 2, 1).reshape(-1, H)  # [B·E, H]
            total = w.abs().sum(1, keepdim=True)
            w = torch.where(total > 0, w / total, 0.0)            # an edge no head walks (δ = 0) has no transport
            sums['C'][l] += to_host(w.T @ w)
            step = WalkStep(A, edges, previous, w, edge_geometry(w, m, d), d)
            for e in computed:
                value = e.value(step)
                if value is None:
                    continue
                defined[e.name][l] = True
                if e.per == 'edge':
                    ok = ~value.isnan()
                    sums[e.name][l] += to_host(torch.where(ok, value, 0).sum())
                    counts[e.name][l] += to_host(ok.sum())
                    if not e.sem:
                        continue
                    value = value.view(B, E).nanmean(1)  # each sequence's mean: its standard error's input
                per_sequence[e.name][start:start + B, l] = to_host(value)
            previous = edges
            if picked is not None:
                here = picked[(picked >= start * E) & (picked < (start + B) * E)] - start * E
                if len(here):
                    diag, off = sampled_gram_entries(w[here.to(device)], m, d, columns.to(device))
                    sums['edge_diag'][l] += to_host(diag.sum())
                    sums['edge_off'][l] += to_host(off.sum())
    source.module.train(was_training)
    r, sem = {}, {}
    for e in computed:
        v = per_sequence[e.name][:, defined[e.name]]
        r[e.name] = ((sums[e.name] / counts[e.name])[defined[e.name]] if e.per == 'edge' else v.mean(0)).tolist()
        if e.sem:
            sem[e.name] = (v.std(0) / math.sqrt(N) if N > 1 and v.shape[1] else
                           torch.full(v.shape[1:], float('nan'))).tolist()
    r['gram'] = mean_gram(layers, sums['C'] / (N * E), d)
    for e in DIAGNOSTICS:
        if e.per == 'walk':
            r[e.name] = e.value(r, d)
            if e.sem:
                sem[e.name] = e.value(sem, d)
    out = {name: r[name] for name in per_layer()}
    if picked is not None:
        out['gram_edge_diag_mean'] = (sums['edge_diag'] / len(picked)).tolist()
        out['gram_edge_offdiag_mean'] = (sums['edge_off'] / len(picked)).tolist()
        out['gram_edges'] = len(picked)
    out['sem'] = {name: sem[name] for name in per_layer() if name in sem}
    out['gram'] = r['gram'].float()
    out['a_eff'] = (sums['a_eff'] / N).float()
    return out


def walk_sequences(data, count, seed):
    """The walk's fixed validation sequences for a run (sources.Data): the paper's 64 tokens (or block_size), drawn
    from a generator of their own, the same at every evaluation, so that logging the walk changes no batch."""
    offsets = torch.randint(data.n_tokens['val'] - data.block_size, (count,), generator=torch.Generator().manual_seed(
        seed + 2000))
    return data.batch('val', offsets)[0][:, :min(64, data.block_size)]


def walk_geometry(model, idx):
    """Per-layer diagnostics for train.py's log.jsonl (walk_interval): of the attention part, and for the operator
    family also of the full operator c_I·I + c_P·P. Never on the training path: the math path, in eval mode, on
    fixed sequences, with no random numbers drawn, so a run's losses are the same with or without it."""
    parts = ['attention'] if model.config.operator == 'attention' else ['attention', 'operator']
    geometry = {}
    for part in parts:
        result = connection_diagnostics(model, idx, full_operator=part == 'operator')
        geometry[part] = {key: result[key] for key in per_layer()}
    return geometry


def mean_gram(layers, C, d):
    """Ḡ [L, d, d] in float64 (on the host) = mean over edges of G_ij = Σ_ab C_ab M_aᵀ M_b, C [L, H, H] the edges'
    mean w wᵀ: the "|mean G|" reading of Gram dominance (gram_diag_mean, gram_offdiag_mean) reads its entries."""
    grams = []
    for m, C_l in zip(layers, C):
        H, _, d_h, _ = m['P'].shape
        Bm = (C_l.to(m['P'].device)[:, :, None, None] * m['P']).permute(0, 2, 1, 3).reshape(H * d_h, H * d_h)
        W_O = m['W_O'].reshape(H * d_h, d)
        grams.append(to_host(W_O.T @ Bm @ W_O))
    return torch.stack(grams)


def depth_regimes(values):
    """Means over the initial (first 20 %), middle and final (last 20 %) layers, counted symmetrically from both
    ends (12 layers: 0–2, 3–8, 9–11)."""
    L = len(values)
    groups = dict(initial=[v for l, v in enumerate(values) if l < 0.2 * L],
                  middle=[v for l, v in enumerate(values) if l >= 0.2 * L and L - 1 - l >= 0.2 * L],
                  final=[v for l, v in enumerate(values) if L - 1 - l < 0.2 * L])
    return {k: sum(v) / len(v) if v else None for k, v in groups.items()}
