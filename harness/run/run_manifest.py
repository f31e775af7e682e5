"""A run's ``manifest.json`` as the runner writes it, typed from start to end.

:class:`RunManifest` and :class:`RunArm` are :class:`~harness.rundir.schema.Manifest` and
:class:`~harness.rundir.schema.ArmRecord` with the writer's types — the resolved :class:`Scenario` (secrets redacted
when written), each arm's :class:`RouteDecision` and :class:`Observation` — and the same JSON, so readers of any run
directory see what they always saw. :func:`initial` starts one from the plan, :func:`resumed` from a stored manifest
(``--resume``); :class:`ManifestWriter` holds it while the run goes: every change replaces a frozen record and is
validated there (:func:`changed`), not at the next save.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated, Any, Mapping, TypeVar

from pydantic import BaseModel, BeforeValidator, ValidationError, field_serializer

from dsa_route.inject import ENV_INJECT, parse_injection
from dsa_route.routing import RouteDecision
from harness.run import builds, cluster as cluster_info, machine as machine_mod
from harness.run.estimate import estimate
from harness.run.plan import ArmPlan, Plan
from harness.run.scenario import REPO_ROOT, Scenario
from harness.run.start import load_avg, now, redact_env, redacted_scenario, schedule
from harness.rundir import schema
from harness.rundir.files import first_error
from harness.rundir.schema import ArmRecord, LevelKey, LevelRecord, LevelState, Manifest, Observation, RemoteObservation
from harness.rundir.store import RunDir, SchemaError

__all__ = ["ManifestWriter", "RunArm", "RunManifest", "changed", "initial", "resumed"]

R = TypeVar("R", bound=BaseModel)

UNPAIRED = "failed: measured again with its duet partner"
"""The status a resumed duet gives a done level whose partner in the other arm is not done."""


def changed(record: R, **changes: Any) -> R:
    """``record`` with ``changes``, validated now: a wrong field name or type raises here, not at the next save."""
    unknown = set(changes) - set(type(record).model_fields)
    if unknown:
        raise TypeError(f"{type(record).__name__} has no field {', '.join(sorted(unknown))}")
    return type(record).model_validate({**dict(record), **changes})


def _observation(value: Any) -> Any:
    """A stored ``observed`` dict as its model: ``{}`` (nothing observed yet) → None, a server started by other
    tooling's → :class:`RemoteObservation`, a log's → :class:`Observation`."""
    if not isinstance(value, Mapping):
        return value
    if not value:
        return None
    return (RemoteObservation if "served_models" in value else Observation).model_validate(value)


class RunArm(ArmRecord):
    """An arm as the runner writes it: the plan's routing decision and what its server showed, typed (``observed``
    None until a server session started, written ``{}``)."""

    decision: RouteDecision
    observed: Annotated[Observation | RemoteObservation | None, BeforeValidator(_observation)] = None

    @field_serializer("decision")
    def _decision_data(self, decision: RouteDecision, info) -> dict[str, Any]:
        return decision.to_dict()   # per-knob overrides only where an attribution arm has them

    @field_serializer("observed")
    def _observed_data(self, observed: Observation | RemoteObservation | None, info) -> dict[str, Any]:
        return {} if observed is None else observed.model_dump(mode=info.mode)


class RunManifest(Manifest):
    """The manifest as the runner writes it: the resolved :class:`Scenario` and :class:`RunArm` records."""

    scenario: Scenario
    arms: tuple[RunArm, ...] = ()

    def scenario_data(self) -> dict[str, Any]:
        return redacted_scenario(self.scenario.model_dump(mode="json"))

    @field_serializer("scenario")
    def _scenario_data(self, scenario: Scenario) -> dict[str, Any]:
        return self.scenario_data()


# ----------------------------------------------------------------------------------------------- start
def initial(plan: Plan, run_dir: Path, *, remote: bool, aa_check: dict[str, Any] | None) -> RunManifest:
    """The manifest of a new run into ``run_dir``: every level pending. ``remote``: the servers were started by other
    tooling (no build of ours to record); ``aa_check``: the [cluster] aa_check run's record."""
    return RunManifest(
        run_id=run_dir.name, status="running", started_at=now(), scenario_name=plan.scenario.name,
        scenario_file=plan.scenario_file, scenario=plan.scenario,
        platform={**plan.machine.to_dict(), "load_avg_at_start": load_avg()},
        versions=machine_mod.versions(), git_sha=machine_mod.git_sha(REPO_ROOT), notes=plan.notes,
        schedule=tuple((name, str(level), r) for name, level, r in schedule(plan)),
        arms=tuple(_arm(plan, arm, run_dir, remote) for arm in plan.arms),
        estimate=estimate(plan).to_dict(), aa_check=aa_check,
        cluster=cluster_info.manifest_record(plan.scenario.cluster, [arm.name for arm in plan.arms],
                                             plan.scenario.workload.repeats))


