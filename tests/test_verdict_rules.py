"""The verdict's decision rules on hand-made cells: margin tolerance, degenerate spread, intersection–union PASS,
Holm over {pooled hypothesis, levels} for FAIL, and ``min_sessions``."""

import numpy as np
import pandas as pd
import pytest

from harness.judge import verdict
from harness.judge.cells import build_cells
from harness.judge.policy import GatePolicy, Status
from harness.judge.validity import check_validity
from harness.judge.verdict import CellInput
from harness.rundir.schema import REQUEST_COLUMNS, Manifest, Regime

SHORT = Regime("random", 64, 32)
LONG = Regime("random", 8192, 64)

TPUT = GatePolicy(primary=("output_throughput",), min_sessions=2)
MTP = GatePolicy(primary=("acceptance_length",), min_sessions=2)


def _cell(metric, level, base, cand):
    """A cell at concurrency ``level`` of one regime."""
    return CellInput(metric, SHORT.at(level), tuple(np.array([v], dtype=float) for v in base),
                     tuple(np.array([v], dtype=float) for v in cand), tuple(range(len(base))))


@pytest.mark.parametrize("policy, metric, base, cand", [
    (TPUT, "output_throughput", [100.0, 100.0], [97.0, 97.0]),         # exactly −3 %
    (MTP, "acceptance_length", [2.0, 2.0], [1.96, 1.96]),               # exactly −2 %
])
def test_exactly_on_the_margin_with_zero_spread_is_not_a_verdict(policy, metric, base, cand):
    result = verdict.decide([_cell(metric, 1, base, cand)], policy)[0]
    assert result.status == Status.INCONCLUSIVE
    assert result.p_fail == 1.0 and result.p_pass == 1.0
    assert any("zero spread" in note or "identical in every session" in note for note in result.notes)


def test_identical_repeats_are_degenerate_never_a_certain_pass_or_fail():
    clear_pass = _cell("output_throughput", 1, [100.0, 100.0], [100.0, 100.0])
    clear_fail = _cell("output_throughput", 2, [100.0, 100.0], [80.0, 80.0])
    *results, pooled = verdict.decide([clear_pass, clear_fail], TPUT)
    assert [r.status for r in results] == [Status.INCONCLUSIVE, Status.INCONCLUSIVE] and pooled.status is None
    assert all("degenerate" in r.note() or any("degenerate" in n for n in r.notes) for r in results)


def test_a_zero_spread_cell_says_so_not_that_it_sits_near_the_margin():
    """A copied timing (3 sessions, the candidate's throughput identical to the baseline's in every one) read "the
    estimate sits near the margin: 3 sessions would already pass an unchanged candidate" — sessions advice for a
    cell that is undecided because its spread is zero."""
    result = verdict.decide([_cell("output_throughput", 1, [236.0, 237.0, 238.0], [236.0, 237.0, 238.0])], TPUT)[0]
    assert result.status == Status.INCONCLUSIVE and result.note().startswith("zero spread")


@pytest.mark.parametrize("cand, status", [
    ([2.36, 2.37, 2.38], Status.PASS),                          # the served MTP A/A of 2026-12-05, uni executor
    ([2.36 * 0.95, 2.37 * 0.95, 2.38 * 0.95], Status.FAIL),     # −5 % in every session: beyond the −2 % margin
    ([2.36 * 0.99, 2.37 * 0.99, 2.38 * 0.99], Status.PASS),     # −1 %: within it
])
def test_an_mtp_count_identical_in_every_session_is_decided_exactly(cand, status):
    """Acceptance counts repeat exactly when the engine is deterministic: the common paired difference is the
    difference, decided against the margin (a timing with zero spread stays degenerate, above)."""
    result = verdict.decide([_cell("acceptance_length", 1, [2.36, 2.37, 2.38], cand)], MTP)[0]
    assert result.status == status and not result.degenerate
    assert any(note.startswith("identical in every session") for note in result.notes)


