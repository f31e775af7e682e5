"""What else the host did while a level ran: the CPU steal share over the level's window (``/proc/stat``) and the
1-minute load average at its end (``/proc/loadavg``); and what the engine itself spent, its CPU time per output token
(:func:`cpu_ms_per_token`).

Steal time is time a virtual CPU wanted to run while the hypervisor ran another guest (proc(5): the 8th value of
a ``cpu`` line, "stolen time, which is the time spent in other operating systems when running in a virtualized
environment"): a level measured under heavy steal measured the neighbours as much as the server.

The parsers are pure (text in, numbers out); :func:`read_cpu_times` and :func:`read_load_1m` read the files and
return None where they do not exist (not Linux).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from harness.metrics import finite_float

PROC_STAT = Path("/proc/stat")
PROC_LOADAVG = Path("/proc/loadavg")


class CpuTimes(NamedTuple):
    """The aggregate ``cpu`` line of ``/proc/stat``, in clock ticks (USER_HZ): steal and the sum of the eight time
    fields user, nice, system, idle, iowait, irq, softirq, steal (guest and guest_nice are already inside user and
    nice, proc(5), so they are not added again)."""

    steal: int
    total: int


def parse_proc_stat(text: str) -> CpuTimes:
    """The aggregate ``cpu`` line of ``/proc/stat`` text.

    Raises:
        ValueError: no ``cpu`` line, or fewer than four numeric fields on it (kernels before 2.6.11 have no steal
            field: it is then 0).
    """
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            try:
                values = [int(v) for v in parts[1:9]]
            except ValueError:
                raise ValueError(f"/proc/stat: non-numeric cpu line {line!r}") from None
            if len(values) < 4:
                raise ValueError(f"/proc/stat: cpu line has {len(values)} fields, expected at least 4")
            values += [0] * (8 - len(values))
            return CpuTimes(steal=values[7], total=sum(values))
    raise ValueError("/proc/stat: no aggregate 'cpu' line")


def steal_share(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Stolen ticks / all ticks between two readings (0..1); None when a reading is missing or no tick passed."""
    if before is None or after is None:
        return None
    total = after.total - before.total
    if total <= 0:
        return None
    return max(0.0, min(1.0, (after.steal - before.steal) / total))


def parse_loadavg(text: str) -> float:
    """The 1-minute load average (runnable + uninterruptible tasks, exponentially averaged) of ``/proc/loadavg``.

    Raises:
        ValueError: the text does not start with a number.
    """
    fields = text.split()
    try:
        return float(fields[0])
    except (IndexError, ValueError):
        raise ValueError(f"/proc/loadavg: unexpected text {text[:40]!r}") from None


def read_cpu_times(path: Path = PROC_STAT) -> CpuTimes | None:
    """:func:`parse_proc_stat` of ``path``; None where it is absent or unreadable."""
    try:
        return parse_proc_stat(path.read_text(encoding="ascii", errors="replace"))
    except (OSError, ValueError):
        return None


def read_load_1m(path: Path = PROC_LOADAVG) -> float | None:
    """:func:`parse_loadavg` of ``path``; None where it is absent or unreadable."""
    try:
        return parse_loadavg(path.read_text(encoding="ascii", errors="replace"))
    except (OSError, ValueError):
        return None


def cpu_ms_per_token(before_s: float | None, after_s: float | None, output_tokens: Any) -> float | None:
    """Milliseconds of engine CPU time per output token over a level: ``(after_s − before_s) · 1000 / output_tokens``
    (``vllm bench serve``'s ``total_output_tokens``; the CPU time also covers the level's warm-up requests, ≤ 1 in
    16 of the default's). A cost that contention barely moves: time the engine waits for a core is not CPU time.
    None when a reading is missing, the clock went back (another engine process) or no token was counted."""
    tokens = finite_float(output_tokens)
    if before_s is None or after_s is None or not tokens or tokens <= 0 or after_s < before_s:
        return None
    return round(1000.0 * (after_s - before_s) / tokens, 4)
