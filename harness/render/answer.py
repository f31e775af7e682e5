"""The report's first screen: the verdict in words, the forest-plot rows (one per primary cell and pooled hypothesis
of ``verdict.json``), the next step, one line per arm and one line of run health.

Pure: functions of the ``verdict.json`` document (a plain dict, :class:`harness.rundir.schema.VerdictDocument`'s
shape), the typed manifest and the per-level views; no I/O. Display names and units come from the metric registry
(:data:`harness.metrics.METRICS`), never the internal names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from harness.metrics import METRICS
from harness.render.levels import LevelView
from harness.rundir.schema import ArmRecord, Level, Manifest, Regime

WORDS = {
    "PASS": "PASS: the candidate is non-inferior to the baseline in every primary cell, within its margin.",
    "FAIL": "FAIL: the candidate is worse than the baseline beyond the margin in at least one primary cell.",
    "INCONCLUSIVE": "INCONCLUSIVE: the data can neither pass nor fail the candidate yet.",
    "INVALID": "INVALID: at least one primary cell could not be judged, so this run decides nothing.",
}
"""The overall verdict in words (harness.judge.verdict: FAIL before INVALID before INCONCLUSIVE before PASS)."""


@dataclass(frozen=True)
class ForestRow:
    """One row of the forest plot: a primary cell (``where`` "c=4", "GSM8K") or a pooled hypothesis ("pooled").

    ``delta``/``low``/``high``/``margin`` are in ``unit`` ("%" of baseline, or "pt" accuracy points), exactly
    ``verdict.json``'s ``delta``/``ci_low``/``ci_high``/``margin``; ``low``/``high`` are None without an interval
    (``gap`` says why). ``status`` is the cell's result (None: a pooled hypothesis that was not rejected)."""

    metric: str
    label: str                  # registry display name with unit: "Output throughput (tok/s)"
    where: str
    concurrency: int | None
    pooled: bool
    delta: float | None
    low: float | None
    high: float | None
    margin: float
    unit: str
    status: str | None
    higher_is_better: bool
    gap: str                    # why there is no interval ("not enough sessions (2 of 3)"), "" with one
    note: str                   # what the cell needs or why it is INVALID, in words ("" when nothing to say)


def display_name(metric: str, fallback: str = "") -> str:
    """``"Output throughput (tok/s)"``: the registry's label and unit of ``metric`` (``fallback`` or the name when
    the registry lacks it)."""
    spec = METRICS.get(metric)
    if spec is None:
        return fallback or metric
    return f"{spec.label} ({spec.unit})" if spec.unit else spec.label


def _field(cell: Mapping[str, Any], key: str) -> float | None:
    """``verdict.json``'s ``delta``/``ci_low``/``ci_high``, or the unit-suffixed twin (``delta_pct``, ``ci_low_pts``) a
    hand-made section may give instead."""
    for name in (key, f"{key}_pct", f"{key}_pts"):
        value = _number(cell.get(name))
        if value is not None:
            return value
    return None


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def interval_gap(cell: Mapping[str, Any], min_sessions: int | None) -> str:
    """Why a cell has no interval: ``"not enough sessions (2 of 3)"`` when it has fewer paired sessions than the
    policy's ``min_sessions``, else ``"no interval"``; ``""`` when it has one."""
    if _field(cell, "ci_low") is not None and _field(cell, "ci_high") is not None:
        return ""
    repeats = cell.get("repeats")
    if cell.get("result") == "INCONCLUSIVE" and min_sessions and isinstance(repeats, int) and repeats < min_sessions:
        return f"not enough sessions ({repeats} of {min_sessions})"
    if cell.get("result") == "INCONCLUSIVE" and any("single server session" in str(n) for n in cell.get("notes") or []):
        return f"not enough sessions (1 of {min_sessions or '≥ 2'})"
    return "no interval"


