"""The advice of an undecided verdict: how many server sessions per arm would let an unchanged candidate PASS — per
cell (:func:`sessions_to_pass`) and for every session-replicated primary cell at once (:func:`joint_sessions_needed`,
:func:`joint_advice`). Prospective power calculations on each cell's spread at its upper bound
(:mod:`harness.judge.planning`), never on the observed effect."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from harness.judge import planning

if TYPE_CHECKING:
    from harness.judge.cell_result import CellResult

__all__ = ["joint_advice", "joint_sessions_needed", "sessions_to_pass", "tested"]


def sessions_to_pass(se: float, df: float, units: int, limit: float, alpha: float) -> int | None:
    """Sessions per arm a fresh run needs for 90 % power to PASS this cell for a candidate equal to the baseline: the
    cell's per-session spread ``se·√units`` at its :data:`~harness.judge.planning.ADVICE_CONFIDENCE` upper bound on
    ``df`` (a prospective power calculation, :mod:`harness.judge.planning`; never the observed effect, which would
    make the advice as noisy as the run)."""
    if df < 1:
        return None
    spread = planning.spread_upper_bound(se * math.sqrt(units), int(df), planning.ADVICE_CONFIDENCE)
    return planning.sessions_for_power(spread, abs(limit), alpha, 0.90, max_sessions=planning.MAX_ADVISED_SESSIONS)


def tested(cells: Sequence[CellResult]) -> list[CellResult]:
    """The session-replicated primary cells with a measured spread and a PASS level (those a power plan covers)."""
    return [c for c in cells if c.spread is not None and c.pass_level is not None]


def _power_plan(cells: Sequence[CellResult]) -> list[tuple[float, float, float]]:
    """(per-session spread, |log margin|, PASS level) per cell: the input of :mod:`harness.judge.planning`."""
    return [(c.spread, abs(math.log1p(c.margin / 100.0)), c.pass_level) for c in cells]


def joint_sessions_needed(cells: Sequence[CellResult]) -> int | None:
    """Sessions per arm for 90 % probability that every session-replicated primary cell PASSes an unchanged
    candidate (:func:`harness.judge.planning.sessions_for_joint_power`); None without such cells or beyond the cap.
    The one figure the verdict's reason and the report's next step both quote."""
    cells = tested(cells)
    return planning.sessions_for_joint_power(_power_plan(cells)) if cells else None


def joint_advice(cells: Sequence[CellResult], need: int | None) -> str:
    """The run's advice: P(every primary session cell PASSes an unchanged candidate) now and the sessions per arm
    for 90 % of it (``need``: :func:`joint_sessions_needed` of ``cells``, cap stated); "" without such cells."""
    cells = tested(cells)
    if not cells:
        return ""
    now = min(c.repeats for c in cells)
    cap = planning.MAX_ADVISED_SESSIONS
    head = (f"P(all {len(cells)} session-replicated primary cells PASS an unchanged candidate) ≈ "
            f"{100 * planning.joint_pass_probability(_power_plan(cells), now):.0f} % at {now} sessions per arm "
            f"(spreads at their {100 * planning.ADVICE_CONFIDENCE:g} % upper bounds)")
    if need is None:
        return f"{head}; more than the {cap}-session cap would be needed for 90 %"
    return f"{head}; ≈{need} sessions per arm for 90 % (cap {cap})"
