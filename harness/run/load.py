"""Load generation with vLLM's own benchmark client, and the only module that knows vLLM's bench result JSON.

:class:`LoadClient` drives one long-lived ``python -m harness.run.loadgen`` child (vLLM imported once per run);
:func:`parse_bench_result` turns a ``vllm bench serve --save-result --save-detailed`` JSON into one ``levels.csv``
row and ``requests.csv`` rows (schema: :mod:`harness.rundir.schema`).
"""

from __future__ import annotations

import json
import math
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from harness.run import procs
from harness.metrics import finite_float
from harness.rundir.schema import Level


class LevelError(RuntimeError):
    """A benchmark level failed or timed out (the message says which and why)."""


class LoadClient:
    """A ``harness.run.loadgen`` child process that runs ``vllm bench serve`` argv lists in-process.

    Args:
        env: environment of the client process.
        log_path: the driver's own log (its import and protocol errors).
        watchdog: end the client if this process dies without closing it (a Ray actor's client).
    """

    def __init__(self, env: Mapping[str, str], log_path: Path, watchdog: bool = False):
        self.env = dict(env)
        self.watchdog = watchdog
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.import_s = 0.0

    def start(self) -> None:
        """Start the client process now (vLLM imported) instead of at the first level, so that two clients' first
        levels can begin together.

        Raises:
            LevelError: the client died or did not answer while starting.
        """
        self._ensure_started()

    def _ensure_started(self, timeout_s: float = 300.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.proc = procs.spawn([sys.executable, "-m", "harness.run.loadgen"], self.env, self.log_path,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, watchdog=self.watchdog)
        reply = self._read_reply(timeout_s, "benchmark client start")
        self.import_s += float(reply.get("import_s", 0.0))

    def _read_reply(self, timeout_s: float, what: str, on_tick: Callable[[], None] | None = None) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise LevelError(f"{what} timeout: no result after {timeout_s:.0f} s "
                                 f"(raise workload.level_timeout_s if the level is just slow)")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(1.0, remaining))
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    code = self.proc.wait(timeout=10)
                    self.proc = None
                    raise LevelError(f"benchmark client exited with code {code} during {what}; see {self.log_path}")
                return json.loads(line)
            if on_tick is not None:
                on_tick()

    def run(self, argv: Sequence[str], log_path: Path, timeout_s: float,
            on_tick: Callable[[], None] | None = None) -> dict[str, Any]:
        """Run one ``vllm bench serve`` argv; returns ``{"ok", "error", "wall_s", "cpu_s"}``.

        ``on_tick`` is called about once a second while the level runs (progress display).

        Raises:
            LevelError: the client died or the level exceeded ``timeout_s`` (the client is then restarted lazily).
        """
        self._ensure_started()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"argv": list(argv), "log": str(log_path)}) + "\n").encode())
        self.proc.stdin.flush()
        return self._read_reply(timeout_s, "per-level", on_tick)

    def close(self) -> None:
        """Stop the client process."""
        if self.proc is not None:
            procs.stop(self.proc, grace_s=5.0)
            self.proc = None