def _noisy(metric, level, ratio, wiggle, units=3):
    """``units`` paired units with baseline ≈ 100 and candidate ``ratio`` × baseline × exp(±wiggle)."""
    base = 100 * np.exp(np.linspace(-0.01, 0.01, units))
    cand = ratio * base * np.exp(wiggle * np.resize([1.0, -1.0, 0.5], units))
    return _cell(metric, level, base, cand)


def test_pass_is_intersection_union_each_cell_at_alpha():
    """Eight cells each passing at α but not at α/8 (Holm's first level): PASS without adjustment (Berger 1982)."""
    cells = [_noisy("output_throughput", c, 1.0, 0.011) for c in (1, 2, 4, 8)]
    cells += [_noisy("mean_tpot_ms", c, 1.0, 0.011) for c in (1, 2, 4, 8)]
    policy = GatePolicy(primary=("output_throughput", "mean_tpot_ms"), min_sessions=2)
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
    policy = GatePolicy(primary=("output_throughput",), min_sessions=2)
    *per_level, pooled = verdict.decide(cells, policy)
    assert pooled.pooled and pooled.status == Status.FAIL and pooled.p_fail <= 0.05
    assert all(r.p_fail > 0.05 for r in per_level)
    assert verdict.overall(per_level + [pooled])[0] == Status.FAIL
    assert "Holm" in policy.describe() and "intersection–union" in policy.describe()


def test_each_regime_has_its_own_pooled_hypothesis_so_a_long_context_loss_is_not_averaged_away():
    """Issue #26: a 6 % loss at every long-context level that no level shows alone FAILs the long regime's pooled
    hypothesis (Holm over {both pooled hypotheses, every level}); one pool over both regimes' levels would sit at the
    −3 % margin (the clean short levels halve it) and reject nothing."""
    patterns = ([1, -1, 0], [-1, 0, 1], [0, 1, -1], [1, 0, -1])
    long_cells = [CellInput("output_throughput", LONG.at(c),
                            *_values([100.0] * 3, 94.0 * np.exp(0.02 * np.array(p, dtype=float))))
                  for c, p in zip((1, 2, 4, 8), patterns)]
    short_cells = [_cell("output_throughput", c, [100.0] * 3, [100.2, 99.9, 100.1]) for c in (1, 2, 4, 8)]
    policy = GatePolicy(primary=("output_throughput",), min_sessions=2)
    results = verdict.decide(short_cells + long_cells, policy)
    pooled = {r.regime: r for r in results if r.pooled}
    assert set(pooled) == {SHORT, LONG} and pooled[LONG].status == Status.FAIL and pooled[SHORT].status is None
    assert pooled[LONG].where == "all levels of 8192→64 random (pooled)"
    assert not [r for r in results if not r.pooled and r.status == Status.FAIL]
    assert verdict.overall(results)[0] == Status.FAIL
    one_pool = verdict._pooled("output_throughput", SHORT, short_cells + long_cells, policy)[0]
    assert one_pool.delta == pytest.approx(-3.0, abs=0.05) and one_pool.p_fail > 0.4


def _values(base, cand):
    return (tuple(np.array([v], dtype=float) for v in base), tuple(np.array([v], dtype=float) for v in cand),
            tuple(range(len(base))))


def test_a_loss_at_one_level_fails_that_level_though_the_pooled_mean_is_within_the_margin():
    """One level far beyond the margin, three clearly fine: the pooled mean is within it, yet Holm over {pooled,
    levels} FAILs the lost level (issue #24: the fixed sequence, pooled first, left it INCONCLUSIVE)."""
    cells = [_noisy("output_throughput", 1, 0.90, 0.002)] + [
        _noisy("output_throughput", c, 1.05, 0.002) for c in (2, 4, 8)]
    *per_level, pooled = verdict.decide(cells, TPUT)
    assert pooled.status is None and pooled.p_fail > 0.05
    assert per_level[0].p_fail < 0.05 / 5 and per_level[0].status == Status.FAIL
    assert per_level[0].p_fail_holm == pytest.approx(min(1.0, 5 * per_level[0].p_fail))
    assert [r.status for r in per_level[1:]] == [Status.PASS] * 3
    assert verdict.overall(per_level + [pooled])[0] == Status.FAIL


