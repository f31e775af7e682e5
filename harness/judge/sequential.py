"""Stop when decided: a group-sequential design over server sessions, with α spent look by look.

A sequential run looks after every block (one fresh server session per arm, :mod:`harness.run.start`) from the
``min_sessions``-th on, up to ``max_sessions`` sessions per arm, and stops at the first PASS or FAIL. Each look ``m``
tests the session-replicated cells (throughput, latency, MTP — every metric whose unit is the session) at its own
level ``α_m``, the increment of an α-spending function (Lan & DeMets 1983, Biometrika 70:659; Jennison & Turnbull
2000, *Group Sequential Methods*, §7.2) at information fraction ``t_m = m / max_sessions``:

    α_m = α(t_m) − α(t_{m−1}),   α(t_{min_sessions − 1}) = 0,   α(1) = α.

The spending function says how much error each look may add; the look's *nominal* one-sided level (the p-value a
cell must reach there) comes from the joint distribution of the looks' statistics (:func:`boundaries`): the looks
of one cell test nested data (look ``m`` holds look ``m − 1``'s sessions plus one), so their paired-t statistics are
strongly correlated and the union bound (testing look ``m`` at its increment ``α_m``) wastes most of α — for one cell
at 4–8 sessions its real overall error is 3.4 % against 5 %, and an equal candidate almost never PASSes all cells of
a run (issue #24). :func:`boundaries` simulates, once per design and α (seeded, cached), the nested one-sample
t statistics ``t_m = √m · mean(d_1..d_m) / sd(d_1..d_m)`` of ``N`` iid normal session differences (the paired t-test
the cells carry on ``m − 1`` df is scale-free, so normal ``d`` give its exact null law up to Monte Carlo error), and
picks each look's nominal level so that the share of simulated runs rejecting *first* at look ``m`` is ``α_m``
(Lan & DeMets 1983's recursion, solved on the simulated joint law instead of the normal integrals of Armitage,
McPherson & Rowe 1969; Jennison & Turnbull 2000 §7.2 and §4.2 for t statistics). The cumulative false rejection of
one hypothesis over all looks is then ``α`` (to ±3 % of it at ``N`` = 200 000), for PASS (each look's PASS is an
intersection–union test, Berger 1982) and for FAIL (:func:`harness.judge.verdict.decide` calls it at each Holm step's
level: a group-sequential Holm procedure, Maurer & Bretz 2013, Stat. Biopharm. Res. 5:311).

Spending functions (Lan & DeMets 1983, eqs. for the Pocock- and O'Brien–Fleming-type boundaries):

- ``pocock``:           α(t) = α · ln(1 + (e − 1) t)  — spends early: half of α by t ≈ 0.38;
- ``obrien-fleming``:   α(t) = 2 − 2 Φ(z_{1−α/2} / √t) — spends late: almost nothing before t ≈ 0.5.

The default is ``pocock``: the looks where a large regression is visible come first, and a run that stops early is
the point of the design. The fixed design is the one-look case ``min_sessions = max_sessions``: its one look is
tested at α. A look at fewer than 2 sessions has no t statistic and spends nothing.

GSM8K accuracy and output parity run once per arm, so they are tested once, at the full α (their share of it:
:func:`harness.judge.verdict.decide`).

Pure: numbers in, numbers out; no files, processes or sockets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import pandas as pd
from scipy.stats import norm

from harness.judge.policy import GatePolicy

__all__ = ["Spending", "SPENDING", "SequentialDesign", "Look", "boundaries", "design_of", "look_of", "paired_sessions",
           "NULL_SIMULATIONS"]

Spending = Literal["pocock", "obrien-fleming"]
SPENDING: tuple[str, ...] = ("pocock", "obrien-fleming")
NULL_SIMULATIONS = 200_000
"""Simulated runs behind :func:`boundaries`: a look spending ``α_m`` ≥ 0.001 rests on ≥ 200 first rejections, so its
spent error is within ≈ ±14 % of ``α_m`` and the cumulative ``α`` = 0.05 within ≈ ±2 % (binomial se, 95 %)."""
BOUNDARY_SEED = 20_241_998
"""Seed of the simulated null runs: the same design gives the same boundaries on every machine."""


def _spent(kind: Spending, alpha: float, t: float) -> float:
    """α(t) of the Lan–DeMets spending function ``kind`` at information fraction ``t`` ∈ [0, 1]."""
    if t <= 0.0:
        return 0.0
    t = min(t, 1.0)
    if kind == "pocock":
        return alpha * math.log(1.0 + (math.e - 1.0) * t)
    if kind == "obrien-fleming":
        return float(2.0 - 2.0 * norm.cdf(norm.ppf(1.0 - alpha / 2.0) / math.sqrt(t)))
    raise ValueError(f"spending must be one of {SPENDING}, not {kind!r}")


@lru_cache(maxsize=32)
def _null_pvalues(min_sessions: int, max_sessions: int) -> np.ndarray:
    """One-sided p-values ``(N, looks)`` of the nested paired t-tests at looks ``min_sessions … max_sessions`` of
    :data:`NULL_SIMULATIONS` runs of iid standard normal session differences (NaN at looks below 2 sessions)."""
    from scipy.special import stdtr

    rng = np.random.default_rng([BOUNDARY_SEED, min_sessions, max_sessions])
    d = rng.standard_normal((NULL_SIMULATIONS, max_sessions))
    n = np.arange(1, max_sessions + 1, dtype=float)
    mean = np.cumsum(d, axis=1) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        var = (np.cumsum(d * d, axis=1) - n * mean * mean) / (n - 1)
        t = mean / np.sqrt(var / n)
        p = 1.0 - stdtr(n - 1, t)
    p[:, n < 2] = np.nan
    return p[:, min_sessions - 1:]


@lru_cache(maxsize=1024)
def boundaries(alpha: float, min_sessions: int, max_sessions: int, spending: Spending = "pocock"
               ) -> tuple[float, ...]:
    """Nominal one-sided levels, one per look ``min_sessions … max_sessions``, whose joint false-rejection rate over
    the looks is ``alpha`` spent by ``spending`` (module docstring). ``alpha ≤ 0`` gives zeros. The fixed design's one
    look is ``(alpha,)`` exactly."""
    looks = max_sessions - min_sessions + 1
    if alpha <= 0:
        return (0.0,) * looks
    if looks == 1:
        return (alpha,) if max_sessions >= 2 else (0.0,)
    p = _null_pvalues(min_sessions, max_sessions)
    alive = np.ones(p.shape[0], dtype=bool)
    out, spent_before = [], 0.0
    for k, m in enumerate(range(min_sessions, max_sessions + 1)):
        spent = alpha if m == max_sessions else _spent(spending, alpha, m / max_sessions)
        target = int(round((spent - spent_before) * p.shape[0]))
        column = np.where(alive, p[:, k], np.inf)
        if m < 2 or target <= 0:
            out.append(0.0)
            continue
        level = float(np.partition(column, target - 1)[target - 1])
        out.append(level if math.isfinite(level) else 0.0)
        alive &= ~(column <= level)
        spent_before = spent
    return tuple(out)


@dataclass(frozen=True)
class SequentialDesign:
    """Looks at ``min_sessions … max_sessions`` sessions per arm, α spent by ``spending``.

    Raises ValueError when ``min_sessions > max_sessions``, ``min_sessions < 1`` or ``alpha`` is not in (0, 0.5).
    """

    alpha: float
    min_sessions: int
    max_sessions: int
    spending: Spending = "pocock"

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 0.5:
            raise ValueError(f"alpha = {self.alpha}: must be in (0, 0.5)")
        if self.min_sessions < 1 or self.max_sessions < self.min_sessions:
            raise ValueError(f"looks from {self.min_sessions} to {self.max_sessions} sessions: need "
                             "1 ≤ min_sessions ≤ max_sessions (gate.max_sessions, or workload.repeats)")
        if self.spending not in SPENDING:
            raise ValueError(f"spending must be one of {SPENDING}, not {self.spending!r}")

    @property
    def fixed(self) -> bool:
        """One look: the fixed design."""
        return self.min_sessions == self.max_sessions

    @property
    def looks(self) -> tuple[int, ...]:
        """Sessions per arm at each look."""
        return tuple(range(self.min_sessions, self.max_sessions + 1))

    def cumulative(self, sessions: int) -> float:
        """α spent by the look at ``sessions`` sessions per arm (0 before the first look; α at the last)."""
        if sessions < self.min_sessions:
            return 0.0
        if self.fixed or sessions >= self.max_sessions:
            return self.alpha
        return _spent(self.spending, self.alpha, sessions / self.max_sessions)

    def look_alpha(self, sessions: int) -> float:
        """The spending function's increment at the look at ``sessions`` sessions per arm: the error that look may add
        (0 when ``sessions`` is not a look: below ``min_sessions`` or past ``max_sessions``)."""
        if sessions < self.min_sessions or sessions > self.max_sessions:
            return 0.0
        return self.cumulative(sessions) - self.cumulative(sessions - 1)

    def nominal(self, sessions: int, alpha: float | None = None) -> float:
        """The nominal one-sided level a cell's p-value is compared with at the look at ``sessions`` sessions per arm,
        for a hypothesis whose error over all looks is ``alpha`` (None: the design's): :func:`boundaries`; 0 when
        ``sessions`` is not a look."""
        if sessions < self.min_sessions or sessions > self.max_sessions:
            return 0.0
        levels = boundaries(self.alpha if alpha is None else alpha, self.min_sessions, self.max_sessions,
                            self.spending)
        return levels[sessions - self.min_sessions]

    def describe(self) -> str:
        """One line for the report: the looks and α per look."""
        if self.fixed:
            return f"fixed design: one look at {self.max_sessions} sessions per arm, α = {self.alpha:g}"
        per_look = ", ".join(f"{m}: {self.nominal(m):.4f}" for m in self.looks)
        return (f"group-sequential: a look after each block from {self.min_sessions} to {self.max_sessions} sessions "
                f"per arm, stop at PASS or FAIL; α = {self.alpha:g} spent {self.spending}-type (Lan & DeMets 1983), "
                f"nominal levels from the simulated joint law of the looks' paired t statistics — {per_look}")


@dataclass(frozen=True)
class Look:
    """Where a run's data stands in its design: ``sessions`` per arm, tested at ``alpha``."""

    design: SequentialDesign
    sessions: int

    @property
    def alpha(self) -> float:
        """The nominal level of this look for the design's α (:meth:`SequentialDesign.nominal`)."""
        return self.design.nominal(self.sessions)

    def nominal(self, alpha: float) -> float:
        """The nominal level of this look for a hypothesis with overall error ``alpha`` (a Holm step's share)."""
        return self.design.nominal(self.sessions, alpha)

    @property
    def last(self) -> bool:
        """No look follows: the run stops here whatever the verdict."""
        return self.sessions >= self.design.max_sessions

    def describe(self) -> str:
        if self.sessions < self.design.min_sessions:
            where = f"{self.sessions} session(s) per arm: before the first look ({self.design.min_sessions})"
        elif self.sessions > self.design.max_sessions:
            where = (f"{self.sessions} session(s) per arm: past the design's last look ({self.design.max_sessions}), "
                     "so no α is left and no session-replicated cell can PASS or FAIL; judge the run with a "
                     "fixed-design policy (max_sessions unset, or ≥ the sessions run)")
        else:
            where = (f"look at {self.sessions} session(s) per arm: session-replicated cells' PASS tested at the "
                     f"nominal level {self.alpha:.4f} ({self.design.cumulative(self.sessions):.4f} of "
                     f"{self.design.alpha:g} spent so far)")
        return f"{where}; {self.design.describe()}"


def design_of(policy: GatePolicy) -> SequentialDesign | None:
    """The policy's sequential design, or None for the fixed design (``max_sessions`` unset)."""
    if policy.max_sessions is None:
        return None
    return SequentialDesign(policy.alpha, policy.min_sessions, policy.max_sessions, policy.spending)


def paired_sessions(levels: pd.DataFrame) -> int:
    """Server sessions per arm in ``levels.csv`` rows: the smaller arm's count of distinct sessions (0 when the
    rows carry no session, as version-1 run directories)."""
    if levels is None or levels.empty or "session" not in levels.columns:
        return 0
    counts = levels.dropna(subset=["session"]).groupby("arm")["session"].nunique()
    return int(counts.min()) if len(counts) == 2 else 0


def look_of(policy: GatePolicy, levels: pd.DataFrame) -> Look | None:
    """The look a run's ``levels.csv`` rows are at under ``policy``'s sequential design; None for the fixed design."""
    design = design_of(policy)
    return None if design is None else Look(design, paired_sessions(levels))
