"""harness.judge.stalls: stalled rounds flagged by a fixed rule, the [gate] estimator, the verdict's record."""

import numpy as np
import pandas as pd
import pytest

from harness.gate import PolicyError, load_policy
from harness.judge import calibration, stalls, verdict
from harness.judge.cells import build_cells
from harness.judge.policy import GatePolicy, Status
from harness.judge.validity import check_validity
from harness.rundir.schema import REQUEST_COLUMNS, Level, Manifest
from harness.run.scenario import ScenarioError, load_scenario

SESSIONS, ROUNDS = 6, 4
C1 = Level("random", 64, 32, 1)
STALLED = ("baseline", C1, 9)         # session 2, its second round: a third of the throughput
STOLEN = ("candidate", C1, 14)        # session 3: 25 % of the host's ticks stolen
FAST = ("candidate", C1, 5)           # session 1: a fast outlier (439 vs ≈ 300 tok/s, as recorded on this machine)


def _manifest():
    return Manifest.model_validate({"run_id": "t", "status": "done", "scenario": {"workload": {}},
                                    "arms": [{"name": "baseline", "route": "baseline"},
                                             {"name": "candidate", "route": "candidate"}]})


def _levels(steal=True):
    """levels.csv at c=1: 6 sessions × 4 rounds per arm, ≈ 300 tok/s with a ±1–2 % wiggle, plus the three crafted
    rounds above."""
    rows = []
    for arm in ("baseline", "candidate"):
        for r in range(SESSIONS * ROUNDS):
            value = 300.0 * (1 + 0.01 * ((r * 7 + 3 * (arm == "candidate")) % 5 - 2))
            if (arm, C1, r) == STALLED:
                value = 100.0
            if (arm, C1, r) == FAST:
                value = 439.0
            rows.append({"arm": arm, "session": r // ROUNDS, "round": r,
                         "level": "random-i64-o32-c1", "concurrency": 1, "completed": 8,
                         "failed": 0, "output_throughput": value,
                         "host_steal_fraction": 0.25 if steal and (arm, C1, r) == STOLEN else 0.01})
    return pd.DataFrame(rows)


def _evaluate(levels, estimator):
    policy = GatePolicy(primary=("output_throughput",), require_attestation=False, estimator=estimator)
    return verdict.evaluate(_manifest(), levels, pd.DataFrame(columns=REQUEST_COLUMNS), None, policy,
                            diagnostics=False)


def _cell(levels, estimator, excluded=frozenset()):
    policy = GatePolicy(primary=("output_throughput",), require_attestation=False, estimator=estimator)
    report = check_validity(_manifest(), levels, pd.DataFrame(columns=REQUEST_COLUMNS), policy)
    (cell,) = build_cells(_manifest(), levels, pd.DataFrame(columns=REQUEST_COLUMNS), None, policy, report,
                          diagnostics=False, excluded={key: "stalled" for key in excluded})
    return cell


def test_modified_z_is_iglewicz_hoaglins():
    x = np.array([1.0, 2.0, 3.0, 4.0, 100.0])             # median 3, MAD 1
    assert stalls.modified_z(x) == pytest.approx(0.6745 * (x - 3.0))
    assert not stalls.modified_z(np.array([5.0, 5.0, 5.0, 5.0, 9.0])).any()     # MAD 0: no spread to judge by


def test_a_far_round_and_a_steal_round_are_flagged_and_nothing_else():
    found = stalls.find_stalls(_levels(), max_steal_fraction=0.10, estimator="exclude-stalls")
    assert {s.key for s in found} == {STALLED, STOLEN, FAST}
    by_key = {s.key: s for s in found}
    assert "modified z-score -" in by_key[STALLED].reason and by_key[STALLED].session == 2
    assert "modified z-score +" in by_key[FAST].reason
    assert by_key[STOLEN].reason == "host CPU steal time was 25.0 % (> 10 %)"
    assert {s.key for s in found if s.excluded} == {STOLEN}               # exogenous evidence: the steal share
    assert "no exogenous evidence" in by_key[STALLED].reason and "no exogenous evidence" in by_key[FAST].reason


def test_a_round_slow_in_both_arms_of_its_block_is_excluded_one_slow_in_its_own_arm_is_kept():
    """The candidate's own stall is its cost (issue #24); a stall in the same slot of both arms is the host's."""
    levels = _levels(steal=False)
    paired = (levels["arm"] == "candidate") & (levels["round"] == 9)       # session 2, second round: as STALLED
    levels.loc[paired, "output_throughput"] = 110.0
    by_key = {s.key: s for s in stalls.find_stalls(levels, max_steal_fraction=0.10, estimator="exclude-stalls")}
    assert by_key[STALLED].excluded and by_key[("candidate", C1, 9)].excluded
    assert "paired candidate round r9" in by_key[STALLED].reason
    assert not by_key[FAST].excluded


