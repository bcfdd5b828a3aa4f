"""
Each study's own figures and claim lines, one function per study: FIGURES at the end says which study calls which,
and lab/sweep.py hands it to lab/reports.py's report, which writes the tables every study shares. A new study is
an entry in lab/studies.py's STUDIES and one here.
"""

import csv
import json
import math
import os
import statistics

import numpy as np
import torch

from common import atomic_write
from model import CLAIM_B, in_corridor

from lab.connection import depth_regimes
from lab.figures import plot_walk_evolution, plt, save, walk_panels, walk_series
from lab.reports import family, last_quarter_change, last_quarter_range, paired_differences
from lab.stats import ci_half_width, fmt_p, line_fit, paired_test, summary_test, weighted_line_fit
from lab.studies import (FIXED_GAMMAS, SETTLED, FROZEN_SEED, PRETRAINED_FIXED_GAMMA, STUDIES, frozen_gamma_path, millions,
                         parse_variant)


def claims_figures(results, out, tests, study):
    """The paper's four claims, per setting."""
    lines = []
    for setting, (loaded, summary) in results.items():
        corridor = summary.get('corridor')

        def test(a, b):
            return tests.add(family(study, a, b), f'{setting}: {a} − {b}', paired_differences(loaded, a, b))
        lines += [f"### Claims on {setting}", '',
                  f"- a: learnable δ(γI+P) lowers val loss vs attention: {test('corridor', 'attention')}",
                  "- b: heads beyond the first layer in −1 < γ < 0: " +
                  (f"{corridor['occupancy_beyond_first']:.0%} (mean γ {corridor['gamma_mean']:+.3f})" if corridor else 'not measured'),
                  f"- c: γ ≥ 0 raises val loss vs learnable γ: {test('gamma_nonneg', 'corridor')}",
                  f"- d: fixed γ = −0.5, δ = 1 beats attention: {test('fixed_gamma', 'attention')}",
                  f"- the forms alike: α0·I + α1·P − corridor {test('alpha', 'corridor')}; "
                  f"αP + β(I − P) − corridor {test('alpha_beta', 'corridor')}", '']
    return lines


# the cells the replication repeats, as the claims study measured them (seeds 0-2; README, commit a7c0eb5)
REPLICATED = {'corridor − attention': (-0.0031, 0.0006, 3), 'gamma_nonneg − corridor': (+0.0036, 0.0003, 3)}


def replication_figures(results, out, tests, study):
    """Each primary test beside the cell it replicates. Named before the runs were read; reported whatever it shows."""
    lines = ["### The replication's primary tests (each alone in its family)", '',
             "| claim | test | original, seeds 0-2 (mean [95 % CI], p) | replication, fresh seeds: mean [95 % CI], p, "
             "Holm p, MDE: verdict |", '|---|---|---|---|']
    for setting, (loaded, summary) in results.items():
        for claim, (a, b) in (('(a)', ('corridor', 'attention')), ('(c)', ('gamma_nonneg', 'corridor'))):
            label = f'{a} − {b}'
            original = summary_test(*REPLICATED[label])
            cell = tests.add(family(study, a, b), f'{setting}: {label}', paired_differences(loaded, a, b))
            lines.append(f"| {claim} | {setting}: {label} | {original.mean:+.4f} [{original.low:+.4f}, "
                         f"{original.high:+.4f}], p {fmt_p(original.p)} | {cell} |")
    return lines + ['']


def fixed_gamma_figures(results, out, tests, study):
    """Δ val loss against the fixed γ, one panel per setting, the learnable corridor's mean γ marked."""
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.8), squeeze=False)
    lines = ["### Fixed γ (δ = 1) against attention, paired by seed", '',
             "| setting | " + ' | '.join(f'γ = {g}' for g in FIXED_GAMMAS) + ' | learnable corridor |',
             '|---|' + '---|' * (len(FIXED_GAMMAS) + 1)]
    for ax, (setting, (loaded, summary)) in zip(axes[0], results.items()):
        names = {g: parse_variant(f'fixed_gamma={g}')[0] for g in FIXED_GAMMAS}
        points = [(g, summary[names[g]]) for g in FIXED_GAMMAS if names[g] in summary]
        ax.axhline(0, color='black', lw=0.8)
        ax.axvspan(-1, 0, color='tab:green', alpha=0.08)
        if points:
            ax.errorbar([g for g, _ in points], [e['vs_attention']['mean'] for _, e in points],
                        yerr=[ci_half_width(e['vs_attention_differences']) for _, e in points], marker='o',
                        capsize=3, label='fixed γ, δ = 1 (mean, 95 % CI over seeds)')
        corridor = summary.get('corridor')
        if corridor:
            ax.errorbar([corridor['gamma_mean']], [corridor['vs_attention']['mean']],
                        yerr=[ci_half_width(corridor['vs_attention_differences'])], marker='*', markersize=12,
                        color='tab:red', capsize=3, ls='none',
                        label=f"learnable corridor (final mean γ {corridor['gamma_mean']:+.2f})")
        ax.set_xlabel('γ')
        ax.set_ylabel('val loss − attention (nats per token)')
        ax.set_title(setting, fontsize=10)
        ax.legend(fontsize=7)
        cells = [tests.add(family(study, names[g], 'attention'), f'{setting}: {names[g]} − attention',
                           summary[names[g]]['vs_attention_differences']) if names[g] in summary else '–'
                 for g in FIXED_GAMMAS]
        cells.append(tests.add(family(study, 'corridor', 'attention'), f'{setting}: corridor − attention',
                               corridor['vs_attention_differences']) + f" (γ̄ {corridor['gamma_mean']:+.3f})"
                     if corridor else '–')
        lines.append(f"| {setting} | " + ' | '.join(cells) + ' |')
    fig.suptitle('Claim (d): does some fixed γ inside the corridor beat attention? (95 % CIs)', fontsize=11)
    save(fig, os.path.join(out, 'fixed_gamma.png'))
    return lines + ['', '![fixed γ](fixed_gamma.png)', '']


