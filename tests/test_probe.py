"""lab/probe.py: ∂L/∂γ at γ = 0, δ = 1 of every head, as a finite difference of the same loss gives it; heatmaps and
tables; a corridor run's learned γ beside it; bad input is one line."""

import json

import pytest
import torch

from sources import load_model
from conftest import assert_one_line_error, run_script
from lab.probe import corridor_at_the_model, probe, sequences


def test_the_probe_is_the_derivative_of_the_loss_in_gamma_at_the_model(trained_run, tiny_data_root):
    model, _ = load_model(str(trained_run))
    _, windows = sequences(str(tiny_data_root), 'tiny', 'val', n_seqs=3, seq_len=24, seed=0)
    gammas = corridor_at_the_model(model.double())
    grads, losses = probe(model, gammas, windows, 'cpu')
    assert grads.shape == (3, 2, 2) and all(g.dtype == torch.float64 for g in gammas)
    torch.testing.assert_close(model.operator_coefficients(), torch.tensor([[[0.0, 1.0]] * 2] * 2))  # γ = 0, δ = 1

    def mean_loss(layer, head, shift):  # the mean of the sequences' losses with one head's γ moved
        with torch.no_grad():
            gammas[layer][head] += shift
            value = sum(model(w[None, :-1], w[None, 1:])[1].item() for w in windows) / len(windows)
            gammas[layer][head] -= shift
        return value
    assert sum(losses) / 3 == pytest.approx(mean_loss(0, 0, 0.0), rel=1e-12)  # the model at γ = 0, δ = 1
    for layer, head in ((0, 0), (1, 1)):
        eps = 1e-5
        numeric = (mean_loss(layer, head, eps) - mean_loss(layer, head, -eps)) / (2 * eps)
        assert grads.mean(0)[layer, head].item() == pytest.approx(numeric, rel=1e-6, abs=1e-10)


def test_the_probe_cli_writes_tables_heatmaps_and_the_comparison(trained_run, tiny_data_root, tmp_path):
    result = run_script('lab.probe', trained_run, '--dataset=tiny', f'--data_root={tiny_data_root}', '--n_seqs=6',
                        '--seq_len=24', f'--compare={trained_run}', f'--out={tmp_path / "p"}', '--device=cpu',
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / 'p' / 'probe.json').read_text())
    mean, se, t = (torch.tensor(saved[k]) for k in ('grad_mean', 'grad_se', 't'))
    assert mean.shape == (2, 2) and (se > 0).all()
    torch.testing.assert_close(t, mean / se)
    assert -1 <= saved['compare']['pearson'] <= 1 and saved['n_seqs'] == 6
    md = (tmp_path / 'p' / 'probe.md').read_text()
    assert '| 1 |' in md and 'Pearson r' in md
    assert (tmp_path / 'p' / 'probe.png').stat().st_size > 1000


def test_probe_bad_input_is_one_line(trained_run, tiny_data_root, tmp_path):
    result = run_script('lab.probe', trained_run, '--dataset=missing', f'--data_root={tiny_data_root}', cwd=tmp_path)
    assert_one_line_error(result, 'no prepared data at')
    result = run_script('lab.probe', trained_run, '--dataset=tiny', f'--data_root={tiny_data_root}', '--seq_len=999',
                        cwd=tmp_path)
    assert_one_line_error(result, "exceeds the model's 32 positions")


def test_the_probe_standard_error_is_the_spread_of_per_sequence_gradients_over_root_n(trained_run, tiny_data_root,
                                                                                      tmp_path):
    """probe.json's mean and SE against the per-sequence gradients recomputed here: the sample standard deviation
    (n − 1) over the sequences, by hand, over √n; t = mean / SE."""
    import math
    import statistics
    n = 6
    result = run_script('lab.probe', trained_run, '--dataset=tiny', f'--data_root={tiny_data_root}', f'--n_seqs={n}',
                        '--seq_len=24', '--seed=3', f'--out={tmp_path / "p"}', '--device=cpu', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / 'p' / 'probe.json').read_text())
    model, _ = load_model(str(trained_run))
    _, windows = sequences(str(tiny_data_root), 'tiny', 'val', n_seqs=n, seq_len=24, seed=3)
    grads, _ = probe(model, corridor_at_the_model(model), windows, 'cpu')
    for layer in range(2):
        for head in range(2):
            per_sequence = [grads[s, layer, head].item() for s in range(n)]
            assert len(set(per_sequence)) == n  # the sequences differ, so the spread means something
            mean, se = statistics.fmean(per_sequence), statistics.stdev(per_sequence) / math.sqrt(n)
            assert saved['grad_mean'][layer][head] == pytest.approx(mean, rel=1e-5, abs=1e-9)
            assert saved['grad_se'][layer][head] == pytest.approx(se, rel=1e-5)
            assert saved['t'][layer][head] == pytest.approx(mean / se, rel=1e-4)


