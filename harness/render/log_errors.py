"""Server-log errors of an arm in their place: those logged while a level was being measured (they can invalidate
it) apart from those logged outside every measured window — at start-up, between levels, or while the harness
stopped the server (vLLM's "AsyncLLM output_handler failed" traceback when its engine core is terminated), shown as a
note, not as an error.

Input: the ``ERROR`` lines :func:`harness.run.attest.observe_from_log` keeps (``observed["errors"]``, vLLM's log
prefix ``ERROR MM-DD HH:MM:SS [file:line] message``) and the arm's level records (``finished_at`` UTC, ``wall_s``).
vLLM's timestamps have second resolution and no year (the year is the level's): a line counts as during a level when
its second lies in ``[floor(start), floor(end))``, so an error logged in the second a level finished counts as after
it (a failure inside the window also fails requests, which ``requests.csv`` records per level).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from harness.rundir.schema import ArmRecord

_LINE = re.compile(r"^ERROR (?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)\s+(?P<rest>.*)$")


@dataclass(frozen=True)
class LogError:
    """One logged error: its first line (``message``), how many log lines it spans (a traceback), and its time."""

    message: str
    lines: int
    at: datetime | None


def _windows(arm: ArmRecord) -> list[tuple[datetime, datetime]]:
    """The measured windows of the arm's levels, [start, end) truncated to seconds, UTC."""
    windows = []
    for _, record in arm.level_items():
        if not record.finished_at or record.wall_s is None:
            continue
        try:
            end = datetime.fromisoformat(record.finished_at.replace("Z", "+00:00"))
        except ValueError:
            continue
        start = end - timedelta(seconds=record.wall_s)
        windows.append((start.replace(microsecond=0), end.replace(microsecond=0)))
    return windows


def _errors(lines: list[str], year: int) -> list[LogError]:
    """Consecutive lines with the same timestamp and source as one error (a traceback is logged line by line)."""
    errors: list[LogError] = []
    last_key = None
    for line in lines:
        match = _LINE.match(str(line))
        stamp = match.group("stamp") if match else None
        source = match.group("rest").split("]")[0] if match else None
        key = (stamp, source)
        if match and key == last_key and errors:
            errors[-1] = LogError(errors[-1].message, errors[-1].lines + 1, errors[-1].at)
            continue
        at = None
        if stamp:
            try:
                at = datetime.strptime(f"{year}-{stamp}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
            except ValueError:
                at = None
        errors.append(LogError(match.group("rest") if match else str(line), 1, at))
        last_key = key
    return errors


def split_errors(arm: ArmRecord) -> tuple[list[LogError], list[LogError]]:
    """(errors logged during a measured level, errors logged outside every measured level) of ``arm``'s server log.
    An error without a readable time counts as during measurement (never hidden as a note)."""
    windows = _windows(arm)
    year = windows[0][0].year if windows else datetime.now(timezone.utc).year
    during, outside = [], []
    for error in _errors(list(arm.observed.get("errors") or []), year):
        inside = error.at is None or any(start <= error.at < end for start, end in windows)
        (during if inside else outside).append(error)
    return during, outside