# the pre-registered studies' tests, named before any run was read (lab/studies.py): each `variant − attention` with
# its role, in the order its report and its per-seed figure draw them; the figure's title and file
PREREGISTERED = {
    'fixed_gamma_powered': ('Claim (d), powered', 'fixed_gamma_powered.png',
                            [('fixed_gamma=-0.1', 'primary (Holm over 2)'), ('fixed_gamma=-0.2', 'primary (Holm over 2)'),
                             ('corridor', 'secondary')]),
    'corridor_settled': ('Claim (a) where γ has settled', 'corridor_settled.png',
                         [('corridor', 'primary (Holm over 2)')] + [(parse_variant(v)[0], 'secondary')
                                                                   for v in SETTLED[2:]]),
}


def comparison_label(variant, role):
    return f'{variant} − attention\n({role})'


def draw_differences(ax, setting, columns):
    """One panel of a pre-registered study's figure: per comparison, (label, its per-seed differences), a column of
    dots, one per seed, and their mean with its 95 % CI in black. Also drawn from a published per-seed file
    (docs/results_recomputed.py --figure), where the run folders are gone."""
    for i, (_, differences) in enumerate(columns):
        if not differences:
            continue
        jitter = torch.linspace(-0.25, 0.25, len(differences)).tolist()
        ax.scatter([i + j for j in jitter], differences, s=10, alpha=0.5, color=f'C{i}')
        ax.errorbar([i], [statistics.fmean(differences)], yerr=[ci_half_width(differences)], marker='D',
                    color='black', capsize=6, markersize=6, zorder=3)
    ax.axhline(0, color='black', lw=0.8)
    ax.set_xticks(range(len(columns)), [label for label, _ in columns], fontsize=8)
    ax.set_ylabel('final val loss − attention (nats per char)\n< 0: lower than attention')
    ax.set_title(f'{setting}: one dot per seed; mean and 95 % CI in black', fontsize=10)


def draw_preregistered(panels, path):
    """A pre-registered study's per-seed figure: one panel per (setting, columns) side by side (draw_differences)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4), squeeze=False)
    for ax, (setting, columns) in zip(axes[0], panels):
        draw_differences(ax, setting, columns)
    save(fig, path)


def preregistered_figures(results, out, tests, study):
    """A pre-registered study's tests (PREREGISTERED), each `variant − attention` with its role, a row per setting,
    and one panel per setting with the per-seed differences drawn; the runs' wall time."""
    title, image, comparisons = PREREGISTERED[study]
    lines = [f"### {title}: the pre-registered tests", '',
             "| test | role | seeds | mean [95 % CI], p, Holm p, MDE: verdict | seeds below 0 | final γ̄, δ̄ |",
             '|---|---|---|---|---|---|']
    panels, wall = [], []
    for setting, (loaded, summary) in results.items():
        columns = []
        for variant, role in comparisons:
            differences = paired_differences(loaded, variant, 'attention')
            cell = tests.add(family(study, variant, 'attention'), f'{setting}: {variant} − attention', differences)
            below = sum(d < 0 for d in differences)
            where = (f"{summary[variant]['gamma_mean']:+.3f}, {summary[variant]['delta_mean']:.3f}"
                     if variant in summary else '–')
            lines.append(f"| {setting}: {variant} − attention | {role} | {len(differences)} | {cell} | "
                         f"{below} of {len(differences)} | {where} |")
            columns.append((comparison_label(variant, role), differences))
        panels.append((setting, columns))
        seconds = [r['seconds'] for r in loaded.values() if r.get('seconds')]
        if seconds:
            wall.append(f"Wall time, {setting}: {len(seconds)} runs, {sum(seconds) / 3600:.2f} h of training in all, "
                        f"median {statistics.median(seconds):.1f} s a run (range {min(seconds):.1f}–"
                        f"{max(seconds):.1f} s; the cores were shared with other work)")
    draw_preregistered(panels, os.path.join(out, image))
    return lines + [''] + [line for text in wall for line in (text, '')] + [f'![per-seed differences]({image})', '']


def fixed_gamma_powered_figures(results, out, tests, study):
    """Claim (d), powered: fixed γ − attention at −0.1 and −0.2 (primary, Holm over the two), corridor − attention."""
    return preregistered_figures(results, out, tests, study)


def corridor_settled_figures(results, out, tests, study):
    """Claim (a) at 4× the budget: corridor − attention on each corpus (primary, Holm over the two), the higher
    operator learning rate and fixed γ = −0.1 (secondary); then where γ ends and whether attention still improves."""
    return (preregistered_figures(results, out, tests, study) + budget_checks(results)
            + gamma_settling(results, out, 'corridor_settled_gamma.png'))


def token_multiplier_figures(results, out, tests, study):
    """The token multiplier's runs: no test within the study itself (its attention runs and its corridor from
    γ0 = −0.1 pair with corridor_settled's published runs, docs/results_recomputed.py computes the estimate and the
    tests from both studies' files); where the corridor from γ0 = −0.1 ends is the shared table's."""
    return gamma_settling(results, out, 'token_multiplier_gamma.png')


