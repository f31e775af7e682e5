"""harness.run.run_manifest: the typed manifest the runner writes (RunManifest, RunArm, ManifestWriter) and the
reader's view of it — the same JSON, whatever the writer's types."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from dsa_route.routing import RouteDecision
from harness.run import run_manifest
from harness.run.plan import Machine, build_plan
from harness.run.scenario import load_scenario
from harness.rundir import schema
from harness.rundir.files import json_text
from harness.rundir.schema import LevelKey, Manifest, Observation, RemoteObservation
from harness.rundir.store import RunDir

CPU = Machine(name="cpu", device="test cpu", cpu_count=2, gpu_count=0, has_triton=False)


@pytest.fixture
def plan(tmp_path, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    scenario = load_scenario("cpu-tiny-dsa", {"serve.env": {"HF_TOKEN": "hf-secret"}, "workload.repeats": 1}
                             ).effective()
    return build_plan(scenario, CPU, ("/models/tiny", "/models/tiny"))


@pytest.fixture
def writer(plan, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    manifest = run_manifest.initial(plan, run_dir, remote=True, aa_check=None)
    return run_manifest.ManifestWriter(manifest, RunDir(run_dir))


def test_the_writers_types_write_what_the_reader_reads(writer, plan):
    manifest = writer.manifest
    assert manifest.scenario is plan.scenario and isinstance(manifest.arms[0].decision, RouteDecision)
    data = json.loads(json_text(manifest))
    assert data["scenario"]["serve"]["env"]["HF_TOKEN"] == "<redacted>"            # secrets never written
    assert manifest.scenario_value("serve", "env", "HF_TOKEN") == "<redacted>"
    assert [arm["decision"] for arm in data["arms"]] == [arm.decision.to_dict() for arm in plan.arms]
    assert all(arm["observed"] == {} for arm in data["arms"])                       # nothing observed yet
    read = Manifest.model_validate(data)
    assert json_text(read) == json_text(manifest)                                   # the same document either way


def test_a_change_is_validated_when_made(writer):
    with pytest.raises(TypeError, match="no field stauts"):
        writer.update_level("baseline", _first_key(writer), stauts="done")
    with pytest.raises(ValidationError):
        writer.update_arm("baseline", sessions="not sessions")
    writer.add_session("baseline", server_start_s=1.5, base_url="http://x:1", startup={"ready_s": 1.5})
    writer.place("baseline", schema.Placement(block=0))
    arm = writer.arm("baseline")
    assert (arm.sessions[0].index, arm.server_start_s, arm.placement) == (0, 1.5, arm.sessions[0].placement)
    assert arm.sessions[0].startup.ready_s == 1.5


def _first_key(writer) -> LevelKey:
    """The first level key of the run (round 0 of its first level)."""
    return writer.arm("baseline").level_items()[0][0]


def test_pending_levels_settle_and_the_run_closes(writer):
    key = _first_key(writer)
    writer.update_level("baseline", key, status="done", session=0)
    writer.settle_pending("stopped: a deciding look")
    assert writer.complete()
    writer.finish({k: 1.0 for k in ("server_start_s", "benchmark_s", "parity_s", "gsm8k_s", "pilot_s")}, 10.0, "done")
    manifest = writer.manifest
    assert manifest.status == "done" and manifest.timing["harness_overhead_s"] == 5.0
    assert manifest.platform.load_avg_at_end and manifest.ended_at
    assert manifest.arm("baseline").levels[str(key)].status == "done"


def test_resume_types_the_stored_observations_and_sets_unfinished_levels_pending(writer, plan):
    key = _first_key(writer)
    writer.update_arm("baseline", observed=Observation(route="baseline", errors=("ERROR x",)))
    writer.update_arm("candidate", observed=RemoteObservation(served_models=("m",)))
    writer.update_level("baseline", key, status="done")
    writer.update_level("candidate", key, status="failed: server died")
    writer.save()
    stored = writer.store.manifest()
    assert isinstance(stored.arm("baseline").observed, dict)                       # readers keep plain data
    resumed = run_manifest.resumed(stored, plan, writer.store)
    baseline, candidate = resumed.arms
    assert isinstance(baseline.observed, Observation) and baseline.observed.errors == ("ERROR x",)
    assert isinstance(candidate.observed, RemoteObservation)
    assert baseline.levels[str(key)].status == "done"
    assert (candidate.levels[str(key)].status, candidate.levels[str(key)].previous) == ("pending",
                                                                                        "failed: server died")
    assert len(resumed.resumed_at) == 1 and resumed.status == "running"
