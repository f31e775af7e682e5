"""``manifest.json`` ``pilot``: the levels run before the first measured one to size every level to the duration floor
``workload.min_level_s`` (harness.run.pilot). Re-exported by :mod:`harness.rundir.schema`."""

from __future__ import annotations

from harness.rundir.record import Record

__all__ = ["PilotLevel", "PilotRecord"]


class PilotLevel(Record):
    """One pilot level at ``concurrency``: ``pilot_prompts`` (the scenario's count, sent once), vLLM's measured
    ``duration_s`` (seconds, warmups excluded; None when the level failed, ``error`` says why), and ``num_prompts``,
    the count every measured level of both arms uses at this concurrency. ``capped``: the floor would have asked for
    more than fits under ``workload.level_timeout_s`` with its headroom. ``raw``: the pilot's bench JSON (relative
    path), not a measurement."""

    concurrency: int
    pilot_prompts: int
    duration_s: float | None = None
    num_prompts: int
    capped: bool = False
    raw: str | None = None
    error: str | None = None


class PilotRecord(Record):
    """The pilot: the floor (``min_level_s``, seconds), the arm and session it ran on, when, its wall time (seconds)
    and one :class:`PilotLevel` per concurrency."""

    min_level_s: float
    arm: str
    session: int | None = None
    at: str | None = None
    wall_s: float | None = None
    levels: tuple[PilotLevel, ...] = ()

    def counts(self) -> dict[int, int]:
        """Concurrency → prompts per measured level."""
        return {level.concurrency: level.num_prompts for level in self.levels}

    def describe(self) -> str:
        """One line for the terminal and the report: the counts every measured level used, and how they were set."""
        parts = []
        for level in self.levels:
            if level.error:
                how = f"pilot failed ({level.error}); the scenario's count"
            else:
                how = f"pilot: {level.pilot_prompts} in {level.duration_s:.2f} s"
                how += "; capped by workload.level_timeout_s" if level.capped else ""
            parts.append(f"c={level.concurrency}: {level.num_prompts} ({how})")
        return (f"≥ {self.min_level_s:g} s per level, counts set by a pilot on {self.arm} (session {self.session}): "
                + ", ".join(parts))