def budget_checks(results):
    """Epochs of the training split each run sees, and whether attention's validation loss still falls over the
    last two evaluations (no overfitting at this budget), seed by seed."""
    lines = ['### The budget: repeated epochs, and no overfitting', '']
    for setting, (loaded, _) in results.items():
        first = next(iter(loaded.values()))
        cfg = first['config']
        folder = os.path.join(cfg['data_root'], cfg['dataset'])
        try:  # the size alone: opening it as Data would check every token id, a full read of OpenWebText
            with open(os.path.join(folder, 'meta.json'), encoding='utf-8') as f:
                itemsize = np.dtype(json.load(f).get('dtype', 'uint16')).itemsize
            train_tokens = os.path.getsize(os.path.join(folder, 'train.bin')) // itemsize
        except (OSError, ValueError, TypeError):  # no data folder here, or not one prepare.py wrote
            train_tokens = None
        epochs = f"{first['log'][-1]['tokens'] / train_tokens:.2f} epochs of its {train_tokens:,} training tokens" \
            if train_tokens else 'epochs unknown (no data folder here)'
        falls = [(r['log'][-1]['val_loss'] - r['log'][-2]['val_loss']) for (v, _), r in loaded.items()
                 if v == 'attention' and len(r['log']) > 1]
        lines.append(f"- {setting}: {first['log'][-1]['tokens']:,} tokens a run, {epochs}; attention's val loss over "
                     f"its last {first['config']['eval_interval']} iterations: " +
                     (f"{statistics.fmean(falls):+.4f} on average, falling in {sum(f < 0 for f in falls)} of "
                      f"{len(falls)} seeds" if falls else 'no attention run yet'))
    return lines + ['']


def gamma_settling(results, out, image):
    """Where the learnable variants' γ goes: mean γ over every head against tokens, each seed a thin line, per
    setting; the table gives the final mean γ, δ and how far γ still moves in the last quarter."""
    lines = ['### Where γ ends', '', '| setting | variant | seeds | final γ̄ (mean over seeds) | final δ̄ | '
             'γ̄ change over the last quarter | largest one-head γ range in the last quarter |', '|---|---|---|---|---|---|---|']
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 3.8), squeeze=False)
    for ax, (setting, (loaded, summary)) in zip(axes[0], results.items()):
        ax.axhspan(-1, 0, color='tab:green', alpha=0.08)
        lowest = 0.0
        for i, (variant, entry) in enumerate(summary.items()):
            runs = [loaded[(variant, s)] for s in entry['seeds']]
            if not entry['operator_scalars'] or not all(len(r['series']) > 1 for r in runs):
                continue
            gammas = [torch.stack([g for _, g, _ in r['series']]) for r in runs]  # [evals, layers, heads] each
            if gammas[0].std() == 0 and all(g.std() == 0 for g in gammas):
                continue  # a fixed γ
            tokens = [e['tokens'] / 1e6 for e in runs[0]['log'] if 'gamma' in e]
            for k, g in enumerate(gammas):
                ax.plot(tokens[:len(g)], g.mean((1, 2)).tolist(), color=f'C{i}', lw=1.5 if len(gammas) == 1 else 0.6,
                        alpha=0.9 if len(gammas) == 1 else 0.4, label=variant if k == 0 else None)
                lowest = min(lowest, g.mean((1, 2)).min().item())
            change = statistics.fmean(last_quarter_change(r['series']) for r in runs)
            lines.append(f"| {setting} | {variant} | {len(runs)} | {entry['gamma_mean']:+.3f} | {entry['delta_mean']:.3f} "
                         f"| {change:+.3f} | {statistics.fmean(last_quarter_range(g) for g in gammas):.3f} |")
        ax.axhline(0, color='black', lw=0.8)
        ax.set_ylim(max(-1.05, lowest - 0.1), 0.05)  # the corridor (shaded) reaches −1; the heads stay well above
        ax.set_xlabel('tokens seen (millions)')
        ax.set_ylabel('mean γ over every head')
        ax.set_title(f'{setting}: each seed a line', fontsize=10)
        ax.legend(fontsize=7)
    save(fig, os.path.join(out, image))
    return lines + ['', f'![mean γ during training]({image})', '']


def corridor_settled_pilot_figures(results, out, tests, study):
    """The pilot's multipliers: where γ ends and how much it still moves, and the final loss, per corpus."""
    return budget_checks(results) + gamma_settling(results, out, 'corridor_settled_pilot_gamma.png')


