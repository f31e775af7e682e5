"""Measures derived from the run directory's rows, shared by judging and rendering (pure: pandas/numpy in, numbers out).
"""

from __future__ import annotations

import numpy as np


def achieved_concurrency(frame) -> float | None:
    """Time-averaged number of requests in flight over the level (Little's law): Σ E2EL / (last end − first start),
    from the per-request timeline (``start_s``, ``e2el_ms``). A client that keeps ``c`` requests in flight scores
    about ``c``; ramp-up and drain lower it a little. (Counting requests in flight at each request's start is biased
    low under ``--ignore-eos``: equal-length requests finish together and their replacements start one by one.)"""
    start = frame["start_s"].to_numpy(dtype=float)
    latency = frame["e2el_ms"].to_numpy(dtype=float) / 1000.0
    ok = np.isfinite(start) & np.isfinite(latency)
    start, latency = start[ok], latency[ok]
    if start.size == 0:
        return None
    span = float((start + latency).max() - start.min())
    return float(latency.sum() / span) if span > 0 else None


def succeeded(frame):
    """The rows of a ``requests.csv`` frame whose ``error`` cell is empty (successful requests)."""
    error = frame["error"]
    return frame[error.isna() | (error.astype(str).str.strip() == "")]
