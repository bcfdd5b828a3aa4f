"""sweep.py: variants and settings are valid runs, the paired statistics, an ad hoc sweep and a study end to end
(shared runs, skipped when finished), every study's figures, the GPU presets on CPU, one-line errors."""

import json

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
                      for seed in range(p.first_seed, p.first_seed + p.seeds)}  # parts may overlap (more seeds for some variants): one run each
            assert set(runs) == wanted, name
    # the studies share their runs: the small Tiny Shakespeare attention runs serve four of them
    shared = [name for name, study in sweep.STUDIES.items()
              if any(p.setting == 'shakespeare_char/small' and 'attention' in p.variants for p in study.parts)]
    assert len(shared) >= 2


def test_the_replication_uses_seeds_no_other_study_uses(tiny_data_root):
    data = [f'--data_root={tiny_data_root}', '--dataset=tiny']
    replication = {seed for (_, _, seed) in sweep.plan_runs(sweep.STUDIES['replication'].parts, 'sweeps', sweep.CPU, data)}
    assert replication == set(range(100, 108))
    others = {seed for name, study in sweep.STUDIES.items() if name != 'replication'
              for parts in (study.parts, study.gpu_parts)
              for (_, _, seed) in sweep.plan_runs(parts, 'sweeps', sweep.CPU, data)}
    assert others and not others & replication


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
