"""
A study's report: every finished run loaded, per setting a table of each variant's final loss against attention
(paired by seed) and its figures, then the study's own figures and claim lines (its function in
lab/study_figures.py, handed in by lab/sweep.py), all tests of one report Holm-corrected within their families
(lab/stats.py). `python -m lab.sweep --study=NAME --report_only=True` regenerates a report from its runs.
"""

import csv
import json
import os
import statistics

import torch

from analyze import occupancy_report, plot_evolution, plot_gamma_delta, plot_occupancy
from common import UserError, atomic_write
from model import CLAIM_B, in_corridor
from sources import load_run

from lab.figures import plt, save
from lab.stats import Tests, ci_half_width, paired_test
from lab.studies import millions, non_embedding_params, run_state


def family(study, a, b):
    """The Holm family of the loss test a − b in a study: the same comparison across the study's settings (corpora,
    sizes), except the fixed-γ grid, which is one family (picking the best of seven γ is part of claim (d))."""
    if study.startswith('fixed_gamma') and a.startswith('fixed_gamma'):
        return 'every fixed γ − attention, every setting'
    return f'{a} − {b}, every setting'


def paired_differences(loaded, a, b):
    """val(a) − val(b) at the final evaluation, over the seeds both finished, in seed order."""
    seeds = sorted(s for v, s in loaded if v == a and (b, s) in loaded)
    return [loaded[(a, s)]['log'][-1]['val_loss'] - loaded[(b, s)]['log'][-1]['val_loss'] for s in seeds]


def summarize(loaded, variants):
    """Per variant of one setting: final val losses by seed, their mean/SD, the paired differences to attention,
    corridor occupancy (all heads, by layer, layers after the first) and mean γ, δ."""
    summary = {}
    for variant in variants:
        seeds = sorted(s for v, s in loaded if v == variant)
        if not seeds:
            continue
        values = [loaded[(variant, s)]['log'][-1]['val_loss'] for s in seeds]
        occupancy = [occupancy_report(loaded[(variant, s)]['gamma'], loaded[(variant, s)]['delta']) for s in seeds]
        n_layer = len(occupancy[0]['layers'])
        first = loaded[(variant, seeds[0])]
        entry = dict(seeds=seeds, val_loss=values, mean=statistics.fmean(values),
                     std=statistics.stdev(values) if len(values) > 1 else float('nan'),
                     occupancy=statistics.fmean(o['occupancy'] for o in occupancy),
                     occupancy_by_layer=[statistics.fmean(o['layers'][i]['occupancy'] for o in occupancy)
                                         for i in range(n_layer)],
                     occupancy_beyond_first=statistics.fmean(o['occupancy_beyond_first'] or 0 for o in occupancy),
                     inside_claim_b_by_layer=[statistics.fmean(o['layers'][i]['inside_claim_b'] for o in occupancy)
                                              for i in range(n_layer)],
                     gamma_mean=statistics.fmean(loaded[(variant, s)]['gamma'].mean().item() for s in seeds),
                     delta_mean=statistics.fmean(loaded[(variant, s)]['delta'].mean().item() for s in seeds),
                     params=first['params'], non_embedding_params=first.get('non_embedding') or
                     non_embedding_params(first['config']),
                     tokens=first['log'][-1]['tokens'], operator_scalars=first['config']['operator'] != 'attention')
        if variant != 'attention':
            entry['vs_attention_differences'] = paired_differences(loaded, variant, 'attention')
            entry['vs_attention'] = paired_test(entry['vs_attention_differences'])._asdict()
        summary[variant] = entry
    return summary


def table(setting, summary, tests, study, versus=True):
    """The markdown table of one setting's variants; versus: with the column against attention (False where the
    setting trains no attention: the pretrained study compares in its own claims table instead)."""
    n_layer = max(len(e['occupancy_by_layer']) for e in summary.values())
    rows = ["| variant | seeds | val loss mean ± SD | "
            + ("− attention, paired: mean [95 % CI], p, Holm p, MDE: verdict | " if versus else '')
            + "mean γ, δ | in corridor | " + ' | '.join(f'L{i}' for i in range(n_layer)) + ' |',
            '|---|---|---|' + '---|' * versus + '---|---|' + '---|' * n_layer]
    for variant, e in summary.items():
        cells = [variant, str(len(e['seeds'])), f"{e['mean']:.4f} ± {e['std']:.4f}"]
        if versus:
            cells.append(tests.add(family(study, variant, 'attention'), f'{setting}: {variant} − attention',
                                   e['vs_attention_differences']) if variant != 'attention' else '–')
        if e['operator_scalars']:
            cells += [f"{e['gamma_mean']:+.3f}, {e['delta_mean']:.3f}", f"{e['occupancy']:.0%}",
                      *(f'{x:.0%}' for x in e['occupancy_by_layer'])]
        else:
            cells += ['0, 1'] + ['–'] * (n_layer + 1)
        rows.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(rows)


