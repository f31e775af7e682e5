"""Concurrent servers with a fresh pair of sessions per block (``serve.restart_per_block``) and duet runs
(``serve.duet``: each level sent to both arms at the same time on disjoint cores).

The runner runs for real — schedule, sessions, looks, the duet's threads, statuses, the manifest; only server start,
parity and the benchmark client are replaced (a level writes one ``levels.csv`` row), as in test_sequential_run."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from fakes.support import StubServer
from harness.judge.policy import Status
from harness.run import duet, estimate as estimate_mod, plan as plan_mod, stopping
from harness.run import runner as runner_mod
from harness.run.load import LevelError
from harness.run.models import locate
from harness.run.scenario import ScenarioError, load_scenario
from harness.run.start import schedule
from harness.rundir import schema

CPU = plan_mod.Machine(name="cpu", device="planned", cpu_count=2, gpu_count=0, has_triton=False)
RECORDING = "tests/fixtures/recorded/record-sessions.toml"
BASE = {"gate.primary": ["output_throughput"], "gate.require_attestation": False, "gate.min_sessions": 3,
        "accuracy.enabled": False, "workload.concurrency": [1, 4], "workload.rounds_per_session": 2,
        "workload.repeats": 3, "serve.concurrent_servers": True}
PLACED = {"cluster.arms.baseline": {"cpu_cores": "0"}, "cluster.arms.candidate": {"cpu_cores": "1"}}
DUET = {**PLACED, "serve.duet": True}


def _plan(**overrides) -> plan_mod.Plan:
    scenario = load_scenario(RECORDING, {**BASE, **overrides}).effective()
    return plan_mod.build_plan(scenario, CPU, locate(scenario))


class FakeClient:
    """A load client that is never started; records that it was closed."""

    instances: list["FakeClient"] = []

    def __init__(self, env, log_path):
        self.log_path, self.started, self.closed, self.import_s = log_path, False, False, 0.0
        FakeClient.instances.append(self)

    def start(self) -> None:
        self.started = True

    def close(self) -> None:
        self.closed = True


def _runner(tmp_path, monkeypatch, plan, level=None, *, loss: float = 0.0, resume=None):
    """A Runner with stub servers and ``level(run, client, arm, concurrency, round)`` as each level's body (default:
    one row with a seeded throughput, the candidate ``loss`` slower); ``resume``: the stored manifest to resume."""
    run = runner_mod.Runner(plan, tmp_path / "run", runner_mod.RunOptions(), resume_manifest=resume)
    rng, run.started_servers, run.up_together = np.random.default_rng(0), [], []
    FakeClient.instances = []

    def start(arm, block):
        run._new_session(arm.name, 1.0, StubServer.base_url)
        server = StubServer()
        run.started_servers.append((arm.name, block, server))
        return server

    def row(run_, client, arm, concurrency, repeat):
        factor = 1.0 - loss if arm.name == "candidate" else 1.0
        _write_row(run, arm.name, concurrency, repeat,
                   100.0 * concurrency.concurrency * factor * math.exp(rng.normal(0, 0.02)))

    def run_level(client, arm, server, concurrency, repeat, progress, task):
        run.up_together.append(sorted(run.servers))
        (level or row)(run, client, arm, concurrency, repeat)

    monkeypatch.setattr(run, "_start_server", start)
    monkeypatch.setattr(run, "_parity", lambda *_: None)
    monkeypatch.setattr(run, "_run_level", run_level)
    monkeypatch.setattr(duet, "LoadClient", FakeClient)
    return run


def _write_row(run, arm: str, level, repeat: int, throughput: float = 100.0) -> None:
    """One ``levels.csv`` row of ``arm``'s current session at ``level`` (a :class:`~harness.rundir.schema.Level`)."""
    run.store.append_levels([{"arm": arm, "session": run._session(arm), "round": repeat, "level": str(level),
                              "concurrency": level.concurrency, "completed": 16, "failed": 0,
                              "output_throughput": throughput}])


def _level_records(manifest: schema.Manifest) -> dict[tuple[str, str], schema.LevelRecord]:
    return {(arm.name, key): level for arm in manifest.arms for key, level in arm.levels.items()}


# ----------------------------------------------------------------------------------------------- scenario checks
@pytest.mark.parametrize("overrides, message", [
    ({"serve.duet": True, "serve.concurrent_servers": False, **PLACED}, "serve.concurrent_servers = true"),
    ({"serve.duet": True}, "--place-baseline cores=0 --place-candidate cores=1"),
    ({"serve.duet": True, "cluster.arms.baseline": {"cpu_cores": "0"}}, "own CPU cores or GPUs"),
    ({"serve.duet": True, "cluster.arms.baseline": {"gpu_ids": "0,1"}, "cluster.arms.candidate": {"gpu_ids": "1"}},
     "own CPU cores or GPUs"),
    ({"serve.duet": True, **PLACED, "cluster.arms.baseline": {"cpu_cores": "0", "gpu_ids": "0"}},
     "own CPU cores or GPUs"),   # cores apart, but the candidate sees every GPU
    ({"gate.max_sessions": 3}, "serve.restart_per_block = true"),
])
def test_duet_and_sequential_looks_need_their_design(overrides, message):
    with pytest.raises(ScenarioError, match=message.replace(".", r"\.").replace("-", r"\-")):
        _plan(**overrides)


