"""
Which heads would move into the corridor first? The gradient probe: ∂L/∂γ of every head of a model given the corridor
δ(γI + P) at γ = 0, δ = 1 (where it computes the model exactly), over fixed sequences of a prepared dataset, with
standard errors over the sequences. Gradient descent moves γ by −∂L/∂γ, so a head with ∂L/∂γ > 0 starts into the
corridor (γ < 0), one with ∂L/∂γ < 0 away from it.

    python -m lab.probe smollm2-135m --dataset=wikitext2_smollm2-135m      # a pretrained LM (prepare.py --tokenizer=...)
    python -m lab.probe out-shakespeare-char --dataset=shakespeare_char     # our GPT: a run folder, any operator
    python -m lab.probe smollm2-135m --dataset=wikitext2_smollm2-135m --compare=sweeps/wikitext2_smollm2-135m/operator/corridor-s0

--compare=RUN sets a corridor run's learned γ beside the probe: does the first gradient predict where heads went?
Writes OUT/probe.json, probe.md and probe.png (heatmaps layer × head: the mean ∂L/∂γ and its t = mean / SE).
"""

import argparse
import json
import math
import os
import sys
from dataclasses import replace

import numpy as np
import torch
from tqdm import tqdm

from common import UserError, atomic_write, main_guard
from lab.figures import plt, save
from sources import check_tokenizer, load_model, load_run, read_meta, read_tokens
from model import OperatorCoefficients


def corridor_at_the_model(model):
    """The model with every head's operator replaced by the corridor at γ = 0, δ = 1, both learnable: the model's
    own computation when the source was attention (and the trained one's weights with a fresh operator otherwise).
    Every other weight frozen: the probe needs no weight gradients."""
    model.config = replace(model.config, operator='corridor', gamma_init=0.0, delta_init=1.0, init_spread=0.0,
                           learn_gamma=True, learn_delta=True, gamma_nonneg=False)
    for p in model.parameters():
        p.requires_grad_(False)
    dtype = next(model.parameters()).dtype
    attention = [m for m in model.modules() if isinstance(getattr(m, 'coefficients', None), OperatorCoefficients)]
    for m in attention:  # first layer first: modules() walks the layers in order
        m.coefficients = OperatorCoefficients(model.config).to(dtype)
    return [m.coefficients.gamma for m in attention]


def sequences(data_root, dataset, split, n_seqs, seq_len, seed):
    """(meta, [n_seqs, seq_len + 1] token windows) at seeded random offsets of a prepared split."""
    # (a split of exactly seq_len + 1 tokens would hold one window; the offsets are drawn below the last one, kept
    # so that the documented probe runs draw the same sequences)
    meta = read_meta(data_root, dataset)
    tokens = read_tokens(data_root, dataset, split, meta, (seq_len + 1, f"the probe draws windows of --seq_len="
                                                                         f"{seq_len} + 1 from at least {seq_len + 2}"))
    offsets = torch.randint(len(tokens) - seq_len - 1, (n_seqs,), generator=torch.Generator().manual_seed(seed))
    return meta, torch.stack([torch.from_numpy(tokens[i:i + seq_len + 1].astype(np.int64)) for i in offsets])


def probe(model, gammas, windows, device):
    """[n_seqs, n_layer, n_head]: ∂L/∂γ of each sequence's mean next-token loss, and the losses [n_seqs]."""
    model.to(device).eval()
    grads, losses = [], []
    for window in tqdm(windows, desc='probe', unit='seq', leave=False):
        x, y = window[None, :-1].to(device), window[None, 1:].to(device)
        _, loss = model(x, y)
        grads.append(torch.stack(torch.autograd.grad(loss, gammas)).cpu().double())
        losses.append(loss.item())
    return torch.stack(grads), losses


def heatmaps(mean, t, path, title):
    n_layer, n_head = mean.shape
    fig, axes = plt.subplots(1, 2, figsize=(2 * (2.5 + 0.45 * n_head), 1.5 + 0.22 * n_layer))
    for ax, values, label in ((axes[0], mean, 'mean ∂L/∂γ at γ = 0, δ = 1'), (axes[1], t, 't = mean / SE')):
        limit = values.abs().max().item() or 1.0
        image = ax.imshow(values.numpy(), cmap='RdBu_r', vmin=-limit, vmax=limit, aspect='auto')
        ax.set(xlabel='head', ylabel='layer', title=label)
        ax.set_xticks(range(n_head))
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(title + ' (red: γ moves below 0, into the corridor)', fontsize=10)
    save(fig, path)


