"""sweep.py: variants and settings are valid runs, the paired statistics, an ad hoc sweep and a study end to end
(shared runs, skipped when finished), every study's figures, the GPU presets on CPU, one-line errors."""

import json
import math
import statistics

import pytest
import torch

import sweep
from conftest import REPO, TINY_TRAIN_ARGS, assert_one_line_error, run_script
from model import GPT, GPTConfig

TINY_RUN = [*TINY_TRAIN_ARGS, '--max_iters=6', '--lr_decay_iters=6', '--eval_interval=3', '--eval_iters=2',
            '--walk_interval=3', '--walk_seqs=2']


def test_paired_verdict_is_a_two_sided_t_test_at_five_percent():
    assert sweep.paired_verdict([-0.02, -0.021, -0.019])[2] == 'lower'
    assert sweep.paired_verdict([0.02, 0.021, 0.019])[2] == 'higher'
    assert sweep.paired_verdict([-0.02, 0.01, -0.03])[2] == 'inconclusive'  # seeds disagree
    assert sweep.paired_verdict([-0.001, -0.03, -0.0001])[2] == 'inconclusive'  # mean within the spread
    # three seeds of one sign with t = 2.31: beyond 2 standard errors, but short of t(2) = 4.30
    assert sweep.paired_verdict([0.01, 0.04, 0.07])[2] == 'inconclusive'
    # eight seeds, one of the other sign: t = 5.9 against t(7) = 2.36
    assert sweep.paired_verdict([-0.01, -0.012, 0.001, -0.011, -0.009, -0.013, -0.008, -0.01])[2] == 'lower'
    mean, std, _ = sweep.paired_verdict([0.01, 0.04, 0.07])
    assert (mean, std) == (pytest.approx(0.04), pytest.approx(0.03))
    assert sweep.paired_verdict([-0.02])[2] == 'inconclusive'  # one seed says nothing about the spread
    assert sweep.paired_verdict([])[2] == 'not measured'


def differences_with_t(t, n):
    """n paired differences whose one-sample t statistic mean / (std / √n) is exactly t (std = 1)."""
    spread = [(-1) ** k for k in range(n)] if n % 2 == 0 else [-1.0, 0.0, 1.0] + [(-1) ** k for k in range(n - 3)]
    scale = 1 / statistics.stdev(spread)
    return [t / math.sqrt(n) + scale * x for x in spread]


# Student's t quantiles from printed tables (not from sweep.py): two-sided 5 % = t_0.975; one-sided 5 % = t_0.95
@pytest.mark.parametrize('n,t_975,t_95,t_975_at_n', [(3, 4.303, 2.920, 3.182), (4, 3.182, 2.353, 2.776),
                                                     (8, 2.365, 1.895, 2.306)])
def test_paired_verdict_flips_just_at_the_two_sided_critical_value_with_n_minus_1_degrees_of_freedom(
        n, t_975, t_95, t_975_at_n):
    """A t 1 % below t_0.975(n − 1) is inconclusive, 1 % above it is not: that rules out n degrees of freedom
    (a smaller critical value) and a one-sided table (smaller still), which both call the first one significant."""
    assert max(t_95, t_975_at_n) < 0.99 * t_975
    for sign, verdict in ((1, 'higher'), (-1, 'lower')):
        assert sweep.paired_verdict(differences_with_t(sign * 0.99 * t_975, n))[2] == 'inconclusive'
        assert sweep.paired_verdict(differences_with_t(sign * 1.01 * t_975, n))[2] == verdict
    mean, std, _ = sweep.paired_verdict(differences_with_t(3.0, n))
    assert (mean, std) == (pytest.approx(3.0 / math.sqrt(n)), pytest.approx(1.0))


def test_paired_verdict_beyond_30_degrees_of_freedom_uses_30s_value():
    """t_0.975(40) = 2.021, t_0.975(30) = 2.042: between them the verdict is (slightly strictly) inconclusive."""
    assert sweep.paired_verdict(differences_with_t(2.03, 41))[2] == 'inconclusive'
    assert sweep.paired_verdict(differences_with_t(2.06, 41))[2] == 'higher'


def test_variant_specs_carry_values_and_name_each_run_once():
    assert sweep.parse_variant('fixed_gamma=-0.3') == ('fixed_gamma=-0.3', dict(
        operator='corridor', gamma_init=-0.3, learn_gamma=False, learn_delta=False))
    assert sweep.parse_variant('fixed_gamma=-0.5')[0] == 'fixed_gamma'  # the default value: the plain name
    assert sweep.parse_variant('corridor_lr=10')[0] == 'corridor_lr'
    assert sweep.parse_variant('laplacian=3')[1] == dict(operator='laplacian', laplacian_heads=3)
    assert sweep.parse_variant('corridor_spread=0.25')[1]['init_spread'] == 0.25