def test_holm_family_holds_the_pooled_hypothesis_and_every_level():
    """A level whose p_fail lies between α/5 and α (5 = 4 levels + pooled) is not FAILed alone: Holm's first step
    is α/5, so FWER ≤ α under any dependence between the levels."""
    cells = [_noisy("output_throughput", 1, 0.95, 0.01)] + [
        _noisy("output_throughput", c, 1.05, 0.002) for c in (2, 4, 8)]
    *per_level, pooled = verdict.decide(cells, TPUT)
    assert 0.05 / 5 < per_level[0].p_fail <= 0.05 and per_level[0].status == Status.INCONCLUSIVE


# ------------------------------------------------------------------------------------------------- min_sessions


def test_fewer_sessions_than_min_sessions_is_inconclusive():
    """Three clean sessions with a clear 10 % loss: below the default min_sessions = 4, no PASS or FAIL."""
    cells = [_noisy("output_throughput", 1, 0.90, 0.002)]
    result = verdict.decide(cells, GatePolicy(primary=("output_throughput",)))[0]
    assert GatePolicy().min_sessions == 4
    assert result.status == Status.INCONCLUSIVE and "needs ≥ 4" in result.note()
    assert verdict.decide(cells, TPUT)[0].status == Status.FAIL


def test_min_repeats_is_read_as_min_sessions_with_a_warning():
    with pytest.warns(DeprecationWarning, match="min_sessions"):
        assert GatePolicy.model_validate({"min_repeats": 3}).min_sessions == 3
    with pytest.raises(ValueError, match="renamed min_sessions"):
        GatePolicy.model_validate({"min_repeats": 3, "min_sessions": 4})


def _levels_frame(sessions_of_round):
    """levels.csv of both arms at c=1: round r in session ``sessions_of_round[r]``; candidate 10 % slower, noisy."""
    rows = []
    for arm, factor in (("baseline", 1.0), ("candidate", 0.9)):
        for r, session in enumerate(sessions_of_round):
            value = 100.0 * factor * (1 + 0.01 * ((r * 7 + (arm == "candidate")) % 3 - 1))
            rows.append({"arm": arm, "session": session, "round": r, "concurrency": 1, "completed": 8, "failed": 0,
                         "output_throughput": value})
    return pd.DataFrame(rows)


def _cell_from(levels_frame):
    manifest = Manifest.model_validate({"run_id": "t", "status": "done", "scenario": {"workload": {}},
                                        "arms": [{"name": "baseline", "route": "baseline"},
                                                 {"name": "candidate", "route": "candidate"}]})
    policy = GatePolicy(primary=("output_throughput",), require_attestation=False)
    report = check_validity(manifest, levels_frame, pd.DataFrame(columns=REQUEST_COLUMNS), policy)
    (cell,) = build_cells(manifest, levels_frame, pd.DataFrame(columns=REQUEST_COLUMNS), None, policy, report,
                          diagnostics=False)
    return cell, policy


def test_rounds_inside_one_session_are_not_independent():
    cell, policy = _cell_from(_levels_frame([0] * 6))
    assert cell.one_session and cell.repeats == (0,)
    result = verdict.decide([cell], policy)[0]
    assert result.status == Status.INCONCLUSIVE and "not independent" in result.note()


def test_rounds_are_aggregated_within_each_session_before_the_test():
    cell, policy = _cell_from(_levels_frame([0, 0, 1, 1, 2, 2, 3, 3]))
    assert not cell.one_session and cell.repeats == (0, 1, 2, 3)
    assert [v.size for v in cell.baseline] == [1, 1, 1, 1]
    frame = _levels_frame([0, 0, 1, 1, 2, 2, 3, 3])
    first = frame[(frame["arm"] == "baseline") & (frame["session"] == 0)]["output_throughput"].mean()
    assert cell.baseline[0][0] == pytest.approx(first)
    assert verdict.decide([cell], policy)[0].status == Status.FAIL


# ---------------------------------------------------------------------------------------------- coalesced streams