def test_compare_correlates_the_push_minus_dL_dgamma_with_the_learned_gamma(monkeypatch):
    """--compare against hand computations: Pearson and Spearman of −∂L/∂γ with the learned γ (a run whose heads
    went where the gradient pushed gives r > 0), and the share of |t| > 2 heads whose γ moved the way −∂L/∂γ points."""
    import statistics
    from scipy import stats
    from lab import probe as probe_module
    mean = torch.tensor([[0.5, -0.2, 0.1], [-0.4, 0.3, 0.05]], dtype=torch.float64)
    t = torch.tensor([[3.0, -2.5, 1.0], [-4.0, 2.2, 0.5]], dtype=torch.float64)
    learned = torch.tensor([[-0.3, 0.1, -0.2], [0.25, 0.02, 0.01]])  # (1, 1): clear, but moved against its push
    monkeypatch.setattr(probe_module, 'load_run', lambda run: dict(gamma=learned))
    lines, result = probe_module.compare(mean, t, 'RUN')
    push, moved = (-mean).flatten().tolist(), learned.double().flatten().tolist()
    assert result['pearson'] == pytest.approx(statistics.correlation(push, moved), rel=1e-6)
    assert result['spearman'] == pytest.approx(stats.spearmanr(push, moved).statistic, rel=1e-6)
    assert result['pearson'] > 0.5 and result['spearman'] > 0.5
    clear = [i for i, v in enumerate(t.flatten().tolist()) if abs(v) > 2]
    assert result['clear_heads'] == len(clear) == 4
    assert result['agree'] == pytest.approx(sum((push[i] > 0) == (moved[i] > 0) for i in clear) / len(clear)) == 0.75
    assert f"Pearson r(−∂L/∂γ, γ) = {result['pearson']:+.2f}" in '\n'.join(lines)


def test_probe_windows_are_whole_seeded_and_the_shortest_split_is_one_line(tmp_path):
    """sequences(): every window is seq_len + 1 consecutive tokens of the split (400 draws from a 40-token file,
    offsets up to its end), the same for the same seed and others for another; a split of seq_len + 2 tokens still
    gives windows, one of seq_len + 1 is refused with a UserError (not a crash in torch.randint)."""
    import numpy as np
    from common import UserError
    (tmp_path / 'd').mkdir()
    (tmp_path / 'd' / 'meta.json').write_text(json.dumps(dict(vocab_size=64, tokenizer='synthetic')))
    np.arange(40, dtype=np.uint16).tofile(tmp_path / 'd' / 'val.bin')
    _, windows = sequences(str(tmp_path), 'd', 'val', n_seqs=400, seq_len=30, seed=0)
    assert windows.shape == (400, 31)
    assert torch.equal(windows, windows[:, :1] + torch.arange(31))  # consecutive tokens, none past the end
    assert len(set(windows[:, 0].tolist())) > 5
    assert torch.equal(sequences(str(tmp_path), 'd', 'val', n_seqs=400, seq_len=30, seed=0)[1], windows)
    assert not torch.equal(sequences(str(tmp_path), 'd', 'val', n_seqs=400, seq_len=30, seed=1)[1], windows)
    assert sequences(str(tmp_path), 'd', 'val', n_seqs=3, seq_len=38, seed=0)[1].shape == (3, 39)
    with pytest.raises(UserError, match=r'the probe draws windows of --seq_len=39 \+ 1 from at least 41, but '
                                        r'.*val.bin has 40 tokens'):
        sequences(str(tmp_path), 'd', 'val', n_seqs=3, seq_len=39, seed=0)
