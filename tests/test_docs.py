"""One verdict rule in README.md and docs/: a bolded **lower** or **higher** (or ***lower***, __higher__, ...) is the
Holm-adjusted p of its study's family below 0.05, and that Holm p stands beside it, so a reader can check it.

Where "beside" is, kept simple:
- in a table row, "Holm 0.025" (also "Holm p 0.025", "Holm < 0.001", "Holm ≤ 0.019") in the verdict's own cell, the
  one nearest the word when a cell has several; failing that, the row's cell in the column whose header names
  "Holm" (docs/results_recomputed.md's "Holm p (family size)" column: its first number);
- in prose, "Holm <p>" in the same paragraph or list item, the nearest one.
A verdict with no Holm p found there fails, as does one whose Holm p is 0.05 or more. Italic *lower* / *higher* is
left alone: the pages use it in prose that defines the words too."""

import math
import re
import statistics
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / 'README.md', *sorted((REPO / 'docs').rglob('*.md'))]

VERDICT = re.compile(r'(?<![\w*_])(?:\*\*\*|\*\*_|_\*\*|\*\*|__)(lower|higher)(?:\*\*\*|_\*\*|\*\*_|\*\*|__)(?![\w*_])',
                     re.I)
HOLM = re.compile(r'Holm(?:\s+p)?\s*[<≤]?\s*(\d*\.\d+|\d+)')
NUMBER = re.compile(r'[<≤]?\s*(\d*\.\d+|\d+)')


def nearest_holm(text, at):
    """The Holm p in text whose mention starts nearest position `at`, or None."""
    found = [(abs(m.start() - at), float(m[1])) for m in HOLM.finditer(text)]
    return min(found)[1] if found else None


def cells_of(row):
    return [c.strip() for c in row.strip().strip('|').split('|')]


def table_verdicts(rows):
    """(row index, word, Holm p or None) for each bolded verdict of one table (its lines, header first)."""
    header = cells_of(rows[0])
    holm_columns = [i for i, name in enumerate(header) if 'holm' in name.lower()]
    out = []
    for k, row in enumerate(rows[2:], start=2):  # past the header and its |---| line
        cells = cells_of(row)
        for cell in cells:
            for m in VERDICT.finditer(cell):
                p = nearest_holm(cell, m.start())
                if p is None and len(holm_columns) == 1 and len(cells) == len(header):
                    number = NUMBER.search(cells[holm_columns[0]])
                    p = float(number[1]) if number else None
                out.append((k, m[1].lower(), p))
    return out


