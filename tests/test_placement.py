"""Placement (pure): slots, per-block swaps, the [cluster] table and its CLI flags, multi-node commands, and the
cluster facts read from plain data (version skew, Ray worker IPs, NCCL transport)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.run import cluster
from harness.run.placement import (Slot, assignments, id_list, needs_multi_node, parse_id_list, parse_place_flag,
                                   slot_for)
from harness.run.plan import Machine, ModelLocation, build_plan, check_machine, executor_backend
from harness.run.scenario import ScenarioError, load_scenario

FIXTURES = Path(__file__).parent / "fixtures"
A = Slot(backend="ray", resource="node_a", cpu_cores=(0, 1))
B = Slot(backend="ray", label=(("zone", "b"),), gpu_ids=(2, 3))


# ------------------------------------------------------------------------------------------------ slots and blocks
def test_id_lists_round_trip_in_vllms_syntax():
    assert id_list([5, 0, 1, 2]) == "0-2,5" and parse_id_list("0-2,5") == (0, 1, 2, 5)
    assert parse_id_list("3") == (3,)
    for bad in ("a", "3-1", "1,,2", "-1"):
        with pytest.raises(ValueError, match="id list"):
            parse_id_list(bad)


def test_a_slot_pins_cores_and_gpus_through_the_environment():
    assert A.env() == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert B.env() == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert Slot().env() == {}
    assert "resource node_a" in A.describe() and "label zone=b" in B.describe()


def test_swapping_exchanges_the_two_arms_slots_on_odd_blocks_only():
    slots = {"baseline": A, "candidate": B}
    assert [slot_for(block, "baseline", slots, swap=True) for block in range(4)] == [A, B, A, B]
    assert [slot_for(block, "candidate", slots, swap=True) for block in range(4)] == [B, A, B, A]
    assert [slot_for(block, "baseline", slots, swap=False) for block in range(3)] == [A, A, A]
    with pytest.raises(ValueError, match="exactly two arms"):
        slot_for(1, "baseline", {"baseline": A}, swap=True)


def test_assignments_list_every_block_and_arm():
    rows = assignments(["baseline", "candidate"], 2, {"baseline": A, "candidate": B}, swap=True)
    assert [(row["block"], row["arm"], row["resource"], row["label"]) for row in rows] == [
        (0, "baseline", "node_a", None), (0, "candidate", None, {"zone": "b"}),
        (1, "baseline", None, {"zone": "b"}), (1, "candidate", "node_a", None)]


def test_each_arm_and_block_is_in_one_place_and_swapped_blocks_balance():
    """Over an even number of swapped blocks every arm spends as many blocks in each slot (the node effect cancels)."""
    slots = {"baseline": A, "candidate": B}
    for blocks in (2, 4, 6):
        for arm in slots:
            used = [slot_for(block, arm, slots, swap=True) for block in range(blocks)]
            assert used.count(A) == used.count(B) == blocks // 2
        for block in range(blocks):   # the two arms never share a slot in a block
            assert slot_for(block, "baseline", slots, True) != slot_for(block, "candidate", slots, True)


def test_place_flags_parse_into_the_cluster_arm_table():
    assert parse_place_flag("node=abc;cores=0-1") == {"node": "abc", "cpu_cores": "0-1"}
    assert parse_place_flag("label=zone:a;label=rack:7;gpus=0,1") == {"label": {"zone": "a", "rack": "7"},
                                                                      "gpu_ids": "0,1"}
    for bad, needle in (("nod=x", "unknown placement key"), ("label=zone", "label=KEY:VALUE"), ("node", "KEY=VALUE")):
        with pytest.raises(ValueError, match=needle):
            parse_place_flag(bad)


def test_multi_node_when_the_world_exceeds_one_nodes_gpus():
    assert needs_multi_node(8, 2, 8) and needs_multi_node(16, 1, 8)
    assert not needs_multi_node(8, 1, 8) and not needs_multi_node(4, 4, None) and not needs_multi_node(2, 1, 0)


# ------------------------------------------------------------------------------------------------ the [cluster] table
def _scenario(**overrides):
    return load_scenario("cpu-tiny", overrides)


def test_default_is_the_local_backend_with_no_placement():
    spec = _scenario().cluster
    assert spec.backend == "local" and not spec.swap_nodes
    assert spec.slots() == {"baseline": Slot(), "candidate": Slot()}


def test_a_cluster_table_validates_into_slots():
    spec = _scenario(**{"cluster.backend": "ray", "cluster.address": "auto", "cluster.swap_nodes": True,
                        "cluster.arms.baseline": {"resource": "node_a", "cpu_cores": "0"},
                        "cluster.arms.candidate": {"label": {"zone": "b"}, "cpu_cores": [1]}}).cluster
    assert spec.slots() == {"baseline": Slot("ray", resource="node_a", cpu_cores=(0,)),
                            "candidate": Slot("ray", label=(("zone", "b"),), cpu_cores=(1,))}


@pytest.mark.parametrize("overrides, needle", [
    ({"cluster.backend": "slurm"}, "unknown cluster.backend 'slurm'; use one of local, ray"),
    ({"cluster.arms.baseline": {"node": "abc"}}, 'picks a Ray node but cluster.backend is "local"'),
    ({"cluster.backend": "ray", "cluster.arms.baseline": {"node": "a", "resource": "r"}}, "pick the node by one of"),
    ({"cluster.arms.baseline": {"cpu_cores": "0-1"}, "cluster.arms.candidate": {"cpu_cores": "1"}},
     "both arms claim CPU cores [1]"),
    ({"cluster.swap_nodes": True}, "both arms have the same placement"),
    ({"cluster.arms.judge": {}}, "[cluster.arms.judge] is not an arm"),
    ({"cluster.arms.baseline": {"cpu_cores": "x"}}, "is not an id list"),
    ({"cluster.backend": "ray", "cluster.address": " "}, "cluster.address is empty"),
])
def test_bad_cluster_values_are_one_line_naming_the_fix(overrides, needle):
    with pytest.raises(ScenarioError) as error:
        _scenario(**overrides)
    assert needle in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("flags, needle", [
    (["--place-baseline", "nod=1"], "--place-baseline: 'nod=1': unknown placement key"),
    (["--place-baseline", "node=abc"], 'cluster.backend is "local"'),
    (["--swap-nodes"], "both arms have the same placement"),
])
def test_bad_cluster_flags_exit_2_with_one_line(flags, needle, capsys):
    assert main(["plan", "--scenario", "cpu-tiny", *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


# ------------------------------------------------------------------------------------------------ multi-node commands
CUDA = Machine(name="cuda", device="test", cpu_count=16, gpu_count=8, has_triton=True)


def _plan(**overrides):
    scenario = load_scenario("deepseek-v3.2-fp8-tp8", overrides).effective()
    check_machine(scenario, CUDA)
    return build_plan(scenario, CUDA, ModelLocation("/models/ds", "/models/ds"))


def test_an_arm_larger_than_a_node_is_served_with_vllms_ray_executor():
    plan = _plan(**{"serve.tensor_parallel_size": 8, "serve.pipeline_parallel_size": 2, "cluster.backend": "ray",
                    "cluster.gpus_per_node": 8})
    assert executor_backend(plan.scenario) == "ray"
    for arm in plan.arms:
        argv = arm.server_argv(8000)
        assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"


def test_an_arm_within_a_node_keeps_vllms_own_executor():
    plan = _plan(**{"cluster.backend": "ray", "cluster.gpus_per_node": 8})
    assert executor_backend(plan.scenario) == "mp"
    assert all("--distributed-executor-backend" not in arm.server_argv(8000) for arm in plan.arms)
    assert all("--pipeline-parallel-size" not in arm.server_argv(8000) for arm in plan.arms)
    assert _plan().arms[0].server_argv(1, host="10.0.0.2")[3:7] == ["--host", "10.0.0.2", "--port", "1"]


# ------------------------------------------------------------------------------------------------ cluster facts
def test_node_records_and_version_skew():
    node = {"NodeID": "n1", "NodeManagerAddress": "10.0.0.2", "Alive": True, "Resources": {"CPU": 2.0, "node_a": 1},
            "Labels": {"zone": "a"}}
    record = cluster.node_record(node, {"ray": "2.60.0"})
    assert record == {"node_id": "n1", "ip": "10.0.0.2", "alive": True, "labels": {"zone": "a"},
                      "resources": {"CPU": 2.0, "node_a": 1.0}, "versions": {"ray": "2.60.0"}}
    versions = {"n1": {"ray": "2.60.0", "vllm": "0.32.0"}, "n2": {"ray": "2.60.0", "vllm": "0.31.1"}}
    (problem,) = cluster.version_skew("candidate", ["n1", "n2", "n1"], versions)
    assert "candidate: its nodes run different vllm versions" in problem and "allow_version_skew" in problem
    assert cluster.version_skew("candidate", ["n1", "n1"], versions) == []
    assert cluster.version_skew("candidate", ["n1", "n3"], versions) == []   # nothing known of n3


def test_nccl_transport_and_worker_ips_from_server_logs():
    ib = (FIXTURES / "nccl" / "two-node-ib.log").read_text()
    socket = (FIXTURES / "nccl" / "two-node-socket.log").read_text()
    assert cluster.nccl_transport(ib) == "NET/IB" and cluster.nccl_transport(socket) == "NET/Socket"
    assert cluster.nccl_transport("INFO Starting vLLM server on http://127.0.0.1:8000") is None
    assert cluster.nccl_transport("x NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC") == "P2P"
    assert cluster.worker_ips(ib) == ["10.0.0.2", "10.0.0.3"] and cluster.worker_ips("no prefix") == []
    note = cluster.transport_note("candidate", "NET/Socket", "cuda", multi_node=True)
    assert note and "NET/Socket" in note
    assert cluster.transport_note("candidate", "NET/IB", "cuda", multi_node=True) is None
    assert cluster.transport_note("candidate", None, "cpu", multi_node=True) is None
    assert "NCCL_DEBUG=INFO" in cluster.transport_note("candidate", None, "cuda", multi_node=True)


# ------------------------------------------------------------------------------------------------ the reaper
def test_the_reaper_ends_a_process_group_whose_owner_died(tmp_path):
    """An owner spawns ``sleep`` with a watchdog and is SIGKILLed: the reaper ends the orphaned group."""
    pid_file = tmp_path / "child.pid"
    owner = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from harness.run import procs; "
        "child = procs.spawn(['sleep', '300'], {'PATH': '/usr/bin:/bin', 'PYTHONPATH': sys.argv[2]}, None, "
        "watchdog=True); Path(sys.argv[1]).write_text(str(child.pid)); time.sleep(300)"),
        str(pid_file), str(Path(__file__).resolve().parents[1])], env={**os.environ})
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pid_file.read_text())
        os.kill(child, 0)          # running
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 30
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(child)
    finally:
        owner.kill()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_a_session_placement_names_where_it_ran_and_how_vllm_spread_its_workers():
    scenario = load_scenario("deepseek-v3.2-fp8-tp8", {"serve.tensor_parallel_size": 8,
                                                         "serve.pipeline_parallel_size": 2, "cluster.backend": "ray",
                                                         "cluster.gpus_per_node": 8})
    log = (FIXTURES / "nccl" / "two-node-socket.log").read_text()
    nodes = [{"node_id": "head", "ip": "10.0.0.2"}, {"node_id": "worker", "ip": "10.0.0.3"}]
    record = cluster.session_placement(scenario, B, 1, {"node_id": "head", "ip": "10.0.0.2"}, log, nodes)
    assert record == {"backend": "ray", "block": 1, "requested": {"label": {"zone": "b"}}, "node": "head",
                      "node_ip": "10.0.0.2", "cpu_cores": None, "gpu_ids": [2, 3], "executor_backend": "ray",
                      "world_size": 16, "nodes": ["head", "worker"], "nccl_transport": "NET/Socket"}
    local = cluster.session_placement(load_scenario("cpu-tiny"), Slot(cpu_cores=(1,)), 0, {}, "", [])
    assert (local["node"], local["nodes"], local["executor_backend"], local["cpu_cores"]) == (None, [], "uni", [1])


def test_ray_actor_options_follow_the_slot():
    ray_backend = pytest.importorskip("harness.run.ray_backend")
    by_node = ray_backend._options(Slot("ray", node="ab" * 28))
    assert by_node["scheduling_strategy"].node_id == "ab" * 28 and by_node["scheduling_strategy"].soft is False
    assert ray_backend._options(B)["label_selector"] == {"zone": "b"}
    assert ray_backend._options(A)["resources"] == {"node_a": 0.001}
    assert all(options["num_cpus"] == 0 for options in (by_node, ray_backend._options(Slot("ray"))))
    assert "scheduling_strategy" not in ray_backend._options(Slot("ray"))
