"""
The README's CPU results recomputed with lab/stats.py: 95 % CI, paired-t p, Holm p within each study's families,
MDE at 80 % power. Two sources: the per-seed files in docs/per_seed/ (one CSV a study, each run's exact final loss:
what `python -m lab.sweep --study=NAME` writes as per_seed.csv), recomputed exactly, with the tables and quoted CIs of
docs/studies.md that come from them (TABLES; tests/test_docs.py finds them on the page); and, for the studies whose
per-seed files are not regenerated yet, the summaries the README and docs/ state (mean and SD of the paired
differences, seeds per cell): p-values from a 4-decimal SD are approximate where the SD is 0.0001–0.0006. Also the
geometry study's walk file (each run's walk diagnostics per depth regime; its quotes in studies.md are rendered here
too), the scales' and the ladder's fits on size (unweighted over seed pairs, precision-weighted), the token multiplier
(with corridor_settled's runs; its compute multiplier with the bench's timed pairs, per_seed/throughput.csv) and the
135M study's first two-seed run.

    python docs/results_recomputed.py          # -> docs/results_recomputed.md
    python docs/results_recomputed.py --append corridor_settled R/corridor_settled
        # more runs of a study (R: their --out_root, reported at this code) added to docs/per_seed/, then the page
    python docs/results_recomputed.py --figure corridor_settled   # -> docs/corridor_settled.png, from its file
"""

import csv
import glob
import math
import os
import random
import statistics
import sys
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import UserError, atomic_write, main_guard  # noqa: E402
from model import CLAIM_B  # noqa: E402
from lab.reports import family  # noqa: E402  (the studies' Holm families, as their reports form them)
from lab.study_figures import (PREREGISTERED, PRETRAINED_CELLS, comparison_label, draw_preregistered,  # noqa: E402
                               pretrained_variant)  # (the reports' cells, and their per-seed figures)
from lab.studies import LADDER_SIZES, STUDIES, millions, non_embedding_params, parse_variant, setting_config  # noqa: E402
from lab.stats import (fmt_p, holm, log_ratio_test, line_fit, paired_test, summary_test, t_two_sided_p, verdict,  # noqa: E402
                       weighted_line_fit)

PER_SEED = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'per_seed')

TS, WT = 'Tiny Shakespeare', 'WikiText-2 (char)'

# SmolLM2-135M operator-only, its first run of corridor and δ only on seeds 0 and 1 (pretrained.md's two-seed pilot, no
# per-seed file): final validation losses by seed, and the frozen model's (each run's iteration-0 loss); its three comparisons are one Holm family
FIRST_RUN = {'corridor': (3.5145, 3.5700), 'δ only': (3.5511, 3.6036), 'frozen model': (3.6343, 3.6843)}


def verdict_words(test, p_holm):
    """'**lower**' / '**higher**' when the Holm p is below 5 %, else 'inconclusive (within ±X)', X the 95 % CI's bound
    farthest from zero: the data rule out a larger difference."""
    if not math.isfinite(test.p):
        return 'no test'  # one seed: no spread to test against
    if p_holm < 0.05:
        return '**lower**' if test.mean < 0 else '**higher**'
    return f"inconclusive (within ±{max(abs(test.low), abs(test.high)):.2g})"


def rows(cells, family_of):
    """Markdown rows for (label, corpus, mean, sd, n) cells, Holm-adjusted within family_of(cell)."""
    tests = [summary_test(mean, sd, n) for _, _, mean, sd, n in cells]
    adjusted = [0.0] * len(cells)
    for name in dict.fromkeys(map(family_of, cells)):
        members = [i for i, c in enumerate(cells) if family_of(c) == name]
        for i, p in zip(members, holm([tests[i].p for i in members])):
            adjusted[i] = p
    out = []
    for (label, corpus, mean, sd, n), t, p_holm in zip(cells, tests, adjusted):
        m = sum(family_of(c) == family_of((label, corpus, mean, sd, n)) for c in cells)
        out.append(f"| {label} | {corpus} | {n} | {mean:+.4f} ± {sd:.4f} | [{t.low:+.4f}, {t.high:+.4f}] | {fmt_p(t.p)} "
                   f"| {fmt_p(p_holm)} ({m}) | {t.mde:.4f} | {verdict_words(t, p_holm)} |")
    return out


HEADER = ["| comparison | corpus | seeds | mean ± SD (stated) | 95 % CI | p | Holm p (m) | MDE | verdict |",
          "|---|---|---|---|---|---|---|---|---|"]


def keyed_rows(path, key):
    """(the header's columns, {key(row): row}) of a CSV file, refusing one whose rows repeat a key: a study gathered
    in parts (--append) adds rows, and a run added twice must not pass as one more seed."""
    keyed = {}
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        for line, row in enumerate(reader, start=2):
            if key(row) in keyed:
                raise UserError(f"{path}, line {line}: {key(row)} appears twice")
            keyed[key(row)] = row
    return reader.fieldnames or [], keyed


def run_key(r):
    return r['setting'], r['variant'], int(r['seed'])


def layer_key(r):
    return *run_key(r), int(r['layer'])


def curve_key(r):
    return *run_key(r), int(r['iter'])


def batch_key(r):
    return r['setting'], float(r['gamma']), int(r['batch'])


def read_per_seed(path):
    """{(setting, variant, seed): row} of one study's per-seed file, the losses as floats (written with repr: exact)."""
    return {k: {**r, 'val_loss': float(r['val_loss'])} for k, r in keyed_rows(path, run_key)[1].items()}


# beyond each variant − attention, the comparisons a study's report also makes: claim (c) and the forms, against the
# learnable corridor
AGAINST_CORRIDOR = {'claims': ('gamma_nonneg', 'alpha', 'alpha_beta'), 'replication': ('gamma_nonneg',)}


def cell_tests(study, runs, pairs):
    """{(setting, a, b): (PairedTest, Holm p, family size, seeds below 0)} for each a − b paired by seed within its
    setting, Holm-adjusted within the families the study's report forms (lab.reports.family: one comparison across
    the settings; the fixed-γ grid as one). A pair with no common seed is left out; one with one seed has no p."""
    tests = {}
    for setting in dict.fromkeys(s for s, _, _ in runs):
        for a, b in pairs:
            differences = seed_pairs(runs, setting, a, b)
            if differences:
                tests[(setting, a, b)] = (paired_test(differences), sum(d < 0 for d in differences))
    adjusted = holm_within({k: t for k, (t, _) in tests.items()}, lambda k: family(study, k[1], k[2]))
    return {k: (t, *adjusted[k], below) for k, (t, below) in tests.items()}


def seed_pairs(runs, setting, a, b):
    """a − b's final val losses in one setting, paired by seed, in seed order (the seeds both have)."""
    seeds = sorted(k for s, v, k in runs if (s, v) == (setting, a) and (setting, b, k) in runs)
    return [runs[(setting, a, k)]['val_loss'] - runs[(setting, b, k)]['val_loss'] for k in seeds]


def holm_within(tests, family_of):
    """{key: (Holm p, family size)} for {key: PairedTest}, adjusted within each family_of(key); a test without a p
    (one seed) gets NaN and is not counted."""
    adjusted = {}
    for name in dict.fromkeys(map(family_of, tests)):
        keys = [k for k in tests if family_of(k) == name and math.isfinite(tests[k].p)]
        adjusted.update((k, (p, len(keys))) for k, p in zip(keys, holm([tests[k].p for k in keys])))
    return {k: adjusted.get(k, (float('nan'), 0)) for k in tests}


def per_seed_cells(study, runs):
    """Every `variant − attention` of a study's per-seed file (and its AGAINST_CORRIDOR comparisons), paired by seed:
    [(setting, a, b, PairedTest, Holm p, family size, seeds below 0)]."""
    variants = [v for v in dict.fromkeys(v for _, v, _ in runs) if v != 'attention']
    pairs = [(v, 'attention') for v in variants] + [(v, 'corridor') for v in AGAINST_CORRIDOR.get(study, ())]
    return [(s, a, b, *cell) for (s, a, b), cell in cell_tests(study, runs, pairs).items()]


def per_seed_sections():
    """A section per published study: its runs, every cell recomputed from the per-seed file. A variant's final losses
    already printed for the same runs (a study sharing another's) are named, not repeated."""
    out, printed = [], {}
    for path in sorted(glob.glob(os.path.join(PER_SEED, '*.csv'))):
        study = os.path.splitext(os.path.basename(path))[0]
        if study == 'throughput' or study.endswith(('_walk', '_layers', '_frozen', '_curves')):
            continue  # the walk (walk_section), per-layer, per-batch, per-evaluation files; the bench's timed pairs
            # (in the token multiplier's section)
        runs = read_file(study)
        cells = per_seed_cells(study, runs)
        out += [f"## `{study}`: {len(runs)} runs ([per_seed/{study}.csv](per_seed/{study}.csv))", '']
        have, planned = planned_runs(study, runs)
        if have < planned:
            out += [f"**Interim: {have} of its {planned} planned runs**, not yet the study's pre-registered tests.", '']
        if cells:
            out += ["| setting | variant − attention | seeds | mean [95 % CI] | p | Holm p (m) | MDE | below 0 | verdict |",
                    "|---|---|---|---|---|---|---|---|---|"]
        elif study in SECTIONS:  # its runs pair with another study's: its own lines, after the final losses
            out.append("Its runs pair with another study's: the final losses, then its own estimates.")
        elif study in PAGES:  # its cells are not against attention: its renderer's, on its own page
            out.append(f"Its cells are not against attention: `{TABLES[study].__name__}` renders them on "
                       f"[{PAGES[study]}]({PAGES[study]})" + (" once every planned run is in" if have < planned else "")
                       + ". The final losses:")
        else:
            out.append("No attention run: the final losses only.")
        repeated = {}
        for setting, a, b, t, p_holm, m, below in cells:
            if t.n > 1:
                tested = (f"{t.mean:+.5f} [{t.low:+.5f}, {t.high:+.5f}] | {fmt_p(t.p)} | {fmt_p(p_holm)} ({m}) | "
                          f"{t.mde:.5f} | {below}/{t.n} | {verdict_words(t, p_holm)}")
            else:  # one difference, no spread to test it against
                tested = f"{t.mean:+.5f} | – | – | – | {below}/1 | {verdict_words(t, p_holm)}"
            row = f"| {setting} | {a if b == 'attention' else f'{a} − {b}'} | {t.n} | {tested} |"
            first = printed.setdefault(row, study)  # the same runs, tested in the same family, in an earlier section
            if first == study:
                out.append(row)
            else:
                repeated.setdefault(first, {})[a if b == 'attention' else f'{a} − {b}'] = None
        out += [f"\nAs in `{first}`, not repeated: {', '.join(rows)}." for first, rows in repeated.items()]
        for setting in dict.fromkeys(s for s, _, _ in runs):
            means, shared = [], {}
            for variant in dict.fromkeys(v for s, v, _ in runs if s == setting):
                rows_of = [r for (s, v, _), r in sorted(runs.items()) if (s, v) == (setting, variant)]
                first, seen = printed.setdefault((setting, variant), (study, rows_of))
                if first != study and seen == rows_of:
                    shared.setdefault(first, []).append(variant)
                    continue
                losses = column(runs, setting, variant)
                sd = f" ± {statistics.stdev(losses):.4f}" if len(losses) > 1 else ''
                gammas, deltas = (column(runs, setting, variant, key) for key in ('gamma_mean', 'delta_mean'))
                held = variant == 'attention' or len(gammas) > 1 and len(set(gammas)) == len(set(deltas)) == 1  # a fixed γ
                scalars = '' if held else f" (γ̄ {statistics.fmean(gammas):+.3f}, δ̄ {statistics.fmean(deltas):.3f})"
                means.append(f"{variant} {statistics.fmean(losses):.4f}{sd}{scalars}")
            means += [f"{', '.join(variants)}: as in `{first}`" for first, variants in shared.items()]
            out += ['', f"{setting}: " + '; '.join(means)]
        out.append('')
        if study in SECTIONS:
            out += SECTIONS[study](runs)
    return out


