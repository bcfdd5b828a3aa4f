"""
The lab's figures: matplotlib set up for files (no display), and the figures that more than one lab tool draws: the
connection-walk geometry a run logged over training (train.py's walk_interval), which analyze.py draws for a run
folder too, through this module, when the run has it.
"""

import matplotlib

matplotlib.use('Agg')  # files only: no display on a server, and no GUI backend to import
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)
import torch  # noqa: E402

from common import save_figure as save  # noqa: E402,F401 (the lab's tools save through it)
from lab import connection  # noqa: E402


def walk_panels():
    """(key, title) of what plot_walk_evolution draws from the log's 'walk' entries (train.py's walk_interval): the
    registry's diagnostics with a panel (lab/connection.py's DIAGNOSTICS), in the order the study reports have them."""
    return tuple((e.name, e.panel) for e in connection.in_order([e for e in connection.DIAGNOSTICS if e.panel],
                                                                 connection.PANEL_ORDER))


def walk_series(log, part, key):
    """(tokens [E], values [E, layers]) of one logged walk diagnostic over the evaluations that have it; a 'shown'
    diagnostic of the registry (gram_ratio: Ḡ's mean |diagonal| over its mean |off-diagonal|) is computed from the
    logged ones. None when the log has none: a log written before an entry was added lacks it."""
    entry = connection.diagnostic(key)
    shown = entry is not None and entry.per == 'shown'
    pairs = [(e['tokens'], entry.value(e['walk'][part]) if shown else e['walk'][part].get(key))
             for e in log if part in e.get('walk', {})]
    pairs = [(tokens, values) for tokens, values in pairs if values is not None]
    if not pairs:
        return None
    return (torch.tensor([tokens for tokens, _ in pairs], dtype=torch.float64),
            torch.tensor([values for _, values in pairs], dtype=torch.float64))


def plot_walk_evolution(groups, path, title):
    """groups: {label: [log, ...]} (e.g. a variant's seeds). Every walk diagnostic that some log has against tokens
    seen, one column per layer, the mean γ of the layer's heads in the last row; one colour per group, one thin line
    per log; the attention part solid, the full operator c_I·I + c_P·P dashed."""
    n_layer = len(next(iter(groups.values()))[0][-1]['gamma'])
    panels = walk_panels()
    logs = [log for group in groups.values() for log in group]
    panels = [(key, name) for key, name in panels  # a row for what some log has: older logs lack newer entries
              if any(walk_series(log, part, key) is not None for log in logs for part in ('attention', 'operator'))]
    rows = len(panels) + 1
    between = set()  # the rows whose diagnostic is between adjacent layers (drift): the last layer has none
    fig, axes = plt.subplots(rows, n_layer, figsize=(3.1 * n_layer, 2.2 * rows), sharex=True, squeeze=False)
    for color, (label, logs) in enumerate(groups.items()):
        for k, log in enumerate(logs):
            for row, (key, name) in enumerate(panels):
                for part, style in (('attention', '-'), ('operator', '--')):
                    series = walk_series(log, part, key)
                    if series is None:
                        continue
                    tokens, values = series
                    if values.shape[1] < n_layer:
                        between.add(row)
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
    for row in between:
        axes[row][-1].text(0.5, 0.5, 'the last layer\nhas no next layer', ha='center', va='center', fontsize=8,
                           transform=axes[row][-1].transAxes)
        axes[row][-1].set_yticks([])
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f'{title}: connection-walk geometry during training (solid: attention part, dashed: full operator)',
                 fontsize=10)
    return save(fig, path)
