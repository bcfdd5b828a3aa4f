"""
Where did the operator go? Reads run folders written by train.py and writes corridor occupancy, γ/δ plots
and run comparisons. (The sweep's statistics live in sweep.py, the connection-walk diagnostics in walk.py;
`analyze.py --diagnostics ...` is kept as another name for `walk.py ...`.)

    python analyze.py out-shakespeare-char-corridor              # -> out-shakespeare-char-corridor/analysis/
    python analyze.py out-a out-b out-c --out comparison          # each run, plus the runs compared

Per run (RUN/analysis/, or OUT/<run>/): corridor.json, summary.md, occupancy.png, gamma_delta.png,
evolution.png (γ and δ of every head against tokens seen), loss.png, and for a run trained with walk_interval
walk.png (the connection-walk geometry of every layer against tokens seen, γ beside it). With several runs, OUT
(default ./comparison) gets the same plots across runs and a summary.md with final losses.

The corridor is the open interval −1 < γ < 0 (model.in_corridor, as in the training log): a head at γ = 0
counts as "above" (plain scaled attention), one at γ = −1 as "below" (a pure scaled Laplacian).
"""

import argparse
import glob
import json
import os
import sys

import matplotlib

matplotlib.use('Agg')  # files only, no display
import matplotlib.pyplot as plt
import torch

from common import UserError, atomic_write, load_checkpoint, main_guard, model_from_checkpoint
from model import gamma_delta, in_corridor


# ---------------------------------------------------------------------------------------------- reading runs

def read_log(out_dir):
    path = os.path.join(out_dir, 'log.jsonl')
    if not os.path.isfile(path):
        return []
    entries = []
    with open(path) as f:
        for line in f:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line torn by a crash
    return entries


def load_run(out_dir):
    """A run folder: its name, config, log entries, final (γ, δ), the snapshot series (iter, γ, δ) and the
    model's parameter count (non-embedding)."""
    if not os.path.isdir(out_dir):
        raise UserError(f"no run folder {out_dir!r}")
    ckpt = load_checkpoint(os.path.join(out_dir, 'ckpt.pt'))
    snapshots = []
    for path in sorted(glob.glob(os.path.join(out_dir, 'ckpt_*.pt'))):  # zero-padded: sorted is iteration order
        snap = load_checkpoint(path)
        snapshots.append((snap['iter_num'], *gamma_delta(model_from_checkpoint(snap).operator_coefficients())))
    model = model_from_checkpoint(ckpt)
    gamma, delta = gamma_delta(model.operator_coefficients())
    return dict(name=os.path.basename(os.path.normpath(out_dir)), out_dir=out_dir, config=ckpt['config'],
                iter=ckpt['iter_num'], log=read_log(out_dir), gamma=gamma, delta=delta, snapshots=snapshots,
                params=model.get_num_params())


# ---------------------------------------------------------------------------------------------- occupancy

def occupancy_report(gamma, delta):
    """corridor.json's content for [n_layer, n_head] tensors of γ and δ."""
    layers = []
    for layer, (g, d) in enumerate(zip(gamma, delta)):
        layers.append(dict(layer=layer, gamma=g.tolist(), delta=d.tolist(),
                           occupancy=in_corridor(g).float().mean().item(),
                           below=int((g <= -1).sum()), above=int((g >= 0).sum()),
                           # torch's median: the lower middle value for an even number of heads
                           gamma_mean=g.mean().item(), gamma_median=g.median().item(), delta_mean=d.mean().item()))
    return dict(layers=layers, occupancy=in_corridor(gamma).float().mean().item(),
                occupancy_beyond_first=in_corridor(gamma[1:]).float().mean().item() if len(gamma) > 1 else None)


