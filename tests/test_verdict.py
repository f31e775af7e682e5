"""harness.judge.policy, .validity (an invalid cell is never PASS), .verdict (decisions), .simulation (the A/A proof).

The simulations read the recorded pool in tests/fixtures/recorded/run (SYNTHETIC until a real recording replaces it;
see that directory's README), primary metrics output throughput and mean TPOT at levels 1, 2, 4, 8 (8 cells), at
QUIET_SESSIONS = 8 paired repeats (each a session). Measured with the intersection–union PASS and the
fixed-sequence FAIL (pooled hypothesis, then Holm over levels, α/2 per metric; since issue #24 Holm over {pooled,
levels}: the tests below assert bounds that hold for both), 200 resamples, seed 11 (the earlier
Holm-on-both-sides rule in brackets):

- A/A (the same arm split in two): PASS 100 % [99.5 %], FAIL 0 % [0 %]; at 4 sessions PASS 36.5 %, FAIL 0 %;
- 5 % throughput regression (throughput only; TPOT untouched): FAIL 100 % [95 %]; at 4 sessions 95.5 %, never PASS;
- throughput exactly on the −3 % margin: FAIL 2.5 % [5.5 %] (the test's size, ≤ α/2 = 2.5 %).

Power against repeats on a larger synthetic pool (128 sweeps, same generator, 500 resamples, 5 % throughput loss):
3 → 20 %, 4 → 36 %, 5 → 58 %, 6 → 70 %, 7 → 89 %, 8 → 95 %, 10 → 99 %; A/A FAIL 0 % and on-margin FAIL 1.8–3.2 % at
every count.
"""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from harness.judge import verdict
from harness.study import simulation
from harness.judge.policy import RECOMMENDED_REPEATS, GatePolicy, Status

QUIET_SESSIONS = 8
"""Sessions per arm at which the SYNTHETIC quiet-machine pool (CV ≈ 1.1–1.5 %, no session effect) FAILs a 5 % loss in
≥ 90 % of resamples; the real machine's figures come from the session recording (tests/test_session_simulation.py,
harness.judge.planning, README)."""
from harness.judge.verdict import CellInput
from harness.rundir.schema import Regime

_SPEC = importlib.util.spec_from_file_location(
    "aa_split", Path(__file__).parent / "fixtures" / "recorded" / "aa_split.py")
aa = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(aa)

PERF = GatePolicy(primary=("output_throughput", "mean_tpot_ms"))
SHORT = Regime("random", 64, 32)   # the regime of the hand-made cells


@pytest.fixture(scope="module")
def run8():
    return aa.aa_run(QUIET_SESSIONS)


@pytest.fixture(scope="module")
def pool():
    _, levels, requests, _ = aa.load_pool()
    return simulation.repeat_pool(levels, requests, aa.fixture_info()["pool_arms"])


def _evaluate(run, policy=PERF, accuracy=None, diagnostics=False):
    manifest, levels, requests = aa.typed(run)
    return verdict.evaluate(manifest, levels, requests, accuracy, policy, diagnostics=diagnostics)


def _copy(run):
    manifest, levels, requests = run
    return json.loads(json.dumps(manifest)), levels.copy(), requests.copy()


# ---------------------------------------------------------------------------------------------------------- policy


def test_policy_defaults_are_issue_6s():
    policy = GatePolicy()
    assert policy.primary == ("output_throughput", "mean_tpot_ms", "gsm8k_accuracy", "acceptance_length")
    assert [policy.margin(n) for n in policy.primary] == [-3.0, 3.0, -1.0, -2.0]
    assert policy.limit("output_throughput") == pytest.approx(math.log(0.97))
    assert policy.limit("gsm8k_accuracy") == pytest.approx(-0.01)
    assert policy.without("acceptance_length", "gsm8k_accuracy").primary == ("output_throughput", "mean_tpot_ms")
    assert GatePolicy.model_validate(policy.model_dump(mode="json")) == policy


@pytest.mark.parametrize("fields,match", [
    ({"primary": ["tput"]}, "unknown primary"),
    ({"primary": []}, "at least one"),
    ({"margins": {"output_throughput": 3.0}}, "must be ≤ 0"),
    ({"margins": {"mean_tpot_ms": -3.0}}, "must be ≥ 0"),
    ({"margins": {"p99_itl": 5.0}}, "unknown metric"),
    ({"alpha": 0.7}, "less than 0.5"),
    ({"levels": [0, 2]}, "positive"),
    ({"min_sessions": 1}, "greater than or equal to 2"),
    ({"repeats": 5}, "Extra inputs"),
])
def test_policy_rejects_bad_fields(fields, match):
    with pytest.raises(ValidationError, match=match):
        GatePolicy.model_validate(fields)


