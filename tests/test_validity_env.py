"""The arms' environment as validity checks: identical installed packages unless the scenario declares the
difference, and idle GPUs before every server session (nvidia-smi readings recorded per session)."""

import importlib.util
import json
from pathlib import Path

import pytest

from harness.judge import verdict
from harness.judge.policy import GatePolicy, Status
from harness.run import builds
from harness.run.gpu_idle import parse_query, visible

_SPEC = importlib.util.spec_from_file_location(
    "aa_split", Path(__file__).parent / "fixtures" / "recorded" / "aa_split.py")
aa = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(aa)

POLICY = GatePolicy(primary=("output_throughput", "mean_tpot_ms"), min_sessions=2)
SAME = ["numpy==2.1.0", "torch==2.13.0", "vllm==0.32.0"]


@pytest.fixture(scope="module")
def run4():
    return aa.aa_run(4)


def _with_builds(run, baseline_packages, candidate_packages, **arm_keys):
    manifest, levels, requests = json.loads(json.dumps(run[0])), run[1].copy(), run[2].copy()
    for name, packages in (("baseline", baseline_packages), ("candidate", candidate_packages)):
        aa.arm(manifest, name)["build"] = {"packages": packages, "packages_sha256": str(hash(tuple(packages)))}
    for name, keys in arm_keys.items():
        manifest["scenario"].setdefault("arms", {}).setdefault(name, {}).update(keys)
    return verdict.evaluate(*aa.typed((manifest, levels, requests)), None, POLICY, diagnostics=False)


def test_identical_packages_pass_the_check(run4):
    result = _with_builds(run4, SAME, SAME)
    assert not [f for f in result.validity.failures if f["check"] == "packages"]
    assert not any("installed packages" in n for n in result.notes)


def test_undeclared_package_difference_invalidates_throughput_and_latency(run4):
    other = ["numpy==2.1.0", "torch==2.12.0", "vllm==0.32.0"]
    result = _with_builds(run4, SAME, other)
    assert all(c.status == Status.INVALID for c in result.primary)
    assert all("torch==2.12.0, torch==2.13.0" in c.note() for c in result.primary)
    assert result.status == Status.INVALID


@pytest.mark.parametrize("declaration", [{"packages_differ": True}, {"vllm": "/opt/pr-venv/bin/vllm"}])
def test_a_declared_difference_is_expected(run4, declaration):
    result = _with_builds(run4, SAME, SAME[:2] + ["vllm==0.33.0"], candidate=declaration)
    assert not [f for f in result.validity.failures if f["check"] == "packages"]


def test_no_package_record_is_said_not_checked(run4):
    result = verdict.evaluate(*aa.typed(run4), None, POLICY, diagnostics=False)
    assert any("installed packages" in n for n in result.notes)


def test_build_record_lists_this_environments_packages():
    class Arm:
        vllm, server_env = None, {}

    record = builds.record(Arm())
    assert record["error"] is None, record["error"]
    assert any(p.startswith("pydantic==") for p in record["packages"]) and record["packages"] == sorted(
        record["packages"])
    assert len(record["packages_sha256"]) == 64


# ------------------------------------------------------------------------------------------------------ GPUs idle

NVIDIA_SMI = "0, 0, 4\n1, 87, 61234\n2, [N/A], 3\n"


def test_nvidia_smi_query_is_parsed():
    gpus = parse_query(NVIDIA_SMI)
    assert [g["index"] for g in gpus] == [0, 1, 2]
    assert gpus[1] == {"index": 1, "utilization_pct": 87.0, "memory_used_mib": 61234.0}
    with pytest.raises(ValueError, match="nvidia-smi"):
        parse_query("GPU 0: busy\n")


def test_visible_devices():
    assert visible({"CUDA_VISIBLE_DEVICES": "0,2"}) == {0, 2}
    assert visible({}) is None and visible({"CUDA_VISIBLE_DEVICES": "GPU-abc"}) is None


def _with_gpus(run, readings):
    manifest, levels, requests = json.loads(json.dumps(run[0])), run[1].copy(), run[2].copy()
    for session in aa.arm(manifest, "candidate")["sessions"]:
        session["gpus_before"] = readings.get(session["index"], [])
    for session in aa.arm(manifest, "baseline")["sessions"]:
        session["gpus_before"] = []
    return verdict.evaluate(*aa.typed((manifest, levels, requests)), None, POLICY, diagnostics=False)


def test_a_session_started_on_busy_gpus_invalidates_its_levels(run4):
    busy = {1: [g for g in parse_query(NVIDIA_SMI) if g["index"] == 1]}
    result = _with_gpus(run4, busy)
    flagged = [f for f in result.validity.failures if f["check"] == "gpus_busy"]
    assert flagged and {f["arm"] for f in flagged} == {"candidate"}
    assert {f["round"] for f in flagged} == {1}                  # aa_run: session k holds round k
    assert all(c.status == Status.INVALID and "GPUs were busy" in c.note() for c in result.primary)


def test_idle_gpus_pass_and_missing_readings_are_said(run4):
    idle = _with_gpus(run4, {0: [g for g in parse_query(NVIDIA_SMI) if g["index"] == 0]})
    assert not [f for f in idle.validity.failures if f["check"] == "gpus_busy"]
    plain = verdict.evaluate(*aa.typed(run4), None, POLICY, diagnostics=False)
    assert any("idle GPUs" in n for n in plain.notes)


def test_a_cpu_platform_has_no_gpus_to_check_and_says_nothing_of_them(run4):
    manifest = json.loads(json.dumps(run4[0]))
    manifest["platform"] = {**manifest.get("platform", {}), "name": "cpu"}
    for name in ("baseline", "candidate"):
        for session in aa.arm(manifest, name)["sessions"]:
            session["gpus_before"], session["gpu_note"] = None, "nvidia-smi not found: GPU idleness not checked"
    result = verdict.evaluate(*aa.typed((manifest, run4[1], run4[2])), None, POLICY, diagnostics=False)
    assert not any("idle GPUs" in n for n in result.notes)
    manifest["platform"]["name"] = "cuda"
    result = verdict.evaluate(*aa.typed((manifest, run4[1], run4[2])), None, POLICY, diagnostics=False)
    assert any("nvidia-smi not found" in n for n in result.notes)


def test_before_session_reads_the_arms_gpus_or_says_why_not(tmp_path, monkeypatch):
    from harness.run.gpu_idle import before_session

    monkeypatch.setenv("PATH", str(tmp_path))
    assert before_session({})["note"].startswith("nvidia-smi not found")
    fake = tmp_path / "nvidia-smi"          # a stand-in printing a recorded query answer
    fake.write_text(f"#!/bin/sh\nprintf '{NVIDIA_SMI}'\n")
    fake.chmod(0o755)
    reading = before_session({"CUDA_VISIBLE_DEVICES": "1,2"})
    assert reading["note"] is None and [g["index"] for g in reading["gpus"]] == [1, 2]