# ------------------------------------------------------------------------------------------------ studies.md's tables
# A study whose per-seed file is published has its tables in docs/studies.md (the 135M study: docs/pretrained.md,
# PAGES) rendered here from that file; a test (tests/test_docs.py) finds each one verbatim on its page, so no cell
# there can drift from the runs.

def signed(x, digits=4):
    """+0.0005, −0.0031 and −0.0000 (a negative mean that rounds to zero) with the pages' minus sign."""
    return f"{x:+.{digits}f}".replace('-', '−')


def p_text(p):
    """'0.011' or '< 0.001', as the pages write a p in prose."""
    return fmt_p(p).replace('<', '< ')


def holm_words(test, p_holm, scope=''):
    """'Holm 0.025: **lower**', or 'Holm 0.079: inconclusive (p 0.040)' where only the unadjusted p passes."""
    head = f"Holm {p_text(p_holm)}{scope}"
    if p_holm < 0.05:
        return f"{head}: **{'lower' if test.mean < 0 else 'higher'}**"
    return f"{head}: inconclusive" + (f" (p {fmt_p(test.p)})" if test.p < 0.05 else '')


def column(runs, setting, variant, key='val_loss'):
    """One column of a per-seed file over a cell's seeds: the final val losses, or each run's mean γ or δ."""
    return [float(r[key]) for (s, v, _), r in runs.items() if (s, v) == (setting, variant)]


CORPORA = {'shakespeare_char': TS, 'wikitext2_char': WT}
# prepare.py's training splits, in characters (= tokens): a run's tokens over its corpus's are the epochs it sees
TRAIN_CHARS = {'shakespeare_char': 1_003_854, 'wikitext2_char': 1_144_748}
CLAIM_ROWS = {'attention': 'attention', 'corridor': 'corridor, learnable from γ = 0, δ = 1',
              'alpha': 'α0·I + α1·P', 'alpha_beta': 'αP + β(I − P)', 'gamma_nonneg': 'corridor with γ ≥ 0',
              'fixed_gamma': 'fixed γ = −0.5, δ = 1', 'laplacian': 'Laplacian heads (1 of 4 is I − P)',
              'corridor_spread': 'corridor from γ0 ~ U(−0.5, 0.5)'}


VARIANT_NAMES = {'attention': 'attention', 'corridor': 'corridor', 'fixed_gamma=-0.1': 'fixed γ = −0.1',
                 'fixed_gamma=-0.2': 'fixed γ = −0.2', 'fixed_gamma': 'fixed γ = −0.5'}  # the pages' names


def gamma_delta(runs, setting, variant):
    """'−0.083, 0.964': the mean over seeds of each run's mean γ and δ."""
    return (f"{signed(statistics.fmean(column(runs, setting, variant, 'gamma_mean')), 3)}, "
            f"{statistics.fmean(column(runs, setting, variant, 'delta_mean')):.3f}")


def ci(test):
    """'−0.0031 [−0.0045, −0.0017]': a mean difference and its 95 % CI, as the pages quote them."""
    return f"{signed(test.mean)} [{signed(test.low)}, {signed(test.high)}]"


def claims_table(runs):
    """The claims section's table (each variant − attention on both corpora, Holm over the two, where γ, δ end), and
    the CIs the page quotes for claims (a) and (c) on each corpus."""
    settings = [f'{corpus}/small' for corpus in CORPORA]
    tests = cell_tests('claims', runs, [(v, 'attention') for v in CLAIM_ROWS if v != 'attention']
                       + [('gamma_nonneg', 'corridor')])
    n = len(column(runs, settings[0], 'attention'))
    out = [f"| variant − attention ({n} seeds) | {TS} | Holm p: verdict | {WT} | Holm p: verdict | γ̄, δ̄ (Shakespeare / "
           "WikiText-2) |", '|---|---|---|---|---|---|']
    for variant, label in CLAIM_ROWS.items():
        cells = [label]
        for setting in settings:
            if variant == 'attention':
                values = column(runs, setting, variant)
                cells += [f"val {statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}", '–']
            else:
                t, p_holm, _, _ = tests[(setting, variant, 'attention')]
                cells += [f"{signed(t.mean)} ± {t.sd:.4f}", holm_words(t, p_holm)]
        if variant == 'attention':
            cells.append('0, 1')
        elif variant == 'fixed_gamma':
            cells.append('−0.5, 1')
        elif variant == 'laplacian':
            cells.append('–')
        else:
            cells.append(' / '.join(gamma_delta(runs, s, variant) for s in settings))
        out.append('| ' + ' | '.join(cells) + ' |')
    return ['\n'.join(out), *(ci(tests[(s, a, b)][0]) for a, b in (('corridor', 'attention'), ('gamma_nonneg', 'corridor'))
                              for s in settings)]


def fixed_gamma_table(runs):
    """The fixed-γ section's grid: each fixed γ − attention (Holm over the grid's cells), and the learnable corridor's
    cell (Holm over the two corpora, as in the claims study)."""
    names = {parse_variant(v)[1]['gamma_init']: v for v in dict.fromkeys(v for _, v, _ in runs)
             if v.startswith('fixed_gamma')}  # γ: its variant's name ('fixed_gamma' is the default, −0.5)
    gammas = sorted(names, reverse=True)
    tests = cell_tests('fixed_gamma', runs, [(names[g], 'attention') for g in gammas] + [('corridor', 'attention')])
    n = len(column(runs, 'shakespeare_char/small', 'attention'))
    out = [f"| fixed γ, δ = 1 − attention ({n} seeds) | " + ' | '.join(signed(g, 2).rstrip('0') for g in gammas)
           + ' | learnable corridor |', '|---|' + '---|' * (len(gammas) + 1)]
    for corpus, name in CORPORA.items():
        setting = f'{corpus}/small'
        grid = [tests[(setting, names[g], 'attention')][:2] for g in gammas]
        t, p_holm, _, _ = tests[(setting, 'corridor', 'attention')]
        gamma = statistics.fmean(column(runs, setting, 'corridor', 'gamma_mean'))
        out.append(f"| {name} | " + ' | '.join(f"{signed(u.mean)} ± {u.sd:.4f}" for u, _ in grid)
                   + f" | {signed(t.mean)} ± {t.sd:.4f} (γ̄ {signed(gamma, 3)}) |")
        out.append("| … Holm p | " + ' | '.join(fmt_p(p) for _, p in grid)
                   + f" | {holm_words(t, p_holm, ' (claims study, 2 corpora)')} |")
    return ['\n'.join(out)]


def replication_quotes(runs):
    """What studies.md quotes of the replication: its two primary tests, each alone in its family, and the losses."""
    setting = 'shakespeare_char/small'
    tests = cell_tests('replication', runs, [('corridor', 'attention'), ('gamma_nonneg', 'corridor')])
    a, c = (tests[(setting, x, y)][0] for x, y in (('corridor', 'attention'), ('gamma_nonneg', 'corridor')))
    losses = {v: column(runs, setting, v) for v in ('attention', 'corridor')}
    return [f"{ci(a)}, p {p_text(a.p)}, MDE {a.mde:.4f}", f"{ci(c)}, p {p_text(c.p)}",
            ', '.join(f"{v} {statistics.fmean(x):.4f} ± {statistics.stdev(x):.4f}" for v, x in losses.items())]


def row_cells(t, p_holm, _, below):
    """A pre-registered test's cells as the powered and settled tables print them: mean [95 % CI] | p | Holm p | MDE |
    seeds below 0 (of the seeds) | verdict (one cell_tests entry)."""
    return (f"{signed(t.mean, 5)} [{signed(t.low, 5)}, {signed(t.high, 5)}] | {p_text(t.p)} | {p_text(p_holm)} | "
            f"{t.mde:.2g} | {below}/{t.n} | {verdict_words(t, p_holm)}")


def fixed_gamma_powered_table(runs):
    """The powered (d) study's table (its two primary tests, Holm over the two, and the corridor's secondary test
    alone), the CIs the verdicts table quotes, and the final losses."""
    setting = 'wikitext2_char/small'
    roles = {'fixed_gamma=-0.1': ('fixed γ = −0.1', 'primary'), 'fixed_gamma=-0.2': ('fixed γ = −0.2', 'primary'),
             'corridor': ('learnable corridor', 'secondary')}
    tests = cell_tests('fixed_gamma_powered', runs, [(v, 'attention') for v in roles])
    out = ["| − attention | mean [95 % CI] | p | Holm p | MDE | seeds below 0 | verdict |", '|---|---|---|---|---|---|---|']
    for variant, (label, role) in roles.items():
        out.append(f"| {label} ({role}) | {row_cells(*tests[(setting, variant, 'attention')])} |")
    corridor, p_corridor = tests[(setting, 'corridor', 'attention')][:2]
    losses = {v: column(runs, setting, v) for v in ('attention', *roles)}
    gamma, delta = (statistics.fmean(column(runs, setting, 'corridor', k)) for k in ('gamma_mean', 'delta_mean'))
    return ['\n'.join(out),
            *(f"γ = {signed(parse_variant(v)[1]['gamma_init'], 1)}: {ci(tests[(setting, v, 'attention')][0])}"
              for v in ('fixed_gamma=-0.1', 'fixed_gamma=-0.2')),
            f"{ci(corridor)}, p {p_text(corridor.p)}, Holm {p_text(p_corridor)}",
            f"Final validation losses (mean ± SD over the {len(losses['attention'])} seeds): "
            + ', '.join(f"{VARIANT_NAMES[v]} {statistics.fmean(x):.4f} ± {statistics.stdev(x):.4f}"
                        for v, x in losses.items())
            + f" (the corridor's heads end at γ̄ {signed(gamma, 3)}, δ̄ {delta:.3f}"]  # the page goes on


