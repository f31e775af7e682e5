"""harness.judge.stats: the bootstrap, the margin tests, Holm, McNemar and the repeats rule, against hand-worked values."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from harness.judge import paired_accuracy, stats


def _repeats(rng, values_per_repeat, repeats, scale=1.0, sd=0.05):
    return [scale * rng.lognormal(3.0, sd, values_per_repeat) for _ in range(repeats)]


def test_statistic_of_pools_repeats_like_vllm():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([4.0, 10.0])
    pooled = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    assert stats.statistic_of([a, b], "mean") == pytest.approx(pooled.mean())
    assert stats.statistic_of([a, b], "median") == pytest.approx(3.0)
    assert stats.statistic_of([a, b], "p99") == pytest.approx(np.quantile(pooled, 0.99))
    with pytest.raises(ValueError, match="unknown statistic"):
        stats.statistic_of([a], "p100")


def test_bootstrap_is_seeded_and_reports_the_point_ratio():
    rng = np.random.default_rng(0)
    base = _repeats(rng, 40, 5)
    cand = _repeats(rng, 40, 5, scale=1.1)
    first = stats.paired_block_bootstrap(base, cand, "mean", n_resamples=500, seed=7)
    again = stats.paired_block_bootstrap(base, cand, "mean", n_resamples=500, seed=7)
    other = stats.paired_block_bootstrap(base, cand, "mean", n_resamples=500, seed=8)
    assert first == again and first.se != other.se
    assert first.ratio == pytest.approx(np.concatenate(cand).mean() / np.concatenate(base).mean())
    assert first.df == 4 and first.repeats == 5
    assert first.percentile_95[0] < first.ratio < first.percentile_95[1]


def test_one_value_per_repeat_matches_the_paired_t_standard_error():
    """Throughput: the corrected bootstrap se of a ratio of means ≈ the paired-t se of per-repeat log ratios."""
    rng = np.random.default_rng(1)
    base = 100 * np.exp(rng.normal(0, 0.01, 8))
    cand = 0.97 * base * np.exp(rng.normal(0, 0.01, 8))
    estimate = stats.paired_block_bootstrap([np.array([v]) for v in base], [np.array([v]) for v in cand],
                                            n_resamples=4000, seed=0)
    paired = np.log(cand / base)
    assert estimate.se == pytest.approx(paired.std(ddof=1) / math.sqrt(8), rel=0.15)


@pytest.mark.parametrize("statistic", ["mean", "median", "p99"])
def test_unequal_repeat_sizes_use_the_masked_path(statistic):
    rng = np.random.default_rng(2)
    base = [rng.lognormal(3, 0.1, n) for n in (30, 50, 40)]
    cand = [rng.lognormal(3, 0.1, n) for n in (50, 30, 45)]
    estimate = stats.paired_block_bootstrap(base, cand, statistic, n_resamples=300, seed=0)
    assert math.isfinite(estimate.se) and estimate.se > 0
    # Without resampling anything, the masked statistic of the identity draw is the pooled statistic.
    padded, counts = stats._padded(base)
    identity = np.arange(3)[None, :]
    value = stats._resampled_statistic(padded, counts, identity, np.random.default_rng(0),
                                       stats._quantile_level(statistic), resample_requests=False)
    assert value[0] == pytest.approx(stats.statistic_of(base, statistic))


def test_bootstrap_chunks_bound_memory(monkeypatch):
    monkeypatch.setattr(stats, "_CHUNK_ELEMENTS", 500)
    rng = np.random.default_rng(3)
    estimate = stats.paired_block_bootstrap(_repeats(rng, 100, 4), _repeats(rng, 100, 4), "p99",
                                            n_resamples=250, seed=0)
    assert estimate.n_resamples == 250 and estimate.se > 0


@pytest.mark.parametrize("base,cand,match", [
    ([np.ones(3)], [np.ones(3)], "at least two"),
    ([np.ones(3)] * 2, [np.ones(3)] * 3, "differ in number"),
    ([np.ones(3), np.array([1.0, np.nan])], [np.ones(3)] * 2, "finite"),
    ([np.ones(3), np.array([])], [np.ones(3)] * 2, "no values"),
    ([np.zeros(3)] * 2, [np.ones(3)] * 2, "positive"),
])
def test_bootstrap_rejects_what_it_cannot_estimate(base, cand, match):
    with pytest.raises(ValueError, match=match):
        stats.paired_block_bootstrap(base, cand, n_resamples=100)


def test_interval_coverage_with_few_repeats():
    """With 5 repeats the t-based interval keeps its coverage; the plain percentile interval would not."""
    rng = np.random.default_rng(4)
    covered = percentile_covered = 0
    trials = 300
    for trial in range(trials):
        base = 100 * np.exp(rng.normal(0, 0.02, 5))
        cand = base * np.exp(rng.normal(0, 0.02, 5))           # true ratio 1
        estimate = stats.paired_block_bootstrap([np.array([v]) for v in base], [np.array([v]) for v in cand],
                                                n_resamples=200, seed=trial)
        low, high = stats.interval(estimate.log_ratio, estimate.se, estimate.df, 0.025)
        covered += low <= 0 <= high
        percentile_covered += estimate.percentile_95[0] <= 1 <= estimate.percentile_95[1]
    assert covered / trials >= 0.90
    assert percentile_covered < covered


def test_noninferiority_pvalues_follow_the_direction():
    limit = math.log(0.97)
    p_pass, p_fail = stats.noninferiority_pvalues(0.0, 0.01, 4, limit, higher_is_better=True)
    assert p_pass + p_fail == pytest.approx(1.0)
    assert p_pass == pytest.approx(sps.t.sf(-limit / 0.01, 4))
    # Lower-is-better: a ratio of 1.05 against a +3 % margin is bad.
    p_pass, p_fail = stats.noninferiority_pvalues(math.log(1.05), 0.005, 9, math.log(1.03), higher_is_better=False)
    assert p_fail < 0.01 < 0.99 < p_pass
    # Zero spread is degenerate: no evidence either way, whatever the estimate.
    assert stats.noninferiority_pvalues(0.0, 0.0, 4, limit, True) == (1.0, 1.0)
    assert stats.noninferiority_pvalues(limit, 0.0, 4, limit, True) == (1.0, 1.0)
    # ... unless the metric repeats exactly (an MTP count): the t-test's limit as se → 0, on the margin still (1, 1).
    assert stats.noninferiority_pvalues(0.0, 0.0, 4, limit, True, exact=True) == (0.0, 1.0)
    assert stats.noninferiority_pvalues(2 * limit, 0.0, 4, limit, True, exact=True) == (1.0, 0.0)
    assert stats.noninferiority_pvalues(limit, 0.0, 4, limit, True, exact=True) == (1.0, 1.0)


def test_an_estimate_exactly_on_the_margin_is_on_it():
    """log(0.97) is 2.8e-17 below log1p(-0.03): within the tolerance, so exactly on the margin (p = ½ each side)."""
    assert math.log(0.97) < math.log1p(-0.03)
    p_pass, p_fail = stats.noninferiority_pvalues(math.log(0.97), 1e-3, 4, math.log1p(-0.03), True)
    assert p_pass == p_fail == 0.5
    assert stats.is_degenerate(0.0) and stats.is_degenerate(1e-9) and not stats.is_degenerate(1e-3)


@pytest.mark.parametrize("estimate", [-0.05, -0.031, -0.02, 0.0])
def test_interval_bound_clears_the_margin_exactly_when_the_test_rejects(estimate):
    limit, se, df, level = math.log(0.97), 0.006, 7, 0.0125
    low, high = stats.interval(estimate, se, df, level)
    p_pass, p_fail = stats.noninferiority_pvalues(estimate, se, df, limit, True)
    assert (low > limit) == (p_pass < level)
    assert (high < limit) == (p_fail < level)


def test_holm_matches_a_hand_worked_example():
    # sorted 0.005, 0.01, 0.03, 0.04 → ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 → running max 0.02, 0.03, 0.06, 0.06
    adjusted = stats.holm_adjust([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    reject, level = stats.holm_test([0.01, 0.04, 0.03, 0.005], 0.05)
    assert list(reject) == [True, False, False, True]
    assert level == pytest.approx([0.05 / 3, 0.05 / 2, 0.05 / 2, 0.05 / 4])
    assert stats.holm_adjust([]).size == 0


def test_holm_test_agrees_with_adjusted_pvalues():
    rng = np.random.default_rng(5)
    for _ in range(200):
        p = rng.uniform(0, 0.1, rng.integers(1, 12))
        reject, level = stats.holm_test(p, 0.05)
        assert list(reject) == list(stats.holm_adjust(p) <= 0.05)
        assert all((p <= level) == reject)                      # the shown level never contradicts the decision


def test_mcnemar_exact_is_a_binomial_test_on_discordant_pairs():
    base = np.array([1] * 50 + [1] * 10 + [0] * 2 + [0] * 8, dtype=bool)
    cand = np.array([1] * 50 + [0] * 10 + [1] * 2 + [0] * 8, dtype=bool)
    result = paired_accuracy.mcnemar_exact(base, cand)
    assert (result.baseline_only, result.candidate_only, result.both, result.neither) == (10, 2, 50, 8)
    assert result.p_value == pytest.approx(2 * (1 + 12 + 66) / 4096)   # 2·P(X ≤ 2), X ~ Bin(12, ½)
    assert paired_accuracy.mcnemar_exact(base, base).p_value == 1.0


def test_paired_difference_uses_agresti_min():
    base = np.array([1] * 80 + [1] * 6 + [0] * 4 + [0] * 10)
    cand = np.array([1] * 80 + [0] * 6 + [1] * 4 + [0] * 10)
    diff = paired_accuracy.paired_difference(base, cand)
    assert diff.difference == pytest.approx(-0.02)
    b, c, n = 6.5, 4.5, 102.0
    assert diff.adjusted == pytest.approx((c - b) / n)
    assert diff.se == pytest.approx(math.sqrt((b + c) - (c - b) ** 2 / n) / n)
    same = paired_accuracy.paired_difference(np.ones(1319), np.ones(1319))
    assert same.difference == 0 and 0 < same.se < 0.001          # no zero-width interval when the arms agree


def test_samples_needed_is_where_tangos_test_rejects_at_the_observed_rates():
    """The fresh-clone review of 2026-12-05: the advice "≈129 questions would settle it" came from the Agresti–Min
    Wald standard error, while at n = 129 the cell's own test (Tango's) still did not PASS. Now the advice is the
    smallest n at which Tango's test, the rates held, rejects — checked here by scaling the counts."""
    b, c, n, limit, level = 3, 5, 128, -0.01, 0.05
    assert paired_accuracy.tango_pvalues(b, c, n, limit)[0] > level                        # undecided now
    need = paired_accuracy.samples_needed(b, c, n, limit, level)
    at = lambda m: paired_accuracy.tango_pvalues(b * m / n, c * m / n, m, limit)[0]       # noqa: E731
    assert at(need) <= level + 1e-12 < at(need - 1)
    assert paired_accuracy.samples_needed(5, 3, 128, limit, level) > need                   # leaning to FAIL: farther
    assert paired_accuracy.samples_needed(0, 30, 128, limit, level) == 128                  # already rejects