def _arm(plan: Plan, arm: ArmPlan, run_dir: Path, remote: bool) -> RunArm:
    """One arm of a new run: how it is launched (the first level's bench command), no session yet."""
    first = plan.levels()[0]
    return RunArm(
        name=arm.name, route=arm.route, description=arm.description, decision=arm.decision,
        unavailable=arm.unavailable, server_command=arm.server_argv("<port>"), server_env=redact_env(arm.server_env),
        bench_command=plan.bench_argv(arm, first, "http://127.0.0.1:<port>", run_dir / schema.RAW_DIR),
        intended=arm.intended, injection=_injection_record(arm), build=None if remote else builds.record(arm),
        levels={str(key): LevelRecord() for key in plan.levels()})


def resumed(stored: Manifest, plan: Plan, store: RunDir) -> RunManifest:
    """The stored manifest with every level that is not ``done`` set back to pending (``previous``: its status), and
    the CSVs cut back to the rows of done levels (a crash between the two CSV appends leaves no orphan rows). Under a
    duet a level whose partner in the other arm is not done is measured again too: a duet level is only valid beside
    its partner. ``plan``: the stored scenario's plan (its scenario is the manifest's).

    Raises:
        SchemaError: an arm's record does not read as this dsa-bench writes it (names the field).
    """
    arms = _unpair_half_done_steps(stored.arms) if stored.scenario_value("serve", "duet") else stored.arms
    store.keep_levels({(arm.name, key) for arm in arms for key, level in arm.level_items()
                       if level.status == LevelState.DONE})
    try:
        typed = tuple(RunArm.model_validate({**arm.model_dump(), "levels": _pending_again(arm.levels)})
                      for arm in arms)
    except ValidationError as error:
        raise SchemaError(f"{store.file(schema.MANIFEST)}: cannot resume: {first_error(error)} (written by another "
                          f"dsa-bench); start a new run") from None
    return RunManifest.model_validate({**dict(stored), "scenario": plan.scenario, "arms": typed, "status": "running",
                                       "resumed_at": (*stored.resumed_at, now())})


def _pending_again(levels: Mapping[str, LevelRecord]) -> dict[str, LevelRecord]:
    """Every level not ``done`` as pending, its status kept as ``previous``."""
    return {key: level if level.status == LevelState.DONE else LevelRecord(previous=level.status)
            for key, level in levels.items()}


def _unpair_half_done_steps(arms: tuple[ArmRecord, ...]) -> tuple[ArmRecord, ...]:
    """Duet: a ``done`` level becomes :data:`UNPAIRED` (so resumed as pending) where the other arm's level of the same
    key is not done."""
    def done(arm: ArmRecord, key: str) -> bool:
        return key in arm.levels and arm.levels[key].status == LevelState.DONE

    half = {key for key in arms[0].levels if len({done(arm, key) for arm in arms}) == 2}
    return tuple(changed(arm, levels={key: changed(level, status=UNPAIRED) if key in half and done(arm, key)
                                      else level for key, level in arm.levels.items()}) for arm in arms)


def _injection_record(arm: ArmPlan) -> dict[str, Any] | None:
    """The manifest's ``injection`` of an arm (``{"kind", "params"}``), None when the arm injects nothing."""
    injection = parse_injection(arm.server_env.get(ENV_INJECT))
    return None if injection is None else injection.record()