# -------------------------------------------------------------------------------------------------------- decisions


def _tput_cell(ratio, sd, repeats=8, level=1):
    """Per-repeat throughputs whose paired log ratios are exactly log(ratio) ± sd (zero-mean, deterministic), at
    concurrency ``level`` of one regime."""
    level = SHORT.at(level)
    wiggle = sd * np.resize([1.0, -1.0, 0.5, -0.5], repeats)
    wiggle -= wiggle.mean()
    base = 100 * np.exp(np.linspace(-0.01, 0.01, repeats))
    cand = ratio * base * np.exp(wiggle)
    return CellInput("output_throughput", level, tuple(np.array([v]) for v in base),
                     tuple(np.array([v]) for v in cand), tuple(range(repeats)))


def test_clear_cases_and_interval_consistency():
    cells = [_tput_cell(1.0, 0.003, level=1), _tput_cell(0.90, 0.003, level=2), _tput_cell(0.97, 0.01, level=4)]
    *results, pooled = verdict.decide(cells, PERF)
    assert [r.status for r in results] == [Status.PASS, Status.FAIL, Status.INCONCLUSIVE]
    assert pooled.pooled and pooled.status == Status.FAIL
    passed, failed, unsure = results
    assert passed.ci_low > -3 and failed.ci_high < -3 and unsure.ci_low <= -3 <= unsure.ci_high
    assert unsure.repeats_needed <= 8 and "near the margin" in unsure.note()   # the spread is small: not sessions
    assert failed.p_fail_holm <= 0.05 and passed.p_pass_holm <= 0.05
    assert "repeats" in unsure.note() or "margin" in unsure.note()


def test_inconclusive_says_how_many_sessions_from_the_spread_not_the_observed_effect():
    result = verdict.decide([_tput_cell(0.985, 0.03, repeats=4)], PERF)[0]
    assert result.status == Status.INCONCLUSIVE and result.repeats_needed > 4
    assert f"≈{result.repeats_needed} sessions per arm" in result.note()
    closer = verdict.decide([_tput_cell(0.975, 0.03, repeats=4)], PERF)[0]   # another effect, the same spread
    assert closer.status == Status.INCONCLUSIVE and closer.repeats_needed == result.repeats_needed
    wider = verdict.decide([_tput_cell(0.985, 0.06, repeats=4)], PERF)[0]
    assert wider.repeats_needed > result.repeats_needed


def test_the_inconclusive_reason_counts_the_minutes_the_missing_sessions_take():
    result = verdict.decide([_tput_cell(0.985, 0.03, repeats=4)], PERF)
    more = result[0].repeats_needed - 4
    _, reason = verdict.overall(result, block_s=90.0)
    assert f"≈{more * 90 / 60:.0f} more minutes at 90 s per session block" in reason
    assert "more minutes" not in verdict.overall(result)[1]          # no block time known: sessions only


def test_one_repeat_is_inconclusive_not_pass():
    result = verdict.decide([_tput_cell(1.0, 0.0001, repeats=1)], PERF)[0]
    assert result.status == Status.INCONCLUSIVE and result.ci_low is None
    assert result.repeats_needed == RECOMMENDED_REPEATS


def test_overall_precedence():
    def results(*statuses):
        return [verdict.CellResult("output_throughput", SHORT.at(i + 1), True, s) for i, s in enumerate(statuses)]

    assert verdict.overall(results(Status.PASS, Status.PASS))[0] == Status.PASS
    assert verdict.overall(results(Status.PASS, Status.INCONCLUSIVE))[0] == Status.INCONCLUSIVE
    assert verdict.overall(results(Status.INCONCLUSIVE, Status.INVALID))[0] == Status.INVALID
    failing = results(Status.INVALID, Status.FAIL)
    failing[1].delta, failing[1].ci_low, failing[1].ci_high, failing[1].margin = -6.0, -8.0, -4.0, -3.0
    assert verdict.overall(failing)[0] == Status.FAIL
    assert verdict.overall([])[0] == Status.INVALID


def test_invalid_cell_is_never_tested():
    cell = CellInput("output_throughput", SHORT.at(1), invalid=("baseline r0: 3 of 10 requests failed",))
    result = verdict.decide([cell, _tput_cell(1.0, 0.001, level=2)], PERF)
    assert result[0].status == Status.INVALID and result[0].p_pass is None
    assert verdict.overall(result)[0] == Status.INVALID


