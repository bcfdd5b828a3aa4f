"""
The four real decoders side by side, from `python -m lab.walk`'s diagnostics.json: δ_orth/√d by depth regime,
trained and random-init twin, their ratio, and a least-squares line of each against log10(parameters) with its
95 % CI (lab/stats.py). Four models of three families, so the fit describes these four, not a scale law.

    python -m lab.walk smollm2-135m gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b --text wiki.test.raw \\
        --n_seqs 64 --seq_len 64 --gram_edges 16 --out walks/kept      # and again with --drop_sink --out walks/dropped
    python docs/real_decoders_fit.py walks/kept/diagnostics.json walks/dropped/diagnostics.json
"""

import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab.pretrained import parameter_count  # noqa: E402
from lab.stats import line_fit  # noqa: E402

REGIMES = ('initial', 'middle', 'final')


def rows(path):
    walks = json.load(open(path))
    sink = 'dropped' if walks['settings']['drop_sink'] else 'kept'
    for name, walk in walks.items():
        if name == 'settings':
            continue
        trained = walk['attention']['by_depth']['delta_orth_trace']
        twin = walk['random_init']['attention']['by_depth']['delta_orth_trace']
        yield name, sink, walk['d'], parameter_count(name)[0], trained, twin


def main(paths):
    table = ["| model | parameters | d | sink | δ_orth/√d initial / middle / final | random twin | trained ÷ twin |",
             "|---|---|---|---|---|---|---|"]
    fits = {}
    for path in paths:
        for name, sink, d, params, trained, twin in rows(path):
            ratio = {r: trained[r] / twin[r] for r in REGIMES}
            table.append(f"| {name} | {params / 1e6:.0f}M | {d} | {sink} | "
                         + ' / '.join(f'{trained[r]:.3f}' for r in REGIMES) + ' | '
                         + ' / '.join(f'{twin[r]:.3f}' for r in REGIMES) + ' | '
                         + ' / '.join(f'{ratio[r]:.2f}' for r in REGIMES) + ' |')
            for r in REGIMES:
                for what, value in (('δ_orth/√d', trained[r]), ('trained ÷ twin', ratio[r])):
                    fits.setdefault((sink, what, r), []).append((math.log10(params), value))
    lines = ['', "| sink | quantity | regime | slope per tenfold in parameters [95 % CI], p (n = models) |",
             "|---|---|---|---|"]
    for (sink, what, regime), points in fits.items():
        slope, low, high, p, n = line_fit([x for x, _ in points], [y for _, y in points])
        lines.append(f"| {sink} | {what} | {regime} | {slope:+.3f} [{low:+.3f}, {high:+.3f}], p {p:.2f} (n = {n}) |")
    print('\n'.join(table + lines))


if __name__ == '__main__':
    main(sys.argv[1:])
