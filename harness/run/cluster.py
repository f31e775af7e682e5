"""What a run learns about its cluster, from plain data: node records, version skew between an arm's nodes, the
nodes vLLM's Ray workers ran on and NCCL's transport, both read from a server's log. Pure (no Ray import)."""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from harness.run.placement import Slot, assignments
from harness.run.plan import executor_backend
from harness.run.scenario import ClusterSpec, Scenario

# Versions compared between the nodes one arm runs on (what harness.run.ray_backend.node_versions reports).
COMPARED_VERSIONS = ("ray", "vllm", "python", "torch")

# Ray prefixes every line a remote worker prints with "(<ActorClass> pid=<pid>, ip=<ip>)"; vLLM's Ray executor
# workers are RayWorkerWrapper actors (vllm/v1/executor/ray_utils.py).
_WORKER_PREFIX = re.compile(r"^\((?:\w+) pid=\d+, ip=([0-9a-fA-F.:]+)\)", re.MULTILINE)

# NCCL's INFO lines (NCCL_DEBUG=INFO): "Channel 00/0 : 0[0] -> 1[1] via NET/IB/0", "via NET/Socket/0", "via P2P/IPC",
# "via SHM/direct/direct", and at init "NET/IB : Using [0]mlx5_0:1/IB" or "NET/Socket : Using [0]eth0:10.0.0.2<0>".
_NCCL_VIA = re.compile(r"NCCL INFO .*?via (NET/IB|NET/Socket|P2P|SHM)")
_NCCL_USING = re.compile(r"NCCL INFO (NET/IB|NET/Socket) : Using")
_TRANSPORT_RANK = ("NET/Socket", "NET/IB", "P2P", "SHM")   # the slowest first: a run is as good as its worst link


def node_record(node: Mapping[str, Any], versions: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """One ``ray.nodes()`` entry (keys ``NodeID``, ``NodeManagerAddress``, ``Alive``, ``Resources``, ``Labels``) →
    the manifest's node record (:class:`harness.rundir.schema.NodeRecord`)."""
    return {"node_id": node["NodeID"], "ip": node.get("NodeManagerAddress"), "alive": node.get("Alive"),
            "labels": {str(k): str(v) for k, v in (node.get("Labels") or {}).items()},
            "resources": {str(k): float(v) for k, v in (node.get("Resources") or {}).items()},
            "versions": dict(versions or {})}


def version_skew(arm: str, node_ids: Iterable[str], versions: Mapping[str, Mapping[str, str | None]]) -> list[str]:
    """Why the nodes ``arm`` ran on differ in versions ([] when they agree): one message per component.

    ``versions``: node id → {component: version}; nodes without a record are skipped (nothing to compare)."""
    seen = {node: versions[node] for node in sorted(set(node_ids)) if node in versions}
    problems = []
    for component in COMPARED_VERSIONS:
        found = {node: record.get(component) for node, record in seen.items()}
        if len(set(found.values())) > 1:
            listed = ", ".join(f"{node[:12]} {version}" for node, version in found.items())
            problems.append(f"{arm}: its nodes run different {component} versions ({listed}); install the same "
                            f"build on every node or set cluster.allow_version_skew = true")
    return problems


def worker_ips(log_text: str) -> list[str]:
    """IP addresses of the Ray workers whose lines appear in a server log (sorted, unique)."""
    return sorted(set(_WORKER_PREFIX.findall(log_text)))


def nccl_transport(log_text: str) -> str | None:
    """The slowest NCCL transport a server log shows (``NET/Socket`` < ``NET/IB`` < ``P2P`` < ``SHM``), None when
    NCCL printed no transport line (NCCL_DEBUG unset, one rank, or CPU)."""
    found = set(_NCCL_VIA.findall(log_text)) | set(_NCCL_USING.findall(log_text))
    return next((transport for transport in _TRANSPORT_RANK if transport in found), None)


def transport_note(arm: str, transport: str | None, platform: str, multi_node: bool) -> str | None:
    """A validity note for a multi-node GPU arm whose inter-node traffic went over TCP sockets (``NET/Socket``):
    its throughput is not what an InfiniBand cluster gives (None otherwise)."""
    if platform != "cuda" or not multi_node:
        return None
    if transport == "NET/Socket":
        return (f"{arm}: NCCL used NET/Socket (TCP) between nodes, not NET/IB: multi-node numbers are not "
                f"InfiniBand numbers; check NCCL_IB_HCA / the RDMA devices on the nodes")
    if transport is None:
        return f"{arm}: no NCCL transport line in the server log; set NCCL_DEBUG=INFO in serve.env to record it"
    return None


def manifest_record(spec: ClusterSpec, arms: Sequence[str], blocks: int) -> dict[str, Any]:
    """The manifest's ``cluster`` before the run (:class:`harness.rundir.schema.ClusterRecord`): backend, address,
    swapping and which arm is to run where in each block; ``nodes`` is filled once the cluster is connected."""
    return {"backend": spec.backend, "address": spec.address if spec.backend == "ray" else None,
            "swap_nodes": spec.swap_nodes, "nodes": [],
            "assignments": assignments(list(arms), blocks, spec.slots(list(arms)), spec.swap_nodes)}


def session_placement(scenario: Scenario, slot: Slot, block: int, node: Mapping[str, str], log_text: str,
                      nodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One session's :class:`harness.rundir.schema.Placement`: what ``slot`` asked for, the ``node`` it got
    (``{"node_id", "ip"}``, empty locally), and how vLLM ran its workers — executor backend, world size (TP × PP),
    the nodes its workers used (the server's node plus those whose IPs prefix Ray worker lines in ``log_text``,
    mapped to ids through the cluster's ``nodes``) and NCCL's transport."""
    serve = scenario.serve
    by_ip = {record["ip"]: record["node_id"] for record in nodes}
    used = sorted({node.get("node_id"), *(by_ip.get(ip, ip) for ip in worker_ips(log_text))} - {None})
    record = slot.record()
    return {"backend": slot.backend, "block": block,
            "requested": {key: record[key] for key in ("node", "label", "resource") if record[key]},
            "node": node.get("node_id"), "node_ip": node.get("ip"), "cpu_cores": record["cpu_cores"],
            "gpu_ids": record["gpu_ids"], "executor_backend": executor_backend(scenario),
            "world_size": serve.tensor_parallel_size * serve.pipeline_parallel_size, "nodes": used,
            "nccl_transport": nccl_transport(log_text)}