def bold_verdicts(text):
    """(line number, 'lower' / 'higher', the Holm p beside it or None) for every bolded verdict of a page."""
    lines = text.splitlines()
    fence = False
    out, i = [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith('```'):
            fence = not fence
        if fence or lines[i].lstrip().startswith('```'):
            i += 1
            continue
        if lines[i].lstrip().startswith('|'):  # a table: its consecutive | lines
            start = i
            while i < len(lines) and lines[i].lstrip().startswith('|'):
                i += 1
            out += [(start + k + 1, word, p) for k, word, p in table_verdicts(lines[start:i])]
            continue
        # prose: a paragraph or list item runs until a blank line, a table, a fence or the next item
        start = i
        i += 1
        while i < len(lines) and lines[i].strip() and not re.match(r'\s*(- |\* |\d+\. |\||```|#)', lines[i]):
            i += 1
        unit = '\n'.join(lines[start:i])
        for m in VERDICT.finditer(unit):
            out.append((start + unit.count('\n', 0, m.start()) + 1, m[1].lower(), nearest_holm(unit, m.start())))
    return out


def verdict_problems(text, name='page'):
    return [f"{name}:{line}: **{word}** " + ('with no Holm p beside it' if p is None else f"beside Holm {p} (≥ 0.05)")
            for line, word, p in bold_verdicts(text) if p is None or p >= 0.05]


@pytest.mark.parametrize('page', PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_bolded_verdict_sits_beside_a_holm_p_below_five_percent(page):
    assert verdict_problems(page.read_text(), page.name) == []


def test_the_pages_have_bolded_verdicts_for_the_check_to_read():
    """Not vacuous on the real pages: the studies' and the 135M study's tables carry their verdicts in bold."""
    found = {page.name: len(bold_verdicts(page.read_text())) for page in PAGES}
    assert found['studies.md'] >= 5 and found['pretrained.md'] >= 10 and found['results_recomputed.md'] >= 5


def test_the_verdict_check_flags_a_holm_p_of_five_percent_or_more_and_a_missing_one():
    header = '| claim | cell |\n|---|---|\n'
    assert verdict_problems(header + '| x | +0.01 [..], Holm 0.08: **higher** |\n') == \
        ['page:3: **higher** beside Holm 0.08 (≥ 0.05)']
    assert verdict_problems(header + '| x | +0.01 [..], Holm 0.01: **higher** |\n') == []
    assert verdict_problems(header + '| x | −0.1 [..], p < 0.001, Holm < 0.001, MDE 0.01: **lower** |\n') == []
    assert verdict_problems(header + '| x | +0.01 [..], Holm 0.050: ***higher*** |\n') == \
        ['page:3: **higher** beside Holm 0.05 (≥ 0.05)']
    assert verdict_problems(header + '| x | +0.01 [..], p 0.012: **lower** |\n') == \
        ['page:3: **lower** with no Holm p beside it']
    # the nearest of two: lower in its own family, not in the wider one
    assert verdict_problems(header + '| x | p 0.012: **lower** (Holm 0.025, 2 corpora), inconclusive over six '
                                     'cells (Holm 0.074) |\n') == []
    assert verdict_problems(header + '| x | Holm 0.025 over the 2 corpora, and over all six cells **lower** '
                                     '(Holm 0.074) |\n') == ['page:3: **lower** beside Holm 0.074 (≥ 0.05)']
    # italic is not a bolded verdict; the word inside another word is not one either
    assert verdict_problems(header + '| x | p 0.012: *lower* |\n| y | **lowered** |\n') == []


def test_the_verdict_check_reads_a_holm_column_and_prose():
    table = ('| comparison | p | Holm p (family size) | verdict |\n|---|---|---|---|\n'
             '| a | 0.012 | 0.025 (2) | **lower** |\n| b | 0.040 | 0.079 (2) | **lower** |\n'
             '| c | <0.001 | <0.001 (4) | **higher** |\n')
    assert verdict_problems(table) == ['page:4: **lower** beside Holm 0.079 (≥ 0.05)']
    prose = ('Intro.\n\n- (a) corridor − attention −0.0031 [−0.0046, −0.0016], **lower**\n  (Holm 0.025 over the 2 '
             'corpora).\n- (c) γ ≥ 0 − corridor **higher**, p 0.006,\n  Holm 0.080 over the grid.\n\n'
             'A paragraph: **lower** with no adjusted p.\n')
    assert verdict_problems(prose) == ['page:5: **higher** beside Holm 0.08 (≥ 0.05)',
                                       'page:8: **lower** with no Holm p beside it']


def recomputed_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location('results_recomputed', REPO / 'docs' / 'results_recomputed.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_recomputed_md_is_what_its_script_computes_from_the_per_seed_files_and_summaries():
    """The page is regenerated, not edited: a changed per-seed file or summary without a rerun fails here."""
    assert (REPO / 'docs' / 'results_recomputed.md').read_text() == recomputed_module().render()


def test_a_per_seed_file_is_recomputed_exactly_paired_by_seed_with_holm_over_the_studys_family(tmp_path, monkeypatch):
    """Three seeds, two settings: corridor − attention paired by seed within each setting (seed 2 of b has no
    attention run: left out), one Holm family over the two settings as the study's report forms it; a variant with one
    seed shows its difference and no test, and does not enter the family."""
    module = recomputed_module()
    rows = [('a', 'attention', 0, 2.0), ('a', 'attention', 1, 2.1), ('a', 'attention', 2, 2.2),
            ('a', 'corridor', 0, 1.9), ('a', 'corridor', 1, 2.05), ('a', 'corridor', 2, 2.1),
            ('b', 'attention', 0, 3.0), ('b', 'attention', 1, 3.0), ('b', 'corridor', 0, 3.01), ('b', 'corridor', 1, 2.98),
            ('b', 'corridor', 2, 1.0), ('a', 'corridor_lr', 1, 2.125), ('c', 'attention', 0, 4.0),
            ('c', 'corridor', 0, 3.5)]
    (tmp_path / 'toy.csv').write_text('setting,variant,seed,iter,tokens,val_loss,gamma_mean,delta_mean,seconds\n' + ''.join(
        f'{s},{v},{k},10,100,{repr(x)},-0.1,0.9,1.0\n' for s, v, k, x in rows))
    monkeypatch.setattr(module, 'PER_SEED', str(tmp_path))
    cells = {(s, a): (t, p_holm, m, below) for s, a, _, t, p_holm, m, below in
             module.per_seed_cells('toy', module.read_per_seed(tmp_path / 'toy.csv'))}
    ta, pa, ma, below_a = cells[('a', 'corridor')]
    tb, pb, mb, below_b = cells[('b', 'corridor')]
    assert (ta.n, tb.n, ma, mb, below_a, below_b) == (3, 2, 2, 2, 3, 1)  # c's one seed is not in their family
    assert cells[('c', 'corridor')][0].n == 1 and cells[('c', 'corridor')][2] == 0
    assert ta.mean == pytest.approx((-0.1 - 0.05 - 0.1) / 3) and tb.mean == pytest.approx((0.01 - 0.02) / 2)
    low, high = sorted((ta.p, tb.p))
    assert sorted((pa, pb)) == pytest.approx([2 * low, max(2 * low, high)])
    page = '\n'.join(module.per_seed_sections())
    assert '## `toy`: 14 runs (' in page and '| a | corridor | 3 | ' in page
    assert '| a | corridor_lr | 1 | +0.02500 | – | – | – | 0/1 | no test |' in page
    assert 'nan' not in page and cells[('a', 'corridor_lr')][2] == 0


def test_a_walk_file_is_paired_by_seed_against_attentions_part_p_with_holm_per_variant_and_part(tmp_path):
    """Two diagnostics, two parts of one variant: each part's value minus attention's (its part P), paired by seed
    (seed 2 has no attention run: left out), Holm within the part's family over the diagnostics."""
    module = recomputed_module()
    attention = {('drift', 0): 1.0, ('drift', 1): 2.0, ('a_eff_fro', 0): 3.0, ('a_eff_fro', 1): 3.5}
    rows = [('attention', k, 'P', d, x) for (d, k), x in attention.items()]
    for part, shift in (('P', 0.0), ('operator', 0.5)):
        rows += [('corridor', 0, part, 'drift', 1.1 + shift), ('corridor', 1, part, 'drift', 2.3 + shift),
                 ('corridor', 2, part, 'drift', 9.0), ('corridor', 0, part, 'a_eff_fro', 2.0 + shift),
                 ('corridor', 1, part, 'a_eff_fro', 2.4 + shift)]
    (tmp_path / 'toy_walk.csv').write_text('setting,variant,seed,part,diagnostic,regime,value\n' + ''.join(
        f'a/b,{v},{k},{part},{d},initial,{repr(x)}\n' for v, k, part, d, x in rows))
    tests = module.walk_tests(module.read_walk(tmp_path / 'toy_walk.csv'))
    assert set(tests) == {('a/b', 'corridor', part, d, 'initial') for part in ('P', 'operator') for d in ('drift', 'a_eff_fro')}
    for part, shift in (('P', 0.0), ('operator', 0.5)):
        drift, a_eff = (tests[('a/b', 'corridor', part, d, 'initial')] for d in ('drift', 'a_eff_fro'))
        assert drift[0].n == 2 and drift[0].mean == pytest.approx(0.2 + shift) and drift[3] == pytest.approx(1.5)
        assert drift[0].p == pytest.approx(module.paired_test([0.1 + shift, 0.3 + shift]).p)  # seed with seed
        assert a_eff[0].mean == pytest.approx(-1.05 + shift) and a_eff[3] == pytest.approx(3.25)
        low, high = sorted((drift[0].p, a_eff[0].p))
        assert (drift[2], a_eff[2]) == (2, 2)  # the family: this part's two cells, not all four
        assert sorted((drift[1], a_eff[1])) == pytest.approx([2 * low, max(2 * low, high)])


def test_every_studies_md_table_of_a_study_with_a_per_seed_file_is_what_that_file_gives():
    """docs/studies.md's tables of a study whose per-seed file is published (the 135M study's: docs/pretrained.md's)
    are rendered from that file (docs/results_recomputed.py's TABLES) and must appear on the page verbatim (line
    breaks aside), as must the CIs it quotes for the claims those tables test: no cell can drift from the runs."""
    module = recomputed_module()
    tables = module.study_tables()
    checked = {'claims', 'fixed_gamma', 'replication', 'corridor_settled_pilot', 'geometry_walk', 'fixed_gamma_powered',
               'scales', 'ladder', 'corridor_settled', 'gamma_dynamics', 'pretrained'}
    assert checked <= set(tables)  # not vacuous: these are checked
    for study, texts in tables.items():
        name = module.PAGES.get(study, 'studies.md')
        words = ' '.join((REPO / 'docs' / name).read_text().split())  # a page may wrap a rendered sentence
        for text in texts:
            assert ' '.join(text.split()) in words, f"docs/{name} lacks what the {study} per-seed file gives:\n{text}"


def test_the_settled_corridor_table_is_its_per_seed_cells_and_stays_off_the_page_until_every_run_is_in(tmp_path,
                                                                                                        monkeypatch):
    """The main study's rendered table gives per_seed_cells' numbers (paired by seed, Holm over the two corpora) for
    the seeds in the file; study_tables leaves it out while the file lacks planned runs (an interim look is not the
    pre-registered test), and includes it once every planned run is there."""
    module = recomputed_module()
    published = (REPO / 'docs' / 'per_seed' / 'corridor_settled.csv').read_text().splitlines()
    first_three = [published[0]] + [row for row in published[1:] if int(row.split(',')[2]) < 303]
    (tmp_path / 'corridor_settled.csv').write_text('\n'.join(first_three) + '\n')
    runs = module.read_per_seed(tmp_path / 'corridor_settled.csv')
    assert len(runs) == 24  # seeds 300–302, 4 variants, 2 corpora
    table = module.corridor_settled_table(runs)[0]
    labels = {'corridor': 'learnable corridor (primary)', 'corridor_lr=3.0': 'corridor, operator_lr_mult 3 (secondary)',
              'fixed_gamma=-0.1': 'fixed γ = −0.1, δ = 1 (secondary)'}
    for setting, a, b, t, p_holm, m, below in module.per_seed_cells('corridor_settled', runs):
        assert m == 2 and b == 'attention'
        row = next(line for line in table.splitlines()
                   if line.startswith(f"| {module.CORPORA[setting.split('/')[0]]} | {labels[a]} "))
        assert f'({labels[a].split(" (")[1]} | {module.signed(t.mean, 5)} [' in row and t.n == 3
        assert f' | {module.p_text(p_holm)} | ' in row and f' | {below}/{t.n} | ' in row
    # the budget's check: epochs from the tokens, attention's last fall over the seeds whose rows record it
    assert module.corridor_settled_table(runs)[2] == ("not recorded on Tiny Shakespeare, 3.67 epochs; not recorded on "
                                                      "WikiText-2 (char), 3.22 epochs")
    recorded = {('wikitext2_char/small-x4', 'attention', 300): 9.0, ('wikitext2_char/small-x4', 'attention', 301): 0.5,
                ('shakespeare_char/small-x4', 'attention', 300): 9.0, ('shakespeare_char/small-x4', 'attention', 301): 8.0,
                ('shakespeare_char/small-x4', 'attention', 302): 7.0,  # every seed: '3 seeds'
                ('wikitext2_char/small-x4', 'corridor', 302): 0.5}  # not attention: not counted
    for key, previous in recorded.items():
        runs[key]['val_loss_previous_eval'] = repr(previous)

    def mean_change(setting, seeds):
        return module.signed(statistics.fmean(runs[(setting, 'attention', k)]['val_loss'] - recorded[(setting, 'attention', k)]
                                              for k in seeds), 4)
    assert module.corridor_settled_table(runs)[2] == (
        f"{mean_change('shakespeare_char/small-x4', (300, 301, 302))} on Tiny Shakespeare, 3.67 epochs, falling in 3 of "
        f"the 3 seeds; {mean_change('wikitext2_char/small-x4', (300, 301))} on WikiText-2 (char), 3.22 epochs, falling "
        f"in 1 of the 2 seeds that record it (of 3)")
    monkeypatch.setattr(module, 'PER_SEED', str(tmp_path))
    assert 'corridor_settled' not in module.study_tables()
    monkeypatch.setattr(module, 'planned_runs', lambda study, runs: (len(runs), len(runs)))
    assert module.study_tables()['corridor_settled'][0] == table


def test_the_pilot_picks_the_smallest_multiplier_settled_and_stable_on_both_corpora_else_the_largest_stable():
    """The pilot's rule, named before it ran: the smallest multiplier above 1 whose γ̄ moves less than 0.01 over the
    last quarter and whose final loss is at most 0.01 above multiplier 1's, on both corpora; if none settles, the
    largest stable one. Made up: 3 is settled but 0.02 worse on one corpus, 10 passes, 30 passes too."""
    module = recomputed_module()

    def pilot(rows):  # {(corpus, multiplier): (final loss, γ̄ change over the last quarter)}
        return {(f'{c}/small-x4', 'corridor' if m == 1 else f'corridor_lr={m:.1f}', 900):
                dict(val_loss=x, gamma_change_last_quarter=repr(moves), gamma_mean=repr(-0.1 * m ** 0.5),
                     delta_mean='0.8') for (c, m), (x, moves) in rows.items()}
    rows = {('wikitext2_char', 1): (1.72, -0.004), ('wikitext2_char', 3): (1.74, -0.002),
            ('wikitext2_char', 10): (1.725, -0.001), ('wikitext2_char', 30): (1.728, 0.0),
            ('shakespeare_char', 1): (1.67, -0.003), ('shakespeare_char', 3): (1.671, -0.004),
            ('shakespeare_char', 10): (1.675, 0.002), ('shakespeare_char', 30): (1.70, 0.0)}
    (text,) = module.corridor_settled_pilot_table(pilot(rows))
    assert text.startswith('**M = 10**, settled and stable: on WikiText-2 (char) and Tiny Shakespeare γ̄ moves −0.001 '
                           'and +0.002 over the last quarter, the final loss is +0.0050 and +0.0050 against multiplier '
                           "1's, and γ̄ ends at −0.316 and −0.316 (multiplier 1: −0.100 and −0.100)")
    rows[('shakespeare_char', 30)] = (1.672, 0.0)  # 30 stable too: still the smallest, 10
    assert module.corridor_settled_pilot_table(pilot(rows))[0].startswith('**M = 10**')
    unsettled = {key: (x, 0.02 if key[1] > 1 else moves) for key, (x, moves) in rows.items()}
    assert module.corridor_settled_pilot_table(pilot(unsettled))[0].startswith(
        '**M = 30**, none settles: the largest stable:')


def test_the_powered_table_holds_the_two_fixed_gammas_in_one_family_and_the_corridor_alone(tmp_path):
    """Three seeds: each variant − attention paired by seed; Holm over the two fixed γ (the primary tests), the
    corridor's secondary test alone; the quoted CIs and the losses line from the same runs."""
    module = recomputed_module()
    shifts = {'attention': (0.0, 0.0, 0.0), 'fixed_gamma=-0.1': (-0.004, -0.003, -0.005),
              'fixed_gamma=-0.2': (-0.006, -0.002, -0.007), 'corridor': (0.001, -0.001, 0.002)}
    rows = [(v, k, 2.0 + 0.01 * k + d) for v, ds in shifts.items() for k, d in enumerate(ds)]
    (tmp_path / 'p.csv').write_text('setting,variant,seed,iter,tokens,val_loss,gamma_mean,delta_mean,seconds\n' + ''.join(
        f'wikitext2_char/small,{v},{k},10,100,{repr(x)},-0.05,0.95,1.0\n' for v, k, x in rows))
    runs = module.read_per_seed(tmp_path / 'p.csv')
    table, q1, q2, corridor, losses = module.fixed_gamma_powered_table(runs)
    tests = {v: module.paired_test([a - b for a, b in zip(ds, shifts['attention'])]) for v, ds in shifts.items()
             if v != 'attention'}
    low, high = sorted((tests['fixed_gamma=-0.1'].p, tests['fixed_gamma=-0.2'].p))
    holm = {v: (2 * low if tests[v].p == low else max(2 * low, high)) for v in ('fixed_gamma=-0.1', 'fixed_gamma=-0.2')}
    for v, label in (('fixed_gamma=-0.1', 'fixed γ = −0.1'), ('fixed_gamma=-0.2', 'fixed γ = −0.2')):
        row = next(line for line in table.splitlines()
                   if line.startswith(f'| {label} (primary) | '))
        assert f' | {module.p_text(tests[v].p)} | {module.p_text(holm[v])} | ' in row
    row = next(line for line in table.splitlines()
               if line.startswith('| learnable corridor (secondary) |'))
    p = module.p_text(tests['corridor'].p)
    assert f' | {p} | {p} | ' in row  # alone: Holm is the unadjusted p
    assert q1 == f"γ = −0.1: {module.ci(tests['fixed_gamma=-0.1'])}" and corridor.startswith(module.ci(tests['corridor']))
    assert losses.startswith('Final validation losses (mean ± SD over the 3 seeds): attention 2.0100 ± 0.0100, ')


def test_the_scales_table_holds_its_six_cells_in_one_holm_family_and_fits_every_seed_pair():
    """Three sizes × two corpora, three seeds each: each cell corridor − attention paired by seed, one Holm family
    over the six; the fit per corpus is least squares over every seed pair on log10(non-embedding parameters)."""
    module = recomputed_module()
    shifts = {'tiny': (-0.001, 0.002, 0.0), 'small': (-0.003, -0.0035, -0.0025), 'medium-x2': (0.003, -0.012, -0.008)}
    runs = {}
    for corpus in ('shakespeare_char', 'wikitext2_char'):
        for size, ds in shifts.items():
            for k, d in enumerate(ds):
                for variant, x in (('attention', 2.0 + 0.01 * k), ('corridor', 2.0 + 0.01 * k + d)):
                    runs[(f'{corpus}/{size}', variant, k)] = dict(val_loss=x, tokens='921600', gamma_mean='-0.05',
                                                                  delta_mean='0.95')
    table, fits, bounds, medium = module.scales_table(runs)
    tests = {size: module.paired_test(list(ds)) for size, ds in shifts.items()}
    holm = dict(zip(shifts, module.holm([t.p for t in tests.values()] * 2)))  # each cell twice: both corpora
    row = next(line for line in table.splitlines() if line.startswith('| small, the base (3 seeds) | 0.79M | '))
    assert f"| {module.signed(tests['small'].mean)} ± {tests['small'].sd:.4f} | Holm {module.p_text(holm['small'])}" in row
    params = {size: p for size, p in zip(shifts, module.size_fits(runs, [f'wikitext2_char/{s}' for s in shifts])[3].values())}
    assert 0.09e6 < params['tiny'] < params['small'] < params['medium-x2'] < 3e6
    xs = [math.log10(params[size]) for size, ds in shifts.items() for _ in ds]
    slope, low, high, _, n = module.line_fit(xs, [d for ds in shifts.values() for d in ds])
    assert n == 9 and fits.startswith(f"{module.signed(slope)} per tenfold [{module.signed(low)}, {module.signed(high)}]")
    assert bounds.startswith(f"at the tiny size (3 seeds) {module.ci(tests['tiny'])}, no gain larger than "
                             f"{-tests['tiny'].low:.4f}")
    assert medium == '(+0.0030, −0.0120, −0.0080)'


def test_a_fits_words_name_its_degrees_of_freedom_and_what_its_weighted_means_are_of():
    """results_recomputed.md's line for one size_fits result: the unweighted fit's t has pairs − 2 df, the weighted
    one's (and its χ²) k − 2 for k means, which the caller names."""
    module = recomputed_module()
    unweighted, weighted = module.fit_words(((0.0006, -0.0039, 0.0051, 0.783, 21), (-0.0018, -0.0081, 0.0046, 0.355, 4),
                                             24.1, {}), 'rungs')
    assert unweighted == ("unweighted over seed pairs +0.0006 per tenfold, 95 % CI [-0.0039, +0.0051], p 0.783 "
                          "(21 pairs, t on 19 df)")
    assert weighted.startswith("precision-weighted over the 4 rungs' means -0.0018 per tenfold, 95 % CI [-0.0081, ")
    assert weighted.endswith("t on 2 df; weighted χ² 24.1 on 2 df)")


def test_the_ladders_table_and_its_two_fits_on_size_from_a_per_seed_file():
    """Made-up seed pairs (6, 6, 6, 3 seeds; SDs 0.0003 to 0.012, 40× apart, as the ladder's): the table's two fits on
    log10(non-embedding parameters) equal the closed forms computed here, the pre-registered one by least squares over
    every seed pair, the precision-weighted one over the rung means with weights 1/SE² and its scale from the
    residuals (weighted χ² / (k − 2)); the rows are each rung's cell, Holm over the four."""
    from scipy import stats as scipy_stats
    module = recomputed_module()
    spreads = {'ladder-xs': (-0.0002, 0.0003, 6), 'ladder-s': (0.0001, 0.0009, 6), 'ladder-m': (-0.0033, 0.0015, 6),
               'ladder-l': (0.0040, 0.0120, 3)}
    runs, xs, pairs = {}, {}, {}
    for name, (mean, sd, n) in spreads.items():
        setting = f'shakespeare_char/{name}'
        xs[name] = math.log10(module.non_embedding_params({**module.setting_config(setting), 'operator': 'corridor'}))
        z = [k - (n - 1) / 2 for k in range(n)]
        pairs[name] = [mean + sd * x / statistics.stdev(z) for x in z]  # mean and SD exactly
        for k, d in enumerate(pairs[name]):
            for variant, loss in (('attention', 2.0 + 0.01 * k), ('corridor', 2.0 + 0.01 * k + d)):
                runs[(setting, variant, k)] = dict(val_loss=loss, tokens='230400', gamma_mean='-0.03', delta_mean='0.97')
    table, unweighted, weighted, chi2_text = module.ladder_table(runs)

    def slope_and_ci(x, y, w, df):  # weighted least squares through the weighted centre, scale χ² / df
        x_bar, y_bar = sum(a * b for a, b in zip(w, x)) / sum(w), sum(a * b for a, b in zip(w, y)) / sum(w)
        sxx = sum(a * (b - x_bar) ** 2 for a, b in zip(w, x))
        slope = sum(a * (b - x_bar) * (c - y_bar) for a, b, c in zip(w, x, y)) / sxx
        chi2 = sum(a * (c - y_bar - slope * (b - x_bar)) ** 2 for a, b, c in zip(w, x, y))
        se = math.sqrt(chi2 / df / sxx)
        half = scipy_stats.t.ppf(0.975, df) * se
        return slope, slope - half, slope + half, 2 * scipy_stats.t.sf(abs(slope / se), df), chi2

    every_x = [xs[name] for name in spreads for _ in pairs[name]]
    every_d = [d for name in spreads for d in pairs[name]]
    slope, low, high, p, _ = slope_and_ci(every_x, every_d, [1.0] * len(every_d), len(every_d) - 2)
    means = [statistics.fmean(pairs[name]) for name in spreads]
    weights = [len(pairs[name]) / statistics.variance(pairs[name]) for name in spreads]
    w_slope, w_low, w_high, w_p, chi2 = slope_and_ci(list(xs.values()), means, weights, 2)
    assert unweighted.startswith(f"pre-registered, unweighted over seed pairs (the primary test) | {module.signed(slope)} "
                                 f"[{module.signed(low)}, {module.signed(high)}], p {p:.2f}") and '21 pairs' in unweighted
    assert 't on 19 df' in unweighted
    assert weighted.startswith(f"precision-weighted (not named in advance) | {module.signed(w_slope)} "
                               f"[{module.signed(w_low)}, {module.signed(w_high)}], p {w_p:.2f}")
    assert chi2_text == f"weighted χ² {chi2:.1f} on 2 df"
    tests = [module.paired_test(pairs[name]) for name in module.RUNGS]
    holm = module.holm([t.p for t in tests])
    for name, t, p_holm in zip(module.RUNGS, tests, holm):
        row = next(line for line in table.splitlines() if line.startswith(f'| {name} | '))
        assert f" | {module.signed(t.mean, 5)} [" in row and f" | {module.p_text(p_holm)} | " in row
        assert f" | {sum(d < 0 for d in pairs[name])}/{t.n} | " in row
    assert '| ladder-xs | 0.056M (2 × 48) | 0.23M (0.23) | −0.00020 [' in table


def test_the_per_seed_readers_refuse_a_file_that_repeats_a_run_a_layer_or_a_batch(tmp_path, monkeypatch):
    """A study gathered in parts appends rows: a row appended twice would pass as one more seed (or layer, or
    batch). Each reader returns its rows keyed (layers in layer order, batches in batch order) and names the repeat."""
    module = recomputed_module()
    monkeypatch.setattr(module, 'PER_SEED', str(tmp_path))
    files = {'s.csv': ('setting,variant,seed,val_loss', ['a,attention,1,2.5', 'a,corridor,1,2.25', 'a,attention,2,2.0']),
             's_layers.csv': ('setting,variant,seed,layer,gamma_mean', ['a,corridor,1,1,-0.5', 'a,corridor,1,0,-0.25']),
             's_frozen.csv': ('setting,gamma,batch,val_loss', ['a,0.0,1,3.5', 'a,0.0,0,3.0', 'b,0.0,0,9.0',
                                                               'a,-0.1,0,2.5'])}
    for name, (header, rows) in files.items():
        (tmp_path / name).write_text('\n'.join([header, *rows]) + '\n')
    assert {k: r['val_loss'] for k, r in module.read_per_seed(tmp_path / 's.csv').items()} == {
        ('a', 'attention', 1): 2.5, ('a', 'corridor', 1): 2.25, ('a', 'attention', 2): 2.0}
    assert module.read_layers('s') == {('a', 'corridor', 1): [{'layer': 0.0, 'gamma_mean': -0.25},
                                                               {'layer': 1.0, 'gamma_mean': -0.5}]}
    assert module.read_frozen('s', 'a') == {0.0: [3.0, 3.5], -0.1: [2.5]}
    for name, (header, rows) in files.items():
        (tmp_path / name).write_text('\n'.join([header, *rows, rows[0].replace('0.0,', '-0.0,')]) + '\n')
    with pytest.raises(module.UserError, match=r"s\.csv, line 5: \('a', 'attention', 1\) appears twice"):
        module.read_per_seed(tmp_path / 's.csv')
    with pytest.raises(module.UserError, match=r"s_layers\.csv, line 4: .* appears twice"):
        module.read_layers('s')
    with pytest.raises(module.UserError, match=r"s_frozen\.csv, line 6: \('a', -0\.0, 1\) appears twice"):
        module.read_frozen('s', 'a')  # γ as a number: −0.0 is 0.0


def test_a_later_report_is_appended_to_a_studys_files_in_the_reports_order_and_never_changes_a_run(
        tmp_path, monkeypatch):
    """--append: the published file appended to itself comes back byte for byte; more runs of the study land in the
    report's order (settings in the study's order, seed, variant; layers by layer) in the per-seed file and its side
    file, a column only they have left empty in the old rows, a run trained again accepted when only its wall time
    differs. Refused, with nothing written: a run the study does not plan, a report lacking a published column, a
    run whose numbers changed; and a command line that is not `--append STUDY FOLDER`."""
    module = recomputed_module()
    monkeypatch.setattr(module, 'PER_SEED', str(tmp_path / 'published'))
    (tmp_path / 'published').mkdir()
    published = (REPO / 'docs' / 'per_seed' / 'corridor_settled.csv').read_text()
    (tmp_path / 'published' / 'corridor_settled.csv').write_text(published)
    report = tmp_path / 'report'
    report.mkdir()
    (report / 'per_seed.csv').write_text(published)
    assert module.append_report('corridor_settled', report) == {str(tmp_path / 'published' / 'corridor_settled.csv'): 0}
    assert (tmp_path / 'published' / 'corridor_settled.csv').read_text() == published

    monkeypatch.setitem(module.SIDE_FILES, 'corridor_settled', ('layers',))  # a study whose tables read its layers
    old = ('setting,variant,seed,val_loss,seconds,val_loss_at_start\n'
           'shakespeare_char/small-x4,corridor,300,1.5,10.0,\n'
           'wikitext2_char/small-x4,corridor,300,1.25,10.0,\n')
    (tmp_path / 'published' / 'corridor_settled.csv').write_text(old)
    (tmp_path / 'published' / 'corridor_settled_layers.csv').write_text(
        'setting,variant,seed,layer,gamma_mean\nwikitext2_char/small-x4,corridor,300,0,-0.25\n')
    new = ('setting,variant,seed,val_loss,seconds,val_loss_at_start,val_loss_previous_eval\n'
           'shakespeare_char/small-x4,attention,309,1.75,11.0,6.0,1.8\n'
           'wikitext2_char/small-x4,corridor,300,1.25,99.0,6.5,1.3\n'  # trained again: only seconds differ
           'wikitext2_char/small-x4,attention,301,1.5,12.0,6.0,1.6\n')
    (report / 'per_seed.csv').write_text(new)
    (report / 'per_seed_layers.csv').write_text('setting,variant,seed,layer,gamma_mean\n'
                                                'wikitext2_char/small-x4,corridor,301,1,-0.5\n'
                                                'wikitext2_char/small-x4,corridor,301,0,-0.125\n')
    before = {f.name: f.read_text() for f in (tmp_path / 'published').iterdir()}

    def refused(match):
        with pytest.raises(module.UserError, match=match):
            module.append_report('corridor_settled', report)
        assert {f.name: f.read_text() for f in (tmp_path / 'published').iterdir()} == before

    (report / 'per_seed.csv').write_text(new.replace(',301,', ',299,'))  # seed 299: not a seed of the study
    refused(r"\('wikitext2_char/small-x4', 'attention', 299\) is not a run of the study")
    (report / 'per_seed.csv').write_text(new.replace('1.25,99.0', '1.2,99.0'))
    refused(r"\('wikitext2_char/small-x4', 'corridor', 300\) comes back with other numbers")
    (report / 'per_seed.csv').write_text('\n'.join(line.rsplit(',', 2)[0] for line in new.splitlines()) + '\n')
    refused('lacks val_loss_at_start, which .* has: report the runs with this code')
    (report / 'per_seed.csv').write_text(new)
    (report / 'per_seed_layers.csv').rename(report / 'elsewhere.csv')
    refused('per_seed_layers.csv not found')
    (report / 'elsewhere.csv').rename(report / 'per_seed_layers.csv')

    added = module.append_report('corridor_settled', report)
    assert list(added.values()) == [2, 2]
    assert (tmp_path / 'published' / 'corridor_settled.csv').read_text() == (
        'setting,variant,seed,val_loss,seconds,val_loss_at_start,val_loss_previous_eval\n'
        'wikitext2_char/small-x4,corridor,300,1.25,10.0,6.5,1.3\n'  # the old wall time kept, the empty columns filled
        'wikitext2_char/small-x4,attention,301,1.5,12.0,6.0,1.6\n'
        'shakespeare_char/small-x4,corridor,300,1.5,10.0,,\n'
        'shakespeare_char/small-x4,attention,309,1.75,11.0,6.0,1.8\n')
    assert (tmp_path / 'published' / 'corridor_settled_layers.csv').read_text() == (
        'setting,variant,seed,layer,gamma_mean\nwikitext2_char/small-x4,corridor,300,0,-0.25\n'
        'wikitext2_char/small-x4,corridor,301,0,-0.125\nwikitext2_char/small-x4,corridor,301,1,-0.5\n')

    for argv in (['--append', 'corridor_settled'], ['--apend', 'corridor_settled', str(report)]):
        monkeypatch.setattr(module.sys, 'argv', ['results_recomputed.py', *argv])
        with pytest.raises(module.UserError, match=r'usage: python docs/results_recomputed.py \[--append STUDY'):
            module.main()
    with pytest.raises(module.UserError, match="no study 'corridor'"):
        module.append_report('corridor', report)


def test_the_per_seed_figure_draws_each_variant_minus_attention_by_seed_from_the_published_file(tmp_path,
                                                                                                 monkeypatch):
    """`--figure STUDY` draws a pre-registered study's per-seed panel from its published file alone: a panel per
    setting, a column per test its report names (in the report's order, with its role), that setting's differences
    paired by seed (a seed attention lacks is left out, wherever it falls), saved as the report's image. Refused in one
    line: a study whose report draws no such figure, one without a file, a file with nothing to pair, a command line
    that is not `--figure STUDY`."""
    module = recomputed_module()
    monkeypatch.setattr(module, 'PER_SEED', str(tmp_path))
    monkeypatch.setitem(module.PREREGISTERED, 'made_up', ('a title', 'made_up.png', [('fixed', 'primary'),
                                                                                       ('corridor', 'secondary')]))
    (tmp_path / 'made_up.csv').write_text(
        'setting,variant,seed,val_loss\n'
        'b/x,corridor,0,1.0\n'  # no attention run of seed 0: not paired (nor shifted onto seed 1's)
        'b/x,attention,1,2.0\nb/x,corridor,1,1.5\nb/x,fixed,1,2.25\n'
        'b/x,attention,2,3.0\nb/x,corridor,2,3.5\nb/x,fixed,2,2.0\n'
        'a/y,attention,1,1.0\na/y,corridor,1,0.75\n')
    drawn, real = [], module.draw_preregistered

    def draw(panels, path):
        drawn.extend(panels)
        real(panels, path)
    monkeypatch.setattr(module, 'draw_preregistered', draw)
    assert module.per_seed_figure('made_up', str(tmp_path)) == str(tmp_path / 'made_up.png')
    assert drawn == [('b/x', [('fixed − attention\n(primary)', [0.25, -1.0]),
                              ('corridor − attention\n(secondary)', [-0.5, 0.5])]),
                     ('a/y', [('fixed − attention\n(primary)', []), ('corridor − attention\n(secondary)', [-0.25])])]
    assert (tmp_path / 'made_up.png').read_bytes()[:4] == b'\x89PNG'

    def refused(match, study='made_up'):
        with pytest.raises(module.UserError, match=match):
            module.per_seed_figure(study, str(tmp_path))
    refused("draws a pre-registered study's per-seed figure: .*not 'claims'", 'claims')  # its report draws others
    monkeypatch.setitem(module.PREREGISTERED, 'absent', module.PREREGISTERED['made_up'])
    refused("'absent' has no published per-seed file yet", 'absent')
    (tmp_path / 'made_up.csv').write_text('setting,variant,seed,val_loss\nb/x,corridor,1,1.5\nb/x,fixed,1,2.0\n')
    refused('no run of b/x pairs with an attention run of its seed')
    monkeypatch.setattr(module.sys, 'argv', ['results_recomputed.py', '--figure'])
    with pytest.raises(module.UserError, match=r'usage: .*\| --figure STUDY\]'):
        module.main()


def test_claim_bs_tables_read_each_runs_layers_and_pair_its_loss_with_attentions_seed():
    """Three seeds of two starts and of attention, one of the rest; four layers a run, layer 0 at γ̄ −0.05 with half its
    heads strictly inside, the others at −0.2 − 0.01·seed, all inside (the spread start: heads still moving more):
    a row per variant and setting with each seed's share beyond layer 0 (the primary test; with one seed, the heads
    counted), layer 0's share, the ranges over seeds of γ̄, of one head's last-quarter range and of δ̄, and the mean
    gap to attention on the same seed; layer 0's contrast over seeds; each start − attention paired by seed, each its
    own Holm family (one comparison across the two settings; the one-seed BPE pair has no p)."""
    module = recomputed_module()
    long, bpe = 'shakespeare_char/small-long', 'wikitext2/small-1k'
    keys = [(long, v, k) for v in ('attention', 'corridor', 'corridor_spread') for k in range(3)]
    keys += [(long, 'corridor_lr', 0), (long, 'corridor_spread_lr', 0), (bpe, 'attention', 0), (bpe, 'corridor', 0)]
    gap = {'attention': (0, 0, 0), 'corridor': (-0.002, -0.0021, -0.0019), 'corridor_spread': (0.004, 0.006, 0.003),
           'corridor_lr': (0.01,), 'corridor_spread_lr': (0.02,)}
    delta = {'attention': 1.0, 'corridor': 0.5, 'corridor_spread': 0.6, 'corridor_lr': 0.4, 'corridor_spread_lr': 0.45}
    runs = {(s, v, k): dict(val_loss=1.6 + 0.01 * k + gap[v][k], delta_mean=str(delta[v]), gamma_mean='-0.15')
            for s, v, k in keys}
    layers = {(s, v, k): [dict(layer=0.0, heads=4.0, gamma_mean=-0.05, gamma_min=-0.3, gamma_max=0.1, inside_claim_b=0.5,
                               gamma_range_last_quarter=0.01 + 0.001 * k + 0.02 * (v == 'corridor_spread'))]
              + [dict(layer=float(i), heads=4.0, gamma_mean=-0.2 - 0.01 * k, gamma_min=-0.35, gamma_max=-0.1,
                      inside_claim_b=1.0, gamma_range_last_quarter=0.005) for i in (1, 2, 3)]
              for s, v, k in keys if v != 'attention'}
    table, contrast, gaps = module.gamma_dynamics_table(runs, layers)
    rows = {line.split(' | ')[0].strip('| '): line for line in table.splitlines()[2:]}
    # three seeds: every later head inside in each, layer 0 half, the later layers' γ̄ −0.20 … −0.22 over the seeds
    assert rows['corridor from γ0 = 0'] == ('| corridor from γ0 = 0 | 3 | 100 %, 100 %, 100 % | 50 % | −0.050 | '
                                           '−0.220 … −0.200 | [−0.35, +0.10] | 0.010–0.012 | 0.50 | −0.0020 |')
    assert cells_of(rows['from γ0 ~ U(−0.5, 0.5)'])[7:] == ['0.030–0.032', '0.60', '+0.0043']
    # one seed: the heads counted; the BPE setting named in its row, its gap to its own attention run
    assert cells_of(rows['corridor from γ0 = 0, operator_lr_mult 10'])[1:3] == ['1', '100 % (12 of 12)']
    bpe = rows['WikiText-2, GPT-2 BPE, 1,000 iterations: corridor from γ0 = 0']
    assert bpe.endswith(' | 0.50 | −0.0020 |')
    assert table.startswith('| variant (Tiny Shakespeare, 12,000 iterations, unless named) | seeds | ')
    t = module.paired_test([0.15, 0.16, 0.17])
    assert contrast.startswith(f"{module.signed(t.mean, 3)} [{module.signed(t.low, 3)}, {module.signed(t.high, 3)}], p ")
    corridor, spread = module.paired_test(list(gap['corridor'])), module.paired_test(list(gap['corridor_spread']))
    assert module.holm([corridor.p, spread.p])[0] != corridor.p  # pooling the two would show
    assert gaps == (f"corridor from γ0 = 0 − attention {module.ci(corridor)} (3 seeds), Holm {module.p_text(corridor.p)}; "
                    f"from γ0 ~ U(−0.5, 0.5) − attention {module.ci(spread)} (3 seeds), Holm {module.p_text(spread.p)}")


def test_the_135m_tables_hold_every_cell_in_one_holm_family_trained_by_seed_frozen_by_batch():
    """Four seeds of five variants (αP + β(I − P) not trained: no cell) and a frozen curve of three γ over 4 batches:
    each trained cell paired by seed ('frozen': each run's own iteration-0 loss), each γ − (γ = 0) by batch, Holm
    over all 8 together, as the report forms the family; per variant, frozen → final (means over seeds) and the shares
    over every head (layers of 2 and 6 heads), in ranges over seeds; and claims (b), (c), (d) in the page's words."""
    module = recomputed_module()
    setting, start = module.PRETRAINED, [3.0, 3.2, 3.1, 3.3]
    finals = {'corridor': [2.90, 3.08, 3.01, 3.18], 'delta_only': [2.95, 3.12, 3.03, 3.24],
              'gamma_nonneg': [2.93, 3.10, 3.04, 3.20], 'fixed_gamma_delta=-0.05': [2.94, 3.11, 3.02, 3.22],
              'alpha': [2.91, 3.07, 3.02, 3.17]}
    fixed_start = [x + 0.04 + 0.002 * k for k, x in enumerate(start)]  # a fixed γ starts above the frozen model
    runs = {(setting, v, k): dict(val_loss=x, gamma_mean='-0.02', delta_mean='0.9', seconds='600.0',
                                  val_loss_at_start=repr((fixed_start if v.startswith('fixed') else start)[k]))
            for v, xs in finals.items() for k, x in enumerate(xs)}
    layer = dict(layer=0.0, heads=2.0, gamma_min=-0.2, gamma_max=0.1, in_corridor=0.5, inside_claim_b=0.5,
                 gamma_range_last_quarter=0.01, above_zero=1.0, at_zero=0.0)
    layers = {key: [layer, {**layer, 'layer': 1.0, 'heads': 6.0, 'in_corridor': 1.0, 'inside_claim_b': 0.0,
                            'above_zero': 0.0, 'at_zero': 2.0}] for key in runs}
    for k in range(4):  # δ only holds every head at γ = 0; γ ≥ 0's lowest head sits on its floor (the shares are
        # the fixture's, not what a held γ would give: the renderer prints the file's shares, except on (b)'s bound)
        layers[(setting, 'delta_only', k)] = [{**layer, 'gamma_min': 0.0, 'gamma_max': 0.0,
                                               'gamma_range_last_quarter': 0.0}]
        layers[(setting, 'gamma_nonneg', k)] = [{**layer, 'gamma_min': 0.0, 'at_zero': float(k + 1)}]
        layers[(setting, 'fixed_gamma_delta=-0.05', k)] = [{**layer, 'gamma_min': -0.05, 'gamma_max': -0.05}]
    curve = {-0.1: [2.98, 3.05, 3.00, 2.99], 0.0: [3.00, 3.10, 3.02, 3.01], 0.05: [3.01, 3.12, 3.02, 3.03]}
    frozen_table, cells, per_variant, b, c, d, *quotes = module.pretrained_tables(runs, layers, curve)

    def diffs(a, b):
        return [x - y for x, y in zip(finals[a], finals[b] if b in finals else start)]
    pairs = [diffs('corridor', 'delta_only'), diffs('corridor', 'frozen'), diffs('delta_only', 'frozen'),
             diffs('gamma_nonneg', 'corridor'), diffs('fixed_gamma_delta=-0.05', 'delta_only'), diffs('alpha', 'corridor'),
             [x - y for x, y in zip(curve[-0.1], curve[0.0])], [x - y for x, y in zip(curve[0.05], curve[0.0])]]
    tests = [module.paired_test(d) for d in pairs]
    holm = module.holm([t.p for t in tests])
    assert len(quotes) == 6 and quotes[3] == f"{module.ci(tests[3])} (Holm {module.p_text(holm[3])})"
    row = next(line for line in cells.splitlines() if line.startswith('| (c) | γ ≥ 0 − corridor | 4 | +0.0250 ['))
    assert f"Holm {module.p_text(holm[3])}" in row and row.endswith('| 0/4 |')  # +0.03, +0.02, +0.03, +0.02
    assert next(line for line in cells.splitlines() if line.startswith('| (a) | corridor − δ only |')).endswith('| 4/4 |')
    assert '| (d), δ learned | fixed γ = −0.05 with δ learned − δ only | 4 | ' in cells and 'αP + β(I − P)' not in cells
    assert 'Holm p (all 8 of the study)' in frozen_table
    row = next(line for line in frozen_table.splitlines() if line.startswith('| −0.1 | '))
    assert row.startswith(f"| −0.1 | {statistics.fmean(curve[-0.1]):.4f} | ") and row.endswith('| 4 of 4 |')
    assert f"Holm {module.p_text(holm[6])}" in row
    assert 'heads above 0 (at 0), of 8 |' in per_variant
    assert '| corridor | 4 | 3.1500 → 3.0425 | −0.020 [−0.20, +0.10] | 88 % | 12 % | 1 (2) | 0.010 | 10 min |' in per_variant
    assert '| fixed γ = −0.05 with δ learned | 4 | 3.1930 → 3.0725 | −0.05 (held) | 50 % | on the bound | ' in per_variant
    assert '| δ only | 4 | 3.1500 → 3.0850 | 0 (held) | 50 % | 50 % | ' in per_variant
    assert '| γ ≥ 0 | 4 | 3.1500 → 3.0675 | −0.020 [0, +0.10] | 50 % | 50 % | 1 (1–4) | ' in per_variant
    assert [line.split(' | ')[0] for line in per_variant.splitlines()[2:]] == \
        ['| corridor', '| γ ≥ 0', '| δ only', '| fixed γ = −0.05 with δ learned', '| α0·I + α1·P']  # the page's order
    assert b == '88 % of the heads end in −1 < γ < 0 (50–100 % a layer), 12 % below −0.05'
    assert c == '1–4 heads end pinned at 0'
    # the fixed γ's cost at each seed's start (its own iteration-0 loss − the frozen model's), and trained (− δ only)
    assert d == "+0.040 … +0.046 at each seed's start, −0.020 … −0.010 trained"


def test_a_claims_table_cell_says_holm_and_the_unadjusted_p_where_only_that_passes():
    module = recomputed_module()
    lower, weak = module.summary_test(-0.0031, 0.0006, 3), module.summary_test(-0.0031, 0.0011, 3)
    assert module.holm_words(lower, 0.025) == 'Holm 0.025: **lower**'
    assert module.holm_words(weak, 0.079) == 'Holm 0.079: inconclusive (p 0.040)'
    assert module.holm_words(module.summary_test(0.003, 0.0003, 3), 0.0004, ' (2 corpora)') == \
        'Holm < 0.001 (2 corpora): **higher**'
    assert module.signed(-0.00001) == '−0.0000' and module.signed(0.0005) == '+0.0005'


def test_runs_two_studies_share_have_one_set_of_numbers_in_their_per_seed_files():
    """The fixed-γ study's attention, corridor and fixed γ = −0.5 runs are the claims study's (trained once), and the
    geometry study's are theirs: the files must give them the same losses, γ and δ, or two tables would quote two
    versions of one run."""
    module = recomputed_module()
    claims, fixed = (module.read_per_seed(REPO / 'docs' / 'per_seed' / f'{s}.csv') for s in ('claims', 'fixed_gamma'))
    shared = claims.keys() & fixed.keys()
    assert len(shared) == 18  # 3 variants × 3 seeds × 2 corpora
    assert all(claims[k] == fixed[k] for k in shared)
    geometry = module.read_per_seed(REPO / 'docs' / 'per_seed' / 'geometry.csv')  # its runs are those two studies'
    assert len(geometry) == 24 and all(geometry[k] == {**claims, **fixed}[k] for k in geometry)
    scales = module.read_per_seed(REPO / 'docs' / 'per_seed' / 'scales.csv')  # its base size: the claims runs
    base = [k for k in scales if k[0].endswith('/small')]
    assert len(base) == 12 and all(scales[k] == claims[k] for k in base)


def test_the_per_seed_folders_page_counts_each_files_runs_and_lists_every_file():
    """docs/per_seed/README.md's table of how each file was made: the runs it states are the file's rows (the
    walk file: its runs; a per-layer file: the runs it has layers of, those with operator scalars; the frozen curve:
    its fixed γ's), and no published file is left out of the table."""
    module = recomputed_module()
    folder = REPO / 'docs' / 'per_seed'
    stated = {}
    for line in (folder / 'README.md').read_text().splitlines():
        match = re.match(r'\| ([\w, .]+\.csv) \| (\d+)', line)
        if match:
            stated.update((name.strip(), int(match[2])) for name in match[1].split(','))
    assert set(stated) == {p.name for p in folder.glob('*.csv')}
    for name, runs in stated.items():
        study = name.removesuffix('.csv')
        if study.endswith('_layers'):
            assert len(module.read_layers(study.removesuffix('_layers'))) == runs, name
        elif study.endswith('_frozen'):  # the 135M study's frozen curve: its fixed γ's, each over every batch
            assert len(module.read_frozen(study.removesuffix('_frozen'), module.PRETRAINED)) == runs, name
        else:
            assert module.planned_runs(study, module.read_file(study))[0] == runs, name


def test_the_token_multiplier_is_exp_of_the_gain_over_attentions_slope_on_log_tokens_by_hand(tmp_path, monkeypatch):
    """Made-up files whose answer is closed-form: attention's final loss is exactly a_s + b·ln(tokens / 1×'s) in every
    seed (b = −0.12; curves at 1×, and at 1.1×, 1.2×, 1.4× for seeds 300-302), so the within-seed slope is b; the
    corridor sits D = −0.004 below attention at 1× in every seed, so m = exp(D / b) and every bootstrap resample gives
    it (a CI of one point); fixed γ's gains differ by seed, so its m is exp(mean gain / b) with a CI inside the
    seeds' extremes; the 1×-and-1.1× sensitivity gives the same m on a line. The corridor from γ0 = −0.1 against fixed
    γ and the γ0 = 0 corridor: paired by seed, Holm over the two. The curves must end at the per-seed rows."""
    module = recomputed_module()
    monkeypatch.setattr(module, 'PER_SEED', str(tmp_path))
    b, base, tokens = -0.12, 'wikitext2_char/small-x4', {'': 3686400, '-1.1x': 4055040, '-1.2x': 4423680, '-1.4x': 5160960}
    a = {300 + i: 1.70 + 0.01 * i for i in range(6)}
    fixed_gain = {300: -0.003, 301: -0.006, 302: -0.005, 303: -0.004, 304: -0.007, 305: -0.005}
    start = {k: (0.001, 0.002, -0.001, 0.003, 0.002, 0.001)[k - 300] for k in a}  # corridor from γ0 = −0.1 − fixed γ
    settled, study = [], []
    for k, intercept in a.items():
        settled += [(base, 'attention', k, tokens[''], intercept, 0.0), (base, 'corridor', k, tokens[''], intercept - 0.004, -0.2),
                    (base, 'fixed_gamma=-0.1', k, tokens[''], intercept + fixed_gain[k], -0.1)]
        study.append((base, 'corridor_start', k, tokens[''], intercept + fixed_gain[k] + start[k], -0.21))
        if k < 303:
            study += [(base + tag, 'attention', k, n, intercept + b * math.log(n / tokens['']), 0.0)
                      for tag, n in tokens.items() if tag]
    header = 'setting,variant,seed,iter,tokens,val_loss,gamma_mean,delta_mean\n'
    for name, rows in (('corridor_settled', settled), ('token_multiplier', study)):
        (tmp_path / f'{name}.csv').write_text(header + ''.join(f'{s},{v},{k},{n // 768},{n},{repr(x)},{g},1.0\n'
                                                               for s, v, k, n, x, g in rows))
    curves = 'setting,variant,seed,iter,tokens,val_loss,train_loss\n' + ''.join(
        f'{s},{v},{k},{i},{i * 768},{repr(x + (n // 768 - i) * 1e-4)},{repr(x)}\n'
        for s, v, k, n, x, _ in study for i in (0, 400, n // 768))
    (tmp_path / 'token_multiplier_curves.csv').write_text(curves)
    runs, both = module.read_file('token_multiplier'), {**module.read_file('corridor_settled'), **module.read_file('token_multiplier')}

    m, (low, high), beta, gain, seeds, curve, n, draws = module.token_multiplier(both, 'corridor')
    assert beta == pytest.approx(b) and gain == pytest.approx(-0.004) and m == pytest.approx(math.exp(-0.004 / b))
    assert (low, high) == pytest.approx((m, m)) and seeds == list(a) and curve == [300, 301, 302] and n == 12
    assert len(draws) == module.RESAMPLES
    # on a straight line the curvature check's quadratic has b2 = 0: the same m
    assert module.token_multiplier(both, 'corridor', estimate=module.quadratic_multiplier).m == pytest.approx(m)
    m, (low, high), *_ = module.token_multiplier(both, 'fixed_gamma=-0.1')
    assert m == pytest.approx(math.exp(statistics.fmean(fixed_gain.values()) / b))
    assert math.exp(-0.003 / b) < low < m < high < math.exp(-0.007 / b)
    assert module.token_multiplier(both, 'fixed_gamma=-0.1', module.MULTIPLIER_BUDGETS[:1])[0] == pytest.approx(m)
    assert module.multiplier_of([[(0.0, 1.0), (0.1, 1.0)]], [-0.004]) == math.inf  # attention not improving

    tables = module.token_multiplier_tables(runs)
    assert f"| learnable corridor (γ0 = 0) | −0.00400 (6) | −0.1200 (3, 12) | {math.exp(-0.004 / b):.3f} [" in tables[0]
    tests = {'fixed': module.paired_test([start[k] for k in a]),  # by construction, seed by seed
             'corridor': module.paired_test([start[k] + fixed_gain[k] + 0.004 for k in a])}
    (p_low, p_high) = sorted(t.p for t in tests.values())
    holm = dict(zip(sorted(tests, key=lambda o: tests[o].p), (2 * p_low, max(2 * p_low, p_high))))
    for other, label in (('fixed', 'fixed γ = −0.1, δ = 1'), ('corridor', 'learnable corridor (γ0 = 0)')):
        row = next(line for line in tables[2].splitlines() if line.startswith(f'| corridor from γ0 = −0.1 − {label} |'))
        assert f' | {module.signed(tests[other].mean, 5)} [' in row and f' | {module.p_text(min(1, holm[other]))} | ' in row
        assert row.count('/6 | ') == 1  # seeds below 0, of the 6
    assert tables[3].startswith('Final γ̄ of the corridor from γ0 = −0.1 − from γ0 = 0, paired by seed (6 seeds): −0.010 [')
    assert module.planned_runs('token_multiplier_curves', module.read_file('token_multiplier_curves'))[0] == len(study)
    assert tables[-1] == 'Compute multiplier: not measured (no per_seed/throughput.csv).'
    # timed pairs beside the files: the learnable corridor's compute multiplier is its m times r
    ratios = (-0.03, -0.02, -0.04)  # ln(attention seconds / corridor seconds) of each pair
    (tmp_path / 'throughput.csv').write_text(THROUGHPUT_HEADER + ''.join(
        f'eager,{i},0.5,{repr(0.5 / math.exp(d))},10,768,1,2.13.0+cpu,cpu\n' for i, d in enumerate(ratios)))
    r = math.exp(statistics.fmean(ratios))
    row = next(line for line in module.token_multiplier_tables(runs)[-2].splitlines()
               if line.startswith("| eager (the study's runs) | 3 | "))
    assert f" | {r:.3f} [" in row and f" | {math.exp(-0.004 / b) * r:.3f} [" in row
    assert module.planned_runs('throughput', module.read_file('throughput'))[0] == 3  # per_seed/README.md counts rows

    final = repr(a[300] + b * math.log(tokens['-1.1x'] / tokens['']))
    assert f',{final},{final}\n' in curves
    (tmp_path / 'token_multiplier_curves.csv').write_text(curves.replace(f',{final},{final}\n', f',1.0,{final}\n'))
    with pytest.raises(module.UserError, match="curve does not end at its per-seed row's final loss"):
        module.token_multiplier_tables(runs)


THROUGHPUT_HEADER = 'mode,pair,attention_seconds,corridor_seconds,steps,tokens_per_step,threads,torch,device\n'


def test_the_curvature_check_is_the_root_nearest_1x_of_attentions_quadratic_in_log_tokens_by_hand():
    """Made-up runs whose answer is closed-form: attention's final loss is exactly a_s + b1·x + b2·x² (x = ln(tokens /
    1×'s)) in seeds 300-303 at the four budgets, the corridor D = −0.004 below it at 1× in seeds 300-307. The
    quadratic's m is exp of the root of b1·x + b2·x² = D nearest 0, by the textbook formula, in every resample (a CI
    of one point); the line through the four budgets is shallower than the slope at 1× (b2 > 0), so the
    pre-registered m is larger. A curve that turns before it comes down to D gives ∞, as does one rising at 1×. With
    noise, the shared quadratic term's F is that of a least-squares fit with a dummy per seed (numpy), and the seeds
    curving upward are those whose own quadratic (numpy's polyfit) does."""
    np = pytest.importorskip('numpy')
    module = recomputed_module()
    base, budgets = module.MULTIPLIER_BASE, module.MULTIPLIER_BUDGETS
    tokens = dict(zip((base, *budgets), (3686400, 4055040, 4423680, 5160960)))
    xs = [math.log(n / tokens[base]) for n in tokens.values()]
    b1, b2, gain = -0.2, 0.08, -0.004

    def runs_of(loss):  # loss(seed, budget index): attention's final loss there
        runs = {}
        for k in range(300, 308):
            for i, setting in enumerate((base, *budgets) if k < 304 else (base,)):
                runs[(setting, 'attention', k)] = {'tokens': str(tokens[setting]), 'val_loss': loss(k, i)}
            runs[(base, 'corridor', k)] = {'tokens': str(tokens[base]), 'val_loss': loss(k, 0) + gain}
        return runs
    runs = runs_of(lambda k, i: 1.7 + 0.01 * (k - 300) + b1 * xs[i] + b2 * xs[i] ** 2)
    quadratic = module.token_multiplier(runs, 'corridor', resamples=200, estimate=module.quadratic_multiplier)
    root = (-b1 - math.sqrt(b1 ** 2 + 4 * b2 * gain)) / (2 * b2)
    assert b1 * root + b2 * root ** 2 == pytest.approx(gain) and 0 < root < 0.05
    assert quadratic.m == pytest.approx(math.exp(root)) and quadratic.ci == pytest.approx((quadratic.m, quadratic.m))
    linear = module.token_multiplier(runs, 'corridor', resamples=200)
    assert b1 < linear.beta < 0 and linear.m > quadratic.m
    points = list(module.attention_points(runs).values())
    assert module.within_quadratic(points) == pytest.approx((b1, b2))
    steps, (_, df, _), upward, seeds = module.curvature(points)
    assert steps == pytest.approx([b1 + b2 * (xs[i] + xs[i + 1]) for i in range(3)]) and (upward, seeds, df) == (4, 4, 10)
    assert module.quadratic_multiplier([[(x, 1 - 0.01 * x + 0.5 * x * x) for x in xs]], [gain]) == math.inf  # turns
    assert module.quadratic_multiplier([[(x, 1 + 0.01 * x) for x in xs]], [gain]) == math.inf  # rising at 1×

    noise = {300: (0, 3e-3, -2e-3, 1e-3), 301: (1e-3, -1e-3, 0, 2e-3), 302: (0, 0, 4e-3, -3e-3), 303: (0, -1e-3, 0, 0)}
    loss = {(k, i): 1.7 + b1 * xs[i] + (b2 if k != 302 else -0.3) * xs[i] ** 2 + noise[k][i] for k in noise for i in range(4)}
    points = list(module.attention_points(runs_of(lambda k, i: loss.get((k, i), 1.7))).values())
    _, (f, df, p), upward, _ = module.curvature(points)
    design = np.array([[float(k == j) for j in noise] + [xs[i], xs[i] ** 2] for k in noise for i in range(4)])
    y = np.array([loss[(k, i)] for k in noise for i in range(4)])
    rss = [float(np.sum((y - d @ np.linalg.lstsq(d, y, rcond=None)[0]) ** 2)) for d in (design[:, :-1], design)]
    assert f == pytest.approx((rss[0] - rss[1]) / (rss[1] / 10)) and p == pytest.approx(module.t_two_sided_p(f ** 0.5, 10))
    assert upward == sum(np.polyfit(xs, [loss[(k, i)] for i in range(4)], 2)[0] > 0 for k in noise) == 3


def test_the_compute_multiplier_is_the_token_multiplier_times_the_throughput_ratio_by_hand(tmp_path):
    """r is exp of the mean of the pairs' ln(attention seconds / corridor seconds), with their t-interval; c = m·r.
    Its CI combines both intervals: with m's resamples all one value it is m times r's t-interval (up to the draws'
    Monte Carlo error); with r the same in every pair it is m's percentile interval times r. The words follow c's CI
    against 1, and a pair published twice is refused."""
    module = recomputed_module()
    eager = [-0.031, -0.027, -0.035, -0.029, -0.033, -0.030, -0.026, -0.034, -0.032, -0.028]
    rows = [f'eager,{i},0.5,{repr(0.5 / math.exp(d))}' for i, d in enumerate(eager)]
    rows += [f'compiled,{i},{repr(0.4 + 0.01 * i)},{repr((0.4 + 0.01 * i) / 0.99)}' for i in range(6)]
    path = tmp_path / 'throughput.csv'
    path.write_text(THROUGHPUT_HEADER + ''.join(f'{row},10,768,1,2.13.0+cpu,cpu\n' for row in rows))
    pairs = module.read_throughput(str(path))
    ratio, t = module.throughput_ratio(pairs, 'eager'), module.paired_test(eager)
    assert ratio.n == 10 and (ratio.mean, ratio.low, ratio.high) == pytest.approx((t.mean, t.low, t.high))

    def multiplier(draws, m=1.02):
        return module.Multiplier(m, module.percentiles(draws), -0.18, -0.004, [], [], 0, draws)
    c, (low, high) = module.compute_multiplier(multiplier([1.02] * module.RESAMPLES), ratio)
    assert c == pytest.approx(1.02 * math.exp(t.mean))
    assert (low, high) == pytest.approx((1.02 * math.exp(t.low), 1.02 * math.exp(t.high)), rel=2e-4)
    compiled = module.throughput_ratio(pairs, 'compiled')
    assert compiled.n == 6 and math.exp(compiled.mean) == pytest.approx(0.99)
    spread = [1.0 + 0.0001 * i for i in range(module.RESAMPLES)]
    c, (low, high) = module.compute_multiplier(multiplier(spread), compiled)
    assert (low, high) == pytest.approx((0.99 * module.percentiles(spread)[0], 0.99 * module.percentiles(spread)[1]))
    assert module.percentiles(spread) == (spread[250], spread[9749])

    table, setup = module.compute_table(pairs, multiplier([1.02] * module.RESAMPLES),
                                        multiplier([1.01] * module.RESAMPLES, 1.01))
    row = next(line for line in table.splitlines() if line.startswith("| eager (the study's runs) | 10 | "))
    assert f" | {math.exp(t.mean):.3f} [{math.exp(t.low):.3f}, {math.exp(t.high):.3f}] | " in row
    assert f" | {1.02 * math.exp(t.mean):.3f} [" in row and f" | {1.01 * math.exp(t.mean):.3f} [" in row
    assert row.endswith(" | no: attention reaches the corridor's loss with less compute |")
    assert setup == "Each pair: 10 training steps of 768 tokens per variant, interleaved, on cpu, 1 thread, torch 2.13.0+cpu."
    row = next(line for line in table.splitlines() if line.startswith("| compiled | 6 | "))
    assert row.startswith('| compiled | 6 | 0.990 [0.990, 0.990] | 1.010 [1.010, 1.010] | ')
    assert module.compute_words(1.001, 1.02).startswith('shown') and module.compute_words(0.99, 1.01).startswith('not shown')
    path.write_text(path.read_text() + 'eager,3,0.5,0.5,10,768,1,2.13.0+cpu,cpu\n')
    with pytest.raises(module.UserError, match='appears twice'):
        module.read_throughput(str(path))


# ------------------------------------------------------------------------------------------------ the plans
PLANS = REPO / 'docs' / 'plans'
# a plan's block: the commit, file and lines it is cut from, the text in a fence, an end marker (the page checks of
# tests/test_readme.py leave the block alone: its commands and links were those of its commit, from its folder)
VERBATIM = re.compile(r'<!-- verbatim: (\w+):(\S+) lines (\d+)-(\d+) -->\n(`{3,})\w*\n(.*?)\n\5\n'
                      r'<!-- end verbatim -->\n', re.S)


def git_show(commit, path):
    """The file at a commit, or None where git or the commit is not there (a shallow clone, an export)."""
    import subprocess
    try:
        shown = subprocess.run(['git', 'show', f'{commit}:{path}'], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    return shown.stdout if shown.returncode == 0 else None


def whole_section(lines, first, last):
    """Lines first..last (1-based) are a whole unit of their file: they start one (a heading, a list item, a comment,
    or after a blank line) and the next line that is not blank starts another (for a heading: one of its level or
    above; otherwise no deeper indented than the first line, so no continuation of it is left out)."""
    def indent(line):
        return len(line) - len(line.lstrip())
    head, before = lines[first - 1], lines[first - 2] if first > 1 else ''
    starts = head.lstrip().startswith(('#', '- ')) or not before.strip()
    after = next((line for line in lines[last:] if line.strip()), None)
    if head.startswith('#'):
        level = len(head) - len(head.lstrip('#'))
        return starts and (after is None or re.match(rf'#{{1,{level}}} ', after) is not None)
    return starts and (after is None or not lines[last].strip() or indent(after) <= indent(head))


@pytest.mark.parametrize('plan', sorted(p for p in PLANS.glob('*.md') if p.name != 'README.md'), ids=lambda p: p.name)
def test_each_plan_is_the_text_its_commit_holds_verbatim_and_whole(plan):
    """A plan file's body is the text of the file its header names at the commit it names, those lines exactly, and a
    whole section or list item there, not a cut from its middle."""
    blocks = VERBATIM.findall(plan.read_text())
    assert blocks, f"{plan.name} has no verbatim block"
    for commit, path, first, last, _, body in blocks:
        source = git_show(commit, path)
        if source is None:
            pytest.skip(f"git show {commit}:{path} unavailable (no git, or a clone without that commit)")
        lines = source.split('\n')
        assert body == '\n'.join(lines[int(first) - 1:int(last)]), f"{plan.name}: not {commit}:{path} {first}-{last}"
        assert whole_section(lines, int(first), int(last)), f"{plan.name}: {commit}:{path} {first}-{last} is a cut"


def test_every_plan_is_listed_with_its_commits_and_linked_from_its_studys_section():
    """docs/plans/README.md lists each plan with the commits its blocks come from; docs/studies.md links each."""
    index, studies = (PLANS / 'README.md').read_text(), (REPO / 'docs' / 'studies.md').read_text()
    plans = sorted(p for p in PLANS.glob('*.md') if p.name != 'README.md')
    assert len(plans) >= 6
    for plan in plans:
        row = next(line for line in index.splitlines() if f']({plan.name})' in line)
        assert all(commit in row for commit, *_ in VERBATIM.findall(plan.read_text())), row
        assert f'](plans/{plan.name})' in studies, f"studies.md does not link plans/{plan.name}"


def test_the_section_check_refuses_a_cut_from_the_middle():
    lines = ['## A', 'text', '- item one', '  goes on', '- item two', '', '## B', '### B.1', 'x', '## C']
    assert whole_section(lines, 1, 5) and whole_section(lines, 3, 4) and whole_section(lines, 7, 9)
    assert not whole_section(lines, 3, 3)  # its continuation left out
    assert not whole_section(lines, 4, 4)  # a continuation alone
    assert not whole_section(lines, 7, 7)  # the heading without its subsection
    assert not whole_section(lines, 1, 2)  # the heading's text without the list that follows it


def test_speed_mds_table_of_the_studys_step_is_what_its_timed_pairs_give():
    """docs/speed.md's corridor_settled table, recomputed from per_seed/throughput.csv without lab/ or the page's
    script: tokens/s over each variant's geometric mean time, the ratio of geometric means, its 95 % t-interval over 20
    batch means of consecutive pairs, and the time a token beyond attention's, 1/r − 1."""
    import csv
    from scipy import stats as scipy_stats
    page = (REPO / 'docs' / 'speed.md').read_text()
    with open(REPO / 'docs' / 'per_seed' / 'throughput.csv', newline='') as f:
        rows = list(csv.DictReader(f))
    for mode in ('eager', 'compiled'):
        pairs = [r for r in rows if r['mode'] == mode]
        tokens = int(pairs[0]['tokens_per_step']) * int(pairs[0]['steps'])
        seconds = {v: [float(r[f'{v}_seconds']) for r in pairs] for v in ('attention', 'corridor')}
        speed = {v: tokens / math.exp(statistics.fmean(map(math.log, s))) for v, s in seconds.items()}
        logs = [math.log(a / c) for a, c in zip(seconds['attention'], seconds['corridor'])]
        size = len(logs) // 20
        means = [statistics.fmean(logs[k * size:(k + 1) * size]) for k in range(20)]
        half = scipy_stats.t.ppf(0.975, 19) * statistics.stdev(means) / math.sqrt(20)
        r, low, high = (math.exp(statistics.fmean(logs) + d) for d in (0, -half, half))
        bold = '**' if mode == 'compiled' else ''
        assert f"| attention | {mode} | {speed['attention']:,.0f} | 1 | – | 1 |" in page, mode
        assert (f"| {bold}corridor{bold} | {bold}{mode}{bold} | {speed['corridor']:,.0f} | {bold}{r:.3f} [{low:.3f}, "
                f"{high:.3f}]{bold} | {bold}+{100 * (1 / r - 1):.1f} % [{100 * (1 / high - 1):.1f}, "
                f"{100 * (1 / low - 1):.1f}]{bold} |") in page, mode
