"""The design study: cost per decision (harness.judge.design_costs), the analysis of recorded run directories, the
design file's checks (one line, exit 2, nothing run) and the run loop's compare arguments (a fake compare)."""

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness import compare
from harness.study import design_study
from harness.study.design_analysis import analyze_run
from harness.study.design_file import find_library, read_designs, resolve
from harness.study.design_table import HEADER
from harness.judge.design_costs import (block_wall_s, decision_cost, pooled_spread, pooled_spreads, run_noise,
                                        sd_interval)
from harness.judge.planning import sessions_for_power
from harness.rundir.schema import Manifest
from harness.rundir.store import RunDir
from harness.run.scenario import Scenario

RECORDING = "tests/fixtures/recorded/real-sessions"
COMPARE_RUN = "tests/fixtures/compare_run"


def _crafted(offsets, levels=(1, 4), block_s=100.0, rounds=2, regime="random-i64-o32"):
    """An A/B frame whose candidate session means sit ``offsets[s]`` (log) above the baseline's at every level (of
    ``regime``), and a manifest whose blocks end ``block_s`` apart."""
    rows, arms = [], []
    for arm in ("baseline", "candidate"):
        sessions, done = [], {}
        for s, offset in enumerate(offsets):
            sessions.append({"index": s, "started_at": "2026-12-01T10:00:00+00:00"})
            for r in range(rounds):
                for c in levels:
                    wobble = 0.01 * (1 if r % 2 else -1)   # rounds differ; their mean is the session's
                    value = 100.0 * c * math.exp(wobble + (offset if arm == "candidate" else 0.0))
                    rows.append({"arm": arm, "session": s, "round": s * rounds + r,
                                 "level": f"{regime}-c{c}", "concurrency": c,
                                 "output_throughput": value})
                    end = pd.Timestamp("2026-12-01T10:00:00+00:00") + pd.Timedelta(seconds=block_s * (s + 1))
                    done[f"{regime}-c{c}-r{s * rounds + r}"] = {"status": "done", "session": s,
                                                                      "finished_at": end.isoformat()}
        arms.append({"name": arm, "route": arm, "sessions": sessions, "levels": done})
    manifest = Manifest.model_validate({"run_id": "crafted", "scenario": {"workload": {"rounds_per_session": rounds}},
                                        "arms": arms})
    return manifest, pd.DataFrame(rows)


def test_cost_is_spread_squared_times_wall_per_block():
    offsets = [0.0, 0.1, -0.1, 0.05, -0.05, 0.2]
    manifest, levels = _crafted(offsets, block_s=120.0)
    noise = run_noise(manifest, levels)
    sd = float(np.std(offsets, ddof=1))
    assert noise["pooled"]["sd"] == pytest.approx(sd) and noise["pooled"]["pairs"] == len(offsets)
    assert all(row["sd"] == pytest.approx(sd) for row in noise["levels"])
    assert noise["wall_per_block_s"] == pytest.approx(120.0) and noise["blocks_timed"] == len(offsets)
    assert noise["cost_s"] == pytest.approx(sd ** 2 * 120.0)
    assert noise["minutes_to_1pct_se"] == pytest.approx(sd ** 2 * 120.0 / 1e-4 / 60)
    assert noise["blocks_3pct"] == sessions_for_power(sd, abs(math.log(0.97)), 0.025, 0.90)
    assert noise["minutes_3pct"] == pytest.approx(noise["blocks_3pct"] * 2.0)
    low, high = sd_interval(sd, len(offsets) - 1)
    assert (noise["pooled"]["low"], noise["pooled"]["high"]) == pytest.approx((low, high)) and low < sd < high


def test_a_halved_spread_costs_a_quarter():
    manifest, wide = _crafted([0.0, 0.2, -0.2, 0.1])
    _, narrow = _crafted([0.0, 0.1, -0.1, 0.05])
    assert run_noise(manifest, narrow)["cost_s"] == pytest.approx(run_noise(manifest, wide)["cost_s"] / 4)


def test_a_session_missing_a_level_is_left_out_of_the_pooled_spread():
    offsets = [0.0, 0.1, -0.1, 0.05, -0.05]
    _, levels = _crafted(offsets)
    broken = levels.drop(levels[(levels["arm"] == "candidate") & (levels["session"] == 4)
                                & (levels["concurrency"] == 4)].index)
    pooled = pooled_spread(broken)
    assert pooled.pairs == 4 and pooled.sd == pytest.approx(float(np.std(offsets[:4], ddof=1)))


