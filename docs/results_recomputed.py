"""
The README's CPU results recomputed with lab/stats.py: 95 % CI, paired-t p, Holm p within each study's families,
MDE at 80 % power. Two sources: the per-seed files in docs/per_seed/ (one CSV a study, each run's exact final loss:
what `python -m lab.sweep --study=NAME` writes as per_seed.csv), recomputed exactly; and, for the studies whose run
folders were never kept, the summaries the README and docs/ state (mean and SD of the paired differences, seeds per
cell): p-values from a 4-decimal SD are approximate where the SD is 0.0001–0.0006. Also the ladder's two slopes
(pre-registered unweighted, precision-weighted) and the 135M study's first sitting.

    python docs/results_recomputed.py          # -> docs/results_recomputed.md
"""

import csv
import glob
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import atomic_write  # noqa: E402
from lab.reports import family  # noqa: E402  (the studies' Holm families, as their reports form them)
from lab.stats import fmt_p, holm, paired_test, summary_test, t_quantile, weighted_line_fit  # noqa: E402

PER_SEED = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'per_seed')

TS, WT = 'Tiny Shakespeare', 'WikiText-2 (char)'

# (comparison, corpus, mean, SD, n) as the README states them
CLAIMS = [
    ('corridor − attention', TS, -0.0031, 0.0006, 3), ('corridor − attention', WT, -0.0001, 0.0009, 3),
    ('α0·I + α1·P − attention', TS, -0.0031, 0.0006, 3), ('α0·I + α1·P − attention', WT, -0.0002, 0.0010, 3),
    ('αP + β(I − P) − attention', TS, -0.0031, 0.0011, 3), ('αP + β(I − P) − attention', WT, +0.0021, 0.0024, 3),
    ('γ ≥ 0 − attention', TS, +0.0005, 0.0005, 3), ('γ ≥ 0 − attention', WT, +0.0030, 0.0017, 3),
    ('fixed γ = −0.5 − attention', TS, +0.0273, 0.0157, 3), ('fixed γ = −0.5 − attention', WT, +0.0049, 0.0054, 3),
    ('Laplacian heads − attention', TS, +0.0048, 0.0108, 3), ('Laplacian heads − attention', WT, +0.0044, 0.0035, 3),
    ('spread start − attention', TS, +0.0057, 0.0068, 3), ('spread start − attention', WT, -0.0022, 0.0053, 3),
    ('(c) γ ≥ 0 − corridor', TS, +0.0036, 0.0003, 3), ('(c) γ ≥ 0 − corridor', WT, +0.0031, 0.0008, 3),
    ('α0·I + α1·P − corridor', TS, -0.0000, 0.0001, 3), ('α0·I + α1·P − corridor', WT, -0.0002, 0.0001, 3),
    ('αP + β(I − P) − corridor', TS, -0.0000, 0.0007, 3), ('αP + β(I − P) − corridor', WT, +0.0021, 0.0015, 3),
]
FIXED = {TS: (+0.0008, 0.0054, -0.0060, 0.0087, -0.0035, 0.0095, +0.0041, 0.0198, +0.0273, 0.0157, +0.0473, 0.0222,
              +0.0711, 0.0290),
         WT: (-0.0012, 0.0023, -0.0036, 0.0035, -0.0075, 0.0071, -0.0044, 0.0063, +0.0049, 0.0054, +0.0296, 0.0039,
              +0.0563, 0.0109)}
GAMMAS = (-0.05, -0.1, -0.2, -0.3, -0.5, -0.7, -0.9)
# (size, corpus, mean, SD, n, non-embedding parameters, tokens)
SCALES = [('tiny', TS, -0.0002, 0.0016, 8, 0.10e6, 0.92e6), ('tiny', WT, +0.0018, 0.0099, 8, 0.10e6, 0.92e6),
          ('small', TS, -0.0031, 0.0006, 3, 0.79e6, 0.92e6), ('small', WT, -0.0001, 0.0009, 3, 0.79e6, 0.92e6),
          ('medium-x2', TS, -0.0058, 0.0075, 3, 2.66e6, 1.84e6), ('medium-x2', WT, -0.0009, 0.0025, 3, 2.66e6, 1.84e6)]
