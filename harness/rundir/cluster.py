"""Where the arms ran: the manifest's ``cluster`` record and each session's ``placement`` (written by
:mod:`harness.run.runner` from :mod:`harness.run.placement` and :mod:`harness.run.cluster`; re-exported by
:mod:`harness.rundir.schema`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from harness.rundir.record import Record as _Record

__all__ = ["Placement", "NodeRecord", "Assignment", "ClusterRecord"]


class Placement(_Record):
    """Where one server session of an arm ran (harness.run.placement): ``backend`` "local" | "ray", the Ray node it
    was asked for (``requested``: node id, labels or custom resource) and the one it got (``node`` id, ``node_ip``),
    the CPU cores / GPUs it was pinned to (None: not pinned), the ``block`` (round) it served, and how vLLM ran its
    workers: ``executor_backend`` ("uni", "mp", "ray"), ``world_size`` (TP × PP), ``nodes`` (ids of every node its
    workers used), ``nccl_transport`` ("NET/IB", "NET/Socket", "P2P/SHM" or None: no NCCL line in the log)."""

    backend: str = "local"
    block: int | None = None
    requested: dict[str, Any] = Field(default_factory=dict)
    node: str | None = None
    node_ip: str | None = None
    cpu_cores: tuple[int, ...] | None = None
    gpu_ids: tuple[int, ...] | None = None
    executor_backend: str | None = None
    world_size: int | None = None
    nodes: tuple[str, ...] = ()
    nccl_transport: str | None = None


class NodeRecord(_Record):
    """One Ray node of the cluster: id, address, labels, resources (``ray.nodes()``: CPU, GPU, memory, custom) and
    the versions found on it by a task placed there (``ray``, ``vllm``, ``python``, ``torch``)."""

    node_id: str
    ip: str | None = None
    alive: bool | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    resources: dict[str, float] = Field(default_factory=dict)
    versions: dict[str, str | None] = Field(default_factory=dict)


class Assignment(_Record):
    """Which arm was to run where in one block (harness.run.placement.assignments)."""

    block: int
    arm: str
    backend: str = "local"
    node: str | None = None
    label: dict[str, str] | None = None
    resource: str | None = None
    cpu_cores: tuple[int, ...] | None = None
    gpu_ids: tuple[int, ...] | None = None


class ClusterRecord(_Record):
    """The cluster a run used: backend, the Ray address (None locally), whether placements swapped per block, the
    nodes, and the assignment of arms to slots per block. Each session's actual place is in its :class:`Placement`."""

    backend: str = "local"
    address: str | None = None
    swap_nodes: bool = False
    nodes: tuple[NodeRecord, ...] = ()
    assignments: tuple[Assignment, ...] = ()
