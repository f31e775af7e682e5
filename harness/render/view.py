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

from harness.render.arms import ArmView, arm_differences, build_arm
from harness.render.sections import load_sections
from harness.render.text import show
from harness.rundir import store as records
from harness.rundir.schema import ArmRecord, Manifest
from harness.rundir.store import RunDir
from harness.metrics import SERVER_SIDE, achieved_concurrency, succeeded
from harness.render.metrics_table import (
    ARMS,
    BASELINE,
    CANDIDATE,
    METRICS,
    Metric,
    Summary,
    delta_class,
    delta_pct,
    summarize,
)

SECTION_KEYS: tuple[str, ...] = ("verdict", "gsm8k", "parity", "mtp")
"""Optional sections the template renders when given data (see :func:`build_context` for their shapes)."""


@dataclass(frozen=True)
class MetricRow:
    """One metric at one level: baseline and candidate summaries over repeats, and Δ % of their medians."""

    metric: Metric
    baseline: Summary
    candidate: Summary
    delta: float | None
    delta_class: str


@dataclass(frozen=True)
class ArmLevel:
    """What one arm did at one level: status from the manifest, load facts from the CSVs."""

    status: str                 # "done", "failed: <reason>", "skipped", "not run", or "r0: done; r1: failed: …"
    status_class: str           # "ok" | "failed" | "missing"
    status_short: str           # the word before the reason: "done", "failed", "skipped", "pending", "not run", "mixed"
    repeats: int                # rows in levels.csv
    completed: Summary
    failed: Summary
    duration_s: Summary
    max_concurrent: Summary
    client_cpu_util: Summary    # benchmark client CPU seconds / level wall seconds
    host_steal: Summary         # the host's CPU steal share over the level (0..1, /proc/stat)
    load_avg: Summary           # the host's 1-minute load average at the level's end
    requests: int               # rows in requests.csv
    request_errors: int
    output_len_range: str       # server-counted output tokens of successful requests, "min–max"
    errors: list[tuple[str, int]]  # distinct error messages with counts, most frequent first (at most 5)


@dataclass(frozen=True)
class LevelView:
    """One concurrency level: per-arm facts and the metric rows of its table."""

    concurrency: int
    arms: dict[str, ArmLevel]
    rows: list[MetricRow]
    max_repeats: int

    @property
    def anchor(self) -> str:
        """HTML id of the level's section."""
        return f"level-c{self.concurrency}"

    @property
    def has_data(self) -> bool:
        """Whether any arm has a ``levels.csv`` row at this level."""
        return any(arm.repeats for arm in self.arms.values())


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


def _level_statuses(arm: ArmRecord | None) -> dict[int, list[tuple[int, str]]]:
    """``{concurrency: [(round, status), ...]}`` from an arm's manifest levels (unparseable keys skipped)."""
    result: dict[int, list[tuple[int, str]]] = {}
    for key, info in arm.level_items() if arm is not None else []:
        result.setdefault(key.concurrency, []).append((key.round, info.status or "unknown"))
    return result


def _status_text(entries: list[tuple[int, str]]) -> tuple[str, str, str]:
    """(full text, CSS class, short word) of a level's manifest statuses over its repeats."""
    if not entries:
        return "not run", "missing", "not run"
    statuses = [status for _, status in entries]
    if len(set(statuses)) == 1:
        text, short = statuses[0], statuses[0].split(":")[0]
    else:
        text = "; ".join(f"r{repeat}: {status}" for repeat, status in entries)
        short = "mixed"
    if all(status == "done" for status in statuses):
        return text, "ok", short
    if any(status.startswith("failed") for status in statuses):
        return text, "failed", short
    return text, "missing", short


def _level_universe(manifest: Manifest, levels, requests) -> list[int]:
    """Every concurrency the run declared or touched: scenario workload, manifest level keys and both CSVs."""
    found: set[int] = set()
    declared = manifest.scenario_value("workload", "concurrency")
    if isinstance(declared, (list, tuple)):
        found.update(int(c) for c in declared if isinstance(c, (int, float)) and not isinstance(c, bool))
    for arm in manifest.arms:
        found.update(_level_statuses(arm))
    for frame in (levels, requests):
        if len(frame):
            found.update(int(c) for c in frame["concurrency"].dropna().unique())
    return sorted(found)


def _request_facts(frame) -> tuple[int, int, str, list[tuple[str, int]]]:
    if not len(frame):
        return 0, 0, "—", []
    # The column is float (all NaN) when no request failed, so map cell by cell instead of fillna("").
    errors = frame["error"].map(lambda v: "" if records.finite_float(v) is None and not isinstance(v, str) else str(v)).str.strip()
    bad = errors != ""
    ok_lens = frame.loc[~bad, "output_len"].dropna()
    if len(ok_lens):
        low, high = int(ok_lens.min()), int(ok_lens.max())
        length_range = f"{low}" if low == high else f"{low}–{high}"
    else:
        length_range = "—"
    counts = errors[bad].value_counts()
    distinct = [(str(message), int(count)) for message, count in counts.head(5).items()]
    return len(frame), int(bad.sum()), length_range, distinct


def _summary_of(frame, column: str) -> Summary:
    # A column the schema does not have (yet, or any more) reads as "not measured", never as an error.
    if not len(frame) or column not in frame.columns:
        return Summary(None, None, None, 0)
    return summarize([records.finite_float(v) if records.finite_float(v) is not None else float("nan") for v in frame[column].tolist()])


