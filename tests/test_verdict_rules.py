"""The verdict's decision rules on hand-made cells: margin tolerance, degenerate spread, intersection–union PASS,
the fixed-sequence FAIL hierarchy (pooled hypothesis first, then Holm over the levels), and ``min_sessions``."""

import numpy as np
import pytest

from harness.judge import verdict
from harness.judge.policy import GatePolicy, Status
from harness.judge.verdict import CellInput

TPUT = GatePolicy(primary=("output_throughput",))
MTP = GatePolicy(primary=("acceptance_length",))


def _cell(metric, level, base, cand):
    return CellInput(metric, level, tuple(np.array([v], dtype=float) for v in base),
                     tuple(np.array([v], dtype=float) for v in cand), tuple(range(len(base))))


@pytest.mark.parametrize("policy, metric, base, cand", [
    (TPUT, "output_throughput", [100.0, 100.0], [97.0, 97.0]),         # exactly −3 %
    (MTP, "acceptance_length", [2.0, 2.0], [1.96, 1.96]),               # exactly −2 %
])
def test_exactly_on_the_margin_with_zero_spread_is_not_a_verdict(policy, metric, base, cand):
    result = verdict.decide([_cell(metric, 1, base, cand)], policy)[0]
    assert result.status == Status.INCONCLUSIVE
    assert result.p_fail == 1.0 and result.p_pass == 1.0
    assert any("zero spread" in note for note in result.notes)


def test_identical_repeats_are_degenerate_never_a_certain_pass_or_fail():
    clear_pass = _cell("output_throughput", 1, [100.0, 100.0], [100.0, 100.0])
    clear_fail = _cell("output_throughput", 2, [100.0, 100.0], [80.0, 80.0])
    *results, pooled = verdict.decide([clear_pass, clear_fail], TPUT)
    assert [r.status for r in results] == [Status.INCONCLUSIVE, Status.INCONCLUSIVE] and pooled.status is None
    assert all("degenerate" in r.note() or any("degenerate" in n for n in r.notes) for r in results)


def _noisy(metric, level, ratio, wiggle, units=3):
    """``units`` paired units with baseline ≈ 100 and candidate ``ratio`` × baseline × exp(±wiggle)."""
    base = 100 * np.exp(np.linspace(-0.01, 0.01, units))
    cand = ratio * base * np.exp(wiggle * np.resize([1.0, -1.0, 0.5], units))
    return _cell(metric, level, base, cand)


def test_pass_is_intersection_union_each_cell_at_alpha():
    """Eight cells each passing at α but not at α/8 (Holm's first level): PASS without adjustment (Berger 1982)."""
    cells = [_noisy("output_throughput", c, 1.0, 0.011) for c in (1, 2, 4, 8)]
    cells += [_noisy("mean_tpot_ms", c, 1.0, 0.011) for c in (1, 2, 4, 8)]
    policy = GatePolicy(primary=("output_throughput", "mean_tpot_ms"))
    results = verdict.decide(cells, policy)
    per_cell = [r for r in results if not r.pooled]
    assert all(0.05 / 8 < r.p_pass <= 0.05 for r in per_cell)
    assert [r.status for r in per_cell] == [Status.PASS] * 8
    assert verdict.overall(results)[0] == Status.PASS


def test_pooled_hypothesis_fails_a_consistent_loss_no_single_level_shows():
    """A 9 % loss at every level, 3 units, per-level noise that averages out over the levels: no level FAILs alone
    (t ≈ 1.8 on 2 df), the pooled mean does (t ≈ 7), so the run FAILs."""
    patterns = ([1, -1, 0], [-1, 0, 1], [0, 1, -1], [1, 0, -1])
    cells = [_cell("output_throughput", level, [100.0] * 3, 91.0 * np.exp(0.06 * np.array(pattern, dtype=float)))
             for level, pattern in zip((1, 2, 4, 8), patterns)]
    policy = GatePolicy(primary=("output_throughput",))
    *per_level, pooled = verdict.decide(cells, policy)
    assert pooled.pooled and pooled.status == Status.FAIL and pooled.p_fail <= 0.05
    assert all(r.p_fail > 0.05 for r in per_level)
    assert verdict.overall(per_level + [pooled])[0] == Status.FAIL
    assert "Holm" in policy.describe() and "intersection–union" in policy.describe()


def test_levels_are_not_failed_when_the_pooled_hypothesis_does_not_reject():
    """One level far beyond the margin, three clearly fine: the pooled mean is within it, so no level FAILs."""
    cells = [_noisy("output_throughput", 1, 0.90, 0.002)] + [
        _noisy("output_throughput", c, 1.05, 0.002) for c in (2, 4, 8)]
    *per_level, pooled = verdict.decide(cells, TPUT)
    assert pooled.status is None
    assert per_level[0].p_fail < 0.001 and per_level[0].status == Status.INCONCLUSIVE
    assert [r.status for r in per_level[1:]] == [Status.PASS] * 3