# the ladder (studies.md, `--study=ladder`, Tiny Shakespeare, 4 tokens per non-embedding parameter): (rung,
# non-embedding parameters of its corridor runs, corridor − attention mean, its 95 % CI low, high, seeds). The page
# states the CI, not the SD: SD = half-width · √n / t_0.975(n − 1). ladder-l's three differences are stated: used as is.
LADDER = [('ladder-xs', 55_544, -0.00015, -0.00044, +0.00013, 6), ('ladder-s', 187_146, +0.00003, -0.00075, +0.00082, 6),
          ('ladder-m', 443_264, -0.0033, -0.0045, -0.0020, 6)]
LADDER_L = ('ladder-l', 1_177_590, [+0.0156, +0.0030, -0.0075])
# SmolLM2-135M operator-only, first sitting (pretrained.md, 2 seeds): final validation losses by seed, and the frozen
# model's (each run's iteration-0 loss); its three comparisons are one Holm family
SITTING = {'corridor': (3.5145, 3.5700), 'δ only': (3.5511, 3.6036), 'frozen model': (3.6343, 3.6843)}
# geometry cells the README states (variant, part, diagnostic, regime, corpus, mean, SD), 3 seeds; each family has
# 24 cells (4 diagnostics × 3 regimes × 2 corpora) of which the README gives only these
GEOMETRY = [('corridor', 'P', 'δ_orth', 'initial', WT, +0.131, 0.013), ('corridor', 'P', 'δ_orth', 'initial', TS, +0.136, 0.081),
            ('corridor', 'operator', '‖A_eff‖_F', 'initial', TS, -0.41, 0.02),
            ('corridor', 'operator', '‖A_eff‖_F', 'initial', WT, -0.74, 0.02),
            ('fixed γ = −0.5', 'operator', 'δ_orth', 'middle', TS, +1.5, 0.5),
            ('fixed γ = −0.5', 'operator', 'Gram dominance', 'middle', TS, -0.80, 0.31),
            ('fixed γ = −0.5', 'operator', 'Gram dominance', 'final', TS, -0.75, 0.04)]


def verdict_words(test, p_holm):
    if p_holm < 0.05:
        return '**lower**' if test.mean < 0 else '**higher**'
    return f"inconclusive: no effect larger than {max(abs(test.low), abs(test.high)):.2g}"


def rows(cells, family_of):
    """Markdown rows for (label, corpus, mean, sd, n) cells, Holm-adjusted within family_of(cell)."""
    tests = [summary_test(mean, sd, n) for _, _, mean, sd, n in cells]
    adjusted = [0.0] * len(cells)
    for family in dict.fromkeys(map(family_of, cells)):
        members = [i for i, c in enumerate(cells) if family_of(c) == family]
        for i, p in zip(members, holm([tests[i].p for i in members])):
            adjusted[i] = p
    out = []
    for (label, corpus, mean, sd, n), t, p_holm in zip(cells, tests, adjusted):
        m = sum(family_of(c) == family_of((label, corpus, mean, sd, n)) for c in cells)
        out.append(f"| {label} | {corpus} | {n} | {mean:+.4f} ± {sd:.4f} | [{t.low:+.4f}, {t.high:+.4f}] | {fmt_p(t.p)} "
                   f"| {fmt_p(p_holm)} ({m}) | {t.mde:.4f} | {verdict_words(t, p_holm)} |")
    return out


HEADER = ["| comparison | corpus | seeds | mean ± SD (stated) | 95 % CI | p | Holm p (family size) | MDE, 80 % | verdict |",
          "|---|---|---|---|---|---|---|---|---|"]


def read_per_seed(path):
    """{(setting, variant, seed): row} of one study's per-seed file, the losses as floats (written with repr: exact)."""
    with open(path, newline='') as f:
        return {(r['setting'], r['variant'], int(r['seed'])): {**r, 'val_loss': float(r['val_loss'])}
                for r in csv.DictReader(f)}


