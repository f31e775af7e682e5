"""Whether an arm's GPUs are idle before its server session starts: ``nvidia-smi`` utilisation and memory per GPU.

A session that starts on GPUs another process is using measures that process too (vLLM's own perf-eval A/B
experiments require idle GPUs before each session). This module records (``arms[].sessions[].gpus_before``);
:mod:`harness.judge.validity` decides what counts as busy. :func:`parse_query` is pure; :func:`before_session` runs
``nvidia-smi`` and returns a note instead where it is absent (CPU hosts) or fails.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any, Mapping

QUERY = ("--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits")
def parse_query(text: str) -> list[dict[str, float]]:
    """``nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits`` output →
    ``[{"index", "utilization_pct", "memory_used_mib"}]`` (a ``[N/A]`` field is NaN).

    Raises:
        ValueError: a line without three fields or with a non-numeric index.
    """
    rows = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[0].isdigit():
            raise ValueError(f"nvidia-smi: unexpected line {line!r}")
        rows.append({"index": int(fields[0]), "utilization_pct": _number(fields[1]),
                     "memory_used_mib": _number(fields[2])})
    return rows


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def visible(env: Mapping[str, str]) -> set[int] | None:
    """The GPU indices ``CUDA_VISIBLE_DEVICES`` names in ``env`` (None: all, or not plain indices)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None or not value.strip():
        return None
    parts = [p.strip() for p in value.split(",")]
    return {int(p) for p in parts} if all(p.isdigit() for p in parts) else None


def before_session(env: Mapping[str, str], timeout_s: float = 20.0) -> dict[str, Any]:
    """``{"gpus": [...] | None, "note": str | None}`` for the GPUs an arm's server will see (``env``'s
    ``CUDA_VISIBLE_DEVICES``, else all)."""
    if shutil.which("nvidia-smi") is None:
        return {"gpus": None, "note": "nvidia-smi not found: GPU idleness not checked"}
    try:
        done = subprocess.run(["nvidia-smi", *QUERY], capture_output=True, text=True, timeout=timeout_s, check=True)
        gpus = parse_query(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return {"gpus": None, "note": f"nvidia-smi failed ({type(error).__name__}): GPU idleness not checked"}
    wanted = visible(env)
    return {"gpus": [g for g in gpus if wanted is None or g["index"] in wanted], "note": None}
