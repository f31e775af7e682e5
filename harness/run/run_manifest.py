"""A run's ``manifest.json`` as the runner starts it — fresh from the plan (:func:`initial`), or a stored one taken
up again by ``--resume`` (:func:`resumed`) — and as it ends it (:func:`finish`). Schema: :class:`harness.rundir.schema.Manifest`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsa_route.inject import ENV_INJECT, parse_injection
from harness.run import builds, cluster as cluster_info, machine as machine_mod
from harness.run.estimate import estimate
from harness.run.plan import ArmPlan, Plan
from harness.run.scenario import REPO_ROOT
from harness.run.start import load_avg, now, redact_env, redacted_scenario, schedule
from harness.rundir import schema
from harness.rundir.schema import LevelKey, Manifest
from harness.rundir.store import RunDir

__all__ = ["finish", "initial", "resumed"]


def initial(plan: Plan, run_dir: Path, *, remote: bool, aa_check: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest of a new run into ``run_dir``: every level pending. ``remote``: the servers were started by other
    tooling (no build of ours to record); ``aa_check``: the [cluster] aa_check run's record."""
    first_c, first_r = plan.levels()[0]
    arms = []
    for arm in plan.arms:
        arms.append({
            "name": arm.name, "route": arm.route, "description": arm.description, "decision": arm.decision.to_dict(),
            "unavailable": list(arm.unavailable),
            "server_command": arm.server_argv("<port>"), "server_env": redact_env(arm.server_env),
            "bench_command": plan.bench_argv(arm, first_c, first_r, "http://127.0.0.1:<port>",
                                            run_dir / schema.RAW_DIR),
            "intended": arm.intended, "observed": {}, "attestation": {"valid": None, "mismatches": []},
            "server_start_s": None, "base_url": None, "placement": None, "injection": _injection_record(arm),
            "sessions": [], "build": None if remote else builds.record(arm),
            "levels": {str(key): {"status": "pending"} for key in plan.levels()},
        })
    return {
        "schema_version": schema.SCHEMA_VERSION, "run_id": run_dir.name, "status": "running",
        "started_at": now(), "ended_at": None, "scenario_name": plan.scenario.name,
        "scenario_file": plan.scenario_file,
        "scenario": redacted_scenario(plan.scenario.model_dump(mode="json")),
        "platform": {**plan.machine.to_dict(), "load_avg_at_start": load_avg()},
        "versions": machine_mod.versions(), "git_sha": machine_mod.git_sha(REPO_ROOT),
        "notes": list(plan.notes), "schedule": [list(item) for item in schedule(plan)], "arms": arms,
        "timing": {}, "resumed_at": [], "estimate": estimate(plan).to_dict(), "aa_check": aa_check,
        "cluster": cluster_info.manifest_record(
            plan.scenario.cluster, [arm.name for arm in plan.arms], plan.scenario.workload.repeats),
    }


def resumed(stored: Manifest, store: RunDir) -> dict[str, Any]:
    """The stored manifest with every level that is not ``done`` set back to pending, and the CSVs cut back to the
    rows of done levels (a crash between the two CSV appends leaves no orphan rows). Under a duet a level whose
    partner in the other arm is not done is measured again too: a duet level is only valid beside its partner."""
    manifest = stored.model_dump(mode="json")
    if (manifest["scenario"].get("serve") or {}).get("duet"):
        _unpair_half_done_steps(manifest)
    done = set()
    for entry in manifest["arms"]:
        for key, level in entry["levels"].items():
            if level.get("status") == "done" and LevelKey.parse(key) is not None:
                done.add((entry["name"], LevelKey.parse(key)))
            elif level.get("status") != "done":
                entry["levels"][key] = {"status": "pending", "previous": level.get("status")}
    store.keep_levels(done)
    manifest["resumed_at"].append(now())
    manifest["status"] = "running"
    return manifest


def _unpair_half_done_steps(manifest: dict[str, Any]) -> None:
    """Duet: set a ``done`` level back to ``failed: …`` (so resumed as pending) where the other arm's level of the same
    key is not done."""
    arms = manifest["arms"]
    for key in arms[0]["levels"]:
        states = [arm["levels"].get(key, {}).get("status") for arm in arms]
        if "done" in states and any(state != "done" for state in states):
            for arm in arms:
                if arm["levels"][key].get("status") == "done":
                    arm["levels"][key] = {**arm["levels"][key],
                                          "status": "failed: measured again with its duet partner"}


def finish(manifest: dict[str, Any], timing: dict[str, float], wall_s: float, status: str) -> None:
    """Close ``manifest`` in place: ``timing`` (seconds per part) with the run's wall time and the harness's share
    of it, every level still pending ``skipped``, the final ``status``, end time and load averages."""
    measured = sum(timing[k] for k in ("server_start_s", "benchmark_s", "parity_s", "gsm8k_s", "pilot_s"))
    manifest["timing"] = {
        "wall_s": round(wall_s, 2), **{k: round(v, 2) for k, v in timing.items()},
        "harness_overhead_s": round(wall_s - measured, 2),
        "harness_share": round((wall_s - measured) / wall_s, 4) if wall_s > 0 else None,
    }
    for arm in manifest["arms"]:
        for level in arm["levels"].values():
            if level["status"] == "pending":
                level["status"] = "skipped: run stopped before this level"
    manifest["status"] = status
    manifest["ended_at"] = now()
    manifest["platform"]["load_avg_at_end"] = load_avg()


def _injection_record(arm: ArmPlan) -> dict[str, Any] | None:
    """The manifest's ``injection`` of an arm (``{"kind", "params"}``), None when the arm injects nothing."""
    injection = parse_injection(arm.server_env.get(ENV_INJECT))
    return None if injection is None else injection.record()