def corridor_settled_table(runs):
    """The main study's pre-registered tests (primary: the learnable corridor − attention on each corpus; secondary:
    the corridor at the pilot's multiplier and fixed γ = −0.1, each Holm over the two corpora), where γ ends, and the
    primary tests' CIs and Holm p's as the page quotes them (and the README's (a) bullet after it), and per corpus the
    budget's check: the epochs a run sees, and attention's validation loss from the evaluation before the last to the
    last (falling: no overfitting), over the seeds whose row has it (the column came after the first seeds); and,
    unplanned, the multiplier-3 corridor − the multiplier-1 corridor on each corpus as the token multiplier's section
    quotes it."""
    rows = (('corridor', 'learnable corridor', 'primary'), ('corridor_lr=3.0', 'corridor, operator_lr_mult 3', 'secondary'),
            ('fixed_gamma=-0.1', 'fixed γ = −0.1, δ = 1', 'secondary'))
    tests = cell_tests('corridor_settled', runs, [(v, 'attention') for v, _, _ in rows])
    out = ["| corpus | − attention | mean [95 % CI] | p | Holm p | MDE | seeds below 0 | verdict | final γ̄, δ̄ | γ̄ change, "
           "last quarter |", '|---|---|---|---|---|---|---|---|---|---|']
    for corpus, name in CORPORA.items():
        setting = f'{corpus}/small-x4'
        for variant, label, role in rows:
            change = statistics.fmean(column(runs, setting, variant, 'gamma_change_last_quarter'))
            out.append(f"| {name} | {label} ({role}) | {row_cells(*tests[(setting, variant, 'attention')])} | "
                       f"{gamma_delta(runs, setting, variant)} | {signed(change, 3)} |")
    primary = [(name, *tests[(f'{corpus}/small-x4', 'corridor', 'attention')][:2]) for corpus, name in CORPORA.items()]
    budget = []
    for corpus, name in CORPORA.items():
        attention = [r for (s, v, _), r in runs.items() if (s, v) == (f'{corpus}/small-x4', 'attention')]
        (tokens,) = {int(r['tokens']) for r in attention}  # every run of the setting sees the same budget
        changes = [r['val_loss'] - float(r['val_loss_previous_eval']) for r in attention if r.get('val_loss_previous_eval')]
        seeds = f"{len(changes)} seeds" if len(changes) == len(attention) else \
            f"{len(changes)} seeds that record it (of {len(attention)})"
        budget.append((f"{signed(statistics.fmean(changes), 4)} on {name}" if changes else f"not recorded on {name}")
                      + f", {tokens / TRAIN_CHARS[corpus]:.2f} epochs"
                      + (f", falling in {sum(c < 0 for c in changes)} of the {seeds}" if changes else ''))
    unplanned = []  # the multiplier-3 arm against the multiplier-1 corridor: not in the plan, unadjusted, no family
    for corpus, name in CORPORA.items():
        differences = seed_pairs(runs, f'{corpus}/small-x4', 'corridor_lr=3.0', 'corridor')
        t = paired_test(differences)
        unplanned.append(f"{ci(t)}, p {p_text(t.p)} on {name} (higher in {sum(d > 0 for d in differences)} of {t.n} seeds)")
    return ['\n'.join(out), '; '.join(f"{name} {ci(t)}, Holm {p_text(p_holm)}" for name, t, p_holm in primary),
            '; '.join(budget), ' and '.join(reversed(unplanned))]


PILOT_BOUND = 0.01  # the pilot's rule (plans/corridor_settled.md): settled, γ̄ moves less over the last quarter;
# stable, the final val loss at most this above the multiplier-1 corridor's


def corridor_settled_pilot_table(runs):
    """The pilot's pick of the main study's operator learning-rate multiplier M, by the rule named in advance and read
    from its runs: the smallest multiplier above 1 that is settled and stable on both corpora (if none settles, the
    largest stable one), and what the rule read for it beside multiplier 1's runs."""
    cells = {(s.split('/')[0], parse_variant(v)[1].get('operator_lr_mult', 1.0)): r for (s, v, _), r in runs.items()}
    corpora = [c for c in ('wikitext2_char', 'shakespeare_char') if (c, 1.0) in cells]

    def above_one(c, m):
        return cells[(c, m)]['val_loss'] - cells[(c, 1.0)]['val_loss']

    def moves(c, m):
        return float(cells[(c, m)]['gamma_change_last_quarter'])
    multipliers = sorted({m for c, m in cells if m != 1.0 and all((k, m) in cells for k in corpora)})
    stable = [m for m in multipliers if all(above_one(c, m) <= PILOT_BOUND for c in corpora)]
    settled = [m for m in stable if all(abs(moves(c, m)) < PILOT_BOUND for c in corpora)]
    if not stable:
        return ["**no multiplier is stable**"]
    chosen, how = (settled[0], 'settled and stable') if settled else (stable[-1], 'none settles: the largest stable')

    def both(f):
        return ' and '.join(f(c) for c in corpora)
    return [f"**M = {chosen:g}**, {how}: on {both(lambda c: CORPORA[c])} γ̄ moves "
            f"{both(lambda c: signed(moves(c, chosen), 3))} over the last quarter, the final loss is "
            f"{both(lambda c: signed(above_one(c, chosen)))} against multiplier 1's, and γ̄ ends at "
            f"{both(lambda c: signed(float(cells[(c, chosen)]['gamma_mean']), 3))} (multiplier 1: "
            f"{both(lambda c: signed(float(cells[(c, 1.0)]['gamma_mean']), 3))})"]


SIZES = {'tiny': 'tiny', 'small': 'small, the base', 'medium-x2': 'medium-x2'}  # the scales study's, smallest first


def size_fits(runs, settings):
    """corridor − attention against log10(non-embedding parameters) over sizes (settings; each's parameters those of
    its corridor runs, as the report counts them): (the unweighted fit, least squares over every seed pair, line_fit;
    the precision-weighted one of the sizes' means, weights 1/SE², weighted_line_fit; its weighted χ² (weighted_chi2);
    {setting: parameters})."""
    params = {s: non_embedding_params({**setting_config(s), **parse_variant('corridor')[1]}) for s in settings}
    pairs = {s: seed_pairs(runs, s, 'corridor', 'attention') for s in settings}
    xs = {s: math.log10(params[s]) for s in settings}
    unweighted = line_fit([xs[s] for s in settings for _ in pairs[s]], [d for s in settings for d in pairs[s]])
    tests = {s: paired_test(pairs[s]) for s in settings if len(pairs[s]) > 1}
    weights = {s: t.n / t.sd ** 2 if t.sd > 0 else math.inf for s, t in tests.items()}  # 1/SE²
    weighted = weighted_line_fit([xs[s] for s in tests], [t.mean for t in tests.values()],
                                 [w ** -0.5 for w in weights.values()])
    chi2 = weighted_chi2([xs[s] for s in tests], [t.mean for t in tests.values()], list(weights.values()), weighted[0])
    return unweighted, weighted, chi2, params


def weighted_chi2(xs, means, weights, slope):
    """Σ w·(mean − the weighted line)² of means about the line of that slope through their weighted centre: about
    k − 2 if the means scatter only as their SEs (weights 1/SE²) say; NaN where the fit is."""
    if not math.isfinite(slope):
        return float('nan')
    x_bar, y_bar = (sum(w * v for w, v in zip(weights, values)) / sum(weights) for values in (xs, means))
    return sum(w * (m - y_bar - slope * (x - x_bar)) ** 2 for w, x, m in zip(weights, xs, means))


def fit_words(fits, points='sizes'):
    """One result of size_fits as render() prints it: (the unweighted fit's words, the precision-weighted one's);
    points names what the weighted fit's means are of."""
    (slope, low, high, p, pairs), (w_slope, w_low, w_high, w_p, k), chi2, _ = fits
    return (f"unweighted over seed pairs {slope:+.4f} per tenfold, 95 % CI [{low:+.4f}, {high:+.4f}], p {fmt_p(p)} "
            f"({pairs} pairs, t on {pairs - 2} df)",
            f"precision-weighted over the {k} {points}' means {w_slope:+.4f} per tenfold, 95 % CI [{w_low:+.4f}, "
            f"{w_high:+.4f}], p {fmt_p(w_p)} (weights 1/SE², scale from the residuals, t on {k - 2} df; weighted χ² "
            f"{chi2:.1f} on {k - 2} df)")


def scales_table(runs):
    """The scales section's table (corridor − attention per size and corpus, Holm over the six cells, where γ ends),
    the unweighted fit on log10(non-embedding parameters) per corpus, and the cells the page quotes: the tiny size's
    CI on Tiny Shakespeare and the bound it puts on a gain, the base size's on WikiText-2, medium-x2's seed pairs."""
    tests = cell_tests('scales', runs, [('corridor', 'attention')])
    fits = {corpus: size_fits(runs, [f'{corpus}/{size}' for size in SIZES]) for corpus in CORPORA}
    params = {size: fits['shakespeare_char'][3][f'shakespeare_char/{size}'] for size in SIZES}
    out = [f"| corridor − attention | non-embedding parameters | tokens (per parameter) | {TS} | Holm p: verdict | {WT} | "
           "Holm p: verdict | final γ̄ (Shakespeare / WikiText-2) |",
           '|---|---|---|---|---|---|---|---|']
    for size, label in SIZES.items():
        settings = [f'{corpus}/{size}' for corpus in CORPORA]
        tokens = int(next(r['tokens'] for (s, _, _), r in runs.items() if s == settings[0]))
        cells = [f"{label} ({len(column(runs, settings[0], 'attention'))} seeds)", millions(params[size]),
                 f"{tokens / 1e6:.2f}M ({tokens / params[size]:.1f})"]
        for setting in settings:
            t, p_holm, _, _ = tests[(setting, 'corridor', 'attention')]
            cells += [f"{signed(t.mean)} ± {t.sd:.4f}", holm_words(t, p_holm)]
        cells.append(' / '.join(signed(statistics.fmean(column(runs, s, 'corridor', 'gamma_mean')), 3) for s in settings))
        out.append('| ' + ' | '.join(cells) + ' |')

    def bound(setting):  # the CI and the largest gain (a negative difference) it leaves possible
        t = tests[(setting, 'corridor', 'attention')][0]
        return f"{ci(t)}, no gain larger than {max(0.0, -t.low):.4f} (MDE {t.mde:.4f})"

    pairs = seed_pairs(runs, 'shakespeare_char/medium-x2', 'corridor', 'attention')
    return ['\n'.join(out),
            ' and '.join(f"{signed(slope)} per tenfold [{signed(low)}, {signed(high)}] on {CORPORA[corpus]}"
                         for corpus, ((slope, low, high, _, _), *_) in fits.items()),
            f"at the tiny size ({tests[('shakespeare_char/tiny', 'corridor', 'attention')][0].n} seeds) "
            f"{bound('shakespeare_char/tiny')}; WikiText-2 at the base size {bound('wikitext2_char/small')}",
            '(' + ', '.join(signed(d) for d in pairs) + ')']


RUNGS = tuple(LADDER_SIZES)  # the ladder's sizes, smallest first