def scales_figures(results, out, tests, study):
    """Δ val loss (corridor − attention) against non-embedding parameters per corpus, with a line fitted to every
    seed's difference against log10(parameters) (the ladder's pre-registered primary test) and, beside it, the
    sizes' means fitted with weights 1/SE²: the seed SD of the differences grows with size (about 40× over the
    ladder), which the unweighted fit ignores; occupancy by layer against size."""
    corpora = list(dict.fromkeys(s.split('/')[0] for s in results))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    lines = ["### The learnable corridor against attention by model size", '',
             "| setting | non-embedding parameters | tokens | tokens per parameter | corridor − attention: mean "
             "[95 % CI], p, Holm p, MDE: verdict | in corridor (layers ≥ 1) | mean γ |", '|---|---|---|---|---|---|---|']
    fits = []
    for i, corpus in enumerate(corpora):
        points = sorted((summary['corridor']['non_embedding_params'], setting, summary['corridor'])
                        for setting, (_, summary) in results.items()
                        if setting.split('/')[0] == corpus and 'corridor' in summary)
        axes[0].errorbar([p for p, _, _ in points], [c['vs_attention']['mean'] for _, _, c in points],
                         yerr=[ci_half_width(c['vs_attention_differences']) for _, _, c in points],
                         marker='o', capsize=3, color=f'C{i}', label=f'{corpus} (mean, 95 % CI)')
        for n, (params, setting, c) in enumerate(points):
            axes[1].plot(range(len(c['occupancy_by_layer'])), c['occupancy_by_layer'], marker='o', color=f'C{i}',
                         alpha=0.4 + 0.6 * (n + 1) / len(points), label=f"{corpus}, {millions(params)}")
            cell = tests.add(family(study, 'corridor', 'attention'), f'{setting}: corridor − attention',
                             c['vs_attention_differences'])
            lines.append(f"| {setting} | {millions(params)} | {c['tokens'] / 1e6:.2f}M | {c['tokens'] / params:.1f} | "
                         f"{cell} | {c['occupancy_beyond_first']:.0%} | {c['gamma_mean']:+.3f} |")
        xs = [math.log10(p) for p, _, c in points for _ in c['vs_attention_differences']]
        ys = [d for _, _, c in points for d in c['vs_attention_differences']]
        slope, low, high, p, n = line_fit(xs, ys)
        if math.isfinite(slope):
            unweighted = 'pre-registered, unweighted' if study.startswith('ladder') else 'unweighted'
            fits.append(f"- {corpus}: corridor − attention changes by {slope:+.4f} per tenfold parameters, 95 % CI "
                        f"[{low:+.4f}, {high:+.4f}], p {fmt_p(p)} ({unweighted}: least squares over {n} seed pairs at "
                        f"{len(points)} sizes; a negative slope: the gain grows with size)")
            sized = [(math.log10(params), paired_test(c['vs_attention_differences'])) for params, _, c in points]
            sized = [(x, t) for x, t in sized if t.n > 1]  # a size with one seed has no SE
            w_slope, w_low, w_high, w_p, k = weighted_line_fit([x for x, _ in sized], [t.mean for _, t in sized],
                                                               [t.sd / math.sqrt(t.n) for _, t in sized])
            fits.append(f"  - precision-weighted: {w_slope:+.4f} per tenfold, 95 % CI [{w_low:+.4f}, {w_high:+.4f}], "
                        f"p {fmt_p(w_p)} (the {k} sizes' mean differences, weights 1/SE², scale from the residuals, "
                        f"t on {k - 2} df; confounded with run length where larger sizes train on more tokens, "
                        f"as at equal tokens per parameter)" if math.isfinite(w_slope) else
                        f"  - precision-weighted: needs 3 sizes with a nonzero SE (2 seeds or more; {k} so far)")
            grid = torch.linspace(min(xs), max(xs), 20, dtype=torch.float64)
            axes[0].plot((10 ** grid).tolist(), (statistics.fmean(ys) + slope * (grid - statistics.fmean(xs))).tolist(),
                         ls='--', color=f'C{i}', lw=0.8)
    axes[0].axhline(0, color='black', lw=0.8)
    axes[0].set_xscale('log')
    axes[0].set_xlabel('non-embedding parameters')
    axes[0].set_ylabel('corridor − attention val loss')
    axes[0].set_title('Claim (a) across model sizes (dashed: least-squares fit)', fontsize=10)
    axes[0].legend(fontsize=8)
    axes[1].set_ylim(-0.05, 1.05)
    axes[1].set_xlabel('layer')
    axes[1].set_ylabel('fraction of heads with −1 < γ < 0')
    axes[1].set_title('Corridor occupancy by layer, by size', fontsize=10)
    axes[1].legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))
    save(fig, os.path.join(out, 'scales.png'))
    fits = ["The gain against size: " if fits else "The gain against size: fewer than two sizes finished.", *fits]
    return lines + ['', *fits, '', '![scales](scales.png)', '']


DEEP = CLAIM_B  # model.py: claim (b)'s "inside the corridor", read strictly (−1 < γ < −0.05)


def gamma_dynamics_figures(results, out, tests, study):
    """Where γ settles: every head's γ against tokens (per variant), occupancy over time, and per seed and layer the
    fraction of heads with −1 < γ < −0.05 at the end, and how far the heads still move in the last quarter."""
    lines = ["### Where γ settles", '',
             f"Per seed: the fraction of heads with −1 < γ < {DEEP} at the end of training, by layer; the mean γ of "
             "layer 0 and of the later layers; settling: the largest range of γ over the last quarter's evaluations, "
             "over all heads (the head that moves most); the loss gap to attention with the same seed.", '',
             f"| setting | variant | seed | −1 < γ < {DEEP}, by layer | γ̄ layer 0 | γ̄ layers ≥ 1 | γ range | "
             "largest γ range in the last quarter | val − attention |", '|---|---|---|---|---|---|---|---|---|']
    summaries, images = [], []
    for setting, (loaded, summary) in results.items():
        learnable = [v for v in summary if summary[v]['operator_scalars']]
        fig, axes = plt.subplots(2, max(1, len(learnable)), figsize=(4 * max(1, len(learnable)), 6.4), squeeze=False)
        for col, v in enumerate(learnable):
            deep_beyond_first, layer0_minus_rest = [], []
            n_layer = loaded[(v, summary[v]['seeds'][0])]['config']['n_layer']
            for s in summary[v]['seeds']:
                log = loaded[(v, s)]['log']
                tokens = [e['tokens'] / 1e6 for e in log]
                gamma = torch.tensor([e['gamma'] for e in log])  # [evals, layers, heads]
                top = axes[0][col]
                top.axhspan(-1, 0, color='tab:green', alpha=0.08)
                for layer in range(gamma.shape[1]):
                    for head in range(gamma.shape[2]):
                        top.plot(tokens, gamma[:, layer, head].tolist(), lw=0.8, alpha=0.7, color=f'C{layer}',
                                 label=f'layer {layer}' if head == 0 and s == summary[v]['seeds'][0] else None)
                axes[1][col].plot(tokens, in_corridor(gamma[:, 1:]).float().mean((1, 2)).tolist(), label=f'layers ≥ 1, seed {s}')
                axes[1][col].plot(tokens, in_corridor(gamma[:, 0]).float().mean(1).tolist(), ls='--', label=f'layer 0, seed {s}')
                last = gamma[-1]
                deep = ((last > -1) & (last < DEEP)).float()
                deep_beyond_first.append(deep[1:].mean().item())
                layer0_minus_rest.append((last[0].mean() - last[1:].mean()).item())
                settling = last_quarter_range(gamma)
                seed_gap = f"{loaded[(v, s)]['log'][-1]['val_loss'] - loaded[('attention', s)]['log'][-1]['val_loss']:+.4f}" \
                    if ('attention', s) in loaded else '– (its attention run not finished)'
                lines.append(f"| {setting} | {v} | {s} | {' / '.join(f'{x:.0%}' for x in deep.mean(1).tolist())} | "
                             f"{last[0].mean():+.3f} | {last[1:].mean():+.3f} | [{last.min():+.2f}, {last.max():+.2f}] | "
                             f"{settling:.3f} | {seed_gap} |")
            fraction = paired_test(deep_beyond_first)
            # "layer 0 is the exception" as a number: its mean γ minus the later layers', one value per seed
            contrast, layer0_text = paired_test(layer0_minus_rest), ''
            if n_layer > 1:
                layer0_text = f"; γ̄ layer 0 − γ̄ layers ≥ 1: {contrast.mean:+.3f}"
                if contrast.n > 1:
                    layer0_text += f" [{contrast.low:+.3f}, {contrast.high:+.3f}], p {fmt_p(contrast.p)}"
            gap = tests.add(family(study, v, 'attention'), f'{setting}: {v} − attention',
                            paired_differences(loaded, v, 'attention'))
            summaries.append(
                f"- {setting}, {v}: heads beyond layer 0 with −1 < γ < {DEEP}: {fraction.mean:.0%} over "
                f"{fraction.n} seed(s)" + (f", 95 % CI [{fraction.low:.0%}, {fraction.high:.0%}]"
                                           if fraction.n > 1 and fraction.sd > 0 else
                                           ' (no spread between seeds)' if fraction.n > 1 else '') +
                (f"; val − attention {gap}" if 'attention' in summary else '') + layer0_text)
            axes[0][col].set_title(f'{v}: γ of every head', fontsize=9)
            axes[1][col].set_ylim(-0.05, 1.05)
            axes[1][col].set_title('fraction in the corridor', fontsize=9)
            axes[1][col].set_xlabel('tokens seen (millions)')
        if learnable:
            axes[0][0].legend(fontsize=6)
            axes[1][0].legend(fontsize=6)
        fig.suptitle(f'Claim (b): where γ settles, {setting}', fontsize=11)
        name = f"gamma_dynamics_{setting.replace('/', '_')}.png"
        save(fig, os.path.join(out, name))
        images += [f'![γ dynamics, {setting}]({name})', '']
    return lines + ['', 'Across seeds:', '', *summaries, '', *images]


