"""The design study's markdown table (the README takes it verbatim) and the cheapest design of a study's rows.

A row per design (its output-throughput analysis), then one indented row per other analysis of the same runs that
had data (client TPOT, server TPOT, robust). Columns: blocks × rounds per session; the pooled paired sd with its
95 % χ² interval; the sd per level; within / between session sd (root mean square over levels); wall seconds per
block (per round); cost = sd² × wall per block (s) and the minutes it means to a 1 % standard error; blocks (and
minutes) for a ±3 % decision at the sd [at its 95 % upper bound]; the A/A verdict; the host's 1-minute load average
over the levels (median, range). A control's within / between cell also gives its base design's (before the
control); a line under the table gives the transparent-huge-page settings the runs recorded.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["cheapest", "markdown", "HEADER"]

HEADER = ("| design | blocks × rounds | paired sd, pooled [95 % CI] | sd per level | within / between sd | "
          "wall per block (round) | cost sd²·s (min to 1 % SE) | blocks for ±3 % [upper] (min) | A/A verdict | "
          "load avg (median, range) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def _n(value: Any, digits: int = 3) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    return f"{value:.{digits}f}"


def cheapest(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row with the least output-throughput cost per decision (None when no row has one)."""
    costed = [row for row in rows if isinstance((row.get("spread") or {}).get("cost_s"), (int, float))]
    return min(costed, key=lambda row: row["spread"]["cost_s"]) if costed else None


def _rms(values: list[float]) -> float | None:
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return math.sqrt(sum(v * v for v in finite) / len(finite)) if finite else None


def _within_between(row: dict[str, Any] | None) -> str | None:
    sessions = (row or {}).get("sessions")
    if not isinstance(sessions, list):
        return None
    return f"{_n(_rms([s['within'] for s in sessions]))} / {_n(_rms([s['between'] for s in sessions]))}"


def _sessions(row: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> str:
    """Within / between sd, and for a control its base design's (the spread before the control)."""
    own, before = _within_between(row), _within_between(by_name.get(row.get("base") or ""))
    return f"{own or '—'}" + (f" (base `{row['base']}`: {before})" if before else "")


def _cost_cells(spread: dict[str, Any]) -> list[str]:
    pooled = spread.get("pooled") or {}
    sd = (f"{_n(pooled.get('sd'))} [{_n(pooled.get('low'))}, {_n(pooled.get('high'))}], "
          f"{pooled.get('pairs', 0)} pairs")
    levels = ", ".join(f"c={s['concurrency']}: {_n(s['sd'])}" for s in spread.get("levels") or [])
    cost = f"{_n(spread.get('cost_s'), 4)} ({_n(spread.get('minutes_to_1pct_se'), 0)} min)"
    blocks = (f"{spread.get('blocks_3pct') or '—'} [{spread.get('blocks_3pct_upper') or '—'}] "
              f"({_n(spread.get('minutes_3pct'), 0)} min)")
    return [sd, levels or "—", cost, blocks]


def _load(row: dict[str, Any]) -> str:
    load = row.get("load") or {}
    if load.get("levels_median") is None:
        return f"start {load.get('at_start') or '—'}, end {load.get('at_end') or '—'}"
    return f"{_n(load['levels_median'], 1)} ({_n(load['levels_min'], 1)}–{_n(load['levels_max'], 1)})"


def _design_line(row: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> str:
    spread = row["spread"]
    sd, levels, cost, blocks = _cost_cells(spread)
    wall = f"{_n(spread.get('wall_per_block_s'), 0)} s ({_n(row.get('wall_per_round_s'), 0)} s)"
    cells = [f"`{row['design']}`", f"{row['blocks']} × {row['rounds_per_session']}", sd, levels,
             _sessions(row, by_name),
             wall, cost, blocks, str(row.get("overall") or "—"), _load(row)]
    return "| " + " | ".join(cells) + " |"


def _analysis_lines(row: dict[str, Any]) -> list[str]:
    lines = []
    for label, spread in (row.get("analyses") or {}).items():
        if "pooled" not in spread:
            continue
        sd, levels, cost, blocks = _cost_cells(spread)
        lines.append("| " + " | ".join([f"↳ {label}", "", sd, levels, "", "", cost, blocks, "", ""]) + " |")
    return lines


def markdown(rows: list[dict[str, Any]]) -> str:
    """The study table, designs in order of cost (cheapest first; rows without a cost last)."""
    def order(row: dict[str, Any]) -> float:
        cost = (row.get("spread") or {}).get("cost_s")
        return cost if isinstance(cost, (int, float)) else math.inf

    by_name = {row["design"]: row for row in rows}
    lines = [HEADER]
    for row in sorted(rows, key=order):
        lines += [_design_line(row, by_name), *_analysis_lines(row)]
    thp = sorted({json.dumps(row.get("thp"), sort_keys=True) for row in rows})
    return "\n".join(lines) + f"\n\nTransparent huge pages during the runs: {'; '.join(thp)}"