def test_a_host_load_outlier_is_exogenous_evidence():
    levels = _levels(steal=False).assign(load_avg_1m=2.0 + 0.01 * np.arange(48) % 0.3)
    levels.loc[(levels["arm"] == "baseline") & (levels["round"] == 9), "load_avg_1m"] = 9.0
    by_key = {s.key: s for s in stalls.find_stalls(levels, max_steal_fraction=0.10, estimator="exclude-stalls")}
    assert by_key[STALLED].excluded and "host load average 9.0" in by_key[STALLED].reason


def test_too_few_rounds_give_no_spread_to_flag_by():
    levels = _levels(steal=False)
    few = levels[levels["round"].isin([8, 9, 10, 11])]                # 4 rounds per arm, one of them stalled
    assert stalls.find_stalls(few, max_steal_fraction=0.10, estimator="median") == []


def test_mean_keeps_flagged_rounds_and_says_so():
    result = _evaluate(_levels(steal=False), "mean")
    assert {s.key for s in result.stalls} == {STALLED, FAST} and not any(s.excluded for s in result.stalls)
    note = next(n for n in result.notes if "stalled round" in n)
    assert "kept" in note and "baseline c=1 · 64→32 random r9 (session 2)" in note


def test_steal_invalidates_the_level_under_mean_and_is_excluded_otherwise():
    assert _evaluate(_levels(), "mean").primary[0].status == Status.INVALID
    result = _evaluate(_levels(), "exclude-stalls")
    assert result.primary[0].status != Status.INVALID
    assert {s.key for s in result.stalls if s.excluded} == {STOLEN}
    note = next(n for n in result.notes if "stalled round" in n)
    assert "excluded from the cells" in note
    assert "candidate c=1 · 64→32 random r14 (session 3): host CPU steal time was 25.0 %" in note


def test_excluded_rounds_leave_the_session_mean():
    levels = _levels(steal=False)
    kept = _cell(levels, "mean").baseline[2][0]
    dropped = _cell(levels, "exclude-stalls", {STALLED}).baseline[2][0]
    session = levels[(levels["arm"] == "baseline") & (levels["session"] == 2)]
    assert kept == pytest.approx(session["output_throughput"].mean())
    assert dropped == pytest.approx(session[session["round"] != 9]["output_throughput"].mean())


def test_median_resists_a_heavy_tailed_round_the_mean_does_not():
    levels = _levels(steal=False)
    session = levels[(levels["arm"] == "candidate") & (levels["session"] == 1)]["output_throughput"].to_numpy()
    mean, median = _cell(levels, "mean").candidate[1][0], _cell(levels, "median").candidate[1][0]
    assert mean == pytest.approx(session.mean()) and mean > 320
    assert median == pytest.approx(np.median(session)) and median < 310


def test_median_of_a_request_metric_pools_the_middle_rounds_requests():
    from harness.judge.cells import _session_values
    from harness.metrics import METRICS

    rounds = [np.array([10.0, 12.0]), np.array([50.0, 70.0]), np.array([11.0, 13.0]), np.array([9.0, 9.5])]
    spec = METRICS["mean_tpot_ms"]
    assert _session_values(spec, rounds, [0] * 4, 0, "mean").size == 8
    assert sorted(_session_values(spec, rounds, [0] * 4, 0, "median")) == [10.0, 11.0, 12.0, 13.0]


def test_calibration_spread_follows_the_estimator():
    levels = _levels(steal=False)
    spreads = {e: calibration.paired_spread(levels, estimator=e)[0].sd for e in stalls.ESTIMATORS}
    assert spreads["exclude-stalls"] < spreads["mean"] / 3
    assert spreads["median"] < spreads["mean"] / 3


def test_a_bad_estimator_is_a_one_line_error(tmp_path):
    with pytest.raises(ScenarioError) as error:
        load_scenario("cpu-tiny-dsa", {"gate.estimator": "trimmed"})
    assert "gate.estimator" in str(error.value) and "\n" not in str(error.value)
    policy = tmp_path / "policy.toml"
    policy.write_text('estimator = "huber"\n')
    with pytest.raises(PolicyError, match="gate.estimator") as error:
        load_policy(policy)
    assert "\n" not in str(error.value)