# the pretrained study's cells, each a difference of final val losses paired by seed ('frozen': the run's own
# evaluation at iteration 0, where γ = 0, δ = 1 computes the pretrained model on the same batches): (claim, a, b)
PRETRAINED_CELLS = (('(a)', 'corridor', 'delta_only'), ('(a)', 'corridor', 'frozen'), ('–', 'delta_only', 'frozen'),
                    ('(c)', 'gamma_nonneg', 'corridor'), ('(d), δ learned', 'fixed_gamma_delta', 'delta_only'),
                    ('forms', 'alpha', 'corridor'), ('forms', 'alpha_beta', 'corridor'))


PRETRAINED_FAMILY = 'every cell of the pretrained study (trained cells paired by seed, frozen cells by batch)'


def pretrained_variant(summary, name):
    """The study's variant spec for a cell's name: fixed_gamma_delta stands for whichever fixed γ the study trains."""
    if name == 'fixed_gamma_delta':
        return next((v for v in summary if v.split('=')[0] == name),
                    parse_variant(f'{name}={PRETRAINED_FIXED_GAMMA}')[0])
    return name


def study_settings(study):
    """The settings of a study's parts, by its report name ('pretrained', 'pretrained-gpu')."""
    base, gpu = study.removesuffix('-gpu'), study.endswith('-gpu')
    if base not in STUDIES:
        return []
    return list(dict.fromkeys(p.setting for p in (STUDIES[base].gpu_parts if gpu else STUDIES[base].parts)))


def frozen_gamma_cells(losses, tests, setting):
    """Each fixed γ of the frozen model: (γ, mean val loss over the batches, its SE, the cell of γ − (γ = 0) paired
    by batch); γ = 0's cell is '–'."""
    rows = []
    for gamma, values in sorted(losses.items()):
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float('nan')
        cell = '–' if gamma == 0 else tests.add(
            PRETRAINED_FAMILY, f'{setting}: frozen, γ = {gamma:+g} − γ = 0 (δ = 1)',
            [a - b for a, b in zip(values, losses[0.0])])
        rows.append((gamma, statistics.fmean(values), se, cell))
    return rows