def compare(mean, t, run):
    """Lines for the probe against a corridor run's learned γ: the correlation of −∂L/∂γ with γ over heads, and how
    often a head whose gradient is clear (|t| > 2) moved the way it points."""
    learned = load_run(run)['gamma'].double()
    if learned.shape != mean.shape:
        raise UserError(f"--compare {run}: its γ is {tuple(learned.shape)}, the probe's model {tuple(mean.shape)}")
    push, moved = -mean.flatten(), learned.flatten()
    pearson = torch.corrcoef(torch.stack([push, moved]))[0, 1].item()
    ranks = torch.stack([push.argsort().argsort(), moved.argsort().argsort()]).double()
    spearman = torch.corrcoef(ranks)[0, 1].item()
    clear = t.flatten().abs() > 2
    agree = (torch.sign(push[clear]) == torch.sign(moved[clear])).double().mean().item() if clear.any() else math.nan
    return [f"## Against {run}'s learned γ", '',
            f"- Pearson r(−∂L/∂γ, γ) = {pearson:+.2f}, Spearman {spearman:+.2f}, over {push.numel()} heads",
            f"- heads with |t| > 2: {int(clear.sum())}; of them {agree:.0%} moved the way the gradient points", ''], \
        dict(run=run, pearson=pearson, spearman=spearman, clear_heads=int(clear.sum()), agree=agree)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('source', help='a run folder, a GPT-2 name, or a pretrained causal LM (smollm2-135m, '
                                       'gemma3-270m, a .gguf file, a transformers folder)')
    parser.add_argument('--dataset', required=True, help="a prepared dataset tokenized as the model reads")
    parser.add_argument('--data_root', default='data')
    parser.add_argument('--split', default='val', choices=['train', 'val'])
    parser.add_argument('--n_seqs', type=int, default=64)
    parser.add_argument('--seq_len', type=int, default=256)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--compare', help="a corridor run of the same model: its learned γ beside the probe")
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default='probe')
    args = parser.parse_args(argv)
    if args.n_seqs < 2 or args.seq_len < 1:
        raise UserError("--n_seqs must be at least 2 (for a standard error) and --seq_len at least 1")
    model, _ = load_model(args.source)
    meta, windows = sequences(args.data_root, args.dataset, args.split, args.n_seqs, args.seq_len, args.seed)
    check_tokenizer(model, meta, os.path.join(args.data_root, args.dataset))
    if args.seq_len > model.config.block_size:
        raise UserError(f"--seq_len={args.seq_len} exceeds the model's {model.config.block_size} positions")
    gammas = corridor_at_the_model(model)
    grads, losses = probe(model, gammas, windows, args.device)
    mean, se = grads.mean(0), grads.std(0) / math.sqrt(len(grads))
    t = mean / se.clamp_min(1e-30)
    name = os.path.basename(os.path.normpath(args.source))

    lines = [f"# The gradient probe: {name} on {args.dataset} ({args.split})", '',
             f"∂L/∂γ of every head at γ = 0, δ = 1 over {len(grads)} sequences of {args.seq_len} tokens (seed "
             f"{args.seed}), mean next-token loss {sum(losses) / len(losses):.4f}. SE over sequences; t = mean / SE. "
             "∂L/∂γ > 0: gradient descent moves the head into the corridor (γ < 0).", '',
             '| layer | mean ∂L/∂γ over heads | heads into the corridor (t > 2) | away (t < −2) | strongest head: '
             '∂L/∂γ ± SE |', '|---|---|---|---|---|']
    for layer in range(mean.shape[0]):
        head = int(mean[layer].argmax())
        lines.append(f"| {layer} | {mean[layer].mean():+.2e} | {int((t[layer] > 2).sum())} / {mean.shape[1]} | "
                     f"{int((t[layer] < -2).sum())} | {head}: {mean[layer, head]:+.2e} ± {se[layer, head]:.1e} |")
    into = (t > 2).double().mean().item()
    lines += ['', f"Over all heads: {into:.0%} would move into the corridor with |t| > 2, "
                  f"{(t < -2).double().mean().item():.0%} away from it (were no head pushed either way, |t| > 2 "
                  f"would flag about 2.5 % of them each way).", '']
    result = dict(source=args.source, dataset=args.dataset, split=args.split, n_seqs=len(grads), seq_len=args.seq_len,
                  seed=args.seed, loss=sum(losses) / len(losses), grad_mean=mean.tolist(), grad_se=se.tolist(),
                  t=t.tolist())
    if args.compare:
        more, result['compare'] = compare(mean, t, args.compare)
        lines += more
    os.makedirs(args.out, exist_ok=True)
    heatmaps(mean, t, os.path.join(args.out, 'probe.png'), f'{name}: which heads move first')
    with atomic_write(os.path.join(args.out, 'probe.json')) as f:
        json.dump(result, f, indent=1)
    with atomic_write(os.path.join(args.out, 'probe.md')) as f:
        f.write('\n'.join(lines) + '\n')
    print('\n'.join(lines) + f"-> {args.out}/probe.md, probe.json, probe.png")


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
