"""``python -m harness.run.reaper WATCHED_PID PGID GRACE_S``: end a process group when the process that owns it dies.

Started by :func:`harness.run.procs.spawn` (``watchdog=True``) inside the child's own process group, next to a child
whose owner can die without running its cleanup — a Ray actor killed by ``ray.kill``, or one whose node's raylet
died. Every 0.5 s it checks whether WATCHED_PID is alive; once it is gone it sends the group SIGTERM, waits GRACE_S
seconds, then SIGKILL (the same sequence as :func:`harness.run.procs.stop`). It exits with the group: a normal stop
signals the whole group, the reaper included.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def main(argv: list[str]) -> int:
    watched, group, grace_s = int(argv[0]), int(argv[1]), float(argv[2])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # its own SIGTERM to the group must not end it before SIGKILL
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while _alive(watched):
        time.sleep(0.5)
    try:
        os.killpg(group, signal.SIGTERM)
        time.sleep(grace_s)
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
