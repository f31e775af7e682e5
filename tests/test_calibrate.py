"""``dsa-bench calibrate``'s pieces: the paired session spread, the smallest detectable loss, the A/A overrides, and
its bad input (exit 2, nothing started)."""

import math

import numpy as np
import pandas as pd
import pytest

from harness.compare import aa_overrides
from harness.cli import main
from harness.judge.calibration import detectable_loss, paired_spread
from harness.run.scenario import load_scenario


def _levels(rng, sessions=6, rounds=3, offset_sd=0.05, loss=0.0):
    rows = []
    for arm in ("baseline", "candidate"):
        for s in range(sessions):
            offset = rng.normal(0, offset_sd)
            for r in range(rounds):
                value = 100 * math.exp(offset + rng.normal(0, 0.01)) * (1 - loss if arm == "candidate" else 1)
                rows.append({"arm": arm, "session": s, "round": s * rounds + r,
                             "level": "random-i64-o32-c4", "concurrency": 4,
                             "output_throughput": value})
    return pd.DataFrame(rows)


def test_paired_spread_sees_the_session_offsets_not_the_rounds():
    (spread,) = paired_spread(_levels(np.random.default_rng(0), sessions=40))
    assert spread.pairs == 40
    assert 0.05 < spread.sd < 0.095      # √2 · 0.05 ≈ 0.071 from the offsets; the rounds add ≈ 0.008
    assert spread.upper > spread.sd


def test_paired_spread_ignores_a_constant_loss():
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    (plain,) = paired_spread(_levels(rng_a))
    (shifted,) = paired_spread(_levels(rng_b, loss=0.2))
    assert math.isclose(plain.sd, shifted.sd, rel_tol=1e-9)


def test_one_pair_has_no_spread():
    (spread,) = paired_spread(_levels(np.random.default_rng(0), sessions=1))
    assert spread.pairs == 1 and math.isnan(spread.sd)


def test_detectable_loss_grows_with_spread_and_shrinks_with_sessions():
    small, large = detectable_loss(0.02, 4, -3.0, 0.025), detectable_loss(0.10, 4, -3.0, 0.025)
    assert 3.0 < small < large
    assert detectable_loss(0.10, 16, -3.0, 0.025) < large
    assert detectable_loss(0.0, 4, -3.0, 0.025) == pytest.approx(3.0)   # no noise: exactly the margin
    with pytest.raises(ValueError):
        detectable_loss(0.05, 1, -3.0, 0.025)


def test_aa_overrides_make_the_candidate_a_copy_of_the_baseline():
    scenario = load_scenario("cpu-tiny-dsa")
    copied = load_scenario("cpu-tiny-dsa", aa_overrides(scenario.arms["baseline"], "step-delay:4"))
    base, cand = copied.arms["baseline"], copied.arms["candidate"]
    assert (cand.route, cand.extra_args, cand.env, cand.vllm) == (base.route, base.extra_args, base.env, base.vllm)
    assert cand.inject == "step-delay:4" and base.inject is None


