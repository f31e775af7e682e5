"""Duet steps (``serve.duet``): one level sent to both arms at the same time, each arm's server on its own CPU cores
or GPUs, so noise the host shares (other tenants, steal time, clock and thermal drift) hits both arms alike (Bulej et
al. 2020, "Duet benchmarking: improving measurement accuracy in the cloud", Empirical Software Engineering 25).

Each arm has its own load client (:class:`harness.run.load.LoadClient`, one ``vllm bench serve`` process per arm);
both levels of a step start together, each in a thread of its own, and the step ends when both have. The servers
are started first, one after the other, in the calling thread. A level that fails, or a server that dies, ends only
that arm's level (its client's timeout bounds a stalled one); an exception that is not a level failure is raised in
the calling thread at once, whose ``finally`` stops every child — the other thread then ends with its client.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rich.console import Console
from rich.markup import escape

from harness.run.load import LevelError, LoadClient

__all__ = ["load_clients", "run_step", "start_clients", "steps"]

Item = tuple[str, Any, int]   # (arm, level, round), as harness.run.start.schedule lists them


def steps(order: Sequence[Item], duet: bool) -> list[list[int]]:
    """The indices of ``order`` that run together: one level each, or (``duet``) the two arms' levels of a step.

    Raises:
        ValueError: a duet order whose consecutive pairs are not one (concurrency, round) for two different arms.
    """
    if not duet:
        return [[index] for index in range(len(order))]
    pairs = [[index, index + 1] for index in range(0, len(order), 2)]
    for first, second in pairs:
        if second >= len(order) or order[first][1:] != order[second][1:] or order[first][0] == order[second][0]:
            raise ValueError(f"a duet step needs both arms at the same level; the schedule has {order[first]} alone")
    return pairs


def load_clients(arms: Sequence[str], env: Mapping[str, str], log_path: Callable[[str], Path],
                 duet: bool) -> dict[str, LoadClient]:
    """Each arm's load client: one shared client (``logs/bench-client.log``) that the arms take turns on, or under a
    duet one per arm (``logs/bench-client-<arm>.log``). ``log_path``: a log's name → its path (RunDir.log_path)."""
    if not duet:
        shared = LoadClient(env, log_path("bench-client.log"))
        return {arm: shared for arm in arms}
    return {arm: LoadClient(env, log_path(f"bench-client-{arm}.log")) for arm in arms}


def start_clients(clients: Mapping[str, LoadClient], console: Console) -> None:
    """Start every client now (vLLM imported), so a duet's first two levels begin together; a client that fails to
    start is only reported here — its arm's first level starts it again and records the failure."""
    for arm, client in clients.items():
        try:
            client.start()
        except LevelError as error:
            console.print(f"[yellow]{arm}: {escape(str(error))}[/]")


def run_step(measures: Sequence[Callable[[], Any]], poll_s: float = 0.2) -> None:
    """Run ``measures`` (each one arm's whole level, failures recorded by itself) at the same time and wait for all.

    Threads are daemons: an interrupt or crash in the calling thread is never held up by a level still running.

    Raises:
        BaseException: the first exception a measure raised (the others keep running until their client ends).
    """
    errors: list[BaseException] = []

    def guarded(measure: Callable[[], Any]) -> None:
        try:
            measure()
        except BaseException as error:  # noqa: BLE001 — handed to the calling thread below
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(measure,), name=f"duet-{index}", daemon=True)
               for index, measure in enumerate(measures)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        if errors:
            raise errors[0]
        time.sleep(poll_s)
    if errors:
        raise errors[0]
