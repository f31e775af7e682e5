"""The results schema: the one contract between the run (load), the report and the gate.

A run directory ``results/<run-id>/`` holds:

- ``manifest.json``   — :class:`Manifest` as JSON: scenario as resolved, arms (intended and observed path, exact server
  and benchmark commands, env), versions, platform, git sha, times, per-arm/level status.
- ``levels.csv``      — one row per arm × concurrency × repeat, columns :data:`LEVEL_COLUMNS`.
- ``requests.csv``    — one row per request, columns :data:`REQUEST_COLUMNS`.
- ``raw/<arm>-c<concurrency>-r<repeat>.json`` — vLLM's own ``vllm bench serve`` result JSON (``--save-detailed``).
- ``logs/<arm>-server.log`` — the server's stdout+stderr.
- ``report.html`` (and later ``verdict.json``, ``summary.md``).

``manifest.json`` keys (schema_version 1)::

    schema_version, run_id, status ("running" | "done" | "failed" | "interrupted"), started_at, ended_at (ISO 8601 UTC),
    scenario_name, scenario_file, scenario (the resolved scenario as a dict),
    platform {name: "cpu"|"cuda", device: str (CPU or GPU model), cpu_count, gpu_count, has_triton,
              load_avg_at_start, load_avg_at_end: "1m / 5m / 15m" load averages (noise context)},
    versions {dsa_bench, vllm, torch, python}, git_sha,
    notes [str]                       # plain-language notes for the report (e.g. what the CPU build cannot do)
    arms {
      "<arm>": {                       # "baseline" then "candidate"
        route, description,            # route = "baseline" | "candidate"
        decision {...},                # dsa_route.routing.RouteDecision.to_dict()
        unavailable [str],             # knobs "not available on this platform"
        server_command [str], server_env {str: str},
        bench_command [str],           # `vllm bench serve ...` argv for one level ({concurrency}, {num_prompts} filled)
        intended {model_runner, compilation_mode, cudagraph_mode, breakable_cudagraph},
        observed {...},                # harness.run.attest.observe_from_log() of the server log
        attestation {valid: bool, mismatches [str]},
        server_start_s,                # seconds from spawn to the first successful completion
        base_url,
        levels {"c<concurrency>-r<repeat>": {status: "done" | "failed: <reason>" | "skipped", wall_s, raw}}
      }
    },
    timing {wall_s, server_start_s, benchmark_s, harness_overhead_s}   # harness share = overhead / wall

Units are in the column names (``_ms`` milliseconds, ``_s`` seconds, throughputs in tokens/s or requests/s).
TPOT per request = (E2EL − TTFT) / (output_len − 1) with output_len counted by the server (vLLM
``benchmarks/serve.py`` definition); requests with output_len ≤ 1 have no TPOT (empty cell).

Every write is atomic (temp file + ``os.replace``) so a crash never leaves a half-written file.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

SCHEMA_VERSION = 1

LEVEL_COLUMNS: tuple[str, ...] = (
    "arm", "concurrency", "repeat", "completed", "failed", "duration_s",
    "output_throughput", "total_token_throughput", "request_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms",
    "max_concurrent_requests", "client_cpu_util",
    # MTP acceptance over the measured window (vLLM's bench reads /metrics after its warmups; empty with MTP off):
    "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "acceptance_rate", "acceptance_length",
    "acceptance_per_pos",
)
"""``levels.csv`` columns. ``client_cpu_util`` = benchmark client CPU seconds / level wall seconds. Throughputs: output and total tokens/s, requests/s; latencies in ms."""

REQUEST_COLUMNS: tuple[str, ...] = (
    "arm", "concurrency", "repeat", "index", "input_len", "output_len",
    "ttft_ms", "tpot_ms", "e2el_ms", "start_s", "error",
)
"""``requests.csv`` columns. ``start_s`` is the request's start relative to the level's first request (seconds)."""

MTP_COLUMNS: tuple[str, ...] = LEVEL_COLUMNS[LEVEL_COLUMNS.index("spec_drafts"):]
"""MTP columns: drafts, draft tokens, accepted tokens (counts); acceptance_rate = accepted / draft tokens (0..1);
acceptance_length = 1 + accepted / drafts (tokens per target step); acceptance_per_pos = per-position rates, ``;``-joined."""

OPTIONAL_COLUMNS: frozenset[str] = frozenset({"max_concurrent_requests", "client_cpu_util", *MTP_COLUMNS})
"""Columns added after schema version 1's first release, or that a run may not produce; readers tolerate absence."""

MANIFEST = "manifest.json"
LEVELS = "levels.csv"
REQUESTS = "requests.csv"
RAW_DIR = "raw"
LOGS_DIR = "logs"
REPORT = "report.html"


class RunDirError(Exception):
    """A run directory is missing, empty or holds unreadable files; the message names the file and the fix."""


def finite_float(value: Any) -> float | None:
    """``float(value)`` when it is a finite number, else None (missing, non-numeric, NaN or ±inf cells and JSON
    values)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory, then ``os.replace``).

    Raises:
        OSError: the directory is not writable (the caller turns it into a one-line error).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON atomically (see :func:`atomic_write_text`)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def rows_to_csv(rows: Iterable[Mapping[str, Any]], columns: tuple[str, ...]) -> str:
    """Render ``rows`` as CSV text with exactly ``columns`` (missing keys → empty cells, extra keys ignored)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({column: ("" if row.get(column) is None else row.get(column)) for column in columns})
    return buffer.getvalue()


def append_rows(path: Path, rows: Iterable[Mapping[str, Any]], columns: tuple[str, ...]) -> None:
    """Append ``rows`` to the CSV at ``path`` by rewriting it atomically (header written once)."""
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    fresh = rows_to_csv(rows, columns)
    if existing:
        fresh = fresh.split("\n", 1)[1]
    atomic_write_text(path, existing + fresh)


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """Read ``manifest.json`` of ``run_dir``.

    Raises:
        RunDirError: the directory or the manifest is missing or not valid JSON.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory; pass a directory written by `dsa-bench compare`")
    path = run_dir / MANIFEST
    if not path.is_file():
        raise RunDirError(f"{path}: missing; {run_dir} is not a dsa-bench run directory (run `dsa-bench compare`)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RunDirError(f"{path}: not valid JSON ({error}); re-run `dsa-bench compare --resume {run_dir}`") from error


def read_table(run_dir: Path, name: str, columns: tuple[str, ...]):
    """Read ``levels.csv`` or ``requests.csv`` into a pandas DataFrame, checking the header.

    Columns in :data:`OPTIONAL_COLUMNS` may be absent (older run dirs, features off); they are added as empty.
    Returns an empty frame with ``columns`` when the file does not exist yet (a run stopped before any level finished).

    Raises:
        RunDirError: the file exists but is unreadable or lacks a required column.
    """
    import pandas as pd

    path = Path(run_dir) / name
    if not path.exists():
        return pd.DataFrame(columns=list(columns))
    try:
        frame = pd.read_csv(path, keep_default_na=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise RunDirError(f"{path}: unreadable CSV ({error}); re-run the affected levels with --resume") from error
    missing = [column for column in columns if column not in frame.columns and column not in OPTIONAL_COLUMNS]
    if missing:
        raise RunDirError(f"{path}: missing columns {missing}; the file is corrupted or from another tool")
    for column in columns:
        if column not in frame.columns:
            frame[column] = float("nan")
    return frame
