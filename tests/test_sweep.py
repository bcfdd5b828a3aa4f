"""lab/sweep.py: variants and settings are valid runs, the paired statistics, an ad hoc sweep and a study end to end
(shared runs, skipped when finished), every study's figures, the GPU presets on CPU, one-line errors."""

import csv
import json
import math
import re
import statistics
from pathlib import Path

import pytest
import torch

from lab import reports, stats, studies, study_figures, sweep
from conftest import REPO, TINY_TRAIN_ARGS, assert_one_line_error, run_script, tiny_llama_and_its_wikitext
from common import UserError, parse_config
from model import GPT, GPTConfig
from train import DEFAULTS as TRAIN_DEFAULTS

TINY_RUN = [*TINY_TRAIN_ARGS, '--max_iters=6', '--lr_decay_iters=6', '--eval_interval=3', '--eval_iters=2',
            '--walk_interval=3', '--walk_seqs=2']


def test_t_quantiles_match_the_printed_table_and_their_p_is_five_percent():
    for df, table in ((1, 12.706), (2, 4.303), (7, 2.365), (30, 2.042)):  # t_0.975 from any statistics table
        assert stats.t_quantile(0.975, df) == pytest.approx(table, abs=5e-4)
        assert stats.t_two_sided_p(table, df) == pytest.approx(0.05, abs=2e-4)


def test_t_p_values_match_the_closed_forms_at_one_and_two_degrees_of_freedom():
    for t in (0.3, 1.0, 3.0, 25.0):
        assert stats.t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-10)  # Cauchy
        assert stats.t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-10)
    assert stats.t_two_sided_p(0.0, 5) == pytest.approx(1.0)


def test_power_and_detectable_effect_match_published_values_and_a_simulation():
    # R's pwr: pwr.t.test(n = 10, d = 1, type = 'paired') gives power 0.8031; d = 0.5 at 80 % needs n = 33.37
    assert stats.t_test_power(math.sqrt(10), 9) == pytest.approx(0.8031, abs=2e-4)
    assert stats.min_detectable_effect(1.0, 33) > 0.5 > stats.min_detectable_effect(1.0, 34)
    # a float64 simulation: 4 pairs, true mean 1.5 SD: how often does |t| exceed t_0.975(3)?
    generator = torch.Generator().manual_seed(0)
    samples = torch.randn(200_000, 4, generator=generator, dtype=torch.float64) + 1.5
    t = samples.mean(1) / (samples.std(1) / 2)
    simulated = (t.abs() > stats.t_quantile(0.975, 3)).double().mean().item()
    assert stats.t_test_power(1.5 * 2, 3) == pytest.approx(simulated, abs=0.005)


def test_seeds_for_power_match_published_values_a_simulation_and_scale_with_the_sd_squared():
    # R's pwr: pwr.t.test(d = 0.5, power = 0.8, type = 'paired') gives n = 33.37, so 34 pairs; d = 1 at n = 10: 0.8031
    assert stats.seeds_for_power(0.5, 1.0) == 34 and stats.seeds_for_power(-0.002, 0.004) == 34
    assert stats.seeds_for_power(1.0, 1.0) == 10
    # a float64 simulation, independent of scipy's noncentral t: 10 pairs at 1 SD reach 80 %, 9 do not
    generator = torch.Generator().manual_seed(0)
    for n, reaches in ((10, True), (9, False)):
        samples = torch.randn(200_000, n, generator=generator, dtype=torch.float64) + 1.0
        t = samples.mean(1) / (samples.std(1) / math.sqrt(n))
        assert ((t.abs() > stats.t_quantile(0.975, n - 1)).double().mean().item() >= 0.8) == reaches
    # n grows as (SD / effect)²: doubling the SD roughly quadruples it; a stricter level asks more; no effect, no n
    for effect in (0.001, 0.0005):
        ratio = stats.seeds_for_power(effect, 0.004) / stats.seeds_for_power(effect, 0.002)
        assert 3.5 < ratio < 4.2
    assert stats.seeds_for_power(0.5, 1.0, alpha=0.05 / 7) > 34 and stats.seeds_for_power(0.0, 1.0) == math.inf


def test_the_sds_upper_bound_is_the_chi_square_bound_and_covers_eighty_percent():
    # on 2 degrees of freedom χ² is exponential: its 20 % quantile is −2 ln 0.8
    assert stats.sd_upper_bound(0.01, 3) == pytest.approx(0.01 * math.sqrt(2 / (-2 * math.log(0.8))), rel=1e-12)
    generator = torch.Generator().manual_seed(1)
    pilots = torch.randn(200_000, 4, generator=generator, dtype=torch.float64).std(1)  # true SD 1, 4 seeds each
    covered = (pilots * stats.sd_upper_bound(1.0, 4) >= 1.0).double().mean().item()
    assert covered == pytest.approx(0.8, abs=0.005)


def test_paired_test_by_hand():
    # differences 0.01, 0.04, 0.07: mean 0.04, SD 0.03, SE 0.03/√3, t = 2.309 on 2 df
    test = stats.paired_test([0.01, 0.04, 0.07])
    se = 0.03 / math.sqrt(3)
    assert (test.n, test.mean, test.sd) == (3, pytest.approx(0.04), pytest.approx(0.03))
    assert (test.low, test.high) == (pytest.approx(0.04 - 4.303 * se, abs=1e-4), pytest.approx(0.04 + 4.303 * se, abs=1e-4))
    assert test.p == pytest.approx(1 - 2.309401 / math.sqrt(2.309401 ** 2 + 2), rel=1e-5)
    assert stats.paired_test([-0.02]).p != stats.paired_test([-0.02]).p  # one seed: no spread, no p (NaN)


def test_holm_by_hand_and_verdicts_follow_the_adjusted_p():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> kept monotone: 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    lower = stats.summary_test(-0.0031, 0.0006, 3)  # the README's claim (a) cell: p = 0.012
    assert lower.p == pytest.approx(0.0123, abs=2e-4)
    assert stats.verdict(lower, lower.p) == 'lower'
    assert stats.verdict(lower, 0.07).startswith('inconclusive, no effect larger than 0.0046')
    tests = stats.Tests()
    cells = [tests.add('f', 'a', [-0.031, -0.030, -0.032]), tests.add('f', 'b', [0.01, -0.01, 0.02]),
             tests.add('g', 'c', [-0.031, -0.030, -0.032]), tests.add('f', 'a', [-0.031, -0.030, -0.032])]
    assert cells[0] == cells[3] and tests.add('f', 'd', []) == 'not measured'  # a test shown twice counts once
    tests.finish()
    a, b, c = tests.tests
    assert (a['family_size'], c['family_size']) == (2, 1) and a['p_holm'] == pytest.approx(2 * c['p_holm'])
    tests.add('g', 'one seed', [0.01])  # has no p: the family still counts its one test, whatever the order
    tests.finish()
    assert {t['family']: t['family_size'] for t in tests.tests} == {'f': 2, 'g': 1}
    assert '**lower**' in tests.fill(cells[2])


def test_line_fit_by_hand():
    # y = 1 + 2x plus residuals +0.1, −0.2, +0.1 at x = 0, 1, 2: slope 2, SE √(0.06/1 / 2) = 0.1732, t on 1 df
    slope, low, high, p, n = stats.line_fit([0, 1, 2], [1.1, 2.8, 5.1])
    assert (slope, n) == (pytest.approx(2.0), 3)
    assert (high - slope) == pytest.approx(12.706 * math.sqrt(0.06 / 2), abs=1e-3)
    assert p == pytest.approx(1 - 2 / math.pi * math.atan(2 / math.sqrt(0.03)), rel=1e-6)


def test_weighted_line_fit_with_equal_weights_is_the_unweighted_fit_of_the_means():
    xs, means = [0.0, 0.5, 1.3, 2.0], [0.3, -0.1, 0.4, 1.2]
    for se in (1e-3, 0.7):  # any common SE: the scale comes from the residuals, not from the SEs
        assert stats.weighted_line_fit(xs, means, [se] * 4) == pytest.approx(stats.line_fit(xs, means))


def test_weighted_line_fit_by_hand():
    # means 0, 1, 3 at x = 0, 1, 2 with SEs 1, 1, 0.5: weights 1/SE² = 1, 1, 4; weighted x̄ 1.5, ȳ 13/6, Sxx 3.5,
    # Sxy 5.5: slope 11/7 (unweighted: 1.5); residuals 4/21, −8/21, 1/21, weighted χ² 4/21 on 3 − 2 = 1 df, so
    # Var(slope) = (4/21) / 3.5 = 8/147 and the CI is ± t_0.975(1) = 12.706 standard errors
    slope, low, high, p, k = stats.weighted_line_fit([0, 1, 2], [0, 1, 3], [1, 1, 0.5])
    assert (slope, k) == (pytest.approx(11 / 7), 3) and stats.line_fit([0, 1, 2], [0, 1, 3])[0] == pytest.approx(1.5)
    assert (high - slope, slope - low) == (pytest.approx(12.706 * math.sqrt(8 / 147), rel=1e-4),) * 2
    t = (11 / 7) / math.sqrt(8 / 147)
    assert p == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-6)  # two-sided p of t on 1 df
    assert stats.weighted_line_fit([0, 1, 2], [0, 1, 3], [3, 3, 1.5]) == pytest.approx((slope, low, high, p, k))


def test_weighted_line_fit_needs_three_points_each_with_a_standard_error():
    assert math.isnan(stats.weighted_line_fit([0, 1], [0, 1], [1, 1])[0])
    assert math.isnan(stats.weighted_line_fit([0, 1, 2], [0, 1, 3], [1, 0.0, 1])[0])
    assert math.isnan(stats.weighted_line_fit([0, 1, 2], [0, 1, 3], [1, float('nan'), 1])[0])


def differences_with_t(t, n):
    """n paired differences whose one-sample t statistic mean / (std / √n) is exactly t (std = 1)."""
    spread = [(-1) ** k for k in range(n)] if n % 2 == 0 else [-1.0, 0.0, 1.0] + [(-1) ** k for k in range(n - 3)]
    scale = 1 / statistics.stdev(spread)
    return [t / math.sqrt(n) + scale * x for x in spread]


