"""``manifest.json`` ``budget``: the projection after session block 1 of whether ``gate.min_sessions`` blocks fit
``--budget`` (``workload.budget_s``), and what the run changed so they do (harness.run.stopping.project_budget).
Re-exported by :mod:`harness.rundir.schema`; the judge (:func:`harness.judge.cells.build_cells`) and the renderers
read the same record."""

from __future__ import annotations

from typing import Literal

from harness.rundir.levels import Level
from harness.rundir.record import Record

__all__ = ["BudgetRecord"]


def _label(level: str, several_regimes: bool) -> str:
    parsed = Level.parse(level)
    return parsed.label(regime=several_regimes) if parsed is not None else level


class BudgetRecord(Record):
    """The projection after block 1 (seconds of wall time, ``time.monotonic()``).

    ``elapsed_s``: the run so far, one-off work (pilot, client import, datasets, parity, GSM8K) included;
    ``block_s``: what each later block is taken to cost, block 1's per-block work only — ``level_s`` summed +
    ``start_s`` + ``look_s`` (what it leaves out: :func:`harness.run.stopping.project_budget`); ``level_s``: block
    1's wall time per level (its id, ``str(Level)``): its steps' walls (``manifest.json`` levels ``wall_s``), both
    arms' levels summed, or under ``serve.duet`` the longer of a step's two overlapping levels; ``look_s``: the
    sequential look at a block's end (0 in records before it was counted); ``needed_s``:
    ``elapsed_s + (m − 1) × block_s``, ``m`` the smaller of ``min_sessions`` and ``planned``;
    ``dropped``: the levels (ids) not measured from block 2 on, longest first by ``level_s`` until the projection
    fits (at least one level kept); ``projected_s``: the projection after the drops (for ``cannot``: with every level
    but the shortest dropped); ``blocks``: the blocks projected to fit the budget at that cost per block, of the
    ``planned`` ones (``workload.repeats``) — a projection, not the count run: each later block starts if the block
    before it, timed, would fit again (:class:`harness.run.stopping.BlockBudget`), so more may run; ``start_s``: the
    server starts of block 1 that every block repeats (fresh sessions per block; 0 where servers stay up), which no
    change of levels shortens. ``outcome``: ``fits``
    (nothing changed), ``adapted`` (levels dropped: the verdict covers the kept ones) or ``cannot`` (nothing makes it
    fit: the run stopped after block 1)."""

    budget_s: float
    elapsed_s: float
    block_s: float
    min_sessions: int
    level_s: dict[str, float]
    needed_s: float
    projected_s: float
    dropped: tuple[str, ...] = ()
    blocks: int
    planned: int
    start_s: float
    look_s: float = 0.0
    outcome: Literal["fits", "adapted", "cannot"]

    def kept(self) -> tuple[str, ...]:
        """The levels (ids) measured in every block, in level order."""
        return tuple(sorted((c for c in self.level_s if c not in self.dropped), key=lambda c: Level.parse(c) or c))

    def _levels(self, levels) -> str:
        several = len({parsed.regime for parsed in map(Level.parse, self.level_s) if parsed is not None}) > 1
        return ", ".join(_label(level, several) for level in levels)

    def describe(self) -> str:
        """One line for the terminal, the report and the summary: the projection and what changed, or why not."""
        head = (f"budget: a block's work is {self.block_s:.0f} s (block 1's levels and server starts); "
                f"min_sessions {self.min_sessions} needs "
                f"{self.needed_s:.0f} s {'≤' if self.outcome == 'fits' else '>'} budget {self.budget_s:.0f} s")
        if self.outcome == "fits":
            return head + (f"; nothing changed ({self.blocks} of {self.planned} blocks projected at block 1's cost; "
                           "each later block still starts if the one before it would fit again)")
        if self.outcome == "adapted":
            return (head + f"; changed: {self._levels(self.dropped)} dropped from blocks 2 on (the longest levels "
                    f"of block 1 first), {self.projected_s:.0f} s projected, {self.blocks} of {self.planned} blocks; "
                    f"the verdict covers {self._levels(self.kept())}")
        if not self.level_s:   # block 1 measured no level (its servers never came up)
            return (head + f"; cannot: block 1 measured no level, {self.start_s:.0f} s of server starts; stopped after "
                    f"block 1 — raise --budget to ≥ {self.needed_s:.0f} s or lower gate.min_sessions")
        shortest = min(self.level_s, key=lambda c: (self.level_s[c], Level.parse(c) or c))
        return (head + f"; cannot: even with {self._levels([shortest])} alone a block takes "
                f"{self.block_s - sum(s for c, s in self.level_s.items() if c != shortest):.0f} s, "
                f"{self.start_s:.0f} s of it server starts ({self.projected_s:.0f} s projected); stopped after block 1 "
                f"— raise --budget to ≥ {self.needed_s:.0f} s or lower gate.min_sessions")
