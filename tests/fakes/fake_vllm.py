#!/usr/bin/env python3
"""A fake ``vllm`` executable for fault tests: ``fake_vllm.py serve MODEL --host H --port P [vLLM flags ...]``.

Standard library only. It speaks just enough of vLLM's OpenAI server for dsa-bench and vLLM's own benchmark client
(``vllm/benchmarks/lib/endpoint_request_func.py``, backend ``vllm``): ``/health``, ``/version``, ``/v1/models``,
``/metrics`` (Prometheus text with ``vllm:request_success_total``) and ``/v1/completions`` — non-streaming
(dsa-bench's readiness probe, lm-eval's ``local-completions``: one choice per prompt) and streaming (SSE
``data: {...}`` chunks, one per token, with ``choices[0].text``; a final usage chunk with ``completion_tokens`` when
``stream_options.include_usage``; then ``data: [DONE]``). Like ``vllm serve`` it starts an "engine core" child process
in its own process group, so tests can check that a whole group is stopped, not just its leader.

Behaviour comes from the environment. Each ``FAKE_VLLM_<NAME>`` may be given per arm as ``FAKE_VLLM_<NAME>_<ARM>``
(``<ARM>`` = ``$FAKE_VLLM_ARM`` upper-cased; the test scenario sets ``FAKE_VLLM_ARM`` in each arm's env), which wins:

- ``FAKE_VLLM_MODE``:
  ``ok`` (default); ``exit_before_ready`` (logs a startup error, exits 3 before listening); ``oom`` (logs a CUDA OOM
  traceback like vLLM's engine core, exits 1); ``completion_fails`` (``/health`` ok, the first completion answers
  HTTP 500 and the server exits 1 — what vLLM CPU does with an unsupported MLA head size); ``completion_fails_stay``
  (every completion answers 500, the server stays up); ``never_ready`` (``/health`` answers 503 forever);
  ``die_after`` (after ``FAKE_VLLM_N`` counted completions the next one kills the server: ``os._exit(1)``);
  ``stall_after`` (after ``FAKE_VLLM_N`` counted completions every further one hangs).
- ``FAKE_VLLM_N``: the count for ``die_after``/``stall_after``.
- ``FAKE_VLLM_COUNT``: which completions count: ``stream`` (default: the benchmark client's; not dsa-bench's
  readiness probe or parity prompts) or ``all`` (e.g. lm-eval's, which are not streamed).
- ``FAKE_VLLM_DELAY_S``: seconds per streamed token (default 0.002); non-streamed answers come at once.
- ``FAKE_VLLM_TEXT``: the text of each generated token (default ``" tok"``).
- ``FAKE_VLLM_MODEL``: the served model name (default: ``--served-model-name``, else MODEL).
- ``FAKE_VLLM_FAIL_REASON``: when set, streaming request number ``FAKE_VLLM_FAIL_AT`` (default 3: the bench client's
  second measured request after one warmup) answers HTTP 500 with this reason phrase (vLLM's bench client records
  ``response.reason`` as the request's error).
- ``FAKE_VLLM_PIDDIR``: write ``<pid>.server`` / ``<pid>.engine`` there (tests check none is left running).
- ``FAKE_VLLM_REQLOG``: append one line per completion request (``<arm> stream|plain``).
- ``VLLM_API_KEY``: like vLLM, require ``Authorization: Bearer <key>`` on ``/v1/*`` (never printed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARM = os.environ.get("FAKE_VLLM_ARM", "")


def setting(name: str, default: str = "") -> str:
    """``FAKE_VLLM_<name>_<ARM>`` if set, else ``FAKE_VLLM_<name>``, else ``default``."""
    if ARM and f"FAKE_VLLM_{name}_{ARM.upper()}" in os.environ:
        return os.environ[f"FAKE_VLLM_{name}_{ARM.upper()}"]
    return os.environ.get(f"FAKE_VLLM_{name}", default)


MODE = setting("MODE", "ok")
COUNT = int(setting("N", "0") or 0)
COUNT_ALL = setting("COUNT", "stream") == "all"
DELAY_S = float(setting("DELAY_S", "0.002") or 0)
TEXT = setting("TEXT", " tok")
FAIL_REASON = setting("FAIL_REASON")
FAIL_AT = int(setting("FAIL_AT", "3") or 3)
PIDDIR = os.environ.get("FAKE_VLLM_PIDDIR")
REQLOG = os.environ.get("FAKE_VLLM_REQLOG")
API_KEY = os.environ.get("VLLM_API_KEY")


def log(message: str) -> None:
    print(f"(APIServer pid={os.getpid()}) INFO {time.strftime('%m-%d %H:%M:%S')} [api_server.py:1] {message}",
          flush=True)


def record_pid(pid: int, kind: str) -> None:
    if PIDDIR:
        os.makedirs(PIDDIR, exist_ok=True)
        with open(os.path.join(PIDDIR, f"{pid}.{kind}"), "w", encoding="utf-8") as handle:
            handle.write(" ".join(sys.argv))


class State:
    lock = threading.Lock()
    completions = 0          # every /v1/completions request
    streams = 0              # streaming ones
    successes = 0


def choice(index: int, tokens: int, body: dict) -> dict:
    """A non-streamed choice; ``token_ids`` and ``logprobs`` (top entries as ``"token_id:<id>"`` keys) when asked,
    the same for every request, so two fake arms always agree (dsa-bench's parity check)."""
    ids = [1000 + position for position in range(tokens)]
    result = {"index": index, "text": TEXT * tokens, "finish_reason": "length", "logprobs": None}
    prompt = body.get("prompt")
    prompt_ids = list(prompt) if isinstance(prompt, list) else [10 + i for i, _ in enumerate(str(prompt).split())]
    if body.get("return_token_ids"):
        result["token_ids"] = ids
        result["prompt_token_ids"] = prompt_ids
    if body.get("prompt_logprobs") is not None:   # teacher-forced scoring: the same for every request
        result["prompt_logprobs"] = [None] + [{str(t): {"logprob": -0.5, "rank": 1}, "7": {"logprob": -1.5, "rank": 2}}
                                              for t in prompt_ids[1:]]
    if body.get("logprobs") is not None:
        result["logprobs"] = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * tokens,
                              "top_logprobs": [{f"token_id:{i}": -0.5, "token_id:7": -1.5} for i in ids],
                              "text_offset": [len(TEXT) * position for position in range(tokens)]}
    return result


