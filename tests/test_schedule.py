"""The run order (:func:`harness.run.start.schedule`): session blocks of several rounds, ABBA over blocks, levels in
a seeded random order per round; and the session each round's rows belong to."""

from collections import Counter

from harness.run import plan as plan_mod
from harness.run.models import locate
from harness.run.scenario import load_scenario
from harness.run.start import round_order, schedule
from fakes.support import StubServer

CPU = plan_mod.Machine(name="cpu", device="planned", cpu_count=2, gpu_count=0, has_triton=False)
RECORDING = "tests/fixtures/recorded/record-sessions.toml"


def _by_concurrency(order):
    """A schedule with each level as its concurrency (these plans have one regime)."""
    return [(name, level.concurrency, r) for name, level, r in order]


def _plan(**workload) -> plan_mod.Plan:
    overrides = {f"workload.{k}": v for k, v in workload.items()}
    scenario = load_scenario(RECORDING, overrides).effective()
    return plan_mod.build_plan(scenario, CPU, locate(scenario))


def test_sequential_blocks_hold_rounds_per_session_rounds_in_abba_order():
    plan = _plan(repeats=3, rounds_per_session=4, concurrency=[1, 2, 4], block_order="abba")
    blocks = []   # (arm, session block, its rounds) in run order
    for arm, _, round_ in schedule(plan):
        if not blocks or blocks[-1][:2] != (arm, plan.block_of(round_)):
            blocks.append((arm, plan.block_of(round_), []))
        if round_ not in blocks[-1][2]:
            blocks[-1][2].append(round_)
    assert [(arm, block) for arm, block, _ in blocks] == [
        ("baseline", 0), ("candidate", 0), ("candidate", 1), ("baseline", 1), ("baseline", 2), ("candidate", 2)]
    assert [rounds for _, _, rounds in blocks] == [[0, 1, 2, 3]] * 2 + [[4, 5, 6, 7]] * 2 + [[8, 9, 10, 11]] * 2


def test_random_block_order_is_a_seeded_coin_per_block_and_keeps_blocks_whole():
    from harness.judge.planning import baseline_first

    from harness.run.workload_spec import WorkloadSpec

    assert WorkloadSpec.model_fields["block_order"].default == "random"
    plan = _plan(repeats=16, rounds_per_session=2, concurrency=[1, 4], block_order="random")
    order = schedule(plan)
    firsts = []
    for block in range(16):
        names = [name for name, _, r in order if plan.block_of(r) == block]
        switches = sum(a != b for a, b in zip(names, names[1:]))
        assert switches == 1 and len(names) == 2 * 2 * 2      # each arm's part of a block is one contiguous run
        firsts.append(names[0] == "baseline")
    assert firsts == [baseline_first(0, block) for block in range(16)]
    assert 0 < sum(firsts) < 16                              # both orders occur
    reseeded = [baseline_first(1, block) for block in range(16)]
    assert reseeded != firsts and schedule(plan) == order    # seeded: the same run order on every call


def test_every_level_and_round_runs_once_per_arm_and_blocks_map_rounds_to_sessions():
    plan = _plan(repeats=3, rounds_per_session=4, concurrency=[1, 2, 4])
    order = schedule(plan)
    assert Counter(order) == Counter((arm.name, c, r) for arm in plan.arms for c, r in plan.levels())
    assert len(order) == 2 * 3 * 4 * 3
    assert [plan.block_of(r) for r in range(plan.rounds())] == [0] * 4 + [1] * 4 + [2] * 4
    for arm in ("baseline", "candidate"):
        blocks = [plan.block_of(r) for name, _, r in order if name == arm]
        assert blocks == sorted(blocks)   # an arm's session blocks run one after another, never interleaved


def test_shuffled_levels_differ_between_rounds_are_seeded_and_the_same_for_both_arms():
    plan = _plan(repeats=4, rounds_per_session=4, concurrency=[1, 2, 4, 8])
    orders = [tuple(level.concurrency for level in round_order(plan, r)) for r in range(plan.rounds())]
    assert all(sorted(o) == [1, 2, 4, 8] for o in orders)
    assert len(set(orders)) > 1
    again = _plan(repeats=4, rounds_per_session=4, concurrency=[1, 2, 4, 8])
    assert orders == [tuple(level.concurrency for level in round_order(again, r)) for r in range(16)]
    reseeded = _plan(repeats=4, rounds_per_session=4, concurrency=[1, 2, 4, 8], seed=1)
    assert [tuple(level.concurrency for level in round_order(reseeded, r)) for r in range(16)] != orders
    order = _by_concurrency(schedule(plan))
    for arm in ("baseline", "candidate"):
        for r in range(plan.rounds()):
            assert tuple(c for name, c, rr in order if name == arm and rr == r) == orders[r]


def test_defaults_keep_one_round_per_session_in_sorted_order():
    plan = _plan(repeats=2, rounds_per_session=1, level_order="sorted", concurrency=[4, 1], block_order="abba")
    assert _by_concurrency(schedule(plan)) == [
        ("baseline", 1, 0), ("baseline", 4, 0), ("candidate", 1, 0), ("candidate", 4, 0),
        ("candidate", 1, 1), ("candidate", 4, 1), ("baseline", 1, 1), ("baseline", 4, 1)]
    assert [plan.block_of(r) for r in range(plan.rounds())] == [0, 1]