def test_the_pooled_spread_pools_within_each_regime_as_the_judge_does():
    """Issue #26: the judge pools a regime's levels, never two regimes'. Here the long regime's session offsets are
    the short one's negated: pooled over both they cancel (sd ≈ 0, a decision that looks free); per regime each has
    its own spread, and the run's cost per decision is the noisier regime's, which it names."""
    short, long_ = [0.0, 0.1, -0.1, 0.05, -0.05], [0.0, -0.2, 0.2, -0.1, 0.1]
    manifest, first = _crafted(short, levels=(1, 4))
    _, second = _crafted(long_, levels=(1, 2), regime="random-i8192-o64")
    levels = pd.concat([first, second], ignore_index=True)
    spreads = {str(s.regime): s for s in pooled_spreads(levels)}
    assert spreads["random-i64-o32"].sd == pytest.approx(float(np.std(short, ddof=1)))
    assert spreads["random-i8192-o64"].sd == pytest.approx(float(np.std(long_, ddof=1)))
    assert pooled_spread(levels).sd == pytest.approx(float(np.std(long_, ddof=1)))
    noise = run_noise(manifest, levels)
    assert noise["pooled"]["regime"] == "random-i8192-o64"
    assert noise["pooled"]["sd"] == pytest.approx(float(np.std(long_, ddof=1)))
    assert [p["regime"] for p in noise["pooled_regimes"]] == ["random-i64-o32", "random-i8192-o64"]


def test_no_finished_block_has_no_wall_time_and_no_cost():
    manifest, levels = _crafted([0.0, 0.1, -0.1])
    data = manifest.model_dump(mode="json")
    for arm in data["arms"]:
        arm["levels"] = {}
    assert block_wall_s(Manifest.model_validate(data)) == (None, 0)
    assert decision_cost(0.1, 0.2, None).cost_s is None


def test_analyze_the_recorded_sessions():
    row = analyze_run(RECORDING)
    store = RunDir(RECORDING)
    levels = store.levels(numeric=True)
    logs = levels.assign(log=np.log(levels["output_throughput"]))
    means = logs.groupby(["arm", "session", "concurrency"])["log"].mean().unstack("concurrency")
    d = (means.loc["candidate"] - means.loc["baseline"]).dropna().mean(axis=1)   # pooled over levels per pair
    assert row["blocks"] == len(d) == 18 and row["rounds_per_session"] == 4
    assert row["spread"]["pooled"]["sd"] == pytest.approx(float(d.std(ddof=1)))
    assert [s["concurrency"] for s in row["sessions"]] == [1, 4]
    assert all(0 < s["within"] and s["within_df"] == 108 for s in row["sessions"])
    spread = row["spread"]
    assert spread["cost_s"] == pytest.approx(spread["pooled"]["sd"] ** 2 * spread["wall_per_block_s"])
    assert row["wall_per_round_s"] == pytest.approx(spread["wall_per_block_s"] / 4)
    assert row["analyses"]["client TPOT"]["pooled"]["pairs"] == 18
    assert "note" in row["analyses"]["server TPOT"] or "pooled" in row["analyses"]["server TPOT"]
    assert row["machine"]["cpu_count"] == 2 and row["overall"] in ("PASS", "FAIL", "INCONCLUSIVE", "INVALID")


