"""Server-side timings and the engine-step decomposition of throughput over a level's measured window, from two
captures of vLLM's Prometheus ``/metrics`` text.

Where the captures come from: :mod:`harness.run.loadgen` records the full ``/metrics`` text at the two points where
``vllm bench serve`` itself reads it for its spec-decode figures (``benchmarks/serve.py`` ``benchmark()``: after the
ready check and the warmups, right before the measured requests, and right after the last of them), and stores both
in the saved bench result under :data:`RESULT_KEY` (``{"before": {"unix_s", "text"}, "after": {...}}``). The window
is therefore the measured requests only. vLLM records a request's stats in the same event-loop turn that hands its
tokens to the response stream (``v1/engine/async_llm.py`` ``output_handler``: ``process_outputs`` then
``logger.record``), so the capture after the last response holds them all.

The histograms and counters used (vLLM 0.32, ``v1/metrics/loggers.py`` ``PrometheusStatLogger``; values in the
Prometheus text summed over every label set: engines, model names, finish reasons)::

    vllm:time_to_first_token_seconds            TTFT per request: frontend arrival → first token processed
    vllm:request_time_per_output_token_seconds  TPOT per finished request (see below)
    vllm:inter_token_latency_seconds            one gap per engine output of a running request (with MTP an
                                                output can carry several tokens)
    vllm:e2e_request_latency_seconds            E2EL per finished request: frontend arrival → last output processed
    vllm:iteration_tokens_total                 one observation per engine step that emitted output
                                                (prefill + generated tokens of that step)
    vllm:generation_tokens_total (counter)      generated tokens emitted
    vllm:prefix_cache_queries_total (counter)   prompt tokens looked up in the prefix cache (scheduler, per
                                                request scheduled)
    vllm:prefix_cache_hits_total (counter)      of those, tokens found cached (whole blocks)

Per window (``Δ`` = after − before)::

    server_mean_<m>_ms     = 1000 × Δ<hist>_sum / Δ<hist>_count     (None: histogram absent or Δcount = 0)
    server_requests        = Δ vllm:e2e_request_latency_seconds_count   (requests finished)
    server_generation_tokens = Δ vllm:generation_tokens_total
    engine_steps           = Δ vllm:iteration_tokens_total_count
    engine_steps_per_s     = engine_steps / duration_s              (duration_s: the bench's measured duration)
    tokens_per_step        = server_generation_tokens / engine_steps
    prefix_cache_queries   = Δ vllm:prefix_cache_queries_total     (tokens)
    prefix_cache_hits      = Δ vllm:prefix_cache_hits_total        (tokens)
    prefix_cache_hit_rate  = prefix_cache_hits / prefix_cache_queries   (0..1; None: no query in the window)

The prefix-cache hit rate is each arm's own (issue #26): two paths that serve the same prompts but cache differently
(block size, a cache the candidate disables, a hash that misses) show different rates at a ``prefix_repetition``
level. vLLM counts both in tokens (``v1/metrics/stats.py`` ``PrefixCacheStats``, recorded by ``loggers.py``
``PrometheusStatLogger.record``); a random-ids level shows ≈ 0.

Server TPOT vs the client's: vLLM's server TPOT of a request is ``decode_time / (num_generation_tokens − 1)`` with
``decode_time`` = last token's engine timestamp − first token's (``v1/metrics/stats.py``
``update_from_finished_request``; a request with one token is observed as 0), the client's (``vllm bench serve``,
``calculate_metrics``) is ``(E2EL − TTFT) / (output_len − 1)`` measured at the client (network, detokenisation and
the API server included, one-token requests excluded). Both means are unweighted means over requests, so they
compare directly; the server figure has the client's and the HTTP layer's jitter removed.

The decomposition: ``engine_steps_per_s × tokens_per_step = server_generation_tokens / duration_s``, which equals
the client's ``output_throughput`` (Σ server-counted ``completion_tokens`` of the successful requests / duration)
when every measured request succeeded and nothing else used the server in the window — then
``server_generation_tokens`` equals the bench's ``total_output_tokens`` and the product matches to float rounding
(``tests/test_server_metrics.py`` checks both on a real capture). ``engine_steps_per_s`` is the engine's speed (steps
per wall second); ``tokens_per_step`` = (requests decoded per step) × (tokens per request-step), where tokens per
request-step is 1 without MTP and about the acceptance length ``1 + accepted/drafts`` with MTP
(:mod:`harness.run.spec_decode`; every MTP decode step of a request emits its accepted drafts plus one token). At a
fixed concurrency the requests per step are fixed by the load, so acceptance luck moves ``tokens_per_step`` and a
path's speed moves ``engine_steps_per_s``. Caveat (vLLM's own TODO at ``vllm:iteration_tokens_total``): with several
API server processes (Prometheus multiprocess mode) the step count may be wrong.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from harness.metrics import ratio

RESULT_KEY = "dsa_bench_server_metrics"
"""Key of the two ``/metrics`` captures in a saved ``vllm bench serve`` result (written by :mod:`harness.run.loadgen`)."""

TIMING_HISTOGRAMS: dict[str, str] = {
    "server_mean_ttft_ms": "vllm:time_to_first_token_seconds",
    "server_mean_tpot_ms": "vllm:request_time_per_output_token_seconds",
    "server_mean_itl_ms": "vllm:inter_token_latency_seconds",
    "server_mean_e2el_ms": "vllm:e2e_request_latency_seconds",
}
"""``levels.csv`` column → vLLM histogram (seconds) whose windowed mean it is, in ms."""

GENERATION_TOKENS = "vllm:generation_tokens_total"
STEP_HISTOGRAM = "vllm:iteration_tokens_total"
REQUEST_HISTOGRAM = "vllm:e2e_request_latency_seconds"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"

LEVEL_COLUMNS: tuple[str, ...] = (*TIMING_HISTOGRAMS, "server_requests", "server_generation_tokens", "engine_steps",
                                  "engine_steps_per_s", "tokens_per_step", "prefix_cache_queries", "prefix_cache_hits",
                                  "prefix_cache_hit_rate")
"""Columns :func:`level_fields` fills (declared in :class:`harness.rundir.schema.LevelRow`)."""


def sample_totals(text: str) -> dict[str, float]:
    """Prometheus exposition text → ``{sample name: value summed over its label sets}``.

    Parsed with prometheus_client's parser (``text_string_to_metric_families``). Histogram ``_bucket`` and every
    ``_created`` sample are left out (bucket sums and creation times mean nothing across label sets); a histogram
    ``h`` appears as ``h_sum`` and ``h_count``, a counter as ``<name>_total``.

    Raises:
        ValueError: ``text`` is not Prometheus text (prometheus_client's error).
    """
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


def _delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float | None:
    """``after[name] − before[name]``; None when either capture lacks it.

    Raises:
        ValueError: the value went down (the server restarted inside the window).
    """
    if name not in before or name not in after:
        return None
    delta = after[name] - before[name]
    if delta < 0:
        raise ValueError(f"/metrics {name} went down ({before[name]:g} → {after[name]:g}): "
                         f"the server restarted inside the measured window")
    return delta


def _count(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def window(before_text: str, after_text: str, duration_s: float | None) -> dict[str, Any]:
    """The :data:`LEVEL_COLUMNS` over the window between two ``/metrics`` texts (formulas: module docstring).

    ``duration_s``: the bench's measured duration (s); None or ≤ 0 leaves ``engine_steps_per_s`` None. Means are in
    ms (float), counts int; a histogram or counter absent from either text gives None for what depends on it.

    Raises:
        ValueError: unparsable text, or a counter that went down (server restart inside the window).
    """
    before, after = sample_totals(before_text), sample_totals(after_text)
    fields: dict[str, Any] = {}
    for column, histogram in TIMING_HISTOGRAMS.items():
        mean_s = ratio(_delta(before, after, f"{histogram}_sum"), _delta(before, after, f"{histogram}_count"))
        fields[column] = None if mean_s is None else 1000.0 * mean_s
    tokens = _delta(before, after, GENERATION_TOKENS)
    steps = _delta(before, after, f"{STEP_HISTOGRAM}_count")
    fields["server_requests"] = _count(_delta(before, after, f"{REQUEST_HISTOGRAM}_count"))
    fields["server_generation_tokens"] = _count(tokens)
    fields["engine_steps"] = _count(steps)
    fields["engine_steps_per_s"] = ratio(steps, duration_s if duration_s and duration_s > 0 else None)
    fields["tokens_per_step"] = ratio(tokens, steps)
    queries, hits = _delta(before, after, PREFIX_CACHE_QUERIES), _delta(before, after, PREFIX_CACHE_HITS)
    fields["prefix_cache_queries"], fields["prefix_cache_hits"] = _count(queries), _count(hits)
    fields["prefix_cache_hit_rate"] = ratio(hits, queries)
    return fields


def from_bench_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`window` over the captures stored in a bench result JSON under :data:`RESULT_KEY`, with its
    ``duration``; every column None when the result has no captures (older run directories, imported results).

    Raises:
        ValueError: malformed captures (not a ``{"before": {"text"}, "after": {"text"}}`` mapping, unparsable text)
            or a counter that went down.
    """
    captures = result.get(RESULT_KEY)
    if captures is None:
        return dict.fromkeys(LEVEL_COLUMNS)
    try:
        before, after = captures["before"]["text"], captures["after"]["text"]
    except (KeyError, TypeError) as error:
        raise ValueError(f"bench result {RESULT_KEY!r} lacks the before/after /metrics text ({error!r})") from None
    duration = result.get("duration")
    return window(before, after, float(duration) if duration is not None else None)


def level_columns(result: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A bench result's ``levels.csv`` server columns and None, or — malformed captures, a counter that went down —
    every column None and why: a diagnostic that cannot be read never discards the level's client figures."""
    try:
        return level_fields(from_bench_result(result)), None
    except ValueError as error:
        return dict.fromkeys(LEVEL_COLUMNS), str(error)


def level_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A :func:`window` result as ``levels.csv`` cells: floats rounded to 6 significant digits, None kept."""
    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return float(f"{value:.6g}") if math.isfinite(value) else None
        return value

    return {column: rounded(fields.get(column)) for column in LEVEL_COLUMNS}
