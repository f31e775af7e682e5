"""``[cluster]`` and ``[cluster.arms.<arm>]`` of a scenario: where each arm's server runs (local child processes or
Ray actors, pinned cores or GPUs, node swaps). Validated here; the slots they declare are :mod:`harness.run.placement`'s."""

from __future__ import annotations

import re
from typing import Annotated, Any, Sequence

from pydantic import AfterValidator, Field, field_validator, model_validator

from harness.run.placement import BACKENDS, Slot, overlapping_cores, parse_id_list
from harness.run.spec_base import Frozen, one_of

__all__ = ["ArmPlacementSpec", "ClusterSpec"]


class ArmPlacementSpec(Frozen):
    """``[cluster.arms.<arm>]``: where that arm's server runs (harness.run.placement.Slot). ``node``, ``label`` and
    ``resource`` pick a Ray node (at most one of them); ``cpu_cores`` (``"0-3"`` or ``[0, 1]``) and ``gpu_ids`` pin the
    server's engine on whatever node it runs on."""

    node: str | None = None
    label: dict[str, str] = Field(default_factory=dict)
    resource: str | None = None
    cpu_cores: tuple[int, ...] | None = None
    gpu_ids: tuple[int, ...] | None = None

    @field_validator("cpu_cores", "gpu_ids", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        if isinstance(value, (str, int)):
            return parse_id_list(str(value))
        return value

    @model_validator(mode="after")
    def _one_selector(self) -> "ArmPlacementSpec":
        if self.node is not None and not re.fullmatch(r"[0-9a-fA-F]+", self.node):
            raise ValueError(f"node = {self.node!r} is not a Ray node id (hex, as `ray list nodes` prints it); "
                             "pick the node by label or resource instead")
        chosen = [key for key in ("node", "label", "resource") if getattr(self, key)]
        if len(chosen) > 1:
            raise ValueError(f"gives {' and '.join(chosen)}; pick the node by one of node, label or resource")
        return self

    def slot(self, backend: str) -> Slot:
        """This arm's declared slot under ``backend``."""
        return Slot(backend=backend, node=self.node, label=tuple(sorted(self.label.items())), resource=self.resource,
                    cpu_cores=self.cpu_cores, gpu_ids=self.gpu_ids)


class ClusterSpec(Frozen):
    """``[cluster]``: where the arms run. ``backend = "local"`` (default: child processes of dsa-bench, no Ray) or
    ``"ray"`` (each server in a Ray actor on its arm's node, the load client next to it). ``address``: ``"auto"``
    (a running cluster, ``ray start --head`` on this host or ``RAY_ADDRESS``), ``"host:port"`` / ``"ray://…"``, or
    ``"local"`` (start a Ray head inside dsa-bench for this run). ``swap_nodes``: exchange the two arms' placements
    every other block. ``gpus_per_node``: GPUs of one node (an arm whose TP × PP exceeds it is served across nodes
    with vLLM's Ray executor). ``allow_version_skew``: the nodes an arm runs on may differ in Ray/vLLM/Python
    versions (otherwise that arm is INVALID)."""

    backend: Annotated[str, AfterValidator(one_of("cluster.backend", BACKENDS))] = "local"
    address: str = "local"
    swap_nodes: bool = False
    gpus_per_node: int | None = Field(default=None, ge=0)
    allow_version_skew: bool = False
    aa_check: bool = False   # first an A/A run of the baseline arm on both placements, not swapped (its own run dir)
    arms: dict[str, ArmPlacementSpec] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> "ClusterSpec":
        unknown = sorted(set(self.arms) - {"baseline", "candidate"})
        if unknown:
            raise ValueError(f"[cluster.arms.{unknown[0]}] is not an arm; use [cluster.arms.baseline] or "
                             f"[cluster.arms.candidate]")
        if self.backend == "local":
            ray_only = [f"{arm}.{key}" for arm, spec in self.arms.items()
                        for key in ("node", "label", "resource") if getattr(spec, key)]
            if ray_only:
                raise ValueError(f"cluster.arms.{ray_only[0]} picks a Ray node but cluster.backend is \"local\"; "
                                 f"set backend = \"ray\" (--cluster-backend ray) or drop it")
        if not self.address.strip():
            raise ValueError("cluster.address is empty; use \"auto\", \"local\" or host:port")
        shared = overlapping_cores(self.slots())
        if shared:
            raise ValueError(f"both arms claim CPU cores {shared}; give each arm its own cores (cpu_cores)")
        return self

    def slots(self, names: Sequence[str] = ("baseline", "candidate")) -> dict[str, Slot]:
        """Each arm's declared slot (an arm without a table: anywhere, vLLM's own binding); ``names``: the run's arms
        (an attribution's generated arms have no table: each runs anywhere, one server at a time)."""
        return {arm: self.arms.get(arm, ArmPlacementSpec()).slot(self.backend) for arm in names}
