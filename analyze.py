"""
Where did the operator go? Reads run folders written by train.py and writes corridor occupancy, γ/δ plots,
run comparisons, and (with --diagnostics) the connection-walk diagnostics of walk.py.

    python analyze.py out-shakespeare-char-corridor              # -> out-shakespeare-char-corridor/analysis/
    python analyze.py out-a out-b out-c --out comparison          # each run, plus the runs compared
    python analyze.py --diagnostics gpt2 out-owt-124m-corridor --text wiki.test.raw   # see walk.py

Per run (RUN/analysis/, or OUT/<run>/): corridor.json, summary.md, occupancy.png, gamma_delta.png,
evolution.png (γ and δ of every head against tokens seen), loss.png. With several runs, OUT (default
./comparison) gets the same plots across runs and a summary.md with final losses.

The corridor is the open interval −1 < γ < 0 (model.in_corridor, as in the training log): a head at γ = 0
counts as "above" (plain scaled attention), one at γ = −1 as "below" (a pure scaled Laplacian).
"""

import argparse
import glob
import json
import math
import os
import statistics
import sys

import matplotlib

matplotlib.use('Agg')  # files only, no display
import matplotlib.pyplot as plt
import torch

from common import UserError, load_checkpoint, main_guard, model_from_checkpoint, tokenizer_from_meta
from model import GPT, gamma_delta, in_corridor
from walk import connection_diagnostics, depth_regimes  # noqa: F401 (analyze.connection_diagnostics is the API)


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
    """A run folder: its name, config, log entries, final (γ, δ) and the snapshot series (iter, γ, δ)."""
    if not os.path.isdir(out_dir):
        raise UserError(f"no run folder {out_dir!r}")
    ckpt = load_checkpoint(os.path.join(out_dir, 'ckpt.pt'))
    snapshots = []
    for path in sorted(glob.glob(os.path.join(out_dir, 'ckpt_*.pt'))):  # zero-padded: sorted is iteration order
        snap = load_checkpoint(path)
        snapshots.append((snap['iter_num'], *gamma_delta(model_from_checkpoint(snap).operator_coefficients())))
    gamma, delta = gamma_delta(model_from_checkpoint(ckpt).operator_coefficients())
    return dict(name=os.path.basename(os.path.normpath(out_dir)), out_dir=out_dir, config=ckpt['config'],
                iter=ckpt['iter_num'], log=read_log(out_dir), gamma=gamma, delta=delta, snapshots=snapshots)


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
    fig.savefig(path, dpi=110)
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
    with open(os.path.join(out, 'corridor.json'), 'w') as f:
        json.dump(report, f, indent=1)
    plot_occupancy({run['name']: report}, os.path.join(out, 'occupancy.png'))
    plot_gamma_delta({run['name']: (run['gamma'], run['delta'])}, os.path.join(out, 'gamma_delta.png'))
    if run['log']:
        plot_evolution(run['log'], os.path.join(out, 'evolution.png'), run['name'])
        plot_losses({'train': ([e['tokens'] for e in run['log']], [e['train_loss'] for e in run['log']]),
                     'val': ([e['tokens'] for e in run['log']], [e['val_loss'] for e in run['log']])},
                    os.path.join(out, 'loss.png'), f"{run['name']}: loss")
    table = layer_table(report)
    header = f"# {run['name']}: operator {report['operator']}, iter {run['iter']}\n\n"
    with open(os.path.join(out, 'summary.md'), 'w') as f:
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
    rows = ["| run | operator | iter | final val loss | best val loss | corridor occupancy |", "|---|---|---|---|---|---|"]
    for r in runs:
        final = r['log'][-1]['val_loss'] if r['log'] else float('nan')
        best = min((e['val_loss'] for e in r['log']), default=float('nan'))
        rows.append(f"| {r['name']} | {r['config']['operator']} | {r['iter']} | {final:.4f} | {best:.4f} "
                    f"| {reports[r['name']]['occupancy']:.0%} |")
    text = '\n'.join(rows)
    with open(os.path.join(out, 'summary.md'), 'w') as f:
        f.write('# Runs compared\n\n' + text + '\n')
    print(text + f"\n-> {out}")


# ---------------------------------------------------------------------------------------------- sweeps

def paired_verdict(differences):
    """'lower' / 'higher' when every seed agrees on the sign and the mean lies beyond 2 standard errors;
    otherwise 'inconclusive' (the difference is inside the seed spread)."""
    n = len(differences)
    mean = statistics.fmean(differences)
    if n < 2:
        return mean, float('nan'), 'inconclusive'
    std = statistics.stdev(differences)
    same_sign = all(d < 0 for d in differences) or all(d > 0 for d in differences)
    if same_sign and abs(mean) > 2 * std / math.sqrt(n):
        return mean, std, 'lower' if mean < 0 else 'higher'
    return mean, std, 'inconclusive'


