"""Where each arm's server runs in each block, and what that means for its command and environment. Pure.

One layer serves two designs:

- **node swaps** (``[cluster] backend = "ray"``): each arm on its own Ray node (by node id, node label or custom
  resource), the two arms' nodes exchanged every other block, so a node effect hits both arms alike and cancels in
  the ABBA pairing;
- **duet swaps** (local, both arms at once): each arm's engine on its own CPU cores (vLLM's
  ``VLLM_CPU_OMP_THREADS_BIND``, parsed by ``vllm/utils/ompmultiprocessing.py`` ``_parse_omp_threads_bind_env``:
  one id list per local rank, ranks separated by ``|``, a list like ``0-3,5``) or its own GPUs
  (``CUDA_VISIBLE_DEVICES``), the sets exchanged every other block likewise.

A block is one session block of the schedule (``workload.rounds_per_session`` rounds, :meth:`Plan.block_of`;
:func:`harness.run.start.schedule`): block ``r`` uses the arms' declared slots
when ``r`` is even or swapping is off, and the other arm's slot when ``r`` is odd and swapping is on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from dsa_route.engine_bind import parse_id_list

Backend = Literal["local", "ray"]
BACKENDS: tuple[str, ...] = ("local", "ray")


@dataclass(frozen=True)
class Slot:
    """One place an arm's server can run.

    Attributes:
        backend: ``"local"`` (a child process of dsa-bench) or ``"ray"`` (inside a Ray actor on a chosen node).
        node: a Ray node id (hex, ``ray.nodes()[i]["NodeID"]``) the server must run on.
        label: Ray node labels the node must carry (``label_selector``), as sorted (key, value) pairs.
        resource: a Ray custom resource the node offers (the actor asks for a tiny amount of it).
        cpu_cores: CPU ids the server's engine binds its OpenMP threads to (None: vLLM's ``auto``).
        gpu_ids: GPU indices visible to the server (None: all of the node's).
    """

    backend: Backend = "local"
    node: str | None = None
    label: tuple[tuple[str, str], ...] = ()
    resource: str | None = None
    cpu_cores: tuple[int, ...] | None = None
    gpu_ids: tuple[int, ...] | None = None

    def env(self) -> dict[str, str]:
        """What this slot adds to the server's environment (``VLLM_CPU_OMP_THREADS_BIND``, ``CUDA_VISIBLE_DEVICES``)."""
        env = {}
        if self.cpu_cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = id_list(self.cpu_cores)
        if self.gpu_ids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in self.gpu_ids)
        return env

    def describe(self) -> str:
        """One line for the console, e.g. ``ray node label zone=a, cores 0-1``."""
        parts = [self.backend if self.backend == "local" else "ray node"]
        if self.node:
            parts.append(f"id {self.node[:12]}")
        if self.label:
            parts.append("label " + ",".join(f"{k}={v}" for k, v in self.label))
        if self.resource:
            parts.append(f"resource {self.resource}")
        if self.cpu_cores is not None:
            parts.append(f"cores {id_list(self.cpu_cores)}")
        if self.gpu_ids is not None:
            parts.append(f"gpus {','.join(map(str, self.gpu_ids))}")
        return " ".join(parts[:1]) + (" " + ", ".join(parts[1:]) if len(parts) > 1 else "")

    def record(self) -> dict[str, Any]:
        """JSON-ready dict (the manifest's ``placement`` fields)."""
        return {"backend": self.backend, "node": self.node, "label": dict(self.label) or None,
                "resource": self.resource, "cpu_cores": list(self.cpu_cores) if self.cpu_cores is not None else None,
                "gpu_ids": list(self.gpu_ids) if self.gpu_ids is not None else None}


def id_list(ids: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"`` (the id-list syntax of ``VLLM_CPU_OMP_THREADS_BIND``)."""
    ordered = sorted(set(ids))
    runs: list[list[int]] = []
    for value in ordered:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def slot_for(block: int, arm: str, slots: Mapping[str, Slot], swap: bool) -> Slot:
    """The slot of ``arm`` in ``block``: its own, or — on odd blocks with ``swap`` — the other arm's.

    Raises:
        ValueError: ``swap`` with other than two arms (the exchange is defined for a pair).
    """
    if not swap or block % 2 == 0:
        return slots[arm]
    if len(slots) != 2:
        raise ValueError(f"swapping placements needs exactly two arms, got {sorted(slots)}")
    (other,) = [name for name in slots if name != arm]
    return slots[other]


def start_together(slots: Sequence[Slot], gpu_count: int) -> bool:
    """Whether servers on ``slots`` may start at the same time: two or more local slots on a host without GPUs
    (``gpu_count`` 0) or on disjoint GPU sets. Two vLLM start-ups on one GPU would each profile the other's memory as
    their own (``gpu_memory_utilization`` is taken from the free memory at start-up); a Ray backend starts its actors
    one by one."""
    if len(slots) < 2 or any(slot.backend != "local" for slot in slots):
        return False
    if gpu_count == 0:
        return True
    gpu_sets = [slot.gpu_ids for slot in slots]
    return (all(ids is not None for ids in gpu_sets)
            and len(set().union(*gpu_sets)) == sum(len(ids) for ids in gpu_sets))


def assignments(arms: Sequence[str], blocks: int, slots: Mapping[str, Slot], swap: bool) -> list[dict[str, Any]]:
    """Every (block, arm) → slot, in block order: what the manifest records as ``cluster.assignments``."""
    return [{"block": block, "arm": arm, **slot_for(block, arm, slots, swap).record()}
            for block in range(blocks) for arm in arms]


def overlapping_cores(slots: Mapping[str, Slot]) -> list[int]:
    """CPU ids two local arms' slots both claim (sorted; [] when disjoint or unpinned)."""
    sets = [set(slot.cpu_cores) for slot in slots.values() if slot.backend == "local" and slot.cpu_cores is not None]
    return sorted(sets[0] & sets[1]) if len(sets) == 2 else []


def parse_place_flag(text: str) -> dict[str, Any]:
    """A ``--place-ARM`` value → the ``[cluster.arms.ARM]`` table: ``node=ID``, ``label=k:v`` (repeatable),
    ``resource=NAME``, ``cores=0-3``, ``gpus=0,1``, separated by ``;``. Example: ``label=zone:a;cores=0-1``.

    Raises:
        ValueError: an unknown key or a malformed item (the message shows the syntax).
    """
    table: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ValueError(f"{item!r}: write KEY=VALUE, e.g. node=<node id>;cores=0-1")
        if key == "label":
            name, colon, wanted = value.partition(":")
            if not colon:
                raise ValueError(f"{item!r}: write label=KEY:VALUE, e.g. label=zone:a")
            table.setdefault("label", {})[name] = wanted
        elif key in ("node", "resource"):
            table[key] = value
        elif key in ("cores", "gpus"):
            table["cpu_cores" if key == "cores" else "gpu_ids"] = value
        else:
            raise ValueError(f"{item!r}: unknown placement key {key!r}; use node, label, resource, cores or gpus")
    return table


def needs_multi_node(tensor_parallel_size: int, pipeline_parallel_size: int, gpus_per_node: int | None) -> bool:
    """Whether one arm's world (TP × PP ranks, one GPU each) exceeds one node's GPUs, so vLLM must span nodes with
    its Ray executor (``--distributed-executor-backend ray``; vllm/config/parallel.py ``distributed_executor_backend``:
    "mp" only keeps a world that fits one host). ``gpus_per_node`` None or 0 (CPU): never."""
    return bool(gpus_per_node) and tensor_parallel_size * pipeline_parallel_size > gpus_per_node
