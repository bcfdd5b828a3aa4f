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

import argparse
import json
import math
import os
import statistics
import sys

import torch
from tqdm import tqdm

from common import GPT2_NAMES, UserError, is_gpt2, load_model, main_guard, tokenizer_from_meta


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


PER_LAYER = ('a_eff_fro', 'drift', 'delta_orth', 'delta_orth_trace', 'gram_rel', 'gram_diag_mean', 'gram_offdiag_mean')


@torch.no_grad()
def connection_diagnostics(model, idx, drop_sink=False, full_operator=False, batch_size=None, progress=False):
    """Per-layer connection-walk diagnostics of `model` on token sequences idx [N, T] (see the module docstring).

    full_operator: walk weights c_I·I + c_P·P of the operator instead of the attention probabilities alone.
    Returns a dict of per-layer lists (PER_LAYER): a_eff_fro [L], drift [L−1], delta_orth [L], delta_orth_trace
    [L] (the same per edge, normalised by tr G instead of ‖μI‖_F: δ_orth / √d), gram_rel [L], gram_diag_mean [L],
    gram_offdiag_mean [L]; and tensors a_eff [L, T, T] (mean over sequences) and gram [L, d, d] (Ḡ) for plots.
    The model is left in the mode it was in."""
    was_training = model.training
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
               delta_orth=(sums['delta_orth'] / edge_count).tolist(),
               delta_orth_trace=(sums['delta_orth'] / edge_count / math.sqrt(d)).tolist(),
               gram_rel=(sums['gram_rel'] / edge_count).tolist())
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
    model.train(was_training)
    return out


def depth_regimes(values):
    """Means over the initial (first 20 %), middle and final (last 20 %) layers, counted symmetrically from both
    ends (12 layers: 0–2, 3–8, 9–11)."""
    L = len(values)
    groups = dict(initial=[v for l, v in enumerate(values) if l < 0.2 * L],
                  middle=[v for l, v in enumerate(values) if l >= 0.2 * L and L - 1 - l >= 0.2 * L],
                  final=[v for l, v in enumerate(values) if L - 1 - l < 0.2 * L])
    return {k: sum(v) / len(v) if v else None for k, v in groups.items()}


# ---------------------------------------------------------------------------------------------- command line

def load_source(source):
    """(name, model, encode) for a run folder, a GPT-2 name, or a local transformers GPT-2 folder."""
    model, meta = load_model(source)
    return os.path.basename(os.path.normpath(source)), model, tokenizer_from_meta(meta)[0]


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


def token_sequences(ids, n_seqs, seq_len):
    """Up to n_seqs consecutive, non-overlapping sequences of seq_len tokens, [N, T]."""
    n = min(n_seqs, len(ids) // seq_len)
    if n < 1:
        raise UserError(f"the text has {len(ids)} tokens, fewer than one sequence of {seq_len}")
    return torch.tensor(ids[:n * seq_len], dtype=torch.long).view(n, seq_len)


def plot_walk_layers(results, path):
    """Per-layer curves of every model (and part) on shared axes."""
    from analyze import plt, save  # the plotting setup lives in analyze.py
    panels = [('drift', 'drift 1 − cos(A_eff^ℓ, A_eff^ℓ+1)'), ('a_eff_fro', '‖A_eff‖_F'),
              ('delta_orth', 'δ_orth (0: scaled isometry)'), ('gram_rel', '‖G − μI‖_F / ‖G‖_F')]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (key, title) in zip(axes, panels):
        for label, r in results.items():
            values = r[key]
            x = [l + 0.5 for l in range(len(values))] if key == 'drift' else list(range(len(values)))
            ax.plot(x, values, marker='.', label=label)
        ax.set_xlabel('layer (drift: between ℓ and ℓ+1)')
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7)
    fig.suptitle('Connection-walk diagnostics by layer', fontsize=11)
    return save(fig, path)


def plot_heatmap(matrix, path, title, xlabel, ylabel, first_column=0):
    from analyze import plt, save  # the plotting setup lives in analyze.py
    fig, ax = plt.subplots(figsize=(5, 4.2))
    image = ax.imshow(matrix.numpy(), cmap='viridis', aspect='auto',
                      extent=(first_column - 0.5, first_column + matrix.shape[1] - 0.5, matrix.shape[0] - 0.5, -0.5))
    fig.colorbar(image, ax=ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return save(fig, path)


def plot_context_sweep(sweeps, path):
    """sweeps: {label: {length: result}}: layer-averaged drift and δ_orth against context length."""
    from analyze import plt, save  # the plotting setup lives in analyze.py
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (key, title) in zip(axes, [('drift', 'mean drift'), ('a_eff_fro', 'mean ‖A_eff‖_F'),
                                       ('delta_orth', 'mean δ_orth')]):
        for label, by_length in sweeps.items():
            lengths = sorted(by_length)
            ax.plot(lengths, [statistics.fmean(by_length[n][key]) for n in lengths], marker='o', label=label)
        ax.set_xscale('log', base=2)
        ax.set_xlabel('context length T (tokens)')
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7)
    fig.suptitle('Connection-walk diagnostics against context length (mean over layers)', fontsize=11)
    return save(fig, path)


