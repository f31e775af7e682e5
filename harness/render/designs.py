"""The report's "Designs measured on this machine" section: the committed design study of this run's machine class
(``results/design-study/<machine>.json``, written by ``python -m harness.study.design_study``; matched on the manifest's
:meth:`~harness.rundir.schema.Platform.identity`) and this run's own paired spread and cost per decision
(``verdict.json``'s ``noise``, :func:`harness.judge.design_costs.run_noise` via the gate).

The study is a repository file, not part of the run directory: re-rendering a report picks up a newer study."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from harness.rundir.schema import Manifest

__all__ = ["MEASURE_COMMAND", "STUDY_DIR", "STUDY_KIND", "design_choice", "design_ran", "designs_section",
           "measured_study"]

STUDY_DIR = Path(__file__).resolve().parents[2] / "results" / "design-study"
STUDY_KIND = "dsa-bench.design-study"


MEASURE_COMMAND = "python -m harness.study.design_study calibrate"
"""How a machine gets its own study, short: the ``calibrate`` designs of ``scenarios/design-study/cpu.toml``, 3 blocks
each (``… run --designs NAME,… --blocks 8`` measures any of its designs at length)."""


def _studies(study_dir: Path | None) -> list[tuple[Path, dict[str, Any]]]:
    """Every readable design study of ``study_dir`` (default ``results/design-study/``), by file name."""
    folder = Path(study_dir or STUDY_DIR)
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(document, dict) and document.get("kind") == STUDY_KIND:
            found.append((path, document))
    return found


def measured_study(machine: Mapping[str, Any], study_dir: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """(path, document) of the design study of ``machine`` (:meth:`~harness.rundir.schema.Platform.identity`), or
    None (none measured, or unreadable)."""
    return next(((path, doc) for path, doc in _studies(study_dir) if doc.get("machine") == dict(machine)), None)


def _study_words(path: Path, document: Mapping[str, Any]) -> str:
    return f"the study of {path.stem}, measured {str(document.get('updated_at') or 'at an unrecorded time')[:10]}"


def design_choice(machine: Mapping[str, Any], design: str | None, study_dir: Path | None = None) -> str:
    """Which machine's study chose the run design ``design`` (the scenario's ``design``), in one line for the plan and
    the report: chosen by this machine's study; this machine's study found another cheapest; or no study of this
    machine (and which other machine's study chose it), with the command that makes one."""
    ran = f"the scenario's design {design}" if design else "the scenario's own settings (no design-study design)"
    found = measured_study(machine, study_dir)
    if found is not None:
        path, document = found
        cheapest = document.get("cheapest")
        if design is not None and cheapest == design:
            return f"design {design} chosen by {_study_words(path, document)} (results/design-study/{path.name})"
        return (f"{_study_words(path, document)}, found {cheapest} cheapest; this run ran {ran} — set the "
                f"scenario's design and overrides to {cheapest}'s "
                f"(results/design-study/{path.name})")
    chooser = next((_study_words(path, doc) for path, doc in _studies(study_dir)
                    if design is not None and doc.get("cheapest") == design), None)
    return (f"no study of this machine ({_machine_words(machine)}); ran {ran}"
            + (f", chosen by {chooser}" if chooser else "") + f"; make one with {MEASURE_COMMAND}")


def _machine_words(machine: Mapping[str, Any]) -> str:
    return (f"{machine.get('name', 'unknown')}, {machine.get('device') or 'unknown device'}, "
            f"{machine.get('cpu_count')} CPUs")


def design_ran(manifest: Manifest) -> str:
    """The run's design in words, from the manifest's scenario (``[gate]`` min/max_sessions, ``[workload]``
    repeats and rounds_per_session): fixed or group-sequential; "not recorded" for imported runs."""
    blocks = manifest.scenario_value("workload", "repeats")
    rounds = manifest.scenario_value("workload", "rounds_per_session")
    if blocks is None:
        return "not recorded (no scenario in the manifest)"
    per_block = f", {rounds} round(s) per session" if rounds else ""
    max_sessions = manifest.scenario_value("gate", "max_sessions")
    if max_sessions:
        return (f"group-sequential (a look after every block from {manifest.scenario_value('gate', 'min_sessions')} "
                f"sessions per arm on, at most {max_sessions} blocks{per_block})")
    return f"fixed ({blocks} session blocks judged once{per_block})"


def _row(row: Mapping[str, Any], cheapest: str | None) -> dict[str, Any]:
    spread = row.get("spread") or {}
    return {"design": row.get("design"), "description": row.get("description", ""),
            "cheapest": row.get("design") == cheapest,
            "blocks": row.get("blocks"), "rounds": row.get("rounds_per_session"), "pooled": spread.get("pooled") or {},
            "wall_per_block_s": spread.get("wall_per_block_s"), "cost_s": spread.get("cost_s"),
            "blocks_3pct": spread.get("blocks_3pct"), "overall": row.get("overall")}


def designs_section(manifest: Manifest, verdict: Any, study_dir: Path | None = None) -> dict[str, Any]:
    """``{"machine": str, "study": None | {"source", "updated_at", "cheapest", "rows": [{design, description,
    cheapest, blocks, rounds, pooled {pairs, sd, low, high}, wall_per_block_s, cost_s, blocks_3pct, overall}]},
    "this_run": None | verdict.json's noise, "ran": this run's design in words, "elsewhere": the other machines'
    studies in words, "command": how to measure this machine, "choice": :func:`design_choice` of the scenario's
    design}``."""
    platform = manifest.platform
    found = measured_study(platform.identity(), study_dir)
    study = None
    if found is not None:
        path, document = found
        rows = [_row(row, document.get("cheapest")) for row in document.get("designs") or []
                if isinstance(row, Mapping)]
        rows.sort(key=lambda r: r["cost_s"] if isinstance(r["cost_s"], (int, float)) else float("inf"))
        study = {"source": path.name, "updated_at": document.get("updated_at"), "cheapest": document.get("cheapest"),
                 "rows": rows}
    noise = verdict.get("noise") if isinstance(verdict, Mapping) else None
    elsewhere = [f"{_machine_words(doc.get('machine') or {})} (results/design-study/{path.name})"
                 for path, doc in _studies(study_dir) if found is None or path != found[0]]
    return {"machine": f"{platform.name}, {platform.device or 'unknown device'}, {platform.cpu_count} CPUs",
            "study": study, "this_run": noise if isinstance(noise, Mapping) else None,
            "ran": design_ran(manifest), "elsewhere": elsewhere, "command": MEASURE_COMMAND,
            "choice": design_choice(platform.identity(), manifest.scenario_value("design"), study_dir),
            "design": manifest.scenario_value("design")}
