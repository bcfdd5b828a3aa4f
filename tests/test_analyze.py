"""analyze.py and sweep.py: exact occupancy from known γ/δ, every plot written, a sweep end to end, the
connection-walk CLI on a run and on an imported GPT-2."""

import json
from dataclasses import asdict

import pytest
import torch

import analyze
from common import save_checkpoint
from conftest import REPO, TINY_TRAIN_ARGS, assert_one_line_error, needs_tokenizer, run_script, synthetic_text
from model import GPT, GPTConfig

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
    assert_one_line_error(run_script('analyze.py', '--diagnostics', 'empty', cwd=tmp_path),
                          "neither a run folder with ckpt.pt nor a GPT-2 model")


def test_paired_verdict_is_inconclusive_inside_the_seed_spread():
    assert analyze.paired_verdict([-0.02, -0.021, -0.019])[2] == 'lower'
    assert analyze.paired_verdict([0.02, 0.021, 0.019])[2] == 'higher'
    assert analyze.paired_verdict([-0.02, 0.01, -0.03])[2] == 'inconclusive'  # seeds disagree
    assert analyze.paired_verdict([-0.001, -0.03, -0.0001])[2] == 'inconclusive'  # mean within 2 standard errors


def test_sweep_runs_end_to_end_and_skips_finished_runs(tiny_data_root, tmp_path):
    out_root = tmp_path / 'sweep'
    args = ['--variants=attention,corridor', '--seeds=2', f'--out_root={out_root}',
            f'--base={REPO / "configs" / "_sweep_shakespeare_char.py"}', '--',
            *TINY_TRAIN_ARGS, f'--data_root={tiny_data_root}', '--max_iters=6', '--lr_decay_iters=6',
            '--eval_interval=3', '--eval_iters=2']
    result = run_script('sweep.py', *args, cwd=tiny_data_root)
    assert result.returncode == 0, result.stderr[-3000:]
    report = (out_root / 'report.md').read_text()
    assert '| attention |' in report and '| corridor |' in report and 'inconclusive' in report
    data = json.loads((out_root / 'report.json').read_text())
    assert len(data['variants']['corridor']['val_loss']) == 2
    for name in ('val_loss.png', 'occupancy.png', 'gamma_evolution.png', 'gamma_delta.png'):
        assert (out_root / name).stat().st_size > 1000
    for run in ('attention-s0', 'attention-s1', 'corridor-s0', 'corridor-s1'):
        assert json.loads((out_root / run / 'config.json').read_text())['seed'] == int(run[-1])
    before = (out_root / 'corridor-s0' / 'ckpt.pt').stat().st_mtime_ns
    again = run_script('sweep.py', *args, cwd=tiny_data_root)
    assert again.returncode == 0 and '4 finished, 0 to train' in again.stdout
    assert (out_root / 'corridor-s0' / 'ckpt.pt').stat().st_mtime_ns == before


def test_sweep_variants_share_initial_weights_and_data_by_seed():
    """Pairing by seed is meaningful: with the same seed every variant starts from the same weights."""
    models = {}
    for operator in ('attention', 'corridor', 'alpha_beta', 'laplacian'):
        torch.manual_seed(3)
        models[operator] = GPT(GPTConfig(block_size=8, vocab_size=20, n_layer=2, n_head=2, n_embd=8, operator=operator))
    reference = models['attention'].state_dict()
    for model in models.values():
        state = model.state_dict()
        assert all(torch.equal(state[k], v) for k, v in reference.items())


# ---------------------------------------------------------------------------------------------- connection walk

def test_diagnostics_cli_on_a_corridor_run(trained_run, tmp_path):
    (tmp_path / 'text.txt').write_text(synthetic_text(300, seed=9))
    result = run_script('analyze.py', '--diagnostics', trained_run, '--text', tmp_path / 'text.txt', '--n_seqs', '8',
                        '--seq_len', '16', '--context_sweep', '--drop_sink', '--out', tmp_path / 'diag', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / 'diag' / 'diagnostics.json').read_text())
    run = saved[trained_run.name]
    assert run['sequences'] == 8 and saved['settings']['drop_sink']
    for part in ('attention', 'operator'):  # a corridor model: the attention part and the full operator
        assert len(run[part]['drift']) == 1 and len(run[part]['delta_orth']) == 2
        assert set(run[part]['context_sweep']) == {'16', '32'}  # up to block_size
    for name in ('walk_layers.png', 'context_sweep.png', f'a_eff_{trained_run.name}_attention.png',
                 f'gram_{trained_run.name}_operator.png'):
        assert (tmp_path / 'diag' / name).stat().st_size > 1000
    assert '| 1 | – |' in (tmp_path / 'diag' / 'diagnostics.md').read_text()  # the last layer has no drift


@needs_tokenizer
def test_diagnostics_cli_on_an_imported_gpt2(tmp_path):
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=64, n_embd=24, n_layer=2, n_head=3))
    hf.save_pretrained(tmp_path / 'tiny-gpt2')
    (tmp_path / 'text.txt').write_text(synthetic_text(100))
    result = run_script('analyze.py', '--diagnostics', tmp_path / 'tiny-gpt2', '--text', tmp_path / 'text.txt',
                        '--n_seqs', '4', '--seq_len', '32', '--out', tmp_path / 'diag', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / 'diag' / 'diagnostics.json').read_text())
    assert set(saved['tiny-gpt2']) == {'sequences', 'seq_len', 'attention'}  # plain attention: one part
    assert len(saved['tiny-gpt2']['attention']['a_eff_fro']) == 2