def ladder_table(runs):
    """The ladder's table (corridor − attention per rung, Holm over the four, where γ ends), its two fits on
    log10(non-embedding parameters) as the page quotes them (the pre-registered unweighted one, the precision-weighted
    one), and the weighted χ² of the rung means about the latter."""
    settings = [f'shakespeare_char/{rung}' for rung in RUNGS]
    tests = cell_tests('ladder', runs, [('corridor', 'attention')])
    (slope, low, high, p, pairs), (w_slope, w_low, w_high, w_p, k), chi2, params = size_fits(runs, settings)
    out = ["| corridor − attention | non-embedding parameters (layers × width) | tokens (epochs of Tiny Shakespeare) | "
           "mean [95 % CI] | p | Holm p | MDE | seeds below 0 | verdict | γ̄ |", '|' + '---|' * 10]
    for rung, setting in zip(RUNGS, settings):
        config = setting_config(setting)
        tokens = int(next(r['tokens'] for (s, _, _), r in runs.items() if s == setting))
        out.append(f"| {rung} | {millions(params[setting])} ({config['n_layer']} × {config['n_embd']}) | "
                   f"{tokens / 1e6:.2f}M ({tokens / TRAIN_CHARS['shakespeare_char']:.2g}) | "
                   f"{row_cells(*tests[(setting, 'corridor', 'attention')])} | "
                   f"{signed(statistics.fmean(column(runs, setting, 'corridor', 'gamma_mean')), 3)} |")
    return ['\n'.join(out),
            f"pre-registered, unweighted over seed pairs (the primary test) | {signed(slope)} [{signed(low)}, "
            f"{signed(high)}], p {p:.2f} | least squares of every seed pair's difference, {pairs} pairs at {len(RUNGS)} "
            f"sizes, t on {pairs - 2} df",
            f"precision-weighted (not named in advance) | {signed(w_slope)} [{signed(w_low)}, {signed(w_high)}], "
            f"p {w_p:.2f} | weighted least squares of the {k} rung means, weights 1/SE² of each mean",
            f"weighted χ² {chi2:.1f} on {k - 2} df"]


DYNAMICS_ROWS = {'corridor': 'corridor from γ0 = 0', 'corridor_spread': 'from γ0 ~ U(−0.5, 0.5)',
                 'corridor_lr': 'corridor from γ0 = 0, operator_lr_mult 10',
                 'corridor_spread_lr': 'from γ0 ~ U(−0.5, 0.5), operator_lr_mult 10'}
DYNAMICS_SETTINGS = {'shakespeare_char/small-long': 'Tiny Shakespeare, 12,000 iterations',
                     'wikitext2/small-1k': 'WikiText-2, GPT-2 BPE, 1,000 iterations'}


def read_layers(study):
    """{(setting, variant, seed): [one dict of floats per layer, in layer order]} of a study's per-layer file."""
    runs = {}
    for (*key, _), r in keyed_rows(os.path.join(PER_SEED, f'{study}_layers.csv'), layer_key)[1].items():
        runs.setdefault(tuple(key), []).append({k: float(v) for k, v in r.items() if k not in ('setting', 'variant', 'seed')})
    return {key: sorted(layers, key=lambda layer: layer['layer']) for key, layers in runs.items()}


def over_heads(layers, key):
    """A per-layer share or mean of the per-layer file over every head of those layers (each layer weighs its heads)."""
    return sum(layer[key] * layer['heads'] for layer in layers) / sum(layer['heads'] for layer in layers)


def layer_summary(layers):
    """One run's claim (b) numbers from its layers: the share strictly inside (−1 < γ < −0.05) per layer and over the
    heads beyond the first layer, the mean γ of layer 0 and of the later layers' heads, γ's range, and the largest
    last-quarter range of one head."""
    rest = layers[1:]
    return dict(inside=[layer['inside_claim_b'] for layer in layers], inside_rest=over_heads(rest, 'inside_claim_b'),
                gamma0=layers[0]['gamma_mean'], gamma_rest=over_heads(rest, 'gamma_mean'),
                low=min(layer['gamma_min'] for layer in layers), high=max(layer['gamma_max'] for layer in layers),
                settling=max(layer['gamma_range_last_quarter'] for layer in layers))


def percent(x):
    return f"{100 * x:.0f} %"


def span(values, digits, sign=True):
    """'−0.192 … −0.181' (signed) or '0.010–0.012' (not): the range of values over runs, one value where all agree."""
    shown = [signed(x, digits) if sign else f"{x:.{digits}f}" for x in (min(values), max(values))]
    return shown[0] if shown[0] == shown[1] else (' … ' if sign else '–').join(shown)


def share_span(values):
    """'25–75 %' or '100 %': the range of shares over runs."""
    shown = [f"{100 * x:.0f}" for x in (min(values), max(values))]
    return f"{shown[0]} %" if shown[0] == shown[1] else f"{shown[0]}–{shown[1]} %"


def gamma_dynamics_table(runs, layers=None):
    """Claim (b)'s table, a row per variant and setting summarising its runs (each read from its layers): the share of
    the heads beyond layer 0 strictly inside (−1 < γ < −0.05) in each seed, the primary test, and how many heads that
    is where there is one seed; layer 0's share; γ̄ of layer 0 and of the later layers' heads; γ's range over every
    head; the largest range of one head over the last quarter; δ̄; the mean loss gap to attention on the same seed.
    Then what the page quotes: layer 0's contrast with the later layers over seeds, and each learnable variant −
    attention (Holm across the settings, as the report forms the families)."""
    layers = read_layers('gamma_dynamics') if layers is None else layers
    tests = cell_tests('gamma_dynamics', runs, [(v, 'attention') for v in DYNAMICS_ROWS])
    out = [f"| variant ({next(iter(DYNAMICS_SETTINGS.values()))}, unless named) | seeds | beyond layer 0 in −1 < γ < −0.05, each seed | layer 0 in it | γ̄ layer 0 | γ̄ layers ≥ 1 "
           "| γ range | one head's largest γ range, last quarter | δ̄ | − attention, mean |", '|' + '---|' * 10]
    summary = {}
    for setting, name in DYNAMICS_SETTINGS.items():
        for variant, label in DYNAMICS_ROWS.items():
            seeds = sorted(k for s, v, k in runs if (s, v) == (setting, variant))
            if not seeds:
                continue
            cells = [summary.setdefault((setting, variant, k), layer_summary(layers[(setting, variant, k)])) for k in seeds]
            later = ', '.join(percent(c['inside_rest']) for c in cells)
            if len(seeds) == 1:
                rest = layers[(setting, variant, seeds[0])][1:]
                later += (f" ({round(sum(layer['inside_claim_b'] * layer['heads'] for layer in rest))} of "
                          f"{round(sum(layer['heads'] for layer in rest))})")
            gaps = [runs[(setting, variant, k)]['val_loss'] - runs[(setting, 'attention', k)]['val_loss']
                    for k in seeds if (setting, 'attention', k) in runs]
            out.append(f"| {label if setting == next(iter(DYNAMICS_SETTINGS)) else f'{name}: {label}'} | {len(seeds)} | "
                       f"{later} | {share_span([c['inside'][0] for c in cells])} | "
                       f"{span([c['gamma0'] for c in cells], 3)} | {span([c['gamma_rest'] for c in cells], 3)} | "
                       f"[{signed(min(c['low'] for c in cells), 2)}, {signed(max(c['high'] for c in cells), 2)}] | "
                       f"{span([c['settling'] for c in cells], 3, sign=False)} | "
                       f"{span([float(runs[(setting, variant, k)]['delta_mean']) for k in seeds], 2, sign=False)} | "
                       f"{signed(statistics.fmean(gaps)) if gaps else '–'} |")
    long = 'shakespeare_char/small-long'

    def of(variant, key):
        return [c[key] for (s, v, _), c in summary.items() if (s, v) == (long, variant)]

    def contrast(variant):  # layer 0's mean γ minus the later layers', one value per seed
        t = paired_test([a - b for a, b in zip(of(variant, 'gamma0'), of(variant, 'gamma_rest'))])
        return f"{signed(t.mean, 3)} [{signed(t.low, 3)}, {signed(t.high, 3)}], p {p_text(t.p)}"

    gaps = [f"{DYNAMICS_ROWS[v]} − attention {ci(t)} ({t.n} seeds), Holm {p_text(p)}"
            for (s, v, _), (t, p, _, _) in tests.items() if s == long and t.n > 1]
    return ['\n'.join(out), f"{contrast('corridor')} from γ0 = 0 and {contrast('corridor_spread')} from the spread start",
            '; '.join(gaps)]


PRETRAINED = 'wikitext2_smollm2-135m/operator'
PRETRAINED_NAMES = {'corridor': 'corridor', 'gamma_nonneg': 'γ ≥ 0', 'delta_only': 'δ only',
                    'fixed_gamma_delta': 'fixed γ = {} with δ learned', 'alpha': 'α0·I + α1·P',
                    'alpha_beta': 'αP + β(I − P)', 'frozen': 'frozen model'}  # the pages' names, in the pages' order


def pretrained_name(variant):
    name, keys = parse_variant(variant) if variant != 'frozen' else (variant, {})
    return PRETRAINED_NAMES[name.split('=')[0]].format(signed(keys.get('gamma_init', 0.0), 2))


def read_frozen(study, setting):
    """{γ: [val loss per evaluation batch]} of one setting in a study's per-batch frozen file (NAME_frozen.csv)."""
    curve = {}
    batches = keyed_rows(os.path.join(PER_SEED, f'{study}_frozen.csv'), batch_key)[1]
    for (_, gamma, _), r in sorted(batches.items(), key=lambda kr: kr[0][2]):
        if r['setting'] == setting:
            curve.setdefault(gamma, []).append(float(r['val_loss']))
    return curve


def sig3(x, like):
    """x with the decimals that give `like` (a test's mean) three significant digits, at most five: +3.29, +0.213,
    −0.0358."""
    digits = min(5, max(0, 2 - math.floor(math.log10(abs(like))))) if like else 4
    return signed(x, digits)


def report_cell(t, p_holm):
    """'+0.213 [+0.200, +0.225], p < 0.001, Holm < 0.001, MDE 0.018: **higher**': a test as the 135M page writes it."""
    words = verdict(t, p_holm)
    return (f"{sig3(t.mean, t.mean)} [{sig3(t.low, t.mean)}, {sig3(t.high, t.mean)}], p {p_text(t.p)}, Holm "
            f"{p_text(p_holm)}, MDE {t.mde:#.2g}: " + (f"**{words}**" if words in ('lower', 'higher') else words))