def layer_table(report):
    rows = ["| layer | in corridor | γ ≤ −1 | γ ≥ 0 | γ mean | γ median | δ mean |", "|---|---|---|---|---|---|---|"]
    for r in report['layers']:
        rows.append(f"| {r['layer']} | {r['occupancy']:.0%} | {r['below']} | {r['above']} | {r['gamma_mean']:+.3f} "
                    f"| {r['gamma_median']:+.3f} | {r['delta_mean']:.3f} |")
    beyond = report['occupancy_beyond_first']
    rows.append(f"\nall heads: {report['occupancy']:.0%} in the corridor"
                + (f"; layers after the first: {beyond:.0%}" if beyond is not None else ''))
    return '\n'.join(rows)


# ---------------------------------------------------------------------------------------------- plots

def save(fig, path):
    fig.tight_layout()
    try:
        with atomic_write(path, 'wb') as f:  # the format from the real name, not from path.tmp
            fig.savefig(f, dpi=110, format=os.path.splitext(path)[1][1:] or 'png')
    finally:
        plt.close(fig)
    return path


def plot_occupancy(reports, path):
    """reports: {label: occupancy report}: grouped bars, one group per layer."""
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(next(iter(reports.values()))['layers'])) + 1.6, 3.6))
    width = 0.8 / len(reports)
    for k, (label, report) in enumerate(reports.items()):
        layers = [r['layer'] for r in report['layers']]
        ax.bar([x + (k - (len(reports) - 1) / 2) * width for x in layers], [r['occupancy'] for r in report['layers']],
               width, label=label)
    ax.set_ylim(0, 1.05)
    ax.set_xticks(layers)
    ax.set_xlabel('layer')
    ax.set_ylabel('fraction of heads with −1 < γ < 0')
    ax.set_title('Corridor occupancy by layer')
    ax.legend(fontsize=8, loc='upper left', bbox_to_anchor=(1.01, 1))
    return save(fig, path)


def plot_gamma_delta(runs, path):
    """runs: {label: (γ, δ)}: every head in the (γ, δ) plane, the corridor shaded, coloured by layer."""
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.8), squeeze=False)
    for ax, (label, (gamma, delta)) in zip(axes[0], runs.items()):
        ax.axvspan(-1, 0, color='tab:green', alpha=0.12, label='corridor −1 < γ < 0')
        colors = plt.cm.viridis([i / max(1, len(gamma) - 1) for i in range(len(gamma))])
        for layer, (g, d) in enumerate(zip(gamma, delta)):
            ax.scatter(g.tolist(), d.tolist(), color=colors[layer], s=22, label=f'layer {layer}')
        lo, hi = min(-1.1, gamma.min().item() - 0.1), max(0.3, gamma.max().item() + 0.1)
        ax.set_xlim(lo, hi)
        ax.set_xlabel('γ = c_I / c_P')
        ax.set_ylabel('δ = c_P')
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=7, loc='best')
    fig.suptitle('Every head in the (γ, δ) plane', fontsize=11)
    return save(fig, path)


def plot_evolution(log, path, title):
    """γ (top) and δ (bottom) of every head against tokens seen, one column per layer."""
    tokens = [e['tokens'] / 1e6 for e in log]
    gamma = torch.tensor([e['gamma'] for e in log])  # [evals, layers, heads]
    delta = torch.tensor([e['delta'] for e in log])
    n_layer = gamma.shape[1]
    fig, axes = plt.subplots(2, n_layer, figsize=(3.2 * n_layer, 5.4), sharex=True, squeeze=False)
    for layer in range(n_layer):
        top, bottom = axes[0][layer], axes[1][layer]
        top.axhspan(-1, 0, color='tab:green', alpha=0.12)
        for head in range(gamma.shape[2]):
            top.plot(tokens, gamma[:, layer, head].tolist(), lw=1.2)
            bottom.plot(tokens, delta[:, layer, head].tolist(), lw=1.2)
        top.set_title(f'layer {layer}', fontsize=10)
        bottom.set_xlabel('tokens seen (millions)')
    axes[0][0].set_ylabel('γ (shaded: the corridor)')
    axes[1][0].set_ylabel('δ')
    fig.suptitle(f'{title}: γ and δ of every head (one line per head)', fontsize=11)
    return save(fig, path)