def test_analyze_writes_the_study_and_prints_the_table(tmp_path, capsys):
    code = design_study.main(["analyze", RECORDING, COMPARE_RUN, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    (written,) = tmp_path.glob("*.json")
    study = json.loads(written.read_text())
    assert code == 0 and out.startswith(HEADER) and str(written) in out
    costs = {row["design"]: row["spread"]["cost_s"] for row in study["designs"]}
    assert study["cheapest"] == min(costs, key=costs.get)
    first, second = (line for line in out.splitlines()[2:] if line.startswith("| `"))
    assert study["cheapest"] in first                             # cheapest first
    again = design_study.main(["analyze", RECORDING, "--out", str(tmp_path)])
    assert again == 0 and len(json.loads(written.read_text())["designs"]) == 2   # merged by design name


def _design_file(tmp_path, body):
    path = tmp_path / "designs.toml"
    path.write_text('scenario = "cpu-tiny-dsa"\n' + body)
    return path


@pytest.mark.parametrize("body, fragment", [
    ('[designs.a]\noverrides = { "serve.no_such_knob" = 1 }\n', "serve.no_such_knob"),
    ('[designs.a]\noverides = { "workload.warmups" = 8 }\n', "unknown key 'overides'"),
    ('[designs.a]\nbase = "b"\n', "base 'b' is not a design"),
    ('[designs.a]\noverrides = { "workload.warmups" = -1 }\n', "workload.warmups"),
])
def test_bad_design_file_is_one_line_exit_2_and_runs_nothing(tmp_path, monkeypatch, capsys, body, fragment):
    monkeypatch.setattr(compare, "run", lambda request: pytest.fail("a compare started"))
    code = design_study.main(["run", "--designs", "a", "--design-file", str(_design_file(tmp_path, body)),
                              "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_unknown_design_name_is_exit_2(tmp_path, capsys):
    path = _design_file(tmp_path, '[designs.a]\noverrides = {}\n')
    assert design_study.main(["run", "--designs", "a,zz", "--design-file", str(path)]) == 2
    assert "unknown design 'zz'" in capsys.readouterr().err


PENDING = {"serve.restart_per_block", "serve.duet", "workload.min_level_s"}   # fields other branches add


def _known(key):
    section, _, field = key.partition(".")
    model = Scenario.model_fields[section].annotation
    return field.split(".")[0] in getattr(model, "model_fields", {})


def test_the_shipped_designs_validate():
    designs = read_designs()
    ready = [name for name, table in designs.tables.items()
             if all(_known(key) or key not in PENDING for key in resolve_keys(designs, name))]
    assert {"sequential-1r", "sequential-4r", "warmups-8", "bind-0"} <= set(ready)
    for design in resolve(designs, ready):
        preloaded = design.overrides.get("serve.env.LD_PRELOAD")
        assert (design.skipped is None) == (preloaded is not None) if design.preload else preloaded is None
        assert preloaded is None or Path(preloaded).exists()
    controls = resolve(designs, ["warmups-8"])[0].overrides
    assert controls["workload.rounds_per_session"] == 4 and controls["workload.warmups"] == 8


def resolve_keys(designs, name):
    table = designs.tables[name]
    keys = set(table.get("overrides", {}))
    base = table.get("base") or (designs.control_base if table.get("control") else None)
    return keys | (resolve_keys(designs, base) if base else set())


def test_a_library_found_nowhere_skips_its_design_and_one_found_is_preloaded(tmp_path, monkeypatch):
    path = _design_file(tmp_path, '[designs.a]\npreload = ["libno-such-allocator.so.9"]\n'
                                  '[designs.b]\npreload = ["libfake-alloc.so.1"]\n')
    (tmp_path / "lib" / "deep").mkdir(parents=True)
    (tmp_path / "lib" / "deep" / "libfake-alloc.so.1").write_text("")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    a, b = resolve(read_designs(path), ["a", "b"])
    assert a.skipped and "libno-such-allocator.so.9" in a.skipped and "serve.env.LD_PRELOAD" not in a.overrides
    assert b.skipped is None and b.overrides["serve.env.LD_PRELOAD"] == str(tmp_path / "lib/deep/libfake-alloc.so.1")
    assert find_library(["libno-such-allocator.so.9"]) is None


def _recorded_compares(tmp_path, monkeypatch) -> list:
    """``compare.run`` replaced by a copy of the recording per call; returns the list of requests it receives."""
    seen = []

    def fake_compare(request):
        run_dir = tmp_path / "out" / "runs" / f"run{len(seen)}"
        shutil.copytree(RECORDING, run_dir)
        seen.append(request)
        return compare.CompareResult(exit_code=0, run_dir=run_dir)

    monkeypatch.setattr(compare, "run", fake_compare)
    return seen


def test_run_makes_gated_aa_compares_with_each_designs_overrides(tmp_path, monkeypatch, capsys):
    seen = _recorded_compares(tmp_path, monkeypatch)
    code = design_study.main(["run", "--designs", "sequential-1r,sequential-4r,warmups-8", "--blocks", "3",
                              "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0 and len(seen) == 3
    for request in seen:
        overrides = request.overrides
        assert (overrides["workload.repeats"], overrides["accuracy.enabled"], request.gate, request.scenario) == (
            3, False, True, "cpu-tiny-dsa")
        assert overrides["allow_identical_arms"] is True
        assert overrides["arms.candidate.route"] == "baseline"
        assert request.out == tmp_path / "out" / "runs"
        assert overrides["workload.budget_s"] is None      # K blocks, whatever the scenario's budget
    assert seen[0].overrides["serve.concurrent_servers"] is False
    assert "workload.rounds_per_session" not in seen[0].overrides
    assert seen[2].overrides["workload.warmups"] == 8 and seen[2].overrides["workload.rounds_per_session"] == 4
    record = json.loads((tmp_path / "out" / "runs" / "run2" / "design.json").read_text())
    assert (record["design"], record["base"], record["blocks"]) == ("warmups-8", "sequential-4r", 3)
    assert "enabled" in record["thp"] and record["loadavg_before"]
    (study,) = (tmp_path / "out").glob("*.json")
    rows = json.loads(study.read_text())["designs"]
    assert [row["design"] for row in rows] == ["sequential-1r", "sequential-4r", "warmups-8"]
    (control,) = [line for line in out.splitlines() if line.startswith("| `warmups-8`")]
    assert "(base `sequential-4r`: " in control and "Transparent huge pages during the runs" in out


def test_robust_analyses_read_the_same_runs_through_the_estimator_option():
    row = analyze_run(RECORDING, ("median",))
    robust = row["analyses"]["robust: median"]
    assert robust["pooled"]["pairs"] == 18 and robust["pooled"]["sd"] != row["spread"]["pooled"]["sd"]


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--designs", "sequential-1r", "--blocks", "1"], "at least 2 blocks"),
    (["analyze", "tests/fixtures/no-such-run"], "not a run directory"),
])
def test_bad_run_or_analyze_arguments_are_exit_2(argv, fragment, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compare, "run", lambda request: pytest.fail("a compare started"))
    assert design_study.main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_the_median_pooled_spread_takes_the_median_per_level_not_over_all_levels():
    """One round per session: the median of a session's rounds at a level is that round, so the robust spread equals
    the mean one (a median over a session's rows of all levels at once would differ)."""
    rng = np.random.default_rng(3)
    rows = [{"arm": arm, "session": s, "round": s, "level": f"random-i64-o32-c{c}", "concurrency": c,
             "output_throughput": 100.0 * c * math.exp(rng.normal(0, 0.1) if arm == "candidate" else 0.0)}
            for arm in ("baseline", "candidate") for s in range(6) for c in (1, 2, 4)]
    levels = pd.DataFrame(rows)
    plain, median = pooled_spread(levels), pooled_spread(levels, estimator="median")
    d = (np.log(levels[levels.arm == "candidate"].output_throughput.to_numpy())
         - np.log(levels[levels.arm == "baseline"].output_throughput.to_numpy())).reshape(6, 3).mean(axis=1)
    assert plain.sd == pytest.approx(float(np.std(d, ddof=1)))
    assert median.pairs == plain.pairs == 6 and median.sd == pytest.approx(plain.sd)


def test_calibrate_runs_the_files_calibrate_designs_briefly_into_this_machines_study(tmp_path, monkeypatch, capsys):
    """Issue #27 item 3: a machine's first study is short — the file's ``calibrate`` designs, 3 blocks each."""
    seen = _recorded_compares(tmp_path, monkeypatch)
    assert design_study.main(["calibrate", "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    shipped = read_designs()
    assert shipped.calibrate and len(seen) == len(shipped.calibrate)
    assert {request.overrides["workload.repeats"] for request in seen} == {3}
    (study,) = (tmp_path / "out").glob("*.json")
    assert [row["design"] for row in json.loads(study.read_text())["designs"]] == list(shipped.calibrate)


@pytest.mark.parametrize("body, fragment", [
    ('[designs.a]\noverrides = {}\n', "no calibrate = [...] list"),
    ('calibrate = ["zz"]\n[designs.a]\noverrides = {}\n', "calibrate must list designs of the file"),
])
def test_calibrate_without_its_designs_is_one_line_exit_2(tmp_path, monkeypatch, capsys, body, fragment):
    monkeypatch.setattr(compare, "run", lambda request: pytest.fail("a compare started"))
    code = design_study.main(["calibrate", "--design-file", str(_design_file(tmp_path, body)),
                              "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1 and not (tmp_path / "out").exists()
