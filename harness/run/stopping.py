"""When a run stops before its last planned session block, and where GSM8K runs so an early stop still has it.

Two rules, checked by the runner at every block boundary: a sequential look decided (:func:`harness.gate.look`,
the gate's own verdict at the look's α) or the next block would end past ``--budget`` (:class:`BlockBudget`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness import gate
from harness.judge.policy import Status
from harness.run.plan import Plan

__all__ = ["BlockBudget", "gsm8k_points", "look_stop"]


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

    def check(self, now_s: float, server_start_s: float, blocks_done: int, one_off_s: float = 0.0) -> str | None:
        """Close the block that ends at ``now_s``; the stop reason when the next one would not fit, else None."""
        elapsed, last_block = now_s - self.started, now_s - self.block_started
        if self.servers_stay_up:
            last_block -= server_start_s - self.block_start_s
        last_block -= one_off_s - self.block_one_off_s
        self.block_started, self.block_start_s, self.block_one_off_s = now_s, server_start_s, one_off_s
        if self.budget_s is not None and elapsed + last_block > self.budget_s:
            return (f"budget: {elapsed:.0f} s of {self.budget_s:.0f} s used after {blocks_done} block(s); the last "
                    f"took {last_block:.0f} s")
        return None
