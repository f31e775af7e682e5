"""What an A/A run says about the machine: the paired spread per level and the smallest regression the design can
detect there (``dsa-bench calibrate``).

Unit: the server session pair. Per level ``c`` and session index ``s`` present in both arms,
``d_s = mean_r log x(candidate, s, r) − mean_r log x(baseline, s, r)`` (``x`` the metric of round ``r``, rounds of a
session averaged as :mod:`harness.judge.cells` does; ``median_r`` of the unflagged rounds under the robust estimators of
:mod:`harness.judge.stalls`); the spread is ``sd(d)`` on ``n − 1`` degrees of freedom, with a
one-sided 95 % upper bound ``sd · sqrt((n − 1) / χ²_{0.05, n−1})``.

Smallest detectable loss (paired one-sample t, normal-theory power; Julious 2004, *Stat Med* 23:1921, eq. for
non-inferiority): a true log-ratio loss ``δ`` FAILs a margin ``m`` (log scale, ``m = log(1 + margin/100) < 0`` for a
throughput) with probability ≈ ``power`` when ``δ − |m| ≥ (t_{1−a, n−1} + t_{power, n−1}) · sd / √n``, ``a`` the
one-sided level the cell is tested at (α/K for K primary metrics, :func:`harness.judge.verdict.decide`). Reported as
a percent loss, ``100 (1 − e^{−δ})``, at the measured spread and at its upper bound.

Pure: frames in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import chi2, t as student_t

from harness.judge.stalls import excludes, find_stalls
from harness.rundir.schema import Level

__all__ = ["Spread", "paired_spread", "detectable_loss"]


@dataclass(frozen=True)
class Spread:
    """Paired session spread of one metric at one level: ``sd`` of the per-session log ratio over ``pairs`` pairs
    (``upper``: its one-sided 95 % upper bound; NaN below 2 pairs)."""

    level: Level
    pairs: int
    sd: float
    upper: float


def kept_rounds(rows: pd.DataFrame, estimator: str, max_steal_fraction: float) -> pd.DataFrame:
    """``rows`` less the rounds ``estimator`` leaves out as stalled (:func:`~harness.judge.stalls.find_stalls`; none
    under ``"mean"``)."""
    if not excludes(estimator):
        return rows
    flagged = {s.key for s in find_stalls(rows, max_steal_fraction=max_steal_fraction, estimator=estimator)}
    keys = zip(rows["arm"].astype(str), map(Level.parse, rows["level"]), rows["round"].astype(int))
    return rows[[key not in flagged for key in keys]]


def paired_spread(levels: pd.DataFrame, column: str = "output_throughput", *,
                  baseline: str = "baseline", candidate: str = "candidate", estimator: str = "mean",
                  max_steal_fraction: float = 0.10) -> list[Spread]:
    """:class:`Spread` of ``column`` at every level of a run's ``levels.csv`` rows (needs ``session``).

    ``estimator`` (the ``[gate] estimator`` rule, :mod:`harness.judge.stalls`): ``"mean"`` averages a session's log
    round figures; ``"exclude-stalls"`` first drops the rounds :func:`~harness.judge.stalls.find_stalls` flags (steal
    above ``max_steal_fraction``, or a modified z-score beyond ±3.5); ``"median"`` drops them and takes the median."""
    rows = levels.dropna(subset=["session", column])
    rows = kept_rounds(rows[rows[column] > 0], estimator, max_steal_fraction)
    location = "median" if estimator == "median" else "mean"
    out = []
    for text, frame in rows.groupby("level"):
        level = Level.parse(text)
        logs = frame.assign(log=np.log(frame[column].astype(float)))
        means = logs.groupby(["arm", "session"])["log"].agg(location)
        base, cand = means.get(baseline), means.get(candidate)
        common = sorted(set(base.index) & set(cand.index)) if base is not None and cand is not None else []
        d = np.array([cand[s] - base[s] for s in common])
        if d.size < 2:
            out.append(Spread(level, int(d.size), math.nan, math.nan))
            continue
        sd = float(d.std(ddof=1))
        upper = sd * math.sqrt((d.size - 1) / chi2.ppf(0.05, d.size - 1))
        out.append(Spread(level, int(d.size), sd, float(upper)))
    return sorted(out, key=lambda spread: spread.level)


def detectable_loss(sd: float, pairs: int, margin_pct: float, level: float, power: float = 0.8) -> float:
    """Smallest true loss (percent of baseline) FAILed with probability ``power`` by a paired t test at one-sided
    ``level`` against ``margin_pct`` (e.g. −3 for a throughput), with ``pairs`` session pairs of spread ``sd``.

    Raises ValueError below 2 pairs or for a non-finite ``sd``."""
    if pairs < 2 or not math.isfinite(sd):
        raise ValueError(f"a detectable loss needs ≥ 2 session pairs and a finite spread (got {pairs}, {sd})")
    df = pairs - 1
    delta = abs(math.log1p(margin_pct / 100.0)) + (student_t.ppf(1 - level, df) + student_t.ppf(power, df)) * sd \
        / math.sqrt(pairs)
    return 100.0 * (1.0 - math.exp(-delta))
