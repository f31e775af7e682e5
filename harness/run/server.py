"""One ``vllm serve`` per arm: start in its own process group, wait for a real completion, stop on every exit path.

Readiness is one successful ``/v1/completions`` request, not ``/health``: vLLM CPU can answer ``/health`` and then
die on the first real request (e.g. an unsupported MLA head size).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

import requests

from harness.run import procs


class ServerError(RuntimeError):
    """The server did not become ready; the message quotes the last lines of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file ('' when absent)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


class _Endpoint:
    """An OpenAI-compatible vLLM endpoint: base URL, auth header, served model name, and readiness probes."""

    def __init__(self, base_url: str, served_model_name: str | None, api_key: str | None):
        self.base_url = base_url.rstrip("/")
        self.served_model_name = served_model_name
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.ready_s: float | None = None

    load_client = None
    """The benchmark client placed next to this server (a Ray-placed server's); None: the run's own client."""

    def _healthy(self) -> bool:
        try:
            return requests.get(f"{self.base_url}/health", timeout=5, headers=self.headers).status_code == 200
        except requests.RequestException:
            return False

    def _first_completion(self) -> tuple[bool, str]:
        body = {"model": self.served_model_name, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        try:
            response = requests.post(f"{self.base_url}/v1/completions", json=body, timeout=300, headers=self.headers)
        except requests.RequestException as error:
            return False, f"completion request failed: {error.__class__.__name__}"
        if response.status_code != 200:
            return False, f"completion returned HTTP {response.status_code}: {response.text[:200]}"
        try:
            choices = response.json()["choices"]
        except (ValueError, KeyError):
            return False, "completion answer is not OpenAI JSON"
        return (bool(choices), "ok" if choices else "completion returned no choices")


class VllmServer(_Endpoint):
    """A ``vllm serve`` process that dsa-bench starts and stops.

    Args:
        argv: the full command (``vllm serve MODEL ... --port PORT``).
        env: the complete environment of the server process.
        port: the port in ``argv``.
        served_model_name: the model name requests must use.
        log_path: where stdout+stderr go.
        api_key: sent as a bearer token when the server requires one (never written anywhere).
        host: the address in ``argv``'s ``--host`` (a Ray-placed server listens on its node's address).
        watchdog: end the server's process group if this process dies without stopping it (Ray actors).
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], port: int, served_model_name: str,
                 log_path: Path, api_key: str | None = None, host: str = "127.0.0.1", watchdog: bool = False):
        super().__init__(f"http://{host}:{port}", served_model_name, api_key)
        self.watchdog = watchdog
        self.argv = list(argv)
        self.env = dict(env)
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.log_offset = 0           # bytes of the log before this session (sessions append to one log)
        self.peak_rss_bytes = 0       # largest resident memory of the server's process tree while starting
        self.peak_gpu_bytes = 0       # largest GPU memory of the server's process tree while starting (nvidia-smi)

    def start(self, timeout_s: float) -> float:
        """Spawn the server and block until a real completion succeeds. Returns seconds to ready.

        Raises:
            ServerError: the port is taken, the process exited, the first completion failed, or ``timeout_s`` passed
                (server ready timeout); the message includes the log's last lines.
        """
        if not _port_is_free(self.port):
            raise ServerError(f"port {self.port} is already in use; stop what listens there or let dsa-bench pick one")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        started = time.monotonic()
        try:
            self.proc = procs.spawn(self.argv, self.env, self.log_path, watchdog=self.watchdog)
        except OSError as error:
            raise ServerError(f"cannot start {self.argv[0]} ({error.strerror or error}); run scripts/setup.sh "
                              f"to install vLLM into .venv/") from None
        try:
            return self._wait_ready(started, timeout_s)
        except BaseException:
            self.stop()  # a server that never became ready (or a Ctrl-C while waiting) leaves nothing running
            raise

    def _wait_ready(self, started: float, timeout_s: float) -> float:
        assert self.proc is not None
        deadline = started + timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise ServerError(self._failure(f"server exited with code {code} before it was ready"))
            self.peak_rss_bytes = max(self.peak_rss_bytes, procs.tree_rss_bytes(self.proc.pid))
            self.peak_gpu_bytes = max(self.peak_gpu_bytes, procs.tree_gpu_bytes(self.proc.pid))
            if self._healthy():
                ok, last_error = self._first_completion()
                if ok:
                    self.ready_s = time.monotonic() - started
                    return self.ready_s
                time.sleep(1.0)
                if self.proc.poll() is not None:
                    raise ServerError(self._failure(f"/health was ok but the first completion failed ({last_error}) "
                                                    f"and the server exited with code {self.proc.returncode}"))
            time.sleep(1.0)
        raise ServerError(self._failure(f"server ready timeout: not ready after {timeout_s:.0f} s ({last_error}); "
                                        f"raise serve.ready_timeout_s if startup is just slow"))

    def session_log(self) -> str:
        """What this session wrote to the log (from :attr:`log_offset` on)."""
        with open(self.log_path, "rb") as log:
            log.seek(self.log_offset)
            return log.read().decode("utf-8", errors="replace")

    def _failure(self, what: str) -> str:
        tail = log_tail(self.log_path)
        return f"{what}; log {self.log_path}, last lines:\n{tail}" if tail else f"{what}; log {self.log_path} is empty"

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Terminate the server's process group (SIGTERM, grace, SIGKILL)."""
        if self.proc is not None:
            procs.stop(self.proc)


class RemoteServer(_Endpoint):
    """A server started by other tooling (``--base-url-baseline/--base-url-candidate``, e.g. multi-node TP/PP with
    vLLM's Ray executor): dsa-bench connects to it and never starts or stops it."""

    log_path = None

    def connect(self, timeout_s: float) -> float:
        """Wait until ``/health`` answers and one real completion succeeds; learn the served model from
        ``/v1/models`` when not given. Returns seconds to ready.

        Raises:
            ServerError: not ready within ``timeout_s`` (server ready timeout), with the last error seen.
        """
        started = time.monotonic()
        last_error = "no answer from /health"
        while time.monotonic() - started < timeout_s:
            if self._healthy():
                if self.served_model_name is None:
                    self.served_model_name = (served_models(self.base_url, self.headers) or [None])[0]
                ok, last_error = self._first_completion()
                if ok:
                    self.ready_s = time.monotonic() - started
                    return self.ready_s
            time.sleep(1.0)
        raise ServerError(f"server ready timeout: {self.base_url} not ready after {timeout_s:.0f} s ({last_error}); "
                          f"check the URL and that the server is up")

    def alive(self) -> bool:
        """Whether ``/health`` answers."""
        return self._healthy()

    def stop(self) -> None:
        """Nothing: dsa-bench did not start this server."""


def served_models(base_url: str, headers: Mapping[str, str] | None = None) -> list[str]:
    """Model ids from ``/v1/models`` ([] when unavailable)."""
    try:
        data = requests.get(f"{base_url}/v1/models", timeout=5, headers=dict(headers or {})).json()
        return [item["id"] for item in data.get("data", [])]
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return []


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def scrape_metrics(base_url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 5.0) -> dict[str, float]:
    """Read the server's Prometheus ``/metrics`` into ``{"name{label=value,...}": value}`` (samples summed over
    identical keys). Parsing uses prometheus_client's text parser.

    Raises:
        requests.RequestException: the server did not answer.
    """
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{base_url}/metrics", timeout=timeout_s, headers=dict(headers or {})).text
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                              if k not in ("model_name", "engine"))
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            samples[key] = samples.get(key, 0.0) + sample.value
    return samples


def server_version(base_url: str, headers: Mapping[str, str] | None = None) -> str | None:
    """vLLM's ``/version`` answer, or None."""
    try:
        return json.loads(requests.get(f"{base_url}/version", timeout=5, headers=dict(headers or {})).text)["version"]
    except (requests.RequestException, ValueError, KeyError):
        return None


def request_successes(server) -> float:
    """``vllm:request_success_total`` summed over its label sets on ``server`` (a VllmServer or RemoteServer); 0.0
    when ``/metrics`` cannot be read (the progress display's count only)."""
    try:
        samples = scrape_metrics(server.base_url, server.headers)
        return sum(v for k, v in samples.items() if k.split("{")[0] == "vllm:request_success_total")
    except Exception:  # noqa: BLE001 — progress display only
        return 0.0