def pretrained_tables(runs, layers=None, frozen=None):
    """The 135M study's tables: the frozen model's fixed-γ curve (each γ − (γ = 0) paired by evaluation batch), the
    trained cells (lab.study_figures.PRETRAINED_CELLS, paired by seed; 'frozen': each run's own iteration-0 loss),
    all in one Holm family as the report forms it, with the seeds below 0; where γ ends, a row per variant in ranges
    over its seeds; claims (b), (c) and (d) in the page's words (the corridor's shares, the heads γ ≥ 0 pins at 0,
    the fixed γ's cost at each seed's start and trained); then each trained cell's CI and Holm p as the pages quote
    them."""
    runs = {key: r for key, r in runs.items() if key[0] == PRETRAINED}
    layers = read_layers('pretrained') if layers is None else layers
    frozen = read_frozen('pretrained', PRETRAINED) if frozen is None else frozen
    in_file = dict.fromkeys(v for _, v, _ in runs)

    def final(variant, seed):
        return runs[(PRETRAINED, variant, seed)]['val_loss']

    def at_start(variant, seed):
        start = runs[(PRETRAINED, variant, seed)]['val_loss_at_start']
        if not start:
            raise ValueError(f"{variant} seed {seed} has no iteration-0 loss in the per-seed file")
        return float(start)

    trained = {}
    for claim, a, b in PRETRAINED_CELLS:
        a, b = pretrained_variant(in_file, a), pretrained_variant(in_file, b)
        if b == 'frozen':
            differences = [final(a, k) - at_start(a, k) for k in sorted(k for _, v, k in runs if v == a)]
        else:
            differences = seed_pairs(runs, PRETRAINED, a, b)
        if len(differences) > 1:
            trained[(claim, a, b)] = (paired_test(differences), differences)
    base = frozen.get(0.0)  # the pretrained model itself: without it there is no frozen cell
    curve = {g: paired_test([x - y for x, y in zip(values, base)]) for g, values in frozen.items() if base and g}
    tests = {**{key: t for key, (t, _) in trained.items()}, **curve}
    adjusted = holm_within(tests, lambda key: 'every cell of the study')  # the report's one family
    m = next(iter(adjusted.values()), (0, 0))[1]
    out = [f"| fixed γ (δ = 1) | val loss | SE ({len(base or ())} batches) | − γ = 0, paired by batch: mean [95 % CI], p, "
           f"Holm p (all {m} of the study), MDE | batches lower than γ = 0 |", '|---|---|---|---|---|']
    for gamma, values in sorted(frozen.items()):
        head = (f"| {'0 (the pretrained model)' if gamma == 0 else signed(gamma, 2).rstrip('0')} | "
                f"{statistics.fmean(values):.4f} | {statistics.stdev(values) / math.sqrt(len(values)):.3f} | ")
        if gamma in curve:
            lower = sum(x < y for x, y in zip(values, base))
            out.append(head + f"{report_cell(curve[gamma], adjusted[gamma][0])} | {lower} of {len(values)} |")
        else:
            out.append(head + "– | – |")
    cells = [f"| claim | cell | seeds | mean [95 % CI], unadjusted p, Holm p (all {m}), MDE | seeds below 0 |",
             '|---|---|---|---|---|']
    for (claim, a, b), (t, differences) in trained.items():
        cells.append(f"| {claim} | {pretrained_name(a)} − {pretrained_name(b)} | {t.n} | "
                     f"{report_cell(t, adjusted[(claim, a, b)][0])} | {sum(d < 0 for d in differences)}/{t.n} |")
    per_variant = ["| variant | seeds | val loss, frozen → final (mean) | γ̄ [min, max] | −1 < γ < 0 | −1 < γ < −0.05 | "
                   f"heads above 0 (at 0), of {round(sum(layer['heads'] for layer in next(iter(layers.values()))))} | "
                   "largest γ range in the last quarter | wall time |", '|' + '---|' * 9]

    def end(x):  # γ ≥ 0's floor and δ only's γ are exactly 0: no sign to print
        return '0' if x == 0 else signed(x, 2)

    def heads_span(counts):
        return str(min(counts)) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
    shares = {}
    for variant in sorted(in_file, key=lambda v: list(PRETRAINED_NAMES).index(v.split('=')[0])):
        seeds = sorted(k for _, v, k in runs if v == variant)
        heads = [layers[(PRETRAINED, variant, k)] for k in seeds]
        low, high = min(x['gamma_min'] for h in heads for x in h), max(x['gamma_max'] for h in heads for x in h)
        # held: one γ in every head (δ only, a fixed γ). The file writes γ to 6 decimals, so a held γ read back as
        # c_I / c_P is one number there, though its heads differ by float noise; on claim (b)'s bound that noise
        # puts a few heads a hair below −0.05 (the file's inside_claim_b), which is no share to count
        where = (f"{end(low)} (held)" if low == high else
                 f"{span([float(runs[(PRETRAINED, variant, k)]['gamma_mean']) for k in seeds], 3)} [{end(low)}, {end(high)}]")
        inside = shares[variant] = [over_heads(h, 'in_corridor') for h in heads], [over_heads(h, 'inside_claim_b') for h in heads]
        deep = 'on the bound' if low == high == CLAIM_B else share_span(inside[1])
        above, at = ([sum(int(x[key]) for x in h) for h in heads] for key in ('above_zero', 'at_zero'))
        minutes = [float(runs[(PRETRAINED, variant, k)]['seconds']) / 60 for k in seeds if runs[(PRETRAINED, variant, k)]['seconds']]
        per_variant.append(
            f"| {pretrained_name(variant)} | {len(seeds)} | {statistics.fmean(at_start(variant, k) for k in seeds):.4f} → "
            f"{statistics.fmean(final(variant, k) for k in seeds):.4f} | {where} | {share_span(inside[0])} | "
            f"{deep} | {heads_span(above)} "
            f"({heads_span(at)}) | {span([max(x['gamma_range_last_quarter'] for x in h) for h in heads], 3, sign=False)} | "
            + (f"{span(minutes, 0, sign=False)} min" if minutes else '–') + ' |')
    quoted = []  # claims (b), (c) and (d) in the page's words
    if 'corridor' in in_file:
        per_layer = [x['in_corridor'] for (_, v, _), h in layers.items() if v == 'corridor' for x in h]
        quoted.append(f"{share_span(shares['corridor'][0])} of the heads end in −1 < γ < 0 ({share_span(per_layer)} a "
                      f"layer), {share_span(shares['corridor'][1])} below −0.05")
    if 'gamma_nonneg' in in_file:
        quoted.append(f"{heads_span([sum(int(x['at_zero']) for x in h) for (_, v, _), h in layers.items() if v == 'gamma_nonneg'])}"
                      " heads end pinned at 0")
    fixed = pretrained_variant(in_file, 'fixed_gamma_delta')
    if fixed in in_file and 'delta_only' in in_file:
        seeds = sorted(k for _, v, k in runs if v == fixed and (PRETRAINED, 'delta_only', k) in runs)
        quoted.append(f"{span([at_start(fixed, k) - at_start('delta_only', k) for k in seeds], 3)} at each seed's start, "
                      f"{span(seed_pairs(runs, PRETRAINED, fixed, 'delta_only'), 3)} trained")
    return ['\n'.join(out), '\n'.join(cells), '\n'.join(per_variant), *quoted,
            *(f"{ci(t)} (Holm {p_text(adjusted[key][0])})" for key, (t, _) in trained.items())]


# ------------------------------------------------------------------------------------------------ the walk file
# the geometry study's per_seed_walk.csv: each run's walk diagnostic per depth regime at the final evaluation, for the
# attention part P and the full operator (lab/study_figures.py's geometry_figures writes it)

DIAGNOSTICS = {'drift': 'drift', 'delta_orth': 'δ_orth', 'a_eff_fro': '‖A_eff‖_F', 'gram_ratio': 'Gram dominance'}


def read_walk(path):
    """{(setting, variant, seed, part, diagnostic, regime): value} of a walk file (values written with repr: exact)."""
    return {k: float(r['value']) for k, r in
            keyed_rows(path, lambda r: (*run_key(r), r['part'], r['diagnostic'], r['regime']))[1].items()}


def walk_tests(walk):
    """{(setting, variant, part, diagnostic, regime): (PairedTest, Holm p, family size, attention's mean)}: each
    variant's part minus attention, paired by seed, Holm within variant × part over every diagnostic, regime and
    setting: the families the geometry report forms."""
    cells = dict.fromkeys((st, v, part, d, r) for st, v, _, part, d, r in walk if v != 'attention')
    tests = {}
    for setting, variant, part, diagnostic, regime in cells:
        base = {k: x for (st, v, k, _, d, r), x in walk.items()
                if (st, v, d, r) == (setting, 'attention', diagnostic, regime)}  # attention's part P, by seed
        seeds = sorted(k for k in base if (setting, variant, k, part, diagnostic, regime) in walk)
        test = paired_test([walk[(setting, variant, k, part, diagnostic, regime)] - base[k] for k in seeds])
        tests[(setting, variant, part, diagnostic, regime)] = (test, statistics.fmean(base.values()))
    adjusted = holm_within({k: t for k, (t, _) in tests.items()}, lambda k: k[1:3])  # variant × part
    return {k: (t, *adjusted[k], base) for k, (t, base) in tests.items()}


def walk_cell_name(key):
    setting, variant, part, diagnostic, regime = key
    return (f"{VARIANT_NAMES.get(variant, variant)}: {part}, {DIAGNOSTICS.get(diagnostic, diagnostic)}, {regime}, "
            f"{CORPORA.get(setting.split('/')[0], setting)}")


def walk_section():
    """results_recomputed.md's geometry section: every cell of the walk file with p < 0.05 before Holm."""
    path = os.path.join(PER_SEED, 'geometry_walk.csv')
    if not os.path.exists(path):
        return []
    tests = walk_tests(read_walk(path))
    families = {k[1:3]: max(m for j, (_, _, m, _) in tests.items() if j[1:3] == k[1:3]) for k in tests}
    sizes = sorted(set(families.values()))
    out = [f"## `geometry`'s walk: {len(tests)} cells ([per_seed/geometry_walk.csv](per_seed/geometry_walk.csv))", '',
           "Each run's diagnostic at the final evaluation, per depth regime, minus attention's on the same seed. Holm: "
           f"one family per variant and part ({len(families)}, of m = {'/'.join(map(str, sizes))}: every diagnostic × "
           "regime × corpus). Only the cells with p < 0.05 before Holm:", '',
           "| variant: part, diagnostic, layers, corpus | attention | difference, mean ± SD [95 % CI] | p | Holm p | "
           "verdict |", '|---|---|---|---|---|---|']
    for key, (t, p_holm, m, base) in tests.items():
        if t.p < 0.05:
            out.append(f"| {walk_cell_name(key)} | {base:.3g} | {t.mean:+.3g} ± {t.sd:.2g} [{t.low:+.3g}, {t.high:+.3g}] | "
                       f"{fmt_p(t.p)} | {fmt_p(p_holm)} | {verdict_words(t, p_holm)} |")
    return out + ['', "The walk's slopes on γ̄ need each run's whole series: `python -m lab.sweep --study=geometry "
                  "--report_only=True` on the runs.", '']


def geometry_quotes(walk):
    """What studies.md states of the walk: a table of the cells its reading rests on (the attention part's δ_orth in
    the initial layers, the full operator's ‖A_eff‖_F there for the corridor and fixed γ = −0.1) and every cell passing
    Holm, each with its Holm p and the word it earns; the corridor's drift cells in one sentence; how many cells pass
    Holm."""
    tests = walk_tests(walk)
    ts, wt = 'shakespeare_char/small', 'wikitext2_char/small'
    shown = [(s, 'corridor', 'P', 'delta_orth', 'initial') for s in (ts, wt)]
    shown += [(s, v, 'operator', 'a_eff_fro', 'initial') for v in ('corridor', 'fixed_gamma=-0.1') for s in (ts, wt)]
    passing = [k for k, (_, p_holm, _, _) in tests.items() if p_holm < 0.05]
    table = ["| variant: part, diagnostic, layers, corpus | attention | − attention [95 % CI] | p | Holm p | verdict |",
             '|---|---|---|---|---|---|']
    for key in dict.fromkeys(shown + passing):
        t, p_holm, m, base = tests[key]
        table.append(f"| {walk_cell_name(key)} | {base:.2f} | {sig3(t.mean, t.mean)} [{sig3(t.low, t.mean)}, "
                     f"{sig3(t.high, t.mean)}] | {p_text(t.p)} | {p_text(p_holm)} | {verdict_words(t, p_holm)} |")
    drift = [k for k in tests if k[1:4] == ('corridor', 'operator', 'drift') and tests[k][0].p < 0.05]
    where = '; '.join(f"{' and '.join(k[4] for k in drift if k[0] == s)} layers on {CORPORA[s.split('/')[0]]}"
                      for s in dict.fromkeys(k[0] for k in drift))
    holm_drift = [tests[k][1] for k in drift]
    return ['\n'.join(table),
            f"its drift between layers {'rises' if all(tests[k][0].mean > 0 for k in drift) else 'moves'} in "
            f"{len(drift)} regimes ({where}: p {min(tests[k][0].p for k in drift):.3f}–"
            f"{max(tests[k][0].p for k in drift):.3f} before Holm, "
            + ('none significant after it' if min(holm_drift) >= 0.05 else 'some significant after it')
            + f", Holm {min(holm_drift):.2f}–{max(holm_drift):.2f})" if drift else "its drift passes no test",
            f"{len(passing)} of the {len(tests)} cells pass Holm"]


