"""``python -m harness.run.loadgen``: one long-lived process that runs ``vllm bench serve`` level after level.

Each ``vllm bench serve`` process spends ~10 s importing vLLM; a sweep of 8 levels × 2 arms would pay that 16 times.
This driver imports vLLM's benchmark module once and runs each level through the *same* code path as the CLI
(``vllm.benchmarks.serve.add_cli_args`` + ``main``), so the figures are vLLM's own.

Protocol (JSON lines): the driver writes ``{"ready": true, "import_s": float}`` once, then for every request line
``{"argv": ["vllm", "bench", "serve", ...], "log": "path"}`` on stdin it runs the benchmark with stdout/stderr
appended to ``log`` and answers ``{"ok": bool, "error": str | null, "wall_s": float, "cpu_s": float}``, where
``cpu_s`` is the client's own CPU time (user + system) during the level — the input to the "client saturated" check.

Server metrics: :func:`install_capture` makes every level's saved result also hold the server's full ``/metrics`` text
at the two points where vLLM's bench reads it (after the warmups, before and after the measured requests), under
:data:`harness.run.server_metrics.RESULT_KEY`; :mod:`harness.run.server_metrics` turns them into columns.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback

BENCH_PREFIX = ("vllm", "bench", "serve")


async def _metrics_text(base_url: str, session) -> dict | None:
    """``{"unix_s": float, "text": str}`` of ``base_url``/metrics read with the bench's own aiohttp ``session``;
    None (and a line on stderr, the level's log) when the server does not answer it."""
    import aiohttp

    try:
        async with session.get(f"{base_url}/metrics") as response:
            if response.status == 200:
                return {"unix_s": time.time(), "text": await response.text()}
            print(f"dsa-bench: /metrics answered HTTP {response.status}; no server metrics for this level",
                  file=sys.stderr)
    except (TimeoutError, aiohttp.ClientError) as error:
        print(f"dsa-bench: /metrics unreadable ({error!r}); no server metrics for this level", file=sys.stderr)
    return None


def install_capture(serve_module) -> None:
    """Wrap ``serve_module`` (``vllm.benchmarks.serve``) so each ``benchmark()`` result carries the ``/metrics``
    text at bench's own two reads around the measured requests.

    ``benchmark()`` calls the module-level ``fetch_spec_decode_metrics(base_url, session)`` exactly twice: right
    before the measured requests (the ready check and the warmups are done) and right after the last of them
    (vLLM 0.32 ``benchmarks/serve.py``). The wrapper reads the full text just before each of those calls; the
    wrapped ``benchmark`` adds ``{"before": capture, "after": capture}`` to its result dict under
    :data:`~harness.run.server_metrics.RESULT_KEY`, which ``main`` merges into the saved result JSON. Any other
    number of reads (another vLLM version) or a failed read leaves the key out, with a line on stderr.
    """
    from harness.run.server_metrics import RESULT_KEY

    fetch_spec_decode, run_benchmark = serve_module.fetch_spec_decode_metrics, serve_module.benchmark
    captures: list[dict | None] = []

    async def fetch_with_capture(base_url, session):
        captures.append(await _metrics_text(base_url, session))
        return await fetch_spec_decode(base_url, session)

    async def benchmark_with_capture(*args, **kwargs):
        captures.clear()
        result = await run_benchmark(*args, **kwargs)
        if len(captures) == 2 and all(captures):
            result[RESULT_KEY] = {"before": captures[0], "after": captures[1]}
        elif len(captures) != 2:
            print(f"dsa-bench: vLLM's bench read /metrics {len(captures)} times (expected 2: before and after the "
                  f"measured requests); no server metrics for this level", file=sys.stderr)
        return result

    serve_module.fetch_spec_decode_metrics = fetch_with_capture
    serve_module.benchmark = benchmark_with_capture


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    """Serve benchmark requests from stdin until EOF. Returns the exit code."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything vLLM prints goes to stderr (the driver's log), never into the protocol stream
    started = time.monotonic()
    import vllm.benchmarks.serve as serve_module
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    install_capture(serve_module)
    add_cli_args, bench_main = serve_module.add_cli_args, serve_module.main

    protocol.write(json.dumps({"ready": True, "import_s": time.monotonic() - started}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        argv = request["argv"]
        if tuple(argv[:3]) != BENCH_PREFIX:
            protocol.write(json.dumps({"ok": False, "error": f"not a vllm bench serve command: {argv[:3]}"}) + "\n")
            continue
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        wall0, cpu0 = time.monotonic(), _cpu_seconds()
        error = None
        with open(request["log"], "a", encoding="utf-8") as log:
            stdout_fd, stderr_fd = os.dup(1), os.dup(2)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                bench_main(parser.parse_args(argv[3:]))
            except (Exception, SystemExit) as exc:  # noqa: BLE001 — report every failure to the parent, keep serving
                traceback.print_exc()
                error = f"{exc.__class__.__name__}: {exc}"
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(stdout_fd, 1)
                os.dup2(stderr_fd, 2)
                os.close(stdout_fd)
                os.close(stderr_fd)
        reply = {"ok": error is None, "error": error, "wall_s": time.monotonic() - wall0,
                 "cpu_s": _cpu_seconds() - cpu0}
        protocol.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