# ------------------------------------------------------------------------------------------------ figures

def plot_sweep_losses(loaded, variants, path, title):
    """Validation loss of every variant (mean over its seeds) and, where the setting has attention runs, each
    variant's difference to attention paired by seed (mean and its 95 % CI): the differences are far smaller than
    the curves' own fall. A study without attention (the pretrained one) gets the left panel alone."""
    attention_seeds = sorted({s for v, s in loaded if v == 'attention'})
    fig, axes = plt.subplots(1, 2 if attention_seeds else 1, figsize=(12 if attention_seeds else 7, 4), squeeze=False)
    axes = axes[0]
    for i, v in enumerate(variants):
        seeds = sorted(s for u, s in loaded if u == v)
        if not seeds:
            continue
        curves = torch.tensor([[e['val_loss'] for e in loaded[(v, s)]['log']] for s in seeds], dtype=torch.float64)
        tokens = [e['tokens'] / 1e6 for e in loaded[(v, seeds[0])]['log']]
        skip = 1 if len(tokens) > 2 else 0  # the first evaluation (ln vocab) would flatten the rest of the curves
        axes[0].plot(tokens[skip:], curves.mean(0)[skip:].tolist(), marker='.', color=f'C{i % 10}',
                     label=f'{v} ({len(seeds)} seed{"s" if len(seeds) > 1 else ""})')
        common = [s for s in seeds if s in attention_seeds]
        if v != 'attention' and common:
            diff = torch.tensor([[e['val_loss'] - r['val_loss'] for e, r in zip(loaded[(v, s)]['log'],
                                                                                loaded[('attention', s)]['log'])]
                                 for s in common], dtype=torch.float64)
            ci = [ci_half_width(diff[:, j].tolist()) for j in range(diff.shape[1])]
            axes[1].errorbar(tokens[skip:diff.shape[1]], diff.mean(0)[skip:].tolist(), yerr=ci[skip:], marker='.',
                             capsize=2, color=f'C{i % 10}', label=v)
    axes[0].set_title(f'{title}: validation loss, mean over seeds', fontsize=10)
    axes[0].set_ylabel('loss (nats per token)')
    axes[0].legend(fontsize=7)
    if attention_seeds:
        axes[1].axhline(0, color='black', lw=0.8)
        axes[1].set_title('difference to attention, paired by seed (mean, 95 % CI)', fontsize=10)
        axes[1].set_ylabel('Δ loss (nats per token)')
        axes[1].legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))
    for ax in axes:
        ax.set_xlabel('tokens seen (millions)')
    return save(fig, path)


def setting_figures(setting, loaded, summary, out):
    """Every setting's own figures: losses, occupancy by layer, γ of every head of the corridor (seed 0)."""
    folder = out if setting == 'sweep' else os.path.join(out, setting.replace('/', '_'))
    os.makedirs(folder, exist_ok=True)
    variants = list(summary)
    plot_sweep_losses(loaded, variants, os.path.join(folder, 'val_loss.png'), setting)
    learnable = {v: dict(layers=[dict(layer=i, occupancy=x, inside_claim_b=y) for i, (x, y) in
                                 enumerate(zip(e['occupancy_by_layer'], e['inside_claim_b_by_layer']))])
                 for v, e in summary.items() if e['operator_scalars']}
    attention = [v for v, e in summary.items() if not e['operator_scalars']]  # named in the figures, as analyze.py's
    if learnable:
        plot_occupancy(learnable, os.path.join(folder, 'occupancy.png'), attention=attention)
    for v in variants:
        if v.startswith('corridor') and loaded[(v, summary[v]['seeds'][0])]['log']:
            seed = summary[v]['seeds'][0]
            plot_evolution(loaded[(v, seed)]['log'], os.path.join(folder, f'gamma_{v}.png'), f"{setting}, {v}, seed {seed}")
    if 'corridor' in summary:  # every head of every seed's corridor run in the (γ, δ) plane
        seeds = summary['corridor']['seeds']
        plot_gamma_delta({f'corridor, {len(seeds)} seeds': tuple(torch.cat([loaded[('corridor', s)][k] for s in seeds], 1)
                                                                for k in ('gamma', 'delta'))},
                         os.path.join(folder, 'gamma_delta.png'), attention=attention)


# ------------------------------------------------------------------------------------------------ reports