# Student's t quantiles from printed tables (not from lab/sweep.py): two-sided 5 % = t_0.975; one-sided 5 % = t_0.95
@pytest.mark.parametrize('n,t_975,t_95,t_975_at_n', [(3, 4.303, 2.920, 3.182), (4, 3.182, 2.353, 2.776),
                                                     (8, 2.365, 1.895, 2.306)])
def test_verdict_flips_just_at_the_two_sided_critical_value_with_n_minus_1_degrees_of_freedom(
        n, t_975, t_95, t_975_at_n):
    """A t 1 % below t_0.975(n − 1) is inconclusive and its CI holds 0; 1 % above, neither: that rules out n degrees
    of freedom (a smaller critical value) and a one-sided test (smaller still), which both call the first one
    significant. (A family of one: the Holm p is p.)"""
    assert max(t_95, t_975_at_n) < 0.99 * t_975
    for sign, word in ((1, 'higher'), (-1, 'lower')):
        below = stats.paired_test(differences_with_t(sign * 0.99 * t_975, n))
        above = stats.paired_test(differences_with_t(sign * 1.01 * t_975, n))
        assert stats.verdict(below, below.p).startswith('inconclusive') and below.low < 0 < below.high
        assert stats.verdict(above, above.p) == word and not above.low < 0 < above.high
    test = stats.paired_test(differences_with_t(3.0, n))
    assert (test.mean, test.sd, test.n) == (pytest.approx(3.0 / math.sqrt(n)), pytest.approx(1.0), n)


def test_verdict_beyond_30_degrees_of_freedom_uses_the_exact_quantile():
    """t_0.975(40) = 2.021 (printed table): 2.01 is inconclusive, 2.03 is not."""
    for t, word in ((2.01, 'inconclusive'), (2.03, 'higher')):
        test = stats.paired_test(differences_with_t(t, 41))
        assert stats.verdict(test, test.p).startswith(word)


def test_variant_specs_carry_values_and_name_each_run_once():
    assert studies.parse_variant('fixed_gamma=-0.3') == ('fixed_gamma=-0.3', dict(
        operator='corridor', gamma_init=-0.3, learn_gamma=False, learn_delta=False))
    assert studies.parse_variant('fixed_gamma=-0.5')[0] == 'fixed_gamma'  # the default value: the plain name
    assert studies.parse_variant('corridor_lr=10')[0] == 'corridor_lr'
    assert studies.parse_variant('laplacian=3')[1] == dict(operator='laplacian', laplacian_heads=3)
    assert studies.parse_variant('corridor_spread=0.25')[1]['init_spread'] == 0.25


def test_every_study_plans_valid_runs_on_cpu_and_gpu(tiny_data_root):
    """Every run of every study, CPU parts and GPU presets, is a config train.py accepts (data: the tiny set)."""
    data = [f'--data_root={tiny_data_root}', '--dataset=tiny']
    for name, study in studies.STUDIES.items():
        for parts in (study.parts, study.gpu_parts):
            runs = sweep.plan_runs(parts, 'sweeps', studies.CPU, data)
            wanted = {(p.setting, studies.parse_variant(v)[0], seed) for p in parts for v in p.variants
                      for seed in range(p.first_seed, p.first_seed + p.seeds)}  # parts may overlap (more seeds for some variants): one run each
            assert set(runs) == wanted, name
    # the studies share their runs: the small Tiny Shakespeare attention runs serve four of them
    shared = [name for name, study in studies.STUDIES.items()
              if any(p.setting == 'shakespeare_char/small' and 'attention' in p.variants for p in study.parts)]
    assert len(shared) >= 2


def test_a_study_refuses_a_dtype_other_than_the_one_its_existing_runs_trained_with(tiny_data_root, tmp_path):
    """The published CPU studies train in float32 (their base config names it): a bfloat16 run planned into their
    folders would mix two precisions in one comparison."""
    data = [f'--data_root={tiny_data_root}', '--dataset=tiny']
    parts = studies.STUDIES['claims'].parts
    runs = sweep.plan_runs(parts, str(tmp_path), studies.CPU, data)
    assert {parse_config(TRAIN_DEFAULTS, args)['dtype'] for _, args in runs.values()} == {'float32'}
    out_dir = Path(next(iter(runs.values()))[0])
    out_dir.mkdir(parents=True)
    (out_dir / 'config.json').write_text(json.dumps(dict(operator='attention', dtype='float32')))
    assert sweep.plan_runs(parts, str(tmp_path), studies.CPU, data).keys() == runs.keys()
    with pytest.raises(UserError, match=re.escape(f"{out_dir} trained with dtype='float32', and this study now asks "
                                                  "for 'bfloat16'") + ".*another --out_root"):
        sweep.plan_runs(parts, str(tmp_path), studies.CPU, [*data, '--dtype=bfloat16'])


def test_the_replication_uses_seeds_no_other_study_uses(tiny_data_root):
    data = [f'--data_root={tiny_data_root}', '--dataset=tiny']
    replication = {seed for (_, _, seed) in sweep.plan_runs(studies.STUDIES['replication'].parts, 'sweeps', studies.CPU, data)}
    assert replication == set(range(100, 108))
    others = {seed for name, study in studies.STUDIES.items() if name != 'replication'
              for parts in (study.parts, study.gpu_parts)
              for (_, _, seed) in sweep.plan_runs(parts, 'sweeps', studies.CPU, data)}
    assert others and not others & replication


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
    result = run_script('lab.sweep', *args, cwd=tiny_data_root)
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
    again = run_script('lab.sweep', *args, cwd=tiny_data_root)
    assert again.returncode == 0 and '6 runs: 6 finished, 0 to train' in again.stdout
    assert (out_root / 'corridor-s0' / 'ckpt.pt').stat().st_mtime_ns == before


def test_every_study_in_the_table_has_its_own_figures_function():
    """lab/study_figures.py's FIGURES names a function for each study of STUDIES, called directly by the report."""
    assert set(study_figures.FIGURES) == set(studies.STUDIES)
    assert all(callable(figures) for figures in study_figures.FIGURES.values())


def test_studies_share_runs_and_write_every_figure(tiny_data_root, tmp_path, monkeypatch):
    """Two tiny settings, the variants every study's figures read: trained once, then reported as each study."""
    tiny = dict(dataset='tiny', data_root=str(tiny_data_root))
    monkeypatch.setitem(studies.SETTINGS, 'tiny/a', (studies.CPU, dict(tiny, n_embd=32)))
    monkeypatch.setitem(studies.SETTINGS, 'tiny/b', (studies.CPU, dict(tiny, n_embd=16)))
    train_args = [arg for arg in TINY_RUN if not arg.startswith('--n_embd')]  # the settings' own
    variants = ('attention', 'corridor', 'fixed_gamma=-0.3', 'corridor_lr')
    parts = tuple(studies.Part(s, variants, 2) for s in ('tiny/a', 'tiny/b'))
    for figures in ('claims_figures', 'fixed_gamma_figures', 'scales_figures', 'gamma_dynamics_figures',
                    'geometry_figures'):
        monkeypatch.setitem(studies.STUDIES, figures, studies.Study('a test', parts, ()))
        monkeypatch.setitem(study_figures.FIGURES, figures, getattr(study_figures, figures))
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
    # layer 0's mean γ minus the later layers', one value per seed, recomputed from the runs' last evaluations
    finals = [json.loads((tmp_path / 'tiny' / 'a' / f'corridor-s{s}' / 'log.jsonl').read_text().splitlines()[-1])['gamma']
              for s in (0, 1)]
    contrast = [statistics.fmean(g[0]) - statistics.fmean(x for layer in g[1:] for x in layer) for g in finals]
    assert "- tiny/a, corridor: heads beyond layer 0" in dynamics
    assert f"γ̄ layer 0 − γ̄ layers ≥ 1: {statistics.fmean(contrast):+.3f} [" in dynamics
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
    assert row.count(' | ') == header.count(' | ') and row.count('–') == len(studies.FIXED_GAMMAS) - 1
    assert '| δ_orth | initial |' in (tmp_path / 'geometry_figures' / 'report.md').read_text()


def test_the_powered_fixed_gamma_study_reports_its_named_tests(tiny_data_root, tmp_path, monkeypatch):
    """Claim (d)'s powered study: the two primary tests Holm-adjusted together, the secondary alone, each cell's
    seeds below zero counted from the runs, and the per-seed figure."""
    monkeypatch.setitem(studies.SETTINGS, 'tiny/a', (studies.CPU, dict(dataset='tiny', data_root=str(tiny_data_root))))
    part = studies.STUDIES['fixed_gamma_powered'].parts[0]
    assert part.seeds == 48 and part.setting == 'wikitext2_char/small'
    monkeypatch.setitem(studies.STUDIES, 'fixed_gamma_powered',
                        studies.STUDIES['fixed_gamma_powered']._replace(parts=(part._replace(setting='tiny/a', seeds=3),)))
    monkeypatch.chdir(REPO)
    sweep.main(['--study=fixed_gamma_powered', f'--out_root={tmp_path}', '--parallel=2', '--', *TINY_RUN])
    out = tmp_path / 'fixed_gamma_powered'
    tests = {t['label']: t for t in json.loads((out / 'report.json').read_text())['tests']}
    primary = [tests[f'tiny/a: fixed_gamma={g} − attention'] for g in (-0.1, -0.2)]
    assert [t['family_size'] for t in primary] == [2, 2]
    ps = sorted(t['p'] for t in primary)  # Holm over two: 2·p_min, then max(that, p_max)
    holm = [min(1.0, 2 * ps[0]), min(1.0, max(2 * ps[0], ps[1]))]
    assert sorted(t['p_holm'] for t in primary) == pytest.approx(holm)
    secondary = tests['tiny/a: corridor − attention']
    assert secondary['family_size'] == 1 and secondary['p_holm'] == pytest.approx(secondary['p'])
    finals = {run: json.loads((tmp_path / 'tiny' / 'a' / run / 'log.jsonl').read_text().splitlines()[-1])['val_loss']
              for run in [f'{v}-s{s}' for v in ('attention', 'fixed_gamma=-0.1') for s in range(200, 203)]}
    below = sum(finals[f'fixed_gamma=-0.1-s{s}'] < finals[f'attention-s{s}'] for s in range(200, 203))
    report = (out / 'report.md').read_text()
    assert '| tiny/a: fixed_gamma=-0.1 − attention | primary (Holm over 2) | 3 | ' in report
    assert f' | {below} of 3 |' in report and 'Wall time, tiny/a: 12 runs, ' in report
    assert (out / 'fixed_gamma_powered.png').stat().st_size > 1000