def per_seed_cells(study, runs):
    """Every `variant − attention` of a study's per-seed file, paired by seed within its setting, Holm-adjusted within
    the families its report uses: [(setting, variant, PairedTest, Holm p, family size, seeds below 0)]."""
    cells = []
    for setting in dict.fromkeys(s for s, _, _ in runs):
        for variant in dict.fromkeys(v for s, v, _ in runs if s == setting and v != 'attention'):
            seeds = sorted(seed for s, v, seed in runs if (s, v) == (setting, variant)
                           and (setting, 'attention', seed) in runs)
            differences = [runs[(setting, variant, k)]['val_loss'] - runs[(setting, 'attention', k)]['val_loss']
                           for k in seeds]
            if not differences:  # no attention run to pair with (a pilot)
                continue
            cells.append([setting, variant, paired_test(differences), sum(d < 0 for d in differences)])
    adjusted = {}
    for name in dict.fromkeys(family(study, v, 'attention') for _, v, _, _ in cells):
        members = [i for i, (_, v, t, _) in enumerate(cells) if family(study, v, 'attention') == name
                   and math.isfinite(t.p)]
        for i, p in zip(members, holm([cells[i][2].p for i in members])):
            adjusted[i] = (p, len(members))
    return [(s, v, t, *adjusted.get(i, (float('nan'), 0)), below) for i, (s, v, t, below) in enumerate(cells)]


def per_seed_sections():
    """A section per published study: its runs, every cell recomputed from the per-seed file."""
    out = []
    for path in sorted(glob.glob(os.path.join(PER_SEED, '*.csv'))):
        study = os.path.splitext(os.path.basename(path))[0]
        runs = read_per_seed(path)
        cells = per_seed_cells(study, runs)
        out += [f"## `{study}` from its per-seed file ({len(runs)} runs; [per_seed/{study}.csv](per_seed/{study}.csv))", '']
        if cells:
            out += ["| setting | comparison | seeds | mean [95 % CI] | p | Holm p (family size) | MDE, 80 % | seeds below "
                    "0 | verdict |", "|---|---|---|---|---|---|---|---|---|"]
        else:
            out.append("No attention run to pair with: the final losses only.")
        for setting, variant, t, p_holm, m, below in cells:
            words = verdict_words(t, p_holm) if math.isfinite(p_holm) else 'inconclusive (one seed)'
            out.append(f"| {setting} | {variant} − attention | {t.n} | {t.mean:+.5f} [{t.low:+.5f}, {t.high:+.5f}] | "
                       f"{fmt_p(t.p)} | {fmt_p(p_holm)} ({m}) | {t.mde:.5f} | {below} of {t.n} | {words} |")
        for setting in dict.fromkeys(s for s, _, _ in runs):
            means = []
            for variant in dict.fromkeys(v for s, v, _ in runs if s == setting):
                rows = [r for (s, v, _), r in runs.items() if (s, v) == (setting, variant)]
                losses = [r['val_loss'] for r in rows]
                sd = f" ± {statistics.stdev(losses):.4f}" if len(losses) > 1 else ''
                means.append(f"{variant} {statistics.fmean(losses):.4f}{sd} (γ̄ "
                             f"{statistics.fmean(float(r['gamma_mean']) for r in rows):+.3f}, δ̄ "
                             f"{statistics.fmean(float(r['delta_mean']) for r in rows):.3f})")
            out += ['', f"{setting}, final val loss (mean ± SD over seeds): " + '; '.join(means)]
        out.append('')
    return out


def fit_from_groups(groups):
    """Least squares of every seed pair's difference on log10(parameters), from the groups' (x, mean, SD, n) alone:
    the sums of squares decompose into within-group (SD²·(n − 1)) and between-group parts, so this equals the fit
    over the individual pairs."""
    n = sum(g[3] for g in groups)
    mx = sum(g[0] * g[3] for g in groups) / n
    my = sum(g[1] * g[3] for g in groups) / n
    sxx = sum(g[3] * (g[0] - mx) ** 2 for g in groups)
    slope = sum(g[3] * (g[0] - mx) * (g[1] - my) for g in groups) / sxx
    sse = sum((g[3] - 1) * g[2] ** 2 + g[3] * (g[1] - my - slope * (g[0] - mx)) ** 2 for g in groups)
    se = math.sqrt(sse / (n - 2) / sxx)
    half = t_quantile(0.975, n - 2) * se
    return slope, slope - half, slope + half, n


