"""The one metric registry (:data:`METRICS`: one meaning per name) and the measures derived from the run
directory's rows that judging and rendering share. Pure: no I/O.

Names are vLLM's (``benchmarks/serve.py``): a latency statistic such as ``mean_tpot_ms`` is the statistic over a
level's successful requests of the per-request figure (TPOT = (E2EL − TTFT) / (output_len − 1)). vLLM writes it as
the ``levels.csv`` column of that name, which the report shows; the gate recomputes the same statistic from
``requests.csv`` (``column`` and ``statistic``), because its bootstrap resamples requests within rounds.

Server-side figures (:data:`SERVER_SIDE`, ``levels.csv`` columns of :mod:`harness.run.server_metrics`) are vLLM's own
``/metrics`` histograms over the same measured window: ``server_mean_<m>_ms`` beside the client's ``mean_<m>_ms``, and
the decomposition output throughput = ``engine_steps_per_s`` × ``tokens_per_step`` (engine speed × tokens per step;
with MTP the tokens per step carry the acceptance). They are level metrics (one figure per round), gated only when a
policy names them, diagnostic otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Source = Literal["level", "request", "spec", "accuracy"]

MTP_POSITIONS = 3
"""Draft positions with a per-position acceptance metric: the most any scenario drafts (GLM-5.2, 3 MTP tokens)."""


def finite_float(value: Any) -> float | None:
    """``float(value)`` when it is a finite number, else None (missing, non-numeric, NaN or ±inf cells and JSON
    values)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``; None when the numerator is missing or the denominator missing or 0 (a counter
    that did not move: e.g. no drafts, no engine steps in the window)."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


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
        abbrev: the metric's name in the 80-column terminal table (≤ 9 characters; its legend gives the label).
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
    abbrev: str = ""

    @property
    def repeats_exactly(self) -> bool:
        """Whether a session can repeat the metric exactly: an MTP count (``spec``) from a deterministic engine can,
        a timing cannot (the gate then decides a zero-spread cell on its common difference,
        :func:`harness.judge.stats.noninferiority_pvalues` ``exact``)."""
        return self.source == "spec"

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


_SERVER = ("from vLLM's /metrics histogram {hist} over the measured window (warmups excluded): "
           "Δsum / Δcount, summed over engines; {what}")
_SERVER_WHAT = {
    "ttft": ("vllm:time_to_first_token_seconds",
             "per request, the API server's arrival → its first token processed (no client or network time)"),
    "tpot": ("vllm:request_time_per_output_token_seconds",
             "per finished request, decode time (engine timestamps, first → last token) / (tokens − 1), 0 for a "
             "one-token request; the client's TPOT is (E2EL − TTFT) / (output_len − 1) at the client"),
    "itl": ("vllm:inter_token_latency_seconds",
            "one gap per engine output of a running request, pooled (with MTP an output can hold several tokens)"),
    "e2el": ("vllm:e2e_request_latency_seconds",
             "per finished request, the API server's arrival → its last output processed"),
}


def _server(metric: str, label: str, default_margin: float | None) -> Metric:
    histogram, what = _SERVER_WHAT[metric]
    return Metric(f"server_mean_{metric}_ms", f"Mean {label}, server", "ms", False, "level", default_margin,
                  f"server_mean_{metric}_ms", short=f"vLLM /metrics {label} histogram; mean", abbrev=f"srv {label}",
                  formula=f"{label} (server) = " + _SERVER.format(hist=histogram, what=what))


def _throughput(name: str, label: str, unit: str, short: str, formula: str, abbrev: str) -> Metric:
    return Metric(name, label, unit, True, "level", -3.0, name, short=short, formula=formula, abbrev=abbrev)


def _request(column: str, label: str, statistic: str) -> Metric:
    shown = {"mean": "Mean", "median": "Median", "p99": "P99"}[statistic]
    over = _PCT if statistic == "p99" else f"{statistic} over requests"
    return Metric(f"{statistic}_{column}", f"{shown} {label}", "ms", False, "request",
                  10.0 if statistic == "p99" else 3.0, column, statistic, f"{_SHORT[column]}; {statistic}",
                  f"{_FULL[column]}; {over}", {"mean": label, "median": f"{label} p50", "p99": f"{label} p99"}[statistic])


