"""What a server showed of the path it took: an arm's ``observed`` in ``manifest.json`` (written by
:mod:`harness.run.runner` from :func:`harness.run.attest.observe_from_log` or
:func:`~harness.run.attest.observe_remote`; re-exported by :mod:`harness.rundir.schema`). Field order is the key order
written to ``manifest.json``."""

from __future__ import annotations

from typing import Any

from harness.rundir.record import Record

__all__ = ["Observation", "RemoteObservation"]


class Observation(Record):
    """The path a ``vllm serve`` log shows (:func:`harness.run.attest.observe_from_log`). Path fields, None where the
    log does not say: ``route`` (the ``dsa_route:`` line), ``model_runner`` ("v1" | "v2"), ``compilation_mode`` and
    ``cudagraph_mode`` (vLLM's enum names), ``breakable_cudagraph``. The rest is evidence: the plugin's first line's
    fields (``dsa_route``), how many processes logged one and whether they agree, the engine config's backend, KV
    dtype, eager flag and speculative config, compile evidence (up to 3 lines), the attention backends, vLLM's
    non-default args, engine init seconds, up to 5 ERROR lines, CUDA graph capture (seconds, GiB, batch sizes) and the
    calibration injection the plugin took (``injection``), refused (``injection_refused``) and the model applied
    (``injection_applied``)."""

    route: str | None = None
    model_runner: str | None = None
    compilation_mode: str | None = None
    cudagraph_mode: str | None = None
    breakable_cudagraph: bool | None = None
    dsa_route: dict[str, Any] | None = None
    dsa_route_lines: int = 0
    dsa_route_processes: tuple[str, ...] = ()
    dsa_route_consistent: bool | None = None
    breakable_auto_enabled: bool = False
    model_runner_evidence: str | None = None
    compilation_backend: str | None = None
    compiled: bool | None = None
    compile_evidence: tuple[str, ...] = ()
    vllm_version: str | None = None
    architecture: str | None = None
    kv_cache_dtype: str | bool | None = None
    enforce_eager: bool | str | None = None
    speculative_config: str | None = None
    attention_backends: tuple[str, ...] = ()
    non_default_args: dict[str, Any] | None = None
    engine_init_s: float | None = None
    errors: tuple[str, ...] = ()
    breakable_wrapper: bool = False
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    graph_capture_s: float | None = None
    graph_capture_gib: float | None = None
    injection_applied: str | None = None
    injection: str | None = None
    injection_refused: str | None = None


class RemoteObservation(Record):
    """What a server started by other tooling exposes (:func:`harness.run.attest.observe_remote`): its served model
    ids (``/v1/models``), ``/version``, and whether ``/metrics`` has spec-decode counters. No path field: such an
    arm's path is not attested."""

    served_models: tuple[str, ...] = ()
    server_version: str | None = None
    spec_decode_metrics: bool = False
