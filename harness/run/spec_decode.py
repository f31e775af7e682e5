"""MTP / speculative-decoding acceptance over a measured window, from vLLM's Prometheus counters.

vLLM (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``, vLLM 0.32) exports four counters, each summed here over
engines (``scrape_metrics`` drops the ``model_name``/``engine`` labels)::

    vllm:spec_decode_num_drafts_total                   drafts proposed (one per request per decode step)
    vllm:spec_decode_num_draft_tokens_total             draft tokens proposed (= drafts × k, k speculative tokens)
    vllm:spec_decode_num_accepted_tokens_total          draft tokens the target model accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}   accepted draft tokens at position i (0-based)

They exist only when the server runs with ``--speculative-config``. Over a window (counter deltas, ``Δ``), with the
formulas of vLLM's own docstring and of ``vllm bench serve`` (``benchmarks/serve.py``)::

    acceptance_rate      = Δaccepted_tokens / Δdraft_tokens              (fraction 0..1; vLLM bench prints it × 100)
    acceptance_length    = 1 + Δaccepted_tokens / Δdrafts                 (tokens emitted per target step, ≥ 1)
    acceptance_per_pos[i] = Δaccepted_per_pos[i] / Δdrafts                (share of drafts accepted at position i)

A window with MTP off (no counters) or without a single draft has ``None`` for the ratios; counts are ``None`` when MTP
is off and ``0`` when it is on but idle.

Which window
------------
``vllm bench serve`` (``benchmarks/serve.py``, ``benchmark()``) runs, in one call: a ready-check request, then
``--num-warmups`` warmup requests, then fetches ``/metrics`` (``fetch_spec_decode_metrics``), runs the measured
requests, and fetches ``/metrics`` again. Its result JSON therefore already holds the exact measured window, warmups
and the ready check excluded (``spec_decode_num_drafts``, ``spec_decode_draft_tokens``, ``spec_decode_accepted_tokens``,
``spec_decode_acceptance_rate`` in %, ``spec_decode_acceptance_length``, ``spec_decode_per_position_acceptance_rates``;
present only when the window had draft tokens): :func:`from_bench_result` reads it. A :func:`snapshot` taken around the
whole bench call instead would also count the ready-check request and the warmups. :func:`snapshot`/:func:`window` are
for windows the harness times itself (the GSM8K run, the parity prompts) and as a cross-check.

Timing of the counters: vLLM's API server records a step's stats in the same event-loop turn that hands the step's
tokens to the request streams (``v1/engine/async_llm.py``, ``output_handler``), before the HTTP response can be written,
so a snapshot taken after the last response has them. The exception is a step whose requests stopped on a stop string
(the handler awaits an abort first); :func:`snapshot` therefore re-reads until two reads agree (``settle_s``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping

from harness.metrics import ratio
from harness.rundir import schema

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

LEVEL_COLUMNS: tuple[str, ...] = schema.MTP_COLUMNS
"""Columns this module adds to a ``levels.csv`` row (see :func:`level_fields`); defined in :mod:`harness.rundir.store`."""


def parse_samples(samples: Mapping[str, float]) -> dict[str, Any]:
    """The spec-decode counters in a :func:`harness.run.server.scrape_metrics` answer.

    Returns ``{"enabled": bool, "drafts", "draft_tokens", "accepted_tokens": float | None, "accepted_per_pos":
    {position: float}}``; ``enabled`` is False (and the counts None) when the server exports no spec-decode counter.
    """
    per_pos: dict[int, float] = {}
    prefix = ACCEPTED_PER_POS + "{"
    for key, value in samples.items():
        if key.startswith(prefix):
            labels = dict(part.split("=", 1) for part in key[len(prefix):-1].split(",") if "=" in part)
            if "position" in labels:
                position = int(labels["position"])
                per_pos[position] = per_pos.get(position, 0.0) + float(value)
    enabled = DRAFTS in samples or DRAFT_TOKENS in samples or bool(per_pos)
    return {
        "enabled": enabled,
        "drafts": float(samples.get(DRAFTS, 0.0)) if enabled else None,
        "draft_tokens": float(samples.get(DRAFT_TOKENS, 0.0)) if enabled else None,
        "accepted_tokens": float(samples.get(ACCEPTED, 0.0)) if enabled else None,
        "accepted_per_pos": dict(sorted(per_pos.items())),
    }


def snapshot(base_url: str, headers: Mapping[str, str] | None = None, *, settle_s: float = 0.2,
             max_reads: int = 10, timeout_s: float = 5.0) -> dict[str, Any]:
    """Read the spec-decode counters from ``base_url``/metrics (see :func:`parse_samples` for the shape).

    Reads until two consecutive reads ``settle_s`` seconds apart agree (at most ``max_reads`` reads), so the stats of
    a step that finished just before the call are in. ``settle_s=0`` reads once.

    Raises:
        requests.RequestException: the server did not answer ``/metrics``.
    """
    from harness.run.server import scrape_metrics

    current = parse_samples(scrape_metrics(base_url, headers, timeout_s))
    if settle_s <= 0:
        return current
    for _ in range(max_reads - 1):
        time.sleep(settle_s)
        following = parse_samples(scrape_metrics(base_url, headers, timeout_s))
        if following == current:
            return following
        current = following
    return current


def _window_dict(drafts: float | None, draft_tokens: float | None, accepted: float | None,
                 per_pos: list[float] | None) -> dict[str, Any]:
    rate = ratio(accepted, draft_tokens)
    per_drafts = ratio(accepted, drafts)
    return {
        "spec_drafts": None if drafts is None else int(round(drafts)),
        "spec_draft_tokens": None if draft_tokens is None else int(round(draft_tokens)),
        "spec_accepted_tokens": None if accepted is None else int(round(accepted)),
        "acceptance_rate": rate,
        "acceptance_length": None if per_drafts is None else 1.0 + per_drafts,
        "acceptance_per_pos": per_pos if per_pos else None,
    }


def window(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """Acceptance over the window between two :func:`snapshot` results.

    Returns ``{"spec_drafts", "spec_draft_tokens", "spec_accepted_tokens": int | None, "acceptance_rate": float |
    None (fraction), "acceptance_length": float | None (tokens per target step), "acceptance_per_pos": list[float] |
    None}`` with the formulas of the module docstring. All None when MTP is off; ratios None when no draft was made.

    Raises:
        ValueError: a counter went down (the server restarted between the two snapshots).
    """
    if not (before.get("enabled") and after.get("enabled")):
        return _window_dict(None, None, None, None)
    deltas = {}
    for key in ("drafts", "draft_tokens", "accepted_tokens"):
        delta = float(after[key]) - float(before[key])
        if delta < 0:
            raise ValueError(f"spec-decode counter {key} went down ({before[key]} → {after[key]}); "
                             f"the server restarted inside the window")
        deltas[key] = delta
    drafts = deltas["drafts"]
    per_pos = None
    if drafts > 0:
        positions = sorted(set(before.get("accepted_per_pos", {})) | set(after.get("accepted_per_pos", {})))
        per_pos = [(after["accepted_per_pos"].get(p, 0.0) - before.get("accepted_per_pos", {}).get(p, 0.0)) / drafts
                   for p in positions]
    return _window_dict(drafts, deltas["draft_tokens"], deltas["accepted_tokens"], per_pos)


def from_bench_result(result: Mapping[str, Any], mtp_enabled: bool) -> dict[str, Any]:
    """The measured-window acceptance that ``vllm bench serve`` itself computed (warmups excluded), as :func:`window`
    returns it.

    ``result`` is the bench result JSON. vLLM writes ``spec_decode_*`` only when the window had draft tokens; with
    ``mtp_enabled`` and no such keys the window had no draft (counts 0, ratios None); without MTP everything is None.
    vLLM's ``spec_decode_acceptance_rate`` is in percent; it is recomputed here as a fraction from the counts.
    """
    if not mtp_enabled:
        return _window_dict(None, None, None, None)
    if "spec_decode_num_drafts" not in result:
        return _window_dict(0.0, 0.0, 0.0, None)
    per_pos = [float(v) for v in result.get("spec_decode_per_position_acceptance_rates") or []]
    return _window_dict(float(result["spec_decode_num_drafts"]), float(result["spec_decode_draft_tokens"]),
                        float(result["spec_decode_accepted_tokens"]), per_pos)


def level_fields(result: Mapping[str, Any]) -> dict[str, Any]:
    """A :func:`window` result as ``levels.csv`` cells (:data:`LEVEL_COLUMNS`): ratios rounded to 6 digits,
    per-position fractions joined with ``;``, None for empty cells."""
    def rounded(value: Any) -> float | None:
        return None if value is None or not math.isfinite(value) else round(float(value), 6)

    per_pos = result.get("acceptance_per_pos")
    return {
        "spec_drafts": result.get("spec_drafts"),
        "spec_draft_tokens": result.get("spec_draft_tokens"),
        "spec_accepted_tokens": result.get("spec_accepted_tokens"),
        "acceptance_rate": rounded(result.get("acceptance_rate")),
        "acceptance_length": rounded(result.get("acceptance_length")),
        "acceptance_per_pos": ";".join(f"{v:.6g}" for v in per_pos) if per_pos else None,
    }


def parse_per_pos(cell: Any) -> list[float]:
    """A ``levels.csv`` ``acceptance_per_pos`` cell back to a list of fractions (empty for an empty cell)."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return []
    text = str(cell).strip()
    if not text:
        return []
    return [float(part) for part in text.split(";") if part.strip()]