def plot_sweep_losses(loaded, variants, seeds, path):
    """Validation loss of every variant (mean over seeds) and, beside it, its difference to attention paired by
    seed (mean ± std): the differences are far smaller than the curves' own fall."""
    curves = {v: torch.tensor([[e['val_loss'] for e in loaded[(v, s)]['log']] for s in seeds]) for v in variants}
    tokens = [e['tokens'] / 1e6 for e in loaded[(variants[0], seeds[0])]['log']]
    skip = 1 if len(tokens) > 2 else 0  # the first evaluation (ln vocab) would flatten the rest of the curves
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for i, (v, c) in enumerate(curves.items()):
        axes[0].plot(tokens[skip:], c.mean(0)[skip:].tolist(), marker='.', color=f'C{i}', label=v)
        if 'attention' in curves and v != 'attention':
            diff = c - curves['attention']
            spread = diff.std(0) if len(seeds) > 1 else torch.zeros(len(tokens))
            axes[1].errorbar(tokens[skip:], diff.mean(0)[skip:].tolist(), yerr=spread[skip:].tolist(), marker='.',
                             capsize=2, color=f'C{i}', label=v)
    axes[0].set_title(f'validation loss, mean of {len(seeds)} seeds', fontsize=10)
    axes[0].set_ylabel('loss (nats per token)')
    axes[1].axhline(0, color='black', lw=0.8)
    axes[1].set_title('difference to attention, paired by seed (mean ± std)', fontsize=10)
    axes[1].set_ylabel('Δ loss (nats per token)')
    for ax in axes:
        ax.set_xlabel('tokens seen (millions)')
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8, loc='upper left', bbox_to_anchor=(1.01, 1))
    return save(fig, path)


def compare_sweep(runs, out_root):
    """runs: {(variant, seed): out_dir}. Writes OUT_ROOT/report.md, report.json and plots."""
    loaded = {key: load_run(out_dir) for key, out_dir in runs.items()}
    variants = list(dict.fromkeys(v for v, _ in runs))
    seeds = sorted({s for _, s in runs})
    final = {key: run['log'][-1]['val_loss'] for key, run in loaded.items()}
    report = dict(variants={}, claims={})
    for variant in variants:
        values = [final[(variant, s)] for s in seeds]
        occupancy = [occupancy_report(loaded[(variant, s)]['gamma'], loaded[(variant, s)]['delta']) for s in seeds]
        entry = dict(val_loss=values, mean=statistics.fmean(values),
                     std=statistics.stdev(values) if len(values) > 1 else float('nan'),
                     occupancy=statistics.fmean(o['occupancy'] for o in occupancy),
                     occupancy_by_layer=[statistics.fmean(o['layers'][i]['occupancy'] for o in occupancy)
                                         for i in range(len(occupancy[0]['layers']))])
        if 'attention' in variants and variant != 'attention':
            entry['vs_attention'] = paired_verdict([final[(variant, s)] - final[('attention', s)] for s in seeds])
        report['variants'][variant] = entry

    def claim(a, b):  # val(a) − val(b), paired by seed
        if a in variants and b in variants:
            return paired_verdict([final[(a, s)] - final[(b, s)] for s in seeds])
        return None
    corridor = report['variants'].get('corridor')
    report['claims'] = {
        'a: learnable δ(γI+P) lowers val loss vs attention': claim('corridor', 'attention'),
        'b: most heads beyond the first layer land in −1 < γ < 0': None if corridor is None else
            statistics.fmean(occupancy_report(loaded[('corridor', s)]['gamma'][1:],
                                              loaded[('corridor', s)]['delta'][1:])['occupancy'] for s in seeds),
        'c: γ ≥ 0 raises val loss vs learnable γ': claim('gamma_nonneg', 'corridor'),
        'd: fixed γ = −0.5, δ = 1 beats attention': claim('fixed_gamma', 'attention'),
    }
    with open(os.path.join(out_root, 'report.json'), 'w') as f:
        json.dump(report, f, indent=1)

    n_layer = len(next(iter(report['variants'].values()))['occupancy_by_layer'])
    lines = [f"# Sweep: {len(variants)} variants × {len(seeds)} seeds ({out_root})", '',
             f"Final validation loss (nats/char) after {loaded[next(iter(loaded))]['iter']} iterations; difference to "
             "attention paired by seed (mean ± std over seeds); verdict 'lower'/'higher' only when every seed "
             "agrees and the mean lies beyond 2 standard errors, else 'inconclusive'.", '',
             "| variant | val loss mean ± std | − attention | verdict | occupancy | " +
             ' | '.join(f'L{i}' for i in range(n_layer)) + ' |',
             '|---|---|---|---|---|' + '---|' * n_layer]
    for variant, e in report['variants'].items():
        diff = e.get('vs_attention')
        diff_text = f"{diff[0]:+.4f} ± {diff[1]:.4f} | {diff[2]}" if diff else '– | –'
        lines.append(f"| {variant} | {e['mean']:.4f} ± {e['std']:.4f} | {diff_text} | {e['occupancy']:.0%} | " +
                     ' | '.join(f'{x:.0%}' for x in e['occupancy_by_layer']) + ' |')
    lines += ['', '## The paper\'s claims at this scale', '']
    for name, value in report['claims'].items():
        if value is None:
            lines.append(f"- {name}: not measured (variant missing)")
        elif isinstance(value, float):
            lines.append(f"- {name}: {value:.0%} of the corridor runs' heads in layers ≥ 1")
        else:
            lines.append(f"- {name}: difference {value[0]:+.4f} ± {value[1]:.4f} → {value[2]}")
    text = '\n'.join(lines)
    with open(os.path.join(out_root, 'report.md'), 'w') as f:
        f.write(text + '\n')

    plot_sweep_losses(loaded, variants, seeds, os.path.join(out_root, 'val_loss.png'))
    learnable = [v for v in variants if loaded[(v, seeds[0])]['config']['operator'] != 'attention']
    plot_occupancy({v: dict(layers=[dict(layer=i, occupancy=x) for i, x in enumerate(report['variants'][v]['occupancy_by_layer'])])
                    for v in learnable}, os.path.join(out_root, 'occupancy.png'))
    if 'corridor' in variants:
        run = loaded[('corridor', seeds[0])]
        plot_evolution(run['log'], os.path.join(out_root, 'gamma_evolution.png'), f"corridor, seed {seeds[0]}")
        plot_gamma_delta({f'corridor, {len(seeds)} seeds': (torch.cat([loaded[('corridor', s)]['gamma'] for s in seeds], 1),
                                                             torch.cat([loaded[('corridor', s)]['delta'] for s in seeds], 1))},
                         os.path.join(out_root, 'gamma_delta.png'))
    print(text + f"\n-> {out_root}/report.md")
    return report


