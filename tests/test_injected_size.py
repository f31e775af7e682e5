"""The size check of injected step delays (harness.judge.injected_size): the expected log effects derived from the
measured step time, checked against each effect's interval; its recompute from a stored attribution.json
(harness.attribution.recompute, `dsa-bench attribute --report FILE`) and its place in summary.md."""

import json
from pathlib import Path

import pytest

from harness.attribution import arm_delays, delay_factors
from harness.cli import main
from harness.judge.attribution import analyse
from harness.judge.factorial import arm_name, design_rows
from harness.judge.injected_size import expected_effects, injected_sizes, references, step_checks
from harness.render.attribution import summary_markdown
from harness.rundir.schema import AttributionDocument
from harness.run.scenario import load_scenario

RESULT = Path(__file__).resolve().parents[1] / "results" / "attribution" / "cpu-tiny-dsa-attribution-20261204.json"
FACTORS = ["compile", "delay_b", "delay_c"]
METRICS = ("output_throughput", "server_mean_tpot_ms", "acceptance_length")
LEVEL = "random-i64-o32-c4"


def delays(b_ms=8.0, c_ms=14.0, bc_ms=40.0):
    """Arm → ms: delay_b's, delay_c's and, where both are on, the injected interaction's (as harness.run.factors)."""
    return {arm_name(r): r[1] * b_ms + r[2] * c_ms + r[1] * r[2] * bc_ms for r in design_rows(3)}


def observations(sleeps=1.0, per_arm=None, base=(20.0, 18.5), blocks=(1.0, 1.12, 0.93), tokens=6.0, accept=1.7):
    """Noise-free rows built from the assumption itself: each engine step of an arm takes its compile level's base
    step (× the block's host factor) plus ``sleeps`` × its delay; throughput = tokens per step / step time, TPOT =
    step / acceptance length."""
    per_arm = per_arm or delays()
    rows = []
    for block, host in enumerate(blocks):
        for row in design_rows(3):
            arm = arm_name(row)
            step = base[row[0]] * host + sleeps * per_arm[arm]
            rows.append({"arm": arm, "block": block, "level": LEVEL, "levels": dict(zip(FACTORS, row)),
                         "engine_steps_per_s": 1000.0 / step, "output_throughput": tokens * 1000.0 / step,
                         "server_mean_tpot_ms": step / accept, "acceptance_length": accept, "tokens_per_step": tokens})
    return rows


def check(rows, per_arm, sleeps=1.0):
    result = analyse(rows, FACTORS, "full", METRICS, 0.05)
    return result, injected_sizes(rows, result["effects"], FACTORS, "full", per_arm, ["delay_b", "delay_c"],
                                  sleeps_per_step=sleeps)


def test_data_that_follow_the_assumption_give_exactly_the_estimates():
    result, sizes = check(observations(), delays())
    assert sizes["checked"] == sizes["inside"] == 15 and sizes["reference"] == "matched"
    for c in sizes["checks"]:
        assert c["expected"] == pytest.approx(c["estimate"], abs=1e-9), c
    mains = {(c["metric"], c["term"]): c for c in sizes["checks"]}
    assert mains[("output_throughput", "delay_b")]["expected"] < -0.3   # a real size, not a trivial zero
    assert mains[("output_throughput", "delay_b×delay_c")]["expected"] < -0.3
    assert all(c["expected"] == 0 for c in sizes["checks"] if c["metric"] == "acceptance_length")
    assert not [c for c in sizes["checks"] if c["term"] == "compile"]   # a real factor: no size to expect


def test_a_wrong_expected_size_is_reported_outside():
    rows = observations()
    _, twice = check(rows, delays(), sleeps=2.0)   # the draft delayed too: two sleeps per engine step
    outside = {(c["metric"], c["term"]) for c in twice["checks"] if c["inside"] is False}
    assert {("output_throughput", "delay_b"), ("output_throughput", "delay_c"), ("server_mean_tpot_ms", "delay_b"),
            ("server_mean_tpot_ms", "delay_c")} <= outside
    assert all(c["miss"] > 0.1 for c in twice["checks"] if c["term"] in ("delay_b", "delay_c")
               and c["metric"] != "acceptance_length")
    _, forgot = check(rows, delays(bc_ms=0.0))   # the injected interaction left out of what each arm sleeps
    assert ("output_throughput", "delay_b×delay_c") in {(c["metric"], c["term"]) for c in forgot["checks"]
                                                         if c["inside"] is False}


