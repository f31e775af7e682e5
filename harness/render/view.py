"""Turn a run directory into the plain data the report template shows (the "view model").

Reads only through :class:`harness.rundir.store.RunDir` (the typed manifest, ``levels.csv``, ``requests.csv``, the
summaries and the file listing of ``raw/`` and ``logs/``); writes nothing. Every field tolerates a partial run: an arm,
a level or a CSV that is missing yields "not run"/"—" in the page instead of an exception.

Optional sections (verdict with intervals, GSM8K per arm with McNemar, output parity, MTP acceptance)
are passed in as plain dicts through ``sections=``; see :data:`SECTION_KEYS` and :func:`build_context`. The GSM8K,
parity and MTP sections are also read from the run directory when not passed (:func:`harness.render.sections.load_sections`: ``parity.json``,
``accuracy/summary.json``, the MTP columns of ``levels.csv``). Without data the page says "not measured in this run".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

from harness.render import answer
from harness.render.arms import ArmView, arm_differences, build_arm
from harness.render.designs import designs_section
from harness.render.levels import LevelView, build_levels
from harness.render.metrics_table import ARMS, BASELINE, CANDIDATE, METRICS
from harness.render.sections import load_sections
from harness.render.startup import startup_section
from harness.render.correctness import correctness_section, tie_band
from harness.render.text import show
from harness.rundir import store as records
from harness.rundir.schema import Level, Manifest
from harness.rundir.store import RunDir

SECTION_KEYS: tuple[str, ...] = ("verdict", "gsm8k", "parity", "mtp")
"""Optional sections the template renders when given data (see :func:`build_context` for their shapes)."""


@dataclass(frozen=True)
class Banner:
    """A line shown at the top of the page; ``kind`` is a CSS class: "invalid", "warn" or "info"."""

    kind: str
    text: str


class _Lenient(dict):
    """A section dict whose missing keys read as ``None``, so a producer may leave optional fields out."""

    def __missing__(self, key: str) -> None:
        return None


def _lenient(value: Any) -> Any:
    """Copy ``value`` with every mapping turned into a :class:`_Lenient` (lists and tuples walked)."""
    if isinstance(value, Mapping):
        return _Lenient({str(k): _lenient(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return [_lenient(v) for v in value]
    return value


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def model_label(manifest: Manifest) -> str:
    """The model the run served, from the resolved scenario (``model.path``/``id``/``name``, or a plain string)."""
    model = manifest.scenario_value("model")
    if isinstance(model, Mapping):
        for key in ("path", "id", "name"):
            if model.get(key):
                return str(model[key])
        return show(model)
    return str(model) if model else "—"


def model_details(manifest: Manifest) -> list[tuple[str, str]]:
    """The scenario's model block as (key, value) pairs, for the header."""
    model = manifest.scenario_value("model")
    if isinstance(model, Mapping):
        return [(str(key), show(value)) for key, value in model.items()]
    return []


def _timing(manifest: Manifest) -> list[tuple[str, str]]:
    """Harness timing rows: wall, server start, benchmark, client import, overhead, each with its share of wall."""
    timing = manifest.timing
    if not timing:
        return []
    wall = records.finite_float(timing.get("wall_s"))
    rows = []
    for key, label in (("wall_s", "Wall time"), ("server_start_s", "Server start (both arms)"),
                       ("benchmark_s", "Benchmark (measured load, incl. warmups)"),
                       ("client_import_s", "Benchmark client import (once)"),
                       ("pilot_s", "Pilot levels (sizing levels to workload.min_level_s)"),
                       ("harness_overhead_s", "Harness overhead")):
        if (key == "client_import_s" and key not in timing) or (key == "pilot_s" and not timing.get(key)):
            continue
        value = records.finite_float(timing.get(key))
        text = "—" if value is None else f"{value:,.1f} s"
        if value is not None and wall and key != "wall_s":
            text += f" ({value / wall * 100:.1f} % of wall)"
        rows.append((label, text))
    share = records.finite_float(timing.get("harness_share"))
    overhead = records.finite_float(timing.get("harness_overhead_s"))
    if share is None and overhead is not None and wall:
        share = overhead / wall
    rows.append(("Harness share", "—" if share is None else f"{share * 100:.1f} %"))
    return rows


