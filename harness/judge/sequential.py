"""Stop when decided: a group-sequential design over server sessions, with α spent look by look.

A sequential run looks after every block (one fresh server session per arm, :mod:`harness.run.start`) from the
``min_sessions``-th on, up to ``max_sessions`` sessions per arm, and stops at the first PASS or FAIL. Each look ``m``
tests the session-replicated cells (throughput, latency, MTP — every metric whose unit is the session) at its own
level ``α_m``, the increment of an α-spending function (Lan & DeMets 1983, Biometrika 70:659; Jennison & Turnbull
2000, *Group Sequential Methods*, §7.2) at information fraction ``t_m = m / max_sessions``:

    α_m = α(t_m) − α(t_{m−1}),   α(t_{min_sessions − 1}) = 0,   α(1) = α.

The looks' errors are combined by the union bound: P(a false FAIL at any look) ≤ Σ_m α_m = α, and the same for a
false PASS (each look's PASS is an intersection–union test at α_m, Berger 1982). Unlike the usual boundaries computed
from the joint normal distribution of the looks' statistics, the union bound needs no independent-increments
assumption, so it holds for the t statistics on 3–10 degrees of freedom and the two-stage bootstraps the cells use —
at the price of being conservative (the real error is below α). The simulation on recorded sessions
(:mod:`harness.judge.session_simulation`) measures it.

Spending functions (Lan & DeMets 1983, eqs. for the Pocock- and O'Brien–Fleming-type boundaries):

- ``pocock``:           α(t) = α · ln(1 + (e − 1) t)  — spends early: half of α by t ≈ 0.38;
- ``obrien-fleming``:   α(t) = 2 − 2 Φ(z_{1−α/2} / √t) — spends late: almost nothing before t ≈ 0.5.

The default is ``pocock``: the looks where a large regression is visible come first, and a run that stops early is
the point of the design. The fixed design is the one-look case ``min_sessions = max_sessions``: α_m = α.

GSM8K accuracy and output parity run once per arm, so they are tested once, at the full α (their share of it:
:func:`harness.judge.verdict.decide`).

Pure: numbers in, numbers out; no files, processes or sockets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import pandas as pd
from scipy.stats import norm

from harness.judge.policy import GatePolicy

__all__ = ["Spending", "SPENDING", "SequentialDesign", "Look", "design_of", "look_of", "paired_sessions"]

Spending = Literal["pocock", "obrien-fleming"]
SPENDING: tuple[str, ...] = ("pocock", "obrien-fleming")


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
        """α of the look at ``sessions`` sessions per arm: the spending function's increment there (0 when
        ``sessions`` is not a look: below ``min_sessions`` or past ``max_sessions``)."""
        if sessions < self.min_sessions or sessions > self.max_sessions:
            return 0.0
        return self.cumulative(sessions) - self.cumulative(sessions - 1)

    def describe(self) -> str:
        """One line for the report: the looks and α per look."""
        if self.fixed:
            return f"fixed design: one look at {self.max_sessions} sessions per arm, α = {self.alpha:g}"
        per_look = ", ".join(f"{m}: {self.look_alpha(m):.4f}" for m in self.looks)
        return (f"group-sequential: a look after each block from {self.min_sessions} to {self.max_sessions} sessions "
                f"per arm, stop at PASS or FAIL; α = {self.alpha:g} spent {self.spending}-type (Lan & DeMets 1983), "
                f"looks combined by the union bound; α per look — {per_look}")


@dataclass(frozen=True)
class Look:
    """Where a run's data stands in its design: ``sessions`` per arm, tested at ``alpha``."""

    design: SequentialDesign
    sessions: int

    @property
    def alpha(self) -> float:
        return self.design.look_alpha(self.sessions)

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
            where = (f"look at {self.sessions} session(s) per arm: session-replicated cells tested at "
                     f"α = {self.alpha:.4f} ({self.design.cumulative(self.sessions):.4f} of {self.design.alpha:g} "
                     "spent so far)")
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