# ----------------------------------------------------------------------------------------------- the writer
class ManifestWriter:
    """The run's :class:`RunManifest` while it runs, and its saves. Each method replaces frozen records (validated
    by :func:`changed`) under one lock: a duet's two level threads share the writer."""

    def __init__(self, manifest: RunManifest, store: RunDir):
        self.manifest = manifest
        self.store = store
        self.lock = threading.RLock()

    def save(self) -> None:
        with self.lock:
            self.store.write_manifest(self.manifest)

    def arm(self, name: str) -> RunArm:
        """The arm called ``name``.

        Raises:
            KeyError: no such arm (a bug in the caller).
        """
        for arm in self.manifest.arms:
            if arm.name == name:
                return arm
        raise KeyError(f"no arm {name!r} in the manifest")

    def level(self, name: str, key: LevelKey) -> LevelRecord:
        return self.arm(name).levels[str(key)]

    def update(self, **changes: Any) -> None:
        """The manifest's own fields (``pilot``, ``cluster``, ``stopped``, …)."""
        with self.lock:
            self.manifest = changed(self.manifest, **changes)

    def update_arm(self, name: str, **changes: Any) -> None:
        with self.lock:
            self.update(arms=tuple(changed(arm, **changes) if arm.name == name else arm
                                   for arm in self.manifest.arms))

    def update_level(self, name: str, key: LevelKey, **changes: Any) -> None:
        with self.lock:
            levels = self.arm(name).levels
            self.update_arm(name, levels={**levels, str(key): changed(levels[str(key)], **changes)})

    def add_session(self, name: str, **fields: Any) -> None:
        """A new server session of arm ``name`` (:class:`~harness.rundir.schema.SessionRecord` fields but its index):
        the levels measured from now on belong to it; the arm's ``server_start_s`` and ``base_url`` are its."""
        with self.lock:
            sessions = self.arm(name).sessions
            session = schema.SessionRecord(index=len(sessions), **fields)
            self.update_arm(name, sessions=(*sessions, session), server_start_s=session.server_start_s,
                            base_url=session.base_url)

    def place(self, name: str, placement: schema.Placement) -> None:
        """Where the arm's latest session runs (the arm's ``placement`` too)."""
        with self.lock:
            *earlier, latest = self.arm(name).sessions
            self.update_arm(name, placement=placement, sessions=(*earlier, changed(latest, placement=placement)))

    def add_note(self, note: str) -> None:
        with self.lock:
            if note not in self.manifest.notes:
                self.update(notes=(*self.manifest.notes, note))

    def settle_pending(self, status: str) -> None:
        """Every level still pending gets ``status`` (an early stop's, or the run's end's)."""
        with self.lock:
            self.update(arms=tuple(changed(arm, levels={
                key: changed(level, status=status) if level.status == LevelState.PENDING else level
                for key, level in arm.levels.items()}) for arm in self.manifest.arms))

    def complete(self) -> bool:
        """Every level done, or stopped by a deciding look or the budget."""
        return all(level.state in (LevelState.DONE, LevelState.STOPPED)
                   for arm in self.manifest.arms for level in arm.levels.values())

    def finish(self, timing: dict[str, float], wall_s: float, status: str) -> None:
        """Close the manifest: ``timing`` (seconds per part) with the run's wall time and the harness's share of it,
        every level still pending ``skipped``, the final ``status``, end time and load average."""
        measured = sum(timing[k] for k in ("server_start_s", "benchmark_s", "parity_s", "gsm8k_s", "pilot_s"))
        with self.lock:
            self.settle_pending("skipped: run stopped before this level")
            self.update(timing={
                "wall_s": round(wall_s, 2), **{k: round(v, 2) for k, v in timing.items()},
                "harness_overhead_s": round(wall_s - measured, 2),
                "harness_share": round((wall_s - measured) / wall_s, 4) if wall_s > 0 else None,
            }, status=status, ended_at=now(), platform=changed(self.manifest.platform, load_avg_at_end=load_avg()))