def test_every_session_flagged_makes_the_cell_invalid_naming_why():
    levels = _levels(steal=False)
    levels.loc[levels["arm"] == "candidate", "host_steal_fraction"] = 0.3
    (cell,) = _evaluate(levels, "median").primary
    assert cell.status == Status.INVALID
    assert "were flagged as stalled and excluded" in cell.note()
    assert "host CPU steal time was 30.0 % (> 10 %)" in cell.note()


def _aa_module():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("aa_split", Path(__file__).parent / "fixtures" / "recorded"
                                                  / "aa_split.py")
    aa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(aa)
    return aa


def _recording():
    from harness.rundir.store import RunDir

    store = RunDir("tests/fixtures/recorded/real-sessions")
    return store.manifest(), store.levels(numeric=True), store.requests(numeric=True)


@pytest.mark.parametrize("effect", [{}, {"throughput_factor": 0.95}])
def test_committed_fixtures_judge_the_same_with_the_default_as_with_the_mean(effect):
    aa = _aa_module()
    runs = [aa.typed(aa.aa_run(8, **effect)), _recording()]
    for manifest, levels, requests in runs:
        verdicts = [verdict.evaluate(manifest, levels, requests, None,
                                     GatePolicy(primary=("output_throughput", "mean_tpot_ms"), **fields),
                                     diagnostics=False)
                    for fields in ({}, {"estimator": "mean"})]
        assert verdicts[0].status == verdicts[1].status
        assert [c.status for c in verdicts[0].primary] == [c.status for c in verdicts[1].primary]


def test_the_mean_keeps_every_round_on_the_recorded_sessions():
    """The estimator of run directories judged before it existed: on the real recording (which holds flagged rounds)
    the session figure is the plain mean of every round, computed here from levels.csv alone."""
    manifest, levels, requests = _recording()
    policy = GatePolicy(primary=("output_throughput",), require_attestation=False, estimator="mean")
    result = verdict.evaluate(manifest, levels, requests, None, policy, diagnostics=False)
    assert result.stalls and not any(s.excluded for s in result.stalls)
    report = check_validity(manifest, levels, requests, policy)
    cells = build_cells(manifest, levels, requests, None, policy, report, diagnostics=False)
    by_level = {c.level: c for c in cells}
    for level, cell in by_level.items():
        expected = levels[(levels["arm"] == "baseline") & (levels["concurrency"] == level.concurrency)] \
            .groupby("session")["output_throughput"].mean()
        assert [v[0] for v in cell.baseline] == pytest.approx(expected.loc[list(cell.repeats)].tolist())


def test_the_gate_writes_the_flagged_rounds_into_verdict_json_and_summary(tmp_path):
    import json

    from harness import gate

    aa = _aa_module()
    manifest, levels, requests = aa.aa_run(8)
    stalled = levels.index[(levels["arm"] == "baseline") & (levels["concurrency"] == 4)][2]
    levels.loc[stalled, "output_throughput"] *= 0.3
    levels["host_steal_fraction"] = 0.0
    levels.loc[stalled, "host_steal_fraction"] = 0.4    # one round per session: a stall is flagged by its steal share
    manifest["scenario"]["gate"] = {"primary": ["output_throughput"], "estimator": "exclude-stalls"}
    result = gate.run_gate(aa.write_run(tmp_path / "run", manifest, levels, requests, None))
    document = json.loads((result.run_dir / gate.VERDICT).read_text())
    row = {"arm": "baseline", "level": levels.loc[stalled, "level"], "concurrency": 4,
           "round": int(levels.loc[stalled, "round"])}
    assert [{k: s[k] for k in row} for s in document["stalls"] if s["excluded"]] == [row]
    assert "1 stalled round(s) flagged" in (result.run_dir / gate.SUMMARY).read_text()


def test_with_one_round_per_session_only_steal_flags_a_round():
    """One round per session: an arm's rounds are its sessions, and a session offset is not a stall."""
    import pandas as pd

    from harness.judge.stalls import find_stalls

    values = [100.0, 101.0, 99.0, 100.5, 99.5, 60.0]            # the last far outside: |z| > 3.5 over the rounds
    rows = pd.DataFrame({"arm": "baseline",
                         "level": "random-i64-o32-c4", "concurrency": 4, "round": range(6), "session": range(6),
                         "output_throughput": values, "host_steal_fraction": [0.0] * 5 + [0.2]})
    (only,) = find_stalls(rows, max_steal_fraction=0.1, estimator="median")
    assert only.round == 5 and "steal" in only.reason and "z-score" not in only.reason
    several = rows.assign(session=[0, 0, 1, 1, 2, 2], host_steal_fraction=0.0)
    (flagged,) = find_stalls(several, max_steal_fraction=0.1, estimator="median")
    assert flagged.round == 5 and "z-score" in flagged.reason
