"""The one metric registry (:data:`METRICS`: one meaning per name) and the measures derived from the run
directory's rows that judging and rendering share. Pure: no I/O.

Names are vLLM's (``benchmarks/serve.py``): a latency statistic such as ``mean_tpot_ms`` is the statistic over a
level's successful requests of the per-request figure (TPOT = (E2EL − TTFT) / (output_len − 1)). vLLM writes it as
the ``levels.csv`` column of that name, which the report shows; the gate recomputes the same statistic from
``requests.csv`` (``column`` and ``statistic``), because its bootstrap resamples requests within rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Source = Literal["level", "request", "spec", "accuracy"]


@dataclass(frozen=True)
class Metric:
    """One metric.

    Attributes:
        name: the key (policy ``primary``/``margins``, verdict cells, and — for ``level``/``spec`` metrics and
            vLLM's latency statistics — the ``levels.csv`` column).
        source: where the gate reads it: ``level`` — the per-round ``levels.csv`` column; ``request`` — the
            ``statistic`` of ``requests.csv`` ``column`` per round (two-stage bootstrap); ``spec`` — per-round MTP
            figure from the ``levels.csv`` counts; ``accuracy`` — GSM8K (``accuracy.csv``).
        default_margin: the gate's default non-inferiority margin (% of baseline; points for accuracy); None: not
            gated (shown in the report only).
        short, formula: the definition printed beside the metric in the report, short and full.
    """

    name: str
    label: str
    unit: str
    higher_is_better: bool
    source: Source
    default_margin: float | None
    column: str = ""
    statistic: str = "mean"
    short: str = ""
    formula: str = ""

    @property
    def margin_unit(self) -> str:
        return "pt" if self.source == "accuracy" else "%"

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
_SHORT = {"ttft_ms": "request sent → first token", "tpot_ms": "(E2EL − TTFT) / (output_len − 1) per request",
          "e2el_ms": "request sent → last token"}
_FULL = {"ttft_ms": _TTFT, "tpot_ms": _TPOT, "e2el_ms": _E2EL}


def _throughput(name: str, label: str, unit: str, short: str, formula: str) -> Metric:
    return Metric(name, label, unit, True, "level", -3.0, name, short=short, formula=formula)


def _request(column: str, label: str, statistic: str) -> Metric:
    shown = {"mean": "Mean", "median": "Median", "p99": "P99"}[statistic]
    over = _PCT if statistic == "p99" else f"{statistic} over requests"
    return Metric(f"{statistic}_{column}", f"{shown} {label}", "ms", False, "request",
                  10.0 if statistic == "p99" else 3.0, column, statistic, f"{_SHORT[column]}; {statistic}",
                  f"{_FULL[column]}; {over}")


METRICS: dict[str, Metric] = {m.name: m for m in (
    _throughput("output_throughput", "Output throughput", "tok/s", "Σ output tokens / duration",
                "Σ output tokens (server-counted) / benchmark duration"),
    _throughput("total_token_throughput", "Total token throughput", "tok/s", "(Σ input + Σ output tokens) / duration",
                "(Σ input tokens + Σ output tokens) / benchmark duration"),
    _throughput("request_throughput", "Request throughput", "req/s", "completed requests / duration",
                "completed requests / benchmark duration"),
    *(_request(column, label, statistic) for column, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"),
                                                               ("e2el_ms", "E2EL"))
      for statistic in ("mean", "median", "p99")),
    Metric("mean_itl_ms", "Mean ITL", "ms", False, "level", None, "mean_itl_ms",
           short="gap between streamed chunks, pooled; mean", formula=_ITL + "; mean"),
    Metric("p99_itl_ms", "P99 ITL", "ms", False, "level", None, "p99_itl_ms",
           short="gap between streamed chunks, pooled; p99", formula=_ITL + "; 99th percentile"),
    Metric("acceptance_length", "MTP acceptance length", "tokens", True, "spec", -2.0, "acceptance_length",
           formula="1 + accepted draft tokens / drafts over the measured window"),
    Metric("acceptance_rate", "MTP acceptance rate", "", True, "spec", -2.0, "acceptance_rate",
           formula="accepted draft tokens / draft tokens over the measured window"),
    Metric("gsm8k_accuracy", "GSM8K accuracy", "%", True, "accuracy", -1.0,
           formula="exact_match of the gated lm-eval filter"),
)}
"""Every metric, by name. p99 latency margins default to +10 %: a tail quantile is far noisier."""

REPORT_TABLE: tuple[str, ...] = ("output_throughput", "total_token_throughput", "request_throughput",
                                 "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                                 "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms")
"""The metrics of the report's per-level tables, in order: vLLM's ``levels.csv`` columns of the same names."""


def achieved_concurrency(frame) -> float | None:
    """Time-averaged number of requests in flight over the level (Little's law): Σ E2EL / (last end − first start),
    from the per-request timeline (``start_s``, ``e2el_ms``). A client that keeps ``c`` requests in flight scores
    about ``c``; ramp-up and drain lower it a little. (Counting requests in flight at each request's start is biased
    low under ``--ignore-eos``: equal-length requests finish together and their replacements start one by one.)"""
    start = frame["start_s"].to_numpy(dtype=float)
    latency = frame["e2el_ms"].to_numpy(dtype=float) / 1000.0
    ok = np.isfinite(start) & np.isfinite(latency)
    start, latency = start[ok], latency[ok]
    if start.size == 0:
        return None
    span = float((start + latency).max() - start.min())
    return float(latency.sum() / span) if span > 0 else None


def succeeded(frame):
    """The rows of a ``requests.csv`` frame whose ``error`` cell is empty (successful requests)."""
    error = frame["error"]
    return frame[error.isna() | (error.astype(str).str.strip() == "")]
