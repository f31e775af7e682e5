"""The Ray backend on a simulated cluster (``ray.cluster_utils.Cluster``: two nodes on this host, one CPU each, told
apart by the custom resources ``node_a`` / ``node_b``): each arm on its own node, placements swapped per block.

- a real CPU compare (vLLM CPU serving the tiny DeepSeek-V3 with dummy weights, one level, few prompts, two blocks)
  writes the same run directory as a local run and a verdict;
- killing a server's actor mid-level fails that level, keeps the rest and leaves no process;
- Ctrl-C of ``dsa-bench compare`` leaves nothing on any node.

The last two use the fake ``vllm`` (tests/fakes/fake_vllm.py) with vLLM's real benchmark client. One cluster for the
module, started before any test sets its process tag, so Ray's own processes never carry it and
:func:`fakes.support.leftovers` sees only what the runs started (servers, reapers, benchmark clients).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import threading
from pathlib import Path

import pandas as pd
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from fakes.support import (DSA_BENCH, REPO, clean_environ, fake_env, leftovers, scenario_copy,  # noqa: E402
                           spawn_sigint_ignored, wait_for)
from harness.cli import main  # noqa: E402
from harness.run import procs  # noqa: E402
from harness.rundir import schema  # noqa: E402
from harness.rundir.store import RunDir  # noqa: E402

pytestmark = pytest.mark.slow

PLACE = ["--cluster-backend", "ray", "--place-baseline", "resource=node_a", "--place-candidate", "resource=node_b"]


@pytest.fixture(scope="module")
def cluster():
    """Two simulated Ray nodes; shut down after the module."""
    simulated = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1},
                                                              "include_dashboard": False})
    simulated.add_node(num_cpus=1, resources={"node_b": 1})
    simulated.wait_for_nodes()
    yield simulated
    if ray.is_initialized():
        ray.shutdown()
    simulated.shutdown()


def _cli(*argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, err.getvalue()


def _manifest(out: Path) -> tuple[Path, dict]:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir, json.loads((run_dir / schema.MANIFEST).read_text(encoding="utf-8"))


@pytest.fixture
def isolated(monkeypatch):
    """No process-wide signal handlers from the CLI in pytest; wide console lines."""
    monkeypatch.setattr(procs, "cleanup_on_exit", lambda: None)
    monkeypatch.setenv("COLUMNS", "400")
    for key in [k for k in os.environ if k.startswith("FAKE_VLLM_") or k == "DSA_BENCH_VLLM"]:
        monkeypatch.delenv(key)


@pytest.mark.heavy
def test_real_cpu_compare_each_arm_on_its_node_swapped_per_block(cluster, isolated, tmp_path, monkeypatch):
    # Both arms' servers start at once, one per node (a swapped block starts a fresh pair): 2 start times, not 4.
    scenario = scenario_copy(tmp_path, ready_timeout_s="ready_timeout_s = 600",
                             concurrent_servers="concurrent_servers = true")
    out = tmp_path / "results"
    code, err = _cli("compare", "--scenario", scenario, "--out", out, "--concurrency", "1", "--num-prompts", "4",
                     "--repeats", "2", "--ray-address", cluster.address, "--swap-nodes", *PLACE)
    run_dir, manifest = _manifest(out)
    assert code == 0, err[-4000:]
    check_swapped_run(run_dir, manifest)


def check_swapped_run(run_dir: Path, manifest: dict) -> None:
    """A two-block run with baseline on node_a and candidate on node_b in block 0, swapped in block 1."""
    assert RunDir(run_dir).manifest().cluster is not None        # the typed schema reads it back
    by_resource = {name: node["node_id"] for node in manifest["cluster"]["nodes"] for name in node["resources"]}
    node_a, node_b = by_resource["node_a"], by_resource["node_b"]
    cluster_record = manifest["cluster"]
    assert cluster_record["backend"] == "ray" and cluster_record["swap_nodes"] is True
    assert {node["node_id"] for node in cluster_record["nodes"]} == {node_a, node_b}
    assert all(node["versions"]["ray"] == ray.__version__ and node["versions"]["vllm"]
               for node in cluster_record["nodes"])
    arms = {arm["name"]: arm for arm in manifest["arms"]}
    # block 0: baseline on node_a, candidate on node_b; block 1 swapped — each session ran where it was assigned
    ran = {(arm, session["placement"]["block"]): session["placement"]["node"]
           for arm, entry in arms.items() for session in entry["sessions"]}
    assert ran == {("baseline", 0): node_a, ("candidate", 0): node_b,
                   ("baseline", 1): node_b, ("candidate", 1): node_a}
    assert all(entry["attestation"]["valid"] for entry in arms.values()), [e["attestation"] for e in arms.values()]
    levels = pd.read_csv(run_dir / schema.LEVELS)
    assert len(levels) == 4 and (levels["output_throughput"] > 0).all() and set(levels["session"]) == {0, 1}
    for arm in arms:   # the servers' logs came back from their nodes into the run directory
        assert "Starting vLLM server on" in (run_dir / schema.LOGS_DIR / f"{arm}-server.log").read_text()
    assert (run_dir / "verdict.json").is_file() and (run_dir / schema.REPORT).is_file()
    # a valid verdict: throughput judged on its data; INVALID only from the coalesced-stream check on TPOT (vLLM CPU
    # streams a share of these tiny requests in one burst, as in tests/test_gate_e2e.py), never from the placement
    verdict = json.loads((run_dir / "verdict.json").read_text())
    throughput = [cell for cell in verdict["cells"] if cell["metric"] == "output_throughput"]
    assert throughput and all(cell["result"] != "INVALID" for cell in throughput), verdict["reason"]
    invalid = [cell for cell in verdict["cells"] if cell["result"] == "INVALID"]
    assert all(cell["metric"] == "mean_tpot_ms" for cell in invalid), verdict["reason"]
    assert verdict["overall"] != "INVALID" or "burst" in verdict["reason"], verdict["reason"]


def test_killing_a_server_actor_mid_level_fails_that_level_keeps_the_rest(cluster, isolated, tmp_path, monkeypatch):
    env = fake_env(tmp_path, delay_s_candidate="0.3")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from harness.run import ray_backend

    started: list = []
    real_start = ray_backend.RayServer.start

    def recording_start(self, timeout_s):
        started.append(self)
        return real_start(self, timeout_s)

    monkeypatch.setattr(ray_backend.RayServer, "start", recording_start)
    requests_log = Path(env["FAKE_VLLM_REQLOG"])

    def kill_candidate_mid_level():
        if wait_for(lambda: requests_log.exists() and requests_log.read_text().count("candidate stream") >= 2, 240):
            ray.kill(next(server for server in started if server.arm.name == "candidate").actor)

    killer = threading.Thread(target=kill_candidate_mid_level, daemon=True)
    killer.start()
    code, err = _cli("compare", "--scenario", scenario_copy(tmp_path), "--out", tmp_path / "results",
                     "--num-prompts", "8", "--ray-address", cluster.address, *PLACE)
    killer.join(timeout=10)
    run_dir, manifest = _manifest(tmp_path / "results")
    statuses = {arm["name"]: {f"c{key.concurrency}-r{key.round}": v["status"] for k, v in arm["levels"].items()
                              if (key := schema.LevelKey.parse(k))} for arm in manifest["arms"]}
    assert code == 1, err[-4000:]
    assert statuses["baseline"] == {"c1-r0": "done", "c2-r0": "done"}
    assert statuses["candidate"]["c1-r0"].startswith("failed: ") and statuses["candidate"]["c2-r0"].startswith(
        "skipped: ")
    levels = pd.read_csv(run_dir / schema.LEVELS)
    assert set(levels["arm"]) == {"baseline"} and len(levels) == 2
    assert leftovers(env) == []          # the reaper ended the killed actor's server


def test_ctrl_c_leaves_nothing_on_any_node(cluster, tmp_path):
    env = fake_env(tmp_path, delay_s_candidate="0.3")
    base = {**clean_environ(), **env, "COLUMNS": "400", "PYTHONPATH": str(REPO)}
    requests_log = Path(env["FAKE_VLLM_REQLOG"])
    proc = spawn_sigint_ignored([DSA_BENCH, "compare", "--scenario", scenario_copy(tmp_path), "--out",
                                tmp_path / "results", "--ray-address", cluster.address, *PLACE], base)
    try:
        assert wait_for(lambda: (requests_log.exists() and requests_log.read_text().count("candidate stream") >= 2)
                        or proc.poll() is not None, 240)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert leftovers(env) == []          # servers, reapers and benchmark clients on both nodes: all gone
    _, manifest = _manifest(tmp_path / "results")
    assert manifest["status"] == "interrupted"
