"""A sequential run (``gate.max_sessions``) stops at the first deciding look and a ``--budget`` run before a block
that would not fit; the stopped levels are not planned any more, so the gate judges the sessions that ran.

The runner runs for real; only server start, parity and the benchmark client are replaced (a level writes one
``levels.csv`` row with a seeded throughput), so the looks, stops, statuses and the gate are the production code."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness import gate
from harness.judge.policy import Status
from harness.render import render_report
from harness.run import plan as plan_mod
from harness.run import runner as runner_mod
from harness.run.models import locate
from harness.run.scenario import ScenarioError, load_scenario
from harness.rundir import schema
from harness.rundir.store import RunDir
from fakes.support import StubServer

CPU = plan_mod.Machine(name="cpu", device="planned", cpu_count=2, gpu_count=0, has_triton=False)
RECORDING = "tests/fixtures/recorded/record-sessions.toml"
GATE = {"gate.primary": ["output_throughput"], "gate.require_attestation": False, "gate.min_sessions": 3,
        "accuracy.enabled": False, "workload.concurrency": [1, 4], "workload.rounds_per_session": 1,
        "parity.gated": False}   # parity is replaced below: no scorings, so no correctness cells


def _plan(**overrides) -> plan_mod.Plan:
    scenario = load_scenario(RECORDING, {**GATE, **overrides}).effective()
    return plan_mod.build_plan(scenario, CPU, locate(scenario))


def _runner(tmp_path, monkeypatch, plan, *, loss: float, budget_s: float | None = None, level_s: float = 0.0):
    run = runner_mod.Runner(plan, tmp_path / "run", runner_mod.RunOptions(budget_s=budget_s))
    rng = np.random.default_rng(0)
    clock = [0.0]

    def start(arm, block):
        run._new_session(arm.name, 1.0, StubServer.base_url)
        return StubServer()

    def level(client, arm, server, at, repeat, progress, task):
        factor = 1.0 - loss if arm.name == "candidate" else 1.0
        run.store.append_levels([{"arm": arm.name, "session": run._session(arm.name), "round": repeat,
                                  "level": str(at), "concurrency": at.concurrency, "completed": 16, "failed": 0,
                                  "output_throughput": 100.0 * at.concurrency * factor
                                  * math.exp(rng.normal(0, 0.02))}])
        clock[0] += level_s

    monkeypatch.setattr(run, "_start_server", start)
    monkeypatch.setattr(run, "_parity", lambda *_: None)
    monkeypatch.setattr(run, "_run_level", level)
    monkeypatch.setattr(runner_mod.time, "monotonic", lambda: clock[0])
    return run


def _statuses(manifest: schema.Manifest) -> list[str]:
    return [level.status for arm in manifest.arms for level in arm.levels.values()]


@pytest.mark.parametrize("primary", [["output_throughput"], ["output_throughput", "gsm8k_accuracy"]])
def test_a_large_loss_stops_at_the_first_look_with_fail(tmp_path, monkeypatch, primary):
    # With accuracy primary (no data at a look) the look splits α over the same metrics as the final gate.
    plan = _plan(**{"gate.max_sessions": 8, "workload.repeats": 8, "gate.primary": primary})
    manifest = _runner(tmp_path, monkeypatch, plan, loss=0.3).run()
    statuses = _statuses(manifest)
    assert statuses.count("done") == 2 * 2 * 3          # 2 arms × 2 levels × 3 sessions (the first look)
    assert all(s == "done" or s.startswith(schema.STOPPED) for s in statuses)
    assert manifest.status == "done" and "FAIL" in manifest.stopped.reason
    result = gate.run_gate(tmp_path / "run")
    assert result.status == Status.FAIL
    assert any("look at 3 session" in note for note in result.verdict.notes)
    assert any("stopped before its last planned" in note for note in result.verdict.notes)
    render_report(tmp_path / "run")
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert "group-sequential" in page and "sequential stop: FAIL" in page


def test_an_aa_run_is_never_stopped_by_fail_and_uses_the_whole_design(tmp_path, monkeypatch):
    plan = _plan(**{"gate.max_sessions": 5, "workload.repeats": 5})
    manifest = _runner(tmp_path, monkeypatch, plan, loss=0.0).run()
    assert manifest.stopped is None or "PASS" in manifest.stopped.reason
    assert gate.run_gate(tmp_path / "run", write=False).status in (Status.PASS, Status.INCONCLUSIVE)


def test_the_budget_stops_before_a_block_that_would_not_fit(tmp_path, monkeypatch):
    plan = _plan(**{"workload.repeats": 6})              # fixed design: only the budget stops it
    manifest = _runner(tmp_path, monkeypatch, plan, loss=0.0, budget_s=50.0, level_s=2.0).run()
    # a block is 2 arms × 2 levels × 2 s = 8 s; after 5 blocks (40 s) a 6th ends at 48 s: it fits, and is the last.
    assert manifest.stopped is None
    manifest = _runner(tmp_path / "b", monkeypatch, plan, loss=0.0, budget_s=30.0, level_s=2.0).run()
    assert "budget" in manifest.stopped.reason
    assert _statuses(manifest).count("done") == 2 * 2 * 3   # 3 blocks (24 s); a 4th would end at 32 s
    stored = RunDir(tmp_path / "b" / "run").manifest()
    assert stored.stopped is not None and stored.status == "done"


@pytest.mark.parametrize("overrides, message", [
    ({"gate.max_sessions": 6}, "workload.repeats = 6"),
    ({"gate.max_sessions": 6, "workload.repeats": 6, "serve.concurrent_servers": True}, "concurrent_servers"),
    ({"gate.max_sessions": 2, "workload.repeats": 2}, "below min_sessions"),
])
def test_inconsistent_sequential_scenarios_are_refused(overrides, message):
    with pytest.raises(ScenarioError, match=message):
        _plan(**overrides)


def test_a_ray_node_must_be_a_node_id():
    with pytest.raises(ScenarioError, match="not a Ray node id"):
        _plan(**{"cluster.backend": "ray", "cluster.arms.baseline.node": "x"})


@pytest.mark.parametrize("flag, expected", [(None, 600.0), (90.0, 90.0)])
def test_the_scenario_budget_applies_unless_budget_is_given(flag, expected, tmp_path, monkeypatch):
    """``workload.budget_s`` is the run's budget; ``--budget`` overrides it."""
    import argparse

    from harness import cli, compare
    from harness.run import runner as runner_mod

    seen = {}

    class Stop(Exception):
        pass

    def fake_runner(plan, run_dir, options, console, resume_manifest=None):
        seen["budget_s"] = options.budget_s
        raise Stop

    monkeypatch.setattr(runner_mod, "Runner", fake_runner)
    parser = cli.build_parser()
    args = parser.parse_args(["compare", "--scenario", "cpu-tiny-dsa", "--no-gsm8k", "--out", str(tmp_path)]
                             + ([] if flag is None else ["--budget", f"{flag:g}s"]))
    request = cli.compare_request(args)
    request = request.model_copy(update={"overrides": {**request.overrides, "workload.budget_s": 600.0}})
    with pytest.raises(Stop):
        compare.run(request)
    assert seen["budget_s"] == expected


