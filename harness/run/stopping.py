"""When a run stops before its last planned session block, and where GSM8K runs so an early stop still has it.

Two rules, checked by the runner at every block boundary: a sequential look decided (:func:`harness.gate.look`,
the gate's own verdict at the look's α) or the next block would end past ``--budget`` (:class:`BlockBudget`). After
block 1, :func:`project_budget` decides early whether ``gate.min_sessions`` blocks fit the budget at all (issue #27
item 4): if not, later blocks leave out levels, or the run stops there and says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from harness import gate
from harness.judge.policy import Status
from harness.run.plan import Plan
from harness.rundir.schema import BudgetRecord, Level, LevelKey

__all__ = ["BlockBudget", "gsm8k_points", "look_stop", "project_budget", "step_seconds"]


def gsm8k_points(plan: Plan, order: list[tuple[str, int, int]]) -> dict[str, int]:
    """Index in ``order`` after which each arm's GSM8K runs: its last level of session block 0 where every block is a
    fresh session (:meth:`~harness.run.scenario.Scenario.fresh_session_per_block`: so a run that stops early still
    has it, on a session of its own), its last level where concurrent servers keep one session for the run."""
    first_block = plan.scenario.fresh_session_per_block()
    return {name: index for index, (name, _, round_) in enumerate(order)
            if not first_block or plan.block_of(round_) == 0}


def look_stop(run_dir: Path, blocks_done: int) -> str | None:
    """The stop reason when the sequential look after ``blocks_done`` blocks decided, else None."""
    look = gate.look(run_dir)
    if look is not None and look.status in (Status.PASS, Status.FAIL):
        return f"sequential stop: {look.status} at the look after block {blocks_done} ({look.reason})"
    return None


@dataclass
class BlockBudget:
    """``--budget``: no block starts that would end past ``budget_s`` seconds of the run, a block taken to last as
    long as the previous one — less its server starts when ``servers_stay_up`` (concurrent servers that keep one
    session for the run start none again; fresh sessions per block start theirs every block) and less the one-off
    work it held (parity, GSM8K, the pilot: once per arm or run, not per block).

    Times are ``time.monotonic()`` seconds; ``server_start_s`` and ``one_off_s`` are the run's cumulative server
    start-up time and one-off time."""

    budget_s: float | None
    started: float
    servers_stay_up: bool
    block_started: float = 0.0
    block_start_s: float = 0.0
    block_one_off_s: float = 0.0

    def __post_init__(self) -> None:
        self.block_started = self.started

    def close(self, now_s: float, server_start_s: float, one_off_s: float = 0.0) -> float:
        """Close the block that ends at ``now_s``; what the next block is taken to cost (seconds)."""
        last_block = now_s - self.block_started
        if self.servers_stay_up:
            last_block -= server_start_s - self.block_start_s
        last_block -= one_off_s - self.block_one_off_s
        self.block_started, self.block_start_s, self.block_one_off_s = now_s, server_start_s, one_off_s
        return last_block

    def stop_reason(self, now_s: float, next_block_s: float, blocks_done: int) -> str | None:
        """The stop reason when a next block of ``next_block_s`` seconds would end past the budget, else None."""
        elapsed = now_s - self.started
        if self.budget_s is not None and elapsed + next_block_s > self.budget_s:
            return (f"budget: {elapsed:.0f} s of {self.budget_s:.0f} s used after {blocks_done} block(s); the last "
                    f"took {next_block_s:.0f} s")
        return None


def step_seconds(walls: Iterable[tuple[str, LevelKey, float]], overlapping: bool) -> dict[Level, float]:
    """Per level, the wall seconds of its steps: ``walls`` holds (arm, level key, the level's wall seconds) of the
    levels measured; a step is one (level, round). The arms' levels of a step run one after another (their walls
    add up) or, ``overlapping`` (``serve.duet``: both arms' levels of a step start together on disjoint cores), at the
    same time — the step's wall is then the longer of them, not their sum."""
    steps: dict[LevelKey, list[float]] = {}
    for _, key, wall in walls:
        steps.setdefault(key, []).append(wall)
    per_level: dict[Level, float] = {}
    for key, times in steps.items():
        per_level[key.level] = per_level.get(key.level, 0.0) + (max(times) if overlapping else sum(times))
    return per_level


def project_budget(budget_s: float, elapsed_s: float, level_s: Mapping[Level, float], min_sessions: int,
                   planned: int, start_s: float = 0.0, look_s: float = 0.0) -> BudgetRecord:
    """After block 1: do ``min_sessions`` blocks fit ``budget_s``, and which levels to leave out so they do.

    Each later block is taken to cost its per-block work only, as block 1 measured it: ``block_s`` = its level
    steps ``level_s`` (per level, :func:`step_seconds`: a duet's overlapping levels counted once) + ``start_s`` (the
    server starts every block repeats: fresh sessions per block; 0 where servers stay up) + ``look_s`` (the sequential
    look at a block's end). Excluded: block 1's one-off work, which no later block repeats — the pilot, the load
    clients' import, writing real-text datasets, connecting a cluster, parity prompts and scorings, GSM8K, the
    first server starts where servers stay up — and what no block-1 figure measures: server stops and the harness's
    bookkeeping between levels (seconds a block; the per-block rule, :class:`BlockBudget`, times each later block
    whole), a restart after a server dies. Leaving a level out saves its ``level_s``; the rest of a block does not
    shrink. The rule: drop the longest level of block 1 first (ties: the later level,
    :class:`~harness.rundir.schema.Level` order), one at a time, until ``elapsed_s + (min_sessions − 1) × block``
    ≤ ``budget_s``, never the last level. It reads wall times only, never a metric value, so it cannot favour either
    arm, and both arms drop the same levels (pairing stays valid). All values in seconds; ``elapsed_s``: the run
    so far, one-off work included; ``planned``: the run's blocks (``workload.repeats``): the most the record's
    ``blocks`` projects, and the most blocks the projection asks for.
    """
    block_s = sum(level_s.values()) + start_s + look_s
    remaining = max(min(min_sessions, planned) - 1, 0)   # a plan of fewer blocks cannot reach min_sessions anyway
    needed = elapsed_s + remaining * block_s
    record = {"budget_s": budget_s, "elapsed_s": round(elapsed_s, 1), "block_s": round(block_s, 1),
              "min_sessions": min_sessions, "level_s": {str(c): round(s, 1) for c, s in sorted(level_s.items())},
              "needed_s": round(needed, 1), "planned": planned, "start_s": round(start_s, 1),
              "look_s": round(look_s, 1)}

    def blocks(block: float) -> int:
        return min(planned, 1 + (math.floor((budget_s - elapsed_s) / block) if block > 0 else planned))

    if needed <= budget_s:
        return BudgetRecord(**record, projected_s=round(needed, 1), blocks=blocks(block_s), outcome="fits")
    dropped: list[str] = []
    block, projected = block_s, needed
    for level in sorted(level_s, key=lambda level: (level_s[level], level), reverse=True)[:-1]:
        dropped.append(str(level))
        block -= level_s[level]
        projected = elapsed_s + remaining * block
        if projected <= budget_s:
            return BudgetRecord(**record, projected_s=round(projected, 1), dropped=tuple(dropped),
                                blocks=blocks(block), outcome="adapted")
    return BudgetRecord(**record, projected_s=round(projected, 1), blocks=max(blocks(block), 1), outcome="cannot")
