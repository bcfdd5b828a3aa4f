"""
Where did the operator go? Reads run folders written by train.py; writes corridor occupancy, γ/δ plots, comparisons.

    python analyze.py out-shakespeare-char                        # -> out-shakespeare-char/analysis/
    python analyze.py out-a out-b out-c --out comparison          # each run, and the runs compared

Reads each run's log.jsonl (every evaluation) and ckpt.pt (its config and, for a run stopped after its last
evaluation, the newer scalars); a run that saved no checkpoint yet is read from log.jsonl and config.json alone.
Per run (RUN/analysis/, or OUT/<run>/): corridor.json, summary.md, occupancy.png, gamma_delta.png, evolution.png
(every head's γ and δ against tokens seen), loss.png, and walk.png for a run trained with walk_interval (drawn by
lab/figures.py). Several runs: the same across runs in OUT (./comparison) and a summary.md of final losses. The
corridor is −1 < γ < 0 (model.in_corridor): γ = 0 counts as "above" (attention), γ = −1 as "below" (a Laplacian).
Any γ just below 0 is in it, so every share is given twice: in the corridor, and settled in it, −1 < γ < −0.05
(model.CLAIM_B, claim (b)'s reading), which a head a hair off attention does not reach.
"""

import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use('Agg')  # files only: no display on a server, and no GUI backend to import
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)
import torch  # noqa: E402

from common import UserError, atomic_write, main_guard, save_figure as save  # noqa: E402
from model import CLAIM_B, in_corridor  # noqa: E402
from sources import load_run  # noqa: E402


SETTLED = f'−1 < γ < −{-CLAIM_B:g}'  # claim (b)'s "settled in the corridor": the settled shares' name in tables, plots


def shares(gamma):
    """{occupancy: the share of γ's heads in the corridor −1 < γ < 0, inside_claim_b: the share settled in it}."""
    return dict(occupancy=in_corridor(gamma).float().mean().item(),
                inside_claim_b=in_corridor(gamma, CLAIM_B).float().mean().item())


def occupancy_report(gamma, delta):
    """corridor.json's content for [n_layer, n_head] tensors of γ and δ: per layer and over all heads (and the layers
    after the first), the shares in the corridor (occupancy) and settled in it (inside_claim_b)."""
    layers = [dict(layer=layer, gamma=g.tolist(), delta=d.tolist(), **shares(g),
                   below=int((g <= -1).sum()), above=int((g >= 0).sum()), gamma_mean=g.mean().item(),
                   gamma_median=g.median().item(), delta_mean=d.mean().item())  # median: the lower middle value
              for layer, (g, d) in enumerate(zip(gamma, delta))]
    beyond = shares(gamma[1:]) if len(gamma) > 1 else dict(occupancy=None, inside_claim_b=None)
    return dict(layers=layers, **shares(gamma), **{f'{key}_beyond_first': x for key, x in beyond.items()})


def layer_table(report):
    rows = [f"| layer | in corridor, −1 < γ < 0 | settled, {SETTLED} | γ ≤ −1 | γ ≥ 0 | γ mean | γ median | δ mean |",
            "|---|---|---|---|---|---|---|---|"]
    rows += [f"| {r['layer']} | {r['occupancy']:.0%} | {r['inside_claim_b']:.0%} | {r['below']} | {r['above']} "
             f"| {r['gamma_mean']:+.3f} | {r['gamma_median']:+.3f} | {r['delta_mean']:.3f} |" for r in report['layers']]
    beyond, settled = report['occupancy_beyond_first'], report['inside_claim_b_beyond_first']
    return '\n'.join(rows) + f"\n\nall heads: {report['occupancy']:.0%} in the corridor, " \
        f"{report['inside_claim_b']:.0%} settled ({SETTLED})" \
        + (f"; layers after the first: {beyond:.0%} and {settled:.0%}" if beyond is not None else '')


