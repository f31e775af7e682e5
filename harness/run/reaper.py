"""``python -m harness.run.reaper WATCHED_PID PGID GRACE_S``: end a process group when the process that owns it dies.

Started by :func:`harness.run.procs.spawn` (``watchdog=True``) in a session of its own, next to a child whose owner
can die without running its cleanup — a Ray actor killed by ``ray.kill``, or one whose node's raylet died. Every
0.5 s it checks whether WATCHED_PID is alive; once it is gone it sends the group SIGTERM, waits up to GRACE_S
seconds, then SIGKILL (the same sequence as :func:`harness.run.procs.stop`). It exits as soon as the group is gone
(a normal stop ends the group first). It detaches at once (forks; the parent exits), so it is not a child of the
owner: Ray's raylet SIGKILLs a dead worker's direct children (``kill_child_processes_on_worker_exit``), which would
take the reaper with it and leave the server's grandchildren (vLLM's engine core) running.
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


def _group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    watched, group, grace_s = int(argv[0]), int(argv[1]), float(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C is the owner's to handle
    if os.fork() > 0:
        os._exit(0)
    while _alive(watched):
        if not _group_exists(group):
            return 0
        time.sleep(0.5)
    try:
        os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _group_exists(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