def forest_rows(verdict: Mapping[str, Any] | None) -> list[ForestRow]:
    """The primary cells of ``verdict.json`` in its order, each metric's pooled hypothesis after its levels."""
    if not isinstance(verdict, Mapping):
        return []
    min_sessions = (verdict.get("policy_fields") or {}).get("min_sessions")
    cells = [c for c in verdict.get("cells") or [] if isinstance(c, Mapping)]
    pooled = {(c.get("metric"), c.get("regime")): c for c in verdict.get("pooled") or [] if isinstance(c, Mapping)}
    several = len({c.get("regime") for c in cells if c.get("regime")}) > 1
    ordered: list[Mapping[str, Any]] = []
    for cell in cells:
        ordered.append(cell)
        key = (cell.get("metric"), cell.get("regime"))
        following = [c for c in cells[cells.index(cell) + 1:] if (c.get("metric"), c.get("regime")) == key]
        if not following and key in pooled:
            ordered.append(pooled.pop(key))
    ordered += list(pooled.values())
    rows = []
    for cell in ordered:
        is_pooled = bool(cell.get("pooled"))
        level = cell.get("concurrency")
        rows.append(ForestRow(
            metric=str(cell.get("metric")), label=display_name(str(cell.get("metric")), str(cell.get("label") or "")),
            where=_where(cell, several),
            concurrency=level, pooled=is_pooled, delta=_field(cell, "delta"), low=_field(cell, "ci_low"),
            high=_field(cell, "ci_high"), margin=_field(cell, "margin") or 0.0,
            unit=str(cell.get("delta_unit") or "%"), status=cell.get("result"),
            higher_is_better=bool(cell.get("higher_is_better", True)), gap=(gap := interval_gap(cell, min_sessions)),
            note=_note(cell, gap, min_sessions)))
    return rows


def _where(cell: Mapping[str, Any], several_regimes: bool) -> str:
    """Where a forest row's cell sits: ``"c=4"`` (``"c=4 · 1024→512 random"`` when the run has several regimes),
    ``"pooled"`` (``"pooled · <regime>"``), or ``"GSM8K"``."""
    regime = Regime.parse(cell.get("regime"))
    if cell.get("pooled"):
        return f"pooled · {regime.label()}" if several_regimes and regime else "pooled"
    level = Level.parse(cell.get("level"))
    if level is not None:
        return level.label(regime=several_regimes)
    return "GSM8K" if cell.get("concurrency") is None else f"c={cell.get('concurrency')}"


def _note(cell: Mapping[str, Any], gap: str, min_sessions: int | None) -> str:
    """The cell's note; for want of sessions, what decides instead of the verdict's terse "run ≈N"."""
    if gap.startswith("not enough sessions"):
        needed = cell.get("repeats_needed")
        return (f"a throughput or latency PASS or FAIL needs at least {min_sessions or 2} server sessions per arm"
                + (f"; about {needed} per arm are recommended" if isinstance(needed, int) else ""))
    if cell.get("note"):
        return str(cell["note"])
    return "; ".join(str(n) for n in cell.get("notes") or [])


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value:+.{2 if unit == 'pt' else 1}f} {unit}"


def row_text(row: ForestRow) -> str:
    """``"Output throughput (tok/s) c=1: −23.4 % [−74.2, +127.4], margin −3 %"``."""
    interval = (f" [{row.low:+.1f}, {row.high:+.1f}]" if row.low is not None and row.high is not None
                else f" ({row.gap})" if row.gap else "")
    return f"{row.label} {row.where}: {_fmt(row.delta, row.unit)}{interval}, margin {row.margin:+g} {row.unit}"


