"""The run directory's schema: every file name, every column and the typed manifest (``schema_version`` 3).

Pure: pydantic models and constants, no file access (that is :mod:`harness.rundir.store`). A run directory
``results/<run-id>/`` holds:

- ``manifest.json`` — :class:`Manifest`: the resolved scenario, one :class:`ArmRecord` per arm (a list, so a run
  may compare more than two), versions, platform, git sha, times, per-arm and per-level status.
- ``levels.csv`` — one :class:`LevelRow` per arm × session × round × level (columns :data:`LEVEL_COLUMNS`). A level
  (:class:`Level`, column ``level``) is a regime — dataset, input and output length — at a concurrency; schema 2 keyed
  levels by concurrency alone, read here with the scenario's one regime (:mod:`harness.rundir.v2`).
- ``requests.csv`` — one :class:`RequestRow` per request (columns :data:`REQUEST_COLUMNS`).
- ``accuracy.csv`` — one :class:`AccuracyRow` per arm × GSM8K question × lm-eval filter; ``accuracy/<arm>/`` holds
  lm-eval's own output and ``arm.json``; ``accuracy/summary.json`` the per-arm scores (:class:`AccuracySummary`).
- ``parity/<arm>.json`` and ``parity.json`` — greedy outputs per arm and their comparison (:class:`ParitySummary`).
- ``raw/<arm>-<level>-r<round>.json`` — vLLM's own ``vllm bench serve --save-detailed`` result, plus the
  key ``dsa_bench_server_metrics``: the server's full Prometheus ``/metrics`` text right before and right after the
  measured requests (``{"before": {"unix_s", "text"}, "after": {...}}``; :mod:`harness.run.server_metrics`; absent
  in older run directories and imported results); ``raw/pilot-<arm>-<level>.json`` a pilot level's
  (``workload.min_level_s``; manifest ``pilot``), not a measurement.
- ``logs/`` — server, benchmark-client and lm-eval logs.
- ``verdict.json`` (:class:`VerdictDocument`), ``summary.md``, ``benchmark.pytorch.json``, ``report.html``.

Replication hierarchy: arm → session (one ``vllm serve`` process; a new session each time the runner starts or
connects to a server: one per arm and block of levels with sequential servers, with concurrent ones under
``serve.restart_per_block``, ``serve.duet`` or swapped placements, else one per arm per run with concurrent servers;
and a new one after ``--resume``) → round (one pass over the levels; version 1 called it
``repeat``) → request.

Units are in the column names (``_ms`` milliseconds, ``_s`` seconds, throughputs in tokens/s or requests/s). The
level metrics are vLLM's own (``vllm/benchmarks/serve.py``: ``mean_tpot_ms`` is its mean over requests of
(E2EL − TTFT) / (output_len − 1)); the per-request ``tpot_ms`` is the same formula per request.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Literal

from pydantic import Field

from harness.rundir.budget import BudgetRecord  # re-exported
from harness.rundir.cluster import Assignment, ClusterRecord, NodeRecord, Placement  # re-exported
from harness.rundir.documents import (AccuracyArm, AccuracyFilter, AccuracyPair, AccuracySummary,  # re-exported
                                      AttributionDocument, AttributionEffect, AttributionObservation, InjectedSizes,
                                      ParitySummary, SizeCheck, StepCheck, VerdictCell, VerdictDocument,
                                      WaterfallStep)
from harness.rundir.levels import DATASETS, Level, LevelKey, Regime, level_regimes, workload_levels  # re-exported
from harness.rundir.observation import Observation, RemoteObservation  # re-exported
from harness.rundir.pilot import PilotLevel, PilotRecord  # re-exported
from harness.rundir.record import Record as _Record
from harness.rundir.rows import (ACCURACY_COLUMNS, LEVEL_COLUMNS, MTP_COLUMNS, REQUEST_COLUMNS,  # re-exported
                                REQUIRED_ACCURACY_COLUMNS, REQUIRED_LEVEL_COLUMNS, REQUIRED_REQUEST_COLUMNS,
                                AccuracyRow, LevelRow, RequestRow)

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
"""Manifest versions this code reads (1 and 2 through :func:`harness.rundir.v1.upgrade_v1` and
:func:`harness.rundir.v2.upgrade_v2`). A newer one is refused in one line (:meth:`harness.rundir.store.RunDir.manifest`)."""

MANIFEST = "manifest.json"
LEVELS = "levels.csv"
REQUESTS = "requests.csv"
ACCURACY = "accuracy.csv"
ACCURACY_DIR = "accuracy"
ACCURACY_ARM = "arm.json"                       # accuracy/<arm>/arm.json
ACCURACY_SUMMARY = "accuracy/summary.json"
PARITY = "parity.json"
PARITY_DIR = "parity"                           # parity/<arm>.json
RAW_DIR = "raw"
LOGS_DIR = "logs"
VERDICT = "verdict.json"
ATTRIBUTION = "attribution.json"   # a factorial attribution's effects (AttributionDocument)
SUMMARY = "summary.md"
PYTORCH_JSON = "benchmark.pytorch.json"
REPORT = "report.html"

RunStatus = Literal["running", "done", "failed", "interrupted"]


class Status(str, Enum):
    """A cell's or the run's verdict. ``str`` so it serialises as its name."""

    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    INVALID = "INVALID"

    def __str__(self) -> str:
        return self.value


SEVERITY = {Status.FAIL: 0, Status.INVALID: 1, Status.INCONCLUSIVE: 2, Status.PASS: 3}
"""Worst first: the overall verdict is the most severe primary cell's."""
EXIT_CODES: dict[Status, int] = {Status.PASS: 0, Status.FAIL: 1, Status.INCONCLUSIVE: 3, Status.INVALID: 4}
"""``dsa-bench gate``'s exit code per verdict (2 stays the usage error)."""


