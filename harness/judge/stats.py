"""Paired statistics for the A/B gate: block-bootstrap ratios, non-inferiority p-values, Holm (the accuracy cell's
paired binary tests — McNemar, Agresti–Min, Tango — are :mod:`harness.judge.paired_accuracy`).

Pure functions on numpy arrays (numpy and scipy only: no pandas, no I/O). Shape legend used below:
``B`` bootstrap resamples, ``R`` repeats (paired between arms: repeat ``r`` of both arms ran in the same ABBA block),
``N`` requests of the longest repeat (shorter repeats are padded and masked).

Conventions
-----------
A comparison is the ratio ``θ = S(candidate) / S(baseline)`` of one statistic ``S`` (mean, median, pNN) of one metric,
analysed on the log scale (``log θ``), where a ratio's sampling distribution is close to symmetric. The margin is a
ratio limit ``λ`` (e.g. 0.97 for "throughput may lose at most 3 %", 1.03 for "TPOT may grow at most 3 %"). For a
higher-is-better metric the candidate is non-inferior when ``θ > λ``; for a lower-is-better one when ``θ < λ``.

Interval: the paired two-stage block bootstrap gives the standard error of ``log θ̂``; the interval is
``log θ̂ ± t_{1−a, R−1} · se`` (bootstrap standard-error interval with Student-t quantiles; Efron & Tibshirani 1993,
*An Introduction to the Bootstrap*, §6 and §12.5). Why not the percentile interval: with the 3–10 repeats a benchmark
can afford, the clustering unit (the repeat) has so few values that percentile intervals are too narrow — the bootstrap
variance of a mean of ``R`` values is ``(R − 1)/R`` of the unbiased one, and the resampling distribution is discrete
(Hesterberg 2015, "What teachers should know about the bootstrap", *The American Statistician* 69(4), §3: the
"narrowness bias"). We therefore multiply the bootstrap standard error by ``sqrt(R / (R − 1))`` and use ``R − 1``
degrees of freedom, which reduces to the paired t-test on per-repeat log ratios when each repeat holds one value
(throughput). The plain 95 % percentile interval is still returned as a diagnostic.

The gate resamples sessions only (``resample_requests=False``, :mod:`harness.judge.verdict`): each session's
statistic is computed on all its requests, so request metrics are tested on per-session values, the unit of
replication (issue #24). The optional two-stage resampling (repeats, then requests within each drawn repeat; Davison
& Hinkley 1997, *Bootstrap Methods and their Application*, §3.8) over-states the variance by counting within-repeat
noise twice; it is kept for diagnostics, not for decisions.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

__all__ = [
    "RatioEstimate",
    "statistic_of", "paired_block_bootstrap", "student_quantile", "student_cdf",
    "noninferiority_pvalues", "interval", "holm_adjust", "holm_test", "rejects",
    "MARGIN_TOLERANCE", "DEGENERATE_SE", "is_degenerate",
]

_QUANTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")
_CHUNK_ELEMENTS = 4_000_000
"""Upper bound on ``B × R × N`` per bootstrap chunk (≈ 32 MB of float64) so large GPU runs do not exhaust memory."""
MARGIN_TOLERANCE = 1e-9
"""Distance from the margin (log-ratio or proportion scale) below which an estimate counts as *on* the margin:
``log(0.97)`` and ``log1p(-0.03)`` differ by 2.8e-17 in float64, so an exact −3 % must not read as beyond it. 1e-9 is
a 1e-7 % change, far below any measurable one and far above float64 rounding of logs (~1e-16)."""
DEGENERATE_SE = 1e-6
"""Standard error (log-ratio or proportion scale) below which the spread counts as zero: a ratio known to 1e-4 %.
No timing measurement repeats that closely (the quietest pools show per-repeat CV ≈ 1 %), so such a spread means
copied or identical values, and a verdict from it would be certain for no reason: the test is not run."""


def _special():
    """scipy.special, imported on first use: scipy's import costs about a second, which commands that never compute
    an interval (plan, compare's bad-input paths) should not pay."""
    from scipy import special

    return special


def _quantile_level(statistic: str) -> float | None:
    """``"mean"`` → None; ``"median"`` → 0.5; ``"p99"`` → 0.99. Raises ValueError on anything else."""
    if statistic == "mean":
        return None
    if statistic == "median":
        return 0.5
    match = _QUANTILE.match(statistic)
    if not match or not 0 < float(match.group(1)) < 100:
        raise ValueError(f"unknown statistic {statistic!r}; use 'mean', 'median' or 'pNN' (e.g. 'p99')")
    return float(match.group(1)) / 100.0


def statistic_of(repeats: Sequence[np.ndarray], statistic: str = "mean") -> float:
    """The statistic of the values of all ``repeats`` pooled (as vLLM computes it over one run's requests).

    Quantiles use numpy's default linear interpolation, the definition ``vllm bench serve`` uses for its pNN columns.
    """
    values = np.concatenate([np.asarray(r, dtype=float).ravel() for r in repeats])
    if values.size == 0:
        raise ValueError("no values")
    q = _quantile_level(statistic)
    return float(values.mean() if q is None else np.quantile(values, q))


def student_quantile(df: float, p: float | np.ndarray) -> np.ndarray:
    """Quantile of Student's t with ``df`` degrees of freedom (``df = inf``: standard normal)."""
    return _special().ndtri(p) if math.isinf(df) else _special().stdtrit(df, p)


def student_cdf(df: float, x: float | np.ndarray) -> np.ndarray:
    """CDF of Student's t with ``df`` degrees of freedom (``df = inf``: standard normal)."""
    return _special().ndtr(x) if math.isinf(df) else _special().stdtr(df, x)


@dataclass(frozen=True)
class RatioEstimate:
    """A paired ratio ``candidate / baseline`` with its bootstrap standard error on the log scale.

    Attributes:
        baseline, candidate: the statistic of each arm over all its repeats' values pooled.
        log_ratio: ``log(candidate / baseline)``.
        se: bootstrap standard error of ``log_ratio`` times ``sqrt(R/(R−1))`` (see the module docstring).
        df: reference degrees of freedom, ``R − 1`` (``inf`` for a normal reference).
        repeats: ``R``, the number of paired repeats.
        percentile_95: the plain bootstrap 2.5 %/97.5 % percentiles of the ratio (diagnostic only).
        n_resamples: ``B``.
    """

    baseline: float
    candidate: float
    log_ratio: float
    se: float
    df: float
    repeats: int
    percentile_95: tuple[float, float]
    n_resamples: int

    @property
    def ratio(self) -> float:
        return math.exp(self.log_ratio)


def _padded(repeats: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Stack ragged per-repeat values into ``(R, N)`` (NaN-padded) and their counts ``(R,)``."""
    arrays = [np.asarray(r, dtype=float).ravel() for r in repeats]
    counts = np.array([a.size for a in arrays], dtype=np.int64)
    if (counts == 0).any():
        raise ValueError("a repeat holds no values")
    for a in arrays:
        if not np.isfinite(a).all():
            raise ValueError("values must be finite (drop failed requests before the bootstrap)")
    padded = np.full((len(arrays), int(counts.max())), np.nan)
    for row, a in enumerate(arrays):
        padded[row, : a.size] = a
    return padded, counts


def _resampled_statistic(padded: np.ndarray, counts: np.ndarray, idx: np.ndarray, rng: np.random.Generator,
                         q: float | None, resample_requests: bool) -> np.ndarray:
    """The statistic of each bootstrap resample ``(B,)``: repeats ``idx (B, R)``, then requests within each repeat."""
    b, repeats = idx.shape
    n_max = padded.shape[1]
    if counts.min() == n_max:                                      # equal repeat sizes (the usual case): no mask
        if resample_requests and n_max > 1:
            within = (rng.random((b, repeats, n_max), dtype=np.float32) * n_max).astype(np.int64)
            np.minimum(within, n_max - 1, out=within)               # float32 rounding can reach n_max
            values = padded.ravel()[idx[..., None] * n_max + within].reshape(b, -1)
        else:
            values = padded[idx].reshape(b, -1)
        return values.mean(axis=1) if q is None else np.quantile(values, q, axis=1)
    n_sel = counts[idx]                                            # (B, R) requests in each drawn repeat
    slots = np.arange(n_max)
    mask = slots < n_sel[..., None]                                # (B, R, N) real (not padding) slots
    if resample_requests and n_max > 1:
        within = (rng.random(mask.shape) * n_sel[..., None]).astype(np.int64)   # uniform in [0, n_sel)
    else:
        within = np.broadcast_to(slots, mask.shape)
    flat = idx[..., None] * n_max + np.minimum(within, n_max - 1)
    values = padded.ravel()[flat]                                  # (B, R, N)
    if q is None:
        return np.where(mask, values, 0.0).sum(axis=(1, 2)) / mask.sum(axis=(1, 2))
    ordered = np.sort(np.where(mask, values, np.inf).reshape(b, -1), axis=1)
    k = mask.reshape(b, -1).sum(axis=1)
    position = q * (k - 1)                                          # numpy 'linear': x[lo] + frac·(x[hi] − x[lo])
    lo = np.floor(position).astype(np.int64)
    hi = np.minimum(lo + 1, k - 1)
    x_lo = np.take_along_axis(ordered, lo[:, None], axis=1)[:, 0]
    x_hi = np.take_along_axis(ordered, hi[:, None], axis=1)[:, 0]
    return x_lo + (position - lo) * (x_hi - x_lo)


def paired_block_bootstrap(baseline: Sequence[np.ndarray], candidate: Sequence[np.ndarray], statistic: str = "mean",
                           *, n_resamples: int = 2000, seed: int | Sequence[int] = 0,
                           resample_requests: bool = True) -> RatioEstimate:
    """Paired two-stage block bootstrap of ``S(candidate) / S(baseline)``.

    ``baseline[r]`` and ``candidate[r]`` are the values of repeat ``r`` of each arm: the per-request values of a
    latency metric, or a one-element array holding the per-repeat figure (throughput, acceptance length). Each
    resample draws ``R`` repeat indices with replacement, the same indices for both arms (the pairing: repeat ``r`` of
    both arms ran in the same ABBA block, so slow drift cancels in the ratio), then, independently per arm, as many
    requests with replacement from each drawn repeat as it holds. ``S`` is taken over the pooled draws of each arm.

    Args:
        statistic: ``"mean"``, ``"median"`` or ``"pNN"``.
        n_resamples: ``B``; 2000 is ample for a standard error (Efron & Tibshirani 1993 §6.4 find 50–200 enough).
        seed: anything ``numpy.random.default_rng`` accepts; the same seed and data give the same result.
        resample_requests: False resamples repeats only.

    Raises:
        ValueError: fewer than two repeats, unequal repeat counts, empty or non-finite values, or a statistic ≤ 0.
    """
    if len(baseline) != len(candidate):
        raise ValueError(f"paired repeats differ in number: baseline {len(baseline)}, candidate {len(candidate)}")
    repeats = len(baseline)
    if repeats < 2:
        raise ValueError("the block bootstrap needs at least two paired repeats")
    q = _quantile_level(statistic)
    pad_b, n_b = _padded(baseline)
    pad_c, n_c = _padded(candidate)
    point_b, point_c = statistic_of(baseline, statistic), statistic_of(candidate, statistic)
    if point_b <= 0 or point_c <= 0:
        raise ValueError(f"ratios need positive statistics (baseline {point_b}, candidate {point_c})")
    rng = np.random.default_rng(seed)
    per_resample = repeats * max(pad_b.shape[1], pad_c.shape[1])
    chunk = max(1, _CHUNK_ELEMENTS // per_resample)
    logs = []
    for start in range(0, n_resamples, chunk):
        b = min(chunk, n_resamples - start)
        idx = rng.integers(0, repeats, size=(b, repeats))
        stat_b = _resampled_statistic(pad_b, n_b, idx, rng, q, resample_requests)
        stat_c = _resampled_statistic(pad_c, n_c, idx, rng, q, resample_requests)
        logs.append(np.log(stat_c) - np.log(stat_b))
    log_ratios = np.concatenate(logs)
    if not np.isfinite(log_ratios).all():
        raise ValueError("a resampled statistic is not positive; the ratio is undefined")
    se = float(log_ratios.std(ddof=1)) * math.sqrt(repeats / (repeats - 1))
    ordered = np.sort(log_ratios)
    low, high = np.exp(np.interp([0.025, 0.975], np.linspace(0.0, 1.0, ordered.size), ordered))
    return RatioEstimate(baseline=point_b, candidate=point_c, log_ratio=math.log(point_c / point_b), se=se,
                         df=float(repeats - 1), repeats=repeats, percentile_95=(float(low), float(high)),
                         n_resamples=n_resamples)


def is_degenerate(se: float) -> bool:
    """Whether a standard error is zero, near zero (below :data:`DEGENERATE_SE`) or not finite: no test from it."""
    return not math.isfinite(se) or se < DEGENERATE_SE


def noninferiority_pvalues(estimate: float, se: float, df: float, limit: float,
                           higher_is_better: bool, exact: bool = False) -> tuple[float, float]:
    """One-sided p-values against the margin ``limit`` (same scale as ``estimate``: a log ratio or a difference).

    ``p_pass`` tests H0 "the candidate is worse than the margin" (rejecting it shows non-inferiority);
    ``p_fail`` tests H0 "the candidate is within the margin or better" (rejecting it shows a loss beyond the margin).
    With ``g = (estimate − limit)`` for higher-is-better (``limit − estimate`` otherwise) and ``T`` Student's t CDF:
    ``p_pass = 1 − T(g / se)``, ``p_fail = T(g / se)``; so ``p_pass + p_fail = 1``. ``|g|`` within
    :data:`MARGIN_TOLERANCE` counts as exactly on the margin (``g = 0``). A degenerate spread (:func:`is_degenerate`:
    identical values in every repeat) is no evidence either way, ``(1, 1)`` — unless ``exact``: the metric can repeat
    exactly (a count from a deterministic engine), so the common value is the difference itself and the p-values are
    the t-test's limit as ``se → 0``: ``(0, 1)`` when ``g > 0``, ``(1, 0)`` when ``g < 0``, ``(1, 1)`` on the margin.
    """
    good = (estimate - limit) if higher_is_better else (limit - estimate)
    if abs(good) <= MARGIN_TOLERANCE:
        good = 0.0
    if is_degenerate(se):
        if exact and good:
            return (0.0, 1.0) if good > 0 else (1.0, 0.0)
        return 1.0, 1.0
    cdf = float(student_cdf(df, good / se))
    return 1.0 - cdf, cdf


def interval(estimate: float, se: float, df: float, level: float) -> tuple[float, float]:
    """Two-sided interval ``estimate ± t_{1−level, df} · se``, i.e. confidence ``1 − 2·level``.

    Each bound is a one-sided ``1 − level`` bound, so the lower bound clears a margin exactly when the one-sided test
    at ``level`` rejects (:func:`noninferiority_pvalues`).
    """
    if se == 0:
        return estimate, estimate
    half = float(student_quantile(df, 1.0 - level)) * se
    return estimate - half, estimate + half


def holm_adjust(pvalues: Sequence[float]) -> np.ndarray:
    """Holm (1979) step-down adjusted p-values: ``p̃_(k) = max_{j ≤ k} min(1, (m − j + 1) · p_(j))``.

    Holm, S. (1979). "A simple sequentially rejective multiple test procedure". *Scand. J. Statist.* 6(2): 65–70.
    Rejecting every hypothesis with ``p̃ ≤ α`` controls the family-wise error rate at ``α`` under any dependence.
    """
    p = np.asarray(pvalues, dtype=float)
    m = p.size
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def holm_test(pvalues: Sequence[float], alpha: float,
              nominal: Callable[[float], float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down test: which hypotheses it rejects, and the level at which each was tested.

    Sorted ascending, ``p_(k)`` is compared with ``nominal(α / (m − k + 1))`` (``nominal``: the identity, or a
    group-sequential look's nominal level for that overall error, :meth:`harness.judge.sequential.Look.nominal`);
    testing stops at the first ``p_(k)`` above its level, and a level of 0 (no α left) rejects nothing. Returns
    ``(reject, level)``: a rejected hypothesis's level is the one it was rejected at; an unrejected one's is the level
    where testing stopped. An interval at one-sided level ``level`` (:func:`interval`) therefore excludes the margin
    exactly for the rejected hypotheses, so a displayed interval never contradicts its verdict.
    """
    nominal = nominal or (lambda a: a)
    p = np.asarray(pvalues, dtype=float)
    m = p.size
    reject = np.zeros(m, dtype=bool)
    level = np.full(m, nominal(alpha / max(m, 1)))
    order = np.argsort(p, kind="stable")
    stop_level = None
    for rank, i in enumerate(order):
        critical = nominal(alpha / (m - rank))
        if stop_level is None and rejects(p[i], critical):
            reject[i], level[i] = True, critical
        else:
            stop_level = critical if stop_level is None else stop_level
            level[i] = stop_level
    return reject, level


def rejects(p: float | None, level: float) -> bool:
    """Whether a test with p-value ``p`` rejects at ``level``: ``level > 0 and p ≤ level`` (a level of 0 — no α
    left, past a sequential design's last look — rejects nothing, even a p-value that underflowed to 0)."""
    return p is not None and level > 0 and p <= level
