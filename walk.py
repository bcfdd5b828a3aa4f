"""
Connection-walk diagnostics: multi-head attention read as one walk over token positions.

For one layer with heads h = 1..H, model width d and head size d_h (row-vector convention, x ↦ x·M):
  A_h          head h's walk weights on the causal edges (i, j), i ≥ j: its attention probabilities P_h, or for
               the full operator c_I,h·I + c_P,h·P_h (signed when c_I,h or c_P,h < 0)
  A_eff        = mean_h A_h
  M_h          = W_V^h W_O^h (d×d): head h's value block of c_attn times its rows of c_proj, biases excluded
  O_ij         = Σ_h w_ij^h M_h,  w_ij^h = A_h[i,j] / Σ_h' |A_h'[i,j]|   (the edge's transport)
  G_ij         = O_ijᵀ O_ij,  μ_ij = tr(G_ij) / d
  δ_orth       = mean over edges of ‖G_ij − μ_ij I‖_F / ‖μ_ij I‖_F   (0: O_ij is a scaled isometry)
  gram_rel     = mean over edges of ‖G_ij − μ_ij I‖_F / ‖G_ij‖_F
  drift(ℓ)     = 1 − cos(A_eff^ℓ, A_eff^(ℓ+1)) over the causal edges
  Gram dominance: mean |diagonal| and mean |off-diagonal| entry of Ḡ = mean over edges of G_ij
Every per-sequence quantity is averaged over the sequences; drop_sink removes the edges to the first token
(j = 0), which soak up much of the attention in trained models, from every quantity.

Signed weights (the corridor's identity term): Σ_h A_h[i,j] can be 0 or negative, so the edge weights are
normalised by the total absolute weight Σ_h |A_h[i,j]|. For non-negative weights this is the usual
normalisation; δ_orth and gram_rel do not depend on it at all (they are invariant to scaling O_ij).

Exact and fast: no d×d matrix per edge. tr(G) and ‖G‖_F² are polynomials of degree 2 and 4 in the edge's
head weights w, with coefficients computed once per layer from head-sized (d_h×d_h) blocks:
  tr(M_aᵀ M_b)             = tr(P_ab Q_ba)
  tr(M_aᵀ M_b M_cᵀ M_d)    = tr(P_ab Q_bc P_cd Q_da),   P_ab = W_V^aᵀ W_V^b,  Q_ab = W_O^a W_O^bᵀ
so each edge costs O(H⁴) (O(H²(H+1)²/4) with the symmetry used below) instead of O(d³). In float64 the
result is exact to rounding, except that ‖G − μI‖² = ‖G‖² − tr(G)²/d cancels near an isometry: δ_orth below
~1e-8 reads as ~1e-8.
"""

import math

import torch
from tqdm import tqdm


def head_weights(attn):
    """W_V [H, d, d_h] and W_O [H, d_h, d] of one CausalSelfAttention, so that M_h = W_V[h] @ W_O[h]."""
    H, d = attn.n_head, attn.n_embd
    d_h = d // H
    w_v = attn.c_attn.weight[2 * d:3 * d]            # v = x @ w_v.T, head h's values are columns h·d_h ...
    W_V = w_v.view(H, d_h, d).transpose(1, 2)          # [H, d, d_h]
    W_O = attn.c_proj.weight.t().reshape(H, d_h, d)    # y = z @ c_proj.weight.T, z = heads concatenated
    return W_V, W_O


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


def walk_weights(probs, c_I=None, c_P=None):
    """Per-head walk weights [B, H, T, T]: the attention probabilities, or with (c_I, c_P) [H] the full operator
    c_I·I + c_P·P."""
    if c_I is None:
        return probs
    eye = torch.eye(probs.shape[-1], dtype=probs.dtype, device=probs.device)
    return c_I.view(-1, 1, 1) * eye + c_P.view(-1, 1, 1) * probs


def causal_edges(T, drop_sink, device):
    i, j = torch.tril_indices(T, T, device=device)
    keep = j > 0 if drop_sink else torch.ones_like(i, dtype=torch.bool)
    return i[keep], j[keep]


