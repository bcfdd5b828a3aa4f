"""sweep.py: variants and settings are valid runs, the paired statistics, an ad hoc sweep and a study end to end
(shared runs, skipped when finished), every study's figures, the GPU presets on CPU, one-line errors."""

import json
import math

import pytest
import torch

import sweep
from conftest import REPO, TINY_TRAIN_ARGS, assert_one_line_error, run_script
from model import GPT, GPTConfig

TINY_RUN = [*TINY_TRAIN_ARGS, '--max_iters=6', '--lr_decay_iters=6', '--eval_interval=3', '--eval_iters=2',
            '--walk_interval=3', '--walk_seqs=2']


def test_t_quantiles_match_the_printed_table_and_their_p_is_five_percent():
    for df, table in ((1, 12.706), (2, 4.303), (7, 2.365), (30, 2.042)):  # t_0.975 from any statistics table
        assert sweep.t_quantile(0.975, df) == pytest.approx(table, abs=5e-4)
        assert sweep.t_two_sided_p(table, df) == pytest.approx(0.05, abs=2e-4)


def test_t_p_values_match_the_closed_forms_at_one_and_two_degrees_of_freedom():
    for t in (0.3, 1.0, 3.0, 25.0):
        assert sweep.t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-10)  # Cauchy
        assert sweep.t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-10)
    assert sweep.t_two_sided_p(0.0, 5) == pytest.approx(1.0)


def test_power_and_detectable_effect_match_published_values_and_a_simulation():
    # R's pwr: pwr.t.test(n = 10, d = 1, type = 'paired') gives power 0.8031; d = 0.5 at 80 % needs n = 33.37
    assert sweep.t_test_power(math.sqrt(10), 9) == pytest.approx(0.8031, abs=2e-4)
    assert sweep.min_detectable_effect(1.0, 33) > 0.5 > sweep.min_detectable_effect(1.0, 34)
    # a float64 simulation: 4 pairs, true mean 1.5 SD: how often does |t| exceed t_0.975(3)?
    generator = torch.Generator().manual_seed(0)
    samples = torch.randn(200_000, 4, generator=generator, dtype=torch.float64) + 1.5
    t = samples.mean(1) / (samples.std(1) / 2)
    simulated = (t.abs() > sweep.t_quantile(0.975, 3)).double().mean().item()
    assert sweep.t_test_power(1.5 * 2, 3) == pytest.approx(simulated, abs=0.005)


def test_paired_test_by_hand():
    # differences 0.01, 0.04, 0.07: mean 0.04, SD 0.03, SE 0.03/√3, t = 2.309 on 2 df
    test = sweep.paired_test([0.01, 0.04, 0.07])
    se = 0.03 / math.sqrt(3)
    assert (test.n, test.mean, test.sd) == (3, pytest.approx(0.04), pytest.approx(0.03))
    assert (test.low, test.high) == (pytest.approx(0.04 - 4.303 * se, abs=1e-4), pytest.approx(0.04 + 4.303 * se, abs=1e-4))
    assert test.p == pytest.approx(1 - 2.309401 / math.sqrt(2.309401 ** 2 + 2), rel=1e-5)
    assert sweep.paired_test([-0.02]).p != sweep.paired_test([-0.02]).p  # one seed: no spread, no p (NaN)


def test_holm_by_hand_and_verdicts_follow_the_adjusted_p():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> kept monotone: 0.06
    assert sweep.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert sweep.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    lower = sweep.summary_test(-0.0031, 0.0006, 3)  # the README's claim (a) cell: p = 0.012
    assert lower.p == pytest.approx(0.0123, abs=2e-4)
    assert sweep.verdict(lower, lower.p) == 'lower'
    assert sweep.verdict(lower, 0.07).startswith('inconclusive, no effect larger than 0.0046')
    tests = sweep.Tests()
    cells = [tests.add('f', 'a', [-0.031, -0.030, -0.032]), tests.add('f', 'b', [0.01, -0.01, 0.02]),
             tests.add('g', 'c', [-0.031, -0.030, -0.032]), tests.add('f', 'a', [-0.031, -0.030, -0.032])]
    assert cells[0] == cells[3] and tests.add('f', 'd', []) == 'not measured'  # a test shown twice counts once
    tests.finish()
    a, b, c = tests.tests
    assert (a['family_size'], c['family_size']) == (2, 1) and a['p_holm'] == pytest.approx(2 * c['p_holm'])
    assert '**lower**' in tests.fill(cells[2])