# ---------------------------------------------------------------------------------------------- connection walk

GPT2_NAMES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')


def source_kind(source):
    """'run' (a folder with ckpt.pt) or 'gpt2' (a GPT-2 name or a local transformers GPT-2 folder)."""
    if os.path.isfile(os.path.join(source, 'ckpt.pt')):
        return 'run'
    if source in GPT2_NAMES or os.path.isfile(os.path.join(source, 'config.json')):
        return 'gpt2'
    raise UserError(f"{source!r} is neither a run folder with ckpt.pt nor a GPT-2 model ({', '.join(GPT2_NAMES)})")


def load_source(source):
    """(name, model, encode) for a run folder, a GPT-2 name, or a local transformers GPT-2 folder."""
    name = os.path.basename(os.path.normpath(source))
    if source_kind(source) == 'run':
        ckpt = load_checkpoint(os.path.join(source, 'ckpt.pt'))
        return name, model_from_checkpoint(ckpt), tokenizer_from_meta(ckpt['meta'])[0]
    try:
        model = GPT.from_pretrained(source)
    except RuntimeError as e:
        raise UserError(str(e)) from None
    return name, model, tokenizer_from_meta({'tokenizer': 'gpt2'})[0]


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
    out = args.out or 'diagnostics'
    os.makedirs(out, exist_ok=True)
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    for source in args.runs:
        source_kind(source)  # fail on a bad name before any slow loading
    text = read_text(args.text)
    results, sweeps, saved = {}, {}, dict(settings=dict(n_seqs=args.n_seqs, seq_len=args.seq_len,
                                                        drop_sink=args.drop_sink, text=args.text or 'wikitext-2 test'))
    for source in args.runs:
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


# ---------------------------------------------------------------------------------------------- command line

def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('runs', nargs='+', help='run folders (with --diagnostics: also GPT-2 names like gpt2)')
    parser.add_argument('--out', help='where to write (default: RUN/analysis, and ./comparison for several runs; '
                                      'with --diagnostics ./diagnostics)')
    walk = parser.add_argument_group('connection-walk diagnostics (walk.py)')
    walk.add_argument('--diagnostics', action='store_true', help='compute them for each run or GPT-2 model')
    walk.add_argument('--text', help='text file to walk over (default: WikiText-2 test through datasets)')
    walk.add_argument('--n_seqs', type=int, default=1024, help='sequences (default 1024, as the paper)')
    walk.add_argument('--seq_len', type=int, default=64, help='tokens per sequence (default 64, as the paper)')
    walk.add_argument('--drop_sink', action='store_true', help='leave out the edges to the first token')
    walk.add_argument('--layer', type=int, help='layer of the A_eff and Gram heatmaps (default: the middle one)')
    walk.add_argument('--context_sweep', action='store_true', help='also at context lengths 16 ... 1024')
    walk.add_argument('--device', help='default: cuda when available, else cpu')
    args = parser.parse_args(argv)
    if args.diagnostics:
        return run_diagnostics(args)
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
