"""The per-level metrics the report shows: names, units, direction and the formula printed beside each.

Pure data plus pure functions over pandas frames read from ``levels.csv``; no I/O. The names are the field's standard
ones (vLLM ``benchmarks/serve.py``): TTFT, TPOT, ITL, E2EL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

BASELINE = "baseline"
CANDIDATE = "candidate"
ARMS: tuple[str, str] = (BASELINE, CANDIDATE)

DELTA_FORMULA = "Δ % = (candidate − baseline) / baseline × 100"


@dataclass(frozen=True)
class Metric:
    """One ``levels.csv`` column as the report shows it.

    ``higher_is_better`` says which sign of Δ % is an improvement; ``short`` is the formula printed next to the
    metric in each level's table, ``formula`` the full definition in the definitions table.
    """

    column: str
    name: str
    unit: str
    higher_is_better: bool
    short: str
    formula: str

    @property
    def better(self) -> str:
        """``"↑ better"`` or ``"↓ better"``."""
        return f"{self.arrow} better"

    @property
    def arrow(self) -> str:
        """``"↑"`` (higher is better) or ``"↓"`` (lower is better)."""
        return "↑" if self.higher_is_better else "↓"


_TTFT = "TTFT = time from sending the request to receiving its first output token"
_TPOT = ("TPOT = (E2EL − TTFT) / (output_len − 1) per request, output_len counted by the server; "
         "requests with output_len ≤ 1 excluded")
_ITL = ("ITL = gap between consecutive streamed chunks, pooled over all requests "
        "(with speculative decoding a chunk can hold several tokens)")
_E2EL = "E2EL = time from sending the request to receiving its last token"
_PCT = "p99 = 99th percentile over requests (numpy, linear interpolation)"

_TPOT_SHORT = "(E2EL − TTFT) / (output_len − 1) per request"

METRICS: tuple[Metric, ...] = (
    Metric("output_throughput", "Output throughput", "tok/s", True, "Σ output tokens / duration",
           "Σ output tokens (server-counted) / benchmark duration"),
    Metric("total_token_throughput", "Total token throughput", "tok/s", True, "(Σ input + Σ output tokens) / duration",
           "(Σ input tokens + Σ output tokens) / benchmark duration"),
    Metric("request_throughput", "Request throughput", "req/s", True, "completed requests / duration",
           "completed requests / benchmark duration"),
    Metric("mean_ttft_ms", "Mean TTFT", "ms", False, "request sent → first token; mean",
           _TTFT + "; mean over requests"),
    Metric("median_ttft_ms", "Median TTFT", "ms", False, "request sent → first token; median",
           _TTFT + "; median over requests"),
    Metric("p99_ttft_ms", "P99 TTFT", "ms", False, "request sent → first token; p99", _TTFT + "; " + _PCT),
    Metric("mean_tpot_ms", "Mean TPOT", "ms", False, _TPOT_SHORT + "; mean", _TPOT + "; mean over requests"),
    Metric("median_tpot_ms", "Median TPOT", "ms", False, _TPOT_SHORT + "; median", _TPOT + "; median over requests"),
    Metric("p99_tpot_ms", "P99 TPOT", "ms", False, _TPOT_SHORT + "; p99", _TPOT + "; " + _PCT),
    Metric("mean_itl_ms", "Mean ITL", "ms", False, "gap between streamed chunks, pooled; mean", _ITL + "; mean"),
    Metric("p99_itl_ms", "P99 ITL", "ms", False, "gap between streamed chunks, pooled; p99",
           _ITL + "; 99th percentile"),
    Metric("mean_e2el_ms", "Mean E2EL", "ms", False, "request sent → last token; mean", _E2EL + "; mean over requests"),
)
"""Metrics with a Δ % column, in table order."""

METRIC_BY_COLUMN = {metric.column: metric for metric in METRICS}


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


def _finite(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def fmt_value(value: float | None) -> str:
    """Format a metric value for a table cell: ``—`` for missing/NaN/non-numbers, 3 significant digits below 1,
    else 2 decimals with thousands separators."""
    value = _finite(value)
    if value is None:
        return "—"
    if value != 0 and abs(value) < 1:
        return f"{value:#.3g}"
    return f"{value:,.2f}"


def fmt_delta(delta: float | None) -> str:
    """Format a Δ % with its sign and one decimal (``+10.8 %``), ``—`` when undefined."""
    delta = _finite(delta)
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