def _prompt_counts(manifest: Manifest, levels) -> str:
    """Prompts per measured level: the pilot's line (``workload.min_level_s``), else completed + failed requests per
    level as ``levels.csv`` has them (empty without rows)."""
    if manifest.pilot is not None:
        return manifest.pilot.describe()
    counts: dict[Level, int] = {}
    for text, completed, failed in zip(levels["level"], levels["completed"], levels["failed"]):
        level, values = Level.parse(text), [records.finite_float(v) for v in (completed, failed)]
        if level is not None and None not in values:
            counts[level] = max(counts.get(level, 0), int(values[0] + values[1]))
    several = len({level.regime for level in counts}) > 1
    return (", ".join(f"{level.label(regime=several)}: {n}" for level, n in sorted(counts.items()))
            + " (the scenario's counts)" if counts else "")


def _schedule(manifest: Manifest) -> str:
    """The run order from the manifest's ``schedule`` ((arm, level, round) items) as one line."""
    levels = {text: Level.parse(text) for _, text, _ in manifest.schedule}
    several = len({level.regime for level in levels.values() if level is not None}) > 1
    return " → ".join(f"{arm} {levels[text].label(regime=several) if levels[text] else text} r{round_}"
                      for arm, text, round_ in manifest.schedule)


def _banners(manifest: Manifest, arms: list[ArmView], differences: list[tuple[str, str, str]]) -> list[Banner]:
    """What the reader must know before the figures: imported results, or two identical arms. (An INVALID arm, a
    partial run and levels not completed are on the arm and health lines and in the grouped reasons.)"""
    if manifest.imported_from:
        return [Banner("warn", f"Imported, not attested: these results were measured by other tooling and read from "
                               f"{show(manifest.imported_from)} (dsa-bench import); no server log was read, so "
                               "neither arm's execution path is known.")]
    if all(arm.present for arm in arms) and not differences:
        return [Banner("warn", "The two arms have identical server commands, environments and benchmark commands: "
                               "this run compares a path with itself (fine for an A/A check only).")]
    return []


def first_screen(store: RunDir, manifest: Manifest, verdict: Any, levels: list[LevelView],
                 designs: Mapping[str, Any]) -> dict[str, Any]:
    """The answer at the top of the page (:mod:`harness.render.answer`): ``words``, ``reason``, ``rows`` (the forest
    rows), ``next_step``, ``arm_lines``, ``health``."""
    document = verdict if isinstance(verdict, Mapping) else None
    rows = answer.forest_rows(document)
    overall = document.get("overall") if document else None
    return {
        "overall": overall,
        "words": answer.WORDS.get(str(overall), "No verdict yet: this run has not been judged."),
        "reason": show(document.get("reason")) if document and document.get("reason") else "",
        "rows": rows,
        "next_step": answer.next_step(document, rows, designs, str(store.path)),
        "arm_lines": [answer.arm_line(manifest.arm(name), name, manifest.versions, bool(manifest.imported_from))
                      for name in ARMS],
        "health": answer.health_line(manifest, levels),
    }


