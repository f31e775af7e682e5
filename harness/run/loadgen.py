"""``python -m harness.run.loadgen``: one long-lived process that runs ``vllm bench serve`` level after level.

Each ``vllm bench serve`` process spends ~10 s importing vLLM; a sweep of 8 levels × 2 arms would pay that 16 times.
This driver imports vLLM's benchmark module once and runs each level through the *same* code path as the CLI
(``vllm.benchmarks.serve.add_cli_args`` + ``main``), so the figures are vLLM's own.

Protocol (JSON lines): the driver writes ``{"ready": true, "import_s": float}`` once, then for every request line
``{"argv": ["vllm", "bench", "serve", ...], "log": "path"}`` on stdin it runs the benchmark with stdout/stderr
appended to ``log`` and answers ``{"ok": bool, "error": str | null, "wall_s": float, "cpu_s": float}``, where
``cpu_s`` is the client's own CPU time (user + system) during the level — the input to the "client saturated" check.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback

BENCH_PREFIX = ("vllm", "bench", "serve")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    """Serve benchmark requests from stdin until EOF. Returns the exit code."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything vLLM prints goes to stderr (the driver's log), never into the protocol stream
    started = time.monotonic()
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

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