def _requests_frame(sessions_of_round, coalesced_per_round):
    """requests.csv for :func:`_levels_frame`: 8 sequential 1-s requests of 32 tokens per round; in the candidate's
    rounds ``coalesced_per_round`` of them arrive in one burst (TTFT = 99 % of E2EL)."""
    rows = []
    for arm in ("baseline", "candidate"):
        for r, session in enumerate(sessions_of_round):
            for i in range(8):
                burst = arm == "candidate" and i < coalesced_per_round
                ttft = 990.0 if burst else 100.0
                rows.append({"arm": arm, "session": session, "round": r, "concurrency": 1, "index": i,
                             "input_len": 16, "output_len": 32, "ttft_ms": ttft, "tpot_ms": (1000.0 - ttft) / 31,
                             "e2el_ms": 1000.0, "start_s": float(i), "error": ""})
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


@pytest.mark.parametrize("coalesced, invalid", [(2, True), (0, False)])
def test_coalesced_streams_make_the_levels_latency_cells_invalid(coalesced, invalid):
    """2 of 8 requests in one burst (25 % > 3 %): mean TPOT at that level is INVALID, throughput is not."""
    sessions = [0, 1, 2, 3]
    levels_frame, requests = _levels_frame(sessions), _requests_frame(sessions, coalesced)
    manifest = Manifest.model_validate({"run_id": "t", "status": "done", "scenario": {"workload": {}},
                                        "arms": [{"name": "baseline", "route": "baseline"},
                                                 {"name": "candidate", "route": "candidate"}]})
    policy = GatePolicy(primary=("output_throughput", "mean_tpot_ms"), require_attestation=False)
    result = verdict.evaluate(manifest, levels_frame, requests, None, policy, diagnostics=False)
    cells = {c.metric: c for c in result.primary}
    assert (cells["mean_tpot_ms"].status == Status.INVALID) is invalid
    assert cells["output_throughput"].status != Status.INVALID
    if invalid:
        assert "8 of 32 requests arrived as one burst" in cells["mean_tpot_ms"].note()
        assert any(f["check"] == "coalesced_streams" for f in result.validity.failures)
    assert any("steal" in n for n in result.notes)


def test_coalesced_streams_leave_the_server_side_tpot_cell_valid():
    """A burst is the client reading a stream late; the server's TPOT (engine timestamps) is untouched by it."""
    sessions = [0, 1, 2, 3]
    levels_frame = _levels_frame(sessions).assign(server_mean_tpot_ms=lambda f: 1000.0 / f["output_throughput"])
    requests = _requests_frame(sessions, 2)
    manifest = Manifest.model_validate({"run_id": "t", "status": "done", "scenario": {"workload": {}},
                                        "arms": [{"name": "baseline", "route": "baseline"},
                                                 {"name": "candidate", "route": "candidate"}]})
    policy = GatePolicy(primary=("output_throughput", "mean_tpot_ms", "server_mean_tpot_ms"),
                        require_attestation=False)
    cells = {c.metric: c for c in verdict.evaluate(manifest, levels_frame, requests, None, policy,
                                                   diagnostics=False).primary}
    assert cells["mean_tpot_ms"].status == Status.INVALID
    assert cells["server_mean_tpot_ms"].status not in (Status.INVALID, None)


def test_roles_come_from_arm_names_not_routes():
    """An A/A recording (both arms on route "candidate", as `allow_identical_arms` runs and main-vs-PR builds are)
    must compare the candidate arm's rows with the baseline's, not the baseline with itself."""
    from pathlib import Path

    from harness.judge.validity import arm_names
    from harness.rundir.store import RunDir

    run = RunDir(Path(__file__).parent / "fixtures" / "recorded" / "real-cpu")
    manifest = run.manifest()
    assert {arm.route for arm in manifest.arms} == {"candidate"}
    assert arm_names(manifest) == {"baseline": "baseline", "candidate": "candidate"}
    swapped = manifest.model_copy(update={"arms": [arm.model_copy(update={"name": other})
                                                   for arm, other in zip(manifest.arms, ("b", "a"))]})
    assert arm_names(swapped) == {"baseline": "b", "candidate": "a"}