# ------------------------------------------------------------------------------------------------ the token multiplier
# token_multiplier's attention runs at longer budgets (seeds 300-307) and corridor_settled's published runs at 1× (X4,
# seeds 300-323): attention's final loss fitted on x = ln(tokens / 1×'s tokens) within seed, and solved for the budget
# where it reaches a variant's 1× loss, m = exp(D / β); its CI a paired bootstrap over seeds, stratified (studies.md
# names the method before its runs).

MULTIPLIER_BASE = 'wikitext2_char/small-x4'  # the 1× budget: corridor_settled's runs and the corridor from γ0 = −0.1
MULTIPLIER_BUDGETS = ('wikitext2_char/small-x4-1.1x', 'wikitext2_char/small-x4-1.2x', 'wikitext2_char/small-x4-1.4x')
MULTIPLIER_VARIANTS = {'corridor': 'learnable corridor (γ0 = 0)', 'fixed_gamma=-0.1': 'fixed γ = −0.1, δ = 1',
                       'corridor_start': 'learnable corridor from γ0 = −0.1'}  # the last: beside the tests, not a test
RESAMPLES = 10_000


def attention_points(runs, budgets=MULTIPLIER_BUDGETS):
    """{seed: [(x, final val loss)]} of attention at 1× and at the longer budgets it has, x = ln(tokens / 1×'s)."""
    base = {k: r for (s, v, k), r in runs.items() if (s, v) == (MULTIPLIER_BASE, 'attention')}
    points = {}
    for (s, v, k), r in sorted(runs.items(), key=lambda kr: (kr[0][2], kr[0][0])):
        if v == 'attention' and k in base and s in (MULTIPLIER_BASE, *budgets):
            points.setdefault(k, []).append((math.log(int(r['tokens']) / int(base[k]['tokens'])), r['val_loss']))
    return points


def within_slope(points):
    """The least-squares slope of y on x with each seed's own intercept (its means removed), over the seeds with two
    points or more: Σ (x − x̄_s)(y − ȳ_s) / Σ (x − x̄_s)²; NaN without two points in any seed."""
    sxy = sxx = 0.0
    for pairs in points:
        if len(pairs) > 1:
            x_bar, y_bar = (statistics.fmean(column) for column in zip(*pairs))
            sxy += sum((x - x_bar) * (y - y_bar) for x, y in pairs)
            sxx += sum((x - x_bar) ** 2 for x, _ in pairs)
    return sxy / sxx if sxx > 0 else float('nan')


def multiplier_of(points, gains):
    """m = exp(D / β): D the mean gain (a list, one per seed), β attention's within-seed slope on ln tokens (points: a
    list of each seed's (x, y) pairs); ∞ where β ≥ 0 (attention not improving with tokens), NaN where β is."""
    beta, gain = within_slope(points), statistics.fmean(gains)
    if not math.isfinite(beta):
        return float('nan')
    return math.exp(gain / beta) if beta < 0 else math.inf


def within_quadratic(points):
    """(b1, b2) of y = a_s + b1·x + b2·x², least squares with each seed's own intercept a_s (its means of x, x² and y
    removed) over the seeds with three points or more: b1 is the slope at x = 0, the 1× budget, b2 the curvature
    every seed shares; NaNs without three budgets."""
    suu = suw = sww = suy = swy = 0.0
    for pairs in points:
        if len(pairs) > 2:
            xs, ys = zip(*pairs)
            x_bar, q_bar, y_bar = statistics.fmean(xs), statistics.fmean(x * x for x in xs), statistics.fmean(ys)
            for x, y in pairs:
                u, w, v = x - x_bar, x * x - q_bar, y - y_bar
                suu, suw, sww, suy, swy = suu + u * u, suw + u * w, sww + w * w, suy + u * v, swy + w * v
    det = suu * sww - suw * suw
    if not det > 1e-12 * suu * sww:  # fewer than three distinct budgets: x and x² are one column
        return float('nan'), float('nan')
    return (sww * suy - suw * swy) / det, (suu * swy - suw * suy) / det


def quadratic_multiplier(points, gains):
    """m from attention's quadratic in x anchored at 1× (within_quadratic): x the root nearest 0 of b1·x + b2·x² = D,
    m = exp(x), so curvature in attention's curve does not bend m as a line through all four budgets does; ∞ where
    the slope at 1× is not negative or the curve turns before it comes down to D; NaN where it cannot be fitted."""
    (b1, b2), gain = within_quadratic(points), statistics.fmean(gains)
    if not (math.isfinite(b1) and math.isfinite(b2)):
        return float('nan')
    discriminant = b1 * b1 + 4 * b2 * gain
    if b1 >= 0 or discriminant < 0:
        return math.inf
    return math.exp(2 * gain / (b1 - math.sqrt(discriminant)))  # the small root, written so b2 = 0 gives D / b1


def curvature(points):
    """How attention's final loss bends in x (points: each curve seed's (x, y) at every budget, the same x's): the mean
    slope between consecutive budgets, the F test of a shared quadratic term against the within-seed line (F, its
    df (1, runs − seeds − 2), p) and how many seeds' own quadratics curve upward."""
    seeds = [sorted(pairs) for pairs in points if len(pairs) > 2]
    steps = [statistics.fmean((p[i + 1][1] - p[i][1]) / (p[i + 1][0] - p[i][0]) for p in seeds)
             for i in range(len(seeds[0]) - 1)]
    beta, (b1, b2) = within_slope(seeds), within_quadratic(seeds)

    def rss(fitted):
        total = 0.0
        for pairs in seeds:
            residuals = [y - fitted(x) for x, y in pairs]
            total += sum((r - statistics.fmean(residuals)) ** 2 for r in residuals)
        return total
    line, quadratic = rss(lambda x: beta * x), rss(lambda x: b1 * x + b2 * x * x)
    df = sum(map(len, seeds)) - len(seeds) - 2
    extra = max(line - quadratic, 0.0)  # the line is the quadratic with b2 = 0: never closer but for rounding
    f = extra / (quadratic / df) if quadratic > 0 else math.inf if extra > 0 else float('nan')
    upward = sum(within_quadratic([pairs])[1] > 0 for pairs in seeds)
    return steps, (f, df, t_two_sided_p(math.sqrt(f), df)), upward, len(seeds)


class Multiplier(NamedTuple):
    m: float
    ci: tuple            # its 95 % CI (low, high): percentiles of the draws
    beta: float          # attention's within-seed slope on x over the budgets fitted
    gain: float          # D: the variant − attention at 1×, mean over seeds
    seeds: list          # the seeds of D
    curve: list          # the curve seeds (a longer budget too)
    runs: int            # attention's runs in the fit
    draws: list          # the bootstrap resamples' m, in draw order


def token_multiplier(runs, variant, budgets=MULTIPLIER_BUDGETS, resamples=RESAMPLES, estimate=multiplier_of):
    """The pre-registered estimate for one variant at 1× (estimate: multiplier_of; quadratic_multiplier for the
    curvature check), a Multiplier. runs: corridor_settled's and token_multiplier's per-seed rows together. The CI:
    `resamples` paired bootstrap resamples over seeds (random.Random(0)), stratified: as many seeds drawn with
    replacement from the curve seeds as there are, and from the other seeds of D likewise; a drawn seed brings its gain
    and its curve, so β and D come from the same seeds; the 2.5 and 97.5 percentiles of m (order statistics
    ⌊0.025·B⌋ + 1 and ⌈0.975·B⌉). Every estimate sees the same resamples."""
    points = attention_points(runs, budgets)
    gains = {k: runs[(MULTIPLIER_BASE, variant, k)]['val_loss'] - runs[(MULTIPLIER_BASE, 'attention', k)]['val_loss']
             for k in sorted(points) if (MULTIPLIER_BASE, variant, k) in runs}
    curve = [k for k in gains if len(points[k]) > 1]
    rest = [k for k in gains if len(points[k]) < 2]
    m = estimate([points[k] for k in curve], list(gains.values())) if gains else float('nan')
    if not curve or not gains:
        return Multiplier(m, (float('nan'), float('nan')), float('nan'), float('nan'), sorted(gains), curve, 0, [])
    rng, draws = random.Random(0), []
    for _ in range(resamples):
        seeds = [rng.choice(curve) for _ in curve] + [rng.choice(rest) for _ in rest]
        draws.append(estimate([points[k] for k in seeds if k in curve], [gains[k] for k in seeds]))
    return Multiplier(m, percentiles(draws), within_slope([points[k] for k in curve]), statistics.fmean(gains.values()),
                      sorted(gains), curve, sum(len(points[k]) for k in curve), draws)


def percentiles(draws):
    """The 95 % percentile interval of bootstrap draws: order statistics ⌊0.025·B⌋ + 1 and ⌈0.975·B⌉."""
    ordered = sorted(draws)
    return ordered[math.floor(0.025 * len(ordered))], ordered[math.ceil(0.975 * len(ordered)) - 1]


# ------------------------------------------------------------------------------------------------ the compute multiplier
# per_seed/throughput.csv (lab/bench.py --preset corridor_settled --pairs_csv): the training step of the study's model
# timed in pairs, attention and corridor interleaved, eager (as the study's runs trained: compile=False) and compiled

THROUGHPUT_MODES = {'eager': "eager (the study's runs)", 'compiled': 'compiled'}


def read_throughput(path=None):
    """{(mode, pair): row} of throughput.csv, the seconds as floats."""
    path = os.path.join(PER_SEED, 'throughput.csv') if path is None else path
    rows = keyed_rows(path, lambda r: (r['mode'], int(r['pair'])))[1]
    return {k: {**r, 'attention_seconds': float(r['attention_seconds']), 'corridor_seconds': float(r['corridor_seconds'])}
            for k, r in rows.items()}


def throughput_ratio(pairs, mode):
    """r, the corridor's training throughput over attention's in one mode, and its 95 % CI: a PairedTest of the pairs'
    ln(attention seconds / corridor seconds) (one pair: the same steps, tokens and thread) in pair order, over the
    means of 20 batches of consecutive pairs (lab/stats.log_ratio_test: neighbours share the machine's load, so single
    pairs would make the interval too narrow); r = exp(its mean)."""
    timed = [r for (m, _), r in sorted(pairs.items()) if m == mode]
    return log_ratio_test([r['attention_seconds'] for r in timed], [r['corridor_seconds'] for r in timed])


