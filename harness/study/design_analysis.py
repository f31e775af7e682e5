"""One design-study run directory → its row of the study: the A/A paired spread per level and pooled (95 % χ²
interval), within- and between-session sd where sessions hold several rounds, wall time per block and per round, cost
per decision, the blocks a ±3 % decision needs, the A/A verdict, the host's load and transparent-huge-page setting,
and the same spread read through other analyses of the same runs (client TPOT, server-side TPOT, a robust estimator)
where the run directory and this build have them. Formulas: :mod:`harness.judge.design_costs`.

Reads the run directory only (``design.json``, written by ``python -m harness.study.design_study run``, names the design;
without it the run's scenario name stands in).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

from harness.judge.design_costs import run_noise
from harness.rundir.schema import Manifest
from harness.rundir.store import RunDir

__all__ = ["DESIGN_RECORD", "ANALYSES", "analyze_run", "machine_key"]

DESIGN_RECORD = "design.json"
ANALYSES = (("client TPOT", "mean_tpot_ms"), ("server TPOT", "server_mean_tpot_ms"))
"""Other metrics read from the same runs: (label, levels.csv column); the server-side column comes from vLLM's
``/metrics`` histograms where the run recorded them."""


def machine_key(machine: dict[str, Any]) -> str:
    """A file-name key for a machine record, e.g. ``cpu-2cpu-amd-epyc``."""
    device = re.sub(r"[^a-z0-9]+", "-", str(machine.get("device") or "unknown").lower()).strip("-")
    return f"{machine.get('name')}-{machine.get('cpu_count')}cpu-{device}"[:80]


def _load(levels, manifest: Manifest) -> dict[str, Any]:
    values = [float(v) for v in levels.get("load_avg_1m", []) if v == v] if "load_avg_1m" in levels else []
    return {"at_start": manifest.platform.load_avg_at_start, "at_end": manifest.platform.load_avg_at_end,
            "levels_median": statistics.median(values) if values else None,
            "levels_min": min(values) if values else None, "levels_max": max(values) if values else None}


def _verdict(store: RunDir) -> tuple[str | None, str | None]:
    path = store.file("verdict.json")
    if path.exists():
        data = json.loads(path.read_text(encoding="utf-8"))
        return data.get("overall"), data.get("reason")
    from harness.gate import run_gate

    result = run_gate(store.path, write=False)
    return str(result.status), result.reason


def _sessions(store: RunDir, manifest: Manifest, levels) -> list[dict[str, Any]]:
    """Within- and between-session sd per level (:func:`harness.study.session_simulation.noise`; ValueError below
    4 complete sessions)."""
    from harness.study.session_simulation import noise, session_pool

    pool = session_pool(manifest, levels, store.requests(numeric=True))
    return [{"concurrency": n.concurrency, "sessions": n.sessions, "within": n.within, "within_df": n.within_df,
             "between": n.between} for n in noise(pool)]


def _robust(manifest: Manifest, levels, estimator: str) -> dict[str, Any]:
    try:
        return run_noise(manifest, levels, estimator=estimator)
    except (ValueError, TypeError, KeyError) as error:
        return {"note": f"robust estimator {estimator!r}: {error}"}


def _analyses(manifest: Manifest, levels, estimators: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, column in ANALYSES:
        has = column in levels.columns and levels[column].notna().any()
        out[label] = run_noise(manifest, levels, column) if has else {"note": f"levels.csv has no {column} values"}
    for estimator in estimators:
        out[f"robust: {estimator}"] = _robust(manifest, levels, estimator)
    return out


def analyze_run(run_dir: Path, robust_estimators: tuple[str, ...] = ()) -> dict[str, Any]:
    """The study row of ``run_dir`` (keys: design, description, overrides, run_dir, machine, blocks,
    rounds_per_session, spread (:func:`harness.judge.design_costs.run_noise` of output throughput), sessions
    (within/between per level, or a note), wall_per_round_s, overall, reason, load, thp, analyses, notes);
    ``robust_estimators``: the ``paired_spread`` estimators read as further analyses (``"robust: <name>"``)."""
    store = RunDir(Path(run_dir))
    manifest, levels = store.manifest(), store.levels(numeric=True)
    record_path = store.file(DESIGN_RECORD)
    record = json.loads(record_path.read_text(encoding="utf-8")) if record_path.exists() else {}
    per_session = manifest.rounds_per_session()
    spread = run_noise(manifest, levels)
    notes = [] if record else [f"no {DESIGN_RECORD}: not run by the design study; named after its scenario"]
    sessions: Any = {"note": "1 round per session: within and between session spread not separable"}
    if per_session > 1:
        try:
            sessions = _sessions(store, manifest, levels)
        except ValueError as error:
            sessions = {"note": str(error)}
    overall, reason = _verdict(store)
    wall = spread["wall_per_block_s"]
    return {
        "design": record.get("design") or manifest.scenario_name or store.path.name,
        "description": record.get("description", ""), "base": record.get("base"),
        "overrides": record.get("overrides", {}),
        "run_dir": str(store.path), "machine": manifest.platform.identity(), "started_at": manifest.started_at,
        "blocks": spread["pooled"]["pairs"], "rounds_per_session": per_session, "spread": spread,
        "sessions": sessions, "wall_per_round_s": None if wall is None else wall / per_session,
        "overall": overall, "reason": reason, "exit_code": record.get("exit_code"),
        "load": {**_load(levels, manifest), "before_run": record.get("loadavg_before"),
                 "after_run": record.get("loadavg_after")},
        "thp": record.get("thp", "not recorded"), "analyses": _analyses(manifest, levels, robust_estimators),
        "notes": notes,
    }