def test_line_fit_by_hand():
    # y = 1 + 2x plus residuals +0.1, −0.2, +0.1 at x = 0, 1, 2: slope 2, SE √(0.06/1 / 2) = 0.1732, t on 1 df
    slope, low, high, p, n = sweep.line_fit([0, 1, 2], [1.1, 2.8, 5.1])
    assert (slope, n) == (pytest.approx(2.0), 3)
    assert (high - slope) == pytest.approx(12.706 * math.sqrt(0.06 / 2), abs=1e-3)
    assert p == pytest.approx(1 - 2 / math.pi * math.atan(2 / math.sqrt(0.03)), rel=1e-6)


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
    saved = json.loads((out_root / 'report.json').read_text())
    data = saved['settings']['sweep']
    assert len(data['corridor']['val_loss']) == 2 and data['fixed_gamma=-0.3']['gamma_mean'] == pytest.approx(-0.3)
    finals = {run: json.loads((out_root / run / 'log.jsonl').read_text().splitlines()[-1])['val_loss']
              for run in ('attention-s0', 'attention-s1', 'corridor-s0', 'corridor-s1')}
    differences = [finals['corridor-s0'] - finals['attention-s0'], finals['corridor-s1'] - finals['attention-s1']]
    assert data['corridor']['vs_attention_differences'] == pytest.approx(differences)  # paired by seed
    test = next(t for t in saved['tests'] if t['label'] == 'sweep: corridor − attention')
    assert test['family_size'] == 1 and test['p_holm'] == pytest.approx(test['p'])
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
    assert '- tiny: corridor − attention changes by ' in scales and 'over 4 seed pairs at 2 sizes' in scales
    dynamics = (tmp_path / 'gamma_dynamics_figures' / 'report.md').read_text()
    assert dynamics.count('| tiny/a | corridor | ') == 2 and dynamics.count('| tiny/a | corridor_lr | ') == 2  # per seed
    assert '- tiny/a, fixed_gamma=-0.3: heads beyond layer 0 with −1 < γ < -0.05: 100% over 2 seed(s)' in dynamics
    assert (tmp_path / 'gamma_dynamics_figures' / 'gamma_dynamics_tiny_a.png').stat().st_size > 1000
    geometry = (tmp_path / 'geometry_figures' / 'report.md').read_text()
    assert '| δ_orth | initial |' in geometry and '| corridor: P | corridor: operator |' in geometry
    assert '- drift to the next layer: slope per unit γ̄ ' in geometry and '(final evaluation, one point per run, n = 6)' in geometry
    assert '- geometry, corridor: P, every diagnostic × regime × setting: 16 test(s)' in geometry  # 4 × 2 regimes × 2
    for name in ('geometry_tiny_a.png', 'geometry_vs_gamma_tiny_b.png'):
        assert (tmp_path / 'geometry_figures' / name).stat().st_size > 1000
    data = json.loads((tmp_path / 'scales_figures' / 'report.json').read_text())['settings']
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
    assert '| openwebtext/gpt2_124m | 84.95M | 123.59M (50,257) | 1.23B (' in result.stdout  # 2,500 × 491,520 tokens
    hours = [float(row.split(' | ')[4]) for row in rows]
    assert hours == sorted(hours) and 'total to train:' in result.stdout
    assert not any(tmp_path.iterdir())


def plan_rows(stdout):
    """{setting: cells} of a printed plan."""
    return {row.split(' | ')[0][2:]: row.split(' | ')[1:] for row in stdout.splitlines()
            if row.startswith('| ') and not row.startswith('| setting')}