def ladder_rungs():
    """(rung, log10 non-embedding parameters, mean, SD, n) of the ladder's corridor − attention differences."""
    rungs = [(name, math.log10(params), mean, (high - low) / 2 * math.sqrt(n) / t_quantile(0.975, n - 1), n)
             for name, params, mean, low, high, n in LADDER]
    name, params, seeds = LADDER_L
    return rungs + [(name, math.log10(params), statistics.fmean(seeds), statistics.stdev(seeds), len(seeds))]


def ladder_fits():
    """The ladder's two slopes per tenfold non-embedding parameters: the pre-registered one, least squares over
    every seed pair (exact from the rungs' summaries, fit_from_groups), and the precision-weighted one, weighted
    least squares of the rung means with weights 1/SE² (lab.stats.weighted_line_fit: scale from the residuals, t on
    k − 2 df); with the weighted χ² of the rung means about the weighted line, which is about k − 2 if the means
    scatter only as their SEs say."""
    rungs = ladder_rungs()
    xs, means = [x for _, x, _, _, _ in rungs], [m for _, _, m, _, _ in rungs]
    weights = [n / sd ** 2 for _, _, _, sd, n in rungs]  # 1/SE²
    weighted = weighted_line_fit(xs, means, [w ** -0.5 for w in weights])
    x_bar, y_bar = (sum(w * v for w, v in zip(weights, vs)) / sum(weights) for vs in (xs, means))
    chi2 = sum(w * (m - y_bar - weighted[0] * (x - x_bar)) ** 2 for w, x, m in zip(weights, xs, means))
    return fit_from_groups([(x, m, sd, n) for _, x, m, sd, n in rungs]), weighted, chi2