def _num(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _max_gap_ms(gaps_s: Sequence[float] | None) -> float:
    """The largest of one request's inter-chunk gaps (seconds) in ms; 0.0 when it has none (one burst)."""
    return 1000.0 * max((float(gap) for gap in gaps_s or ()), default=0.0)


def parse_bench_result(data: Mapping[str, Any], arm: str, level: Level, round_: int, session: int | None = None
                       ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One vLLM bench result JSON of ``level`` → (``levels.csv`` row, ``requests.csv`` rows).

    Per request: TTFT and E2EL from vLLM's ``ttfts``/``latencies`` (s → ms); ``output_len`` is the server-counted
    ``usage.completion_tokens`` (vLLM's ``output_lens``); TPOT = (E2EL − TTFT)/(output_len − 1) for output_len > 1
    (vLLM ``benchmarks/serve.py`` ``calculate_metrics``), else empty. ``start_s`` is relative to the first request.
    ``max_itl_ms`` is the request's largest gap between streamed chunks (vLLM's ``itls``, s → ms): 0 for a successful
    multi-token request whose whole output came in its first chunk (``itls`` empty), empty where ``itls`` is absent
    (a result saved without ``--save-detailed``), for a failed request, or for one output token.

    Raises:
        ValueError: a required key is missing or the per-request arrays disagree in length (corrupted file).
    """
    required = ("duration", "completed", "output_throughput", "total_token_throughput", "request_throughput",
                "input_lens", "output_lens", "ttfts", "latencies", "errors")
    missing = [key for key in required if key not in data]
    if missing:
        raise ValueError(f"benchmark JSON lacks {missing} (not a `vllm bench serve --save-detailed` result?)")
    count = len(data["input_lens"])
    for key in ("output_lens", "ttfts", "latencies", "errors"):
        if len(data[key]) != count:
            raise ValueError(f"benchmark JSON: '{key}' has {len(data[key])} entries, input_lens has {count}")
    starts = data.get("start_times") or [None] * count
    itls = data.get("itls")
    if itls is not None and len(itls) != count:
        raise ValueError(f"benchmark JSON: 'itls' has {len(itls)} entries, input_lens has {count}")
    first = min((s for s in starts if s is not None), default=None)
    requests = []
    for index in range(count):
        error = data["errors"][index] or ""
        output_len = int(data["output_lens"][index] or 0)
        ttft_ms = data["ttfts"][index] * 1000.0 if not error else None
        e2el_ms = data["latencies"][index] * 1000.0 if not error else None
        tpot_ms = (e2el_ms - ttft_ms) / (output_len - 1) if (not error and output_len > 1) else None
        requests.append({
            "arm": arm, "session": session, "round": round_, "level": str(level), "concurrency": level.concurrency,
            "index": index,
            "input_len": int(data["input_lens"][index]), "output_len": output_len,
            "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "e2el_ms": e2el_ms,
            "start_s": (starts[index] - first) if (starts[index] is not None and first is not None) else None,
            "error": error.strip().splitlines()[-1][:300] if error else "",
            "max_itl_ms": _max_gap_ms(itls[index]) if (itls is not None and not error and output_len > 1) else None,
        })
    level = {
        "arm": arm, "session": session, "round": round_, "level": str(level), "concurrency": level.concurrency,
        "completed": int(data["completed"]), "failed": int(data.get("failed", count - int(data["completed"]))),
        "duration_s": float(data["duration"]),
        "output_throughput": float(data["output_throughput"]),
        "total_token_throughput": float(data["total_token_throughput"]),
        "request_throughput": float(data["request_throughput"]),
        "max_concurrent_requests": data.get("max_concurrent_requests"),
    }
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p99"):
            level[f"{stat}_{metric}_ms"] = _num(data.get(f"{stat}_{metric}_ms"))
    level.update(_goodput(data))
    return level, requests


def _goodput(data: Mapping[str, Any]) -> dict[str, float | None]:
    """``request_goodput`` (req/s) and ``slo_attainment`` (0..1) of a result run with ``--goodput`` (the scenario's
    ``[slo]``): vLLM's own ``request_goodput`` = requests meeting every SLO / duration (``benchmarks/serve.py``
    ``calculate_metrics``: TTFT, TPOT — 0 for a one-token request — and E2EL each ≤ its SLO), and the share of
    completed requests that met them, ``round(goodput × duration) / completed``. Both None without ``--goodput``."""
    goodput, duration = finite_float(data.get("request_goodput")), finite_float(data.get("duration"))
    completed = finite_float(data.get("completed"))
    if goodput is None or not duration or not completed:
        return {"request_goodput": None, "slo_attainment": None}
    return {"request_goodput": goodput, "slo_attainment": round(goodput * duration) / completed}


def read_bench_json(path: Path) -> dict[str, Any]:
    """Read a bench result JSON file.

    Raises:
        ValueError: the file is not valid JSON (message names the file).
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: unreadable benchmark JSON ({error})") from error