STATISTICS = ("Final validation loss (nats per token). Every difference is paired by seed and reported as: mean "
              "[95 % CI], p of a two-sided paired t-test, that p Holm-adjusted within its family (families below), "
              "and MDE, the smallest true difference the test detects with 80 % power at 5 % two-sided given the "
              "observed SD and seeds (the exact noncentral t). Verdict 'lower' / 'higher' when the adjusted p is "
              "below 0.05; otherwise 'inconclusive, no effect larger than X', X the CI's bound farthest from zero. "
              "A family is one comparison across the study's settings (the fixed-γ grid: every γ and setting "
              "together; the geometry: one per variant and part over every diagnostic, regime and setting).")


PER_SEED_FIELDS = ('setting', 'variant', 'seed', 'iter', 'tokens', 'val_loss', 'gamma_mean', 'delta_mean', 'seconds',
                   'gamma_change_last_quarter', 'val_loss_at_start', 'val_loss_previous_eval')


def last_quarter_change(series):
    """How far the mean γ over every head still moved at the end of a run: its value at the last evaluation minus
    at the evaluation three quarters of the way. series: the run's (iter, γ, δ) per evaluation."""
    means = [gamma.mean().item() for _, gamma, _ in series]
    return means[-1] - means[int(0.75 * (len(means) - 1))]


def last_quarter_range(gamma):
    """How far γ still moves at the end: over the evaluations of the last quarter, the largest range of one head's γ
    (the head that moves most). gamma: [evaluations, layers, heads]."""
    tail = gamma[int(0.75 * (len(gamma) - 1)):]
    return (tail.max(0).values - tail.min(0).values).max().item()


PER_LAYER_FIELDS = ('setting', 'variant', 'seed', 'layer', 'gamma_mean', 'gamma_min', 'gamma_max', 'in_corridor',
                    'inside_claim_b', 'gamma_range_last_quarter', 'heads', 'above_zero', 'at_zero')


def per_layer_rows(results):
    """One row per layer of each finished run with operator scalars: where its heads' γ end (mean, min, max), the
    share of them in the corridor −1 < γ < 0 and strictly inside, −1 < γ < CLAIM_B (claim (b)'s reading), the
    largest range of one head's γ over the last quarter's evaluations, and the layer's heads with how many end above
    0 and at exactly 0 (held there by γ ≥ 0). The per-layer cells of claim (b) (docs/per_seed/)."""
    rows = []
    for setting, (loaded, summary) in results.items():
        for (variant, seed), run in sorted(loaded.items(), key=lambda item: (item[0][1], item[0][0])):
            if not summary[variant]['operator_scalars']:
                continue
            series = torch.stack([gamma for _, gamma, _ in run['series']]) if run['series'] else run['gamma'][None]
            for layer, gamma in enumerate(run['gamma']):
                rows.append(dict(setting=setting, variant=variant, seed=seed, layer=layer,
                                 **{k: f"{x:.6f}" for k, x in (
                                     ('gamma_mean', gamma.mean().item()), ('gamma_min', gamma.min().item()),
                                     ('gamma_max', gamma.max().item()),
                                     ('in_corridor', in_corridor(gamma).float().mean().item()),
                                     ('inside_claim_b', in_corridor(gamma, CLAIM_B).float().mean().item()),
                                     ('gamma_range_last_quarter', last_quarter_range(series[:, layer:layer + 1])))},
                                 heads=gamma.numel(), above_zero=int((gamma > 0).sum()), at_zero=int((gamma == 0).sum())))
    return rows


def per_seed_rows(results):
    """One row per finished run: its final validation loss (repr: the exact float), final mean γ, δ over every head,
    how far that mean γ moved over the last quarter of the run, the validation loss at iteration 0 (a pretrained
    model's own loss, before the operator trains: the pretrained study's 'frozen' cells) and at the evaluation before
    the last (whether it still falls at the end: no overfitting). The file a reader checks any cell against without
    the run folders (docs/per_seed/)."""
    rows = []
    for setting, (loaded, _) in results.items():
        for (variant, seed), run in sorted(loaded.items(), key=lambda item: (item[0][1], item[0][0])):
            rows.append(dict(setting=setting, variant=variant, seed=seed, iter=run['iter'],
                             tokens=run['log'][-1]['tokens'], val_loss=repr(run['log'][-1]['val_loss']),
                             gamma_mean=f"{run['gamma'].mean().item():.6f}",
                             delta_mean=f"{run['delta'].mean().item():.6f}",
                             seconds=f"{run['seconds']:.1f}" if run.get('seconds') else '',
                             gamma_change_last_quarter=f"{last_quarter_change(run['series']):+.6f}"
                             if len(run['series']) > 1 else '',
                             val_loss_at_start=repr(run['log'][0]['val_loss']) if run['log'][0]['iter'] == 0 else '',
                             val_loss_previous_eval=repr(run['log'][-2]['val_loss']) if len(run['log']) > 1 else ''))
    return rows