# --------------------------------------------------------------------------------------------- validity on real data


def test_recorded_aa_run_is_valid_and_not_fail(run8):
    result = _evaluate(run8)
    assert result.status in (Status.PASS, Status.INCONCLUSIVE), result.reason   # A/A never FAILs
    assert not result.validity.failures


def _mutate_levels(run, column, value, arm="candidate", level=4, repeat=2):
    manifest, levels, requests = _copy(run)
    mask = (levels["arm"] == arm) & (levels["concurrency"] == level) & (levels["round"] == repeat)
    levels.loc[mask, column] = value
    return manifest, levels, requests


def _mutate_status(run, status):
    manifest, levels, requests = _copy(run)
    aa.arm(manifest, "candidate")["levels"][aa.level_key(manifest, 4, 2)]["status"] = status
    return manifest, levels, requests


def _drop_level_row(run):
    manifest, levels, requests = _copy(run)
    levels = levels[~((levels["arm"] == "candidate") & (levels["concurrency"] == 4) & (levels["round"] == 2))]
    return manifest, levels, requests


def _short_outputs(run):
    manifest, levels, requests = _copy(run)
    mask = (requests["arm"] == "candidate") & (requests["concurrency"] == 4) & (requests["round"] == 2)
    requests.loc[mask & (requests["index"] < 3), "output_len"] = 7
    return manifest, levels, requests


def _serial_client(run):
    """A client that never had more than one request in flight at level 4."""
    manifest, levels, requests = _copy(run)
    mask = (requests["arm"] == "candidate") & (requests["concurrency"] == 4) & (requests["round"] == 2)
    durations = requests.loc[mask, "e2el_ms"].to_numpy() / 1000
    requests.loc[mask, "start_s"] = np.concatenate([[0.0], np.cumsum(durations)[:-1]])
    return manifest, levels, requests


def _attestation(valid):
    def mutate(run):
        manifest, levels, requests = _copy(run)
        if valid is None:
            del aa.arm(manifest, "candidate")["attestation"]
        else:
            aa.arm(manifest, "candidate")["attestation"] = {"valid": False, "mismatches": ["model_runner v2 != v1"]}
        return manifest, levels, requests
    return mutate


def _planned_level_never_run(run):
    manifest, levels, requests = _copy(run)
    manifest["scenario"]["workload"]["concurrency"] = [1, 2, 4, 8, 16]
    return manifest, levels, requests


def _fewer_repeats_than_planned(run):
    manifest, levels, requests = _copy(run)
    manifest["scenario"]["workload"]["repeats"] = QUIET_SESSIONS + 1
    return manifest, levels, requests


INVALIDATIONS = {
    "failed requests": (lambda run: _mutate_levels(run, "failed", 3), "requests failed"),
    "too few requests": (lambda run: _mutate_levels(run, "completed", 5), "ramp-up and drain"),
    "vLLM max concurrency": (lambda run: _mutate_levels(run, "max_concurrent_requests", 1), "max_concurrent"),
    "timeline concurrency": (_serial_client, "achieved concurrency"),
    "client saturated": (lambda run: _mutate_levels(run, "client_cpu_util", 0.99), "client"),
    "output length": (_short_outputs, "--ignore-eos"),
    "path mismatch": (_attestation(False), "observed path differs"),
    "not attested": (_attestation(None), "not attested"),
    "repeat failed": (lambda run: _mutate_status(run, "failed: server died"), "failed: server died"),
    "repeat skipped": (lambda run: _mutate_status(run, "skipped"), "not run (skipped)"),
    "row missing": (_drop_level_row, "no levels.csv row"),
    "planned level never run": (_planned_level_never_run, "not run"),
    "planned repeat never run": (_fewer_repeats_than_planned, "not run"),
}


@pytest.mark.parametrize("name", list(INVALIDATIONS))
def test_each_validity_check_makes_the_cell_invalid_never_pass(run8, name):
    mutate, fragment = INVALIDATIONS[name]
    result = _evaluate(mutate(run8))
    bad = [c for c in result.primary if c.status == Status.INVALID]
    assert bad, name
    assert any(fragment in c.note() for c in bad), [c.note() for c in bad]
    assert result.status in (Status.INVALID, Status.FAIL) and result.status != Status.PASS


def test_p99_needs_enough_requests(run8):
    _, levels, _ = run8
    smallest = int(levels[levels["arm"] == "baseline"].groupby("concurrency")["completed"].sum().min())
    policy = GatePolicy(primary=("output_throughput", "p99_ttft_ms"), min_requests_for_p99=smallest + 1)
    result = _evaluate(run8, policy)
    p99_small = [c for c in result.primary if c.metric == "p99_ttft_ms" and c.status == Status.INVALID]
    assert p99_small and all("a p99 needs" in c.note() for c in p99_small)
    assert result.status == Status.INVALID


