"""Start-up of one ``vllm serve`` session, read from the server's own log lines (vLLM 0.32 prints each at INFO).

| field | line (vLLM 0.32 source) |
| --- | --- |
| ``model_init_s`` | ``Initializing model took %f seconds`` (model_executor/model_loader/base_loader.py:83) |
| ``weights_s`` | ``Loading weights took %.2f seconds`` (model_loader/default_loader.py:502) |
| ``model_load_s``, ``model_load_gib`` | ``Model loading took %s GiB memory and %.6f seconds`` (v1/worker/gpu_model_runner.py:5150, MRV1; v1/worker/gpu/model_runner.py:425, MRV2) |
| ``compile_s`` | CUDA: ``torch.compile took %.2f s in total`` (compilation/monitor.py:20); CPU: ``Warming up model for the compilation...`` → ``Warming up done.`` (v1/worker/cpu_model_runner.py:87, :91), timestamps at 1 s resolution |
| ``graph_capture_s``, ``graph_memory_gib`` | ``Graph capturing finished in %.0f secs, took %.2f GiB`` (v1/worker/gpu/model_runner.py:1128, gpu_model_runner.py:6582) |
| ``kv_cache_gib`` | ``Available KV cache memory: %s GiB`` (v1/worker/gpu_worker.py:760); CPU ``Explicitly set (%s/…) GiB for KV cache`` (v1/worker/cpu_worker.py:230) |
| ``kv_cache_tokens`` | ``%s KV cache size: %s tokens, …`` (v1/core/kv_cache_utils.py:2328) |
| ``engine_init_s`` | ``init engine (profile, create kv cache, warmup model) took %.2f s`` (v1/engine/core.py:403) |
| ``api_server_s`` | ``Starting vLLM server on`` (entrypoints/launchers/api_server/entry.py:140): seconds after the log's first line |

With tensor parallelism each worker prints its own lines; per-worker times are summed per process (a backbone and an
MTP head each compile) and the slowest worker is kept. A field is None when its line is absent (another platform or
vLLM release). The time to the first completion is the server's ready time (``harness.run.server.VllmServer``),
added by the runner with the peak resident memory of the server's process tree during start-up.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime

_TIMESTAMP = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d) \[")
_PROCESS = re.compile(r"^\((\w+) pid=(\d+)\)")

# field → (pattern, group) of a per-process time summed per process; the slowest process is kept
_PER_PROCESS_SECONDS = {
    "model_init_s": (re.compile(r"Initializing model took ([\d.]+) seconds"), 1),
    "weights_s": (re.compile(r"Loading weights took ([\d.]+) seconds"), 1),
    "model_load_s": (re.compile(r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds"), 1),
    "compile_s": (re.compile(r"torch\.compile took ([\d.]+) s in total"), 1),
    "graph_capture_s": (re.compile(r"Graph capturing finished in ([\d.]+) secs"), 1),
}
# field → (pattern, group) of a value taken as the largest over the log
_LARGEST = {
    "model_load_gib": (re.compile(r"Model loading took ([\d.]+) GiB memory"), 1),
    "graph_memory_gib": (re.compile(r"Graph capturing finished in [\d.]+ secs, took ([\d.]+) GiB"), 1),
    "kv_cache_gib": (re.compile(r"Available KV cache memory: ([\d.]+) GiB|Explicitly set \(([\d.]+)/[\d.]+\) GiB "
                                r"for KV cache"), None),
    "kv_cache_tokens": (re.compile(r"KV cache size: ([\d,]+) tokens"), 1),
    "engine_init_s": (re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"), 1),
}
_CPU_WARMUP_START = "Warming up model for the compilation..."
_CPU_WARMUP_DONE = "Warming up done."
_API_SERVER = "Starting vLLM server on"

FIELDS = (*_PER_PROCESS_SECONDS, *_LARGEST, "api_server_s")


def _time(line: str) -> datetime | None:
    match = _TIMESTAMP.search(line)
    return datetime.strptime(f"2000-{match.group(1)}", "%Y-%m-%d %H:%M:%S") if match else None


def _number(match: re.Match, group: int | None) -> float:
    text = match.group(group) if group is not None else next(g for g in match.groups() if g is not None)
    return float(text.replace(",", ""))


def startup_from_log(text: str) -> dict[str, float | None]:
    """The start-up fields of one session's server log (see the module table); seconds, GiB and tokens.

    ``text`` is the log of one session only (the runner passes what the session appended)."""
    per_process: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    largest: dict[str, float] = {}
    warmup_start: dict[str, datetime] = {}
    first = api_server = None
    for line in text.splitlines():
        when = _time(line)
        first = first or when
        process = _PROCESS.match(line)
        pid = process.group(2) if process else "?"
        for field, (pattern, group) in _PER_PROCESS_SECONDS.items():
            if match := pattern.search(line):
                per_process[field][pid] += _number(match, group)
        for field, (pattern, group) in _LARGEST.items():
            if match := pattern.search(line):
                largest[field] = max(largest.get(field, 0.0), _number(match, group))
        if _CPU_WARMUP_START in line and when:
            warmup_start[pid] = when
        elif _CPU_WARMUP_DONE in line and when and pid in warmup_start:
            per_process["compile_s"][pid] += (when - warmup_start.pop(pid)).total_seconds()
        if _API_SERVER in line and when and first and api_server is None:
            api_server = (when - first).total_seconds()
    result: dict[str, float | None] = {field: round(max(times.values()), 3) if (times := per_process.get(field))
                                       else None for field in _PER_PROCESS_SECONDS}
    result.update({field: largest.get(field) for field in _LARGEST})
    result["api_server_s"] = api_server
    return result
