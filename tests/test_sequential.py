"""The group-sequential design: α-spending increments, the fixed design as its one-look case, looks' α in the
decision, and the look a run's rows are at."""

import math

import numpy as np
import pandas as pd
import pytest

from harness.judge import sequential, verdict
from harness.judge.policy import GatePolicy, Status
from harness.judge.sequential import SequentialDesign
from harness.judge.verdict import CellInput


@pytest.mark.parametrize("spending", sequential.SPENDING)
@pytest.mark.parametrize("looks", [(4, 10), (3, 8), (2, 3)])
def test_look_alphas_are_positive_and_sum_to_alpha(spending, looks):
    design = SequentialDesign(0.05, *looks, spending=spending)
    per_look = [design.look_alpha(m) for m in design.looks]
    assert all(a > 0 for a in per_look)
    assert math.isclose(sum(per_look), 0.05, rel_tol=1e-12)
    cumulative = [design.cumulative(m) for m in design.looks]
    assert cumulative == sorted(cumulative) and cumulative[-1] == 0.05


def test_no_alpha_outside_the_looks():
    design = SequentialDesign(0.05, 4, 10)
    assert design.look_alpha(3) == 0.0 and design.look_alpha(11) == 0.0 and design.cumulative(3) == 0.0


def test_fixed_design_is_the_one_look_case():
    design = SequentialDesign(0.05, 4, 4)
    assert design.fixed and design.looks == (4,) and design.look_alpha(4) == 0.05


def test_pocock_spends_earlier_than_obrien_fleming():
    pocock, obf = SequentialDesign(0.05, 4, 10, "pocock"), SequentialDesign(0.05, 4, 10, "obrien-fleming")
    assert pocock.look_alpha(4) > 10 * obf.look_alpha(4)
    assert pocock.look_alpha(10) < obf.look_alpha(10)


def test_lan_demets_formulas_at_half_information():
    # Lan & DeMets (1983): α·ln(1 + (e−1)t) and 2 − 2Φ(z_{1−α/2}/√t); at t = 1/2, α = 0.05: 0.0310 and 0.0056.
    assert math.isclose(SequentialDesign(0.05, 1, 2, "pocock").cumulative(1), 0.05 * math.log(1 + (math.e - 1) / 2))
    assert math.isclose(SequentialDesign(0.05, 1, 2, "obrien-fleming").cumulative(1), 0.005574, abs_tol=2e-6)


@pytest.mark.parametrize("bad", [dict(min_sessions=5, max_sessions=4), dict(min_sessions=0, max_sessions=4),
                                 dict(alpha=0.7, min_sessions=2, max_sessions=4)])
def test_bad_designs_are_refused(bad):
    with pytest.raises(ValueError):
        SequentialDesign(**{"alpha": 0.05, **bad})


def test_policy_refuses_max_below_min_sessions():
    with pytest.raises(ValueError, match="max_sessions"):
        GatePolicy(min_sessions=4, max_sessions=3)


def _cell(metric, base, cand):
    return CellInput(metric, 1, tuple(np.array([v], dtype=float) for v in base),
                     tuple(np.array([v], dtype=float) for v in cand), tuple(range(len(base))))


def test_a_look_tests_session_cells_at_its_own_alpha():
    # −1 % ± a little over 4 sessions: non-inferior at α = 0.05, not at a look's α ten times below its p value.
    cell = _cell("output_throughput", [100.0, 101.0, 99.0, 100.5], [99.2, 99.8, 98.1, 99.4])
    policy = GatePolicy(primary=("output_throughput",), min_sessions=4)
    fixed = verdict.decide([cell], policy)[0]
    assert fixed.status == Status.PASS and fixed.p_pass < 0.05
    early = verdict.decide([cell], policy, session_alpha=fixed.p_pass / 10)[0]
    assert early.status == Status.INCONCLUSIVE


def test_accuracy_keeps_the_full_alpha_at_every_look():
    rng = np.random.default_rng(0)
    base = (rng.random(400) < 0.6).astype(float)
    cand = base.copy()
    cand[:100] = 0.0                                       # −15 points: a certain accuracy FAIL
    cell = CellInput("gsm8k_accuracy", None, correct=(base, cand))
    policy = GatePolicy(primary=("gsm8k_accuracy",))
    assert verdict.decide([cell], policy, session_alpha=1e-12)[0].status == Status.FAIL


def _levels(sessions_per_arm):
    rows = [{"arm": arm, "session": s, "concurrency": 1} for arm, n in sessions_per_arm.items() for s in range(n)]
    return pd.DataFrame(rows)


def test_the_look_counts_the_smaller_arms_sessions():
    policy = GatePolicy(min_sessions=3, max_sessions=6)
    look = sequential.look_of(policy, _levels({"baseline": 5, "candidate": 4}))
    assert look.sessions == 4 and look.alpha == SequentialDesign(0.05, 3, 6).look_alpha(4) and not look.last
    assert "look at 4" in look.describe()
    assert sequential.look_of(GatePolicy(), _levels({"baseline": 5, "candidate": 5})) is None
    assert sequential.paired_sessions(pd.DataFrame({"arm": ["baseline"], "concurrency": [1]})) == 0


def test_a_look_past_the_design_says_no_alpha_is_left():
    from harness.judge.sequential import Look, SequentialDesign

    look = Look(SequentialDesign(0.05, 3, 5), sessions=7)
    assert look.alpha == 0.0 and "past the design's last look (5)" in look.describe()
    assert "past" not in Look(SequentialDesign(0.05, 3, 5), sessions=5).describe()
