"""Issue #27 item 4: after block 1 the run projects whether ``gate.min_sessions`` blocks fit ``--budget``; if not it
leaves the longest levels out of the later blocks, or stops and says why (``manifest.json`` ``budget``).

The runner runs for real; only server start, parity and the benchmark client are replaced (a level advances a fake
clock by its duration and writes one ``levels.csv`` row), so the projection, the statuses, the gate and the
renderers are the production code."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness import gate
from harness.judge.cells import DROPPED_NOTE
from harness.render import render_report
from harness.run import plan as plan_mod
from harness.run import runner as runner_mod
from harness.run.models import locate
from harness.run.scenario import load_scenario
from harness.run.stopping import project_budget, step_seconds
from harness.rundir import schema
from harness.rundir.store import RunDir
from fakes.support import StubServer

CPU = plan_mod.Machine(name="cpu", device="planned", cpu_count=2, gpu_count=0, has_triton=False)
RECORDING = "tests/fixtures/recorded/record-sessions.toml"
GATE = {"gate.primary": ["output_throughput"], "gate.require_attestation": False, "gate.min_sessions": 3,
        "accuracy.enabled": False, "workload.concurrency": [1, 2, 8], "workload.rounds_per_session": 1,
        "workload.repeats": 6, "parity.gated": False}
LEVEL_S = {1: 2.0, 2: 3.0, 8: 10.0}    # seconds per level and arm: a block is 5 s of starts + 2 × 15 s of levels
START_S = 2.5
SHORT = schema.Regime("random", 64, 32)   # the recording's regime


def _at(*concurrencies: int) -> tuple[str, ...]:
    return tuple(str(SHORT.at(c)) for c in concurrencies)


# ------------------------------------------------------------------------------------------------- the rule, pure
def test_a_budget_that_fits_changes_nothing():
    record = project_budget(120.0, elapsed_s=40.0, level_s={SHORT.at(1): 10.0, SHORT.at(8): 20.0},
                            min_sessions=3, planned=6, start_s=10.0)
    assert record.block_s == 40.0 and record.outcome == "fits" and record.dropped == () and record.needed_s == 120.0
    assert record.describe().endswith("needs 120 s ≤ budget 120 s; nothing changed (3 of 6 blocks projected at "
                                      "block 1's cost; each later block still starts if the one before it would "
                                      "fit again)")


def test_the_longest_levels_are_dropped_until_min_sessions_fit():
    level_s = {SHORT.at(1): 4.0, SHORT.at(2): 6.0, SHORT.at(4): 9.0, SHORT.at(8): 15.0}
    # 40 + 2 × 40 = 120 s > 80 s; without c=8: 40 + 2 × 25 = 90 s > 80 s; without c=4 too: 40 + 2 × 16 = 72 s
    record = project_budget(80.0, elapsed_s=40.0, level_s=level_s, min_sessions=3, planned=6, start_s=6.0)
    assert record.outcome == "adapted" and record.dropped == _at(8, 4) and record.kept() == _at(1, 2)
    assert record.projected_s == 72.0 and record.blocks == 3    # 1 + ⌊(80 − 40) / 16⌋
    assert ("min_sessions 3 needs 120 s > budget 80 s; changed: c=8, c=4 dropped from blocks 2 on"
            in record.describe())
    assert record.describe().endswith("the verdict covers c=1, c=2")


def test_a_budget_nothing_can_fit_says_so():
    record = project_budget(60.0, elapsed_s=40.0, level_s={SHORT.at(1): 4.0, SHORT.at(8): 15.0},
                            min_sessions=3, planned=6, start_s=20.0, look_s=1.0)
    assert record.outcome == "cannot" and record.dropped == ()
    assert record.projected_s == 40.0 + 2 * 25.0
    assert "cannot: even with c=1 alone a block takes 25 s, 20 s of it server starts" in record.describe()
    assert "raise --budget to ≥ 120 s" in record.describe()


def test_a_first_block_without_a_level_is_described_not_a_crash():
    record = project_budget(15.0, elapsed_s=14.0, level_s={}, min_sessions=3, planned=6, start_s=10.0)
    assert record.outcome == "cannot"
    assert "cannot: block 1 measured no level, 10 s of server starts" in record.describe()


# ------------------------------------------------------------------------------------------------- a whole run
def _plan(**overrides) -> plan_mod.Plan:
    scenario = load_scenario(RECORDING, {**GATE, **overrides}).effective()
    return plan_mod.build_plan(scenario, CPU, locate(scenario))


def _runner(run_dir, monkeypatch, plan, budget_s: float, setup_s: float = 0.0, look_s: float = 0.0
            ) -> runner_mod.Runner:
    """A runner on a fake clock: each server start takes START_S, each level LEVEL_S; ``setup_s`` of one-off work
    before the first level (as writing a real-text dataset is, timed by no ``timing`` key) and ``look_s`` per
    sequential look at a block boundary."""
    run = runner_mod.Runner(plan, run_dir, runner_mod.RunOptions(budget_s=budget_s))
    rng = np.random.default_rng(0)
    clock = [0.0]
    look = runner_mod.stopping.look_stop

    def setup() -> None:
        clock[0] += setup_s

    def looked(run_dir, blocks_done):
        clock[0] += look_s
        return look(run_dir, blocks_done)

    def start(arm, block):
        clock[0] += START_S
        run.timing["server_start_s"] += START_S
        run._new_session(arm.name, START_S, StubServer.base_url)
        return StubServer()

    def level(client, arm, server, at, repeat, progress, task):
        clock[0] += LEVEL_S[at.concurrency]
        run.store.append_levels([{"arm": arm.name, "session": run._session(arm.name), "round": repeat,
                                  "level": str(at), "concurrency": at.concurrency, "completed": 16, "failed": 0,
                                  "output_throughput": 100.0 * at.concurrency * math.exp(rng.normal(0, 0.01))}])

    monkeypatch.setattr(run, "_start_server", start)
    monkeypatch.setattr(run, "_parity", lambda *_: None)
    monkeypatch.setattr(run, "_run_level", level)
    monkeypatch.setattr(run, "_write_text_datasets", setup)
    monkeypatch.setattr(runner_mod.stopping, "look_stop", looked)
    monkeypatch.setattr(runner_mod.time, "monotonic", lambda: clock[0])
    return run


def _done_blocks(manifest: schema.Manifest, concurrency: int) -> int:
    return sum(1 for arm in manifest.arms[:1] for key, level in arm.level_items()
               if key.concurrency == concurrency and level.status == "done")


CONCURRENT = {"serve.concurrent_servers": True, "serve.restart_per_block": True}


@pytest.mark.parametrize("serve", [{}, CONCURRENT], ids=["sequential", "concurrent-fresh"])
def test_a_budget_that_fits_runs_every_block_unchanged(tmp_path, monkeypatch, serve):
    manifest = _runner(tmp_path / "run", monkeypatch, _plan(**serve), budget_s=600.0).run()
    assert manifest.budget.outcome == "fits" and manifest.stopped is None and manifest.budget.blocks == 6
    assert all(_done_blocks(manifest, c) == 6 for c in LEVEL_S)
    assert manifest.budget.block_s == 2 * START_S + 2 * sum(LEVEL_S.values())


@pytest.mark.parametrize("serve", [{}, CONCURRENT], ids=["sequential", "concurrent-fresh"])
def test_a_budget_that_fits_after_dropping_levels_judges_the_levels_of_every_block(tmp_path, monkeypatch, serve):
    # block 1 35 s; 3 blocks need 105 s > 80 s; without c=8 (20 s) a block is 15 s: 35 + 2 × 15 = 65 s ≤ 80 s
    run_dir = tmp_path / "run"
    manifest = _runner(run_dir, monkeypatch, _plan(**serve), budget_s=80.0).run()
    record = RunDir(run_dir).manifest().budget
    assert record.outcome == "adapted" and record.dropped == _at(8) and record.needed_s == 105.0
    assert record.blocks == 4                            # 1 + ⌊(80 − 35) / 15⌋: what the run then does
    assert _done_blocks(manifest, 8) == 1
    blocks = _done_blocks(manifest, 1)
    assert blocks == _done_blocks(manifest, 2) == 4     # 35 + 3 × 15 = 80 s: the budget's own stop after that
    dropped = [level.status for arm in manifest.arms for key, level in arm.level_items()
               if key.concurrency == 8 and key.round > 0]
    assert dropped and all(status.startswith(f"{schema.STOPPED}: budget") for status in dropped)
    result = gate.run_gate(run_dir)
    cells = {(c.metric, c.level and c.level.concurrency, c.pooled): c for c in result.verdict.cells}
    assert not cells[("output_throughput", 8, False)].primary
    assert DROPPED_NOTE in cells[("output_throughput", 8, False)].notes
    assert cells[("output_throughput", 1, False)].primary and cells[("output_throughput", 1, False)].repeats == 4
    assert cells[("output_throughput", None, True)].repeats == 4   # pooled over c=1, 2 only
    assert any("changed: c=8 dropped" in note for note in result.verdict.notes)
    assert result.document["noise"]["pooled"]["pairs"] == 4        # the run's spread, over the levels of every block
    render_report(run_dir)
    page = (run_dir / schema.REPORT).read_text(encoding="utf-8")
    summary = (run_dir / schema.SUMMARY).read_text(encoding="utf-8")
    assert "changed: c=8 dropped from blocks 2 on" in page and "changed: c=8 dropped" in summary


def test_a_budget_that_cannot_fit_stops_after_block_1_and_says_why(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    manifest = _runner(run_dir, monkeypatch, _plan(), budget_s=50.0).run()
    assert manifest.budget.outcome == "cannot"
    assert manifest.stopped.reason == manifest.budget.describe()
    assert manifest.stopped.reason.startswith("budget: a block's work is 35 s (block 1's levels and server starts); "
                                              "min_sessions 3 needs 105 s > budget 50 s; "
                                              "cannot: even with c=1 alone a block takes 9 s, 5 s of it server "
                                              "starts")
    assert all(_done_blocks(manifest, c) == 1 for c in LEVEL_S)
    result = gate.run_gate(run_dir)
    assert any("cannot:" in note for note in result.verdict.notes)


def test_without_a_budget_nothing_is_projected(tmp_path, monkeypatch):
    run = _runner(tmp_path / "run", monkeypatch, _plan(**{"workload.repeats": 2}), budget_s=None)
    assert run.run().budget is None


def test_a_plan_of_fewer_blocks_than_min_sessions_is_projected_on_its_own_blocks():
    record = project_budget(100.0, elapsed_s=40.0, level_s={SHORT.at(1): 10.0, SHORT.at(8): 20.0},
                            min_sessions=3, planned=2, start_s=10.0)
    assert record.outcome == "fits" and record.needed_s == 80.0 and record.blocks == 2


def test_the_projection_leaves_block_1s_one_off_work_out_and_counts_each_blocks_look(tmp_path, monkeypatch):
    """Block 1 also held 30 s of one-off work later blocks never repeat (a dataset written, timed by no ``timing``
    key) and each block ends with a 1 s sequential look: a later block is its levels, server starts and look
    (35 + 1 s), not block 1's wall (66 s). 66 + 2 × 36 = 138 s > 100 s; without c=8 (20 s): 66 + 2 × 16 = 98 s."""
    run_dir = tmp_path / "run"
    manifest = _runner(run_dir, monkeypatch, _plan(), budget_s=100.0, setup_s=30.0, look_s=1.0).run()
    record = manifest.budget
    assert record.elapsed_s == 66.0 and record.look_s == 1.0 and record.block_s == 36.0
    assert record.outcome == "adapted" and record.dropped == _at(8) and record.projected_s == 98.0


def test_a_duets_overlapping_levels_count_their_steps_wall_once():
    """``serve.duet``: both arms' levels of a step run at the same time on disjoint cores, so the step costs the
    longer of the two, not their sum; one after another they add up."""
    key = schema.LevelKey(SHORT.at(4), 0)
    walls = [("baseline", key, 10.0), ("candidate", key, 12.0),
             ("baseline", schema.LevelKey(SHORT.at(4), 1), 11.0), ("candidate", schema.LevelKey(SHORT.at(4), 1), 9.0)]
    assert step_seconds(walls, overlapping=True) == {SHORT.at(4): 12.0 + 11.0}
    assert step_seconds(walls, overlapping=False) == {SHORT.at(4): 42.0}
    record = project_budget(100.0, elapsed_s=30.0, level_s=step_seconds(walls, overlapping=True), min_sessions=3,
                            planned=6, start_s=5.0)
    assert record.block_s == 28.0 and record.needed_s == 30.0 + 2 * 28.0