def _levels_text(rows: Sequence[ForestRow]) -> str:
    """``"Output throughput (tok/s) at c=1, 4; Mean TPOT (ms) at c=4"``: rows grouped by metric."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(row.label, []).append(row.where)
    return "; ".join(label if wheres == ["GSM8K"] else f"{label} at {', '.join(wheres)}"
                     for label, wheres in groups.items())


UNFINISHED = ("interrupted", "running")
"""``verdict.json`` ``run_status`` of a run stopped before its last level (Ctrl-C, SIGTERM, a killed process): what
it lacks, ``dsa-bench compare --resume`` runs."""


def next_step(verdict: Mapping[str, Any] | None, rows: Sequence[ForestRow], designs: Mapping[str, Any] | None,
              run_dir: str) -> str:
    """One sentence of what to do next: which cell failed and by how much; what makes the run invalid; how many more
    sessions and minutes would decide an INCONCLUSIVE run, and the cheaper design when a study names one."""
    if not isinstance(verdict, Mapping):
        return f"Next: judge this run with `dsa-bench gate {run_dir}`, then re-render the report."
    overall = verdict.get("overall")
    if overall == "PASS":
        return "Next: nothing to do; on this evidence the candidate may merge (every primary cell is within its margin)."
    if overall == "FAIL":
        failed = [r for r in rows if r.status == "FAIL"]
        first = failed[0] if failed else None
        detail = f" ({row_text(first)})" if first is not None else ""
        return (f"Next: find the regression in {_levels_text(failed) or 'the failing cell'}{detail}: the whole "
                "interval lies beyond the margin, so more sessions will not turn it into a PASS.")
    if overall == "INVALID" and verdict.get("run_status") in UNFINISHED:
        return (f"Next: finish the run with `dsa-bench compare --resume {run_dir}` (its finished levels are kept), "
                "then judge it again: the levels that did not finish leave their cells INVALID.")
    if overall == "INVALID":
        cells = [c for c in verdict.get("cells") or [] if isinstance(c, Mapping) and c.get("result") == "INVALID"]
        reason = _clip(str(cells[0].get("note") or "") if cells else str(verdict.get("reason") or ""))
        invalid = [r for r in rows if r.status == "INVALID"]
        return (f"Next: fix what made {_levels_text(invalid) or 'the run'} INVALID ({reason.rstrip('.')}), then run "
                "the comparison again; no figure of an INVALID cell is evidence.")
    return _inconclusive_step(verdict, rows, designs)


def _clip(text: str, limit: int = 140) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters, "…" marking the cut (the whole reason is the
    gate line above the plot)."""
    text = text.rstrip(".")
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def _inconclusive_step(verdict: Mapping[str, Any], rows: Sequence[ForestRow], designs: Mapping[str, Any] | None) -> str:
    open_rows = [r for r in rows if r.status == "INCONCLUSIVE"]
    cells = [c for c in verdict.get("cells") or [] if isinstance(c, Mapping) and c.get("result") == "INCONCLUSIVE"]
    needed = [(c.get("repeats_needed"), c.get("repeats") or 0) for c in cells
              if isinstance(c.get("repeats_needed"), int)]
    noise = verdict.get("noise") if isinstance(verdict.get("noise"), Mapping) else {}
    block_s = _number(noise.get("wall_per_block_s"))
    text = f"Next: {_levels_text(open_rows) or 'the primary cells'} undecided"
    decide = _sessions_to_decide(verdict, needed) if needed else None
    if decide is None and needed:
        text += "; more sessions per arm than the advice's cap would be needed to decide every cell"
    elif decide is not None:
        sessions, more = decide
        text += f"; ≈{sessions} sessions per arm would decide"
        if more > 0 and block_s:
            text += f" (≈{more} more session blocks, ≈{more * block_s / 60:,.0f} more minutes at {block_s:,.0f} s each)"
    else:
        text += "; the spread is too wide for any affordable number of sessions on this design"
    cheaper = _cheaper_design(designs, _number(noise.get("cost_s")))
    return text + (f"; {cheaper}" if cheaper else "") + "."


