"""Prospective session counts (harness.judge.planning): the power condition at the returned count and not one
before, the chi-square upper bound on a spread, and defaults derived from the recorded session spread."""

import math
from pathlib import Path

import pytest
from scipy import stats as sps

from harness.judge import planning
from harness.study import session_simulation as sim
from harness.judge.policy import RECOMMENDED_REPEATS
from harness.rundir.store import RunDir


def _half_widths(n, spread, level, power):
    return (sps.t.ppf(1 - level, n - 1) + sps.t.ppf(power, n - 1)) * spread / math.sqrt(n)


def test_sessions_for_power_is_the_first_count_meeting_the_power_condition():
    spread, distance, level = 0.12, 0.0749, 0.025
    n = planning.sessions_for_power(spread, distance, level, 0.9)
    assert _half_widths(n, spread, level, 0.9) <= distance < _half_widths(n - 1, spread, level, 0.9)
    assert planning.sessions_for_power(spread / 2, distance, level, 0.9) < n
    assert planning.sessions_for_power(spread, 0.0, level) is None
    assert planning.sessions_for_power(10.0, 1e-4, level, max_sessions=50) is None


def test_power_condition_matches_simulated_t_tests():
    """At the returned count a one-sided t-test on normal pairs rejects in ≈ 90 % of draws (Monte Carlo)."""
    import numpy as np

    spread, distance, level = 0.1, 0.08, 0.025
    n = planning.sessions_for_power(spread, distance, level, 0.9)
    rng = np.random.default_rng(0)
    d = rng.normal(distance, spread, size=(20_000, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    assert 0.88 <= float((t > sps.t.ppf(1 - level, n - 1)).mean()) <= 0.95


def test_spread_upper_bound_is_the_chi_square_bound():
    assert planning.spread_upper_bound(0.1, 9) == pytest.approx(0.1 * math.sqrt(9 / sps.chi2.ppf(0.05, 9)))
    assert planning.spread_upper_bound(0.1, 200) < planning.spread_upper_bound(0.1, 9)
    with pytest.raises(ValueError, match="no upper bound"):
        planning.spread_upper_bound(0.1, 0)


def test_recorded_spread_and_recommended_sessions_come_from_the_session_recording():
    store = RunDir(Path(__file__).parent / "fixtures" / "recorded" / "real-sessions")
    pool = sim.session_pool(store.manifest(), store.levels(numeric=True), store.requests(numeric=True))
    sd, df = sim.pooled_pair_spread(pool)
    assert (planning.RECORDED_PAIR_SD, planning.RECORDED_PAIR_DF) == (pytest.approx(sd, abs=5e-4), df)
    assert RECOMMENDED_REPEATS == planning.recommended_sessions()
