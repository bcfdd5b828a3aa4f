"""analyze.py: exact occupancy from known γ/δ, every plot written, one-line errors."""

import json
import os
from dataclasses import asdict

import pytest
import torch

import analyze
import sources
from common import save_checkpoint
from sources import read_log
from conftest import assert_one_line_error, run_script
from model import CLAIM_B, GPT, GPTConfig
from lab.figures import walk_series

# layer 0 holds both boundaries: γ = −1 counts as "below", γ = 0 as "above", neither in the corridor
GAMMA = [[-1.0, 0.0, -0.5, 0.3], [-0.2, -0.9, -1.5, -0.99], [-0.1, -0.3, -0.6, -0.7]]
DELTA = [[1.0, 2.0, 0.5, 1.5], [0.8, 1.2, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]


def fake_run(folder, gamma=GAMMA, delta=DELTA, snapshots=()):
    """A run folder as train.py leaves it, with a corridor model of known (γ, δ) and a short log."""
    config = GPTConfig(block_size=8, vocab_size=5, n_layer=len(gamma), n_head=len(gamma[0]), n_embd=8,
                       operator='corridor')
    folder.mkdir(parents=True)

    def checkpoint(gamma_values, iter_num):
        model = GPT(config)
        with torch.no_grad():
            for block, g, d in zip(model.transformer.h, gamma_values, delta):
                block.attn.coefficients.gamma.copy_(torch.tensor(g))
                block.attn.coefficients.delta.copy_(torch.tensor(d))
        return dict(model=model.state_dict(), model_args=asdict(config), iter_num=iter_num, best_val_loss=1.0,
                    config=dict(operator='corridor', max_iters=100), meta=dict(tokenizer='char', vocab_size=5,
                                                                               itos=list('abcde')))
    save_checkpoint(checkpoint(gamma, 100), folder / 'ckpt.pt')
    for it, g in snapshots:
        save_checkpoint(checkpoint(g, it), folder / f'ckpt_{it:07d}.pt')
    with open(folder / 'log.jsonl', 'w') as f:
        for it in (0, 50, 100):
            scale = it / 100
            f.write(json.dumps(dict(iter=it, tokens=it * 64, train_loss=2 - scale, val_loss=2.1 - scale,
                                    gamma=[[x * scale for x in row] for row in gamma], delta=delta,
                                    c_I=[[x * scale * y for x, y in zip(r, s)] for r, s in zip(gamma, delta)],
                                    c_P=delta)) + '\n')
    return folder


def test_occupancy_counts_and_statistics_are_exact(tmp_path):
    run = fake_run(tmp_path / 'run')
    analyze.main([str(run)])
    report = json.loads((run / 'analysis' / 'corridor.json').read_text())
    layer0, layer1, layer2 = report['layers']
    assert (layer0['occupancy'], layer0['below'], layer0['above']) == (0.25, 1, 2)  # −1 below, 0 and 0.3 above
    assert (layer1['occupancy'], layer1['below'], layer1['above']) == (0.75, 1, 0)
    assert (layer2['occupancy'], layer2['below'], layer2['above']) == (1.0, 0, 0)
    assert report['occupancy'] == pytest.approx(8 / 12)
    assert report['occupancy_beyond_first'] == pytest.approx(7 / 8)
    assert layer0['gamma_mean'] == pytest.approx(-0.3)
    assert layer0['gamma_median'] == pytest.approx(-0.5)  # torch's median: the lower middle value
    assert layer1['delta_mean'] == pytest.approx(1.0)
    assert layer1['gamma'] == pytest.approx(GAMMA[1]) and layer0['delta'] == pytest.approx(DELTA[0])
    # the series at every evaluation, from log.jsonl: γ scaled by iter / 100 (γ = 0 at iter 0 is "above")
    # settled, −1 < γ < −0.05: at iter 50 layer 2's −0.1 · 0.5 = −0.05 is in the corridor but not settled
    assert report['series'] == [dict(iter=0, occupancy=0.0, inside_claim_b=0.0, occupancy_by_layer=[0.0, 0.0, 0.0],
                                     inside_claim_b_by_layer=[0.0, 0.0, 0.0]),
                                dict(iter=50, occupancy=pytest.approx(10 / 12), inside_claim_b=pytest.approx(9 / 12),
                                     occupancy_by_layer=pytest.approx([0.5, 1.0, 1.0]),
                                     inside_claim_b_by_layer=pytest.approx([0.5, 1.0, 0.75])),
                                dict(iter=100, occupancy=pytest.approx(8 / 12), inside_claim_b=pytest.approx(8 / 12),
                                     occupancy_by_layer=pytest.approx([0.25, 0.75, 1.0]),
                                     inside_claim_b_by_layer=pytest.approx([0.25, 0.75, 1.0]))]
    summary = (run / 'analysis' / 'summary.md').read_text()
    assert '| 0 | 25% | 25% | 1 | 2 |' in summary and 'layers after the first: 88% and 88%' in summary


def test_every_plot_is_written_for_one_run_and_for_several(tmp_path):
    runs = [fake_run(tmp_path / name, gamma=[[g + 0.1 * k for g in row] for row in GAMMA])
            for k, name in enumerate(('a', 'b'))]
    analyze.main([str(runs[0])])
    for name in ('occupancy.png', 'gamma_delta.png', 'evolution.png', 'loss.png', 'corridor.json', 'summary.md'):
        assert (runs[0] / 'analysis' / name).stat().st_size > 1000 or name.endswith(('.json', '.md'))
    analyze.main([str(r) for r in runs] + ['--out', str(tmp_path / 'cmp')])
    for name in ('occupancy.png', 'gamma_delta.png', 'val_loss.png'):
        assert (tmp_path / 'cmp' / name).stat().st_size > 1000
    for run in ('a', 'b'):
        assert (tmp_path / 'cmp' / run / 'evolution.png').stat().st_size > 1000
    summary = (tmp_path / 'cmp' / 'summary.md').read_text()
    assert '| a | corridor | 100 | 1.1000 | +0.0000 |' in summary and '| b |' in summary
    assert 'One run per variant' in summary


def fake_attention_run(folder):
    """A plain attention run folder (3 layers of 4 heads, like fake_run's) whose val loss falls 2.0 -> 1.5."""
    folder.mkdir()
    config = GPTConfig(block_size=8, vocab_size=5, n_layer=3, n_head=4, n_embd=8, operator='attention')
    save_checkpoint(dict(model=GPT(config).state_dict(), model_args=asdict(config), iter_num=100, best_val_loss=1.0,
                         config=dict(operator='attention', max_iters=100),
                         meta=dict(tokenizer='char', vocab_size=5, itos=list('abcde'))), folder / 'ckpt.pt')
    with open(folder / 'log.jsonl', 'w') as f:
        for it in (0, 50, 100):
            zeros, ones = [[0.0] * 4] * 3, [[1.0] * 4] * 3
            f.write(json.dumps(dict(iter=it, tokens=it * 64, train_loss=2.0, val_loss=2.0 - it / 200, gamma=zeros,
                                    delta=ones, c_I=zeros, c_P=ones)) + '\n')
    return folder


def test_an_attention_run_gets_no_empty_corridor_plots_and_its_comparison_shows_the_difference(tmp_path):
    corridor = fake_run(tmp_path / 'corridor')
    attention = fake_attention_run(tmp_path / 'baseline')
    analyze.main([str(attention), str(corridor), '--out', str(tmp_path / 'cmp')])
    names = {p.name for p in (tmp_path / 'cmp' / 'baseline').iterdir()}
    assert names == {'corridor.json', 'summary.md', 'loss.png'}  # no flat γ/δ panels, no zero-height bars
    assert 'plain attention' in (tmp_path / 'cmp' / 'baseline' / 'summary.md').read_text()
    summary = (tmp_path / 'cmp' / 'summary.md').read_text()
    assert '| baseline | attention | 100 | 1.5000 | +0.0000 | 1.5000 | – |' in summary
    assert '| corridor | corridor | 100 | 1.1000 | -0.4000 |' in summary
    assert (tmp_path / 'cmp' / 'val_loss.png').stat().st_size > 1000
    assert analyze.label(analyze.load_run(str(attention))) == 'baseline (attention)'


def test_gamma_delta_come_from_the_log_and_the_checkpoint_only_when_it_is_newer(tmp_path, monkeypatch):
    """No model is rebuilt to read what log.jsonl holds; a run stopped after its last evaluation (its checkpoint
    newer than the log) reads the checkpoint's own scalars."""
    run = fake_run(tmp_path / 'run')
    real = sources.model_from_checkpoint
    monkeypatch.setattr(sources, 'model_from_checkpoint', lambda *a, **k: pytest.fail('a model was rebuilt'))
    loaded = sources.load_run(str(run))
    assert torch.allclose(loaded['gamma'], torch.tensor(GAMMA)) and loaded['params'] > 0
    monkeypatch.setattr(sources, 'model_from_checkpoint', real)
    lines = (run / 'log.jsonl').read_text().splitlines()
    stale = [json.loads(line) for line in lines[:2]]  # the last evaluation (iter 100, = the checkpoint) lost
    (run / 'log.jsonl').write_text(''.join(json.dumps(e) + '\n' for e in stale))
    assert torch.allclose(sources.load_run(str(run))['gamma'], torch.tensor(GAMMA))  # the checkpoint's, not iter 50's


def test_bad_input_is_one_line(tmp_path):
    assert_one_line_error(run_script('analyze.py', 'nowhere', cwd=tmp_path), "no run folder 'nowhere'")
    (tmp_path / 'empty').mkdir()
    assert_one_line_error(run_script('analyze.py', 'empty', cwd=tmp_path), 'empty is not a train.py run folder')
    (tmp_path / 'starting').mkdir()  # a run in its first moments: locked, its log still empty
    (tmp_path / 'starting' / 'train.lock').write_text('pid 1\n')
    (tmp_path / 'starting' / 'log.jsonl').write_text('')
    assert_one_line_error(run_script('analyze.py', 'starting', cwd=tmp_path), 'no evaluation in log.jsonl')


def test_a_run_that_saved_no_checkpoint_is_analyzed_from_its_log_and_config(unsaved_run, tmp_path):
    """What log.jsonl holds is read without ckpt.pt: the last evaluation's γ and δ, the operator from config.json;
    the summary says where they came from."""
    result = run_script('analyze.py', unsaved_run, '--out', tmp_path / 'a', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'iter 0 (no ckpt.pt yet' in result.stdout
    out = tmp_path / 'a' / unsaved_run.name
    report = json.loads((out / 'corridor.json').read_text())
    assert report['operator'] == 'corridor' and report['iter'] == 0
    assert [g for layer in report['layers'] for g in layer['gamma']] == pytest.approx([-0.2] * 4)
    assert {p.name for p in out.iterdir()} >= {'evolution.png', 'gamma_delta.png', 'loss.png'}


def test_a_run_with_walk_geometry_gets_its_plot_and_the_series_read_back_exactly(trained_run, tmp_path):
    analyze.main([str(trained_run), '--out', str(tmp_path / 'out')])
    assert (tmp_path / 'out' / trained_run.name / 'walk.png').stat().st_size > 1000
    log = read_log(trained_run)
    tokens, ratio = walk_series(log, 'operator', 'gram_ratio')
    assert tokens.tolist() == [e['tokens'] for e in log]  # walk_interval = eval_interval: every evaluation
    last = log[-1]['walk']['operator']
    assert ratio[-1].tolist() == pytest.approx([a / b for a, b in zip(last['gram_diag_mean'], last['gram_offdiag_mean'])])
    assert walk_series(log, 'operator', 'drift')[1].shape == (len(log), 1)  # 2 layers: one drift
    assert walk_series([{k: v for k, v in e.items() if k != 'walk'} for e in log], 'attention', 'drift') is None


# ------------------------------------------------------------------ what the figures say, read from matplotlib objects

@pytest.fixture
def figures(monkeypatch):
    """{path: Figure} of every figure analyze draws, laid out as save lays it out but never written."""
    drawn = {}

    def capture(fig, path, rect=(0, 0, 1, 1)):
        fig.tight_layout(rect=rect)
        drawn[os.path.normpath(path)] = fig
        return path
    monkeypatch.setattr(analyze, 'save', capture)
    yield drawn
    for fig in drawn.values():
        analyze.plt.close(fig)


def legend_texts(legend):
    return [t.get_text() for t in legend.get_texts()]


def test_val_loss_curves_differ_by_style_the_difference_says_its_sign_and_the_caveat_is_off_the_data(figures):
    tokens = [0, 100, 200, 300]
    analyze.plot_losses({'attention': (tokens, [4.0, 3.0, 2.5, 2.2]), 'corridor': (tokens, [4.0, 3.0, 2.5, 2.19])},
                        'val_loss.png', 'validation loss', compare=True)
    fig = figures['val_loss.png']
    top, bottom = fig.axes
    styles = [(line.get_linestyle(), line.get_marker()) for line in top.get_lines()]
    assert len(styles) == 2 and styles[0][0] != styles[1][0] and styles[0][1] != styles[1][1]  # not colour alone
    assert '−' in bottom.get_ylabel() and 'reference' in bottom.get_ylabel()
    assert any('< 0: corridor lower' in t for t in legend_texts(bottom.get_legend()))
    fig.canvas.draw()
    caveat = [t for t in fig.findobj(analyze.matplotlib.text.Text) if 'seed-to-seed' in t.get_text()]
    assert len(caveat) == 1 and caveat[0].get_transform() is not bottom.transAxes
    box = caveat[0].get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes)  # under the axes, on no curve


def test_the_comparison_figures_mark_and_name_attention_and_show_the_corridors_lower_edge(tmp_path, figures):
    corridor, attention = fake_run(tmp_path / 'corridor'), fake_attention_run(tmp_path / 'baseline')
    analyze.main([str(corridor), str(attention), '--out', str(tmp_path / 'cmp')])
    fig = figures[str(tmp_path / 'cmp' / 'gamma_delta.png')]
    assert 'baseline (attention)' in fig._suptitle.get_text().replace('\u00a0', ' ')  # a label never wrapped
    for ax in fig.axes:
        points = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
        assert points['attention (γ = 0, δ = 1)'] == [[0.0, 1.0]]
        assert [-1, -1] in [list(line.get_xdata()) for line in ax.get_lines()]  # the corridor's lower edge
        low, high = ax.get_xlim()
        assert low < -1.05 and high > 0.05
    (ax,) = figures[str(tmp_path / 'cmp' / 'occupancy.png')].axes
    assert any(t.startswith('baseline (attention)') and '0 %' in t for t in legend_texts(ax.get_legend()))
    # one corridor run alone: the attention point is still there, no attention run named
    fig = figures[str(tmp_path / 'cmp' / 'corridor' / 'gamma_delta.png')]
    assert 'attention' not in fig._suptitle.get_text()
    assert 'attention (γ = 0, δ = 1)' in legend_texts(fig.axes[0].get_legend())


def test_evolution_names_each_head_once_and_every_gamma_panel_shows_the_corridors_edges(figures):
    log = [dict(tokens=t * 1000, gamma=[[g * t / 4 for g in row] for row in GAMMA], delta=DELTA) for t in range(5)]
    fig = figures[analyze.plot_evolution(log, 'evolution.png', 'run')]
    (legend,) = fig.legends  # one for the figure, none per panel
    assert legend_texts(legend) == ['head 0', 'head 1', 'head 2', 'head 3']
    assert not any(ax.get_legend() for ax in fig.axes)
    gamma_panels = [ax for ax in fig.axes if ax.get_title().startswith('layer')]
    assert len(gamma_panels) == len(GAMMA)
    for ax in gamma_panels:
        low, high = ax.get_ylim()
        assert low < -1 and high > 0
        assert [line.get_color() for line in ax.get_lines()][:4] == ['C0', 'C1', 'C2', 'C3']  # head k: colour k
    many = [dict(tokens=t, gamma=[[-0.1] * 11], delta=[[1.0] * 11]) for t in range(3)]
    fig = figures[analyze.plot_evolution(many, 'many.png', 'run')]
    assert not fig.legends and 'one line per head' in fig._suptitle.get_text()


# γ a hair below 0 is in the corridor but not settled in it (γ = −0.05 itself neither: the interval is open)
NEAR_ZERO = [[-0.01, -0.02, -0.5, 0.0], [-0.04, CLAIM_B, -0.3, -0.6]]


def test_the_occupancy_figure_draws_the_settled_share_beside_the_corridors_as_the_report_gives_them(tmp_path,
                                                                                                      figures):
    run = fake_run(tmp_path / 'near', gamma=NEAR_ZERO, delta=[[1.0] * 4] * 2)
    analyze.main([str(run)])
    report = json.loads((run / 'analysis' / 'corridor.json').read_text())
    assert [r['occupancy'] for r in report['layers']] == [0.75, 1.0]
    assert [r['inside_claim_b'] for r in report['layers']] == [0.25, 0.5]
    assert (report['occupancy'], report['inside_claim_b']) == (7 / 8, 3 / 8)
    assert (report['occupancy_beyond_first'], report['inside_claim_b_beyond_first']) == (1.0, 0.5)
    (ax,) = figures[str(run / 'analysis' / 'occupancy.png')].axes
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    corridor, settled = bars['near: in the corridor, −1 < γ < 0'], bars['near: settled, −1 < γ < −0.05 (claim (b))']
    assert corridor == [r['occupancy'] for r in report['layers']]
    assert settled == [r['inside_claim_b'] for r in report['layers']]
    assert {label for label in legend_texts(ax.get_legend())} == set(bars)  # the legend names both
    summary = (run / 'analysis' / 'summary.md').read_text()
    assert 'settled, −1 < γ < −0.05' in summary and '| 0 | 75% | 25% | 0 | 1 |' in summary
    assert 'all heads: 88% in the corridor, 38% settled' in summary


def test_evolution_compares_layers_on_one_gamma_scale_and_one_delta_scale(figures):
    """Layer 0's δ falls 1.0 → 0.8, layer 1's moves 0.98 → 1.03: both δ panels span both, as both γ panels span
    layer 1's γ down to −1.4."""
    log = [dict(tokens=t * 1000, gamma=[[-0.1 * t, -0.05 * t], [-0.35 * t, -0.2 * t]],
                delta=[[1.0 - 0.05 * t, 1.0], [0.98 + 0.0125 * t, 1.0]]) for t in range(5)]
    fig = figures[analyze.plot_evolution(log, 'evolution.png', 'run')]
    gamma_panels = [ax for ax in fig.axes if ax.get_title().startswith('layer')]
    delta_panels = [ax for ax in fig.axes if ax.axison and ax not in gamma_panels]
    assert len(gamma_panels) == len(delta_panels) == 2
    for panels, low, high in ((gamma_panels, -1.4, 0.0), (delta_panels, 0.8, 1.03)):
        (limits,) = {ax.get_ylim() for ax in panels}  # one y-scale for the panels compared
        assert limits[0] < low and limits[1] > high
