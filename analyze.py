"""
Where did the operator go? Reads run folders written by train.py and writes corridor occupancy, γ/δ plots
and run comparisons. (The sweep's statistics live in sweep.py, the connection-walk diagnostics in walk.py, the
figures it shares with them in plots.py.)

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
import json
import os
import sys

from common import UserError, atomic_write, load_run, main_guard, occupancy_report
from model import in_corridor
from plots import (plot_evolution, plot_gamma_delta, plot_loss_comparison, plot_losses, plot_occupancy,
                   plot_walk_evolution)


# ---------------------------------------------------------------------------------------------- occupancy

def layer_table(report):
    rows = ["| layer | in corridor | γ ≤ −1 | γ ≥ 0 | γ mean | γ median | δ mean |", "|---|---|---|---|---|---|---|"]
    for r in report['layers']:
        rows.append(f"| {r['layer']} | {r['occupancy']:.0%} | {r['below']} | {r['above']} | {r['gamma_mean']:+.3f} "
                    f"| {r['gamma_median']:+.3f} | {r['delta_mean']:.3f} |")
    beyond = report['occupancy_beyond_first']
    rows.append(f"\nall heads: {report['occupancy']:.0%} in the corridor"
                + (f"; layers after the first: {beyond:.0%}" if beyond is not None else ''))
    return '\n'.join(rows)


# ---------------------------------------------------------------------------------------------- one or more runs

def analyze_run(run, out):
    """Write one run's corridor.json, summary.md and plots into out; returns its occupancy report."""
    os.makedirs(out, exist_ok=True)
    report = dict(run=run['name'], iter=run['iter'], operator=run['config']['operator'],
                  **occupancy_report(run['gamma'], run['delta']))
    if run['series']:  # occupancy at every evaluation, from log.jsonl
        report['series'] = [dict(iter=it, occupancy=in_corridor(g).float().mean().item(),
                                 occupancy_by_layer=in_corridor(g).float().mean(-1).tolist())
                            for it, g, _ in run['series']]
    with atomic_write(os.path.join(out, 'corridor.json')) as f:
        json.dump(report, f, indent=1)
    scalars = report['operator'] != 'attention'  # plain attention has none: every head is (c_I, c_P) = (0, 1)
    if scalars:
        plot_occupancy({run['name']: report}, os.path.join(out, 'occupancy.png'))
        plot_gamma_delta({run['name']: (run['gamma'], run['delta'])}, os.path.join(out, 'gamma_delta.png'))
    if run['log'] and scalars:
        plot_evolution(run['log'], os.path.join(out, 'evolution.png'), run['name'])
    if run['log']:
        plot_losses({'train': ([e['tokens'] for e in run['log']], [e['train_loss'] for e in run['log']]),
                     'val': ([e['tokens'] for e in run['log']], [e['val_loss'] for e in run['log']])},
                    os.path.join(out, 'loss.png'), f"{run['name']}: loss")
        if any('walk' in e for e in run['log']):
            plot_walk_evolution({run['name']: [run['log']]}, os.path.join(out, 'walk.png'), run['name'])
    table = layer_table(report) if scalars else \
        "plain attention: every head's (c_I, c_P) is (0, 1), γ = 0, δ = 1, nothing to place in the corridor"
    header = f"# {run['name']}: operator {report['operator']}, iter {run['iter']}\n\n"
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
    if with_scalars:
        plot_occupancy({label(r): reports[r['name']] for r in with_scalars}, os.path.join(out, 'occupancy.png'))
        plot_gamma_delta({label(r): (r['gamma'], r['delta']) for r in with_scalars},
                         os.path.join(out, 'gamma_delta.png'))
    logged = [r for r in runs if r['log']]
    if len(logged) > 1:  # the first run is the reference the others are compared with
        plot_loss_comparison({label(r): ([e['tokens'] for e in r['log']], [e['val_loss'] for e in r['log']])
                              for r in logged}, os.path.join(out, 'val_loss.png'), 'validation loss')
    walked = {label(r): [r['log']] for r in runs if any('walk' in e for e in r['log'])}
    if walked:
        plot_walk_evolution(walked, os.path.join(out, 'walk.png'), 'runs compared')
    rows = [f"| run | operator | iter | final val loss | − {runs[0]['name']} | best val loss | corridor occupancy |",
            "|---|---|---|---|---|---|---|"]
    first = runs[0]['log'][-1]['val_loss'] if runs[0]['log'] else float('nan')
    for r in runs:
        final = r['log'][-1]['val_loss'] if r['log'] else float('nan')
        best = min((e['val_loss'] for e in r['log']), default=float('nan'))
        occupancy = '–' if r['config']['operator'] == 'attention' else f"{reports[r['name']]['occupancy']:.0%}"
        rows.append(f"| {r['name']} | {r['config']['operator']} | {r['iter']} | {final:.4f} | {final - first:+.4f} "
                    f"| {best:.4f} | {occupancy} |")
    rows.append("\nOne run per variant: a difference means something only against the seed-to-seed spread of the "
                "same setting; train several seeds (sweep.py) before reading a sign into it.")
    text = '\n'.join(rows)
    with atomic_write(os.path.join(out, 'summary.md')) as f:
        f.write('# Runs compared\n\n' + text + '\n')
    print(text + f"\n-> {out}")


# ---------------------------------------------------------------------------------------------- command line

def main(argv):
    if '--diagnostics' in argv:  # its old name for walk.py: say where it went rather than import another tool
        raise UserError("the connection-walk diagnostics are their own command now: python walk.py "
                        + ' '.join(a for a in argv if a != '--diagnostics'))
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