def test_disjoint_gpus_make_a_duet_and_fresh_sessions_accept_max_sessions():
    gpus = _plan(**{"serve.duet": True, "cluster.arms.baseline": {"gpu_ids": "0,1"},
                    "cluster.arms.candidate": {"gpu_ids": "2,3"}})
    assert gpus.scenario.serve.duet and gpus.scenario.fresh_session_per_block()
    for fresh in ({"serve.restart_per_block": True}, DUET, {**PLACED, "cluster.swap_nodes": True}):
        assert _plan(**fresh, **{"gate.max_sessions": 3}).scenario.gate.max_sessions == 3
    assert not _plan().scenario.fresh_session_per_block()


def test_plan_notes_estimate_and_gsm8k_points_follow_the_design():
    kept, fresh, pair = _plan(), _plan(**{"serve.restart_per_block": True}), _plan(**DUET, **{"cluster.swap_nodes": True})
    assert not any("fresh pair" in note for note in kept.notes)
    assert any("fresh pair of server sessions per session block" in note for note in fresh.notes)
    (note,) = [note for note in pair.notes if note.startswith("duet:")]
    assert "baseline on local cores 0" in note and "candidate on local cores 1" in note and "exchanged" in note
    (unswapped,) = [note for note in _plan(**DUET).notes if note.startswith("duet:")]
    assert "not swapped" in unswapped and "--swap-nodes" in unswapped
    assert estimate_mod.sessions(kept) == 2 and estimate_mod.sessions(fresh) == estimate_mod.sessions(pair) == 2 * 3
    parts = [estimate_mod.estimate(plan).parts for plan in (kept, fresh)]
    assert parts[0]["parity"] == parts[1]["parity"]   # collected once per arm, whatever the sessions
    assert parts[1]["server starts"][0] == 3 * parts[0]["server starts"][0]
    assert estimate_mod.start_ups(fresh) == 3   # a block's pair starts together on a host without GPUs
    levels = [estimate_mod.estimate(plan).parts["load levels"] for plan in (fresh, pair)]
    assert levels[1] == pytest.approx((levels[0][0] / 2, levels[0][1] / 2), abs=0.1)   # a duet runs both arms' levels at once
    for plan, last_block in ((kept, 2), (fresh, 0), (pair, 0)):
        order = schedule(plan)
        points = stopping.gsm8k_points(plan, order)
        assert {plan.block_of(order[index][2]) for index in points.values()} == {last_block}
        assert all(order[index][0] == name for name, index in points.items())


def test_duet_steps_pair_the_two_arms_of_each_level():
    plan = _plan(**DUET)
    order = schedule(plan)
    pairs = duet.steps(order, True)
    assert len(pairs) == len(order) // 2 == 2 * plan.rounds()
    for first, second in pairs:
        assert order[first][1:] == order[second][1:] and {order[first][0], order[second][0]} == {"baseline",
                                                                                                  "candidate"}
    assert duet.steps(order, False) == [[index] for index in range(len(order))]
    with pytest.raises(ValueError, match="both arms at the same level"):
        duet.steps(order[1:], True)


# ----------------------------------------------------------------------------------------------- runs
def test_a_blocks_servers_start_together_and_the_start_up_time_counts_their_wall_time_once(tmp_path, monkeypatch):
    plan = _plan(**{"serve.restart_per_block": True, "workload.repeats": 2})
    run = _runner(tmp_path, monkeypatch, plan)
    barrier, inner = threading.Barrier(2, timeout=10), run._start_server

    def start(arm, block):   # each start waits for the other: passes only when both are in flight at once
        barrier.wait()
        run.timing["server_start_s"] += 100.0   # what _start_server adds: each server's own ready time
        return inner(arm, block)

    monkeypatch.setattr(run, "_start_server", start)
    manifest = run.run()
    assert manifest.status == "done" and len(run.started_servers) == 4
    assert run.timing["server_start_s"] < 10.0   # two blocks' wall time, not 4 × 100 s of ready times


