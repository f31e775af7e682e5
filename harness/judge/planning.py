"""The run's design: which arm a session block starts with (:func:`baseline_first`), and how many server sessions a
decision takes — a prospective power calculation on a spread with an upper confidence bound, and the spread recorded
on real sessions that the defaults come from.

Block order. A fixed ABBA order (A B | B A | A B | …) cancels a linear drift of the host's speed, but on a shared
host the drift is not linear: the session recording (``tests/fixtures/recorded/real-sessions``) holds a stretch of
sessions ~25 % slower than those around it (another job's load). A fixed order maps the same positions in time to the
same arm in every run, so such a stretch shifts the paired mean one way: on the recording's first 20 sessions the
A/A false-FAIL rate of resampled runs was 10 % at 4 sessions per arm (60 runs; the t statistic's lower tail held
6.4 %, its upper 0.4 %; on all 36 sessions 3.0 %, 200 runs).
Drawing the order of each block at random (Fisher 1935, *The Design of Experiments*, ch. II) makes every block's
paired difference symmetric about the true effect whatever the load did, so the paired t-test keeps its level
conditional on the host's history (both tails ≈ 2.5 % at the nominal 2.5 %; drift then adds variance, not bias).

The test a session count has to carry is the gate's one-sided non-inferiority t-test on the per-session paired log
ratio (``harness.judge.verdict``). With a per-pair spread ``s``, a true distance ``δ`` from the margin (log scale) and
the test at ``level``, ``n`` pairs reach power ``1 − β`` when ``(t_{1−level, n−1} + t_{1−β, n−1}) · s / √n ≤ δ``
(the Student approximation to the non-central t, Julious 2004, "Sample sizes for clinical trials with Normal data",
Stat. Med. 23:1921, eq. 7). ``s`` is taken at a one-sided upper confidence bound ``s·sqrt(df / χ²_{1−γ, df})`` with
γ = :data:`ADVICE_CONFIDENCE` (80 %; Browne 1995, "On the use of a pilot sample for sample size determination",
Stat. Med. 14:1933), so a count planned on a noisy spread estimate seldom comes out short.

Pure: numbers in, numbers out (scipy for the t and χ² quantiles).
"""

from __future__ import annotations

import math

__all__ = ["baseline_first", "RECORDED_PAIR_SD", "RECORDED_PAIR_DF", "RECORDED_SOURCE", "spread_upper_bound", "sessions_for_power",
           "recommended_sessions", "pass_probability", "joint_pass_probability", "sessions_for_joint_power",
           "ADVICE_CONFIDENCE", "MAX_ADVISED_SESSIONS"]

ADVICE_CONFIDENCE = 0.80
"""Confidence of the spread's upper bound the advice plans on: a 95 % bound on the 2–3 df of a small run inflated
the sessions asked for 8–20× (issue #24: from 4 sessions at a true sd of 0.02 the advice had median 27 sessions where
6 suffice); 80 % keeps a planned count from coming out short in most runs without that inflation."""
MAX_ADVISED_SESSIONS = 1000
"""The advice's cap: beyond it the reason says so instead of naming a count."""

RECORDED_PAIR_SD = 0.1634
"""sd of the per-block paired log ratio of output throughput (session means, levels pooled as the gate's pooled
hypothesis does) on the A/A session recording :data:`RECORDED_SOURCE`: the noise one paired session block carries on
the 2-core CPU machine, 36 sessions of 4 rounds at c = 1 and 4 under a host load average of 2.8–37 (median 9.7),
recorded 2026-12-01 13:44–14:50 UTC (``python -m harness.study.session_simulation --recording …`` prints it)."""
RECORDED_PAIR_DF = 17
"""Degrees of freedom of :data:`RECORDED_PAIR_SD` (blocks − 1)."""
RECORDED_SOURCE = "tests/fixtures/recorded/real-sessions"