def compute_multiplier(multiplier, ratio, seed=1):
    """c = m·r, attention's wall time to the variant's loss over the variant's (m the tokens, 1 / r the time a token),
    and its 95 % CI from both intervals: each bootstrap draw of m times an independent draw of r, exp(mean + SE·t)
    with t from Student's t on the batches' n − 1 df (random.Random(seed): a normal over the root of a χ² over its
    df), whose spread is r's t-interval; the 2.5 and 97.5 percentiles of the products."""
    c = multiplier.m * math.exp(ratio.mean)
    if ratio.n < 2 or not multiplier.draws:
        return c, (float('nan'), float('nan'))
    rng, df, se = random.Random(seed), ratio.n - 1, ratio.sd / math.sqrt(ratio.n)
    draws = [m * math.exp(ratio.mean + se * rng.gauss(0, 1) / math.sqrt(rng.gammavariate(df / 2, 2) / df))
             for m in multiplier.draws]
    return c, percentiles(draws)


def compute_words(low, high):
    """Whether c's CI shows a compute-matched gain at this size, in words."""
    if low > 1:
        return "shown: attention needs more compute to reach the corridor's loss"
    if high < 1:
        return "no: attention reaches the corridor's loss with less compute"
    return "not shown: the CI includes 1"


def compute_table(pairs, linear, quadratic):
    """The compute multiplier's table (per mode: pairs, r, c from the linear m and from the quadratic m, the words) and
    how the pairs were timed, for the learnable corridor (the variant the bench times)."""
    out = ["| training step timed | pairs | r: corridor ÷ attention throughput [95 % CI] | c = m·r, m linear [95 % CI] "
           "| c, m quadratic [95 % CI] | compute-matched gain at this size |",
           '|---|---|---|---|---|---|']
    for mode, label in THROUGHPUT_MODES.items():
        ratio = throughput_ratio(pairs, mode)
        if not ratio.n:
            continue
        r = f"{math.exp(ratio.mean):.3f} [{math.exp(ratio.low):.3f}, {math.exp(ratio.high):.3f}]" if ratio.n > 1 else \
            f"{math.exp(ratio.mean):.3f}"
        (c, (low, high)), (q, (q_low, q_high)) = (compute_multiplier(m, ratio) for m in (linear, quadratic))
        out.append(f"| {label} | {sum(m == mode for m, _ in pairs):,} | {r} | {times(c)} [{times(low)}, {times(high)}] | "
                   f"{times(q)} [{times(q_low)}, {times(q_high)}] | {compute_words(low, high)} |")
    setup = {key: sorted({str(r[key]) for r in pairs.values()}) for key in ('steps', 'tokens_per_step', 'threads',
                                                                             'torch', 'device')}
    return ['\n'.join(out),
            f"Each pair: {'/'.join(setup['steps'])} training step{'' if setup['steps'] == ['1'] else 's'} of "
            f"{'/'.join(setup['tokens_per_step'])} tokens per variant, interleaved, on {'/'.join(setup['device'])}, "
            f"{'/'.join(setup['threads'])} thread{'' if setup['threads'] == ['1'] else 's'}, torch "
            f"{'/'.join(setup['torch'])}."]


def read_curves(study):
    """{(setting, variant, seed): [(iter, tokens, val loss, train loss)] in iteration order} of NAME_curves.csv."""
    curves = {}
    rows = keyed_rows(os.path.join(PER_SEED, f'{study}_curves.csv'), curve_key)[1]
    for (*key, _), r in rows.items():
        curves.setdefault(tuple(key), []).append((int(r['iter']), int(r['tokens']), float(r['val_loss']),
                                                  float(r['train_loss'])))
    return {key: sorted(points) for key, points in curves.items()}


def check_curves(runs, curves):
    """Each run's curve ends where its per-seed row does (iteration, tokens, final val loss, exactly): the curves file
    and the per-seed file are one set of runs. The runs checked."""
    for key, r in runs.items():
        if key not in curves or curves[key][-1][:3] != (int(r['iter']), int(r['tokens']), r['val_loss']):
            raise UserError(f"docs/per_seed: {key}'s curve does not end at its per-seed row's final loss")
    if extra := sorted(curves.keys() - runs.keys()):
        raise UserError(f"docs/per_seed: {extra[0]} has a curve but no per-seed row")
    return len(runs)


def times(m):
    return '∞' if m == math.inf else f"{m:.3f}"


def token_multiplier_tables(runs, settled=None, curves=None, throughput=None):
    """token_multiplier's numbers from its per-seed file (runs), its curves and corridor_settled's per-seed file: per
    variant at 1× the multiplier m with its bootstrap CI, β, D, m from attention's quadratic in ln tokens anchored at
    1× (the curvature check) and m from the 1× and 1.1× budgets alone (the sensitivity named with the plan); how
    attention's curve bends; the corridor from γ0 = −0.1 against fixed γ = −0.1 and against the corridor from γ0 = 0
    (Holm over the two); where its γ̄ ends against the corridor from γ0 = 0's, paired by seed; and, from
    per_seed/throughput.csv (throughput: read_throughput's rows), the compute multiplier of the learnable corridor, or
    that it is not measured. Each table a string."""
    settled = read_file('corridor_settled') if settled is None else settled
    check_curves(runs, read_curves('token_multiplier') if curves is None else curves)
    if throughput is None and os.path.exists(os.path.join(PER_SEED, 'throughput.csv')):
        throughput = read_throughput()
    both = {**settled, **runs}
    out = ["| variant at 1× (4,800 iterations) | D (seeds) | β (curve seeds, runs) | m, linear (pre-registered) [95 % CI] "
           "| tokens at m | m, quadratic [95 % CI] | m from 1× and 1.1× alone [95 % CI] |", '|---|---|---|---|---|---|---|']
    corridor = None
    for variant, label in MULTIPLIER_VARIANTS.items():
        linear = token_multiplier(both, variant)
        m, (low, high), beta, gain, seeds, curve, n, _ = linear
        if not seeds:
            continue
        quadratic = token_multiplier(both, variant, estimate=quadratic_multiplier)
        local, (local_low, local_high), *_ = token_multiplier(both, variant, MULTIPLIER_BUDGETS[:1])
        tokens = int(both[(MULTIPLIER_BASE, 'attention', seeds[0])]['tokens'])
        out.append(f"| {label} | {signed(gain, 5)} ({len(seeds)}) | {signed(beta, 4)} ({len(curve)}, {n}) | "
                   f"{times(m)} [{times(low)}, {times(high)}] | {m * tokens / 1e6:.2f}M | "
                   f"{times(quadratic.m)} [{times(quadratic.ci[0])}, {times(quadratic.ci[1])}] | "
                   f"{times(local)} [{times(local_low)}, {times(local_high)}] |")
        if variant == 'corridor':
            corridor = linear, quadratic
    points = attention_points(both)
    shape = "Attention's curve: fewer than three budgets, no curvature to measure."
    if sum(len(p) > 2 for p in points.values()) > 1:
        steps, (f, df, p), upward, n_curves = curvature(list(points.values()))
        (b1, _), beta = within_quadratic(list(points.values())), within_slope(list(points.values()))
        shape = (f"Attention's curve ({n_curves} curve seeds): its mean slope between consecutive budgets "
                 f"{', '.join(signed(x, 3) for x in steps)}; a quadratic term shared by the seeds F(1, {df}) = {f:.1f}, "
                 f"p {p_text(p)}, curving upward in {upward} of {n_curves} seeds; the quadratic's slope at 1× "
                 f"{signed(b1, 4)} against the line's {signed(beta, 4)}.")
    compute = ["Compute multiplier: not measured (no per_seed/throughput.csv)."]
    if throughput and corridor:
        compute = compute_table(throughput, *corridor)
    tests = {}
    for other in ('fixed_gamma=-0.1', 'corridor'):
        differences = seed_pairs(both, MULTIPLIER_BASE, 'corridor_start', other)
        if differences:
            tests[other] = paired_test(differences)
    adjusted = holm_within(tests, lambda key: 'the γ0 = −0.1 arm')
    arm = ["| test (paired by seed, Holm over 2) | mean [95 % CI] | p | Holm p | MDE | seeds below 0 | verdict |",
           '|---|---|---|---|---|---|---|']
    for other, t in tests.items():
        below = sum(d < 0 for d in seed_pairs(both, MULTIPLIER_BASE, 'corridor_start', other))
        name = MULTIPLIER_VARIANTS[other]
        if t.n > 1:
            arm.append(f"| corridor from γ0 = −0.1 − {name} | {row_cells(t, adjusted[other][0], None, below)} |")
        else:
            arm.append(f"| corridor from γ0 = −0.1 − {name} | {signed(t.mean, 5)} | – | – | – | {below}/1 | no test |")
    gammas = [float(both[(MULTIPLIER_BASE, 'corridor_start', k)]['gamma_mean'])
              - float(both[(MULTIPLIER_BASE, 'corridor', k)]['gamma_mean'])
              for k in sorted(k for s, v, k in both if (s, v) == (MULTIPLIER_BASE, 'corridor_start'))
              if (MULTIPLIER_BASE, 'corridor', k) in both]
    g = paired_test(gammas)
    where = (f"Final γ̄ of the corridor from γ0 = −0.1 − from γ0 = 0, paired by seed ({g.n} seeds): "
             + (f"{signed(g.mean, 3)} [{signed(g.low, 3)}, {signed(g.high, 3)}]" if g.n > 1 else
                signed(g.mean, 3) if g.n else 'no run yet'))
    if not tests:
        arm = ["The corridor from γ0 = −0.1: no run yet."]
    return ['\n'.join(out), shape, '\n'.join(arm), where, *compute]


def token_multiplier_section(runs):
    """results_recomputed.md's lines for token_multiplier: its tables, interim or not."""
    curve = {k for s, v, k in runs if v == 'attention' and s in MULTIPLIER_BUDGETS}
    timed = os.path.exists(os.path.join(PER_SEED, 'throughput.csv'))
    lines = ["The multiplier m = exp(D / β) and the γ0 = −0.1 arm, with corridor_settled's runs at 1× and "
             "[per_seed/token_multiplier_curves.csv](per_seed/token_multiplier_curves.csv): β attention's within-seed "
             f"slope of final loss on ln tokens, the CI {RESAMPLES:,} stratified paired bootstrap resamples over seeds "
             "(studies.md, `--study=token_multiplier`)."
             + (" With one seed at the longer budgets the bootstrap cannot vary β: the CI is D's alone." if len(curve) == 1
                else '')
             + " The curvature check: attention's loss as a quadratic in ln tokens with each seed's intercept, m = exp(x) "
             "at the root nearest 0 of b1·x + b2·x² = D, on the same resamples."
             + (" The compute multiplier c = m·r: r the corridor's training throughput over attention's, exp of the mean "
                "of the timed pairs' ln(attention seconds / corridor seconds) with its t-interval "
                "([per_seed/throughput.csv](per_seed/throughput.csv)); c's CI: each resample of m times an independent "
                "draw of r from its t distribution, the 2.5 and 97.5 percentiles." if timed else '')]
    for text in token_multiplier_tables(runs):
        lines += ['', text]
    return lines + ['']


