"""Helpers of the fault and security tests: the fake ``vllm`` executable, the test scenario, and the checks that no
process a test caused is left running.

Every process a test causes (dsa-bench, fake servers, their "engine core" children, the benchmark client, lm-eval)
inherits a unique ``DSA_FAULT_TEST_TAG`` in its environment; :func:`tagged_processes` finds the live ones through
``/proc/<pid>/environ``, so the check also sees grandchildren and processes re-parented after their parent died, and
never confuses a test's processes with a colleague's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import requests
from harness.run.server import free_port

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
FAKE_VLLM = TESTS / "fakes" / "fake_vllm.py"
SCENARIO = TESTS / "fixtures" / "scenarios" / "fault-tiny.toml"
DSA_BENCH = Path(sys.executable).parent / "dsa-bench"
XSS = "<script>alert(1)</script>"


def fake_executable(folder: Path) -> Path:
    """A ``vllm`` wrapper in ``folder`` that runs the fake server with this interpreter (for ``DSA_BENCH_VLLM``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vllm"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_VLLM}" "$@"\n', encoding="utf-8")
    path.chmod(0o755)
    return path


def fake_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """Environment additions for a run against the fake: ``DSA_BENCH_VLLM``, a pid directory, a request log, a tag.

    ``settings`` become ``FAKE_VLLM_<KEY>`` (``mode_candidate="die_after"`` → ``FAKE_VLLM_MODE_CANDIDATE``)."""
    env = {
        "DSA_BENCH_VLLM": str(fake_executable(tmp_path / "bin")),
        "FAKE_VLLM_PIDDIR": str(tmp_path / "pids"),
        "FAKE_VLLM_REQLOG": str(tmp_path / "requests.log"),
        "DSA_FAULT_TEST_TAG": uuid.uuid4().hex,
    }
    env.update({f"FAKE_VLLM_{key.upper()}": str(value) for key, value in settings.items()})
    return env


def clean_environ() -> dict[str, str]:
    """``os.environ`` without any ``FAKE_VLLM_*``/``VLLM_API_KEY``/``DSA_BENCH_VLLM`` left over from the caller."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("FAKE_VLLM_") and k not in ("VLLM_API_KEY", "OPENAI_API_KEY", "DSA_BENCH_VLLM")}


def scenario_copy(tmp_path: Path, name: str = "scenario.toml", **replace: str) -> Path:
    """The fault scenario with lines replaced: ``ready_timeout_s="ready_timeout_s = 3"`` swaps the line that starts
    with ``ready_timeout_s``."""
    lines = SCENARIO.read_text(encoding="utf-8").splitlines()
    for key, line in replace.items():
        matches = [i for i, text in enumerate(lines) if text.split("=")[0].strip() == key]
        assert len(matches) == 1, f"{key} appears {len(matches)} times in {SCENARIO}"
        lines[matches[0]] = line
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a killed child of a dead parent may stay a zombie under PID 1)."""
    return _state(pid) not in (None, "Z", "X")


def tagged_processes(tag: str) -> list[str]:
    """``"pid: cmdline"`` of every running process whose environment holds ``DSA_FAULT_TEST_TAG=<tag>``."""
    needle = f"DSA_FAULT_TEST_TAG={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in environ.split(b"\0") and running(int(entry.name)):
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def fake_pids(piddir: Path) -> dict[int, str]:
    """``{pid: "server"|"engine"}`` of every fake process started with ``FAKE_VLLM_PIDDIR=piddir``."""
    if not piddir.is_dir():
        return {}
    return {int(p.name.split(".")[0]): p.name.split(".")[1] for p in piddir.iterdir()}


def leftovers(env: dict[str, str]) -> list[str]:
    """Processes of a test still running: fake servers/engines from the pid directory, and any tagged process.
    Waits up to 5 s for processes that are being killed right now."""
    deadline = time.monotonic() + 5
    while True:
        alive = [f"fake {kind} {pid}" for pid, kind in fake_pids(Path(env["FAKE_VLLM_PIDDIR"])).items()
                 if running(pid)]
        alive += tagged_processes(env["DSA_FAULT_TEST_TAG"])
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def spawn_sigint_ignored(argv: list, env: dict[str, str]) -> subprocess.Popen:
    """Start ``argv`` (text pipes, a session of its own) with SIGINT ignored, as a CI runner's or a non-interactive
    shell's background job starts it (POSIX: bash sets SIG_IGN for asynchronous commands without job control; Python
    then installs no KeyboardInterrupt handler). A Ctrl-C test through this checks that dsa-bench installs its own
    (:func:`harness.run.procs.cleanup_on_exit`)."""
    return subprocess.Popen([str(arg) for arg in argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def wait_for(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


class FakeServer:
    """A fake ``vllm serve`` the test itself starts (for ``--base-url-*`` and lm-eval), in its own process group."""

    def __init__(self, tmp_path: Path, env: dict[str, str], model: str = "tiny-deepseek-v3", name: str = "remote"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"{name}-fake-server.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(FAKE_VLLM), "serve", model, "--host", "127.0.0.1", "--port", str(self.port)],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if not wait_for(self._healthy, 30):
            self.stop()
            raise RuntimeError(f"fake server did not start; log:\n{self.log_path.read_text()}")

    def _healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


class StubServer:
    """A started server as far as the runner's session bookkeeping looks at one (``alive``/``stop``, an address),
    for runner tests that replace server start and the benchmark client."""

    base_url, served_model_name, headers, load_client = "http://127.0.0.1:1", "stub", {}, None

    def __init__(self):
        self.stopped = False

    def alive(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped = True