def plot_occupancy(reports, path, attention=()):
    """reports: {label: occupancy report}: bars grouped by layer, each run's share in the corridor hatched and, where
    the report has it, the share settled in it solid over it (a subset: a hatched top is the heads only just below
    0); attention: the attention runs' labels, an x at 0 %."""
    n_layer = len(next(iter(reports.values()))['layers'])
    fig, ax = plt.subplots(figsize=(min(16, max(5, 1.2 * n_layer)) + 3.4, 3.6))
    slots, layers = len(reports) + len(attention), range(n_layer)
    width = 0.8 / slots
    for k, (label, report) in enumerate(reports.items()):
        x = [r['layer'] + (k - (slots - 1) / 2) * width for r in report['layers']]
        ax.bar(x, [r['occupancy'] for r in report['layers']], width, facecolor='none', edgecolor=f'C{k}', hatch='///',
               label=f'{label}: in the corridor, −1 < γ < 0')
        if all('inside_claim_b' in r for r in report['layers']):
            ax.bar(x, [r['inside_claim_b'] for r in report['layers']], width, color=f'C{k}', edgecolor=f'C{k}',
                   label=f'{label}: settled, {SETTLED} (claim (b))')
    for k, label in enumerate(attention, len(reports)):  # a zero-height bar would not show: a marker at 0 does
        ax.plot([x + (k - (slots - 1) / 2) * width for x in layers], [0] * n_layer, 'x', ms=8, mew=2, color='black',
                clip_on=False, label=f'{label}:\n0 % by construction (γ = 0)')
    ax.set(ylim=(0, 1.05), xticks=layers, xlabel='layer', ylabel='fraction of heads',
           title='Corridor occupancy by layer')
    ax.legend(fontsize=8, loc='upper left', bbox_to_anchor=(1.01, 1))
    return save(fig, path)


def plot_gamma_delta(runs, path, attention=()):
    """runs: {label: (γ, δ)}, a panel each; attention: the labels of attention runs (every head at (0, 1)), named."""
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.8), squeeze=False)
    for ax, (label, (gamma, delta)) in zip(axes[0], runs.items()):
        ax.axvspan(-1, 0, color='tab:green', alpha=0.12, label='corridor −1 < γ < 0')
        for edge in (-1, 0):  # both edges drawn, so the lower one shows even where no head comes near it
            ax.axvline(edge, color='tab:green', lw=1)
        colors = plt.cm.viridis([i / max(1, len(gamma) - 1) for i in range(len(gamma))])
        for layer, (g, d) in enumerate(zip(gamma, delta)):
            ax.scatter(g.tolist(), d.tolist(), color=colors[layer], s=22,
                       label=f'layer {layer}' if len(gamma) <= 8 else None)
        ax.scatter([0], [1], marker='*', s=260, facecolor='none', edgecolor='tab:red', linewidth=1.6, zorder=3,
                   label='attention (γ = 0, δ = 1)')  # hollow: heads that stay near attention show through
        ax.set(xlim=(min(-1, gamma.min().item()) - 0.15, max(0.15, gamma.max().item() + 0.15)),
               xlabel='γ = c_I / c_P', ylabel='δ = c_P')
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=7, loc='best')
        if len(gamma) > 8:  # a pretrained model's 30 layers: a colour scale, not 30 legend entries
            scale = plt.cm.ScalarMappable(cmap='viridis', norm=plt.Normalize(0, len(gamma) - 1))
            fig.colorbar(scale, ax=ax, label='layer')
    named = f"\nattention, every head at ☆ (0, 1): {', '.join(attention)}" if attention else ''
    fig.suptitle('Every head in the (γ, δ) plane' + named, fontsize=10, wrap=True)
    return save(fig, path)


def plot_evolution(log, path, title):
    """γ (upper rows) and δ of every head against tokens seen, a column per layer (six at most, then wrapped), γ's axis
    spanning the whole corridor [−1, 0]; head k has colour k in every panel, named in one legend. Every γ panel has
    one y-scale, every δ panel another: layers are compared by eye, and a panel scaled to its own range would show a
    δ moving 0.98 … 1.03 as large as one moving 0.8 … 1.0."""
    tokens = [e['tokens'] / 1e6 for e in log]
    gamma = torch.tensor([e['gamma'] for e in log])  # [evals, layers, heads]
    delta = torch.tensor([e['delta'] for e in log])
    n_layer, n_head = gamma.shape[1:]
    columns = min(n_layer, 6)
    pairs = math.ceil(n_layer / columns)
    fig, axes = plt.subplots(2 * pairs, columns, figsize=(3.2 * columns, 2.7 * 2 * pairs), sharex=True, squeeze=False,
                             height_ratios=[3, 2] * pairs)  # γ's row taller: its axis spans the whole corridor
    panels = axes.reshape(pairs, 2, columns).transpose(0, 2, 1).reshape(-1, 2)  # (γ, δ) per layer, row by row
    for top, bottom in panels[1:n_layer]:
        top.sharey(panels[0][0])
        bottom.sharey(panels[0][1])
    for layer, (top, bottom) in enumerate(panels[:n_layer]):
        for head in range(n_head):
            top.plot(tokens, gamma[:, layer, head].tolist(), lw=1.4, color=f'C{head % 10}', label=f'head {head}')
            bottom.plot(tokens, delta[:, layer, head].tolist(), lw=1.4, color=f'C{head % 10}')
        top.axhspan(-1, 0, color='tab:green', alpha=0.12)  # γ's axis: the whole corridor and every head
        top.margins(y=0.06)
        for edge in (-1, 0):
            top.axhline(edge, color='tab:green', lw=1, zorder=1)  # under the heads, which start on γ = 0
        # heads that stay near 0 are a few pixels on an axis down to −1: their final values, in words
        top.set_title('layer {}: γ ends {:+.2f} … {:+.2f}'.format(layer, *gamma[-1, layer].aminmax()), fontsize=9)
        top.set_ylabel('γ (shaded: the corridor)' if layer % columns == 0 else '')
        bottom.set(ylabel='δ' if layer % columns == 0 else '', xlabel='tokens seen (millions)')
    for empty in panels[n_layer:].flat:
        empty.axis('off')
    named = n_head <= 10  # beyond ten heads the colours repeat: a legend would mislead
    if named:
        fig.legend(*axes[0][0].get_legend_handles_labels(), loc='lower center', ncol=n_head, fontsize=8,
                   title='colour = head index, the same in every layer', title_fontsize=8, frameon=False)
    fig.suptitle(f'{title}: γ and δ of every head' + ('' if named else ' (one line per head)'), fontsize=11)
    return save(fig, path, rect=(0, 0.55 / fig.get_figheight() if named else 0, 1, 1))


