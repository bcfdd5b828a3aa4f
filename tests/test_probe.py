"""probe.py: ∂L/∂γ at γ = 0, δ = 1 of every head, as a finite difference of the same loss gives it; heatmaps and
tables; a corridor run's learned γ beside it; bad input is one line."""

import json

import pytest
import torch

from common import load_model
from conftest import assert_one_line_error, run_script
from probe import corridor_at_the_model, probe, sequences


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
    result = run_script('probe.py', trained_run, '--dataset=tiny', f'--data_root={tiny_data_root}', '--n_seqs=6',
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
    result = run_script('probe.py', trained_run, '--dataset=missing', f'--data_root={tiny_data_root}', cwd=tmp_path)
    assert_one_line_error(result, 'no prepared data at')
    result = run_script('probe.py', trained_run, '--dataset=tiny', f'--data_root={tiny_data_root}', '--seq_len=999',
                        cwd=tmp_path)
    assert_one_line_error(result, "exceeds the model's 32 positions")
