"""
The studies' statistics: paired t-tests of final losses over seeds, Holm's correction within a family, the smallest
effect a test detects at 80 % power and the seeds an effect needs, and a line fit with its CI, unweighted or weighted
by each point's precision. The distributions come from scipy.stats (the t, the noncentral t for the power, the χ² for
an SD's bound), the weighted fit from numpy; what is written here is which test, on what, and how a verdict is worded.
tests/test_sweep.py checks these against printed t tables, closed forms, R's pwr and a simulation.
"""

import math
import re
import statistics
from typing import NamedTuple

import numpy as np
from scipy import optimize, stats


def t_quantile(q, df):
    """The q-quantile of Student's t."""
    return float(stats.t.ppf(q, df))


def t_two_sided_p(t, df):
    """P(|T| ≥ |t|) for Student's t with df degrees of freedom."""
    return float(2 * stats.t.sf(abs(t), df))


def t_test_power(shift, df, alpha=0.05):
    """Power of the two-sided t-test at level alpha when the true mean is `shift` standard errors from 0: the
    probability that the noncentral t (noncentrality `shift`) falls beyond either critical value. The lower tail is
    written as the upper tail at −shift: scipy's nct.cdf far out in that tail returns NaN, its sf returns ~0."""
    critical = t_quantile(1 - alpha / 2, df)
    return float(stats.nct.sf(critical, df, shift) + stats.nct.sf(critical, df, -shift))


def min_detectable_effect(sd, n, power=0.8, alpha=0.05):
    """The smallest true mean difference a two-sided paired t-test over n pairs with this SD detects with the
    given power (the exact noncentral t, solved for the shift)."""
    if n < 2 or not sd > 0:
        return float('nan')
    gap = lambda shift: t_test_power(shift, n - 1, alpha) - power
    high = 1.0
    while gap(high) < 0:  # bracket the root by doubling
        high *= 2
    return optimize.brentq(gap, 0.0, high, xtol=1e-12) * sd / math.sqrt(n)


