"""Child processes: each in its own process group, logged to a file, terminated then killed on every exit path.

Every child the harness starts (servers, the benchmark client, lm-eval) goes through :func:`spawn`, which registers
it; :func:`stop_all` (called on normal exit, error, SIGINT and SIGTERM by :func:`cleanup_on_exit`) sends SIGTERM to
each process group, waits ``grace_s``, then SIGKILLs what is left. Commands are argument lists; no shell is used.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Mapping, Sequence

_children: list[subprocess.Popen] = []


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path | None, *,
          stdin: int | None = None, stdout: int | IO | None = None, watchdog: bool = False) -> subprocess.Popen:
    """Start ``argv`` in a new session (its own process group) with exactly ``env``.

    stdout/stderr go to ``log_path`` (appended) unless ``stdout`` is given (then stderr goes to the log).
    ``watchdog``: also start :mod:`harness.run.reaper` (in a session of its own), which ends the child's group when
    this process dies without stopping it (a Ray actor killed or lost with its node), and exits with the group.

    Raises:
        OSError: the executable does not exist or the log cannot be opened.
    """
    log = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115 (closed with the child)
    try:
        proc = subprocess.Popen(
            list(argv), env=dict(env), stdin=stdin, stdout=stdout if stdout is not None else log,
            stderr=log if log_path is not None else subprocess.DEVNULL, start_new_session=True,
        )
    finally:
        if log_path is not None:
            log.close()
    _children.append(proc)
    if watchdog:
        proc.reaper = subprocess.Popen(  # type: ignore[attr-defined]  (waited for in stop)
    [sys.executable, "-m", "harness.run.reaper", str(os.getpid()), str(proc.pid), "20"],
            env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
    return proc


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> int | None:
    """SIGTERM ``proc``'s process group, wait up to ``grace_s`` seconds, then SIGKILL it. Returns the exit code."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # The group may outlive its leader (vLLM's engine core, TP workers): kill whatever is left in it.
    _signal_group(proc, signal.SIGKILL)
    for member in (proc, getattr(proc, "reaper", None)):
        try:
            if member is not None:
                member.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    if proc in _children:
        _children.remove(proc)
    return proc.returncode


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all(grace_s: float = 20.0) -> None:
    """Stop every child still registered (newest first)."""
    for proc in reversed(list(_children)):
        stop(proc, grace_s)


def live_children() -> list[int]:
    """PIDs of registered children still running (tests assert this is empty after a run)."""
    return [proc.pid for proc in _children if proc.poll() is None]


class Interrupted(Exception):
    """Raised in the main thread on SIGTERM so that ``finally`` blocks run (SIGINT raises KeyboardInterrupt)."""


def cleanup_on_exit() -> None:
    """Install handlers: SIGTERM → :class:`Interrupted`; SIGINT → KeyboardInterrupt; atexit → :func:`stop_all`.

    SIGINT is set explicitly because a process started from a non-interactive shell's background job (``cmd &``,
    CI runners, nohup-style wrappers) inherits it ignored and Python then installs no handler: ``kill -INT`` would
    be lost and the run would go on to its end."""
    def _on_term(signum, frame):  # noqa: ARG001
        raise Interrupted(f"received signal {signum}")

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit.register(stop_all)


def _tree(pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


ENGINE_TITLE = "VLLM::EngineCor"
"""The start of the vLLM engine process's name: ``set_process_title("EngineCore")`` gives ``VLLM::EngineCore``
(``vllm/v1/engine/core.py:1410``, ``vllm/utils/system_utils.py:180``; ``_DP<rank>`` with data parallelism), which the
kernel's 15-character ``comm`` cuts to this."""


def engine_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds so far of the vLLM engine under server process ``pid``: every process of its tree
    named :data:`ENGINE_TITLE`… plus its descendants (the ``VLLM::Worker`` that runs the model), the API server left
    out (proc(5) ``utime``/``stime``, via psutil). None when no engine process is found (not started yet, gone, or a
    vLLM without process titles). Processes that exit while being read are skipped."""
    import psutil

    engines = []
    for member in _tree(pid):
        try:
            if member.name().startswith(ENGINE_TITLE):
                engines.append(member)
        except psutil.Error:
            continue
    if not engines:
        return None
    seen, total = set(), 0.0
    for engine in engines:
        for member in [engine, *_descendants(engine)]:
            if member.pid in seen:
                continue
            seen.add(member.pid)
            try:
                times = member.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
    return total


def _descendants(process) -> list:
    import psutil

    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def tree_rss_bytes(pid: int) -> int:
    """Resident memory (bytes) of process ``pid`` and all its descendants now (psutil); 0 when it is gone.
    Processes that exit while being read are skipped."""
    import psutil

    total = 0
    for member in _tree(pid):
        try:
            total += member.memory_info().rss
        except psutil.Error:
            continue
    return total


def gpu_mib_by_pid(csv_text: str) -> dict[int, float]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` output → {pid: MiB}
    (a process on several GPUs is summed; unparsable lines are skipped)."""
    used: dict[int, float] = {}
    for line in csv_text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                used[int(parts[0])] = used.get(int(parts[0]), 0.0) + float(parts[1])
            except ValueError:
                continue
    return used


def tree_gpu_bytes(pid: int) -> int:
    """GPU memory (bytes) held by process ``pid`` and its descendants now, from ``nvidia-smi``; 0 without it."""
    import shutil

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (subprocess.SubprocessError, OSError):
        return 0
    used = gpu_mib_by_pid(out)
    return int(sum(used.get(member.pid, 0.0) for member in _tree(pid)) * 2**20)