SECTIONS = {'token_multiplier': token_multiplier_section}  # a study whose runs pair with another's: its own lines


TABLES = {'claims': claims_table, 'fixed_gamma': fixed_gamma_table, 'replication': replication_quotes,
          'fixed_gamma_powered': fixed_gamma_powered_table, 'corridor_settled_pilot': corridor_settled_pilot_table,
          'corridor_settled': corridor_settled_table, 'geometry_walk': geometry_quotes, 'scales': scales_table,
          'ladder': ladder_table, 'gamma_dynamics': gamma_dynamics_table, 'pretrained': pretrained_tables,
          'token_multiplier': token_multiplier_tables}
PAGES = {'pretrained': 'pretrained.md'}  # the page in docs/ of a study's tables where it is not studies.md


def planned_runs(study, runs):
    """(runs in the file, runs the study plans (lab.studies.STUDIES)); a walk or curves file counts its runs, not its
    rows; a file of no study: its own count twice."""
    name = study.removesuffix('_walk').removesuffix('_curves')
    have = len({key[:3] for key in runs}) if name != study else len(runs)  # (setting, variant, seed)
    return have, sum(len(p.variants) * p.seeds for p in STUDIES[name].parts) if name in STUDIES else have


def read_file(study):
    """A published file of docs/per_seed/: a walk file (NAME_walk.csv), a curves file (NAME_curves.csv) or a study's
    per-seed losses."""
    if study.endswith('_curves'):
        return read_curves(study.removesuffix('_curves'))
    if study == 'throughput':
        return read_throughput()
    path = os.path.join(PER_SEED, f'{study}.csv')
    return (read_walk if study.endswith('_walk') else read_per_seed)(path)


# the files beside a study's per-seed file that its renderer also reads (NAME_layers.csv, NAME_frozen.csv)
SIDE_FILES = {'gamma_dynamics': ('layers',), 'pretrained': ('layers', 'frozen'), 'token_multiplier': ('curves',)}


def study_tables():
    """{study: [its tables and quoted cells as its page (docs/studies.md, or PAGES') prints them]} for every study
    with a per-seed file (and the side files its renderer reads), a renderer here and every planned run in the file."""
    tables = {}
    for study, table in TABLES.items():
        files = [f'{study}.csv', *(f'{study}_{side}.csv' for side in SIDE_FILES.get(study, ()))]
        if all(os.path.exists(os.path.join(PER_SEED, name)) for name in files):
            runs = read_file(study)
            have, planned = planned_runs(study, runs)
            if have >= planned:  # a study still running is not on the page yet
                tables[study] = table(runs)
    return tables


def render():
    """The page's text."""
    out = ["# The CPU results recomputed: CIs, p, Holm, power", '',
           "Generated by `python docs/results_recomputed.py` from the files in [per_seed/](per_seed/), exactly (the last "
           "section: from the 4-decimal losses of the 135M study's two-seed pilot, which has no per-seed file). A row: "
           "the variant's final validation loss (nats per token) minus attention's, paired by seed (a row naming `− corridor`: minus the learnable corridor's); "
           "the mean and 95 % CI (t on n − 1 df); the two-sided paired-t p; the Holm p within the study's family of m "
           "tests; the MDE (80 % power, 5 % two-sided, noncentral t); the seeds below 0. Verdict: *lower* or "
           "*higher* (bold) when the Holm p is below 0.05, else inconclusive (within ±X), X the CI's bound farthest from 0. "
           "Below each table: each variant's final loss, mean ± SD over seeds (γ̄, δ̄ at the end, unless held in every "
           "run).", '',
           *per_seed_sections(), *walk_section(),
           "## Scales: corridor − attention against size", '',
           "Fits on log10(non-embedding parameters) per corpus; size is confounded with tokens per parameter "
           "(9.3 / 1.2 / 0.7):", '']
    scales = read_file('scales')
    for corpus, name in CORPORA.items():
        unweighted, weighted = fit_words(size_fits(scales, [f'{corpus}/{size}' for size in SIZES]))
        out.append(f"- {name}: {unweighted}; {weighted}")
    unweighted, weighted = fit_words(size_fits(read_file('ladder'), [f'shakespeare_char/{rung}' for rung in RUNGS]),
                                     'rungs')
    out += ['', "## Ladder: corridor − attention against size at 4 tokens per non-embedding parameter", '',
            "Fits on log10(non-embedding parameters), confounded with run length (the larger rungs train longer, and γ "
            "moves further):", '',
            f"- pre-registered (the primary test): {unweighted}", f"- {weighted}",
            '',
            "## SmolLM2-135M operator-only: the two-seed pilot of corridor and δ only (pretrained.md), one family", '',
            "From its final losses, kept here to 4 decimals (FIRST_RUN); 1 df per test.", '', *HEADER]
    first = [(f"{a} − {b}", 'WikiText-2 (SmolLM2 tokens)', paired_test([x - y for x, y in zip(FIRST_RUN[a], FIRST_RUN[b])]))
             for a, b in (('corridor', 'δ only'), ('corridor', 'frozen model'), ('δ only', 'frozen model'))]
    out += rows([(label, corpus, t.mean, t.sd, t.n) for label, corpus, t in first], lambda c: 'first run')
    out += ['', "Claim (b), a share of heads per seed, is not a paired difference: `gamma_dynamics_table` renders it on "
            "studies.md.", '']
    return '\n'.join(out) + '\n'


# what a report folder holds (lab/reports.py, lab/study_figures.py) -> the published file's suffix, each row's key and
# its order in the file (settings in the study's order, then as a report writes them)
REPORT_FILES = {'': ('per_seed.csv', run_key, lambda k, at: (at(k[0]), k[2], k[1])),
                'layers': ('per_seed_layers.csv', layer_key, lambda k, at: (at(k[0]), k[2], k[1], k[3])),
                'frozen': ('per_batch_frozen.csv', batch_key, lambda k, at: (at(k[0]), k[1], k[2])),
                'curves': ('per_seed_curves.csv', curve_key, lambda k, at: (at(k[0]), k[2], k[1], k[3]))}


def append_report(study, folder):
    """Add more runs of a study (its report folder, R/STUDY, written by `lab.sweep --report_only=True` at this code)
    to the study's published files: per_seed.csv, and the side files its tables read. For a study trained in parts
    whose run folders are not kept together. Refused, writing nothing: a run the study does not plan,
    a report lacking a column the published file has (a report from older code), and a run (layer, batch) already
    published that comes back with other numbers (every column both fill but the wall time `seconds`: a run trained
    again). A column only the new rows have is left empty in the old ones. {published file: rows added}."""
    if study not in STUDIES:
        raise UserError(f"no study {study!r} (lab/studies.py's STUDIES)")
    settings = list(dict.fromkeys(part.setting for part in STUDIES[study].parts))
    planned = {(part.setting, parse_variant(v)[0], seed) for part in STUDIES[study].parts for v in part.variants
               for seed in range(part.first_seed, part.first_seed + part.seeds)}
    merged = {}
    for side in ('', *SIDE_FILES.get(study, ())):
        report_name, key, order = REPORT_FILES[side]
        source, published = os.path.join(folder, report_name), os.path.join(PER_SEED, f"{study}{'_' * bool(side)}{side}.csv")
        if not os.path.isfile(source):
            raise UserError(f"{source} not found: the report folder of `lab.sweep --study={study} --report_only=True`")
        fields, new = keyed_rows(source, key)
        old_fields, old = keyed_rows(published, key) if os.path.exists(published) else (fields, {})
        if missing := [c for c in old_fields if c not in fields]:
            raise UserError(f"{source} lacks {', '.join(missing)}, which {published} has: report the runs with this "
                            f"code (`python -m lab.sweep --study={study} --report_only=True`)")
        if side != 'frozen' and (unplanned := sorted(k[:3] for k in new if k[:3] not in planned)):
            raise UserError(f"{source}: {unplanned[0]} is not a run of the study {study!r}"
                            + (f" (and {len(unplanned) - 1} more)" if len(unplanned) > 1 else ''))
        for k in old.keys() & new.keys():
            if any(old[k][c] not in ('', new[k][c]) and new[k][c] != '' for c in old_fields if c != 'seconds'):
                raise UserError(f"{source}: {k} comes back with other numbers than {published} holds")
        runs = {**new, **{k: {**new.get(k, {}), **{c: v for c, v in row.items() if v != ''}} for k, row in old.items()}}
        seen = settings + [s for s in dict.fromkeys(k[0] for k in runs) if s not in settings]
        merged[published] = ([*old_fields, *(c for c in fields if c not in old_fields)],
                             sorted(runs.items(), key=lambda kr: order(kr[0], seen.index)), len(new.keys() - old.keys()))
    for published, (fields, runs, _) in merged.items():  # every file checked before any is written
        with atomic_write(published) as f:
            writer = csv.DictWriter(f, fields, restval='', lineterminator='\n')
            writer.writeheader()
            writer.writerows(row for _, row in runs)
    return {published: added for published, (_, _, added) in merged.items()}


def per_seed_figure(study, folder):
    """A pre-registered study's per-seed figure, as its report draws it (lab/study_figures.py's PREREGISTERED: a panel
    per setting, a column per `variant − attention` with its role, one dot per seed, mean and 95 % CI), from its
    published file alone, into folder/its image: for a study gathered in parts, whose report folders (and so its
    report's figure) each hold some of its runs. The path of the image."""
    if study not in PREREGISTERED:
        raise UserError(f"--figure draws a pre-registered study's per-seed figure: {', '.join(PREREGISTERED)}, "
                        f"not {study!r}")
    path = os.path.join(PER_SEED, f'{study}.csv')
    if not os.path.isfile(path):
        raise UserError(f"{path} not found: {study!r} has no published per-seed file yet")
    runs = read_per_seed(path)
    _, image, comparisons = PREREGISTERED[study]
    panels = []
    for setting in dict.fromkeys(s for s, _, _ in runs):
        columns = [(comparison_label(v, role), seed_pairs(runs, setting, v, 'attention')) for v, role in comparisons]
        if not any(differences for _, differences in columns):
            raise UserError(f"{path}: no run of {setting} pairs with an attention run of its seed")
        panels.append((setting, columns))
    draw_preregistered(panels, os.path.join(folder, image))
    return os.path.join(folder, image)


USAGE = "usage: python docs/results_recomputed.py [--append STUDY REPORT_FOLDER | --figure STUDY]"


def main():
    args = sys.argv[1:]
    if args[:1] == ['--figure']:
        if len(args) != 2:
            raise UserError(USAGE)
        image = per_seed_figure(args[1], os.path.dirname(os.path.abspath(__file__)))
        print(f"{os.path.relpath(image)}: drawn from docs/per_seed/{args[1]}.csv")
        return
    if args:
        if len(args) != 3 or args[0] != '--append':
            raise UserError(USAGE)
        for published, added in append_report(*args[1:]).items():
            print(f"{os.path.relpath(published)}: {added} added")
    text = render()
    with atomic_write(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results_recomputed.md')) as f:
        f.write(text)
    print(text, end='')


if __name__ == '__main__':
    main_guard(main)