def plot_losses(curves, path, title):
    """curves: {label: (tokens, losses)} overlaid."""
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for label, (tokens, losses) in curves.items():
        ax.plot([t / 1e6 for t in tokens], losses, marker='.', label=label)
    ax.set_xlabel('tokens seen (millions)')
    ax.set_ylabel('loss (nats per token)')
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save(fig, path)


# ------------------------------------------------------------------------------------ walk geometry over training

# what plot_walk_evolution draws from the log's 'walk' entries (train.py's walk_interval): key, axis title
WALK_PANELS = (('drift', 'drift to the next layer'), ('delta_orth', 'δ_orth'), ('a_eff_fro', '‖A_eff‖_F'),
               ('gram_ratio', 'Ḡ diagonal / off-diagonal (mean abs)'))


def walk_series(log, part, key):
    """(tokens [E], values [E, layers]) of one logged walk diagnostic over the evaluations that have it;
    gram_ratio is Ḡ's mean |diagonal| over its mean |off-diagonal|. None when the log has none."""
    entries = [e for e in log if part in e.get('walk', {})]
    if not entries:
        return None
    if key == 'gram_ratio':
        values = [[a / b for a, b in zip(e['walk'][part]['gram_diag_mean'], e['walk'][part]['gram_offdiag_mean'])]
                  for e in entries]
    else:
        values = [e['walk'][part][key] for e in entries]
    return torch.tensor([e['tokens'] for e in entries], dtype=torch.float64), torch.tensor(values, dtype=torch.float64)


def plot_walk_evolution(groups, path, title):
    """groups: {label: [log, ...]} (e.g. a variant's seeds). Every walk diagnostic against tokens seen, one column
    per layer, the mean γ of the layer's heads in the last row; one colour per group, one thin line per log;
    the attention part solid, the full operator c_I·I + c_P·P dashed."""
    n_layer = len(next(iter(groups.values()))[0][-1]['gamma'])
    rows = len(WALK_PANELS) + 1
    fig, axes = plt.subplots(rows, n_layer, figsize=(3.1 * n_layer, 2.2 * rows), sharex=True, squeeze=False)
    for color, (label, logs) in enumerate(groups.items()):
        for k, log in enumerate(logs):
            for row, (key, name) in enumerate(WALK_PANELS):
                for part, style in (('attention', '-'), ('operator', '--')):
                    series = walk_series(log, part, key)
                    if series is None:
                        continue
                    tokens, values = series
                    for layer in range(values.shape[1]):
                        axes[row][layer].plot((tokens / 1e6).tolist(), values[:, layer].tolist(), style, lw=1,
                                              color=f'C{color}', alpha=0.8,
                                              label=f'{label}{"" if part == "attention" else " (operator)"}'
                                              if k == 0 and layer == 0 else None)
                axes[row][0].set_ylabel(name, fontsize=8)
            gamma = torch.tensor([e['gamma'] for e in log]).mean(-1)  # [evals, layers]
            for layer in range(n_layer):
                axes[-1][layer].plot([e['tokens'] / 1e6 for e in log], gamma[:, layer].tolist(), lw=1,
                                     color=f'C{color}', alpha=0.8)
    axes[-1][0].set_ylabel('mean γ of the layer', fontsize=8)
    for layer in range(n_layer):
        axes[0][layer].set_title(f'layer {layer}', fontsize=9)
        axes[-1][layer].set_xlabel('tokens seen (millions)')
        axes[-1][layer].axhline(0, color='black', lw=0.6)
    axes[0][-1].text(0.5, 0.5, 'the last layer\nhas no next layer', ha='center', va='center', fontsize=8,
                     transform=axes[0][-1].transAxes)
    axes[0][-1].set_yticks([])
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f'{title}: connection-walk geometry during training (solid: attention part, dashed: full operator)',
                 fontsize=10)
    return save(fig, path)