def test_every_study_plans_valid_runs_on_cpu_and_gpu(tiny_data_root):
    """Every run of every study, CPU parts and GPU presets, is a config train.py accepts (data: the tiny set)."""
    data = [f'--data_root={tiny_data_root}', '--dataset=tiny']
    for name, study in sweep.STUDIES.items():
        for parts in (study.parts, study.gpu_parts):
            runs = sweep.plan_runs(parts, 'sweeps', sweep.CPU, data)
            wanted = {(p.setting, sweep.parse_variant(v)[0], seed) for p in parts for v in p.variants
                      for seed in range(p.seeds)}  # parts may overlap (more seeds for some variants): one run each
            assert set(runs) == wanted, name
    # the studies share their runs: the small Tiny Shakespeare attention runs serve four of them
    shared = [name for name, study in sweep.STUDIES.items()
              if any(p.setting == 'shakespeare_char/small' and 'attention' in p.variants for p in study.parts)]
    assert len(shared) >= 2


def test_sweep_variants_share_initial_weights_and_data_by_seed():
    """Pairing by seed is meaningful: with the same seed every variant starts from the same weights (and sees the
    same batches: test_train's test_every_variant_sees_the_same_batches_with_the_same_seed)."""
    models = {}
    for operator in ('attention', 'corridor', 'alpha_beta', 'laplacian'):
        torch.manual_seed(3)
        models[operator] = GPT(GPTConfig(block_size=8, vocab_size=20, n_layer=2, n_head=2, n_embd=8, operator=operator))
    reference = models['attention'].state_dict()
    for model in models.values():
        state = model.state_dict()
        assert all(torch.equal(state[k], v) for k, v in reference.items())


def test_ad_hoc_sweep_runs_end_to_end_and_skips_finished_runs(tiny_data_root, tmp_path):
    out_root = tmp_path / 'sweep'
    args = ['--variants=attention,corridor,fixed_gamma=-0.3', '--seeds=2', f'--out_root={out_root}', '--parallel=2',
            f'--base={REPO / "configs" / "_sweep_cpu.py"}', '--', *TINY_RUN, f'--data_root={tiny_data_root}']
    result = run_script('sweep.py', *args, cwd=tiny_data_root)
    assert result.returncode == 0, result.stderr[-3000:]
    report = (out_root / 'report.md').read_text()
    assert '| attention | 2 |' in report and '| corridor | 2 |' in report and '| fixed_gamma=-0.3 | 2 |' in report
    assert '- a: learnable δ(γI+P) lowers val loss vs attention' in report
    data = json.loads((out_root / 'report.json').read_text())['sweep']
    assert len(data['corridor']['val_loss']) == 2 and data['fixed_gamma=-0.3']['gamma_mean'] == pytest.approx(-0.3)
    finals = {run: json.loads((out_root / run / 'log.jsonl').read_text().splitlines()[-1])['val_loss']
              for run in ('attention-s0', 'attention-s1', 'corridor-s0', 'corridor-s1')}
    differences = [finals['corridor-s0'] - finals['attention-s0'], finals['corridor-s1'] - finals['attention-s1']]
    assert data['corridor']['vs_attention'][:3] == list(sweep.paired_verdict(differences))  # paired by seed
    for name in ('val_loss.png', 'occupancy.png', 'gamma_corridor.png', 'gamma_delta.png'):
        assert (out_root / name).stat().st_size > 1000
    for run in ('attention-s0', 'attention-s1', 'corridor-s0', 'corridor-s1'):
        assert json.loads((out_root / run / 'config.json').read_text())['seed'] == int(run[-1])
    before = (out_root / 'corridor-s0' / 'ckpt.pt').stat().st_mtime_ns
    again = run_script('sweep.py', *args, cwd=tiny_data_root)
    assert again.returncode == 0 and '6 runs: 6 finished, 0 to train' in again.stdout
    assert (out_root / 'corridor-s0' / 'ckpt.pt').stat().st_mtime_ns == before


