"""analyze.py: exact occupancy from known γ/δ, every plot written, one-line errors."""

import json
from dataclasses import asdict

import pytest
import torch

import analyze
from common import read_log, save_checkpoint
from conftest import assert_one_line_error, run_script
from model import GPT, GPTConfig
from plots import walk_series

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
    run = fake_run(tmp_path / 'run', snapshots=[(50, [[-0.5] * 4, [0.5] * 4, [-2.0, -0.5, 0.0, -0.1]])])
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
    assert report['snapshots'] == [dict(iter=50, occupancy=pytest.approx(6 / 12),
                                        occupancy_by_layer=pytest.approx([1.0, 0.0, 0.5]))]
    summary = (run / 'analysis' / 'summary.md').read_text()
    assert '| 0 | 25% | 1 | 2 |' in summary and 'layers after the first: 88%' in summary


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
    assert '| a | corridor | 100 | 1.1000 |' in summary and '| b |' in summary


def test_bad_input_is_one_line(tmp_path):
    assert_one_line_error(run_script('analyze.py', 'nowhere', cwd=tmp_path), "no run folder 'nowhere'")
    (tmp_path / 'empty').mkdir()
    assert_one_line_error(run_script('analyze.py', 'empty', cwd=tmp_path), 'no checkpoint at')
    assert_one_line_error(run_script('analyze.py', '--diagnostics', 'empty', cwd=tmp_path),  # walk.py's old name
                          "python walk.py empty")


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