# ---------------------------------------------------------------------------------------------- one or more runs

def analyze_run(run, out):
    """Write one run's corridor.json, summary.md and plots into out; returns its occupancy report."""
    os.makedirs(out, exist_ok=True)
    report = dict(run=run['name'], iter=run['iter'], operator=run['config']['operator'],
                  **occupancy_report(run['gamma'], run['delta']))
    if run['snapshots']:
        report['snapshots'] = [dict(iter=it, occupancy=in_corridor(g).float().mean().item(),
                                    occupancy_by_layer=in_corridor(g).float().mean(-1).tolist())
                               for it, g, _ in run['snapshots']]
    with atomic_write(os.path.join(out, 'corridor.json')) as f:
        json.dump(report, f, indent=1)
    plot_occupancy({run['name']: report}, os.path.join(out, 'occupancy.png'))
    plot_gamma_delta({run['name']: (run['gamma'], run['delta'])}, os.path.join(out, 'gamma_delta.png'))
    if run['log']:
        plot_evolution(run['log'], os.path.join(out, 'evolution.png'), run['name'])
        plot_losses({'train': ([e['tokens'] for e in run['log']], [e['train_loss'] for e in run['log']]),
                     'val': ([e['tokens'] for e in run['log']], [e['val_loss'] for e in run['log']])},
                    os.path.join(out, 'loss.png'), f"{run['name']}: loss")
        if any('walk' in e for e in run['log']):
            plot_walk_evolution({run['name']: [run['log']]}, os.path.join(out, 'walk.png'), run['name'])
    table = layer_table(report)
    header = f"# {run['name']}: operator {report['operator']}, iter {run['iter']}\n\n"
    with atomic_write(os.path.join(out, 'summary.md')) as f:
        f.write(header + table + '\n')
    print(header + table + f"\n-> {out}\n")
    return report


def compare_runs(runs, reports, out):
    """Several runs: plots across runs and a summary of final losses."""
    os.makedirs(out, exist_ok=True)
    plot_occupancy({r['name']: reports[r['name']] for r in runs}, os.path.join(out, 'occupancy.png'))
    plot_gamma_delta({r['name']: (r['gamma'], r['delta']) for r in runs}, os.path.join(out, 'gamma_delta.png'))
    plot_losses({r['name']: ([e['tokens'] for e in r['log']], [e['val_loss'] for e in r['log']]) for r in runs if r['log']},
                os.path.join(out, 'val_loss.png'), 'validation loss')
    walked = {r['name']: [r['log']] for r in runs if any('walk' in e for e in r['log'])}
    if walked:
        plot_walk_evolution(walked, os.path.join(out, 'walk.png'), 'runs compared')
    rows = ["| run | operator | iter | final val loss | best val loss | corridor occupancy |", "|---|---|---|---|---|---|"]
    for r in runs:
        final = r['log'][-1]['val_loss'] if r['log'] else float('nan')
        best = min((e['val_loss'] for e in r['log']), default=float('nan'))
        rows.append(f"| {r['name']} | {r['config']['operator']} | {r['iter']} | {final:.4f} | {best:.4f} "
                    f"| {reports[r['name']]['occupancy']:.0%} |")
    text = '\n'.join(rows)
    with atomic_write(os.path.join(out, 'summary.md')) as f:
        f.write('# Runs compared\n\n' + text + '\n')
    print(text + f"\n-> {out}")


# ---------------------------------------------------------------------------------------------- command line

def main(argv):
    if '--diagnostics' in argv:  # the connection-walk diagnostics' own command line, under their old name
        import walk
        return walk.main([a for a in argv if a != '--diagnostics'])
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