METRICS: dict[str, Metric] = {m.name: m for m in (
    _throughput("output_throughput", "Output throughput", "tok/s", "Σ output tokens / duration",
                "Σ output tokens (server-counted) / benchmark duration", "tput"),
    _throughput("total_token_throughput", "Total token throughput", "tok/s", "(Σ input + Σ output tokens) / duration",
                "(Σ input tokens + Σ output tokens) / benchmark duration", "tot tput"),
    _throughput("request_throughput", "Request throughput", "req/s", "completed requests / duration",
                "completed requests / benchmark duration", "req/s"),
    *(_request(column, label, statistic) for column, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"),
                                                               ("e2el_ms", "E2EL"))
      for statistic in ("mean", "median", "p99")),
    Metric("request_goodput", "Request goodput", "req/s", True, "level", -3.0, "request_goodput",
           short="requests meeting every SLO / duration",
           formula="requests whose TTFT, TPOT and E2EL are each within the scenario's [slo] / benchmark duration "
                   "(vLLM bench serve --goodput; DistServe, Zhong et al. 2024, arXiv:2401.09670)", abbrev="goodput"),
    Metric("slo_attainment", "SLO attainment", "", True, "level", -2.0, "slo_attainment",
           short="share of requests meeting every SLO",
           formula="requests meeting every SLO of the scenario's [slo] / completed requests (0..1)",
           abbrev="SLO att"),
    Metric("mean_itl_ms", "Mean ITL", "ms", False, "level", None, "mean_itl_ms",
           short="gap between streamed chunks, pooled; mean", formula=_ITL + "; mean", abbrev="ITL"),
    Metric("p99_itl_ms", "P99 ITL", "ms", False, "level", None, "p99_itl_ms",
           short="gap between streamed chunks, pooled; p99", formula=_ITL + "; 99th percentile", abbrev="ITL p99"),
    _server("ttft", "TTFT", 3.0),
    _server("tpot", "TPOT", 3.0),
    _server("itl", "ITL", None),
    _server("e2el", "E2EL", 3.0),
    Metric("engine_steps_per_s", "Engine steps per second", "steps/s", True, "level", -3.0, "engine_steps_per_s",
           short="engine steps / duration (server)",
           formula="Δ vllm:iteration_tokens_total_count (engine steps that emitted output) / benchmark duration; "
                   "output throughput = engine steps per second × tokens per step (engine speed, untouched by MTP "
                   "acceptance at a fixed concurrency)", abbrev="steps/s"),
    Metric("tokens_per_step", "Tokens per engine step", "tokens", True, "level", -2.0, "tokens_per_step",
           short="generated tokens / engine steps (server)",
           formula="Δ vllm:generation_tokens_total / Δ vllm:iteration_tokens_total_count = requests decoded per "
                   "step × tokens per request-step (1 without MTP, ≈ the MTP acceptance length with it)",
           abbrev="tok/step"),
    Metric("prefix_cache_hit_rate", "Prefix-cache hit rate", "", True, "level", None, "prefix_cache_hit_rate",
           short="prompt tokens found in the prefix cache / looked up (server)",
           formula="Δ vllm:prefix_cache_hits_total / Δ vllm:prefix_cache_queries_total over the measured window "
                   "(tokens; v1/metrics/stats.py PrefixCacheStats): each arm's own cache, so an arm that caches "
                   "differently at a prefix_repetition level shows here; ≈ 0 on random ids", abbrev="pfx hit"),
    Metric("engine_cpu_ms_per_token", "Engine CPU time per output token", "ms", False, "level", 3.0,
           "engine_cpu_ms_per_token", short="engine CPU time / output tokens (server processes)",
           formula="Δ (user + system CPU time) of the vLLM engine processes (VLLM::EngineCore and its workers, "
                   "/proc/<pid>/stat) over the level / its output tokens: the work per token, not the wall time, so a "
                   "core taken by another process lengthens the level but not this",
           abbrev="cpu/tok"),
    Metric("acceptance_length", "MTP acceptance length", "tokens", True, "spec", -2.0, "acceptance_length",
           formula="1 + accepted draft tokens / drafts over the measured window", abbrev="acc len"),
    Metric("acceptance_rate", "MTP acceptance rate", "", True, "spec", -2.0, "acceptance_rate",
           formula="accepted draft tokens / draft tokens over the measured window", abbrev="acc rate"),
    *(Metric(f"acceptance_pos_{k}", f"MTP acceptance at draft position {k}", "", True, "spec", -2.0,
             "acceptance_per_pos",
             formula=f"accepted draft tokens at position {k} / drafts over the measured window "
                     "(vllm:spec_decode_num_accepted_tokens_per_pos{position=k-1} / vllm:spec_decode_num_drafts): "
                     "a defect that hurts only later draft positions (vLLM #46075) shows here, not in the mean",
             abbrev=f"acc@{k}")
      for k in range(1, MTP_POSITIONS + 1)),
    Metric("gsm8k_accuracy", "GSM8K accuracy", "%", True, "accuracy", -1.0,
           formula="exact_match of the gated lm-eval filter", abbrev="GSM8K"),
)}
"""Every metric, by name. p99 latency margins default to +10 %: a tail quantile is far noisier."""

SERVER_SIDE: tuple[str, ...] = ("engine_steps_per_s", "tokens_per_step", "prefix_cache_hit_rate",
                                "server_mean_ttft_ms", "server_mean_tpot_ms",
                                "server_mean_itl_ms", "server_mean_e2el_ms")
"""The metrics read from the server's ``/metrics`` (empty in run directories recorded without the captures)."""

GOODPUT: tuple[str, ...] = ("request_goodput", "slo_attainment")
"""The metrics of a scenario's ``[slo]`` (empty without one)."""

OPTIONAL_COLUMNS: tuple[str, ...] = (*SERVER_SIDE, "engine_cpu_ms_per_token", *GOODPUT)
"""Level metrics whose column may be empty — the server-side figures, the engine's CPU time per token (not read
for remote servers or in older run directories) and goodput (only with ``[slo]``): shown and judged only where
recorded."""

REPORT_TABLE: tuple[str, ...] = ("output_throughput", "engine_steps_per_s", "tokens_per_step",
                                 "engine_cpu_ms_per_token", "prefix_cache_hit_rate", "total_token_throughput",
                                 "request_throughput", "request_goodput", "slo_attainment", "mean_ttft_ms", "server_mean_ttft_ms", "median_ttft_ms",
                                 "p99_ttft_ms", "mean_tpot_ms", "server_mean_tpot_ms", "median_tpot_ms",
                                 "p99_tpot_ms", "mean_itl_ms", "server_mean_itl_ms", "p99_itl_ms", "mean_e2el_ms",
                                 "server_mean_e2el_ms")
"""The metrics of the report's per-level tables, in order: the ``levels.csv`` columns of the same names; each server
figure right under the client figure it mirrors, the throughput decomposition under the output throughput."""


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