@pytest.mark.parametrize("argv, fragment", [
    (["calibrate", "--slowdown", "bogus"], "--slowdown"),
    (["calibrate", "--inject-candidate", "topk-random"], "drop --inject-candidate"),
    (["calibrate", "--budget", "soon"], "not a duration"),
    (["calibrate", "--defects", "nope"], "unknown defect(s) nope; use all or"),
    (["calibrate", "--defects", " , "], "no defect named"),
    (["calibrate", "--defects", "mtp-hidden-unnormed"], "pass --mtp 2"),           # the default drafts 1 token
    (["calibrate", "--defects", "topk-random", "--scenario", "cpu-tiny"], "dsa_route.vllm_cpu"),   # vLLM's class
    (["calibrate", "--defects", "all", "--scenario", "cpu-tiny"], "can apply none of the 15 defects"),
])
def test_bad_calibrate_input_is_one_line_exit_2(argv, fragment, capsys, tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    try:
        code = main(argv + ["--out", str(tmp_path)])
    except SystemExit as exit_:                       # argparse's own errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
    from harness.run import procs

    assert procs.live_children() == []


def test_aa_check_runs_the_baseline_on_both_placements_unswapped_and_is_recorded(tmp_path, monkeypatch):
    import shutil

    from harness import compare, gate
    from harness.rundir.schema import Manifest
    from harness.rundir.store import RunDir

    run_dir = tmp_path / "aa"
    shutil.copytree("tests/fixtures/compare_run", run_dir)
    aa_overall = gate.run_gate(run_dir).status
    seen = {}

    def fake_compare(request):
        seen.update(request.overrides)
        return compare.CompareResult(exit_code=0, run_dir=run_dir)

    monkeypatch.setattr(compare, "run", fake_compare)
    record = compare.run_aa_check(compare.CompareRequest(scenario="cpu-tiny-dsa"))
    assert seen["cluster.swap_nodes"] is False and seen["cluster.aa_check"] is False
    assert seen["arms.candidate.route"] == load_scenario("cpu-tiny-dsa").arms["baseline"].route
    assert record == {"run_dir": str(run_dir), "overall": str(aa_overall), "reason": record["reason"]}

    data = RunDir(run_dir).manifest().model_dump(mode="json")
    data["aa_check"] = {**record, "overall": "FAIL"}
    manifest = Manifest.model_validate(data)
    store = RunDir(run_dir)
    from harness.judge.policy import GatePolicy
    from harness.judge.verdict import evaluate

    verdict = evaluate(manifest, store.levels(numeric=True), store.requests(numeric=True), None,
                       GatePolicy(primary=("output_throughput",), require_attestation=False))
    assert any("A/A check across the placements" in n and "placements differ" in n for n in verdict.notes)


def test_calibrate_counts_false_alarms_over_its_aa_runs(tmp_path, monkeypatch, capsys):
    """``--aa-runs 3``: three A/A compares, then the slowdown one; the JSON and the exit code count the FAILs."""
    import json
    import shutil

    from harness import compare
    from harness.study import calibrate

    verdicts = iter(["INCONCLUSIVE", "FAIL", "INCONCLUSIVE", "FAIL"])   # A/A ×3, then the slowdown
    injections = []

    def fake_compare(request):
        injections.append(request.overrides["arms.candidate.inject"])
        run_dir = tmp_path / f"run{len(injections)}"
        shutil.copytree("tests/fixtures/compare_run", run_dir)
        (run_dir / "verdict.json").write_text(json.dumps({"overall": next(verdicts), "reason": "r"}))
        return compare.CompareResult(exit_code=0, run_dir=run_dir)

    monkeypatch.setattr(compare, "run", fake_compare)
    code = main(["calibrate", "--aa-runs", "3", "--scenario", "cpu-tiny-dsa", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert injections == [None, None, None, calibrate.DEFAULT_SLOWDOWN]
    assert "A/A false alarms: 1 of 3 run(s)" in out and "A/A 2/3: FAIL (false alarm)" in out
    (written,) = tmp_path.glob("calibration-*.json")
    record = json.loads(written.read_text())
    assert record["false_alarms"] == 1 and len(record["aa_runs"]) == 3 and record["slowdown"]["overall"] == "FAIL"
    pooled = record["aa"]["pooled_spread"]                   # the FAIL side's first test: levels pooled
    assert pooled["pairs"] == 3 and pooled["sd"] > 0 and "all levels (pooled): sd" in out
    assert code == 1                                    # a false alarm fails the calibration


def test_aa_runs_below_one_is_one_line_exit_2(capsys, tmp_path):
    assert main(["calibrate", "--aa-runs", "0", "--out", str(tmp_path)]) == 2
    assert "--aa-runs" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_an_interrupted_run_ends_calibrate_without_starting_the_next(tmp_path, monkeypatch, capsys):
    """Ctrl-C or SIGTERM in one compare (its exit code 130) stops calibrate: no further A/A or slowdown run."""
    from harness import compare

    calls = []

    def interrupted_compare(request):
        calls.append(request.overrides["arms.candidate.inject"])
        return compare.CompareResult(exit_code=130, run_dir=tmp_path / "run")

    monkeypatch.setattr(compare, "run", interrupted_compare)
    assert main(["calibrate", "--aa-runs", "3", "--scenario", "cpu-tiny-dsa", "--out", str(tmp_path)]) == 130
    assert calls == [None] and "no further runs" in capsys.readouterr().err


def _verdict(overall: str, failed_cell: bool) -> dict:
    """A minimal ``verdict.json`` (harness.rundir.schema.VerdictDocument): one GSM8K cell and the token-divergence
    cell, both FAILed when ``failed_cell``."""
    result = "FAIL" if failed_cell else "PASS"
    return {"run_id": "r", "overall": overall, "exit_code": 1 if overall == "FAIL" else 3, "reason": "r",
            "cells": [{"metric": "gsm8k_accuracy", "label": "GSM8K", "concurrency": None, "result": result},
                      {"metric": "output_throughput", "label": "tput",
                       "level": "random-i64-o32-c4", "concurrency": 4, "result": "PASS"}],
            "correctness": [{"name": "token_divergence", "result": result}, {"name": "parity", "result": "PASS"}]}


def _fake_defect_runs(tmp_path, monkeypatch, outcome):
    """``compare.run`` replaced by a copy of the recorded run whose verdict ``outcome(inject)`` gives
    (``(overall, failed_cell)``); returns the list of injections asked for, in order."""
    import json
    import shutil

    from harness import compare

    injections = []

    def fake_compare(request):
        inject = request.overrides["arms.candidate.inject"]
        injections.append(inject)
        run_dir = tmp_path / f"run{len(injections)}"
        shutil.copytree("tests/fixtures/compare_run", run_dir)
        (run_dir / "verdict.json").write_text(json.dumps(_verdict(*outcome(inject))))
        return compare.CompareResult(exit_code=0, run_dir=run_dir)

    monkeypatch.setattr(compare, "run", fake_compare)
    return injections


def test_calibrate_defects_all_prints_the_kill_matrix_and_leaves_out_what_the_scenario_cannot_apply(
        tmp_path, monkeypatch, capsys):
    """``--defects all`` on the default: the A/A run, then one run per applicable defect (not the slowdown);
    harmful ones FAIL, harmless ones PASS → every outcome as expected, exit 0; ``mtp-hidden-unnormed`` needs
    ``--mtp 2`` and is listed as not run."""
    import json

    from dsa_route.inject import DEFECTS

    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    injections = _fake_defect_runs(tmp_path, monkeypatch, lambda inject: (
        ("FAIL", True) if inject and DEFECTS[inject].harmful else ("PASS", False)))
    code = main(["calibrate", "--defects", "all", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    runnable = [name for name in DEFECTS if name != "mtp-hidden-unnormed"]
    assert injections == [None, *runnable]
    assert "| `topk-random` | yes | FAIL | caught | gsm8k_accuracy, token_divergence |" in out
    assert "| `topk-order` | no | PASS | quiet | — |" in out
    assert "caught: 12, missed: 0, false alarm: 0, quiet: 2" in out and "not run: mtp-hidden-unnormed" in out
    (written,) = tmp_path.glob("calibration-*.json")
    record = json.loads(written.read_text())
    assert [row["defect"] for row in record["kill_matrix"]] == runnable and "slowdown" not in record
    assert "--mtp 2" in record["not_run"]["mtp-hidden-unnormed"] and code == 0


def test_a_missed_defect_or_a_harmless_fail_fails_the_calibration(tmp_path, monkeypatch, capsys):
    import json

    verdicts = {None: ("INCONCLUSIVE", False), "topk-random": ("FAIL", True),
                "visibility-off-by-one": ("INCONCLUSIVE", False), "topk-order": ("FAIL", True)}
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    injections = _fake_defect_runs(tmp_path, monkeypatch, verdicts.__getitem__)
    code = main(["calibrate", "--defects", "topk-random,visibility-off-by-one,topk-order,topk-random",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert injections == [None, "topk-random", "visibility-off-by-one", "topk-order"]   # each once, in order
    assert "| `visibility-off-by-one` | yes | INCONCLUSIVE | missed | — |" in out
    assert "| `topk-order` | no | FAIL | false alarm |" in out
    (written,) = tmp_path.glob("calibration-*.json")
    outcomes = [row["outcome"] for row in json.loads(written.read_text())["kill_matrix"]]
    assert outcomes == ["caught", "missed", "false alarm"] and code == 1


def test_calibration_figures_set_the_engine_cpu_spread_beside_the_throughput_spread(tmp_path):
    """With ``engine_cpu_ms_per_token`` recorded, each level's figures carry its paired session sd too (is the
    contention-robust cost less noisy?); a run without the column has none."""
    import shutil

    from harness import gate
    from harness.study import calibrate

    run_dir = tmp_path / "run"
    shutil.copytree("tests/fixtures/compare_run", run_dir)
    gate.run_gate(run_dir)
    assert all("engine_cpu_sd" not in row for row in calibrate._figures(run_dir)["spread"])
    levels = pd.read_csv(run_dir / "levels.csv")
    rng = np.random.default_rng(0)
    levels["engine_cpu_ms_per_token"] = 5.0 * np.exp(rng.normal(0, 0.01, len(levels)))
    levels.to_csv(run_dir / "levels.csv", index=False)
    spread = calibrate._figures(run_dir)["spread"]
    assert spread and all(0 < row["engine_cpu_sd"] < 0.05 for row in spread if row["pairs"] >= 2)