def render():
    """The page's text."""
    out = ["# The CPU results recomputed: CIs, p, Holm, power", '',
           "Generated by `python docs/results_recomputed.py`: first from the per-seed files of docs/per_seed/ (exact), "
           "then from the summaries the README and docs/ state for the studies whose run folders were not kept. Each cell: the mean paired difference over seeds (final validation loss, "
           "nats per token, or the walk diagnostic), its 95 % CI (t on n − 1 df), p of the two-sided paired t-test, "
           "p Holm-adjusted within the family in brackets, and the MDE: the smallest true difference the test detects "
           "with 80 % power at 5 % two-sided given the stated SD and n (exact noncentral t). Verdict words follow "
           "the Holm p; *inconclusive* names X, the 95 % CI's bound farthest from zero: the data exclude a larger "
           "effect (unadjusted). The SDs are the README's rounded ones, so p-values built on SD 0.0001–0.0006 are "
           "approximate.", '', *per_seed_sections(),
           "## Claims study (3 seeds): families = one comparison over the two corpora (m = 2)", '', *HEADER,
           *rows(CLAIMS, lambda c: c[0]), '',
           "## Fixed γ, δ = 1 − attention (3 seeds): one family, every γ × corpus (m = 14)", '', *HEADER]
    cells = [(f'fixed γ = {g}', corpus, values[2 * i], values[2 * i + 1], 3)
             for corpus, values in FIXED.items() for i, g in enumerate(GAMMAS)]
    out += [*rows(cells, lambda c: 'grid'), '',
            "## Scales: corridor − attention: one family over the six cells (m = 6)", '',
            "The claims study's two base cells are two of these six; counted with every cell that tests claim (a), "
            "the p ≈ 0.012 cell is not significant.", '', *HEADER]
    out += rows([(f"{size} ({params / 1e6:.2f}M, {tokens / params:.1f} tokens/param)", corpus, m, sd, n)
                 for size, corpus, m, sd, n, params, tokens in SCALES], lambda c: 'scales')
    out += ['', "Least squares of every seed pair's difference on log10(non-embedding parameters), per corpus "
            "(computed exactly from the stated summaries; size is confounded with tokens per parameter, 9.2 / 1.2 / 0.7):", '']
    for corpus in (TS, WT):
        slope, low, high, n = fit_from_groups([(math.log10(p), m, sd, k) for _, c, m, sd, k, p, _ in SCALES if c == corpus])
        out.append(f"- {corpus}: {slope:+.4f} per tenfold parameters, 95 % CI [{low:+.4f}, {high:+.4f}] ({n} pairs)")
    out += ['', "## Ladder: corridor − attention at 4 tokens per non-embedding parameter, Tiny Shakespeare: one family "
            "over the four rungs (m = 4)", '',
            "The SDs are recomputed from the stated 95 % CIs (SD = half-width · √n / t_0.975(n − 1)); ladder-l's "
            "from its three stated differences.", '', *HEADER]
    out += rows([(f"{name} ({10 ** x / 1e6:.3f}M)", TS, m, sd, n) for name, x, m, sd, n in ladder_rungs()],
                lambda c: 'ladder')
    (slope, low, high, pairs), (w_slope, w_low, w_high, w_p, k), chi2 = ladder_fits()
    out += ['', "Corridor − attention against log10(non-embedding parameters), two fits of the same rungs:", '',
            f"- pre-registered, unweighted over seed pairs (the primary test): {slope:+.4f} per tenfold, 95 % CI "
            f"[{low:+.4f}, {high:+.4f}] ({pairs} pairs, t on {pairs - 2} df; every pair weighs the same, though the "
            f"rungs' SDs differ about 40×)",
            f"- precision-weighted: {w_slope:+.4f} per tenfold, 95 % CI [{w_low:+.4f}, {w_high:+.4f}], p {fmt_p(w_p)} "
            f"(weighted least squares of the {k} rung means, weights 1/SE², scale from the residuals, t on {k - 2} df; "
            f"the means scatter about the line more than their SEs allow: weighted χ² {chi2:.1f} on {k - 2} df). "
            "Confounded with run length: at equal tokens per parameter the larger rungs train longer (300 to 6,120 "
            "iterations), and γ moves further the longer a run trains.",
            '', "## Geometry (3 seeds): families = variant × part over 4 diagnostics × 3 regimes × 2 corpora (m = 24)",
            '', "The README states only these cells. Holm's p is at most 24·p (Bonferroni); for the one corridor P-cell "
            "that passed unadjusted, the other 23 P-cells have p > 0.05 (the README: one passes), so it ranks first "
            "and its Holm p is exactly 24·p. The README does not say which part its fixed γ = −0.5 cells are; taken "
            "here as the full operator.", '',
            "| variant: part | diagnostic, regime | corpus | mean ± SD | 95 % CI | p | 24·p (≥ Holm p) | verdict |",
            "|---|---|---|---|---|---|---|---|"]
    for variant, part, diagnostic, regime, corpus, mean, sd in GEOMETRY:
        t = summary_test(mean, sd, 3)
        bound = min(1.0, 24 * t.p)
        words = verdict_words(t, bound) if bound < 0.05 else 'not significant at 24·p; Holm needs the unstated cells'
        if (variant, part) == ('corridor', 'P'):
            words = verdict_words(t, bound)
        out.append(f"| {variant}: {part} | {diagnostic}, {regime} | {corpus} | {mean:+.3g} ± {sd:.2g} | "
                   f"[{t.low:+.3g}, {t.high:+.3g}] | {fmt_p(t.p)} | {fmt_p(bound)} | {words} |")
    out += ['', "The correlations with γ (r = +0.97 / +0.99, −0.92 / −0.93) pooled evaluations and seeds with the "
            "shared start; they cannot be recomputed from the README: `python -m lab.sweep --study=geometry "
            "--report_only=True` on the runs gives per-run slopes and one point per run.", '',
            "## SmolLM2-135M operator-only, the first sitting (2 seeds, pretrained.md): one family, its three "
            "comparisons (m = 3)", '',
            "From the per-seed final losses the page states (4 decimals); 1 df per test.", '', *HEADER]
    first = [(f"{a} − {b}", 'WikiText-2 (SmolLM2 tokens)', paired_test([x - y for x, y in zip(SITTING[a], SITTING[b])]))
             for a, b in (('corridor', 'δ only'), ('corridor', 'frozen model'), ('δ only', 'frozen model'))]
    out += rows([(label, corpus, t.mean, t.sd, t.n) for label, corpus, t in first], lambda c: 'first sitting')
    out += ['', "## Claim (b): a share of heads per seed, not a paired difference: its 3-seed table (`--study=gamma_dynamics`) "
            "is in studies.md.", '']
    return '\n'.join(out) + '\n'


def main():
    text = render()
    with atomic_write(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results_recomputed.md')) as f:
        f.write(text)
    print(text, end='')


if __name__ == '__main__':
    main()