def test_servers_sharing_a_gpu_start_one_after_the_other_in_the_blocks_order(tmp_path, monkeypatch):
    gpu = plan_mod.Machine(name="cuda", device="planned", cpu_count=2, gpu_count=1, has_triton=True)
    plan = _plan(**{"serve.restart_per_block": True})
    plan = plan_mod.Plan(plan.scenario, gpu, plan.arms)
    run = _runner(tmp_path, monkeypatch, plan)
    assert not run._start_together(plan.arms, 0)
    assert estimate_mod.start_ups(plan) == estimate_mod.sessions(plan) == 6   # the estimate counts each start
    manifest = run.run()
    assert manifest.status == "done"
    order = schedule(plan)
    first = [next(name for name, _, r in order if plan.block_of(r) == block) for block in range(3)]
    assert [(name, block) for name, block, _ in run.started_servers] == [   # the block's first arm starts first
        (name, block) for block in range(3) for name in (first[block], ({"baseline", "candidate"} - {first[block]}).pop())]
    placed = _plan(**{"serve.restart_per_block": True, "cluster.arms.baseline": {"gpu_ids": "0"},
                      "cluster.arms.candidate": {"gpu_ids": "1"}})
    two_gpus = runner_mod.Runner(plan_mod.Plan(placed.scenario, gpu, placed.arms), tmp_path / "two",
                                 runner_mod.RunOptions())
    assert two_gpus._start_together(placed.arms, 0)   # disjoint GPU sets: together


def test_restart_per_block_starts_a_fresh_pair_per_block_with_both_servers_up(tmp_path, monkeypatch):
    plan = _plan(**{"serve.restart_per_block": True})
    run = _runner(tmp_path, monkeypatch, plan)
    manifest = run.run()
    assert manifest.status == "done"
    assert sorted((block, name) for name, block, _ in run.started_servers) == [   # a pair per block, together
        (block, name) for block in range(3) for name in ("baseline", "candidate")]
    assert all(server.stopped for _, _, server in run.started_servers)
    assert all(sorted(up) == ["baseline", "candidate"] for up in run.up_together)   # both up before any level
    for (name, key), level in _level_records(manifest).items():
        assert level.status == "done" and level.session == plan.block_of(schema.LevelKey.parse(key).round)
    assert [len(arm.sessions) for arm in manifest.arms] == [3, 3]
    assert len(FakeClient.instances) == 1   # not a duet: one client takes turns


def test_a_duet_sends_each_level_to_both_arms_at_once(tmp_path, monkeypatch):
    plan = _plan(**DUET, **{"cluster.swap_nodes": True})
    together = threading.Barrier(2, timeout=30)   # a level that ran alone would break it
    clients = {}

    def level(run, client, arm, concurrency, repeat):
        clients.setdefault(arm.name, set()).add(id(client))
        together.wait()
        _write_row(run, arm.name, concurrency, repeat)
        together.wait()   # neither level ends before both have written their row

    run = _runner(tmp_path, monkeypatch, plan, level)
    manifest = run.run()
    assert manifest.status == "done", _level_records(manifest)
    records = _level_records(manifest)
    for key in manifest.arms[0].levels:
        base, cand = records[("baseline", key)], records[("candidate", key)]
        assert base.started_at < cand.finished_at and cand.started_at < base.finished_at
        assert base.session == cand.session == plan.block_of(schema.LevelKey.parse(key).round)
    assert len(clients["baseline"]) == len(clients["candidate"]) == 1 and clients["baseline"] != clients["candidate"]
    assert sorted(client.log_path.name for client in FakeClient.instances) == [
        "bench-client-baseline.log", "bench-client-candidate.log"]
    assert all(client.started and client.closed for client in FakeClient.instances)
    assert len(run.store.levels()) == 2 * 2 * plan.rounds()   # no row lost to the two writers
    assert [row.cpu_cores for row in manifest.cluster.assignments] == [(0,), (1,), (1,), (0,), (0,), (1,)]
    assert any(note.startswith("duet:") for note in manifest.notes)


def test_a_failing_arm_does_not_hold_up_the_other(tmp_path, monkeypatch):
    plan = _plan(**DUET)

    def level(run, client, arm, concurrency, repeat):
        if arm.name == "candidate":
            raise LevelError("benchmark failed: connection refused")
        _write_row(run, arm.name, concurrency, repeat)

    manifest = _runner(tmp_path, monkeypatch, plan, level).run()
    statuses = {key: level.status for key, level in _level_records(manifest).items()}
    assert all(status == "done" for (arm, _), status in statuses.items() if arm == "baseline")
    candidate = [status for (arm, _), status in statuses.items() if arm == "candidate"]
    assert candidate.count("failed: benchmark failed: connection refused") == 1
    assert all(status.startswith("skipped: an earlier level failed") for status in candidate
               if not status.startswith("failed"))
    assert manifest.status == "failed"