def test_the_settled_corridor_study_reports_its_named_tests_and_publishes_every_seed(tiny_data_root, tmp_path,
                                                                                     monkeypatch):
    """Claim (a) at 4× the budget: the primary test (corridor − attention) Holm-adjusted over the two corpora, the
    secondary ones likewise, where γ ends, the epochs and attention's last fall; per_seed.csv holds every run's
    exact final loss and mean γ, δ, the numbers docs/per_seed/ publishes."""
    settings = {f'{corpus}/small-x4' for corpus in ('wikitext2_char', 'shakespeare_char')}
    parts = studies.STUDIES['corridor_settled'].parts
    assert {p.setting for p in parts} == settings and len(parts) == 48 and {p.seeds for p in parts} == {1}
    assert sorted({p.first_seed for p in parts}) == list(range(300, 324))
    for setting in settings:
        monkeypatch.setitem(studies.SETTINGS, setting, (studies.CPU, dict(dataset='tiny', data_root=str(tiny_data_root))))
    monkeypatch.setitem(studies.STUDIES, 'corridor_settled', studies.STUDIES['corridor_settled']._replace(
        parts=tuple(p for p in parts if p.first_seed < 302)))
    monkeypatch.chdir(REPO)
    sweep.main(['--study=corridor_settled', f'--out_root={tmp_path}', '--parallel=2', '--', *TINY_RUN])
    out = tmp_path / 'corridor_settled'
    tests = {t['label']: t for t in json.loads((out / 'report.json').read_text())['tests']}
    for variant in (studies.parse_variant(v)[0] for v in studies.SETTLED[1:]):  # each one family over the 2 corpora
        pair = [tests[f'{setting}: {variant} − attention'] for setting in sorted(settings)]
        ps = sorted(t['p'] for t in pair)
        assert sorted(t['p_holm'] for t in pair) == pytest.approx([min(1, 2 * ps[0]), min(1, max(2 * ps[0], ps[1]))])
    report = (out / 'report.md').read_text()
    assert '| wikitext2_char/small-x4: corridor − attention | primary (Holm over 2) | 2 | ' in report
    assert '### Where γ ends' in report and '| wikitext2_char/small-x4 | corridor | 2 | ' in report
    assert '### The budget: repeated epochs, and no overfitting' in report and ' epochs of its ' in report
    rows = (out / 'per_seed.csv').read_text().splitlines()
    assert rows[0] == ','.join(reports.PER_SEED_FIELDS) and len(rows) == 1 + 2 * 4 * 2
    for row in rows[1:]:
        setting, variant, seed, _, _, val_loss, gamma, delta, _, change, at_start, previous = row.split(',')
        log = [json.loads(line) for line in (tmp_path / setting / f'{variant}-s{seed}' / 'log.jsonl').read_text().splitlines()]
        final = log[-1]
        assert float(val_loss) == final['val_loss'] and float(at_start) == log[0]['val_loss']  # exact
        assert float(previous) == log[-2]['val_loss'] and log[-2]['iter'] < final['iter']
        assert log[0]['iter'] == 0
        assert float(gamma) == pytest.approx(statistics.fmean(g for layer in final['gamma'] for g in layer), abs=1e-6)
        assert float(delta) == pytest.approx(statistics.fmean(d for layer in final['delta'] for d in layer), abs=1e-6)
        # the mean γ's move over the last quarter: last evaluation minus the one three quarters of the way
        means = [statistics.fmean(g for layer in e['gamma'] for g in layer) for e in log if 'gamma' in e]
        assert len(means) > 2 and float(change) == pytest.approx(means[-1] - means[int(0.75 * (len(means) - 1))], abs=1e-6)
    layers = (out / 'per_seed_layers.csv').read_text().splitlines()  # every layer of the 12 runs with operator scalars
    assert layers[0] == ','.join(reports.PER_LAYER_FIELDS) and len(layers) - 1 == 12 * len(final['gamma'])
    assert not any(',attention,' in row for row in layers)


def test_the_token_multiplier_plans_what_studies_md_names(tiny_data_root):
    """The plan docs/studies.md names: attention on WikiText-2 (char) at 1.1, 1.2 and 1.4 times X4's 4,800 iterations
    (each its own cosine to its end, X4's warmup and evaluations) on seeds 300-307, first and seed by seed; then the
    learnable corridor from γ0 = −0.1, δ0 = 1 at X4 on seeds 300-323, each run one of corridor_settled's seeds."""
    runs = list(sweep.plan_runs(studies.STUDIES['token_multiplier'].parts, 'sweeps', studies.CPU,
                                [f'--data_root={tiny_data_root}', '--dataset=tiny']))
    longer = [f'wikitext2_char/small-x4-{k}x' for k in ('1.1', '1.2', '1.4')]
    assert runs[:24] == [(s, 'attention', seed) for seed in range(300, 308) for s in longer]
    assert runs[24:] == [('wikitext2_char/small-x4', 'corridor_start', seed) for seed in range(300, 324)]
    x4 = studies.setting_config('wikitext2_char/small-x4')
    for setting, iters in zip(longer, (5280, 5760, 6720)):
        config = studies.setting_config(setting)
        assert config['max_iters'] == config['lr_decay_iters'] == iters and config['dataset'] == 'wikitext2_char'
        assert {k: config[k] for k in config if k not in ('max_iters', 'lr_decay_iters')} == \
            {k: x4[k] for k in x4 if k not in ('max_iters', 'lr_decay_iters')}
    assert studies.parse_variant('corridor_start')[1] == dict(operator='corridor', gamma_init=-0.1)
    assert GPTConfig().delta_init == 1.0
    settled = {seed for p in studies.STUDIES['corridor_settled'].parts for seed in range(p.first_seed, p.first_seed + p.seeds)}
    assert {seed for _, _, seed in runs} <= settled


def test_the_curves_file_has_every_evaluation_of_every_run_exactly(fake_study):
    """per_seed_curves.csv's rows: one per run and evaluation, in iteration order, the losses as logged (repr); an
    evaluation a resumed run logged twice appears once, with its last entry."""
    loaded, _ = fake_study['tiny/a']
    loaded[('attention', 0)]['log'].insert(2, dict(loaded[('attention', 0)]['log'][2], val_loss=9.0))  # logged twice
    rows = reports.per_eval_rows(fake_study)
    assert len(rows) == len(FINAL_LOSS) * 3 * 5 and set(rows[0]) == set(reports.CURVE_FIELDS)
    first = [r for r in rows if (r['variant'], r['seed']) == ('attention', 0)]
    assert [r['iter'] for r in first] == [0, 10, 20, 30, 40] and [r['tokens'] for r in first] == [0, 500_000, 1_000_000,
                                                                                              1_500_000, 2_000_000]
    assert [float(r['val_loss']) for r in first] == [2.0 + 0.1 * (4 - k) for k in range(5)]
    assert first[-1]['val_loss'] == repr(FINAL_LOSS['attention'][0]) and first[-1]['train_loss'] == repr(2.0)


def test_gammas_last_quarter_change_is_the_last_mean_minus_the_one_three_quarters_of_the_way():
    """Nine evaluations whose mean γ is −0.1·k: the last quarter starts at evaluation 6, so the change is −0.2."""
    series = [(100 * k, torch.full((2, 3), -0.1 * k), torch.ones(2, 3)) for k in range(9)]
    assert reports.last_quarter_change(series) == pytest.approx(-0.2)


def test_the_per_layer_file_says_where_each_layers_heads_end_and_how_far_they_still_move():
    """One corridor run, 2 layers × 4 heads, 9 evaluations in which only layer 1's first head still moves (by 0.01 an
    evaluation): per layer the final γ's mean, min, max, the share in −1 < γ < 0 and in −1 < γ < −0.05, the largest
    range of one head over the last quarter (evaluations 6–8: 0.02 in layer 1, 0 in layer 0), the heads and how
    many end above 0 and at 0; layer 1's −0.01 is in the corridor but not strictly inside; attention's
    run, with no operator scalars, has no rows."""
    final = torch.tensor([[-0.5, 0.0, 0.2, -1.5], [-0.2, -0.3, -0.1, -0.01]])
    moving = torch.zeros(2, 4)
    moving[1, 0] = 0.01
    series = [(10 * k, final + moving * (8 - k), torch.ones(2, 4)) for k in range(9)]
    corridor = dict(gamma=final, series=series)
    attention = dict(gamma=torch.zeros(2, 4), series=[(10 * k, torch.zeros(2, 4), torch.ones(2, 4)) for k in range(9)])
    results = {'tiny/a': ({('corridor', 0): corridor, ('attention', 0): attention},
                          {'corridor': dict(operator_scalars=True), 'attention': dict(operator_scalars=False)})}
    rows = reports.per_layer_rows(results)
    assert [(r['variant'], r['layer']) for r in rows] == [('corridor', 0), ('corridor', 1)]
    expected = [(-0.45, -1.5, 0.2, 0.25, 0.25, 0.0, 4, 1, 1), (-0.1525, -0.3, -0.01, 1.0, 0.75, 0.02, 4, 0, 0)]
    for row, values in zip(rows, expected):
        assert [float(row[k]) for k in reports.PER_LAYER_FIELDS[4:]] == pytest.approx(values, abs=1e-6)