def pretrained_figures(results, out, tests, study):
    """A frozen pretrained model given the operator, the paper's four claims as cells (PRETRAINED_CELLS, paired by
    seed at the final evaluation), and the frozen model's fixed-γ curve at δ = 1 (frozen_gamma_losses: per batch,
    paired with γ = 0 by batch), all in one Holm family; per run where γ ends, how far it still moves in the last
    quarter, and the wall time; a figure of every cell and the curve, and one of γ per layer and over training. The
    curve's per-batch losses go to per_batch_frozen.csv (setting, γ, batch, val loss)."""
    lines = ["### The claims at this scale: one Holm family", '',
             "Trained cells: final val loss, paired by seed ('frozen': the run's own evaluation at iteration 0, where "
             "γ = 0, δ = 1 computes the pretrained model on the same batches). Frozen cells: the pretrained model with "
             "every head at a fixed γ, δ = 1 (nothing to train), on the evaluation batches of seed "
             f"{FROZEN_SEED}, paired with γ = 0 by batch: their CI is over batches, not seeds. Claim (b) is the "
             "per-run table below.", '',
             "| setting | claim | cell | seeds | mean [95 % CI], p, Holm p, MDE: verdict |", '|---|---|---|---|---|']
    rows = ["### Where γ ends, per run", '',
            f"| setting | variant | seed | frozen → final val loss | γ̄ [min, max] | −1 < γ < 0 | −1 < γ < {DEEP} | "
            "largest γ range in the last quarter | wall time |", '|---|---|---|---|---|---|---|---|---|']
    curves, images, out_root = [], [], os.path.dirname(os.path.normpath(out))
    settings = list(dict.fromkeys([*study_settings(study), *results]))
    for setting in settings:
        loaded, summary = results.get(setting, ({}, {}))
        path = frozen_gamma_path(out_root, setting)
        if os.path.isfile(path):
            with open(path) as f:
                saved = json.load(f)
            losses = {float(g): v for g, v in saved['losses'].items()}
            if 0.0 in losses:
                curves.append((setting, saved, frozen_gamma_cells(losses, tests, setting)))
        for claim, a, b in PRETRAINED_CELLS:
            a, b = pretrained_variant(summary, a), pretrained_variant(summary, b)
            if a not in summary or (b != 'frozen' and b not in summary):
                lines.append(f"| {setting} | {claim} | {a} − {b} | 0 | not trained yet |")
                continue
            differences = [loaded[(a, s)]['log'][-1]['val_loss'] - loaded[(a, s)]['log'][0]['val_loss']
                           for s in summary[a]['seeds']] if b == 'frozen' else paired_differences(loaded, a, b)
            cell = tests.add(PRETRAINED_FAMILY, f'{setting}: {a} − {b}', differences)
            lines.append(f"| {setting} | {claim} | {a} − {b} | {len(differences)} | {cell} |")
        if not loaded:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
        extremes = [0.0]
        for (variant, seed), run in sorted(loaded.items()):
            log = run['log']
            gamma = torch.tensor([e['gamma'] for e in log])  # [evals, layers, heads]
            last = gamma[-1]
            settling = last_quarter_range(gamma)
            wall = f"{run['seconds'] / 60:.0f} min" if run['seconds'] else '–'
            rows.append(f"| {setting} | {variant} | {seed} | {log[0]['val_loss']:.4f} → {log[-1]['val_loss']:.4f} | "
                        f"{last.mean():+.3f} [{last.min():+.2f}, {last.max():+.2f}] | {in_corridor(last).float().mean():.0%} | "
                        f"{((last > -1) & (last < DEEP)).float().mean():.0%} | {settling:.3f} | {wall} |")
            if variant != 'corridor':
                continue
            layers = range(last.shape[0])
            extremes += [last.min().item(), last.max().item()]
            axes[0].plot(layers, last.mean(1).tolist(), marker='o', ms=3, label=f'mean over heads, seed {seed}')
            axes[0].fill_between(layers, last.min(1).values.tolist(), last.max(1).values.tolist(), alpha=0.15)
            axes[1].plot(layers, in_corridor(last).float().mean(1).tolist(), marker='o', ms=3, label=f'seed {seed}')
            tokens = [e['tokens'] / 1e3 for e in log]
            for layer in layers:
                axes[2].plot(tokens, gamma[:, layer].mean(1).tolist(), lw=0.8,
                             color=plt.cm.viridis(layer / max(1, len(layers) - 1)), alpha=0.8)
        axes[0].axhspan(-1, 0, color='tab:green', alpha=0.08)
        margin = 0.1 * (max(extremes) - min(extremes)) or 0.01
        axes[0].set_ylim(min(extremes) - margin, max(extremes) + margin)  # the heads' values, not the whole corridor
        axes[0].set(xlabel='layer', ylabel='final γ (shaded: the corridor)',
                    title='corridor: γ by layer (band: min–max over heads)')
        axes[1].set(xlabel='layer', ylabel='fraction of heads', title='corridor: −1 < γ < 0 by layer', ylim=(-0.05, 1.05))
        axes[2].set(xlabel='tokens seen (thousands)', ylabel='mean γ of the layer',
                    title='corridor: γ over training (dark: first layers)')
        for ax in axes[:2]:
            ax.legend(fontsize=7)
        name = f"pretrained_{setting.replace('/', '_')}.png"
        save(fig, os.path.join(out, name))
        images += [f'![γ by layer, {setting}]({name})', '']
        plot_pretrained_cells(setting, loaded, next((c for c in curves if c[0] == setting), None),
                              os.path.join(out, f"pretrained_claims_{setting.replace('/', '_')}.png"))
        images += [f"![the cells and the frozen fixed-γ curve, {setting}](pretrained_claims_{setting.replace('/', '_')}.png)", '']
    for setting, saved, frozen in curves:
        if setting not in results:  # no trained run yet: the curve alone
            plot_pretrained_cells(setting, {}, (setting, saved, frozen),
                                  os.path.join(out, f"pretrained_claims_{setting.replace('/', '_')}.png"))
            images += [f"![the frozen fixed-γ curve, {setting}](pretrained_claims_{setting.replace('/', '_')}.png)", '']
    with atomic_write(os.path.join(out, 'per_batch_frozen.csv')) as f:  # the frozen cells' numbers, for docs/per_seed/
        writer = csv.writer(f, lineterminator='\n')
        writer.writerow(('setting', 'gamma', 'batch', 'val_loss'))
        writer.writerows((setting, f'{float(gamma):+g}', batch, repr(loss)) for setting, saved, _ in curves
                         for gamma, losses in saved['losses'].items() for batch, loss in enumerate(losses))
    frozen_lines = []
    for setting, saved, frozen in curves:
        identity = saved['identity']
        frozen_lines += [f"### {setting}: the frozen model at fixed γ, δ = 1 (claim (d), no training)", '',
                         f"{identity['init_from']} with every head at γ, δ = 1, on the {identity['eval_iters']} "
                         f"evaluation batches of seed {identity['seed']} ({identity['batch_size']} × "
                         f"{identity['block_size']} tokens each, {identity['dataset']}'s val split); SE over "
                         "batches; the difference to γ = 0 (the pretrained model) paired by batch.", '',
                         "| γ | val loss | SE | − γ = 0, paired by batch: mean [95 % CI], p, Holm p, MDE: verdict | "
                         "wall time |", '|---|---|---|---|---|']
        for gamma, mean, se, cell in frozen:
            frozen_lines.append(f"| {gamma:+g} | {mean:.4f} | {se:.4f} | {cell} | "
                                f"{saved['seconds'][f'{gamma:+g}'] / 60:.1f} min |")
        frozen_lines.append('')
    if not curves:
        frozen_lines = ["The frozen model's fixed-γ curve: not evaluated yet (`python -m lab.sweep --study=pretrained` "
                        "evaluates it before any run)", '']
    return lines + [''] + frozen_lines + rows + [''] + images