def baseline_first(seed: int, block: int, order: str = "random") -> bool:
    """Whether session block ``block`` runs the baseline arm first. ``order`` "random": a fair coin drawn from
    ``random.Random(f"{seed}:block:{block}")`` (the same on every machine and on resume); "abba": even blocks
    baseline first, odd blocks candidate first."""
    if order == "abba":
        return block % 2 == 0
    import random

    return random.Random(f"{seed}:block:{block}").random() < 0.5


def _t(df: float, p: float) -> float:
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


def spread_upper_bound(sd: float, df: int, confidence: float = 0.95) -> float:
    """One-sided ``confidence`` upper bound of a standard deviation estimated on ``df`` degrees of freedom
    (chi-square; Browne 1995). Raises ValueError for ``df < 1``."""
    from scipy.stats import chi2

    if df < 1:
        raise ValueError(f"a spread on {df} degrees of freedom has no upper bound")
    return float(sd * math.sqrt(df / chi2.ppf(1.0 - confidence, df)))


def sessions_for_power(spread: float, distance: float, level: float, power: float = 0.90, *,
                       max_sessions: int = 10_000) -> int | None:
    """Smallest session pairs ``n ≥ 2`` at which the one-sided t-test at ``level`` has ``power`` against a true
    log-scale ``distance`` from the margin, at per-pair spread ``spread`` (Julious 2004 eq. 7). None when even
    ``max_sessions`` would not do (``distance ≤ 0``, or an infinite spread)."""
    if distance <= 0 or not math.isfinite(spread):
        return None
    if spread <= 0:
        return 2
    for n in range(2, max_sessions + 1):
        if (_t(n - 1, 1.0 - level) + _t(n - 1, power)) * spread / math.sqrt(n) <= distance:
            return n
    return None


def pass_probability(spread: float, distance: float, level: float, n: int) -> float:
    """P(one cell PASSes) at ``n`` session pairs for a candidate ``distance`` (log scale) inside the margin: the
    one-sided t-test at ``level`` on per-pair spread ``spread``, ``T_{n−1}(δ √n / s − t_{1−level, n−1})`` (the shifted
    central t approximating the non-central one, Julious 2004 eq. 7). 0 for ``n < 2`` or ``level ≤ 0``."""
    from scipy.special import stdtr

    if n < 2 or level <= 0 or distance <= 0:
        return 0.0
    if spread <= 0:
        return 1.0
    return float(stdtr(n - 1, distance * math.sqrt(n) / spread - _t(n - 1, 1.0 - level)))


def joint_pass_probability(cells, n: int) -> float:
    """P(every cell PASSes) at ``n`` session pairs, ``cells`` = ``[(spread, distance, level)]``: the product of the
    cells' :func:`pass_probability` — exact for independent cells, a lower bound for the positively associated cells
    of one run (throughput and TPOT of the same requests; Esary, Proschan & Walkup 1967)."""
    return math.prod(pass_probability(s, d, level, n) for s, d, level in cells)


def sessions_for_joint_power(cells, power: float = 0.90, *, max_sessions: int = MAX_ADVISED_SESSIONS) -> int | None:
    """Smallest ``n ≥ 2`` with :func:`joint_pass_probability` ≥ ``power``; None above ``max_sessions``."""
    for n in range(2, max_sessions + 1):
        if joint_pass_probability(cells, n) >= power:
            return n
    return None


def recommended_sessions(loss: float = 0.10, margin: float = -0.03, level: float = 0.025, power: float = 0.90) -> int:
    """Sessions per arm for ``power`` to FAIL a true throughput ``loss`` (fraction) against ``margin`` at ``level``
    (the default policy's FAIL share α/K for K = 2 gated speed metrics), at the upper bound of the recorded spread
    (:data:`RECORDED_PAIR_SD` on :data:`RECORDED_PAIR_DF`)."""
    distance = math.log1p(margin) - math.log1p(-loss)
    upper = spread_upper_bound(RECORDED_PAIR_SD, RECORDED_PAIR_DF)
    needed = sessions_for_power(upper, distance, level, power)
    assert needed is not None
    return needed