def test_the_step_check_measures_sleeps_per_step_from_the_data():
    one = step_checks(observations(), delays(), ["delay_b", "delay_c"])
    assert len(one) == 12 and {s["route"] for s in one} == {"engine", "request"}
    assert all(s["sleeps_per_step"] == pytest.approx(1.0) and abs(s["excess_ms"]) < 1e-9 for s in one)
    two = step_checks(observations(sleeps=2.0), delays(), ["delay_b", "delay_c"])
    assert all(s["sleeps_per_step"] == pytest.approx(2.0) and s["excess_ms"] > 0 for s in two)


def test_references_are_matched_in_a_full_design_and_pooled_in_a_fraction():
    levels = {arm_name(r): dict(zip(FACTORS, r)) for r in design_rows(3)}
    refs, mode = references(levels, ["delay_b", "delay_c"])
    assert mode == "matched" and refs["f111"] == ["f100"] and refs["f011"] == ["f000"]
    half = {arm_name(r): dict(zip("abcd", r)) for r in design_rows(4, "half")}
    refs, mode = references(half, ["d"])   # D = ABC: an arm with D on has no twin with D off
    assert mode == "pooled" and refs["f1001"] == sorted(a for a, lv in half.items() if lv["d"] == 0)
    with pytest.raises(ValueError, match="no arm has every injected factor"):
        references({a: lv for a, lv in levels.items() if lv["delay_b"] or lv["delay_c"]}, ["delay_b", "delay_c"])


def test_a_metric_without_a_known_size_is_refused():
    with pytest.raises(ValueError, match="mean_ttft_ms: no expected size"):
        expected_effects(observations(), FACTORS, "full", "mean_ttft_ms", delays(), ["delay_b"])


def test_the_scenarios_delays_are_read_per_arm_and_only_pure_delays_are_checked():
    spec = load_scenario("cpu-tiny-dsa-attribution").attribution
    assert delay_factors(spec) == ["delay_b", "delay_c"]
    arms = [{"name": "f011", "intended": {"injection": "step-delay:62"}}, {"name": "f000", "intended": {}}]
    assert arm_delays(arms) == {"f011": 62.0, "f000": 0.0}


def test_the_committed_result_is_what_the_code_derives(tmp_path):
    """results/attribution's JSON recomputed from its own observations: the stored check is this code's."""
    stored = json.loads(RESULT.read_text())
    copy = tmp_path / "a.json"
    copy.write_text(json.dumps(stored))
    assert main(["attribute", "--report", str(copy)]) == 0
    again = AttributionDocument.model_validate_json(copy.read_text())
    kept = AttributionDocument.model_validate(stored)
    assert kept.injected_sizes is not None and again.injected_sizes is not None
    for old, new in zip(kept.injected_sizes.checks, again.injected_sizes.checks):
        assert (old.term, old.metric, old.inside) == (new.term, new.metric, new.inside)
        assert new.expected == pytest.approx(old.expected, abs=1e-9)
    summary = (tmp_path / "a-summary.md").read_text()
    section = summary[summary.index("### Injected effects"):]
    assert section.count("| random-i64-o32-c4 |") == len(again.injected_sizes.checks) + len(again.injected_sizes.steps)


def test_a_file_from_before_the_stored_factors_takes_them_from_its_scenario(tmp_path):
    stored = json.loads(RESULT.read_text())
    for key in ("attribution", "injected_sizes"):
        stored.pop(key, None)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(stored))
    assert main(["attribute", "--report", str(path)]) == 0
    document = AttributionDocument.model_validate_json(path.read_text())
    assert document.injected_sizes.checked == 15 and "predates the stored [attribution] table" in document.notes[0]
    summary = summary_markdown(document)
    assert "### Injected effects" in summary and "sleeps per step" in summary


def test_a_bad_attribution_file_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    for text in ("{not json", json.dumps({"design": "full"})):
        bad.write_text(text)
        assert main(["attribute", "--report", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "not a readable attribution.json" in err and err.count("\n") == 1, err