def seeds_for_power(effect, sd, power=0.8, alpha=0.05):
    """The fewest pairs (at least 2) with which a two-sided paired t-test at level alpha detects a true mean
    difference `effect` given the pairs' SD with the given power: min_detectable_effect's noncentral t, solved for n
    (the power rises with n, so doubling brackets it and bisection finds it). Infinite for no effect."""
    if not abs(effect) > 0:
        return math.inf
    reaches = lambda n: t_test_power(abs(effect) / sd * math.sqrt(n), n - 1, alpha) >= power
    low, high = 1, 2  # low never reaches (one pair has no test), high does once the doubling stops
    while not reaches(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if reaches(middle) else (middle, high)
    return high


def sd_upper_bound(sd, n, confidence=0.8):
    """The one-sided upper confidence bound of an SD measured on n values: s·√((n − 1) / χ²), χ² the 1 − confidence
    quantile on n − 1 degrees of freedom. Seeds sized at it give the intended power with that probability at least;
    sized at s itself they fall short about half the time (Browne 1995, on pilot studies)."""
    return sd * math.sqrt((n - 1) / stats.chi2.ppf(1 - confidence, n - 1))


class PairedTest(NamedTuple):
    n: int
    mean: float
    sd: float
    low: float           # the mean's 95 % confidence interval
    high: float
    p: float             # two-sided paired t-test of "no difference"
    mde: float           # the smallest effect detectable at 80 % power, two-sided 5 %, given this SD and n


def summary_test(mean, sd, n):
    """The paired test from a summary (mean and SD of the n paired differences): what a reader can recompute."""
    if n < 2 or not math.isfinite(sd):
        return PairedTest(n, mean, float('nan'), float('nan'), float('nan'), float('nan'), float('nan'))
    se = sd / math.sqrt(n)
    half = t_quantile(0.975, n - 1) * se
    p = t_two_sided_p(mean / se, n - 1) if se > 0 else float(mean == 0)
    return PairedTest(n, mean, sd, mean - half, mean + half, p, min_detectable_effect(sd, n))


def paired_test(differences):
    """The paired test of a list of differences, one per seed: the one-sample t-test of the differences against 0,
    which is the paired t-test of the two variants' losses."""
    if not differences:
        return PairedTest(0, float('nan'), float('nan'), float('nan'), float('nan'), float('nan'), float('nan'))
    return summary_test(statistics.fmean(differences),
                        statistics.stdev(differences) if len(differences) > 1 else float('nan'), len(differences))


def batch_means(values, batches=20):
    """The means of `batches` runs of consecutive values, of equal length (the last len % batches values left out), or
    the values themselves when there are fewer than 2·batches. Timings taken one after another share the machine's
    drifting load, so neighbours are correlated and a t-interval over them is too narrow; over the means of long
    enough runs it is not (the batch-means method; 20 batches leave 19 degrees of freedom)."""
    if len(values) < 2 * batches:
        return list(values)
    size = len(values) // batches
    return [statistics.fmean(values[k * size:(k + 1) * size]) for k in range(batches)]


def log_ratio_test(numerators, denominators):
    """The test of ln(a / b) over pairs taken one after another (timings: lab/bench.py, docs/results_recomputed.py):
    its mean over every pair (exp of it: the ratio of the geometric means), its SD, n and t-interval over their
    batch_means, so that neighbours sharing a load do not narrow it."""
    logs = [math.log(a / b) for a, b in zip(numerators, denominators)]
    if not logs:
        return paired_test([])
    means = batch_means(logs)
    return summary_test(statistics.fmean(logs), statistics.stdev(means) if len(means) > 1 else float('nan'), len(means))


def holm(p_values):
    """Holm's step-down adjustment: the k-th smallest of m p-values times (m − k + 1), kept monotone, at most 1.
    (scipy has no Holm, only Benjamini–Hochberg in false_discovery_control; statsmodels' multipletests has it, but
    is a large dependency for six lines.)"""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def verdict(test, p_adjusted):
    """'lower' / 'higher' when the Holm-adjusted p is below 5 %; otherwise 'inconclusive, no effect larger than X',
    X the 95 % CI's bound farthest from zero (the data's own bound, unlike the MDE, which is the design's)."""
    if test.n == 0:
        return 'not measured'
    if not math.isfinite(test.p):
        return 'inconclusive (one seed)'
    if p_adjusted < 0.05:
        return 'lower' if test.mean < 0 else 'higher'
    return f"inconclusive, no effect larger than {max(abs(test.low), abs(test.high)):.2g}"


def fmt_p(p):
    return '–' if not math.isfinite(p) else '<0.001' if p < 0.001 else f'{p:.3f}'


class Tests:
    """Every paired test of one report. A family's Holm adjustment needs all of its p-values, so a cell is written
    as a placeholder when the test is added and filled in once the report is complete."""

    def __init__(self):
        self.tests = []

    def add(self, family, label, differences):
        """A placeholder for the test's cell; a test shown twice (a table and a claim's line) counts once."""
        if not differences:
            return 'not measured'
        for i, t in enumerate(self.tests):
            if (t['family'], t['label']) == (family, label):
                return f'\x00{i}\x00'
        self.tests.append(dict(family=family, label=label, differences=list(differences),
                               **paired_test(list(differences))._asdict()))
        return f'\x00{len(self.tests) - 1}\x00'

    def finish(self):
        for family in dict.fromkeys(t['family'] for t in self.tests):
            cells = [t for t in self.tests if t['family'] == family]
            members = [t for t in cells if math.isfinite(t['p'])]  # a cell of one seed has no p
            for t, adjusted in zip(members, holm([t['p'] for t in members])):
                t['p_holm'] = adjusted
            for t in cells:  # every cell, one without a p too, knows its family's size
                t['family_size'] = len(members)
        for t in self.tests:
            t.setdefault('p_holm', float('nan'))
            t['verdict'] = verdict(PairedTest(*(t[k] for k in PairedTest._fields)), t['p_holm'])

    def cell(self, t):
        if t['n'] < 2:
            return f"{t['mean']:+.3g} (n = {t['n']}): {t['verdict']}"
        words = f"**{t['verdict']}**" if t['verdict'] in ('lower', 'higher') else t['verdict']
        return (f"{t['mean']:+.3g} [{t['low']:+.2g}, {t['high']:+.2g}], p {fmt_p(t['p'])}, Holm {fmt_p(t['p_holm'])}, "
                f"MDE {t['mde']:.2g}: {words}")

    def fill(self, text):
        return re.sub('\x00(\\d+)\x00', lambda m: self.cell(self.tests[int(m[1])]), text)


def ci_half_width(differences):
    """Half the 95 % CI of the mean of a list of differences (the figures' error bars); 0 for one value."""
    test = paired_test(list(differences))
    return (test.high - test.low) / 2 if test.n > 1 else 0.0


def line_fit(xs, ys):
    """Least squares y = a + b·x: (b, its 95 % CI low, high, p of b = 0, n), from the t distribution on n − 2
    degrees of freedom; NaNs when fewer than 3 points or one x."""
    n = len(xs)
    if n < 3 or len(set(xs)) < 2:
        return (float('nan'),) * 4 + (n,)
    fit = stats.linregress(xs, ys)
    half = t_quantile(0.975, n - 2) * fit.stderr
    return float(fit.slope), float(fit.slope - half), float(fit.slope + half), float(fit.pvalue) if fit.stderr > 0 else 0.0, n


def weighted_line_fit(xs, ys, ses):
    """Weighted least squares y = a + b·x of k means ys with standard errors ses, weights 1/SE² (a precise mean counts
    more): (b, its 95 % CI low, high, p of b = 0, k). The SEs set only the weights' ratios; the scale comes from the
    residuals (the weighted χ² over k − 2), so the CI is t on k − 2 degrees of freedom, as line_fit's, and equal SEs
    give line_fit of the means. Means that scatter about the line more than their SEs allow widen the CI instead of
    hiding behind the SEs. NaNs when fewer than 3 points, one x, or an SE not a positive number."""
    k = len(xs)
    if k < 3 or len(set(xs)) < 2 or not all(math.isfinite(se) and se > 0 for se in ses):
        return (float('nan'),) * 4 + (k,)
    (slope, _), cov = np.polyfit(xs, ys, 1, w=[1 / se for se in ses], cov=True)  # polyfit's w is 1/SE, not 1/SE²
    se_slope = math.sqrt(cov[0][0])
    half = t_quantile(0.975, k - 2) * se_slope
    p = t_two_sided_p(slope / se_slope, k - 2) if se_slope > 0 else 0.0
    return float(slope), float(slope - half), float(slope + half), p, k