CURVE_FIELDS = ('setting', 'variant', 'seed', 'iter', 'tokens', 'val_loss', 'train_loss')


def per_eval_rows(results):
    """One row per finished run and evaluation: its iteration, tokens seen and the validation and training losses
    there (repr: exact), in iteration order (an evaluation a resumed run logged twice: its last entry).
    The learning curves a reader fits without the run folders (docs/per_seed/NAME_curves.csv)."""
    rows = []
    for setting, (loaded, _) in results.items():
        for (variant, seed), run in sorted(loaded.items(), key=lambda item: (item[0][1], item[0][0])):
            evaluations = {e['iter']: e for e in run['log'] if 'val_loss' in e}
            rows += [dict(setting=setting, variant=variant, seed=seed, iter=e['iter'], tokens=e['tokens'],
                          val_loss=repr(e['val_loss']), train_loss=repr(e['train_loss']))
                     for _, e in sorted(evaluations.items())]
    return rows


def report(name, study, runs, out, figures, without_runs=False):
    """Load every finished run, write OUT/report.md, report.json, per_seed.csv, per_seed_layers.csv and
    per_seed_curves.csv (each run's numbers, per_seed_rows, per_layer_rows and per_eval_rows), the figures every
    study shares and the study's own (figures: its function in lab/study_figures.py); print the report.
    without_runs: a report even before any run finished (the pretrained study's frozen curve is an evaluation)."""
    os.makedirs(out, exist_ok=True)
    results, skipped, planned = {}, [], {}  # planned: each setting's variants (canonical specs), in the study's order
    for setting, variant, _ in runs:
        planned.setdefault(setting or 'sweep', {})[variant] = None
    for setting in dict.fromkeys(key[0] for key in runs):
        loaded = {}
        for (s, variant, seed), (out_dir, _) in runs.items():
            if s != setting:
                continue
            if run_state(out_dir) == 'done':
                loaded[(variant, seed)] = load_run(out_dir)
            else:
                skipped.append(out_dir)
        if loaded:
            results[setting or 'sweep'] = (loaded, summarize(loaded, list(planned[setting or 'sweep'])))
    if not results and not without_runs:
        raise UserError(f"no finished run to report yet ({len(runs)} planned)")
    tests = Tests()
    lines = [f"# {name}: {study.question}", '', f"{len(runs) - len(skipped)} of {len(runs)} runs finished. "
             + STATISTICS, '']
    for setting, (loaded, summary) in results.items():
        first = next(iter(summary.values()))
        lines += [f"## {setting}: {millions(first['non_embedding_params'])} non-embedding parameters "
                  f"({millions(first['params'])} with the token embeddings), {first['tokens'] / 1e6:.2f}M tokens per run",
                  '', table(setting, summary, tests, name, versus='attention' in planned[setting]), '']
        setting_figures(setting, loaded, summary, out)
    lines += figures(results, out, tests, name)
    tests.finish()
    sizes = {t['family']: t['family_size'] for t in tests.tests}
    lines += ['### Holm families', '', *(f"- {family}: {m} test(s)" if m else f"- {family}: no test yet (one seed)"
                                        for family, m in sizes.items()), '']
    text = tests.fill('\n'.join(lines))
    with atomic_write(os.path.join(out, 'report.md')) as f:
        f.write(text + '\n')
    with atomic_write(os.path.join(out, 'per_seed.csv')) as f:
        writer = csv.DictWriter(f, PER_SEED_FIELDS, lineterminator='\n')
        writer.writeheader()
        writer.writerows(per_seed_rows(results))
    with atomic_write(os.path.join(out, 'per_seed_layers.csv')) as f:
        writer = csv.DictWriter(f, PER_LAYER_FIELDS, lineterminator='\n')
        writer.writeheader()
        writer.writerows(per_layer_rows(results))
    with atomic_write(os.path.join(out, 'per_seed_curves.csv')) as f:
        writer = csv.DictWriter(f, CURVE_FIELDS, lineterminator='\n')
        writer.writeheader()
        writer.writerows(per_eval_rows(results))
    with atomic_write(os.path.join(out, 'report.json')) as f:
        json.dump(dict(settings={setting: summary for setting, (_, summary) in results.items()}, tests=tests.tests),
                  f, indent=1)
    print(text + f"\n-> {out}/report.md")
    return results
