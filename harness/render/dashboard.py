"""``benchmark.pytorch.json``: per arm × level × metric records in the PyTorch OSS benchmark format vLLM's dashboard
reads (the records of ``vllm/benchmarks/lib/utils.py:convert_to_pytorch_benchmark_format``, vLLM 0.32)."""

from __future__ import annotations

from typing import Any

from harness.render.output import Output, VerdictView
from harness.rundir.schema import PYTORCH_JSON, Level
from harness.rundir.store import json_text

DASHBOARD_METRICS = ("output_throughput", "total_token_throughput", "request_throughput", "mean_ttft_ms",
                     "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                     "p99_itl_ms", "mean_e2el_ms", "acceptance_length", "acceptance_rate")
"""``levels.csv`` columns written to the dashboard (vLLM's own level figures)."""


def records(view: VerdictView) -> list[dict[str, Any]]:
    """The records, one per arm × level × metric of :data:`DASHBOARD_METRICS` present in ``levels.csv``.

    Same record shape as ``convert_to_pytorch_benchmark_format``: ``{"benchmark": {"name": "vLLM benchmark",
    "extra_info": {"args", "compilation_config.mode", "optimization_level", "use_compile"}}, "model": {"name"},
    "metric": {"name", "benchmark_values", "extra_info"}}``. ``benchmark_values`` holds one value, the mean over the
    level's rounds (vLLM writes one value per run); the per-round values, the arm and the gate's Δ/interval for that
    cell are in ``metric.extra_info``. Written always (vLLM only with ``SAVE_TO_PYTORCH_BENCHMARK_FORMAT``) and without
    importing vLLM. Empty without a manifest or a readable ``levels.csv``.
    """
    import pandas as pd

    manifest, levels = view.manifest, view.levels
    if manifest is None or levels is None:
        return []
    model = manifest.model_name()
    tensor_parallel_size = manifest.scenario_value("serve", "tensor_parallel_size") or 1
    cells = view.cell_map()
    out = []
    for (arm, text), frame in levels.groupby(["arm", "level"]):
        level = Level.parse(text)
        if level is None:
            continue
        record = manifest.arm(str(arm))
        route = record.route if record is not None else None
        mode = record.intended.get("compilation_mode") if record is not None else None
        args = {"model": model, "max_concurrency": level.concurrency, "arm": arm, "route": route,
                "num_prompts": int(frame["completed"].max() + frame["failed"].max()),
                "tensor_parallel_size": tensor_parallel_size, "dataset_name": level.dataset,
                "random_input_len": level.input_len, "random_output_len": level.output_len, "run_id": manifest.run_id}
        for metric in DASHBOARD_METRICS:
            values = pd.to_numeric(frame[metric], errors="coerce").dropna() if metric in frame.columns else []
            if not len(values):
                continue
            extra = {"arm": arm, "route": route, "concurrency": level.concurrency, "level": str(level),
                     "repeat_values": [float(v) for v in values], "repeats": int(values.size)}
            cell = cells.get((metric, str(level)))
            if cell is not None and cell.delta is not None:
                extra.update(delta_pct=cell.delta, ci_low_pct=cell.ci_low, ci_high_pct=cell.ci_high,
                             gate_result=cell.result)
            out.append({
                "benchmark": {"name": "vLLM benchmark", "extra_info": {
                    "args": args, "compilation_config.mode": "" if mode is None else str(mode),
                    "optimization_level": "", "use_compile": mode not in (None, "NONE", "0", 0)}},
                "model": {"name": model},
                "metric": {"name": metric, "benchmark_values": [float(values.mean())], "extra_info": extra},
            })
    return out


def render(view: VerdictView) -> str:
    """:func:`records` as JSON text."""
    return json_text(records(view))


OUTPUT = Output(PYTORCH_JSON, render)