def test_concurrent_servers_alternate_arms_per_level_over_all_rounds():
    plan = _plan(repeats=1, rounds_per_session=2, level_order="sorted", concurrency=[1, 4])
    plan = plan_mod.Plan(plan.scenario.model_copy(update={"serve": plan.scenario.serve.model_copy(
        update={"concurrent_servers": True})}), plan.machine, plan.arms)
    assert _by_concurrency(schedule(plan)) == [
        ("baseline", 1, 0), ("candidate", 1, 0), ("candidate", 4, 0), ("baseline", 4, 0),
        ("baseline", 1, 1), ("candidate", 1, 1), ("candidate", 4, 1), ("baseline", 4, 1)]


def test_concurrent_blocks_start_their_abba_sequence_with_the_arm_the_block_order_draws():
    """Each block's first arm is drawn like the sequential order (a seeded coin, or alternating for "abba"), so the
    warm-after-itself carryover of the per-level alternation is not tied to one arm at a level."""
    from harness.judge.planning import baseline_first

    for order in ("random", "abba"):
        plan = _plan(repeats=6, rounds_per_session=1, level_order="sorted", concurrency=[1, 2, 4, 8],
                     block_order=order)
        plan = plan_mod.Plan(plan.scenario.model_copy(update={"serve": plan.scenario.serve.model_copy(
            update={"concurrent_servers": True})}), plan.machine, plan.arms)
        entries = schedule(plan)
        for block in range(6):
            mine = [name for name, _, r in entries if r == block]
            first, second = ("baseline", "candidate") if baseline_first(0, block, order) else ("candidate", "baseline")
            assert mine == [first, second, second, first] * 2
        firsts = [next(name for name, _, r in entries if r == block) for block in range(6)]
        assert set(firsts) == {"baseline", "candidate"}    # both arms lead some blocks (seed 0: not all alike)


def test_runner_starts_one_session_per_arm_and_block_and_rows_of_a_round_get_its_block(tmp_path, monkeypatch):
    from harness.run import runner as runner_mod

    plan = _plan(repeats=3, rounds_per_session=4, concurrency=[1, 4], block_order="abba")
    run = runner_mod.Runner(plan, tmp_path / "run", runner_mod.RunOptions())
    started = []

    def start(arm, block):
        run._new_session(arm.name, 1.0, "http://127.0.0.1:1")
        started.append(arm.name)
        return StubServer()

    monkeypatch.setattr(run, "_start_server", start)
    monkeypatch.setattr(run, "_parity", lambda *_: None)
    arms = {arm.name: arm for arm in plan.arms}
    session_of = {}
    for name, concurrency, round_ in schedule(plan):
        assert run._server_for(arms[name], plan.block_of(round_)) is not None
        assert list(run.servers) == [name]   # sequential: the other arm's server is down
        session_of[(name, concurrency, round_)] = run._session(name)
    assert started == ["baseline", "candidate", "candidate", "baseline", "baseline", "candidate"]
    assert session_of == {key: plan.block_of(key[2]) for key in session_of}


def test_validity_plans_repeats_times_rounds_per_session_rounds():
    import pandas as pd

    from harness.judge.policy import GatePolicy
    from harness.judge.validity import check_validity
    from harness.rundir.schema import REQUEST_COLUMNS, Manifest, Regime

    c1 = Regime("random", 64, 32).at(1)
    manifest = Manifest.model_validate({"run_id": "t", "status": "done",
                                        "scenario": {"workload": {"repeats": 2, "rounds_per_session": 3,
                                                                  "input_len": 64, "output_len": 32}},
                                        "arms": [{"name": "baseline", "route": "baseline"},
                                                 {"name": "candidate", "route": "candidate"}]})
    rows = [{"arm": arm, "session": r // 3, "round": r, "concurrency": 1, "completed": 8, "failed": 0,
             "output_throughput": 100.0} for arm in ("baseline", "candidate") for r in range(6)]
    policy = GatePolicy(primary=("output_throughput",), require_attestation=False)
    report = check_validity(manifest, pd.DataFrame(rows), pd.DataFrame(columns=REQUEST_COLUMNS), policy)
    assert report.done[("baseline", c1)] == set(range(6)) and not report.reasons
    short = check_validity(manifest, pd.DataFrame(rows[:-1]), pd.DataFrame(columns=REQUEST_COLUMNS), policy)
    assert [r for r, _ in short.reasons[("candidate", c1)]] == [5]


def test_a_port_taken_before_vllm_binds_it_is_retried_on_a_new_port(tmp_path, monkeypatch):
    from harness.run import runner as runner_mod, server_sessions

    plan = _plan(repeats=1, rounds_per_session=1, concurrency=[1])
    run = runner_mod.Runner(plan, tmp_path / "run", runner_mod.RunOptions())
    ports = []

    class FlakyServer:
        def __init__(self, argv, env, port, name, log_path, api_key=None, watchdog=False):
            ports.append(port)
            self.log_path = log_path

        def start(self, timeout):
            if len(ports) == 1:
                raise server_sessions.ServerError("server exited with code 1 before it was ready, last lines:\n"
                                                  "OSError: [Errno 98] Address already in use")
            raise server_sessions.ServerError("server exited with code 1 before it was ready")

    monkeypatch.setattr(server_sessions, "VllmServer", FlakyServer)   # where the runner's server sessions start
    ports_free = iter([40001, 40002, 40003])
    monkeypatch.setattr(server_sessions, "free_port", lambda: next(ports_free))
    import pytest

    with pytest.raises(server_sessions.ServerError, match="code 1 before it was ready$"):
        run._start_server(plan.arms[0], 0)
    assert ports == [40001, 40002]   # retried once on a new port, then the other failure is raised as it is