def make_handler(served: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args):  # quiet: the log holds startup lines only
            pass

        def _json(self, code: int, data, reason: str | None = None) -> None:
            body = json.dumps(data).encode()
            self.send_response(code, reason)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self) -> bool:
            if API_KEY and self.headers.get("Authorization") != f"Bearer {API_KEY}":
                self._json(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self):  # noqa: N802
            if self.path == "/health":
                self._json(503 if MODE == "never_ready" else 200, {})
            elif self.path == "/version":
                self._json(200, {"version": "0.32.0+fake"})
            elif self.path == "/metrics":
                text = ("# HELP vllm:request_success_total Count of successfully processed requests.\n"
                        "# TYPE vllm:request_success_total counter\n"
                        f'vllm:request_success_total{{finished_reason="length",model_name="fake"}} '
                        f"{float(State.successes)}\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)
            elif self.path == "/v1/models":
                if self._authorized():
                    self._json(200, {"object": "list", "data": [{"id": served, "object": "model",
                                                                  "owned_by": "vllm"}]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):  # noqa: N802
            if self.path != "/v1/completions":
                self._json(404, {"error": "not found"})
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not self._authorized():
                return
            stream = bool(body.get("stream"))
            with State.lock:
                State.completions += 1
                State.streams += stream
                counted = State.completions if COUNT_ALL else State.streams
                fail_now = bool(FAIL_REASON) and stream and State.streams == FAIL_AT
            if REQLOG:
                with open(REQLOG, "a", encoding="utf-8") as handle:
                    handle.write(f"{ARM} {'stream' if stream else 'plain'}\n")
            if MODE == "die_after" and counted > COUNT and (stream or COUNT_ALL):
                os._exit(1)
            if MODE == "stall_after" and counted > COUNT and (stream or COUNT_ALL):
                time.sleep(3600)
            if MODE in ("completion_fails", "completion_fails_stay"):
                self._json(500, {"error": {"message": "EngineCore encountered an issue: head size 576 is not "
                                                      "supported by the CPU attention backend"}})
                if MODE == "completion_fails":
                    print("ERROR [core.py:1] EngineCore died: head size 576 is not supported", flush=True)
                    threading.Timer(0.2, lambda: os._exit(1)).start()
                return
            if fail_now:
                self._json(500, {"error": "refused"}, reason=FAIL_REASON)
                return
            tokens = int(body.get("max_tokens") or 16)
            prompts = body.get("prompt")
            if stream:
                self._stream(body, tokens)
            else:
                count = len(prompts) if isinstance(prompts, list) and prompts and isinstance(prompts[0], str) else 1
                self._json(200, {
                    "id": "cmpl-fake", "object": "text_completion", "model": served,
                    "choices": [choice(i, tokens, body) for i in range(count)],
                    "usage": {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": 4 + tokens},
                })
            with State.lock:
                State.successes += 1

        def _stream(self, body, tokens: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for index in range(tokens):
                time.sleep(DELAY_S)
                chunk = {"id": "cmpl-fake", "object": "text_completion", "model": served,
                         "choices": [{"index": 0, "text": TEXT, "logprobs": None,
                                      "finish_reason": "length" if index == tokens - 1 else None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"id": "cmpl-fake", "object": "text_completion", "model": served, "choices": [],
                         "usage": {"prompt_tokens": 16, "completion_tokens": tokens, "total_tokens": 16 + tokens}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


def main() -> int:
    parser = argparse.ArgumentParser(prog="fake-vllm")
    parser.add_argument("command")
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name")
    args, _unknown = parser.parse_known_args()
    if args.command != "serve":
        print(f"fake-vllm: only `serve` is faked, not {args.command!r}", file=sys.stderr)
        return 2
    record_pid(os.getpid(), "server")
    served = os.environ.get("FAKE_VLLM_MODEL") or args.served_model_name or args.model
    log(f"vLLM API server version 0.32.0+fake; model [{args.model}]")
    # The "engine core": a child in this process group, as vLLM's EngineCore process is.
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "fake_vllm_engine"])
    record_pid(engine.pid, "engine")
    if MODE == "exit_before_ready":
        print(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [core.py:700] ValueError: no config.json in "
              f"[/nonexistent/{os.path.basename(args.model)}]", flush=True)
        return 3
    if MODE == "oom":
        time.sleep(0.3)
        for line in ("(EngineCore_DP0 pid=1) ERROR [core.py:1028] EngineCore failed to start.",
                     "(EngineCore_DP0 pid=1) ERROR [core.py:1028] Traceback (most recent call last):",
                     "(EngineCore_DP0 pid=1) ERROR [core.py:1028] torch.OutOfMemoryError: CUDA out of memory. "
                     "Tried to allocate 7.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.23 GiB is free.",
                     "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"):
            print(line, flush=True)
        return 1
    try:
        server = ThreadingHTTPServer((args.host, args.port), make_handler(served))
    except OSError as error:
        print(f"ERROR [api_server.py:1] OSError: [Errno {error.errno}] {error.strerror}: "
              f"('{args.host}', {args.port})", flush=True)
        return 1
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: (print("INFO shutting down", flush=True), os._exit(0)))
    log(f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