# ------------------------------------------------------------------------------------------------------- manifest


class Attestation(_Record):
    """Intended vs observed path of an arm: ``valid`` None when it could not be checked (``not_checked`` says what)."""

    valid: bool | None = None
    mismatches: tuple[str, ...] = ()
    not_checked: tuple[str, ...] = ()
    note: str | None = None


class Injection(_Record):
    """A fault or slowdown injected into an arm on purpose: ``kind`` (``topk-random``, ``indexer-rope-flip``,
    ``step-delay``; dsa_route.inject) and its parameters (``{"ms": float}`` for step-delay)."""

    kind: str
    params: dict[str, Any] = Field(default_factory=dict)


class StartupRecord(_Record):
    """A session's start-up, from the server's own log lines (harness.run.startup: seconds, GiB, tokens; None where
    the line is absent) plus ``ready_s`` (spawn → first successful completion) and ``peak_rss_gib`` (largest resident
    memory of the server's process tree, sampled about once a second while starting; ``peak_gpu_gib`` likewise from
    ``nvidia-smi``, None without it)."""

    ready_s: float | None = None
    api_server_s: float | None = None           # the API server's "Starting vLLM server" after the log's first line
    model_init_s: float | None = None
    weights_s: float | None = None
    model_load_s: float | None = None
    model_load_gib: float | None = None
    compile_s: float | None = None
    graph_capture_s: float | None = None
    graph_memory_gib: float | None = None
    engine_init_s: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: float | None = None
    peak_rss_gib: float | None = None
    peak_gpu_gib: float | None = None           # GPU memory of the server's processes (nvidia-smi), all GPUs summed


class GpuState(_Record):
    """One GPU as ``nvidia-smi`` saw it just before a session's server started: utilisation (%) and memory (MiB)."""

    index: int
    utilization_pct: float | None = None
    memory_used_mib: float | None = None


class SessionRecord(_Record):
    """One server session of an arm: its index (0, 1, … per arm), start time, readiness and start-up metrics, and
    the arm's GPUs just before it started (``gpus_before``; None with ``gpu_note`` saying why where not checked)."""

    index: int
    gpus_before: tuple[GpuState, ...] | None = None
    gpu_note: str | None = None
    started_at: str | None = None
    server_start_s: float | None = None
    base_url: str | None = None
    startup: StartupRecord | None = None
    placement: Placement | None = None