def test_tango_restricted_mle_maximises_the_constrained_likelihood():
    from scipy.optimize import minimize_scalar

    b, c, n, delta = 12, 5, 200, -0.01
    loglik = lambda x: -(b * math.log(x) + c * math.log(x + delta) + (n - b - c) * math.log(1 - 2 * x - delta))  # noqa: E731
    best = minimize_scalar(loglik, bounds=(-delta + 1e-9, (1 - delta) / 2 - 1e-9), method="bounded",
                           options={"xatol": 1e-12}).x
    z = paired_accuracy.tango_z(b, c, n, delta)
    assert z == pytest.approx((c - b - n * delta) / math.sqrt(n * (2 * best + delta * (1 - delta))), rel=1e-6)


@pytest.mark.parametrize("n, discordance", [(1319, 0.011), (1319, 0.015), (500, 0.011)])
def test_tango_pass_size_at_the_margin_is_at_most_alpha_where_the_wald_was_not(n, discordance):
    """Exact size (trinomial sum) of the accuracy PASS at −1 pt; issue #24: Agresti–Min Wald 7.5 / 6.8 / 10.4 %."""
    from harness.study.regression import accuracy_size

    size = accuracy_size(n, discordance)
    assert size["size_tango"] <= 0.05 + 0.002 and size["size_agresti_min_wald"] > 0.06


def test_tango_interval_agrees_with_its_test():
    b, c, n = 9, 4, 1319
    low, high = paired_accuracy.tango_interval(b, c, n, 0.05)
    assert paired_accuracy.tango_pvalues(b, c, n, low)[0] == pytest.approx(0.05, abs=1e-6)
    assert paired_accuracy.tango_pvalues(b, c, n, low - 1e-4)[0] < 0.05 < paired_accuracy.tango_pvalues(b, c, n, low + 1e-4)[0]
    assert low < (c - b) / n < high
