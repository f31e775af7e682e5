"""The group-sequential design: α-spending increments, the nominal levels from the joint law of the looks' t
statistics, the fixed design as its one-look case, looks' levels in the decision, and the look a run's rows are at."""

import math

import numpy as np
import pandas as pd
import pytest

from harness.judge import sequential, verdict
from harness.judge.policy import GatePolicy, Status
from harness.judge.sequential import SequentialDesign
from harness.judge.verdict import CellInput
from harness.rundir.schema import Regime


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


def _overall_error(design, alpha, sims=40_000, seed=7):
    """P(some look rejects) of one cell's nested paired t-tests at the design's nominal levels, on fresh normal
    draws (a seed :func:`sequential.boundaries` does not use) — and of the union bound's increments."""
    from scipy.special import stdtr

    d = np.random.default_rng(seed).standard_normal((sims, design.max_sessions))
    any_nominal = np.zeros(sims, bool)
    any_union = np.zeros(sims, bool)
    for m in design.looks:
        x = d[:, :m]
        p = 1 - stdtr(m - 1, x.mean(1) / (x.std(1, ddof=1) / np.sqrt(m)))
        any_nominal |= p <= design.nominal(m, alpha)
        any_union |= p <= design.look_alpha(m) * alpha / design.alpha
    return any_nominal.mean(), any_union.mean()


@pytest.mark.parametrize("looks, alpha", [((4, 8), 0.05), ((3, 6), 0.05), ((3, 6), 0.0125)])
def test_nominal_levels_spend_exactly_alpha_over_the_looks(looks, alpha):
    """Boundaries from the joint law of the nested t statistics: the overall error is α (not the union bound's
    3.4 % at 4–8; issue #24), on draws independent of the ones that set them."""
    design = SequentialDesign(0.05, *looks)
    nominal, union = _overall_error(design, alpha)
    se = math.sqrt(alpha * (1 - alpha) / 40_000)
    assert abs(nominal - alpha) < 4 * se and union < alpha - 4 * se
    levels = [design.nominal(m, alpha) for m in design.looks]
    assert all(n >= design.look_alpha(m) * alpha / 0.05 for n, m in zip(levels, design.looks))


def test_the_4_to_8_boundaries_are_the_issues_lan_demets_ones():
    # issue #24 item 3 (its own simulation): Lan–DeMets Pocock spending 0.0308, 0.0193, 0.0162, 0.0157, 0.0157.
    design = SequentialDesign(0.05, 4, 8)
    assert [design.nominal(m) for m in design.looks] == pytest.approx([0.0308, 0.0193, 0.0162, 0.0157, 0.0157],
                                                                      abs=0.0012)
    assert design.nominal(9) == 0.0 and SequentialDesign(0.05, 6, 6).nominal(6) == 0.05


@pytest.mark.parametrize("bad", [dict(min_sessions=5, max_sessions=4), dict(min_sessions=0, max_sessions=4),
                                 dict(alpha=0.7, min_sessions=2, max_sessions=4)])
def test_bad_designs_are_refused(bad):
    with pytest.raises(ValueError):
        SequentialDesign(**{"alpha": 0.05, **bad})


def test_policy_refuses_max_below_min_sessions():
    with pytest.raises(ValueError, match="max_sessions"):
        GatePolicy(min_sessions=4, max_sessions=3)


def _cell(metric, base, cand):
    return CellInput(metric, Regime("random", 64, 32).at(1), tuple(np.array([v], dtype=float) for v in base),
                     tuple(np.array([v], dtype=float) for v in cand), tuple(range(len(base))))


def test_a_look_tests_session_cells_at_its_own_nominal_level():
    # −2 % ± 0.9 % over 4 sessions: non-inferior at α = 0.05, not at the first look of 4–8 (nominal 0.031).
    cell = _cell("output_throughput", [100.0, 101.0, 99.0, 100.5], [98.91, 98.11, 97.48, 98.07])
    policy = GatePolicy(primary=("output_throughput",), min_sessions=4)
    fixed = verdict.decide([cell], policy)[0]
    first = sequential.Look(SequentialDesign(0.05, 4, 8), 4)
    assert fixed.status == Status.PASS and first.alpha < fixed.p_pass < 0.05
    assert verdict.decide([cell], policy, look=first)[0].status == Status.INCONCLUSIVE


def test_past_the_last_look_nothing_passes_even_a_p_value_of_zero():
    # issue #24 item 7: relative noise 1e-5 made p_pass underflow to 0.0, and 0.0 <= 0 passed.
    cell = _cell("acceptance_length", [2.0 * (1 + 1e-5 * k) for k in range(7)], [2.2] * 7)
    policy = GatePolicy(primary=("acceptance_length",), min_sessions=4)
    past = sequential.Look(SequentialDesign(0.05, 4, 6), 7)
    result = verdict.decide([cell], policy, look=past)[0]
    assert result.p_pass == 0.0 and result.status == Status.INCONCLUSIVE


def test_accuracy_keeps_the_full_alpha_at_every_look():
    rng = np.random.default_rng(0)
    base = (rng.random(400) < 0.6).astype(float)
    cand = base.copy()
    cand[:100] = 0.0                                       # −15 points: a certain accuracy FAIL
    cell = CellInput("gsm8k_accuracy", None, correct=(base, cand))
    policy = GatePolicy(primary=("gsm8k_accuracy",))
    past = sequential.Look(SequentialDesign(0.05, 4, 6), 7)
    assert verdict.decide([cell], policy, look=past)[0].status == Status.FAIL


def _levels(sessions_per_arm):
    rows = [{"arm": arm, "session": s, "concurrency": 1} for arm, n in sessions_per_arm.items() for s in range(n)]
    return pd.DataFrame(rows)


def test_the_look_counts_the_smaller_arms_sessions():
    policy = GatePolicy(min_sessions=3, max_sessions=6)
    look = sequential.look_of(policy, _levels({"baseline": 5, "candidate": 4}))
    assert look.sessions == 4 and look.alpha == SequentialDesign(0.05, 3, 6).nominal(4) and not look.last
    assert "look at 4" in look.describe()
    assert sequential.look_of(GatePolicy(), _levels({"baseline": 5, "candidate": 5})) is None
    assert sequential.paired_sessions(pd.DataFrame({"arm": ["baseline"], "concurrency": [1]})) == 0


def test_a_look_past_the_design_says_no_alpha_is_left():
    from harness.judge.sequential import Look, SequentialDesign

    look = Look(SequentialDesign(0.05, 3, 5), sessions=7)
    assert look.alpha == 0.0 and "past the design's last look (5)" in look.describe()
    assert "past" not in Look(SequentialDesign(0.05, 3, 5), sessions=5).describe()