def test_plan_counts_parameters_as_the_readme_and_states_which(tmp_path):
    """The scales study's sizes: 0.11M / 0.80M / 2.68M as train.py counts them with Tiny Shakespeare's 65
    characters (the README's table), and the non-embedding count, 12·L·d² up to biases and layer norms."""
    (tmp_path / 'shakespeare_char').mkdir()
    (tmp_path / 'shakespeare_char' / 'meta.json').write_text(json.dumps(dict(vocab_size=65)))
    result = run_script('sweep.py', '--study=scales', '--plan=True', f'--out_root={tmp_path / "sweeps"}', '--',
                        f'--data_root={tmp_path}', cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'non-embedding: without the token and position embeddings' in result.stdout
    rows = plan_rows(result.stdout)
    for size, (layers, width), counted in (('tiny', (2, 64), '0.11M (65)'), ('small', (4, 128), '0.80M (65)'),
                                           ('medium-x2', (6, 192), '2.68M (65)')):
        non_embedding, as_counted = rows[f'shakespeare_char/{size}'][:2]
        assert as_counted == counted
        assert float(non_embedding.rstrip('M')) == pytest.approx(12 * layers * width ** 2 / 1e6, rel=0.02)
    assert rows['wikitext2_char/small'][1] == 'its data not prepared yet'


def test_gpu_with_variants_plans_gpt2_runs_or_refuses_a_base(tmp_path):
    result = run_script('sweep.py', '--gpu=True', '--variants=attention,corridor,gamma_nonneg', '--plan=True',
                        f'--out_root={tmp_path}', cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    row = plan_rows(result.stdout)['openwebtext/gpt2_124m']
    assert row[1] == '123.59M (50,257)' and row[2].startswith('1.23B') and row[4:6] == ['9', '9 |']
    assert_one_line_error(run_script('sweep.py', '--gpu=True', '--variants=attention', '--base=configs/_sweep_cpu.py ',
                                     '--plan=True', f'--out_root={tmp_path}', cwd=REPO), 'drop --base')
    assert_one_line_error(run_script('sweep.py', '--study=replication', '--gpu=True', '--plan=True',
                                     f'--out_root={tmp_path}', cwd=REPO), 'has no GPU runs')


def test_the_ladder_spans_twenty_fold_at_equal_tokens_per_parameter(tmp_path, tiny_data_root):
    result = run_script('sweep.py', '--study=ladder', '--plan=True', f'--out_root={tmp_path}', cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = plan_rows(result.stdout)
    assert len(rows) >= 4
    sizes = [float(cells[0].rstrip('M')) for cells in rows.values()]
    assert max(sizes) / min(sizes) >= 20
    ratios = [float(cells[2].split('(')[1].split()[0]) for cells in rows.values()]
    assert max(ratios) / min(ratios) < 1.1  # equal up to whole multiples of 60 iterations
    seeds = {p.setting: p.seeds for p in sweep.STUDIES['ladder'].parts}
    assert sorted(seeds.values())[1] >= 6 and min(seeds.values()) >= 3
    # tiny overrides after `--` win over a rung's budget, its size stays
    runs = sweep.plan_runs(sweep.STUDIES['ladder'].parts, 'sweeps', sweep.CPU,
                           [f'--data_root={tiny_data_root}', '--dataset=tiny', '--max_iters=6', '--lr_decay_iters=6'])
    config = sweep.parse_config(sweep.TRAIN_DEFAULTS, runs[('shakespeare_char/ladder-l', 'corridor', 0)][1])
    assert (config['max_iters'], config['n_layer'], config['n_embd'], config['dropout']) == (6, 6, 192, 0.1)


def test_claim_b_has_three_seeds_for_the_corridor_and_the_spread_start(tiny_data_root):
    runs = sweep.plan_runs(sweep.STUDIES['gamma_dynamics'].parts, 'sweeps', sweep.CPU,
                           [f'--data_root={tiny_data_root}', '--dataset=tiny'])
    for variant in ('attention', 'corridor', 'corridor_spread'):
        assert sum(key[:2] == ('shakespeare_char/small-long', variant) for key in runs) >= 3


def test_the_replication_report_puts_each_primary_test_beside_the_original_cell(tmp_path):
    finals = {'attention': [2.040, 2.050, 2.030, 2.045], 'corridor': [2.037, 2.046, 2.028, 2.041],
              'gamma_nonneg': [2.041, 2.050, 2.032, 2.045]}
    loaded = {(v, 100 + i): dict(log=[dict(val_loss=x)]) for v, xs in finals.items() for i, x in enumerate(xs)}
    tests = sweep.Tests()
    lines = sweep.replication_figures({'shakespeare_char/small': (loaded, {})}, str(tmp_path), tests, 'replication')
    tests.finish()
    text = tests.fill('\n'.join(lines))
    # corridor − attention: −0.003, −0.004, −0.002, −0.004: mean −0.00325, SD 0.000957, t = −6.79 on 3 df
    a = next(line for line in text.splitlines() if line.startswith('| (a) |'))
    assert '-0.0031 [-0.0046, -0.0016], p 0.012' in a and '-0.00325 [' in a and '**lower**' in a
    assert next(t for t in tests.tests if t['label'].endswith('corridor − attention'))['p'] == pytest.approx(
        sweep.t_two_sided_p(0.00325 / (0.000957427 / 2), 3), rel=1e-4)
    assert all(t['family_size'] == 1 for t in tests.tests)  # each claim's primary test alone in its family