def test_studies_share_runs_and_write_every_figure(tiny_data_root, tmp_path, monkeypatch):
    """Two tiny settings, the variants every study's figures read: trained once, then reported as each study."""
    tiny = dict(dataset='tiny', data_root=str(tiny_data_root))
    monkeypatch.setitem(sweep.SETTINGS, 'tiny/a', (sweep.CPU, dict(tiny, n_embd=32)))
    monkeypatch.setitem(sweep.SETTINGS, 'tiny/b', (sweep.CPU, dict(tiny, n_embd=16)))
    train_args = [arg for arg in TINY_RUN if not arg.startswith('--n_embd')]  # the settings' own
    variants = ('attention', 'corridor', 'fixed_gamma=-0.3', 'corridor_lr')
    parts = tuple(sweep.Part(s, variants, 2) for s in ('tiny/a', 'tiny/b'))
    for figures in ('claims_figures', 'fixed_gamma_figures', 'scales_figures', 'gamma_dynamics_figures',
                    'geometry_figures'):
        monkeypatch.setitem(sweep.STUDIES, figures, sweep.Study('a test', parts, (), figures))
    monkeypatch.chdir(REPO)
    sweep.main(['--study=claims_figures', f'--out_root={tmp_path}', '--parallel=2', '--', *train_args])
    trained = {p: p.stat().st_mtime_ns for p in tmp_path.glob('tiny/*/*/ckpt.pt')}
    assert len(trained) == 16
    for study in ('fixed_gamma_figures', 'scales_figures', 'gamma_dynamics_figures', 'geometry_figures'):
        sweep.main([f'--study={study}', f'--out_root={tmp_path}', '--', *train_args])
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob('tiny/*/*/ckpt.pt')} == trained  # trained once
    claims = (tmp_path / 'claims_figures' / 'report.md').read_text()
    assert '### Claims on tiny/a' in claims and '## tiny/b:' in claims
    assert (tmp_path / 'claims_figures' / 'tiny_a' / 'val_loss.png').stat().st_size > 1000
    fixed = (tmp_path / 'fixed_gamma_figures' / 'report.md').read_text()
    assert '| tiny/a |' in fixed and (tmp_path / 'fixed_gamma_figures' / 'fixed_gamma.png').stat().st_size > 1000
    scales = (tmp_path / 'scales_figures' / 'report.md').read_text()
    assert scales.count('| tiny/') == 2 and (tmp_path / 'scales_figures' / 'scales.png').stat().st_size > 1000
    dynamics = (tmp_path / 'gamma_dynamics_figures' / 'report.md').read_text()
    assert dynamics.count('| tiny/a | corridor | ') == 2 and dynamics.count('| tiny/a | corridor_lr | ') == 2  # per seed
    assert (tmp_path / 'gamma_dynamics_figures' / 'gamma_dynamics_tiny_a.png').stat().st_size > 1000
    geometry = (tmp_path / 'geometry_figures' / 'report.md').read_text()
    assert '| δ_orth | initial |' in geometry and '| corridor: P | corridor: operator |' in geometry
    assert 'Does the difference track γ? drift to the next layer: r = ' in geometry
    for name in ('geometry_tiny_a.png', 'geometry_vs_gamma_tiny_b.png'):
        assert (tmp_path / 'geometry_figures' / name).stat().st_size > 1000
    data = json.loads((tmp_path / 'scales_figures' / 'report.json').read_text())
    assert data['tiny/a']['corridor']['params'] > data['tiny/b']['corridor']['params']

    # a study partway (an attention run not finished): the reports pair what finished, columns in place
    (tmp_path / 'tiny' / 'a' / 'attention-s1' / 'ckpt.pt').unlink()
    for study in ('fixed_gamma_figures', 'geometry_figures'):
        sweep.main([f'--study={study}', f'--out_root={tmp_path}', '--report_only=True', '--', *train_args])
    fixed = (tmp_path / 'fixed_gamma_figures' / 'report.md').read_text().splitlines()
    header = next(line for line in fixed if line.startswith('| setting | γ = '))
    row = next(line for line in fixed if line.startswith('| tiny/a | '))
    assert row.count(' | ') == header.count(' | ') and row.count('–') == len(sweep.FIXED_GAMMAS) - 1
    assert '| δ_orth | initial |' in (tmp_path / 'geometry_figures' / 'report.md').read_text()


