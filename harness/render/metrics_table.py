"""The per-level tables of the report: which metrics of the registry (:mod:`harness.metrics`) they show, Δ %,
its colour, number formats and the median/min–max summary over rounds. Pure; no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from harness.metrics import METRICS as ALL_METRICS, REPORT_TABLE, Metric, finite_float

BASELINE = "baseline"
CANDIDATE = "candidate"
ARMS: tuple[str, str] = (BASELINE, CANDIDATE)

DELTA_FORMULA = "Δ % = (candidate − baseline) / baseline × 100"


METRICS: tuple[Metric, ...] = tuple(ALL_METRICS[name] for name in REPORT_TABLE)
"""Metrics with a Δ % column, in table order (their ``name`` is the ``levels.csv`` column)."""

METRIC_BY_NAME = {metric.name: metric for metric in METRICS}


def delta_pct(baseline: float | None, candidate: float | None) -> float | None:
    """Δ % = (candidate − baseline) / baseline × 100, or ``None`` when either side is missing/NaN or baseline is 0."""
    if baseline is None or candidate is None:
        return None
    if not (math.isfinite(baseline) and math.isfinite(candidate)) or baseline == 0:
        return None
    return (candidate - baseline) / baseline * 100.0


def delta_class(metric: Metric, delta: float | None) -> str:
    """CSS class for a Δ %: ``"better"``, ``"worse"`` or ``""`` (missing, or rounds to 0.0 %).

    Colour shows direction only; it is not a significance judgement (that is the verdict's job).
    """
    if delta is None or abs(delta) < 0.05:
        return ""
    improved = delta > 0 if metric.higher_is_better else delta < 0
    return "better" if improved else "worse"


def fmt_value(value: float | None) -> str:
    """Format a metric value for a table cell: ``—`` for missing/NaN/non-numbers, 3 significant digits below 1,
    else 2 decimals with thousands separators."""
    value = finite_float(value)
    if value is None:
        return "—"
    if value != 0 and abs(value) < 1:
        return f"{value:#.3g}"
    return f"{value:,.2f}"


def fmt_delta(delta: float | None) -> str:
    """Format a Δ % with its sign and one decimal (``+10.8 %``), ``—`` when undefined."""
    delta = finite_float(delta)
    if delta is None:
        return "—"
    return f"{delta:+.1f} %"


@dataclass(frozen=True)
class Summary:
    """A metric over the repeats of one arm × level: ``value`` is the median across repeats (the value itself when
    there is one repeat), ``low``/``high`` the min–max spread, ``n`` the number of repeats with a finite value."""

    value: float | None
    low: float | None
    high: float | None
    n: int


def summarize(values: Sequence[float]) -> Summary:
    """Median and min–max of the finite entries of ``values`` (NaN/None skipped); all ``None`` when none is finite."""
    finite = sorted(float(v) for v in values if v is not None and math.isfinite(float(v)))
    if not finite:
        return Summary(None, None, None, 0)
    mid = len(finite) // 2
    median = finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2
    return Summary(median, finite[0], finite[-1], len(finite))