def build_context(run_dir: Path, sections: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything the template needs, read from ``run_dir``.

    ``sections`` optionally fills the later-issue sections (each key absent or ``None`` → "not measured in this run";
    a string → "not measured" with that reason). Keys not passed are read from the run directory
    (:func:`load_sections`). Shapes (all values plain, all strings escaped by the template):

    - ``verdict``: ``{"overall": "PASS"|"FAIL"|"INCONCLUSIVE"|"INVALID", "policy": str, "cells": [{"concurrency",
      "metric", "delta_pct", "ci_low_pct", "ci_high_pct", "margin_pct", "result", "note"}]}``; cells whose metric is a
      ``levels.csv`` column also give the Δ % plot its error bars.
    - ``gsm8k``: ``{"arms": [{"arm", "filter", "accuracy_pct", "stderr_pct", "n"}], "paired": [{"filter",
      "difference_pts", "baseline_only", "candidate_only", "p_value", "ci_low_pts", "ci_high_pts", "ci_level"}],
      "notes": [str],
      "setup": str, "reference": str}``.
    - ``parity``: ``{"exact_match_rate_pct", "prompts_total", "tolerance", "max_logprob_diff", "near_ties",
      "failures", "divergences": [{"prompt_index", "prompt", "position", "max_logprob_diff", "margin",
      "near_tie"}]}``.
    - ``mtp``: ``{"rows": [{"concurrency", "arm", "acceptance_rate_pct", "acceptance_length", "per_position" (%),
      "drafts", "draft_tokens", "accepted"}], "num_speculative_tokens", "plot": {"uri", "alt", "caption"},
      "reference": str}``.

    Raises:
        RunDirError: the manifest is missing/unreadable, or a CSV exists but is unreadable or lacks a column.
    """
    store = RunDir(run_dir)
    manifest = store.manifest()
    levels, requests = store.levels(), store.requests()
    arms = [build_arm(name, manifest.arm(name)) for name in ARMS]
    level_views = build_levels(manifest, levels, requests)
    differences = arm_differences(manifest.arm(BASELINE), manifest.arm(CANDIDATE))
    started, ended = _parse_time(manifest.started_at), _parse_time(manifest.ended_at)
    elapsed = f"{(ended - started).total_seconds():,.0f} s" if started and ended else "—"
    platform = manifest.platform.model_dump()
    scenario = manifest.scenario
    given = dict(sections or {})
    unknown = set(given) - set(SECTION_KEYS)
    if unknown:
        raise ValueError(f"unknown report sections {sorted(unknown)}; expected a subset of {SECTION_KEYS}")
    for key, value in load_sections(store, manifest, levels, given.get("verdict")).items():
        given.setdefault(key, value)        # a section passed in wins over the run directory's files
    designs = designs_section(manifest, given.get("verdict"))
    return {
        "run_id": show(manifest.run_id or store.path.name),
        "status": show(manifest.status),
        "schema_version": show(store.version),
        "started_at": show(manifest.started_at),
        "ended_at": show(manifest.ended_at),
        "elapsed": elapsed,
        "scenario_name": show(manifest.scenario_name),
        "scenario_file": show(manifest.scenario_file),
        "scenario_description": show(scenario.get("description") or ""),
        "scenario_json": json.dumps(scenario, indent=2, default=str) if scenario else "",
        "model": model_label(manifest),
        "model_details": model_details(manifest),
        "platform": [(str(k), show(v)) for k, v in platform.items() if v is not None],
        "platform_name": show(manifest.platform.name),
        "device": show(manifest.platform.device),
        "versions": [(str(k), show(v)) for k, v in manifest.versions.items()],
        "git_sha": show(manifest.git_sha),
        "notes": [show(note) for note in manifest.notes],
        "timing": _timing(manifest),
        "schedule": _schedule(manifest),
        "prompt_counts": show(_prompt_counts(manifest, levels)),
        "arms": arms,
        "levels": level_views,
        "differences": differences,
        "banners": _banners(manifest, arms, differences),
        "level_reasons": answer.level_reasons(manifest),
        "answer": first_screen(store, manifest, given.get("verdict"), level_views, designs),
        "startup": startup_section(manifest),
        "correctness": correctness_section(given.get("verdict")),
        "token_tie_band": tie_band(given.get("verdict")),
        "decode_tie_band": tie_band(given.get("verdict"), "decode_tolerance", "nats/position"),
        "confidence_band": tie_band(given.get("verdict"), "confidence_tolerance", "nats/token"),
        "designs": designs,
        "files": store.listing(),
        "metrics": METRICS,
        "sections": {key: _lenient(given.get(key)) for key in SECTION_KEYS},
    }
