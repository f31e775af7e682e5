"""Paired binary outcomes (one GSM8K question answered by both arms): the accuracy cell's statistics.

Each arm's accuracy and their paired difference (Agresti–Min), the exact McNemar test, and Tango's score test with its
interval and the sample size that would settle it. Pure functions (numpy; scipy imported where used: scipy.stats
costs ~1 s and the CLI imports the judge). The block-bootstrap ratios of the timing cells are
:mod:`harness.judge.stats`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["McNemarResult", "PairedDifference", "mcnemar_exact", "paired_difference", "samples_needed", "tango_z",
           "tango_pvalues", "tango_interval"]


@dataclass(frozen=True)
class McNemarResult:
    """Exact McNemar test on paired binary outcomes.

    ``baseline_only``: pairs right in the baseline only (``b``); ``candidate_only``: right in the candidate only
    (``c``); ``p_value``: two-sided exact p-value of H0 "the arms are equally accurate".
    """

    n: int
    both: int
    neither: int
    baseline_only: int
    candidate_only: int
    p_value: float


def mcnemar_exact(baseline_correct: np.ndarray, candidate_correct: np.ndarray) -> McNemarResult:
    """Exact (conditional) McNemar test: a binomial test of ``c`` successes in ``b + c`` discordant pairs, ``p = ½``.

    McNemar, Q. (1947). "Note on the sampling error of the difference between correlated proportions or percentages".
    *Psychometrika* 12(2): 153–157; exact form as in Fagerland, Lydersen & Laake (2013), *BMC Med. Res. Methodol.*
    13:91. Two-sided ``p = min(1, 2 · P(X ≤ min(b, c)))``, ``X ~ Binomial(b + c, ½)``; ``p = 1`` with no discordance.
    """
    from scipy.stats import binomtest   # here, not at import: scipy.stats costs ~1 s and the CLI imports this module

    base = np.asarray(baseline_correct, dtype=bool)
    cand = np.asarray(candidate_correct, dtype=bool)
    if base.shape != cand.shape:
        raise ValueError("paired outcomes must have the same length")
    b = int((base & ~cand).sum())
    c = int((~base & cand).sum())
    p_value = float(binomtest(c, b + c, 0.5).pvalue) if b + c else 1.0
    return McNemarResult(n=int(base.size), both=int((base & cand).sum()), neither=int((~base & ~cand).sum()),
                         baseline_only=b, candidate_only=c, p_value=min(1.0, p_value))


@dataclass(frozen=True)
class PairedDifference:
    """Accuracy of each arm and their paired difference ``candidate − baseline`` (proportions, not points).

    ``difference`` is the observed difference; ``adjusted``/``se`` are the Agresti–Min centre and standard error
    used for the interval and the margin test; ``*_stderr`` are each arm's standard errors as lm-eval reports them
    (``sqrt(var(ddof=1) / n)``).
    """

    n: int
    baseline: float
    candidate: float
    baseline_stderr: float
    candidate_stderr: float
    difference: float
    adjusted: float
    se: float


def paired_difference(baseline_correct: np.ndarray, candidate_correct: np.ndarray) -> PairedDifference:
    """Paired difference of two accuracies with the Agresti–Min adjusted Wald standard error.

    Agresti, A. & Min, Y. (2005). "Simple improved confidence intervals for comparing matched proportions".
    *Statistics in Medicine* 24(5): 729–740: add ½ to each of the four cells of the paired 2×2 table (``n' = n + 2``),
    then ``d' = (c' − b') / n'`` and ``Var(d') = ((b' + c') − (c' − b')² / n') / n'²``. Unlike the plain Wald interval
    it does not collapse to zero width when the arms agree on every question.
    """
    base = np.asarray(baseline_correct, dtype=float)
    cand = np.asarray(candidate_correct, dtype=float)
    n = base.size
    if n < 2 or cand.size != n:
        raise ValueError("need at least two paired outcomes of equal length")
    b = float(((base == 1) & (cand == 0)).sum()) + 0.5
    c = float(((base == 0) & (cand == 1)).sum()) + 0.5
    n_adj = n + 2.0
    adjusted = (c - b) / n_adj
    se = math.sqrt(max((b + c) - (c - b) ** 2 / n_adj, 0.0)) / n_adj
    return PairedDifference(n=n, baseline=float(base.mean()), candidate=float(cand.mean()),
                            baseline_stderr=float(base.std(ddof=1) / math.sqrt(n)),
                            candidate_stderr=float(cand.std(ddof=1) / math.sqrt(n)),
                            difference=float(cand.mean() - base.mean()), adjusted=adjusted, se=se)


def tango_z(baseline_only: int, candidate_only: int, n: int, delta: float) -> float:
    """Tango's score statistic for H0 "``p_cand − p_base = delta``" on paired binary outcomes.

    Tango, T. (1998). "Equivalence test and confidence interval for the difference in proportions for the
    paired-sample design". *Statistics in Medicine* 17(8): 891–908, eq. (3); the variance at the restricted MLE
    (Nam 1997, *Biometrics* 53:1422, for the same statistic). With ``b`` = ``baseline_only``, ``c`` =
    ``candidate_only`` (the discordant pairs) and ``p̃`` the MLE of P(baseline right only) under H0 (the root in
    [max(0, −δ), (1 − δ)/2] of ``2n p² − B p − b δ (1 − δ) = 0``, ``B = b + c + (c − b − 2n) δ``):
    ``z = (c − b − n δ) / sqrt(n (2 p̃ + δ (1 − δ)))``. Large ``z``: the candidate is better than ``delta``.
    ``z = 0`` where numerator and variance both vanish (no discordance tested at δ = 0); ±inf where only the
    variance does."""
    big_b = baseline_only + candidate_only + (candidate_only - baseline_only - 2 * n) * delta
    p10 = (big_b + math.sqrt(max(big_b * big_b + 8.0 * n * baseline_only * delta * (1.0 - delta), 0.0))) / (4.0 * n)
    numerator = candidate_only - baseline_only - n * delta
    variance = n * (2.0 * p10 + delta * (1.0 - delta))
    if variance <= 1e-300:
        return 0.0 if abs(numerator) < 1e-12 else math.copysign(math.inf, numerator)
    return numerator / math.sqrt(variance)


def tango_pvalues(baseline_only: int, candidate_only: int, n: int, limit: float) -> tuple[float, float]:
    """``(p_pass, p_fail)`` of the accuracy margin ``limit`` (a proportion difference, e.g. −0.01) by Tango's score
    test (:func:`tango_z`) with a normal reference: ``p_pass`` tests H0 "the candidate is worse than the margin"
    (``1 − Φ(z)``), ``p_fail`` H0 "within it or better" (``Φ(z)``). Its size at the −1 pt margin, n = 1319, is
    4.0–4.9 % where the Agresti–Min Wald's is 6.8–7.5 % (issue #24; ``tests/test_stats.py`` computes it exactly)."""
    from scipy.special import ndtr

    z = tango_z(baseline_only, candidate_only, n, limit)
    cdf = float(ndtr(z))
    return 1.0 - cdf, cdf


def tango_interval(baseline_only: int, candidate_only: int, n: int, level: float) -> tuple[float, float]:
    """The score interval of ``p_cand − p_base`` at two-sided confidence ``1 − 2 level`` (Tango 1998 §3): the
    ``delta`` where :func:`tango_z` equals ``± z_{1−level}`` (z decreases in ``delta``; found by Brent's method).
    Each bound clears a margin exactly when :func:`tango_pvalues` rejects at ``level``."""
    from scipy.optimize import brentq
    from scipy.special import ndtri

    z = float(ndtri(1.0 - level))
    edge = 1.0 - 1e-12

    def bound(target: float) -> float:
        f = lambda d: tango_z(baseline_only, candidate_only, n, d) - target   # noqa: E731
        if f(-edge) <= 0:
            return -1.0
        if f(edge) >= 0:
            return 1.0
        return float(brentq(f, -edge, edge, xtol=1e-12))

    return bound(z), bound(-z)


def samples_needed(baseline_only: int, candidate_only: int, n: int, limit: float, level: float) -> int | None:
    """Paired questions at which Tango's score test at the margin ``limit`` (:func:`tango_z`) would reject at
    ``level`` on the side the data lean to, the discordance rates ``b/n`` and ``c/n`` held as observed.

    At fixed rates the restricted MLE ``p̃`` of :func:`tango_z` does not depend on ``n`` (its quadratic scales with
    ``n``), so ``z`` grows as ``√n`` and the answer is ``n (z_{1−level} / |z|)²`` — the same test the cell is judged
    by, not a Wald approximation of it. ``n`` itself when it already rejects; None when ``z = 0`` (the estimate sits
    on the margin: no sample size settles it)."""
    z = tango_z(baseline_only, candidate_only, n, limit)
    if z == 0.0:
        return None
    if math.isinf(z):
        return n
    from scipy.special import ndtri

    need = float(ndtri(1.0 - level)) / abs(z)
    return max(n, int(math.ceil(n * need * need)))
