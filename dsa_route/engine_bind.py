"""Bind a vLLM CPU engine that runs its worker in-process (the ``uni`` executor) to its declared cores.

vLLM's CPU platform runs the model in a separate worker process (the ``mp`` executor) and binds that worker's OpenMP
threads to ``VLLM_CPU_OMP_THREADS_BIND`` (``vllm/v1/executor/multiproc_executor.py`` → ``OMPProcessManager`` in
``vllm/utils/ompmultiprocessing.py``, which sets ``OMP_NUM_THREADS`` and ``GOMP_CPU_AFFINITY`` before the spawn).
With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the platform keeps the ``uni`` executor (``vllm/platforms/cpu.py``
``check_and_update_config`` forces ``mp`` only while that variable is 1), and the worker runs inside the EngineCore
process, as it does on a GPU at TP 1. No step then crosses the shared-memory queue whose two ends busy-poll a core
each (``vllm/distributed/device_communicators/shm_broadcast.py`` ``SpinCondition.wait``), but nothing binds the
engine either: its OpenMP team takes every core, and the two arms' engines of the CPU default share both.

:func:`apply` restores the binding for that case, from the same variable, in the EngineCore process itself (the vLLM
plugin calls it at load, before the engine builds its model): every thread of the process gets the core list as
its affinity (threads made later inherit it), ``OMP_NUM_THREADS`` is set to the list's length unless set (vLLM's
``vllm/utils/torch_utils.py`` then leaves torch's thread count alone), and torch's intra-op thread count is set to
it. It does nothing in any other process, under the ``mp`` executor, or for ``auto`` / ``nobind`` / ``all`` or a list
per rank (``|``): those are vLLM's own to handle.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping, MutableMapping

ENV_BIND = "VLLM_CPU_OMP_THREADS_BIND"
ENV_MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"
VLLM_BIND_WORDS = ("auto", "nobind", "all")


def parse_id_list(text: str) -> tuple[int, ...]:
    """``"0-2,5"`` → ``(0, 1, 2, 5)``: the id-list syntax of ``VLLM_CPU_OMP_THREADS_BIND`` (one rank's list).

    Raises:
        ValueError: not a comma-separated list of ids and ``a-b`` ranges of non-negative integers.
    """
    ids: list[int] = []
    for part in str(text).split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise ValueError(f"{text!r} is not an id list; write e.g. 0-3 or 0,2,4")
        ids.extend(range(int(low), int(high or low) + 1))
    return tuple(sorted(set(ids)))


def cores_to_bind(env: Mapping[str, str], process: str) -> tuple[int, ...] | None:
    """The cores an in-process engine must be bound to, or None where :func:`apply` leaves the process alone.

    Args:
        env: the process environment.
        process: ``multiprocessing.current_process().name`` (vLLM names its engine process ``EngineCore``, with a
            ``_DP<rank>`` suffix under data parallelism).

    Raises:
        ValueError: ``VLLM_CPU_OMP_THREADS_BIND`` is neither one of vLLM's words nor an id list.
    """
    spec = env.get(ENV_BIND, "auto").strip()
    if (not process.startswith("EngineCore") or env.get(ENV_MULTIPROCESSING, "1") != "0"
            or spec in VLLM_BIND_WORDS or "|" in spec):
        return None
    return parse_id_list(spec)


def bind_process(cores: tuple[int, ...]) -> None:
    """Set the affinity of every thread of this process to ``cores`` (Linux: ``/proc/self/task``)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores)
        except ProcessLookupError:   # a thread that ended meanwhile
            continue


def apply(env: MutableMapping[str, str], cores: tuple[int, ...], set_num_threads: Callable[[int], None]) -> None:
    """Bind this process to ``cores`` (what :func:`cores_to_bind` returned): every thread's affinity,
    ``OMP_NUM_THREADS`` unless set, and torch's intra-op thread count.

    ``set_num_threads``: ``torch.set_num_threads`` (passed in: this module stays free of torch, so the harness's pure
    placement layer can share :func:`parse_id_list`)."""
    bind_process(cores)
    env.setdefault("OMP_NUM_THREADS", str(len(cores)))
    set_num_threads(int(env["OMP_NUM_THREADS"]))