def plot_losses(curves, path, title, compare=False):
    """curves: {label: (tokens, losses)} overlaid. compare: the first is the reference, and a panel below shows each
    other run's difference from it at the evaluations they share, with what one run per variant can and cannot say."""
    fig, axes = plt.subplots(1 + compare, 1, figsize=(6.4, 6) if compare else (6, 3.8), sharex=True,
                             squeeze=False, height_ratios=(3, 2) if compare else None)
    top, bottom = axes[0, 0], axes[-1, 0]
    ref_label, (ref_tokens, ref_losses) = next(iter(curves.items()))
    reference = dict(zip(ref_tokens, ref_losses))
    for k, (label, (tokens, losses)) in enumerate(curves.items()):
        # a style and marker per curve, not colour alone: the first thick and solid, under the others' thin dashes
        style = dict(ls='-', marker='o', lw=2.6, ms=5, mfc='none') if k == 0 else \
            dict(ls=('--', ':', '-.')[(k - 1) % 3], marker='s^vD<>'[(k - 1) % 6], lw=1.4, ms=4, zorder=3)
        every = max(1, len(tokens) // 15)
        top.plot([t / 1e6 for t in tokens], losses, color=f'C{k}', label=label, markevery=every, **style)
        if k and compare:
            shared = [(t, loss - reference[t]) for t, loss in zip(tokens, losses) if t in reference]
            bottom.plot([t / 1e6 for t, _ in shared], [d for _, d in shared], color=f'C{k}', markevery=every,
                        label=f'{label} − {ref_label}' + (f': {shared[-1][1]:+.4f} at the end' if shared else '')
                        + f'\n(< 0: {label} lower)', **style)
    top.set(ylabel='loss (nats per token)', title=title)
    top.legend(fontsize=8)
    bottom.set(xlabel='tokens seen (millions)')
    if compare:
        bottom.axhline(0, color='black', lw=0.7)
        bottom.set(ylabel='run − reference (nats)')
        bottom.legend(fontsize=7, loc='upper center', bbox_to_anchor=(0.5, -0.32))  # below the panel: on no point
        # a caption under the axes, never over a curve (tight_layout leaves room for a figure's supxlabel)
        fig.supxlabel('one run each: a difference is evidence only against the seed-to-seed spread;\n'
                      'train several seeds (python -m lab.sweep) before reading a sign into it',
                      fontsize=7, color='0.3')
    return save(fig, path)


def plot_walks(logs, path, title):
    """logs: {label: log}; walk.png of those trained with walk_interval: the second paper's geometry, the lab's."""
    walked = {label: [log] for label, log in logs.items() if any('walk' in e for e in log)}
    if walked:
        from lab.figures import plot_walk_evolution
        plot_walk_evolution(walked, path, title)


def analyze_run(run, out):
    """Write one run's corridor.json, summary.md and plots into out; returns its occupancy report."""
    os.makedirs(out, exist_ok=True)
    report = dict(run=run['name'], iter=run['iter'], operator=run['config']['operator'],
                  **occupancy_report(run['gamma'], run['delta']))
    if run['series']:  # occupancy at every evaluation, from log.jsonl
        report['series'] = [dict(iter=it, **shares(g), occupancy_by_layer=in_corridor(g).float().mean(-1).tolist(),
                                 inside_claim_b_by_layer=in_corridor(g, CLAIM_B).float().mean(-1).tolist())
                            for it, g, _ in run['series']]
    with atomic_write(os.path.join(out, 'corridor.json')) as f:
        json.dump(report, f, indent=1)
    scalars = report['operator'] != 'attention'  # plain attention has none: every head is (c_I, c_P) = (0, 1)
    log = run['log']
    if scalars:
        plot_occupancy({run['name']: report}, os.path.join(out, 'occupancy.png'))
        plot_gamma_delta({run['name']: (run['gamma'], run['delta'])}, os.path.join(out, 'gamma_delta.png'))
        if log:
            plot_evolution(log, os.path.join(out, 'evolution.png'), run['name'])
    if log:
        plot_losses({split: ([e['tokens'] for e in log], [e[f'{split}_loss'] for e in log])
                     for split in ('train', 'val')}, os.path.join(out, 'loss.png'), f"{run['name']}: loss")
    plot_walks({run['name']: log}, os.path.join(out, 'walk.png'), run['name'])
    table = layer_table(report) if scalars else \
        "plain attention: every head's (c_I, c_P) is (0, 1), γ = 0, δ = 1, nothing to place in the corridor"
    header = f"# {run['name']}: operator {report['operator']}, iter {run['iter']}" + \
        (" (no ckpt.pt yet: its log.jsonl's last evaluation)" if run['checkpoint'] is None else '') + "\n\n"
    with atomic_write(os.path.join(out, 'summary.md')) as f:
        f.write(header + table + '\n')
    print(header + table + f"\n-> {out}\n")
    return report


def label(run):
    """A run's name in plots: its folder and its operator, which the folder name may not say."""
    operator = run['config']['operator']
    return run['name'] if operator in run['name'] else f"{run['name']} ({operator})"


def compare_runs(runs, reports, out):
    """Several runs: plots across runs and a summary of final losses."""
    os.makedirs(out, exist_ok=True)
    with_scalars = [r for r in runs if r['config']['operator'] != 'attention']
    attention = [label(r) for r in runs if r['config']['operator'] == 'attention']  # named in the figures, not drawn
    if with_scalars:
        plot_occupancy({label(r): reports[r['name']] for r in with_scalars}, os.path.join(out, 'occupancy.png'),
                       attention=attention)
        plot_gamma_delta({label(r): (r['gamma'], r['delta']) for r in with_scalars},
                         os.path.join(out, 'gamma_delta.png'), attention=attention)
    logged = [r for r in runs if r['log']]
    if len(logged) > 1:  # the first run is the reference the others are compared with
        curves = {label(r): ([e['tokens'] for e in r['log']], [e['val_loss'] for e in r['log']]) for r in logged}
        plot_losses(curves, os.path.join(out, 'val_loss.png'), 'validation loss', compare=True)
    plot_walks({label(r): r['log'] for r in runs}, os.path.join(out, 'walk.png'), 'runs compared')
    rows = [f"| run | operator | iter | final val loss | − {runs[0]['name']} | best val loss | in corridor, −1 < γ < 0 "
            f"| settled, {SETTLED} |", "|---|---|---|---|---|---|---|---|"]
    finals = [r['log'][-1]['val_loss'] if r['log'] else float('nan') for r in runs]
    for r, final in zip(runs, finals):
        best = min((e['val_loss'] for e in r['log']), default=float('nan'))
        occupancy = '– | –' if r['config']['operator'] == 'attention' else \
            f"{reports[r['name']]['occupancy']:.0%} | {reports[r['name']]['inside_claim_b']:.0%}"
        rows.append(f"| {r['name']} | {r['config']['operator']} | {r['iter']} | {final:.4f} | {final - finals[0]:+.4f} "
                    f"| {best:.4f} | {occupancy} |")
    rows.append("\nOne run per variant: a difference means something only against the seed-to-seed spread of the "
                "same setting; train several seeds (python -m lab.sweep) before reading a sign into it.")
    text = '\n'.join(rows)
    with atomic_write(os.path.join(out, 'summary.md')) as f:
        f.write('# Runs compared\n\n' + text + '\n')
    print(text + f"\n-> {out}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('runs', nargs='+', help='run folders written by train.py')
    parser.add_argument('--out', help='where to write (default: RUN/analysis, and ./comparison for several runs)')
    args = parser.parse_args(argv)
    runs = [load_run(path) for path in args.runs]
    if len({r['name'] for r in runs}) < len(runs):
        raise UserError("several runs share a folder name; give runs distinct folder names")
    reports = {}
    for run in runs:
        out = os.path.join(args.out, run['name']) if args.out else os.path.join(run['out_dir'], 'analysis')
        reports[run['name']] = analyze_run(run, out)
    if len(runs) > 1:
        compare_runs(runs, reports, args.out or 'comparison')


if __name__ == '__main__':
    main_guard(lambda: main(sys.argv[1:]))