def test_the_budget_predicts_the_next_block_without_the_one_off_work_of_the_last():
    """Block 0 held GSM8K and parity (60 s of 100 s): the next block is taken as 40 s, not 100 s."""
    from harness.run.stopping import BlockBudget

    budget = BlockBudget(150.0, started=0.0, servers_stay_up=False)
    assert budget.close(100.0, server_start_s=20.0, one_off_s=60.0) == 40.0
    assert budget.stop_reason(100.0, 40.0, blocks_done=1) is None                             # 100 + 40 ≤ 150
    assert budget.close(140.0, server_start_s=30.0, one_off_s=60.0) == 40.0
    assert "budget" in budget.stop_reason(140.0, 40.0, blocks_done=2)                         # 140 + 40 > 150
    plain = BlockBudget(150.0, started=0.0, servers_stay_up=False)
    assert plain.close(100.0, server_start_s=20.0) == 100.0                                   # 100 + 100 > 150
    stay = BlockBudget(150.0, started=0.0, servers_stay_up=True)   # servers started once: not again next block
    assert stay.close(100.0, server_start_s=20.0) == 80.0


def test_repeats_on_a_sequential_scenario_runs_that_many_blocks_in_the_fixed_design(capsys):
    """The CPU default looks from 3 to 6 sessions; `--repeats 2` is a 2-block run judged once, not an error."""
    from harness.cli import main

    assert main(["plan", "--repeats", "2"]) == 0
    assert "rounds 0..1" in capsys.readouterr().out
    assert main(["plan", "--max-sessions", "4"]) == 0