@torch.no_grad()
def connection_diagnostics(model, idx, drop_sink=False, full_operator=False, batch_size=None, progress=False):
    """Per-layer connection-walk diagnostics of `model` on token sequences idx [N, T] (see the module docstring).

    full_operator: walk weights c_I·I + c_P·P of the operator instead of the attention probabilities alone.
    Returns a dict of per-layer lists: a_eff_fro [L], drift [L−1], delta_orth [L], gram_rel [L],
    gram_diag_mean [L], gram_offdiag_mean [L]; and tensors a_eff [L, T, T] (mean over sequences) and gram
    [L, d, d] (Ḡ) for plots."""
    model.eval()
    N, T = idx.shape
    L, H, d = model.config.n_layer, model.config.n_head, model.config.n_embd
    device = idx.device
    f64 = torch.float64
    layers = []
    for block in model.transformer.h:
        W_V, W_O = (w.to(f64) for w in head_weights(block.attn))
        T2, T4, P = transport_moments(W_V, W_O)
        K, ia, ib = pair_form(T4)
        c_I, c_P = (c.to(device, f64) for c in block.attn.coefficients())
        layers.append(dict(W_O=W_O, P=P, T2=T2, K=K, ia=ia, ib=ib, c=(c_I, c_P) if full_operator else (None, None)))
    ei, ej = causal_edges(T, drop_sink, device)
    if len(ei) == 0:
        raise ValueError(f"sequences of {T} token(s) without the sink column have no edges")
    sums = dict(a_eff_fro=torch.zeros(L, dtype=f64), drift=torch.zeros(max(L - 1, 0), dtype=f64),
                delta_orth=torch.zeros(L, dtype=f64), gram_rel=torch.zeros(L, dtype=f64),
                a_eff=torch.zeros(L, T, T, dtype=f64), C=torch.zeros(L, H, H, dtype=f64))
    edge_count = torch.zeros(L, dtype=f64)  # edges with a defined δ_orth
    # keep each batch's probabilities (L·H·T² per sequence) to a few hundred MB
    batch_size = batch_size or max(1, 2 ** 25 // (L * H * T * T))
    batches = range(0, N, batch_size)
    for start in tqdm(batches, desc='connection walk', disable=not progress, unit='batch'):
        probs = model.attention_probs(idx[start:start + batch_size])
        previous = None
        for l, (p, layer) in enumerate(zip(probs, layers)):
            A = walk_weights(p.to(f64), *layer['c'])          # [B, H, T, T]
            a_eff = A.mean(1)
            sums['a_eff'][l] += a_eff.sum(0).cpu()
            edges = a_eff[:, ei, ej]                          # [B, E]
            sums['a_eff_fro'][l] += edges.norm(dim=1).sum().cpu()
            if previous is not None:
                cos = (previous * edges).sum(1) / (previous.norm(dim=1) * edges.norm(dim=1))
                sums['drift'][l - 1] += (1 - cos).sum().cpu()
            previous = edges
            w = A[:, :, ei, ej].permute(0, 2, 1).reshape(-1, H)  # [B·E, H]
            total = w.abs().sum(1, keepdim=True)
            w = torch.where(total > 0, w / total, 0.0)            # an edge no head walks (δ = 0) has no transport
            sums['C'][l] += (w.T @ w).cpu()
            trace = ((w @ layer['T2']) * w).sum(1)                # tr(G) per edge
            u = w[:, layer['ia']] * w[:, layer['ib']]
            fro2 = ((u @ layer['K']) * u).sum(1)                  # ‖G‖_F² per edge
            off2 = (fro2 - trace ** 2 / d).clamp(min=0)           # ‖G − μI‖_F², ≥ 0 up to rounding
            ok = trace > 1e-12 * trace.max().clamp(min=1e-300)    # δ_orth is undefined where O_ij = 0
            sums['delta_orth'][l] += (off2[ok].sqrt() / (trace[ok] / math.sqrt(d))).sum().cpu()
            sums['gram_rel'][l] += (off2[ok].sqrt() / fro2[ok].sqrt()).sum().cpu()
            edge_count[l] += ok.sum().cpu()
    n_edges = N * len(ei)
    out = dict(a_eff_fro=(sums['a_eff_fro'] / N).tolist(), drift=(sums['drift'] / N).tolist(),
               delta_orth=(sums['delta_orth'] / edge_count).tolist(), gram_rel=(sums['gram_rel'] / edge_count).tolist())
    grams = []
    for l, layer in enumerate(layers):
        C = (sums['C'][l] / n_edges).to(device)  # mean over edges of w wᵀ
        H_, d_h = layer['P'].shape[0], layer['P'].shape[2]
        B = (C[:, :, None, None] * layer['P']).permute(0, 2, 1, 3).reshape(H_ * d_h, H_ * d_h)
        W_O = layer['W_O'].reshape(H_ * d_h, d)
        grams.append((W_O.T @ B @ W_O).cpu())  # Ḡ = Σ_ab C_ab M_aᵀ M_b
    gram = torch.stack(grams)
    diag = gram.diagonal(dim1=1, dim2=2).abs()
    out['gram_diag_mean'] = diag.mean(1).tolist()
    out['gram_offdiag_mean'] = ((gram.abs().sum((1, 2)) - diag.sum(1)) / (d * d - d)).tolist()
    out['a_eff'] = (sums['a_eff'] / N).float()
    out['gram'] = gram.float()
    return out


def depth_regimes(values):
    """Means over the initial (first 20 %), middle and final (last 20 %) layers, counted symmetrically from both
    ends (12 layers: 0–2, 3–8, 9–11)."""
    L = len(values)
    groups = dict(initial=[v for l, v in enumerate(values) if l < 0.2 * L],
                  middle=[v for l, v in enumerate(values) if l >= 0.2 * L and L - 1 - l >= 0.2 * L],
                  final=[v for l, v in enumerate(values) if L - 1 - l < 0.2 * L])
    return {k: sum(v) / len(v) if v else None for k, v in groups.items()}