def test_missing_primary_data_is_invalid_never_pass(run8):
    """Default policy on a run without accuracy.csv and MTP columns: INVALID with the fix named."""
    result = _evaluate(run8, GatePolicy())
    by_metric = {c.metric: c for c in result.primary}
    assert by_metric["gsm8k_accuracy"].status == Status.INVALID
    assert "accuracy.csv" in by_metric["gsm8k_accuracy"].note()
    assert by_metric["acceptance_length"].status == Status.INVALID
    assert "MTP" in by_metric["acceptance_length"].note()
    assert result.status == Status.INVALID


def test_heavy_steal_invalidates_the_level_under_the_mean_and_is_excluded_under_a_robust_estimator(run8):
    stolen = _mutate_levels(run8, "host_steal_fraction", 0.25)
    mean = _evaluate(stolen, PERF.model_copy(update={"estimator": "mean"}))
    bad = [c for c in mean.primary if c.status == Status.INVALID]
    assert bad and all(c.level.concurrency == 4 for c in bad) and all("steal time was 25.0 %" in c.note() for c in bad)
    robust = _evaluate(stolen, PERF.model_copy(update={"estimator": "median"}))
    assert not [c for c in robust.primary if c.status == Status.INVALID]
    assert [(s.arm, s.level.concurrency, s.round, s.excluded) for s in robust.stalls
            if "steal" in s.reason] == [("candidate", 4, 2, True)]


def test_light_steal_is_recorded_not_judged_and_absent_steal_is_said(run8):
    light = _evaluate(_mutate_levels(run8, "host_steal_fraction", 0.05))
    assert not [f for f in light.validity.failures if f["check"] == "host_steal"]
    assert not any("host steal" in n for n in light.notes)
    assert any("host steal time" in n for n in _evaluate(run8).notes)    # the recorded pool predates the column


def test_not_checked_is_said(run8):
    manifest, levels, requests = _copy(run8)
    levels = levels.drop(columns=["client_cpu_util"])
    result = _evaluate((manifest, levels, requests))
    assert any("client saturation" in n for n in result.notes)


# ---------------------------------------------------------------------------------------------------- accuracy, MTP


def _accuracy_frame(n, base_wrong, cand_wrong, filter_name="flexible-extract"):
    rows = []
    for arm, wrong in (("baseline", base_wrong), ("candidate", cand_wrong)):
        rows += [{"arm": arm, "question_id": str(i), "filter": filter_name, "correct": int(i not in wrong),
                  "extracted": "42"} for i in range(n)]
    return pd.DataFrame(rows)


def test_gsm8k_cell_pairs_questions_and_reports_mcnemar(run8):
    policy = GatePolicy(primary=("output_throughput", "gsm8k_accuracy"))
    same = _evaluate(run8, policy, _accuracy_frame(1319, set(range(69)), set(range(69))))
    cell = next(c for c in same.primary if c.metric == "gsm8k_accuracy")
    assert cell.status == Status.PASS and cell.mcnemar["p_value"] == 1.0 and cell.delta == 0
    worse = _evaluate(run8, policy, _accuracy_frame(1319, set(range(69)), set(range(69 + 60))))
    cell = next(c for c in worse.primary if c.metric == "gsm8k_accuracy")
    assert cell.status == Status.FAIL and cell.mcnemar["baseline_only"] == 60 and cell.mcnemar["p_value"] < 1e-10
    assert worse.status == Status.FAIL
    small = _evaluate(run8, policy, _accuracy_frame(50, {1, 2}, {1, 2, 3}))
    cell = next(c for c in small.primary if c.metric == "gsm8k_accuracy")
    assert cell.status == Status.INCONCLUSIVE and cell.samples_needed > 50