def run_diagnostics(args):
    out = args.out
    os.makedirs(out, exist_ok=True)
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    for source in args.sources:  # fail on a bad name before any slow loading
        if not is_gpt2(source) and not os.path.isfile(os.path.join(source, 'ckpt.pt')):
            raise UserError(f"{source!r} is neither a run folder with ckpt.pt nor a GPT-2 model "
                            f"({', '.join(GPT2_NAMES)}, or a local transformers folder)")
    text = read_text(args.text)
    results, sweeps, saved = {}, {}, dict(settings=dict(n_seqs=args.n_seqs, seq_len=args.seq_len,
                                                        drop_sink=args.drop_sink, text=args.text or 'wikitext-2 test'))
    for source in args.sources:
        name, model, encode = load_source(source)
        model.to(device)
        ids = encode(text)
        idx = token_sequences(ids, args.n_seqs, min(args.seq_len, model.config.block_size)).to(device)
        parts = ['attention'] if model.config.operator == 'attention' else ['attention', 'operator']
        saved[name] = dict(sequences=idx.shape[0], seq_len=idx.shape[1])
        for part in parts:
            label = name if len(parts) == 1 else f"{name} ({'attention part' if part == 'attention' else 'full operator'})"
            print(f"{label}: {idx.shape[0]} sequences of {idx.shape[1]} tokens")
            r = connection_diagnostics(model, idx, drop_sink=args.drop_sink, full_operator=part == 'operator',
                                       progress=True)
            results[label] = r
            layer = args.layer if args.layer is not None else model.config.n_layer // 2
            if not 0 <= layer < model.config.n_layer:
                raise UserError(f"--layer {layer} is not a layer of {name} (0 .. {model.config.n_layer - 1})")
            tag = f"{name}_{part}"
            plot_heatmap(r['a_eff'][layer][:, 1:], os.path.join(out, f'a_eff_{tag}.png'),
                         f'{label}\nA_eff, layer {layer}, sink column removed', 'key position j', 'query position i',
                         first_column=1)
            plot_heatmap(r['gram'][layer], os.path.join(out, f'gram_{tag}.png'),
                         f'{label}\nedge-averaged Gram Ḡ, layer {layer}', 'feature', 'feature')
            numbers = {k: v for k, v in r.items() if k not in ('a_eff', 'gram')}
            numbers['gram_by_depth'] = {k: depth_regimes(r[k]) for k in ('gram_diag_mean', 'gram_offdiag_mean')}
            if args.context_sweep:
                by_length = {}
                for length in [n for n in (16, 32, 64, 128, 256, 512, 1024) if n <= model.config.block_size]:
                    # fewer sequences at longer contexts keep the edge count (and the time) near the main run's
                    n = max(1, round(idx.shape[0] * idx.shape[1] ** 2 / length ** 2))
                    seqs = token_sequences(ids, min(n, args.n_seqs), length).to(device)
                    by_length[length] = connection_diagnostics(model, seqs, drop_sink=args.drop_sink,
                                                               full_operator=part == 'operator')
                sweeps[label] = by_length
                numbers['context_sweep'] = {n: {k: statistics.fmean(v[k]) for k in ('drift', 'a_eff_fro', 'delta_orth')}
                                            for n, v in by_length.items()}
            saved[name][part] = numbers
    with open(os.path.join(out, 'diagnostics.json'), 'w') as f:
        json.dump(saved, f, indent=1)
    plot_walk_layers(results, os.path.join(out, 'walk_layers.png'))
    if sweeps:
        plot_context_sweep(sweeps, os.path.join(out, 'context_sweep.png'))
    rows = ["| model | layer | drift to next | ‖A_eff‖_F | δ_orth | ‖G−μI‖/‖G‖ | Ḡ mean abs diag | Ḡ mean abs off-diag |",
            "|---|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        for l in range(len(r['delta_orth'])):
            drift = f"{r['drift'][l]:.4f}" if l < len(r['drift']) else '–'
            rows.append(f"| {label} | {l} | {drift} | {r['a_eff_fro'][l]:.3f} | {r['delta_orth'][l]:.3f} "
                        f"| {r['gram_rel'][l]:.3f} | {r['gram_diag_mean'][l]:.4g} | {r['gram_offdiag_mean'][l]:.4g} |")
    with open(os.path.join(out, 'diagnostics.md'), 'w') as f:
        f.write('\n'.join(rows) + '\n')
    print('\n'.join(rows) + f"\n-> {out}")



def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('sources', nargs='+', help='run folders, GPT-2 names (gpt2, ...) or local transformers folders')
    parser.add_argument('--out', default='diagnostics', help='where to write (default: ./diagnostics)')
    parser.add_argument('--text', help='text file to walk over (default: WikiText-2 test through datasets)')
    parser.add_argument('--n_seqs', type=int, default=1024, help='sequences (default 1024, as the paper)')
    parser.add_argument('--seq_len', type=int, default=64, help='tokens per sequence (default 64, as the paper)')
    parser.add_argument('--drop_sink', action='store_true', help='leave out the edges to the first token')
    parser.add_argument('--layer', type=int, help='layer of the A_eff and Gram heatmaps (default: the middle one)')
    parser.add_argument('--context_sweep', action='store_true', help='also at context lengths 16 ... 1024')
    parser.add_argument('--device', help='default: cuda when available, else cpu')
    run_diagnostics(parser.parse_args(argv))


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