def test_a_gpu_preset_starts_and_logs_on_cpu_with_tiny_overrides(tiny_data_root, tmp_path):
    result = run_script('sweep.py', '--study=scales', '--gpu=True', '--seeds=1', f'--out_root={tmp_path}',
                        '--parallel=2', '--', *TINY_RUN, f'--data_root={tiny_data_root}', '--dataset=tiny',
                        '--device=cpu', '--compile=False', '--gradient_accumulation_steps=1', cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    for size in ('gpt2_30m', 'gpt2_124m', 'gpt2_350m'):
        log = (tmp_path / 'openwebtext' / size / 'corridor-s0' / 'log.jsonl').read_text().splitlines()
        assert [json.loads(line)['iter'] for line in log] == [0, 3, 6]
    assert '# scales-gpu:' in (tmp_path / 'scales-gpu' / 'report.md').read_text()


@pytest.mark.parametrize('args,message', [
    (['--study=scale'], "unknown study 'scale'"),
    (['--variants=attention,corridr'], "unknown variant 'corridr'"),
    (['--variants=alpha=3'], "alpha takes no value"),
    (['--variants=fixed_gamma=minus'], "is not a number"),
    (['--study=claims', '--', '--n_layr=2'], "unknown config key 'n_layr'"),
    (['--study=claims', '--', '--data_root=nowhere'], "run `python prepare.py shakespeare_char` first"),
    (['--parallel=0'], "parallel must be at least 1"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    assert_one_line_error(run_script('sweep.py', f'--out_root={tmp_path}', *args, cwd=REPO), message)
    assert not any(tmp_path.iterdir())


def test_plan_prints_the_gpu_budget_without_data_or_training(tmp_path):
    result = run_script('sweep.py', '--study=scales', '--gpu=True', '--plan=True', f'--out_root={tmp_path}', cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith('| openwebtext/')]
    assert [row.split(' | ')[0] for row in rows] == ['| openwebtext/gpt2_30m', '| openwebtext/gpt2_124m',
                                                     '| openwebtext/gpt2_350m']
    assert '| openwebtext/gpt2_124m | 123.6M | 1.23B |' in result.stdout  # 2,500 × 491,520 tokens
    hours = [float(row.split(' | ')[3]) for row in rows]
    assert hours == sorted(hours) and 'total to train:' in result.stdout
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------------ the reports' numbers

FINAL_LOSS = {'attention': (2.00, 2.10, 2.20), 'corridor': (1.90, 2.05, 2.10), 'fixed_gamma=-0.3': (2.01, 2.08, 2.23),
              'corridor_lr': (1.95, 2.00, 2.15)}
CORRIDOR_GAMMA = [[0.1, -0.2], [-0.5, -0.3], [-0.4, -1.2], [-0.6, -0.1], [-0.2, 0.07]]  # 5 layers × 2 heads, at the end


def fake_run(variant, seed):
    """What analyze.load_run gives for a finished run, made up: 5 evaluations of 50k tokens each; the corridors' γ
    moves by 0.02 per evaluation to CORRIDOR_GAMMA − 0.01·seed; attention and corridor log a walk (5 layers) whose
    δ_orth in layer 0 is 1 + 0.1·seed for attention, +0.04/0.05/0.06 for the corridor's P, −0.2/−0.1/−0.3 for its
    full operator."""
    final = FINAL_LOSS[variant][seed]
    if variant == 'attention':
        gamma = [[0.0] * 2 for _ in range(5)]
    elif variant.startswith('fixed_gamma'):
        gamma = [[-0.3] * 2 for _ in range(5)]
    else:
        gamma = [[g - 0.01 * seed for g in row] for row in CORRIDOR_GAMMA]
    moves = not variant.startswith(('attention', 'fixed'))
    log = []
    for k in range(5):
        entry = dict(iter=10 * k, tokens=50_000 * 10 * k, val_loss=final + 0.1 * (4 - k), train_loss=final,
                     gamma=[[g - 0.02 * (4 - k) * moves for g in row] for row in gamma], delta=[[1.0] * 2] * 5)
        if variant in ('attention', 'corridor'):
            def walk(first):
                return dict(delta_orth=[first, 1.2, 1.3, 1.4, 1.5], drift=[0.1] * 4, a_eff_fro=[2.0] * 5,
                            gram_diag_mean=[1.0] * 5, gram_offdiag_mean=[0.1] * 5)
            base = 1 + 0.1 * seed
            entry['walk'] = dict(attention=walk(base)) if variant == 'attention' else \
                dict(attention=walk(base + (0.04, 0.05, 0.06)[seed]), operator=walk(base + (-0.2, -0.1, -0.3)[seed]))
        log.append(entry)
    return dict(log=log, gamma=torch.tensor(gamma), delta=torch.ones(5, 2), params=1_234_567,
                config=dict(operator='attention' if variant == 'attention' else 'corridor'))


@pytest.fixture
def fake_study(monkeypatch):
    import matplotlib.figure
    monkeypatch.setattr(matplotlib.figure.Figure, 'savefig', lambda *args, **kwargs: None)  # the tables, not the PNGs
    loaded = {(v, s): fake_run(v, s) for v in FINAL_LOSS for s in range(3)}
    return {'tiny/a': (loaded, sweep.summarize(loaded, list(FINAL_LOSS)))}


# Hand computations. corridor − attention: −0.10, −0.05, −0.10: mean −0.0833, std 0.0289, t = 5.0 > t_0.975(2) = 4.303.
# fixed γ = −0.3 − attention: +0.01, −0.02, +0.03: mean +0.0067, std 0.0252. corridor_lr: t = 4.0 < 4.303.
# The corridor's γ: layer 0 mean −0.05, layers ≥ 1 mean −0.40375, all layers −0.333 (minus 0.01·seed);
# in −1 < γ < 0: layer 0 one head of 2, layers ≥ 1 six of 8.

def test_claims_report_states_the_paired_differences_and_occupancy(fake_study, tmp_path):
    lines = sweep.claims_figures(fake_study, tmp_path)
    assert "- a: learnable δ(γI+P) lowers val loss vs attention: -0.0833 ± 0.0289 → **lower**" in lines
    assert "- b: heads beyond the first layer in −1 < γ < 0: 75% (mean γ -0.343)" in lines
    assert "- c: γ ≥ 0 raises val loss vs learnable γ: not measured" in lines


def test_fixed_gamma_report_states_each_fixed_gammas_paired_difference(fake_study, tmp_path):
    row = next(line for line in sweep.fixed_gamma_figures(fake_study, tmp_path) if line.startswith('| tiny/a |'))
    cells = row.strip('| ').split(' | ')
    assert cells[1 + sweep.FIXED_GAMMAS.index(-0.3)] == '+0.0067 ± 0.0252 inconclusive'
    assert cells.count('–') == len(sweep.FIXED_GAMMAS) - 1
    assert cells[-1] == '-0.0833 ± 0.0289 → **lower** (γ̄ -0.343)'


def test_scales_report_states_size_difference_and_occupancy(fake_study, tmp_path):
    rows = [line for line in sweep.scales_figures(fake_study, tmp_path) if line.startswith('| tiny/a |')]
    assert rows == ['| tiny/a | 1.23M | 2.00M | -0.0833 ± 0.0289 | lower | 75% | -0.343 |']


def test_gamma_dynamics_report_states_where_gamma_ends_per_seed(fake_study, tmp_path):
    rows = [line for line in sweep.gamma_dynamics_figures(fake_study, tmp_path) if line.startswith('| tiny/a |')]
    assert '| tiny/a | corridor | 0 | -0.050 | -0.404 | [-1.20, +0.10] | 50% | 75% | 0.0200 | -0.1000 |' in rows
    assert '| tiny/a | corridor | 1 | -0.060 | -0.414 | [-1.21, +0.09] | 50% | 75% | 0.0200 | -0.0500 |' in rows
    assert '| tiny/a | corridor_lr | 2 | -0.070 | -0.424 | [-1.22, +0.08] | 50% | 75% | 0.0200 | -0.0500 |' in rows
    assert '| tiny/a | fixed_gamma=-0.3 | 2 | -0.300 | -0.300 | [-0.30, -0.30] | 100% | 100% | 0.0000 | +0.0300 |' in rows
    assert len(rows) == 9  # the three variants with operator scalars × 3 seeds; attention has none


def test_geometry_report_states_attentions_value_and_the_paired_differences(fake_study, tmp_path):
    lines = sweep.geometry_figures(fake_study, tmp_path)
    assert '| diagnostic | regime | attention | corridor: P | corridor: operator |' in lines  # only runs with a walk
    # layer 0 is the initial regime of 5 layers: attention 1.0, 1.1, 1.2 → 1.1; P +0.04, +0.05, +0.06 → t = 8.7;
    # the full operator −0.2, −0.1, −0.3 → t = 3.5 < 4.303
    assert '| δ_orth | initial | 1.1 | +0.05 ± 0.01 higher | -0.2 ± 0.1 inconclusive |' in lines
    assert any(line.startswith('| δ_orth | middle | 1.3 | ') for line in lines)  # layers 1–3