@pytest.mark.parametrize("loss", [15, 50])
def test_the_defaults_accuracy_cell_fails_a_15_point_loss_at_its_n(run8, loss):
    """The embedded default's policy and question count (cpu-tiny-dsa: 128 generated problems): a candidate that
    loses ``loss`` points — a broken indexer loses ≈ 50 — FAILs the accuracy cell and the run (exit code 1),
    whatever the other cells say."""
    from harness.gate import exit_code
    from harness.run.scenario import load_scenario

    scenario = load_scenario("cpu-tiny-dsa").effective()
    n = scenario.accuracy.limit
    wrong = set(range(n // 2))                                   # baseline ≈ 50 %, the candidate ``loss`` points less
    policy = scenario.gate.model_copy(update={"primary": ("output_throughput", "gsm8k_accuracy")})
    result = _evaluate(run8, policy, _accuracy_frame(n, wrong, wrong | set(range(n // 2, n // 2 + loss * n // 100))))
    cell = next(c for c in result.primary if c.metric == "gsm8k_accuracy")
    assert n == 128 and cell.status == Status.FAIL and cell.delta <= -loss + 1
    assert result.status == Status.FAIL and exit_code(result.status) == 1


def test_gsm8k_unpaired_or_wrong_filter_is_invalid(run8):
    policy = GatePolicy(primary=("output_throughput", "gsm8k_accuracy"))
    frame = _accuracy_frame(100, set(), set())
    frame = frame[~((frame["arm"] == "candidate") & (frame["question_id"] == "7"))]
    assert _evaluate(run8, policy, frame).status == Status.INVALID
    assert _evaluate(run8, policy, _accuracy_frame(100, set(), set(), "strict-match")).status == Status.INVALID


def _with_mtp(run, candidate_factor=1.0):
    manifest, levels, requests = _copy(run)
    rng = np.random.default_rng(0)
    drafts = 1000 + rng.integers(0, 50, len(levels))
    rate = np.where(levels["arm"] == "candidate", 0.8 * candidate_factor, 0.8) * np.exp(rng.normal(0, 0.005,
                                                                                               len(levels)))
    levels["spec_drafts"] = drafts
    levels["spec_draft_tokens"] = drafts
    levels["spec_accepted_tokens"] = np.round(drafts * rate)
    levels["acceptance_rate"] = 100 * levels["spec_accepted_tokens"] / drafts
    levels["acceptance_length"] = 1 + levels["spec_accepted_tokens"] / drafts
    return manifest, levels, requests


def test_mtp_acceptance_length_is_gated_when_present(run8):
    policy = GatePolicy(primary=("output_throughput", "acceptance_length"))
    assert _evaluate(_with_mtp(run8), policy).status == Status.PASS
    dropped = _evaluate(_with_mtp(run8, candidate_factor=0.85), policy)   # length 1.80 → 1.68: −6.7 %
    assert dropped.status == Status.FAIL
    manifest, levels, requests = _with_mtp(run8)
    levels.loc[levels["arm"] == "candidate", "spec_drafts"] = 0
    assert _evaluate((manifest, levels, requests), policy).status == Status.INVALID


# ------------------------------------------------------------------------------------------ the simulation proof


def test_aa_false_alarms_at_most_one_percent(pool):
    result = simulation.simulate_gate(pool, PERF, repeats=QUIET_SESSIONS, n_sims=500, seed=11)
    assert not result.with_replacement
    assert result.rate(Status.FAIL) <= 0.01, result.counts


def test_five_percent_throughput_regression_fails_at_default_repeats(pool):
    result = simulation.simulate_gate(pool, PERF, repeats=QUIET_SESSIONS, n_sims=500, seed=12,
                                      throughput_factor=0.95)
    assert result.rate(Status.FAIL) >= 0.90, result.counts
    assert result.rate(Status.PASS) == 0


def test_at_the_margin_fail_rate_stays_near_alpha(pool):
    """Size: throughput exactly 3 % down (on the margin) FAILs at most α (+ sampling slack)."""
    result = simulation.simulate_gate(pool, PERF, repeats=QUIET_SESSIONS, n_sims=200, seed=13,
                                      throughput_factor=0.97)
    assert result.rate(Status.FAIL) <= PERF.alpha + 0.03, result.counts


def test_resampled_runs_with_an_invalid_cell_never_pass(pool):
    rng = np.random.default_rng(14)
    pairs = len(pool.sweeps) // 2
    for sim in range(100):
        chosen = rng.choice(pairs, QUIET_SESSIONS, replace=False)
        cells = []
        for level in pool.levels:
            base = tuple(np.array([pool.sweeps[2 * p][level]["level"]["output_throughput"]]) for p in chosen)
            cand = tuple(np.array([pool.sweeps[2 * p + 1][level]["level"]["output_throughput"]]) for p in chosen)
            cells.append(CellInput("output_throughput", level, base, cand, tuple(range(len(chosen)))))
        broken = int(rng.integers(len(cells)))
        cells[broken] = CellInput("output_throughput", cells[broken].level, invalid=("client saturated",))
        status, _ = verdict.overall(verdict.decide(cells, PERF, n_resamples=200, seed=sim))
        assert status in (Status.INVALID, Status.FAIL)