def _sessions_to_decide(verdict: Mapping[str, Any], needed: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """(sessions per arm that would decide, how many more than the run has): the verdict's joint figure
    (``sessions_needed``, the one its reason quotes; None when it is beyond the advice's cap), else the largest
    per-cell figure (a ``verdict.json`` written before the field existed). ``needed``: (repeats_needed, repeats) per
    open cell, not empty."""
    per_cell = max(n for n, _ in needed), max(n - have for n, have in needed)
    if "sessions_needed" not in verdict:
        return per_cell
    joint, have = verdict["sessions_needed"], min(have for _, have in needed)
    if isinstance(joint, int):
        return joint, joint - have
    return per_cell if have < 2 else None   # one session measures no spread: no joint figure, the cells' advice


def _cheaper_design(designs: Mapping[str, Any] | None, cost_s: float | None) -> str:
    """``"the design concurrent-pinned costs 0.0083 sd²·s per decision on this machine (this run: 7.0)"``, or "" —
    also when the run already ran that design (its cost then differs by the run's own noise and levels, not by the
    design)."""
    study = (designs or {}).get("study") if isinstance(designs, Mapping) else None
    if not isinstance(study, Mapping) or not study.get("cheapest") or study["cheapest"] == designs.get("design"):
        return ""
    row = next((r for r in study.get("rows") or [] if r.get("design") == study.get("cheapest")), None)
    best = _number(row.get("cost_s")) if row else None
    if best is None or (cost_s is not None and best >= cost_s):
        return ""
    this = f" (this run: {cost_s:.3g})" if cost_s is not None else ""
    return f"the design {study['cheapest']} would be cheaper: {best:.3g} sd²·s per decision on this machine{this}"


def arm_line(arm: ArmRecord | None, name: str, versions: Mapping[str, Any], imported: bool) -> str:
    """``"candidate: vllm.models.deepseek_v32 · MRV2 · CompilationMode NONE · vLLM 0.32.0 (abc1234) · attested"``."""
    if arm is None:
        return f"{name}: not started"
    observed, intended = arm.observed or {}, arm.intended or {}
    def knob(key: str) -> Any:
        return observed.get(key) if observed.get(key) is not None else intended.get(key)
    runner = knob("model_runner")
    parts = [f"route {arm.route}"]
    if observed.get("architecture"):
        parts.append(str(observed["architecture"]))
    if runner:
        parts.append({"v1": "MRV1", "v2": "MRV2"}.get(str(runner), str(runner)))
    if knob("compilation_mode") is not None:
        parts.append(f"CompilationMode {knob('compilation_mode')}")
    if knob("breakable_cudagraph") is not None:
        parts.append("breakable CUDA graphs " + ("on" if knob("breakable_cudagraph") else "off"))
    build = arm.build
    version = (build.version if build is not None and build.version else None) or versions.get("vllm")
    if version:
        commit = f" ({build.commit[:10]})" if build is not None and build.commit else ""
        parts.append(f"vLLM {version}{commit}")
    valid = arm.attestation.valid
    if imported:
        parts.append("not attested (imported)")
    elif valid is True:
        parts.append("attested")
    elif valid is False:
        parts.append("INVALID: " + ("; ".join(arm.attestation.mismatches) or "observed ≠ intended"))
    else:
        parts.append("not attested")
    return f"{name}: " + " · ".join(parts)


def health_line(manifest: Manifest, levels: Sequence[LevelView]) -> str:
    """``"2 of 60 session blocks done; stopped: budget …; 0 of 96 requests failed; load average 1.7 → 7.4 on 2
    CPUs"``: what ran of the plan, what the budget's projection after block 1 changed (``manifest.budget``), why it
    stopped, failed requests, the host's load."""
    planned = manifest.scenario_value("workload", "repeats")
    done = [len({record.session for _, record in arm.level_items() if record.status == "done"})
            for arm in manifest.arms]
    blocks = min(done) if done else 0
    parts = [f"{blocks} of {planned} session blocks done" if isinstance(planned, int) else f"{blocks} session blocks done"]
    if manifest.budget is not None and manifest.budget.outcome == "adapted":
        parts.append(manifest.budget.describe())
    if manifest.stopped is not None:
        parts.append(f"stopped early ({manifest.stopped.reason})")
    elif manifest.status != "done":
        parts.append(f"run status {manifest.status}")
    requests = sum(info.requests for level in levels for info in level.arms.values())
    failed = sum(info.request_errors for level in levels for info in level.arms.values())
    parts.append(f"{failed:,} of {requests:,} requests failed")
    platform = manifest.platform
    if platform.load_avg_at_start or platform.load_avg_at_end:
        parts.append(f"1-min load average {_first(platform.load_avg_at_start)} → {_first(platform.load_avg_at_end)}"
                     f" on {platform.cpu_count or '?'} CPUs")
    return "; ".join(parts) + "."


def _first(load: str | None) -> str:
    return (load or "—").split("/")[0].strip()


@dataclass(frozen=True)
class LevelReason:
    """One reason some levels did not complete (a manifest level status other than "done"), stated once, with the
    levels it applies to: ``where`` is ``"baseline c=1 r2–r7, c=4 r2–r7; candidate c=1 r2–r7"``."""

    status: str
    where: str
    count: int


def _ranges(rounds: Sequence[int]) -> str:
    """``[2, 3, 4, 7]`` → ``"r2–r4, r7"``."""
    values, spans = sorted(set(rounds)), []
    for value in values:
        if spans and value == spans[-1][1] + 1:
            spans[-1][1] = value
        else:
            spans.append([value, value])
    return ", ".join(f"r{a}" if a == b else f"r{a}–r{b}" for a, b in spans)


def level_reasons(manifest: Manifest) -> list[LevelReason]:
    """The manifest's level statuses other than "done", grouped by status text, most levels first."""
    groups: dict[str, dict[str, dict[Level, list[int]]]] = {}
    for arm in manifest.arms:
        for key, record in arm.level_items():
            status = record.status or "unknown"
            if status != "done":
                groups.setdefault(status, {}).setdefault(arm.name, {}).setdefault(key.level, []).append(key.round)
    several = len({key.level.regime for arm in manifest.arms for key, _ in arm.level_items()}) > 1
    reasons = []
    for status, arms in groups.items():
        where = "; ".join(f"{arm} " + ", ".join(f"{level.label(regime=several)} {_ranges(rounds)}"
                                                for level, rounds in sorted(levels.items()))
                          for arm, levels in arms.items())
        count = sum(len(rounds) for levels in arms.values() for rounds in levels.values())
        reasons.append(LevelReason(status, where, count))
    return sorted(reasons, key=lambda r: -r.count)