def plot_pretrained_cells(setting, loaded, curve, path):
    """One scale, the frozen model's loss on the same batches subtracted. Left: every variant's final val loss minus
    its run's iteration-0 loss (the frozen model on that seed's batches), mean and 95 % CI over seeds; right: the
    frozen model's val loss at fixed γ, δ = 1, minus γ = 0's, paired by batch (mean, 95 % CI over batches)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw=dict(width_ratios=(1.2, 1)))
    by_variant = {}
    for (variant, seed), run in sorted(loaded.items()):
        by_variant.setdefault(variant, []).append(run['log'][-1]['val_loss'] - run['log'][0]['val_loss'])
    cells = [(v, d, None) for v, d in by_variant.items()]
    measured = [(label, d) for label, d, _ in cells if d]
    for i, (label, differences) in enumerate(measured):
        axes[0].errorbar([statistics.fmean(differences)], [i], xerr=[ci_half_width(differences)], marker='o',
                         capsize=3, color='C0')
        axes[0].plot(differences, [i] * len(differences), 'x', color='gray', ms=4)
    if measured:
        axes[0].set_yticks(range(len(measured)), [f'{label} (n = {len(d)})' for label, d in measured], fontsize=8)
        axes[0].set_ylim(-0.5, len(measured) - 0.5)
        axes[0].axvline(0, color='black', lw=0.8)
        axes[0].set_xlabel('final val loss − frozen model, same batches (nats per token)')
        axes[0].set_title(f'{setting}: by variant (mean, 95 % CI over seeds; ×: seeds)', fontsize=9)
    else:
        axes[0].set_axis_off()
        axes[0].text(0.5, 0.5, f'{setting}:\nno trained run finished yet', ha='center', va='center', fontsize=10)
    if curve:
        _, saved, frozen = curve
        losses = {float(g): v for g, v in saved['losses'].items()}
        gammas = [g for g, *_ in frozen]
        diffs = [[a - b for a, b in zip(losses[g], losses[0.0])] for g in gammas]
        axes[1].errorbar(gammas, [statistics.fmean(d) for d in diffs], yerr=[ci_half_width(d) for d in diffs],
                         marker='o', capsize=3, color='tab:blue')
        axes[1].axvspan(min(gammas + [-1e-9]), 0, color='tab:green', alpha=0.08)
        axes[1].axhline(0, color='black', lw=0.8)
        axes[1].set_yscale('symlog', linthresh=0.02)  # the small differences near γ = 0 beside the large ones
        for g, d in zip(gammas, diffs):
            axes[1].annotate(f'{statistics.fmean(d):+.3f}', (g, statistics.fmean(d)), textcoords='offset points',
                             xytext=(4, 6), fontsize=7)
        axes[1].set_xlabel('fixed γ of every head (δ = 1)')
        axes[1].set_ylabel('val loss − γ = 0 (nats per token)')
        base = next(mean for g, mean, *_ in frozen if g == 0)
        axes[1].set_title(f'frozen model at fixed γ, δ = 1 (γ = 0: {base:.4f}):\npaired by batch, 95 % CI over '
                          f'{len(losses[0.0])} batches', fontsize=9)
    else:
        axes[1].set_axis_off()
    return save(fig, path)


def geometry_figures(results, out, tests, study):
    """The connection walk of every variant against attention's, paired by seed: per depth regime at the end of
    training (the attention part, and the full operator c_I·I + c_P·P), during training, and against γ."""
    lines = ["### The connection walk against attention's", '',
             "Final evaluation, per depth regime (initial 20 % of layers, middle, final 20 %): attention's value "
             "(mean over seeds) and each variant's difference to it, paired by seed, for the attention part P of "
             "the variant and for its full operator c_I·I + c_P·P. Holm families: one per variant and part, over "
             "every diagnostic × regime × setting. Does the difference track γ? Per learnable-corridor run, the "
             "least-squares slope of the full operator's difference (all layers) on the layer-mean γ over the "
             "evaluations after the first (the shared start at γ = 0 left out), tested across seeds; and one point "
             "per run (final evaluation) for the correlation across the corridor and fixed-γ runs. Every run's "
             "regime values: per_seed_walk.csv.", '']
    walk_rows = []  # (setting, variant, seed, part, diagnostic, regime, value) of every cell's runs: per_seed_walk.csv
    for setting, (loaded, summary) in results.items():
        # pair by seed the finished runs that logged their walk (a study may be partway, a run may lack walk_interval)
        logged = {key for key, run in loaded.items() if any('attention' in e.get('walk', {}) for e in run['log'])}
        seeds = {v: [s for s in summary[v]['seeds'] if (v, s) in logged and ('attention', s) in logged]
                 for v in summary}
        variants = [v for v in summary if v != 'attention' and seeds[v]]
        if not seeds.get('attention'):
            lines += [f"{setting}: no walk geometry logged (train with walk_interval)", '']
            continue

        def series(v, s, part, key):  # attention's runs have the part P only
            return walk_series(loaded[(v, s)]['log'], part if summary[v]['operator_scalars'] else 'attention', key)

        def final(v, s, part, key):  # regime means of one run's last logged walk
            return depth_regimes(series(v, s, part, key)[1][-1].tolist())

        # the registry's diagnostics with a panel that every paired run logged: a run older than an entry lacks it
        runs = [(v, s) for v in ('attention', *variants) for s in seeds[v]]
        panels = [(key, name) for key, name in walk_panels()
                  if all(series(v, s, part, key) is not None for v, s in runs for part in ('attention', 'operator'))]
        missing = [name for key, name in walk_panels() if (key, name) not in panels]
        lines += [f"#### {setting}", '', *([f"Not logged by every run, left out: {', '.join(missing)}.", '']
                                           if missing else [])]
        if not panels:
            continue
        header = "| diagnostic | regime | attention | " + ' | '.join(f"{v}: P | {v}: operator" for v in variants) + ' |'
        lines += [header, '|---|---|---|' + '---|---|' * len(variants)]
        for key, name in panels:
            for regime in ('initial', 'middle', 'final'):
                base = {s: final('attention', s, 'attention', key)[regime] for s in seeds['attention']}
                if any(b is None for b in base.values()):
                    continue
                cells = [f"{statistics.fmean(base.values()):.4g}"]
                walk_rows += [(setting, 'attention', s, 'P', key, regime, b) for s, b in base.items()]
                for v in variants:
                    for part in ('attention', 'operator'):
                        values = {s: final(v, s, part, key)[regime] for s in seeds[v]}
                        diffs = [values[s] - base[s] for s in seeds[v]]
                        part_name = 'P' if part == 'attention' else 'operator'
                        walk_rows += [(setting, v, s, part_name, key, regime, x) for s, x in values.items()]
                        cells.append(tests.add(f'geometry, {v}: {part_name}, every diagnostic × regime × setting',
                                               f'{setting}: {name}, {regime}, {v}: {part_name} − attention', diffs))
                lines.append(f"| {name} | {regime} | " + ' | '.join(cells) + ' |')
        lines.append('')

        # the full operator's difference to attention against γ: per-run slopes (corridor), one point per run (all)
        fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
        tracking = []
        fixed_first = next(((v, seeds[v][0]) for v in variants if v.startswith('fixed_gamma')), None)  # one legend entry
        for col, (key, name) in enumerate(panels):
            ax, slopes, finals = axes[0][col], [], []
            for v in variants:
                for s in seeds[v]:
                    tokens, ours = series(v, s, 'operator', key)
                    _, theirs = series('attention', s, 'attention', key)
                    by_tokens = {e['tokens']: e['gamma'] for e in loaded[(v, s)]['log']}
                    gamma = torch.tensor([by_tokens[t] for t in tokens.tolist()]).mean((1, 2))  # where it is logged
                    if ours.shape != theirs.shape:  # evaluated at other iterations: not comparable step by step
                        continue
                    diff = (ours - theirs).mean(1)  # all layers
                    finals.append((gamma[-1].item(), diff[-1].item()))
                    if v == 'corridor':
                        slopes.append(line_fit(gamma[1:].tolist(), diff[1:].tolist())[0])
                        ax.plot(gamma.tolist(), diff.tolist(), '.-', color='tab:red', lw=0.8,
                                label='learnable corridor, every evaluation' if s == seeds[v][0] else None)
                    elif v.startswith('fixed_gamma'):
                        ax.plot([gamma[-1].item()], [diff[-1].item()], 'o', color='tab:blue',
                                label='fixed γ, end of training' if (v, s) == fixed_first else None)
            slopes = [b for b in slopes if math.isfinite(b)]
            cell = tests.add('geometry: slope of the operator − attention on γ̄, per corridor run',
                             f'{setting}: {name}', slopes) if slopes else 'too few evaluations'
            r = (torch.corrcoef(torch.tensor(finals, dtype=torch.float64).T)[0, 1].item()
                 if len(finals) > 2 and len({g for g, _ in finals}) > 1 else float('nan'))
            tracking.append(f"- {name}: slope per unit γ̄ {cell}; across runs (final evaluation, one point per run, "
                            f"n = {len(finals)}) r = {r:+.2f}")
            ax.axhline(0, color='black', lw=0.6)
            ax.set_xlabel('mean γ')
            ax.set_title(f'{name}\n(full operator) − attention', fontsize=9)
        axes[0][0].legend(fontsize=7)
        name = setting.replace('/', '_')
        save(fig, os.path.join(out, f'geometry_vs_gamma_{name}.png'))
        plot_walk_evolution({v: [loaded[(v, s)]['log'] for s in seeds[v]] for v in ('attention', *variants)},
                            os.path.join(out, f'geometry_{name}.png'), setting)
        lines += ["Does the difference track γ?", '', *tracking, '',
                  f"![geometry during training, {setting}](geometry_{name}.png)", '',
                  f"![geometry against γ, {setting}](geometry_vs_gamma_{name}.png)", '']
    with atomic_write(os.path.join(out, 'per_seed_walk.csv')) as f:
        writer = csv.writer(f, lineterminator='\n')
        writer.writerow(WALK_FIELDS)
        writer.writerows((*row[:-1], repr(row[-1])) for row in walk_rows)  # repr: the exact float
    return lines


# the geometry study's per-run walk file: one row per run, part (the attention part P, or the full operator), walk
# diagnostic and depth regime, at the final evaluation; attention's runs have the part P only
WALK_FIELDS = ('setting', 'variant', 'seed', 'part', 'diagnostic', 'regime', 'value')


# which study's report calls which function (a study run on one GPU, NAME-gpu, calls its study's)
FIGURES = {
    'claims': claims_figures,
    'fixed_gamma': fixed_gamma_figures,
    'scales': scales_figures,
    'gamma_dynamics': gamma_dynamics_figures,
    'replication': replication_figures,
    'fixed_gamma_powered': fixed_gamma_powered_figures,
    'corridor_settled': corridor_settled_figures,
    'corridor_settled_pilot': corridor_settled_pilot_figures,
    'ladder': scales_figures,
    'token_multiplier': token_multiplier_figures,
    'pretrained': pretrained_figures,
    'geometry': geometry_figures,
}