def test_a_gpu_preset_starts_and_logs_on_cpu_with_tiny_overrides(tiny_data_root, tmp_path):
    result = run_script('lab.sweep', '--study=scales', '--gpu=True', '--seeds=1', f'--out_root={tmp_path}',
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
    (['--parallel=0'], "parallel and gpus_per_run must be at least 1"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    assert_one_line_error(run_script('lab.sweep', f'--out_root={tmp_path}', *args, cwd=REPO), message)
    assert not any(tmp_path.iterdir())


def test_help_lists_every_study_with_its_question_and_a_wrong_name_lists_the_same(tmp_path):
    """`python -m lab.sweep --help` lists the studies of STUDIES (the table --study is checked against), each once with
    its question and whether it has GPU parts; the error for a wrong name lists the same names in the same order."""
    result = run_script('lab.sweep', '--help', cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    section = result.stdout.split('\nStudies, --study=NAME')[1].split('\n\n')[0]
    listed = re.findall(r'^  (\w+) +(.*)$', section, re.M)
    assert [name for name, _ in listed] == list(studies.STUDIES)
    flat = ' '.join(section.split())
    for name, study in studies.STUDIES.items():
        question = ' '.join(study.question.split())
        assert f"{name} {question}" in flat and (f"{question} [GPU too]" in flat) == bool(study.gpu_parts), name
    error = run_script('lab.sweep', '--study=scale', f'--out_root={tmp_path}', cwd=REPO)
    assert_one_line_error(error, f"(choose from {', '.join(name for name, _ in listed)})")


def test_the_slurm_launcher_on_a_machine_without_slurm_is_one_line_and_writes_nothing(tiny_data_root, tmp_path):
    """`python -m lab.sweep --launcher=slurm` where there is no sbatch: exit 2, one `error:` line, no traceback, no
    run folder. This test makes SLURM absent itself: the command's PATH is an empty folder (sbatch is looked up on
    PATH), since .ci/run may have installed a local SLURM (tests/slurm_local.sh) in /usr/bin for test_launch.py."""
    nothing = tmp_path / 'empty_path'
    nothing.mkdir()
    out_root = tmp_path / 'sweeps'
    result = run_script('lab.sweep', '--variants=attention,corridor', '--seeds=1', f'--out_root={out_root}',
                        '--launcher=slurm', f'--base={REPO / "configs" / "_sweep_cpu.py"}', '--', *TINY_RUN,
                        f'--data_root={tiny_data_root}', cwd=tmp_path, env=dict(PATH=str(nothing)))
    assert_one_line_error(result, "--launcher=slurm needs SLURM's sbatch, and there is none on this machine's PATH",
                          "--launcher=local (or commands)")
    assert not out_root.exists() and result.stdout == ''


def test_plan_prints_the_gpu_budget_without_data_or_training(tmp_path):
    result = run_script('lab.sweep', '--study=scales', '--gpu=True', '--plan=True', f'--out_root={tmp_path}', cwd=REPO)
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
    result = run_script('lab.sweep', '--study=scales', '--plan=True', f'--out_root={tmp_path / "sweeps"}', '--',
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
    result = run_script('lab.sweep', '--gpu=True', '--variants=attention,corridor,gamma_nonneg', '--plan=True',
                        f'--out_root={tmp_path}', cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    row = plan_rows(result.stdout)['openwebtext/gpt2_124m']
    assert row[1] == '123.59M (50,257)' and row[2].startswith('1.23B') and row[4:6] == ['9', '9 |']
    assert_one_line_error(run_script('lab.sweep', '--gpu=True', '--variants=attention', '--base=configs/_sweep_cpu.py ',
                                     '--plan=True', f'--out_root={tmp_path}', cwd=REPO), 'drop --base')
    assert_one_line_error(run_script('lab.sweep', '--study=replication', '--gpu=True', '--plan=True',
                                     f'--out_root={tmp_path}', cwd=REPO), 'has no GPU runs')


def test_plan_hours_sit_on_the_step_latency_floor_for_a_model_too_small_for_its_flops(tmp_path, capsys):
    """A tiny model's FLOPs take microseconds a step, so its hours are the floor's exactly: max_iters × micro-steps ×
    PLAN_MICRO_STEP_FLOOR; GPT-2 124M's FLOPs take over twice the floor, so it is not listed at it."""
    parts = [studies.Part('shakespeare_char/tiny', ('attention',), 1), studies.Part('openwebtext/gpt2_124m', ('attention',), 1)]
    hours = sweep.print_plan(sweep.plan_runs(parts, str(tmp_path), studies.CPU, [], need_data=False))
    out = capsys.readouterr().out
    config = studies.setting_config('shakespeare_char/tiny')
    floor = config['max_iters'] * config['gradient_accumulation_steps'] * sweep.PLAN_MICRO_STEP_FLOOR / 3600
    assert hours['shakespeare_char/tiny'] == floor
    assert plan_rows(out)['shakespeare_char/tiny'][3] == f'{floor:.3g}'
    assert '\nat the step-latency floor, not FLOPs: shakespeare_char/tiny\n' in out  # and not the 124M setting
    big = studies.setting_config('openwebtext/gpt2_124m')
    assert hours['openwebtext/gpt2_124m'] > 2 * big['max_iters'] * big['gradient_accumulation_steps'] * \
        sweep.PLAN_MICRO_STEP_FLOOR / 3600


def test_gpu_power_entries_are_the_per_seed_files_paired_differences():
    """Every CPU effect a GPU study's seeds are sized by is its per-seed file's mean and SD of the paired differences
    (to the 4 decimals written), over the seeds named; its test is one the GPU study's runs can make, at the
    setting whose runs the printed stage-2 command (--variants=A,B --gpu=True) trains."""
    for name, tests in studies.GPU_POWER.items():
        variants = {studies.parse_variant(v)[0] for p in studies.STUDIES[name].gpu_parts for v in p.variants}
        assert {p.setting for p in studies.STUDIES[name].gpu_parts} == {'openwebtext/gpt2_124m'}
        for t in tests:
            with open(REPO / 'docs' / 'per_seed' / f'{t.source}.csv') as f:
                loss = {(r['variant'], r['seed']): float(r['val_loss']) for r in csv.DictReader(f) if r['setting'] == t.setting}
            differences = [loss[(t.a, seed)] - loss[(t.b, seed)] for (v, seed) in loss if v == t.a and (t.b, seed) in loss]
            assert len(differences) == t.seeds and {t.a, t.b} <= variants, t
            assert t.effect == pytest.approx(statistics.fmean(differences), abs=5e-5), t
            assert t.sd == pytest.approx(statistics.stdev(differences), abs=5e-5), t


def power_rows(stdout, columns):
    """{test: cells} of the printed table whose header has this many columns."""
    return {row.split(' | ')[0][2:].split(': ')[1]: row.split(' | ')[1:] for row in stdout.splitlines()
            if row.startswith('| openwebtext/') and ': ' in row.split(' | ')[0] and row.count(' | ') == columns - 1}


def test_gpu_plan_sizes_every_registered_test_and_costs_both_stages(tmp_path, capsys):
    sweep.main(['--study=claims', '--gpu=True', '--plan=True', f'--out_root={tmp_path}'])
    out = capsys.readouterr().out
    per_run = float(plan_rows(out)['openwebtext/gpt2_124m'][3])
    assert "Assumed at 124M: each test's effect and paired SD are the CPU's in nats" in out
    assert '| seeds at SD ×0.5 | ×1 | ×2 |' in out
    table, stage2, k = power_rows(out, 9), power_rows(out, 7), studies.PILOT_SEEDS
    tested = {}
    for t in studies.GPU_POWER['claims']:  # each test alone in its family: one setting, so at 5 %
        cells = table[f'{t.a} − {t.b}']
        assert cells[3] == '0.05' and [int(c) for c in cells[4:7]] == [stats.seeds_for_power(t.effect, m * t.sd)
                                                                         for m in (0.5, 1, 2)]
        n = stats.seeds_for_power(t.effect, stats.sd_upper_bound(t.sd, k))
        runs, hours = stage2[f'{t.a} − {t.b}'][3:5]
        assert (int(stage2[f'{t.a} − {t.b}'][1]), int(runs)) == (n, 2 * (n - k))
        assert float(hours) == pytest.approx(2 * (n - k) * per_run, rel=0.01)
        for variant in (t.a, t.b):
            tested[variant] = max(n, tested.get(variant, 0))
        # the row's command, as printed (with --plan=True: it would train on a GPU), plans exactly those runs
        command = stage2[f'{t.a} − {t.b}'][5].rstrip(' |')
        # the pilot's runs are found where they are
        assert command == f"python -m lab.sweep --variants={t.a},{t.b} --gpu=True --seeds={n} --out_root={tmp_path}"
        sweep.main([*command.split()[3:], '--plan=True'])
        planned = plan_rows(capsys.readouterr().out)['openwebtext/gpt2_124m']
        assert planned[3] == plan_rows(out)['openwebtext/gpt2_124m'][3] and int(planned[4]) == 2 * n
    pilot = re.search(f'--study=claims --gpu=True --seeds={k} --out_root=\\S+: (\\d+) runs, ([\\d.]+) h', out)
    assert int(pilot[1]) == k * len(studies.CLAIMS) and float(pilot[2]) == pytest.approx(int(pilot[1]) * per_run, rel=0.01)
    shared = sum(n - k for n in tested.values())  # a variant in two tests is trained once, to the larger N
    union = re.search(r'trained once\) \| \| \| \| (\d+) \| ([\d.]+) \|', out)
    assert int(union[1]) == shared and float(union[2]) == pytest.approx(shared * per_run, rel=0.01)
    assert 'under 80 % power with the planned seeds (3)' in out and 'cannot decide' not in out
    assert not any(tmp_path.iterdir())
    # the pilot's report in its folder: each test's measured SD, over the pairs it had, sizes the second stage; a test
    # the report lacks keeps the CPU's SD and says so; a test beyond 100 seeds is said to be undecidable
    report = tmp_path / 'fixed_gamma-gpu' / 'report.json'
    report.parent.mkdir()
    tests = studies.GPU_POWER['fixed_gamma']
    report.write_text(json.dumps(dict(tests=[dict(label=f'openwebtext/gpt2_124m: {t.a} − {t.b}', sd=0.002, n=4)
                                             for t in tests[:-1]])))
    sweep.main(['--study=fixed_gamma', '--gpu=True', '--plan=True', f'--out_root={tmp_path}'])
    out = capsys.readouterr().out
    assert f's: measured, from {report}' in out
    for t in tests[:-1]:
        alpha = 0.05 / (7 if t.a.startswith('fixed_gamma') else 1)  # the fixed-γ grid is one family of 7
        n = stats.seeds_for_power(t.effect, stats.sd_upper_bound(0.002, 4), alpha=alpha)
        assert power_rows(out, 7)[f'{t.a} − {t.b}'][:2] == ['0.0020', str(n)]
    last = tests[-1]
    assert power_rows(out, 7)[f'{last.a} − {last.b}'][0] == f"{last.sd:.4f} (the CPU's: not in the report)"
    assert 'fixed_gamma=-0.05 − attention | 0.0020 | 108 | 39 | – | – (over 100 seeds' in out
    sweep.main(['--variants=attention,corridor', '--gpu=True', '--plan=True', f'--out_root={tmp_path}'])
    assert 'an ad hoc sweep registers no test' in capsys.readouterr().out


def test_gpu_md_states_what_the_plan_prints(tmp_path, capsys):
    """docs/gpu.md's seeds tables, cell by cell, and its hours, as `--plan=True` prints them for claims and
    fixed_gamma: each test's seeds at SD ×0.5 / ×1 / ×2, the power of the 3 seeds planned, the two-stage N, its runs
    and hours, the pilot's, the total."""
    page = (REPO / 'docs' / 'gpu.md').read_text()
    printed = {}
    for name in ('claims', 'fixed_gamma'):
        sweep.main([f'--study={name}', '--gpu=True', '--plan=True', f'--out_root={tmp_path}'])
        out = capsys.readouterr().out
        seeds, stage2 = power_rows(out, 9), power_rows(out, 7)
        pilot = re.search(r'--seeds=4[^:]*: (\d+) runs, ([\d.]+) h', out)
        union = re.search(r'trained once\) \| \| \| \| (\d+) \| ([\d.]+) \|', out)
        total = re.search(r'pilot and stage 2: ([\d.]+) H100 hours', out)[1]
        planned = re.search(r'total to train: ([\d.]+) H100 hours', out)[1]
        printed[name] = seeds, stage2, pilot.groups(), union.groups(), total, planned
    seeds, stage2, pilot, union, total, planned = printed['claims']
    table = page.split('| claims test')[1].split('\n\n')[0].splitlines()[2:]
    assert len(table) == len(studies.GPU_POWER['claims'])
    for row, t in zip(table, studies.GPU_POWER['claims']):
        cells = [c.strip() for c in row.strip('|').split('|')]
        mine, theirs = seeds[f'{t.a} − {t.b}'], stage2[f'{t.a} − {t.b}']
        assert cells[2] == ' / '.join(mine[4:7]) and cells[3] == mine[7].split()[0].replace('%', ' %'), row
        assert cells[4] == theirs[1] and cells[5] == f'{theirs[3]}, {theirs[4]}', row
    assert f'{pilot[0]} runs, {pilot[1]} h' in page and f'{union[0]} runs, {union[1]} h' in page
    assert f'**{round(float(total))} H100 hours** with the pilot, against the {planned} planned' in page
    seeds, stage2, pilot, union, total, planned = printed['fixed_gamma']
    rows = {line.split(' | ')[0].strip('| '): [c.strip() for c in line.strip('|').split('|')[1:]]
            for line in page.split('| fixed γ, δ = 1 − attention')[1].split('\n\n')[0].splitlines()[2:]}
    for k, t in enumerate(studies.GPU_POWER['fixed_gamma']):
        mine, theirs = seeds[f'{t.a} − {t.b}'], stage2[f'{t.a} − {t.b}']
        assert rows['seeds at SD ×0.5 / ×1 / ×2'][k] == ' / '.join(mine[4:7]), t
        assert rows['two-stage N'][k].split(':')[0] == theirs[1], t
    assert f'Pilot {pilot[0]} runs, {pilot[1]} h' in page
    assert f'{union[0]} runs, {union[1]} h: **{round(float(total))} H100 hours**' in page


def test_the_ladder_spans_twenty_fold_at_equal_tokens_per_parameter(tmp_path, tiny_data_root):
    result = run_script('lab.sweep', '--study=ladder', '--plan=True', f'--out_root={tmp_path}', cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = plan_rows(result.stdout)
    assert len(rows) >= 4
    sizes = [float(cells[0].rstrip('M')) for cells in rows.values()]
    assert max(sizes) / min(sizes) >= 20
    ratios = [float(cells[2].split('(')[1].split()[0]) for cells in rows.values()]
    assert max(ratios) / min(ratios) < 1.1  # equal up to whole multiples of 60 iterations
    seeds = {p.setting: p.seeds for p in studies.STUDIES['ladder'].parts}
    assert sorted(seeds.values())[1] >= 6 and min(seeds.values()) >= 3
    # tiny overrides after `--` win over a rung's budget, its size stays
    runs = sweep.plan_runs(studies.STUDIES['ladder'].parts, 'sweeps', studies.CPU,
                           [f'--data_root={tiny_data_root}', '--dataset=tiny', '--max_iters=6', '--lr_decay_iters=6'])
    config = studies.parse_config(studies.TRAIN_DEFAULTS, runs[('shakespeare_char/ladder-l', 'corridor', 0)][1])
    assert (config['max_iters'], config['n_layer'], config['n_embd'], config['dropout']) == (6, 5, 140, 0.1)


def test_claim_b_has_three_seeds_for_the_corridor_and_the_spread_start(tiny_data_root):
    runs = sweep.plan_runs(studies.STUDIES['gamma_dynamics'].parts, 'sweeps', studies.CPU,
                           [f'--data_root={tiny_data_root}', '--dataset=tiny'])
    for variant in ('attention', 'corridor', 'corridor_spread'):
        assert sum(key[:2] == ('shakespeare_char/small-long', variant) for key in runs) >= 3


def test_the_replication_report_puts_each_primary_test_beside_the_original_cell(tmp_path):
    finals = {'attention': [2.040, 2.050, 2.030, 2.045], 'corridor': [2.037, 2.046, 2.028, 2.041],
              'gamma_nonneg': [2.041, 2.050, 2.032, 2.045]}
    loaded = {(v, 100 + i): dict(log=[dict(val_loss=x)]) for v, xs in finals.items() for i, x in enumerate(xs)}
    tests = stats.Tests()
    lines = study_figures.replication_figures({'shakespeare_char/small': (loaded, {})}, str(tmp_path), tests, 'replication')
    tests.finish()
    text = tests.fill('\n'.join(lines))
    # corridor − attention: −0.003, −0.004, −0.002, −0.004: mean −0.00325, SD 0.000957, t = −6.79 on 3 df
    a = next(line for line in text.splitlines() if line.startswith('| (a) |'))
    assert '-0.0031 [-0.0046, -0.0016], p 0.012' in a and '-0.00325 [' in a and '**lower**' in a
    assert next(t for t in tests.tests if t['label'].endswith('corridor − attention'))['p'] == pytest.approx(
        stats.t_two_sided_p(0.00325 / (0.000957427 / 2), 3), rel=1e-4)
    assert all(t['family_size'] == 1 for t in tests.tests)  # each claim's primary test alone in its family


# ------------------------------------------------------------------------------------------------ the reports' numbers

FINAL_LOSS = {'attention': (2.00, 2.10, 2.20), 'corridor': (1.90, 2.05, 2.10), 'fixed_gamma=-0.3': (2.01, 2.08, 2.23),
              'corridor_lr': (1.95, 2.00, 2.15)}
CORRIDOR_GAMMA = [[0.1, -0.2], [-0.5, -0.3], [-0.4, -1.2], [-0.6, -0.1], [-0.2, 0.07]]  # 5 layers × 2 heads, at the end


def fake_run(variant, seed):
    """What common.load_run gives for a finished run, made up: 5 layers × 2 heads of width 64, 5 evaluations of
    500k tokens each; the corridors' γ moves by 0.02 per evaluation to CORRIDOR_GAMMA − 0.01·seed; attention and
    corridor log a walk (5 layers) whose δ_orth in layer 0 is 1 + 0.1·seed for attention, +0.04/0.05/0.06 for the
    corridor's P, −0.2/−0.1/−0.3 for its full operator."""
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
    operator = 'attention' if variant == 'attention' else 'corridor'
    return dict(log=log, gamma=torch.tensor(gamma), delta=torch.ones(5, 2), params=1_234_567,
                config=dict(operator=operator, n_layer=5, n_head=2, n_embd=64, block_size=16))


@pytest.fixture
def fake_study(monkeypatch):
    import matplotlib.figure
    monkeypatch.setattr(matplotlib.figure.Figure, 'savefig', lambda *args, **kwargs: None)  # the tables, not the PNGs
    loaded = {(v, s): fake_run(v, s) for v in FINAL_LOSS for s in range(3)}
    return {'tiny/a': (loaded, reports.summarize(loaded, list(FINAL_LOSS)))}


def report_of(figures, results, tmp_path, study):
    """A study's figure lines with every test's cell filled in, as report() writes them."""
    tests = stats.Tests()
    lines = figures(results, str(tmp_path), tests, study)
    tests.finish()
    return tests.fill('\n'.join(lines)).splitlines()


def cell_by_hand(differences, family_size=1):
    """The start of the report's cell for 3 paired differences, from the printed t_0.975(2) = 4.303 and the closed
    form of the two-sided p at 2 degrees of freedom, 1 − |t| / √(2 + t²); Holm for the smallest p of its family
    when every other p is 1: family_size · p."""
    n, mean = len(differences), statistics.fmean(differences)
    se = statistics.stdev(differences) / math.sqrt(n)
    t = mean / se
    p = 1 - abs(t) / math.sqrt(2 + t * t)
    return (f"{mean:+.3g} [{mean - 4.303 * se:+.2g}, {mean + 4.303 * se:+.2g}], p {p:.3f}, "
            f"Holm {min(1, family_size * p):.3f}, MDE ")


# Hand computations. corridor − attention: −0.10, −0.05, −0.10: mean −0.0833, t = −5.0, p = 0.038 (lower).
# fixed γ = −0.3 − attention: +0.01, −0.02, +0.03: t = 0.46, p = 0.69. corridor_lr: t = −4.0, p = 0.057.
# The corridor's γ: layer 0 mean −0.05, layers ≥ 1 mean −0.40375, all layers −0.333 (minus 0.01·seed);
# in −1 < γ < 0: layer 0 one head of 2, layers ≥ 1 six of 8.
CORRIDOR = [-0.10, -0.05, -0.10]


def assert_cell(text, differences, words, family_size=1):
    prefix = cell_by_hand(differences, family_size)
    assert prefix in text and text.split(prefix, 1)[1].split(': ', 1)[1].startswith(words), (prefix, words, text)


def test_a_studys_occupancy_figure_draws_the_settled_share_beside_the_corridors(monkeypatch, tmp_path):
    """Seed means by layer of both shares, as analyze.py draws one run's: here the corridor's head at γ = −0.03 is in
    the corridor (−1 < γ < 0) but not settled in it (γ < −0.05), so the two differ where it is."""
    loaded = {(v, s): fake_run(v, s) for v in ('attention', 'corridor') for s in range(2)}
    for s in range(2):
        loaded[('corridor', s)]['gamma'][0] = torch.tensor([-0.03, -0.5])
    summary = reports.summarize(loaded, ['attention', 'corridor'])
    assert summary['corridor']['occupancy_by_layer'][0] == 1.0
    assert summary['corridor']['inside_claim_b_by_layer'][0] == 0.5
    drawn = {}
    monkeypatch.setattr(reports, 'plot_occupancy', lambda runs, path, attention=(): drawn.update(runs=runs))
    monkeypatch.setattr(reports, 'plot_sweep_losses', lambda *args: None)
    monkeypatch.setattr(reports, 'plot_evolution', lambda *args: None)
    reports.setting_figures('tiny/a', loaded, summary, str(tmp_path))
    layers = drawn['runs']['corridor']['layers']
    assert [r['occupancy'] for r in layers] == summary['corridor']['occupancy_by_layer']
    assert [r['inside_claim_b'] for r in layers] == summary['corridor']['inside_claim_b_by_layer']


def test_claims_report_states_the_paired_differences_and_occupancy(fake_study, tmp_path):
    lines = report_of(study_figures.claims_figures, fake_study, tmp_path, 'claims')
    a = next(line for line in lines if line.startswith('- a: learnable δ(γI+P) lowers val loss vs attention: '))
    assert_cell(a, CORRIDOR, '**lower**')
    assert "- b: heads beyond the first layer in −1 < γ < 0: 75% (mean γ -0.343)" in lines
    assert "- c: γ ≥ 0 raises val loss vs learnable γ: not measured" in lines


def test_fixed_gamma_report_states_each_fixed_gammas_paired_difference(fake_study, tmp_path):
    row = next(line for line in report_of(study_figures.fixed_gamma_figures, fake_study, tmp_path, 'fixed_gamma')
               if line.startswith('| tiny/a |'))
    cells = row.strip('| ').split(' | ')
    assert_cell(cells[1 + studies.FIXED_GAMMAS.index(-0.3)], [0.01, -0.02, 0.03], 'inconclusive, no effect larger '
                'than 0.069')  # the CI's far bound, +0.0067 + 4.303 · 0.01453
    assert cells.count('–') == len(studies.FIXED_GAMMAS) - 1
    assert_cell(cells[-1], CORRIDOR, '**lower** (γ̄ -0.343)')


def test_scales_report_states_size_difference_and_occupancy(fake_study, tmp_path):
    rows = [line for line in report_of(study_figures.scales_figures, fake_study, tmp_path, 'scales')
            if line.startswith('| tiny/a |')]
    # non-embedding: 5 blocks of 12·64² weights, 13·64 biases and LayerNorm entries, 4 corridor scalars, + ln_f:
    # 250,068; tokens 4 evaluations × 500k = 2.00M, 8.0 per parameter
    assert len(rows) == 1 and rows[0].startswith('| tiny/a | 0.25M | 2.00M | 8.0 | ')
    assert rows[0].endswith(' | 75% | -0.343 |')
    assert_cell(rows[0], CORRIDOR, '**lower**')


def test_ladder_report_states_the_pre_registered_slope_and_the_precision_weighted_one(fake_study, tmp_path):
    """Three sizes at 10^5, 10^6, 10^7 non-embedding parameters whose differences spread more with size: the
    unweighted fit over the 9 seed pairs, labelled pre-registered in the ladder's report, and beside it the sizes'
    means fitted with weights 1/SE²."""
    import copy

    import numpy as np
    loaded, base = fake_study['tiny/a']
    differences = [[-0.001, 0.000, -0.002], [-0.004, -0.002, -0.009], [0.01, -0.03, 0.02]]
    results = {}
    for i, d in enumerate(differences):
        summary = copy.deepcopy(base)
        summary['corridor'].update(non_embedding_params=10 ** (5 + i), vs_attention_differences=d)
        results[f'tiny/{"abc"[i]}'] = (loaded, summary)
    lines = report_of(study_figures.scales_figures, results, tmp_path, 'ladder')
    slope = stats.line_fit([5 + i for i, d in enumerate(differences) for _ in d], sum(differences, []))[0]
    unweighted = next(line for line in lines if line.startswith('- tiny: corridor − attention changes by '))
    assert f'{slope:+.4f} per tenfold' in unweighted
    assert '(pre-registered, unweighted: least squares over 9 seed pairs at 3 sizes' in unweighted
    means = [statistics.fmean(d) for d in differences]
    ses = [statistics.stdev(d) / math.sqrt(3) for d in differences]
    weighted = np.polyfit([5, 6, 7], means, 1, w=[1 / se for se in ses])[0]  # numpy's w is 1/SE
    line = lines[lines.index(unweighted) + 1]
    assert line.startswith(f'  - precision-weighted: {weighted:+.4f} per tenfold, 95 % CI [')
    assert "the 3 sizes' mean differences, weights 1/SE², scale from the residuals, t on 1 df" in line
    scales = report_of(study_figures.scales_figures, results, tmp_path, 'scales')
    assert not any('pre-registered' in line for line in scales) and any('(unweighted: least' in line for line in scales)


def test_gamma_dynamics_report_states_where_gamma_ends_per_seed(fake_study, tmp_path):
    rows = [line for line in report_of(study_figures.gamma_dynamics_figures, fake_study, tmp_path, 'gamma_dynamics')
            if line.startswith('| tiny/a |')]
    # seed 0: −1 < γ < −0.05 in layer 0 (0.1, −0.2): 50 %, layer 1: 100 %, layer 2 (−0.4, −1.2): 50 %, ...; the last
    # quarter is the last two evaluations, 0.02 apart; the gap to attention 1.90 − 2.00
    assert ('| tiny/a | corridor | 0 | 50% / 100% / 50% / 100% / 50% | -0.050 | -0.404 | [-1.20, +0.10] | 0.020 '
            '| -0.1000 |') in rows
    assert ('| tiny/a | corridor_lr | 2 | 50% / 100% / 50% / 100% / 50% | -0.070 | -0.424 | [-1.22, +0.08] | 0.020 '
            '| -0.0500 |') in rows
    assert ('| tiny/a | fixed_gamma=-0.3 | 2 | 100% / 100% / 100% / 100% / 100% | -0.300 | -0.300 | [-0.30, -0.30] '
            '| 0.000 | +0.0300 |') in rows
    assert len(rows) == 9  # the three variants with operator scalars × 3 seeds; attention has none


def test_geometry_report_states_attentions_value_and_the_paired_differences(fake_study, tmp_path):
    lines = report_of(study_figures.geometry_figures, fake_study, tmp_path, 'geometry')
    # layer 0 is the initial regime of 5 layers: attention 1.0, 1.1, 1.2 → 1.1; P +0.04, +0.05, +0.06 → t = 8.7;
    # the full operator −0.2, −0.1, −0.3 → t = 3.5 < 4.303
    # each is the smallest p of its Holm family (the corridor's P, or its operator, over 4 diagnostics × 3 regimes),
    # every other difference in it being exactly 0 (p = 1)
    cells = next(line for line in lines if line.startswith('| δ_orth | initial |')).strip('| ').split(' | ')
    assert cells[2] == '1.1'
    assert_cell(cells[3], [0.04, 0.05, 0.06], 'inconclusive, no effect larger than 0.075', family_size=12)
    assert_cell(cells[4], [-0.2, -0.1, -0.3], 'inconclusive, no effect larger than 0.45', family_size=12)
    assert any(line.startswith('| δ_orth | middle | 1.3 | ') for line in lines)  # layers 1–3
    # per_seed_walk.csv: every run's regime values, exact, from which those differences come again
    with open(tmp_path / 'per_seed_walk.csv', newline='') as f:
        walk = {(r['variant'], int(r['seed']), r['part'], r['diagnostic'], r['regime']): float(r['value'])
                for r in csv.DictReader(f) if r['setting'] == 'tiny/a'}
    assert [walk[('attention', s, 'P', 'delta_orth', 'initial')] for s in range(3)] == [1.0, 1.1, 1.2]
    assert [walk[('corridor', s, 'P', 'delta_orth', 'initial')] - walk[('attention', s, 'P', 'delta_orth', 'initial')]
            for s in range(3)] == pytest.approx([0.04, 0.05, 0.06])
    assert ('attention', 0, 'operator', 'delta_orth', 'initial') not in walk  # attention has one part


def test_the_pretrained_plan_counts_the_models_own_parameters_and_no_weight_gradients_when_frozen(tmp_path):
    """A Llama config folder (no weights): its parameters as train.py counts them (tied embedding once) and without
    the embedding, by hand; operator-only runs cost 4N per token (no weight gradients), full fine-tuning 6N."""
    import transformers
    # large enough (63M parameters, counted on the meta device) that its FLOPs, not the per-step latency floor, bound
    # both runs' estimates
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                                      num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True)
    config.save_pretrained(tmp_path / 'llama')
    layer = 512 * 512 * 2 + 2 * 512 * 256 + 3 * 512 * 2048 + 2 * 512  # q, o; k, v (4 KV heads of 64); MLP; 2 norms
    non_embedding = 12 * layer + 512                                    # and the final norm
    result = run_script('lab.sweep', '--study=pretrained', '--gpu=True', '--plan=True', f'--out_root={tmp_path}', '--',
                        f'--init_from={tmp_path / "llama"}', cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = plan_rows(result.stdout)
    operator, full = rows['wikitext2_qwen2.5-0.5b/operator'], rows['wikitext2_qwen2.5-0.5b/full']
    assert operator[0] == f'{non_embedding / 1e6:.2f}M' and operator[1] == f'{(non_embedding + 32000 * 512) / 1e6:.0f}M'
    assert 'step-latency floor' not in result.stdout
    tokens = {name: float(row[2].split('M')[0]) for name, row in (('operator', operator), ('full', full))}
    hours = {name: float(row[3]) for name, row in (('operator', operator), ('full', full))}
    assert hours['full'] / hours['operator'] == pytest.approx(6 / 4 * tokens['full'] / tokens['operator'], rel=0.02)


def test_the_loss_figure_draws_every_variant_and_pairs_with_attention_only_where_there_is_attention(monkeypatch):
    """Left panel: each variant's mean curve over its own seeds; right panel, only with attention runs: each
    variant − attention by seed. The pretrained study has no attention: its figure was two empty panels."""
    drawn = []
    monkeypatch.setattr(reports, 'save', lambda fig, path: drawn.append(fig))

    def run(*losses):
        return dict(log=[dict(tokens=i * 1000, val_loss=v) for i, v in enumerate(losses)])
    without = {('corridor', 0): run(9, 3.0, 2.8, 2.6), ('corridor', 1): run(9, 3.2, 3.0, 2.8),
               ('delta_only', 0): run(9, 3.1, 2.9, 2.7)}
    reports.plot_sweep_losses(without, ['corridor', 'delta_only'], 'unused.png', 'wiki')
    (ax,) = drawn.pop().axes
    lines = {line.get_label(): line.get_ydata().tolist() for line in ax.get_lines()}
    assert lines == {'corridor (2 seeds)': pytest.approx([3.1, 2.9, 2.7]), 'delta_only (1 seed)': [3.1, 2.9, 2.7]}

    with_attention = {**without, ('attention', 0): run(9, 3.3, 3.0, 2.9), ('attention', 1): run(9, 3.3, 3.1, 3.0)}
    reports.plot_sweep_losses(with_attention, ['attention', 'corridor', 'delta_only'], 'unused.png', 'wiki')
    left, right = drawn.pop().axes
    assert len(left.get_lines()) == 3
    differences = {c.get_label(): c.lines[0].get_ydata().tolist() for c in right.containers}
    assert differences == {'corridor': pytest.approx([-0.2, -0.15, -0.25]),  # seeds 0 and 1
                           'delta_only': pytest.approx([-0.2, -0.1, -0.2])}                 # seed 0 alone


def test_the_pretrained_report_pairs_the_corridor_with_delta_only_and_with_the_frozen_model(tmp_path):
    """Made-up runs of two seeds: corridor − δ-only is paired at the final evaluation, each − frozen against its own
    run's evaluation at iteration 0 (γ = 0, δ = 1: the frozen model on the same batches)."""
    def run(first, last, gamma, seconds):
        log = [dict(iter=i, tokens=i * 1000, val_loss=v, gamma=[[g] * 2] * 3) for i, v, g in
               ((0, first, 0.0), (5, (first + last) / 2, gamma / 2), (10, last, gamma))]
        return dict(log=log, seconds=seconds)
    loaded = {('corridor', 0): run(3.00, 2.90, -0.2, 600), ('corridor', 1): run(3.10, 2.96, -0.3, 660),
              ('delta_only', 0): run(3.00, 2.95, 0.0, 590), ('delta_only', 1): run(3.10, 3.02, 0.0, 650)}
    summary = {v: dict(seeds=[0, 1]) for v in ('corridor', 'delta_only')}
    tests = stats.Tests()
    lines = study_figures.pretrained_figures({'wiki/operator': (loaded, summary)}, str(tmp_path), tests, 'pretrained')
    tests.finish()
    text = tests.fill('\n'.join(lines))
    by_label = {t['label']: t for t in tests.tests}
    assert by_label['wiki/operator: corridor − delta_only']['differences'] == pytest.approx([-0.05, -0.06])
    assert by_label['wiki/operator: corridor − frozen']['differences'] == pytest.approx([-0.10, -0.14])
    assert by_label['wiki/operator: delta_only − frozen']['differences'] == pytest.approx([-0.05, -0.08])
    assert '| wiki/operator | corridor | 1 | 3.1000 → 2.9600 | -0.300 [-0.30, -0.30] | 100% | 100% | 0.150 | 11 min |' \
        in text
    assert (tmp_path / 'pretrained_wiki_operator.png').stat().st_size > 1000


# ------------------------------------------------------------------------------------------------------------
# the pretrained study at 135M: its cells, the frozen model's fixed-γ curve (an evaluation), the report

def test_the_pretrained_study_trains_every_cell_with_four_seeds_claim_c_first(tiny_data_root):
    parts = studies.STUDIES['pretrained'].parts
    runs = list(sweep.plan_runs(parts, 'sweeps', studies.CPU, [f'--data_root={tiny_data_root}', '--dataset=tiny']))
    variants = {v for _, v, _ in runs}
    fixed = studies.parse_variant(f'fixed_gamma_delta={studies.PRETRAINED_FIXED_GAMMA}')[0]
    assert variants == {'gamma_nonneg', 'corridor', 'delta_only', fixed, 'alpha', 'alpha_beta'}
    assert all(sorted(s for _, w, s in runs if w == v) == [0, 1, 2, 3] for v in variants)  # 3 df a cell
    assert [v for _, v, _ in runs[:2]] == ['gamma_nonneg', 'corridor']  # claim (c)'s pair trains first
    assert studies.parse_variant('fixed_gamma_delta=-0.2')[1] == dict(operator='corridor', gamma_init=-0.2,
                                                                    learn_gamma=False)  # δ learns
    for _, a, b in study_figures.PRETRAINED_CELLS:  # every cell's variants are trained
        assert {a, b} - {'frozen'} <= {v.split('=')[0] for v in variants}
    assert studies.PRETRAINED_FIXED_GAMMA in studies.PRETRAINED_GAMMAS and studies.PRETRAINED_FIXED_GAMMA < 0


@pytest.fixture(scope='module')
def tiny_frozen(tmp_path_factory):
    """A random tiny Llama with its own word tokenizer, WikiText-2-shaped data prepared with it, and a setting's base
    config that freezes it (as configs/smollm2_operator.py does SmolLM2)."""
    root = tmp_path_factory.mktemp('frozen')
    model_dir, dataset = tiny_llama_and_its_wikitext(root, train_sentences=400, test_sentences=200)
    config = root / 'tiny_operator.py'
    config.write_text(f"init_from = {str(model_dir)!r}\ntrain_only = 'operator'\noperator = 'corridor'\n"
                      f"dataset = {dataset!r}\ndata_root = {str(root)!r}\ndevice = 'cpu'\n"
                      "compile = False\ndtype = 'float32'\nblock_size = 16\nbatch_size = 4\neval_iters = 3\n"
                      "max_iters = 0\nlr_decay_iters = 10\nwarmup_iters = 2\n")
    return root, config


def iteration0_val_loss(root, config, out, *args):
    """train.py's own evaluation at iteration 0 (max_iters = 0: no step), its log's val loss."""
    result = run_script('train.py', str(config), f'--out_dir={out}', '--seed=0', *args, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / 'log.jsonl').read_text().splitlines()[0])['val_loss']


def test_the_frozen_curve_evaluates_train_pys_batches_at_each_fixed_gamma_and_continues(tiny_frozen, tmp_path,
                                                                                       monkeypatch):
    """γ = 0 is the pretrained model on the very batches train.py evaluates for the seed; a fixed γ is the model
    train.py builds with gamma_init = γ, δ = 1 (on every weight frozen, a run with nothing to train: train_only=all
    at max_iters = 0 evaluates it); a rerun reads the file; a new γ evaluates only itself; other batches: all again."""
    root, config = tiny_frozen
    monkeypatch.setitem(studies.SETTINGS, 'tiny/operator', (str(config), dict()))
    losses, seconds = sweep.frozen_gamma_losses('tiny/operator', str(tmp_path), gammas=(-0.3, 0.0))
    assert [len(v) for v in losses.values()] == [3, 3] and all(s > 0 for s in seconds.values())
    assert statistics.fmean(losses[0.0]) == pytest.approx(iteration0_val_loss(root, config, tmp_path / 'r0'), rel=1e-6)
    assert statistics.fmean(losses[-0.3]) == pytest.approx(iteration0_val_loss(
        root, config, tmp_path / 'r1', '--train_only=all', '--gamma_init=-0.3', '--learn_gamma=False',
        '--learn_delta=False'), rel=1e-6)
    assert losses[-0.3] != losses[0.0]
    # seed 1's batches are other batches
    other = sweep.frozen_gamma_losses('tiny/operator', str(tmp_path / 'seed1'), gammas=(0.0,), seed=1)[0]
    assert other[0.0] != losses[0.0]

    loads = []
    real = sweep.pretrained.load_pretrained
    monkeypatch.setattr(sweep.pretrained, 'load_pretrained', lambda *a, **k: loads.append(a) or real(*a, **k))
    assert sweep.frozen_gamma_losses('tiny/operator', str(tmp_path), gammas=(-0.3, 0.0))[0] == losses
    assert loads == []  # read from the file, nothing evaluated
    again = sweep.frozen_gamma_losses('tiny/operator', str(tmp_path), gammas=(-0.3, -0.1, 0.0))[0]
    saved = json.loads((tmp_path / 'tiny' / 'operator' / 'frozen_gamma.json').read_text())
    assert len(loads) == 1 and sorted(saved['losses']) == ['+0', '-0.1', '-0.3']
    assert again[-0.3] == losses[-0.3] and again[0.0] == losses[0.0]
    sweep.frozen_gamma_losses('tiny/operator', str(tmp_path), gammas=(0.0,), train_args=['--eval_iters=2'])
    saved = json.loads((tmp_path / 'tiny' / 'operator' / 'frozen_gamma.json').read_text())
    assert sorted(saved['losses']) == ['+0'] and len(saved['losses']['+0']) == 2  # other batches: a fresh file


def test_the_frozen_curve_evaluates_as_a_run_does_under_bf16_autocast_and_lets_go_of_the_model(tiny_frozen, tmp_path,
                                                                                              monkeypatch):
    """The run's device and dtype, autocast on: γ = 0 is a bf16 run's iteration-0 loss (not a float32 evaluation's),
    and no model is left alive in the sweep's process when the curve is done (the runs need the device's memory)."""
    import gc
    import weakref
    root, config = tiny_frozen
    monkeypatch.setitem(studies.SETTINGS, 'tiny/operator', (str(config), dict()))
    loaded, real = [], sweep.pretrained.load_pretrained

    def load(*args, **kwargs):
        model, meta = real(*args, **kwargs)
        loaded.append(weakref.ref(model))
        return model, meta
    monkeypatch.setattr(sweep.pretrained, 'load_pretrained', load)
    losses, _ = sweep.frozen_gamma_losses('tiny/operator', str(tmp_path), gammas=(0.0,), train_args=['--dtype=bfloat16'])
    bf16 = iteration0_val_loss(root, config, tmp_path / 'bf16', '--dtype=bfloat16')
    assert statistics.fmean(losses[0.0]) == pytest.approx(bf16, rel=1e-6)
    assert bf16 != pytest.approx(iteration0_val_loss(root, config, tmp_path / 'fp32'), rel=1e-6)  # bf16 shows
    gc.collect()
    assert len(loaded) == 1 and loaded[0]() is None


def pretrained_run(first, last, gamma, seconds):
    log = [dict(iter=i, tokens=i * 1000, val_loss=v, gamma=[[g] * 2] * 3) for i, v, g in
           ((0, first, 0.0), (5, (first + last) / 2, gamma / 2), (10, last, gamma))]
    return dict(log=log, seconds=seconds)


def test_the_pretrained_report_has_every_claim_and_the_frozen_curve_in_one_holm_family(tmp_path):
    """Four seeds of every cell and a frozen curve of three γ over 4 batches: each trained cell paired by seed (and
    against each run's iteration-0 loss), each γ − (γ = 0) paired by batch, all adjusted together; a cell not trained
    yet says so; with no run finished, the curve alone."""
    setting = 'wikitext2_smollm2-135m/operator'
    frozen = [3.0, 3.2, 3.1, 3.3]  # every seed's iteration-0 loss, so each − frozen is its final loss − 3.x
    finals = {'corridor': [2.90, 3.08, 3.01, 3.18], 'delta_only': [2.95, 3.12, 3.03, 3.24],
              'gamma_nonneg': [2.93, 3.10, 3.04, 3.20], 'fixed_gamma_delta=-0.2': [2.94, 3.11, 3.02, 3.22],
              'alpha': [2.91, 3.07, 3.02, 3.17]}
    loaded = {(v, s): pretrained_run(frozen[s], x, -0.1 if v != 'delta_only' else 0.0, 600)
              for v, values in finals.items() for s, x in enumerate(values)}
    summary = {v: dict(seeds=[0, 1, 2, 3]) for v in finals}
    curve = {'-0.1': [2.98, 3.05, 3.00, 2.99], '+0': [3.00, 3.10, 3.02, 3.01], '+0.05': [3.01, 3.12, 3.02, 3.03]}
    (tmp_path / setting).mkdir(parents=True)
    (tmp_path / setting / 'frozen_gamma.json').write_text(json.dumps(dict(
        identity=dict(init_from='smollm2-135m', dataset='wiki', seed=0, eval_iters=4, batch_size=4, block_size=256,
                      dtype='float32'), losses=curve, seconds={g: 120.0 for g in curve})))
    out = tmp_path / 'pretrained'
    out.mkdir()
    tests = stats.Tests()
    lines = study_figures.pretrained_figures({setting: (loaded, summary)}, str(out), tests, 'pretrained')
    tests.finish()
    text = tests.fill('\n'.join(lines))
    by_label = {t['label']: t for t in tests.tests}

    def diffs(a, b):
        return [x - y for x, y in zip(finals[a], finals[b] if b in finals else frozen)]
    for a, b in (('corridor', 'delta_only'), ('corridor', 'frozen'), ('delta_only', 'frozen'),
                 ('gamma_nonneg', 'corridor'), ('fixed_gamma_delta=-0.2', 'delta_only'), ('alpha', 'corridor')):
        assert by_label[f'{setting}: {a} − {b}']['differences'] == pytest.approx(diffs(a, b)), (a, b)
    assert by_label[f'{setting}: frozen, γ = -0.1 − γ = 0 (δ = 1)']['differences'] == pytest.approx(
        [-0.02, -0.05, -0.02, -0.02])
    assert {t['family'] for t in tests.tests} == {study_figures.PRETRAINED_FAMILY}
    assert {t['family_size'] for t in tests.tests} == {8}  # 6 trained cells + 2 fixed γ
    # the cell by hand: gamma_nonneg − corridor +0.03, +0.02, +0.03, +0.02: mean +0.025, SD 0.005774, 3 df
    t = tests.tests[[t['label'] for t in tests.tests].index(f'{setting}: gamma_nonneg − corridor')]
    se = 0.005774 / 2
    assert (t['mean'], t['low'], t['high']) == (pytest.approx(0.025), pytest.approx(0.025 - 3.182 * se, abs=1e-4),
                                                pytest.approx(0.025 + 3.182 * se, abs=1e-4))
    assert f"| {setting} | (c) | gamma_nonneg − corridor | 4 | +0.025 [" in text
    assert f"| {setting} | forms | alpha_beta − corridor | 0 | not trained yet |" in text
    se_curve = statistics.stdev(curve['-0.1']) / 2
    assert f"| -0.1 | {statistics.fmean(curve['-0.1']):.4f} | {se_curve:.4f} | -0.0275 [" in text
    assert '| +0 | 3.0325 | ' in text and '| 2.0 min |' in text
    assert (out / 'pretrained_claims_wikitext2_smollm2-135m_operator.png').stat().st_size > 1000
    rows = (out / 'per_batch_frozen.csv').read_text().splitlines()  # the curve's numbers, batch by batch, exact
    assert rows[0] == 'setting,gamma,batch,val_loss' and len(rows) == 1 + 3 * 4
    assert f'{setting},-0.1,1,3.05' in rows and f'{setting},+0,3,3.01' in rows

    # no run finished yet: the frozen curve alone (report() asks for no run in this study)
    tests = stats.Tests()
    lines = study_figures.pretrained_figures({}, str(out), tests, 'pretrained')
    tests.finish()
    assert [t['family_size'] for t in tests.tests] == [2, 2] and any(line.startswith('| -0.1 | ') for line in lines)


def test_a_pretrained_study_evaluates_the_frozen_curve_trains_and_reports_end_to_end(tiny_frozen, tmp_path,
                                                                                    monkeypatch):
    """lab/sweep.py's main on a tiny frozen Llama: the curve first (every γ of PRETRAINED_GAMMAS), then the runs, then
    the report with both; the same command again trains and evaluates nothing."""
    root, config = tiny_frozen
    monkeypatch.setitem(studies.SETTINGS, 'tiny/operator', (str(config), dict()))
    monkeypatch.setitem(studies.STUDIES, 'tiny_pretrained', studies.Study(
        'a test', (studies.Part('tiny/operator', ('gamma_nonneg', 'corridor'), 1),), ()))
    monkeypatch.setitem(study_figures.FIGURES, 'tiny_pretrained', study_figures.pretrained_figures)
    args = ['--study=tiny_pretrained', f'--out_root={tmp_path}', '--', '--max_iters=4', '--eval_interval=2']
    sweep.main(args)
    saved = json.loads((tmp_path / 'tiny' / 'operator' / 'frozen_gamma.json').read_text())
    assert sorted(map(float, saved['losses'])) == sorted(studies.PRETRAINED_GAMMAS)
    report = (tmp_path / 'tiny_pretrained' / 'report.md').read_text()
    assert '| tiny/operator | (c) | gamma_nonneg − corridor | 1 | ' in report and '| -0.05 | ' in report
    assert '| tiny/operator | forms | alpha − corridor | 0 | not trained yet |' in report
    # no attention in this study: its variant table has no column against it (the claims table compares)
    assert '| variant | seeds | val loss mean ± SD | mean γ, δ | in corridor | L0 |' in report
    assert '− attention' not in report
    assert (tmp_path / 'tiny_pretrained' / 'pretrained_claims_tiny_operator.png').stat().st_size > 1000
    monkeypatch.setattr(sweep.subprocess, 'Popen', lambda *a, **k: pytest.fail('trained again'))
    before = (tmp_path / 'tiny' / 'operator' / 'frozen_gamma.json').stat().st_mtime_ns
    sweep.main(args)
    assert (tmp_path / 'tiny' / 'operator' / 'frozen_gamma.json').stat().st_mtime_ns == before  # not evaluated again