class LevelState(str, Enum):
    """The state word of a level status ``"<state>[: <reason>]"`` (:class:`LevelRecord`); read with
    :func:`level_state`, never by matching a prefix."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    STOPPED = "stopped"


STOPPED = LevelState.STOPPED.value
"""Status word of a level a run no longer plans: a sequential look decided, or the budget ran out, before it
(``"stopped: <reason>"``; the manifest's ``stopped`` says why). Not a failure: the gate judges the sessions that ran."""


def level_state(status: str | None) -> LevelState | None:
    """The :class:`LevelState` of a level status text (``"failed: server died"`` → ``FAILED``); None for None or a
    text that starts with no known state (a run directory written by other tooling)."""
    word = (status or "").split(":", 1)[0].strip()
    try:
        return LevelState(word)
    except ValueError:
        return None


def level_reason(status: str | None) -> str:
    """The reason part of a level status text (``"failed: server died"`` → ``"server died"``; "" when none)."""
    return (status or "").partition(":")[2].strip()


class AaCheckRecord(_Record):
    """``manifest.json`` ``aa_check``: the A/A run of the baseline arm on both placements before the A/B
    (``[cluster] aa_check``) — its run directory and verdict."""

    run_dir: str
    overall: str | None = None
    reason: str | None = None


class StopRecord(_Record):
    """Why a run stopped before its last planned session block (``manifest.json`` ``stopped``)."""

    reason: str
    at: str | None = None


class LevelRecord(_Record):
    """Status of one level of one arm: ``status`` is "pending", "done", "failed: <reason>", "skipped: <reason>" or
    "stopped: <reason>" (:data:`STOPPED`); :attr:`state` and :attr:`reason` are its two parts."""

    status: str = "pending"
    session: int | None = None
    wall_s: float | None = None
    started_at: str | None = None               # UTC, milliseconds: a duet's two levels of one step overlap
    finished_at: str | None = None
    raw: str | None = None                      # relative path of the raw bench JSON
    previous: str | None = None                 # the status before a --resume set it back to pending

    @property
    def state(self) -> LevelState | None:
        return level_state(self.status)

    @property
    def reason(self) -> str:
        return level_reason(self.status)


class BuildRecord(_Record):
    """The vLLM build an arm's server ran (harness.run.builds): what was declared (None: the harness's own
    environment), its interpreter, distribution and version, VCS commit (PEP 610), SHA-256 of its RECORD file, where
    it is installed, whether the dsa_route plugin is visible to it, the installed packages (``pip freeze``'s set)
    with their hash, and ``error`` when it could not be read."""

    declared: str | None = None
    python: str | None = None
    distribution: str | None = None
    version: str | None = None
    commit: str | None = None
    record_sha256: str | None = None
    location: str | None = None
    plugin: bool | None = None
    packages: tuple[str, ...] = ()              # every installed distribution, ``name==version`` (pip freeze's set)
    packages_sha256: str | None = None          # SHA-256 of ``packages`` joined by newlines
    error: str | None = None


class ArmRecord(_Record):
    """One arm: what was decided (route, decision, intended path), how it was launched, and what was observed."""

    name: str
    route: str
    description: str = ""
    decision: dict[str, Any] = Field(default_factory=dict)   # dsa_route.routing.RouteDecision.to_dict()
    unavailable: tuple[str, ...] = ()           # knobs "not available on this platform"
    server_command: tuple[str, ...] | None = None   # None: a server started by other tooling
    server_env: dict[str, str] = Field(default_factory=dict)
    bench_command: tuple[str, ...] | None = None     # the first level's `vllm bench serve` argv
    intended: dict[str, Any] = Field(default_factory=dict)
    observed: dict[str, Any] = Field(default_factory=dict)
    attestation: Attestation = Attestation()
    server_start_s: float | None = None         # the latest session's spawn → first successful completion
    base_url: str | None = None
    placement: Placement | None = None
    injection: Injection | None = None
    sessions: tuple[SessionRecord, ...] = ()
    build: BuildRecord | None = None            # the vLLM build this arm's server ran
    levels: dict[str, LevelRecord] = Field(default_factory=dict)   # str(LevelKey) → status

    def level_items(self) -> list[tuple[LevelKey, LevelRecord]]:
        """Levels with a parseable key, sorted by (level, round)."""
        found = [(LevelKey.parse(key), record) for key, record in self.levels.items()]
        return sorted(((key, record) for key, record in found if key is not None), key=lambda item: item[0])


class Platform(_Record):
    """The machine: ``name`` "cpu" | "cuda", device model, counts, and the load averages around the run."""

    name: str = "unknown"
    device: str = ""
    cpu_count: int | None = None
    gpu_count: int | None = None
    has_triton: bool | None = None
    load_avg_at_start: str | None = None
    load_avg_at_end: str | None = None

    def identity(self) -> dict[str, Any]:
        """What makes two runs' machines the same class (name, device, CPUs, GPUs): the key a design study of this
        machine is matched on."""
        return {"name": self.name, "device": self.device, "cpu_count": self.cpu_count, "gpu_count": self.gpu_count}


class EstimateRecord(_Record):
    """The plan's cost estimate (harness.run.estimate), recorded next to the actual ``timing``: seconds as
    (min, max) per part and in all, GPUs held, GPU-hours (min, max), server sessions, and the stated prior."""

    parts: dict[str, tuple[float, float]] = Field(default_factory=dict)
    wall_s: tuple[float, float] | None = None
    gpus: int = 0
    gpu_hours: tuple[float, float] | None = None
    sessions: int | None = None
    prior: dict[str, Any] = Field(default_factory=dict)


class Manifest(_Record):
    """``manifest.json`` as readers see it. ``scenario`` is the resolved scenario as a dict, each arm's ``decision`` and
    ``observed`` dicts: a run directory of any version reads. The runner writes the typed subclass
    (``harness.run.run_manifest.RunManifest``: a ``Scenario``, ``RouteDecision`` and :class:`Observation`), whose
    JSON is the same."""

    schema_version: Literal[3] = SCHEMA_VERSION
    run_id: str
    status: RunStatus = "running"
    started_at: str | None = None
    ended_at: str | None = None
    resumed_at: tuple[str, ...] = ()
    scenario_name: str | None = None
    scenario_file: str | None = None
    scenario: dict[str, Any] = Field(default_factory=dict)
    platform: Platform = Platform()
    versions: dict[str, str | None] = Field(default_factory=dict)
    git_sha: str | None = None
    notes: tuple[str, ...] = ()
    schedule: tuple[tuple[str, str, int], ...] = ()      # (arm, str(Level), round) in run order
    arms: tuple[ArmRecord, ...] = ()
    timing: dict[str, float | None] = Field(default_factory=dict)
    estimate: EstimateRecord | None = None      # what the plan expected; compare with ``timing``
    imported_from: str | None = None            # the index CSV of ``dsa-bench import`` (None: measured by compare)
    stopped: StopRecord | None = None           # a sequential look or the budget ended the run early
    aa_check: AaCheckRecord | None = None       # the A/A run across the placements before this A/B
    cluster: ClusterRecord | None = None        # where the arms ran (None: written before placements were recorded)
    pilot: PilotRecord | None = None            # the levels that set the prompt counts (None: no workload.min_level_s)
    budget: BudgetRecord | None = None          # the projection after block 1 (None: no budget, or before block 1)

    def arm(self, name: str) -> ArmRecord | None:
        """The arm called ``name``, or None."""
        return next((arm for arm in self.arms if arm.name == name), None)

    def arm_for_route(self, route: str) -> ArmRecord | None:
        """The first arm whose route is ``route`` ("baseline" | "candidate"), or None."""
        return next((arm for arm in self.arms if arm.route == route), None)

    def scenario_data(self) -> dict[str, Any]:
        """The resolved scenario as JSON data (what ``manifest.json`` holds; a writer's typed scenario, dumped)."""
        return self.scenario

    def scenario_value(self, *path: str) -> Any:
        """``scenario[path[0]][path[1]]…``, None where a key is missing or a value is not a table."""
        value: Any = self.scenario_data()
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def rounds_per_session(self) -> int:
        """``workload.rounds_per_session`` as a whole number ≥ 1 (1 where it is missing or not a positive number)."""
        value = self.scenario_value("workload", "rounds_per_session")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
            return 1
        return int(value)

    def model_name(self) -> str:
        """The model the run served: the benchmark's ``--model``, else the scenario's ``model.id``."""
        for arm in self.arms:
            argv = list(arm.bench_command or ())
            if "--model" in argv and argv.index("--model") + 1 < len(argv):
                return str(argv[argv.index("--model") + 1])
        model = self.scenario_value("model")
        if isinstance(model, dict):
            return str(model.get("id") or model.get("path") or model.get("name") or "unknown")
        return str(model or "unknown")


# CSV rows: harness.rundir.rows (re-exported above)

__all__ = [  # the documents beside the manifest live in harness.rundir.documents; named and re-exported here
    "ATTRIBUTION", "AttributionDocument", "AttributionEffect", "AttributionObservation", "WaterfallStep",
    "InjectedSizes", "SizeCheck", "StepCheck",
    "AccuracyArm", "AccuracyFilter", "AccuracyPair", "AccuracySummary", "ParitySummary", "VerdictCell",
    "VerdictDocument", "ACCURACY", "ACCURACY_ARM", "ACCURACY_COLUMNS", "ACCURACY_DIR", "ACCURACY_SUMMARY",
    "AccuracyRow", "ArmRecord", "Assignment", "Attestation", "BudgetRecord", "ClusterRecord", "EXIT_CODES",
    "GpuState", "Injection", "DATASETS", "LEVELS", "LEVEL_COLUMNS", "LOGS_DIR", "Level", "LevelKey", "Regime",
    "level_regimes", "LevelRecord", "LevelRow", "LevelState", "level_reason",
    "level_state", "MANIFEST", "MTP_COLUMNS", "Manifest",
    "NodeRecord", "Observation", "PARITY", "PARITY_DIR", "PYTORCH_JSON", "PilotLevel", "PilotRecord", "Placement",
    "Platform",
    "RAW_DIR", "READABLE_VERSIONS",
    "RemoteObservation", "REPORT", "REQUESTS", "REQUEST_COLUMNS",
    "REQUIRED_ACCURACY_COLUMNS", "REQUIRED_LEVEL_COLUMNS", "REQUIRED_REQUEST_COLUMNS", "RequestRow", "RunStatus",
    "SCHEMA_VERSION", "SEVERITY", "SUMMARY", "SessionRecord", "Status", "VERDICT"
]
