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
    results = verdict.decide([clear_pass, clear_fail], TPUT)
    assert [r.status for r in results] == [Status.INCONCLUSIVE, Status.INCONCLUSIVE]
    assert all("degenerate" in r.note() or any("degenerate" in n for n in r.notes) for r in results)
