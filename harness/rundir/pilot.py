"""``manifest.json`` ``pilot``: the levels run before the first measured one to size every level to the duration floor
``workload.min_level_s`` (harness.run.pilot). Re-exported by :mod:`harness.rundir.schema`."""

from __future__ import annotations

from harness.rundir.levels import Level
from harness.rundir.record import Record

__all__ = ["PilotLevel", "PilotRecord"]


class PilotLevel(Record):
    """The pilot of one ``level`` (``str(Level)``; its ``concurrency`` repeated): ``pilot_prompts`` (the scenario's count, sent once), vLLM's measured
    ``duration_s`` (seconds, warmups excluded; None when the level failed, ``error`` says why), and ``num_prompts``,
    the count every measured round of the level uses in both arms. ``capped``: the floor would have asked for
    more than fits under ``workload.level_timeout_s`` with its headroom. ``raw``: the pilot's bench JSON (relative
    path), not a measurement."""

    level: str                                  # str(Level)
    concurrency: int
    pilot_prompts: int
    duration_s: float | None = None
    num_prompts: int
    capped: bool = False
    raw: str | None = None
    error: str | None = None


class PilotRecord(Record):
    """The pilot: the floor (``min_level_s``, seconds), the arm and session it ran on, when, its wall time (seconds)
    and one :class:`PilotLevel` per level of the grid."""

    min_level_s: float
    arm: str
    session: int | None = None
    at: str | None = None
    wall_s: float | None = None
    levels: tuple[PilotLevel, ...] = ()

    def counts(self) -> dict[Level, int]:
        """Level → prompts per measured round (levels whose id does not parse are left out)."""
        return {Level.parse(level.level): level.num_prompts for level in self.levels if Level.parse(level.level)}

    def describe(self) -> str:
        """One line for the terminal and the report: the counts every measured level used, and how they were set."""
        parts = []
        several = len({parsed.regime for parsed in self.counts()}) > 1
        for level in self.levels:
            if level.error:
                how = f"pilot failed ({level.error}); the scenario's count"
            else:
                how = f"pilot: {level.pilot_prompts} in {level.duration_s:.2f} s"
                how += "; capped by workload.level_timeout_s" if level.capped else ""
            where = Level.parse(level.level)
            shown = where.label(regime=several) if where else f"c={level.concurrency}"
            parts.append(f"{shown}: {level.num_prompts} ({how})")
        return (f"≥ {self.min_level_s:g} s per level, counts set by a pilot on {self.arm} (session {self.session}): "
                + ", ".join(parts))
