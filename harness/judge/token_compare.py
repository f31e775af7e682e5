"""Comparing two teacher-forced scorings of the same token sequences (:mod:`harness.run.scoring` rows) and two
greedy collections (:mod:`harness.run.parity` rows), position by position. Pure.

Per position (definitions and the KL bound's source: :mod:`harness.run.scoring`): ``abs_dlogp`` (nats), ``kl_lb``
(a lower bound of ``KL(p_A ‖ p_B)``: the top-k lists coarse-grained onto their common ids plus one rest bucket; the
log-sum inequality, Cover & Thomas 2006, Thm 2.7.1), ``flip`` (the arg-max differs).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

REST_ROUNDING = 1e-9
"""Probability mass left outside a top-k that is float64 rounding of ``1 − Σ exp(logprob)``, not a real remainder."""


def _coarse_kl(top_a: Sequence[Sequence[float]], top_b: Sequence[Sequence[float]]) -> float:
    """KL of the two top-k lists coarse-grained onto their common ids + one rest bucket (nats, ≥ 0)."""
    a, b = {int(t): math.exp(lp) for t, lp in top_a}, {int(t): math.exp(lp) for t, lp in top_b}
    common = a.keys() & b.keys()
    pa, pb = [a[t] for t in common], [b[t] for t in common]
    rest = [1.0 - sum(pa), 1.0 - sum(pb)]      # below REST_ROUNDING: the top-k held all the mass
    pa.append(rest[0] if rest[0] > REST_ROUNDING else 0.0)
    pb.append(rest[1] if rest[1] > REST_ROUNDING else 0.0)
    total = sum(p * math.log(p / q) if q > 0 else math.inf for p, q in zip(pa, pb) if p > 0)
    return max(0.0, total)


def compare_positions(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, list]:
    """Two scorings of one sequence → per continuation position ``abs_dlogp``, ``kl_lb`` and ``flip``
    (see the module docstring); positions where either forced logprob is missing are left out of ``abs_dlogp``."""
    dlogp, kl, flip = [], [], []
    for lp_a, lp_b, top_a, top_b in zip(a["logprobs"], b["logprobs"], a["top"], b["top"]):
        dlogp.append(abs(lp_a - lp_b) if math.isfinite(lp_a) and math.isfinite(lp_b) else float("nan"))
        kl.append(_coarse_kl(top_a, top_b) if top_a and top_b else float("nan"))
        flip.append(bool(top_a and top_b and int(top_a[0][0]) != int(top_b[0][0])))
    return {"abs_dlogp": dlogp, "kl_lb": kl, "flip": flip}


def summary(values: Sequence[float], flips: Sequence[bool]) -> dict[str, float | None]:
    """Median, p99 and max of the finite ``values`` and the share of ``flips``."""
    finite = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if finite.size == 0:
        return {"median": None, "p99": None, "max": None, "flip_share": None, "positions": 0}
    return {"median": float(np.median(finite)), "p99": float(np.quantile(finite, 0.99)), "max": float(finite.max()),
            "flip_share": float(np.mean(flips)) if len(flips) else None, "positions": int(finite.size)}


def compare_scores(a_rows: Sequence[Mapping[str, Any]], b_rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Two scorings of the same sequences → ``{"prompts": [{"index", "abs_dlogp", "kl_lb", "flip", "summary"}],
    "summary": ...}`` (per prompt and over every position of the run).

    Raises:
        ValueError: the two cover different sequences or lengths.
    """
    by_index = {int(row["index"]): row for row in b_rows}
    if sorted(by_index) != sorted(int(row["index"]) for row in a_rows):
        raise ValueError("the two scorings cover different sequences")
    prompts = []
    for row in sorted(a_rows, key=lambda r: int(r["index"])):
        other = by_index[int(row["index"])]
        if len(other["logprobs"]) != len(row["logprobs"]):
            raise ValueError(f"sequence {row['index']}: the scorings have different lengths")
        positions = compare_positions(row, other)
        prompts.append({"index": int(row["index"]), **positions,
                        "summary": summary(positions["abs_dlogp"], positions["flip"])})
    every = [v for p in prompts for v in p["abs_dlogp"]]
    return {"prompts": prompts, "summary": summary(every, [f for p in prompts for f in p["flip"]])}


def first_divergence(a: Sequence[int], b: Sequence[int]) -> float:
    """The first index where two token-id sequences differ (the shorter one's length when one is a prefix of the
    other), ∞ when identical."""
    length = min(len(a), len(b))
    first = next((i for i in range(length) if a[i] != b[i]), None)
    if first is not None:
        return float(first)
    return math.inf if len(a) == len(b) else float(length)
