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

    python walk.py gpt2 out-owt-corridor path/to/llama-or-bert --text wiki.test.raw --context_sweep
"""

import argparse
import json
import math
import os
import random
import re
import statistics
import sys
from typing import Callable, NamedTuple, Optional

import torch
from tqdm import tqdm

from common import GPT2_NAMES, UserError, load_model, main_guard, tokenizer_from_meta
from model import GPT


# ---------------------------------------------------------------------------------------------- walk sources

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
    """Our GPT (a run folder, or OpenAI's GPT-2 read through common.load_model) as a walk source. A walk source
    gives: `module` (its nn.Module), `causal`, `specials` (how many positions at the start and the end of every
    sequence are special tokens, left out of an encoder's edges), `layers()` (a WalkLayer per layer) and
    `attention_probs(idx)` (every layer's P [B, H, T, T]). walk_hf.HFWalk is the other one."""
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
        return self.module.attention_probs(idx)


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
    return dict(W_V=W_V, W_O=W_O, P=P, T2=T2, K=K, ia=ia, ib=ib, kv_head=layer.kv_head.to(device), c=c)


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
    group = torch.zeros(len(w), int(m['kv_head'].max()) + 1, dtype=w.dtype, device=w.device)
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

# the per-layer lists train.py logs (walk_interval); append only: running studies read these names
PER_LAYER = ('a_eff_fro', 'drift', 'delta_orth', 'delta_orth_trace', 'gram_rel', 'gram_diag_mean', 'gram_offdiag_mean',
             'delta_orth_null')


@torch.no_grad()
def connection_diagnostics(model, idx, drop_sink=False, full_operator=False, batch_size=None, progress=False,
                           gram_edges=0, seed=0):
    """Per-layer connection-walk diagnostics of `model` (our GPT, or a walk source such as walk_hf.HFWalk) on token
    sequences idx [N, T] (see the module docstring). An encoder's sequences must all be [CLS] … [SEP], unpadded.

    full_operator: walk weights c_I·I + c_P·P of the operator instead of the attention probabilities alone.
    gram_edges: also the per-edge reading of Gram dominance, from this many edges drawn at random (seeded; all of
    them when there are fewer), each edge's G built explicitly (up to GRAM_COLUMNS of its columns); 0 skips it.
    Returns a dict of per-layer lists (PER_LAYER): a_eff_fro [L], drift [L−1], delta_orth [L], delta_orth_trace [L]
    (δ_orth / √d), gram_rel [L], gram_diag_mean [L], gram_offdiag_mean [L] (Ḡ), delta_orth_null [L] (closed form);
    with gram_edges, gram_edge_diag_mean and gram_edge_offdiag_mean [L] and gram_edges (how many); sem: the standard
    error over sequences of a_eff_fro, drift, delta_orth and delta_orth_trace; tensors a_eff [L, T, T] (mean over
    sequences) and gram [L, d, d] (Ḡ) for plots. The model is left in the mode it was in."""
    source = GPTWalk(model) if isinstance(model, GPT) else model
    was_training = source.module.training
    source.module.eval()
    N, T = idx.shape
    device = idx.device
    f64 = torch.float64
    layers = [layer_moments(layer, device, full_operator) for layer in source.layers()]
    L, (H, d) = len(layers), layers[0]['W_V'].shape[:2]
    ei, ej = walk_edges(T, source.causal, source.specials, drop_sink, device)
    E = len(ei)
    if E == 0:
        raise ValueError(f"sequences of {T} token(s) have no edges once the sink / special tokens are removed")
    per_sequence = dict(a_eff_fro=torch.zeros(N, L, dtype=f64), drift=torch.zeros(N, max(L - 1, 0), dtype=f64),
                        delta_orth=torch.zeros(N, L, dtype=f64))
    sums = {k: torch.zeros(L, dtype=f64) for k in ('delta_orth', 'gram_rel', 'delta_orth_null', 'count',
                                                    'edge_diag', 'edge_off')}
    sums.update(a_eff=torch.zeros(L, T, T, dtype=f64), C=torch.zeros(L, H, H, dtype=f64))
    picked = None  # the edges (flat index sequence·E + edge) whose G is built for the per-edge Gram reading
    if gram_edges:
        generator = torch.Generator().manual_seed(seed)  # its own generator: the caller's random stream is untouched
        picked = torch.arange(N * E) if gram_edges >= N * E else torch.randperm(N * E, generator=generator)[:gram_edges]
        picked = picked.to(device)
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
            sums['a_eff'][l] += a_eff.sum(0).cpu()
            edges = a_eff[:, ei, ej]                            # [B, E]
            per_sequence['a_eff_fro'][start:start + B, l] = edges.norm(dim=1).cpu()
            if previous is not None:
                cos = (previous * edges).sum(1) / (previous.norm(dim=1) * edges.norm(dim=1))
                per_sequence['drift'][start:start + B, l - 1] = (1 - cos).cpu()
            previous = edges
            w = A[:, :, ei, ej].permute(0, 2, 1).reshape(-1, H)  # [B·E, H]
            total = w.abs().sum(1, keepdim=True)
            w = torch.where(total > 0, w / total, 0.0)            # an edge no head walks (δ = 0) has no transport
            sums['C'][l] += (w.T @ w).cpu()
            g = edge_geometry(w, m, d)
            ok = ~g['delta'].isnan()
            for key, value in (('delta_orth', 'delta'), ('gram_rel', 'rel'), ('delta_orth_null', 'null')):
                sums[key][l] += g[value][ok].sum().cpu()
            sums['count'][l] += ok.sum().cpu()
            per_sequence['delta_orth'][start:start + B, l] = g['delta'].view(B, E).nanmean(1).cpu()
            if picked is not None:
                here = picked[(picked >= start * E) & (picked < (start + B) * E)] - start * E
                if len(here):
                    diag, off = sampled_gram_entries(w[here], m, d, columns.to(device))
                    sums['edge_diag'][l] += diag.sum().cpu()
                    sums['edge_off'][l] += off.sum().cpu()
    source.module.train(was_training)
    count = sums['count']
    out = dict(a_eff_fro=per_sequence['a_eff_fro'].mean(0).tolist(), drift=per_sequence['drift'].mean(0).tolist(),
               delta_orth=(sums['delta_orth'] / count).tolist(),
               delta_orth_trace=(sums['delta_orth'] / count / math.sqrt(d)).tolist(),
               gram_rel=(sums['gram_rel'] / count).tolist())
    out.update(edge_gram(layers, sums['C'] / (N * E), d))
    out['delta_orth_null'] = (sums['delta_orth_null'] / count).tolist()
    if picked is not None:
        out['gram_edge_diag_mean'] = (sums['edge_diag'] / len(picked)).tolist()
        out['gram_edge_offdiag_mean'] = (sums['edge_off'] / len(picked)).tolist()
        out['gram_edges'] = len(picked)
    sem = {k: (v.std(0) / math.sqrt(N) if N > 1 and v.shape[1] else torch.full(v.shape[1:], float('nan'))).tolist()
           for k, v in per_sequence.items()}
    sem['delta_orth_trace'] = [s / math.sqrt(d) for s in sem['delta_orth']]
    out['sem'] = sem
    out['a_eff'] = (sums['a_eff'] / N).float()
    return out


def edge_gram(layers, C, d):
    """Ḡ = mean over edges of G_ij = Σ_ab C_ab M_aᵀ M_b (C [L, H, H]: the edges' mean w wᵀ), and its mean |diagonal|
    and |off-diagonal| entries: the "|mean G|" reading of Gram dominance."""
    grams = []
    for m, C_l in zip(layers, C):
        H, _, d_h, _ = m['P'].shape
        Bm = (C_l.to(m['P'].device)[:, :, None, None] * m['P']).permute(0, 2, 1, 3).reshape(H * d_h, H * d_h)
        W_O = m['W_O'].reshape(H * d_h, d)
        grams.append((W_O.T @ Bm @ W_O).cpu())
    gram = torch.stack(grams)
    diag = gram.diagonal(dim1=1, dim2=2).abs()
    return dict(gram_diag_mean=diag.mean(1).tolist(),
                gram_offdiag_mean=((gram.abs().sum((1, 2)) - diag.sum(1)) / (d * d - d)).tolist(),
                gram=gram.float())


def depth_regimes(values):
    """Means over the initial (first 20 %), middle and final (last 20 %) layers, counted symmetrically from both
    ends (12 layers: 0–2, 3–8, 9–11)."""
    L = len(values)
    groups = dict(initial=[v for l, v in enumerate(values) if l < 0.2 * L],
                  middle=[v for l, v in enumerate(values) if l >= 0.2 * L and L - 1 - l >= 0.2 * L],
                  final=[v for l, v in enumerate(values) if L - 1 - l < 0.2 * L])
    return {k: sum(v) / len(v) if v else None for k, v in groups.items()}


# ---------------------------------------------------------------------------------------------- text and sampling

class TextCodec(NamedTuple):
    """How a model reads text: its content tokens, and the special tokens its tokenizer puts around a sequence."""
    encode: Callable          # text -> token ids, no special tokens
    prefix: tuple = ()        # e.g. BERT's [CLS], Llama's <|begin_of_text|>
    suffix: tuple = ()        # e.g. BERT's [SEP]

    def wrap(self, ids):
        return list(self.prefix) + list(ids) + list(self.suffix)


def read_text(path):
    """The text to walk over: a file, or by default the WikiText-2 test split through `datasets`."""
    if path:
        if not os.path.isfile(path):
            raise UserError(f"--text {path!r} not found")
        with open(path, encoding='utf-8') as f:
            return f.read()
    try:
        from datasets import load_dataset
        return ''.join(load_dataset('wikitext', 'wikitext-2-raw-v1', split='test')['text'])
    except Exception as e:
        raise UserError(f"cannot load WikiText-2 through datasets ({type(e).__name__}); pass a text file with "
                        f"--text (e.g. wiki.test.raw)") from None


def text_units(text, unit):
    """The text's lines (WikiText's rows: paragraphs and headings) or documents (articles, split before WikiText's
    top-level ` = Title = ` headings; a text without them is one document), blank ones left out."""
    parts = text.split('\n') if unit == 'lines' else re.split(r'\n(?= = [^=].* = \n)', text)
    return [p for p in parts if p.strip()]


SAMPLINGS = {
    'lines': "lines with at least T tokens, drawn at random (seeded), each truncated to its first T: the paper's "
             "'randomly sample 1,024 sequences, truncated to 64 tokens' (WikiText-2's rows are its lines)",
    'documents': "T-token chunks of the documents (articles), drawn at random (seeded); no chunk crosses a document "
                 "boundary: long contexts, where no line is long enough",
    'chunks': "the first N consecutive T-token chunks of the whole text, no seed (this tool's old default)",
}


def sample_sequences(text, codec, n_seqs, seq_len, sampling, seed):
    """[N, T] token ids: up to n_seqs sequences of seq_len tokens, special tokens included (see SAMPLINGS)."""
    m = seq_len - len(codec.prefix) - len(codec.suffix)  # content tokens per sequence
    if m < 1:
        raise UserError(f"--seq_len {seq_len} leaves no room beside the tokenizer's special tokens")
    if sampling == 'chunks':
        ids = codec.encode(text)
        candidates = [ids[k:k + m] for k in range(0, len(ids) - m + 1, m)][:n_seqs]
    else:
        units = [codec.encode(u) for u in text_units(text, sampling)]
        if sampling == 'lines':
            candidates = [u[:m] for u in units if len(u) >= m]
        else:
            candidates = [u[k:k + m] for u in units for k in range(0, len(u) - m + 1, m)]
        picks = random.Random(seed).sample(range(len(candidates)), min(n_seqs, len(candidates)))
        candidates = [candidates[k] for k in picks]
    if not candidates:
        unit = dict(lines='no line of the text has', documents='no document of the text has',
                    chunks='the text has fewer than')[sampling]
        raise UserError(f"{unit} {m} tokens, as one sequence of {seq_len} needs; use a longer text, a shorter "
                        f"--seq_len{'' if sampling == 'documents' else ', or --sampling documents'}")
    return torch.tensor([codec.wrap(c) for c in candidates], dtype=torch.long)


# ---------------------------------------------------------------------------------------------- models

def source_kind(source):
    """'run', 'gpt2', or a transformers model_type; a source that is none of them is a UserError."""
    if os.path.isfile(os.path.join(source, 'ckpt.pt')):
        return 'run'
    if source in GPT2_NAMES:
        return 'gpt2'
    import walk_hf
    return walk_hf.model_type(source)


def load_source(source, kind, device):
    """(walk source, TextCodec, longest sequence it takes) for a run folder, a GPT-2 name or folder (read as our GPT),
    or a Llama / Qwen2 / Qwen3 / Gemma 3 / BERT folder, .gguf file or packaged model (walk_hf)."""
    if kind in ('run', 'gpt2'):
        model, meta = load_model(source)
        return GPTWalk(model.to(device)), TextCodec(tokenizer_from_meta(meta)[0]), model.config.block_size
    import walk_hf
    return walk_hf.load(source, device)


def random_twin(walker, seed):
    """The same architecture at its random initialisation (its own init scheme), on the same device."""
    if isinstance(walker, GPTWalk):
        torch.manual_seed(seed)
        device = next(walker.module.parameters()).device
        return GPTWalk(GPT(walker.module.config).to(device))
    import walk_hf
    return walk_hf.random_twin(walker, seed)


def architecture(walker):
    layers = walker.layers()
    H, d, d_h = layers[0].W_V.shape
    return dict(n_layer=len(layers), d=d, n_head=H, n_kv_head=int(layers[0].kv_head.max()) + 1, d_head=d_h,
                causal=walker.causal, specials=list(walker.specials))


def parts(walker):
    """The walks of a model: the attention part, and for the operator family also the full operator."""
    operator = isinstance(walker, GPTWalk) and walker.module.config.operator != 'attention'
    return ['attention', 'operator'] if operator else ['attention']


def context_lengths(max_len, seq_len):
    return [n for n in (16, 32, 64, 128, 256, 512, 1024) if n <= max_len] or [seq_len]


SWEPT = ('drift', 'a_eff_fro', 'delta_orth', 'delta_orth_trace', 'delta_orth_null')


def walk_model(walker, idx, sweep_idx, part, args, desc):
    """One model's (or its twin's) numbers for one part: the per-layer lists, by depth regime, and the sweep."""
    r = connection_diagnostics(walker, idx, drop_sink=args.drop_sink, full_operator=part == 'operator',
                               progress=True, gram_edges=args.gram_edges, seed=args.seed)
    numbers = {k: v for k, v in r.items() if k not in ('a_eff', 'gram')}
    numbers['by_depth'] = {k: depth_regimes(v) for k, v in numbers.items()
                           if isinstance(v, list) and k != 'drift' and None not in v}
    if sweep_idx:
        numbers['context_sweep'] = {}
        for length, seqs in tqdm(sweep_idx.items(), desc=f'{desc}: context sweep', unit='length'):
            s = connection_diagnostics(walker, seqs, drop_sink=args.drop_sink, full_operator=part == 'operator')
            numbers['context_sweep'][length] = dict(sequences=len(seqs), **{k: s[k] for k in SWEPT},
                                                    sem={k: s['sem'][k] for k in s['sem']})
    return r, numbers


# ---------------------------------------------------------------------------------------------- tables

def ratios(numbers, d):
    """Derived per-layer series: Gram dominance ratios (both readings), and the closed-form nulls on the paper's
    scale and for the per-edge ratio."""
    out = dict(gram_ratio=[a / b for a, b in zip(numbers['gram_diag_mean'], numbers['gram_offdiag_mean'])],
               null_trace=[x / math.sqrt(d) for x in numbers['delta_orth_null']],
               null_gram_ratio=[math.sqrt(math.pi * d / 2) / x for x in numbers['delta_orth_null']])
    if 'gram_edge_diag_mean' in numbers:
        out['gram_edge_ratio'] = [a / b for a, b in zip(numbers['gram_edge_diag_mean'],
                                                          numbers['gram_edge_offdiag_mean'])]
    return out


def labelled(saved):
    """(label, d, numbers, twin numbers or None) for every model and part."""
    for name, entry in saved.items():
        if name == 'settings':
            continue
        for part in ('attention', 'operator'):
            if part in entry:
                label = name if 'operator' not in entry else \
                    f"{name} ({'attention part' if part == 'attention' else 'full operator'})"
                yield label, entry['d'], entry[part], entry.get('random_init', {}).get(part)


def fmt(x, spec='.3f'):
    return '–' if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table_delta_orth(saved):
    rows = ["| model | d | initial | middle | final |", "|---|---|---|---|---|"]

    def row(label, d, trace, ours):
        cells = [f"{fmt(trace[k])} ({fmt(ours[k], '.2f')})" for k in ('initial', 'middle', 'final')]
        rows.append(f"| {label} | {d} | " + ' | '.join(cells) + ' |')
    for label, d, n, twin in labelled(saved):
        row(label, d, n['by_depth']['delta_orth_trace'], n['by_depth']['delta_orth'])
        if twin:
            row(f"↳ {label}, random init", d, twin['by_depth']['delta_orth_trace'], twin['by_depth']['delta_orth'])
        null = n['by_depth']['delta_orth_null']
        row(f"↳ random W_V, W_O on {label}'s walk (closed form)", d,
            {k: None if v is None else v / math.sqrt(d) for k, v in null.items()}, null)
    return rows


def table_gram(saved):
    rows = ["| model | layers | Ḡ diag | Ḡ off-diag | Ḡ ratio | per-edge diag | per-edge off-diag | per-edge ratio "
            "| closed form ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for label, d, n, twin in labelled(saved):
        for tag, numbers in ((label, n), (f"↳ {label}, random init", twin)):
            if numbers is None:
                continue
            r = {k: depth_regimes(v) for k, v in ratios(numbers, d).items()}
            by = {k: depth_regimes(numbers[k]) if k in numbers else dict.fromkeys(('initial', 'middle', 'final'))
                  for k in ('gram_diag_mean', 'gram_offdiag_mean', 'gram_edge_diag_mean', 'gram_edge_offdiag_mean')}
            for regime in ('initial', 'middle', 'final'):
                rows.append(f"| {tag} | {regime} | {fmt(by['gram_diag_mean'][regime], '.3g')} "
                            f"| {fmt(by['gram_offdiag_mean'][regime], '.3g')} | {fmt(r['gram_ratio'][regime], '.1f')} "
                            f"| {fmt(by['gram_edge_diag_mean'][regime], '.3g')} "
                            f"| {fmt(by['gram_edge_offdiag_mean'][regime], '.3g')} "
                            f"| {fmt(r.get('gram_edge_ratio', {}).get(regime), '.1f')} "
                            f"| {fmt(r['null_gram_ratio'][regime], '.1f')} |")
    return rows


def table_layers(saved):
    rows = ["| model | layer | drift to next | ‖A_eff‖_F | δ_orth/√d | δ_orth | δ_orth null | ‖G−μI‖/‖G‖ "
            "| Ḡ ratio | per-edge ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, d, n, twin in labelled(saved):
        for tag, r in ((label, n), (f"{label}, random init", twin)):
            if r is None:
                continue
            derived = ratios(r, d)
            for l in range(len(r['delta_orth'])):
                drift = fmt(r['drift'][l], '.4f') if l < len(r['drift']) else '–'
                edge = fmt(derived['gram_edge_ratio'][l], '.1f') if 'gram_edge_ratio' in derived else '–'
                rows.append(f"| {tag} | {l} | {drift} | {r['a_eff_fro'][l]:.3f} "
                            f"| {fmt(r['delta_orth_trace'][l], '.4f')} | {fmt(r['delta_orth'][l])} "
                            f"| {fmt(r['delta_orth_null'][l])} | {fmt(r['gram_rel'][l])} "
                            f"| {fmt(derived['gram_ratio'][l], '.1f')} | {edge} |")
    return rows


def table_sweep(saved):
    rows = ["| model | T | sequences | drift | ‖A_eff‖_F | δ_orth/√d |", "|---|---|---|---|---|---|"]
    for label, _, n, twin in labelled(saved):
        for tag, r in ((label, n), (f"{label}, random init", twin)):
            for length, s in ((r or {}).get('context_sweep') or {}).items():
                cells = []
                for key, spec in (('drift', '.4f'), ('a_eff_fro', '.3f'), ('delta_orth_trace', '.4f')):
                    mean = statistics.fmean(s[key]) if s[key] else float('nan')
                    cells.append(f"{fmt(mean, spec)} ± {fmt(max(s['sem'][key], default=float('nan')), '.0e')}")
                rows.append(f"| {tag} | {length} | {s['sequences']} | " + ' | '.join(cells) + ' |')
    return rows


TABLE_NOTES = dict(
    table1="‖G − μI‖_F / tr G (= δ_orth/√d, the paper's scale); in parentheses δ_orth = ‖G − μI‖_F / ‖μI‖_F. Closed "
           "form: Gaussian W_V, W_O on the model's own head weights, √(1 + (d/d_h)·Σ_g(Σ_{h∈g} w_h²)² / (Σ_h w_h²)²) "
           "per edge.",
    table2="Mean |diagonal| and mean |off-diagonal| entry of Ḡ = mean over edges of G_ij (\"|mean G|\") and of each "
           "edge's G_ij, averaged over sampled edges (\"mean |G|\"); ratio = diagonal / off-diagonal, averaged over "
           "the regime's layers. Closed form ≈ √(πd/2) / δ_orth,null (a Gaussian transport: √(πd/2)).",
    sweep="Mean over layers ± the largest standard error (over sequences) of one layer; every layer's numbers are in "
          "diagnostics.json and context_sweep_*.png.",
)


def write_tables(saved, path):
    s = saved['settings']
    header = (f"Text: {s['text']}; {s['sampling']} sampling (seed {s['seed']}), up to {s['n_seqs']} sequences of "
              f"{s['seq_len']} tokens per model; drop_sink: {s['drop_sink']}; per-edge Gram from {s['gram_edges']} "
              f"sampled edges per layer. Depth regimes: initial = the first 20 % of the layers, final = the last "
              f"20 %, middle = the rest. \"random init\": the same architecture at its random initialisation, on the "
              f"same sequences.")
    text = ["# Connection-walk diagnostics\n", header,
            "\n## Table 1: δ_orth by depth\n", TABLE_NOTES['table1'] + '\n', *table_delta_orth(saved),
            "\n## Table 2: Gram diagonal vs off-diagonal by depth\n", TABLE_NOTES['table2'] + '\n', *table_gram(saved),
            "\n## Per layer\n", *table_layers(saved)]
    sweep = table_sweep(saved)
    if len(sweep) > 2:
        text += ["\n## Context sweep\n", TABLE_NOTES['sweep'] + '\n', *sweep]
    with open(path, 'w') as f:
        f.write('\n'.join(text) + '\n')
    return '\n'.join(text)


# ---------------------------------------------------------------------------------------------- plots

def plot_walk_layers(saved, path):
    """Per-layer curves of every model (and part): the model solid, its random-init twin dashed, the closed form
    dotted."""
    from analyze import plt, save  # the plotting setup lives in analyze.py
    panels = [('drift', 'drift 1 − cos(A_eff^ℓ, A_eff^ℓ+1)'), ('a_eff_fro', '‖A_eff‖_F'),
              ('delta_orth_trace', 'δ_orth/√d = ‖G − μI‖_F / tr G'),
              ('gram_edge_ratio', 'Gram diag / off-diag, per edge'), ('gram_ratio', 'Gram diag / off-diag of Ḡ')]
    nulls = dict(delta_orth_trace='null_trace', gram_edge_ratio='null_gram_ratio')
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.7))
    for k, (label, d, n, twin) in enumerate(labelled(saved)):
        color = f'C{k}'
        for numbers, style, tag in ((n, '-', label), (twin, '--', 'random init')):
            if numbers is None:
                continue
            series = {**numbers, **ratios(numbers, d)}
            for ax, (key, _) in zip(axes, panels):
                if key in series:
                    x = [l + 0.5 for l in range(len(series[key]))] if key == 'drift' else range(len(series[key]))
                    ax.plot(list(x), series[key], style, color=color, marker='.', label=tag)
                if key in nulls and numbers is n:
                    ax.plot(range(len(series[nulls[key]])), series[nulls[key]], ':', color=color,
                            label='closed form, random W_V, W_O')
    for ax, (key, title) in zip(axes, panels):
        ax.set_xlabel('layer (drift: between ℓ and ℓ+1)' if key == 'drift' else 'layer')
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7)
    fig.suptitle('Connection-walk diagnostics by layer (solid: model, dashed: random init, dotted: closed form)',
                 fontsize=11)
    return save(fig, path)


def plot_context_sweep(label, numbers, twin, path):
    """Every layer's drift, ‖A_eff‖_F and δ_orth/√d at each context length: one curve per length; the random-init
    twin in a second row."""
    from analyze import plt, save  # the plotting setup lives in analyze.py
    rows = [(label, numbers)] + ([('random init', twin)] if twin else [])
    panels = [('drift', 'drift'), ('a_eff_fro', '‖A_eff‖_F'), ('delta_orth_trace', 'δ_orth/√d')]
    fig, axes = plt.subplots(len(rows), len(panels), figsize=(4.2 * len(panels), 3.4 * len(rows)), squeeze=False,
                             sharey='col')
    for (tag, r), axrow in zip(rows, axes):
        sweep = r['context_sweep']
        for k, (length, s) in enumerate(sweep.items()):
            color = plt.cm.viridis(k / max(1, len(sweep) - 1))
            for ax, (key, title) in zip(axrow, panels):
                x = [l + 0.5 for l in range(len(s[key]))] if key == 'drift' else list(range(len(s[key])))
                ax.plot(x, s[key], marker='.', color=color, label=f"T = {length} ({s['sequences']})")
                ax.set_title(f'{tag}: {title}', fontsize=9)
                ax.set_xlabel('layer')
        axrow[0].legend(fontsize=6)
    fig.suptitle('Per layer at each context length T (sequences in parentheses)', fontsize=11)
    return save(fig, path)


def plot_heatmap(matrix, path, title, xlabel, ylabel, first_row=0, first_column=0):
    from analyze import plt, save  # the plotting setup lives in analyze.py
    fig, ax = plt.subplots(figsize=(5, 4.2))
    rows, columns = matrix.shape
    image = ax.imshow(matrix.numpy(), cmap='viridis', aspect='auto', extent=(
        first_column - 0.5, first_column + columns - 0.5, first_row + rows - 0.5, first_row - 0.5))
    fig.colorbar(image, ax=ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return save(fig, path)


def plot_heatmaps(walker, r, label, layer, tag, out):
    """A_eff of `layer` on the edges that count (a decoder: without the sink column; an encoder: without its special
    tokens), and Ḡ."""
    a_eff = r['a_eff'][layer]
    if walker.causal:
        matrix, rows, columns, what = a_eff[:, 1:], 0, 1, 'sink column removed'
    else:
        (s0, s1), T = walker.specials, a_eff.shape[0]
        matrix, rows, columns, what = a_eff[s0:T - s1, s0:T - s1], s0, s0, 'special tokens removed'
    plot_heatmap(matrix, os.path.join(out, f'a_eff_{tag}.png'), f'{label}\nA_eff, layer {layer}, {what}',
                 'key position j', 'query position i', rows, columns)
    plot_heatmap(r['gram'][layer], os.path.join(out, f'gram_{tag}.png'),
                 f'{label}\nedge-averaged Gram Ḡ, layer {layer}', 'feature', 'feature')


# ---------------------------------------------------------------------------------------------- command line

def run_diagnostics(args):
    out = args.out
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if args.sampling not in SAMPLINGS:
        raise UserError(f"--sampling {args.sampling!r}: choose from {', '.join(SAMPLINGS)}")
    if min(args.n_seqs, args.seq_len, args.sweep_seqs) < 1 or args.gram_edges < 0:
        raise UserError("--n_seqs, --seq_len and --sweep_seqs must be >= 1, --gram_edges >= 0")
    kinds = {source: source_kind(source) for source in args.sources}  # a bad source fails before any slow loading
    names = [os.path.basename(os.path.normpath(source)) for source in args.sources]
    if len(set(names)) < len(names):
        raise UserError("several sources share a folder name; give them distinct names")
    text = read_text(args.text)
    os.makedirs(out, exist_ok=True)
    saved = dict(settings=dict(n_seqs=args.n_seqs, seq_len=args.seq_len, drop_sink=args.drop_sink,
                               text=args.text or 'wikitext-2 test', sampling=args.sampling, seed=args.seed,
                               gram_edges=args.gram_edges, null_model=args.null_model,
                               context_sweep=dict(sampling='documents', sequences=args.sweep_seqs)
                               if args.context_sweep else None))
    for source, name in zip(args.sources, names):
        walker, codec, max_len = load_source(source, kinds[source], device)
        idx = sample_sequences(text, codec, args.n_seqs, min(args.seq_len, max_len), args.sampling, args.seed)
        print(f"{name}: {idx.shape[0]} sequences of {idx.shape[1]} tokens ({args.sampling}, seed {args.seed})")
        sweep_idx = None
        if args.context_sweep:  # documents: the only unit long enough at 1,024 tokens, the same at every length
            sweep_idx = {n: sample_sequences(text, codec, args.sweep_seqs, n, 'documents', args.seed).to(device)
                         for n in context_lengths(max_len, args.seq_len)}
        entry = dict(kind=kinds[source], **architecture(walker), sequences=idx.shape[0], seq_len=idx.shape[1])
        layer = args.layer if args.layer is not None else entry['n_layer'] // 2
        if not 0 <= layer < entry['n_layer']:
            raise UserError(f"--layer {layer} is not a layer of {name} (0 .. {entry['n_layer'] - 1})")
        twin = random_twin(walker, args.seed) if args.null_model else None
        for part in parts(walker):
            r, entry[part] = walk_model(walker, idx.to(device), sweep_idx, part, args, name)
            plot_heatmaps(walker, r, name if part == 'attention' else f'{name} (full operator)', layer,
                          f'{name}_{part}', out)
            if twin is not None:
                entry.setdefault('random_init', {})[part] = walk_model(twin, idx.to(device), sweep_idx, part, args,
                                                                       f'{name}, random init')[1]
        saved[name] = entry
        del walker, twin
    with open(os.path.join(out, 'diagnostics.json'), 'w') as f:
        json.dump(saved, f, indent=1)
    plot_walk_layers(saved, os.path.join(out, 'walk_layers.png'))
    if args.context_sweep:
        for name in names:
            for part in parts_of(saved[name]):
                plot_context_sweep(name, saved[name][part], saved[name].get('random_init', {}).get(part),
                                   os.path.join(out, f'context_sweep_{name}_{part}.png'))
    print(write_tables(saved, os.path.join(out, 'diagnostics.md')) + f"\n-> {out}")


def parts_of(entry):
    return [part for part in ('attention', 'operator') if part in entry]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('sources', nargs='+', help="run folders, GPT-2 names (gpt2, ...), local transformers folders "
                        "of GPT-2, Llama, Qwen2, Qwen3, Gemma 3 or BERT models, .gguf files of Llama or Gemma 3 models "
                        "(dequantised once into ~/.cache/corridor-gpt/gguf), or a model from its PyPI package: "
                        "'all-MiniLM-L6-v2', 'smollm2-135m', 'gemma3-270m'")
    parser.add_argument('--out', default='diagnostics', help='where to write (default: ./diagnostics)')
    parser.add_argument('--text', help='text file to walk over (default: WikiText-2 test through datasets)')
    parser.add_argument('--n_seqs', type=int, default=1024, help='sequences (default 1024, as the paper)')
    parser.add_argument('--seq_len', type=int, default=64, help='tokens per sequence, special tokens included '
                        '(default 64, as the paper)')
    parser.add_argument('--sampling', default='lines', help='; '.join(f'{k}: {v}' for k, v in SAMPLINGS.items()))
    parser.add_argument('--seed', type=int, default=0, help='of the sampling, the random-init twins and the '
                        'per-edge Gram sample')
    parser.add_argument('--drop_sink', action='store_true', help="leave out a decoder's edges to the first token "
                        "(an encoder's [CLS]/[SEP] are always left out)")
    parser.add_argument('--gram_edges', type=int, default=64, help='edges per layer whose Gram is built explicitly '
                        'for the per-edge Gram dominance (default 64; 0: skip; O(d³) each)')
    parser.add_argument('--null_model', action=argparse.BooleanOptionalAction, default=True,
                        help='also walk each model at random initialisation (default: yes)')
    parser.add_argument('--layer', type=int, help='layer of the A_eff and Gram heatmaps (default: the middle one)')
    parser.add_argument('--context_sweep', action='store_true', help='also every layer at context lengths 16 ... 1024 '
                        '(up to the model\'s), on random document chunks')
    parser.add_argument('--sweep_seqs', type=int, default=32, help='sequences at each length of the sweep (default 32; '
                        'the standard errors in the output say whether they are enough)')
    parser.add_argument('--device', help='default: cuda when available, else cpu')
    run_diagnostics(parser.parse_args(argv))


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