def _achieved(reqs) -> Summary:
    """Achieved concurrency per repeat by Little's law (Σ E2EL / span of the successful requests), summarized."""
    if not len(reqs):
        return Summary(None, None, None, 0)
    values = []
    for _, group in reqs.groupby("round"):
        value = achieved_concurrency(succeeded(group))
        values.append(value if value is not None else float("nan"))
    return summarize(values)


def _shown_metrics(levels) -> tuple[Metric, ...]:
    """The per-level table's metrics: every client metric, and the server-side ones (:data:`SERVER_SIDE`) only when
    ``levels.csv`` has a value for them (a run recorded without ``/metrics`` captures shows no empty server rows)."""
    def has_data(name: str) -> bool:
        return name in levels.columns and levels[name].notna().any()

    return tuple(m for m in METRICS if m.name not in SERVER_SIDE or has_data(m.name))


def build_levels(manifest: Manifest, levels, requests) -> list[LevelView]:
    """One :class:`LevelView` per concurrency, including levels that failed or never ran (kept visible).

    ``levels``/``requests`` are the frames of :meth:`RunDir.levels` and :meth:`RunDir.requests`.
    """
    statuses = {arm: _level_statuses(manifest.arm(arm)) for arm in ARMS}
    shown = _shown_metrics(levels)
    views = []
    for concurrency in _level_universe(manifest, levels, requests):
        per_arm: dict[str, ArmLevel] = {}
        frames = {}
        for arm in ARMS:
            rows = levels[(levels["arm"] == arm) & (levels["concurrency"] == concurrency)] if len(levels) else levels
            reqs = (requests[(requests["arm"] == arm) & (requests["concurrency"] == concurrency)]
                    if len(requests) else requests)
            frames[arm] = rows
            status, status_class, short = _status_text(statuses[arm].get(concurrency, []))
            if status == "not run" and len(rows):
                status, status_class, short = "done (no manifest status)", "ok", "done"
            n_requests, n_errors, length_range, errors = _request_facts(reqs)
            per_arm[arm] = ArmLevel(
                status=status, status_class=status_class, status_short=short, repeats=len(rows),
                completed=_summary_of(rows, "completed"), failed=_summary_of(rows, "failed"),
                duration_s=_summary_of(rows, "duration_s"),
                max_concurrent=_achieved(reqs),
                client_cpu_util=_summary_of(rows, "client_cpu_util"),
                host_steal=_summary_of(rows, "host_steal_fraction"), load_avg=_summary_of(rows, "load_avg_1m"),
                requests=n_requests, request_errors=n_errors, output_len_range=length_range, errors=errors,
            )
        metric_rows = []
        for metric in shown:
            base = _summary_of(frames[BASELINE], metric.name)
            cand = _summary_of(frames[CANDIDATE], metric.name)
            delta = delta_pct(base.value, cand.value)
            metric_rows.append(MetricRow(metric, base, cand, delta, delta_class(metric, delta)))
        views.append(LevelView(concurrency, per_arm, metric_rows, max(a.repeats for a in per_arm.values())))
    return views


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
    concurrency as ``levels.csv`` has them (empty without rows)."""
    if manifest.pilot is not None:
        return manifest.pilot.describe()
    counts: dict[int, int] = {}
    for concurrency, completed, failed in zip(levels["concurrency"], levels["completed"], levels["failed"]):
        values = [records.finite_float(v) for v in (concurrency, completed, failed)]
        if None not in values:
            key = int(values[0])
            counts[key] = max(counts.get(key, 0), int(values[1] + values[2]))
    return ", ".join(f"c={c}: {n}" for c, n in sorted(counts.items())) + " (the scenario's counts)" if counts else ""


def _schedule(manifest: Manifest) -> str:
    """The run order from the manifest's ``schedule`` ((arm, concurrency, round) items) as one line."""
    return " → ".join(f"{arm} c{concurrency} r{round_}" for arm, concurrency, round_ in manifest.schedule)


def _banners(manifest: Manifest, arms: list[ArmView], levels: list[LevelView],
             differences: list[tuple[str, str, str]]) -> list[Banner]:
    banners = []
    if manifest.imported_from:
        banners.append(Banner("warn", f"Imported, not attested: these results were measured by other tooling and "
                                      f"read from {show(manifest.imported_from)} (dsa-bench import); no server log "
                                      "was read, so neither arm's execution path is known."))
    elif all(arm.present for arm in arms) and not differences:
        banners.append(Banner("warn", "The two arms have identical server commands, environments and benchmark "
                                      "commands: this run compares a path with itself (fine for an A/A check only)."))
    for arm in arms:
        if arm.attestation == "INVALID":
            detail = "; ".join(arm.mismatches) or "attestation.valid is false"
            banners.append(Banner("invalid", f"INVALID: the {arm.name} arm did not run its intended path ({detail})."))
    status = manifest.status
    if status != "done":
        banners.append(Banner("warn", f"Partial run: run status is '{show(status)}'; figures cover what finished."))
    for arm in arms:
        if not arm.present:
            banners.append(Banner("warn", f"The {arm.name} arm is missing from the manifest (not started)."))
    troubled = [
        f"c={level.concurrency} {name}: {info.status}"
        for level in levels for name, info in level.arms.items() if info.status_class != "ok"
    ]
    if troubled:
        banners.append(Banner("warn", "Levels not completed: " + "; ".join(troubled) + "."))
    return banners


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
        "banners": _banners(manifest, arms, level_views, differences),
        "files": store.listing(),
        "metrics": METRICS,
        "sections": {key: _lenient(given.get(key)) for key in SECTION_KEYS},
    }