@pytest.mark.parametrize("error", [RuntimeError("a bug in one arm's thread"), KeyboardInterrupt()])
def test_a_crash_in_one_arm_ends_the_run_at_once_and_stops_every_child(tmp_path, monkeypatch, error):
    plan = _plan(**DUET)
    never, running = threading.Event(), threading.Event()

    def level(run, client, arm, concurrency, repeat):
        if arm.name == "candidate":
            running.wait(30)
            raise error
        running.set()
        never.wait(60)   # the baseline's level would run on; the run must not wait for it

    run = _runner(tmp_path, monkeypatch, plan, level)
    try:
        with pytest.raises(type(error)):
            run.run()
        assert run.manifest.status == ("interrupted" if isinstance(error, KeyboardInterrupt) else "failed")
        name, level_id, round_ = run.manifest.schedule[0]
        first = run.manifest.arm(name).levels[f"{level_id}-r{round_}"]
        assert name == "baseline" and first.status == "failed: interrupted during this level"   # not waited for
        assert all(server.stopped for _, _, server in run.started_servers)
        assert len(FakeClient.instances) == 2 and all(client.closed for client in FakeClient.instances)
    finally:
        never.set()


def test_a_duet_with_max_sessions_stops_at_the_first_deciding_look(tmp_path, monkeypatch):
    plan = _plan(**DUET, **{"gate.max_sessions": 8, "workload.repeats": 8, "workload.rounds_per_session": 1})
    manifest = _runner(tmp_path, monkeypatch, plan, loss=0.3).run()
    statuses = [level.status for level in _level_records(manifest).values()]
    assert statuses.count("done") == 2 * 2 * 3   # 2 arms × 2 levels × 3 sessions (the first look)
    assert "FAIL" in manifest.stopped.reason and manifest.status == "done"
    from harness import gate

    assert gate.run_gate(tmp_path / "run", write=False).status == Status.FAIL


def test_a_resumed_restart_per_block_run_starts_servers_only_for_its_unfinished_blocks(tmp_path, monkeypatch):
    """Resuming after a stop in block 2 starts one fresh pair for block 2, none for the finished blocks 0 and 1."""
    plan = _plan(**{"serve.restart_per_block": True, "workload.repeats": 3})

    def level(run, client, arm, concurrency, repeat):
        if repeat >= 4:
            raise KeyboardInterrupt
        _write_row(run, arm.name, concurrency, repeat)

    with pytest.raises(KeyboardInterrupt):
        _runner(tmp_path, monkeypatch, plan, level).run()
    stored = schema.Manifest.model_validate_json((tmp_path / "run" / schema.MANIFEST).read_text())
    resumed = _runner(tmp_path, monkeypatch, plan, resume=stored)
    assert resumed.run().status == "done"
    assert sorted((name, block) for name, block, _ in resumed.started_servers) == [("baseline", 2), ("candidate", 2)]


def test_a_resumed_duet_measures_a_half_done_step_again_with_both_arms(tmp_path, monkeypatch):
    """A crash with one arm's level of a step done and the other's not: on resume both are measured, together."""
    from harness.run import run_manifest
    from harness.rundir.store import RunDir

    plan = _plan(**DUET)
    run = _runner(tmp_path, monkeypatch, plan)
    manifest = run.run()
    key = next(iter(manifest.arms[0].levels))
    stored = RunDir(tmp_path / "run").manifest()
    candidate = stored.arm("candidate")
    interrupted = run_manifest.changed(candidate.levels[key], status="failed: interrupted during this level")
    stored = run_manifest.changed(stored, arms=(stored.arm("baseline"), run_manifest.changed(
        candidate, levels={**candidate.levels, key: interrupted})))
    resumed = run_manifest.resumed(stored, plan, RunDir(tmp_path / "run"))
    assert [arm.levels[key].status for arm in resumed.arms] == ["pending", "pending"]
    others = [k for k in resumed.arms[0].levels if k != key]
    assert all(arm.levels[k].status == "done" for arm in resumed.arms for k in others)


def test_an_interrupt_during_a_joint_start_stops_the_servers_instead_of_waiting_for_them(monkeypatch):
    """A SIGTERM that reached dsa-bench while both servers of a block were starting waited until both were ready
    (minutes on a loaded host): the executor joined its threads first. Now every child is stopped, the start still
    in flight sees its server exit, and the interrupt goes on at once."""
    import threading
    import time

    from harness.run import procs, server_sessions
    from harness.run.procs import Interrupted

    stopped = threading.Event()
    monkeypatch.setattr(procs, "stop_all", lambda grace_s=20.0: stopped.set())

    def start(arm):
        if arm == "interrupted":
            raise Interrupted("received signal 15")
        if not stopped.wait(timeout=30):        # a server polling /health until its process exits
            raise AssertionError("the server was never stopped")
        return "server exited before it was ready"

    began = time.monotonic()
    with pytest.raises(Interrupted):
        server_sessions._start_all(start, ["slow", "interrupted"])
    assert stopped.is_set() and time.monotonic() - began < 10
