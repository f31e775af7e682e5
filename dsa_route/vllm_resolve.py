"""The effective path of a whole ``vllm serve`` command, resolved by the installed vLLM on a simulated platform.

:func:`resolve_serve` does what a server process of this venv does before it loads weights — the dsa_route plugin on
the command line and environment (``dsa_route.plugin.apply``), vLLM's serve argument parser,
``EngineArgs.create_engine_config`` — inside :func:`dsa_route.vllm_defaults.simulated_platform`, and reports the path
vLLM resolved (:class:`EffectivePath`). :func:`intended_path` and :func:`path_mismatches` compare it with a plan arm,
naming the knob behind every difference. Reads vLLM 0.32 internals (see :mod:`dsa_route.vllm_defaults`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

from dsa_route.routing import RouteDecision
from dsa_route.vllm_defaults import (
    DEFAULT_CAPABILITY,
    PATH_ENV,
    internals_changed,
    registered_target,
    resolve_target,
    simulated_platform,
    vllm_version,
)


class VllmRefusal(ValueError):
    """vLLM refused the configuration (what ``vllm serve`` would fail with at startup); ``str()`` is vLLM's message."""


@dataclass(frozen=True)
class EffectivePath:
    """The path vLLM's configuration resolved for one server command (after the dsa_route plugin, as in the server).

    Names are vLLM's: ``model_runner`` ``"v1"|"v2"``, ``compilation_mode`` a CompilationMode name,
    ``cudagraph_mode`` a CUDAGraphMode name; ``implementation`` / ``mtp_implementation`` the resolved
    ``"module:Class"``; ``env`` the path variables the server process ends with (after plugin and vLLM wrote them);
    ``plugin_line`` the ``dsa_route:`` line the plugin would print.
    """

    vllm_version: str
    platform: str
    architecture: str
    model_runner: str
    compilation_mode: str
    cudagraph_mode: str
    breakable_cudagraph: bool
    implementation: str
    mtp_architecture: str | None
    mtp_implementation: str | None
    mtp_enforce_eager: bool | None
    kv_cache_dtype: str
    env: dict
    plugin_line: str | None
    config_text: str  # str(VllmConfig): what the engine core logs after "Initializing a V1 LLM engine (v…) with config:"

    def to_dict(self) -> dict:
        return asdict(self)


def _engine_args(server_args: Sequence[str]):
    """``AsyncEngineArgs`` from ``vllm serve`` arguments, through vLLM's own serve parser
    (vllm/entrypoints/launchers/cli_args.py ``make_arg_parser``; the positional model tag wins, as in
    vllm/entrypoints/cli/serve.py ``ServeSubcommand.cmd``)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(list(server_args))
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    return AsyncEngineArgs.from_cli_args(args)


def _refusal_message(error: Exception) -> str:
    """vLLM's own words: the messages of a pydantic ValidationError (vLLM's configs are pydantic dataclasses), else
    the first line."""
    if callable(getattr(error, "errors", None)):
        return "; ".join(str(e.get("msg", "")).removeprefix("Value error, ") for e in error.errors())
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__


def resolve_serve(server_args: Sequence[str], env: Mapping[str, str], platform: str, *, has_triton: bool | None = None,
                  device_capability: tuple[int, int] = DEFAULT_CAPABILITY, apply_plugin: bool = True) -> EffectivePath:
    """Resolve ``vllm serve <server_args>`` under ``env`` on ``platform`` the way the server would, without starting it.

    Args:
        server_args: everything after ``vllm serve`` (model first or ``--model``); must name a local model directory
            or ``--hf-config-path`` that holds config.json (nothing is fetched).
        env: the server environment (the arm's ``server_env``).
        platform, has_triton, device_capability: see :func:`simulated_platform`.
        apply_plugin: run dsa_route's plugin first (``dsa_route.plugin.apply``), as every server process of this venv
            does; False shows what plain vLLM does.

    Returns:
        :class:`EffectivePath`.

    Raises:
        VllmRefusal: vLLM rejects the configuration (the server would not start).
        VllmInternalsChanged: see :func:`require_supported`.
    """
    from dsa_route import plugin

    with simulated_platform(platform, env=env, has_triton=has_triton, device_capability=device_capability):
        line = None
        if apply_plugin:
            result = plugin.apply(os.environ, ["vllm", "serve", *server_args], plugin.probe_installed_vllm,
                                  process="simulated")
            line = result[0] if result else None
        try:
            config = _engine_args(server_args).create_engine_config()
            v2 = config.use_v2_model_runner
        except (ValueError, AssertionError) as error:  # what `vllm serve` would exit with
            raise VllmRefusal(_refusal_message(error)) from error
        except (ImportError, AttributeError, TypeError, KeyError) as error:
            raise internals_changed("config resolution failed under the simulated platform", error) from error
        import vllm.envs as envs

        arch = config.model_config.architectures[0]
        spec = config.speculative_config
        draft = spec.draft_model_config.architectures[0] if spec is not None and spec.draft_model_config else None
        return EffectivePath(
            vllm_version=vllm_version() or "", platform=platform, architecture=arch,
            model_runner="v2" if v2 else "v1", compilation_mode=config.compilation_config.mode.name,
            cudagraph_mode=config.compilation_config.cudagraph_mode.name,
            breakable_cudagraph=bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH),
            implementation=resolve_target(registered_target(arch) or "?", platform),
            mtp_architecture=draft,
            mtp_implementation=resolve_target(registered_target(draft) or "?", platform) if draft else None,
            mtp_enforce_eager=getattr(spec, "enforce_eager", None) if spec is not None else None,
            kv_cache_dtype=str(config.cache_config.cache_dtype),
            env={k: os.environ[k] for k in PATH_ENV if k in os.environ}, plugin_line=line, config_text=str(config),
        )


# --- intended vs effective -------------------------------------------------------------------------------------------

# The knob that sets each compared field, named in every mismatch.
KNOBS: Mapping[str, str] = {
    "model_runner": "VLLM_USE_V2_MODEL_RUNNER",
    "breakable_cudagraph": "VLLM_USE_BREAKABLE_CUDAGRAPH",
    "compilation_mode": "--compilation-config mode",
    "cudagraph_mode": "--compilation-config cudagraph_mode",
    "implementation": "DSA_ROUTE (the dsa_route plugin's ModelRegistry entry)",
    "mtp_implementation": "DSA_ROUTE + --speculative-config (the draft's ModelRegistry entry)",
    "mtp_enforce_eager": "--speculative-config enforce_eager",
}


def intended_path(intended: Mapping, decision: RouteDecision, platform: str) -> dict:
    """The fields :func:`path_mismatches` compares, from a plan arm.

    Args:
        intended: ``serve_path.expected_observation(...)`` (``ArmPlan.intended``): runner, modes, breakable.
        decision: the arm's :class:`~dsa_route.routing.RouteDecision` (``ArmPlan.decision``): implementation and MTP
            draft.
        platform: the arm's platform (the implementation is resolved through the platform package there).
    """
    out = {name: intended[name] for name in ("model_runner", "compilation_mode", "cudagraph_mode",
                                             "breakable_cudagraph")}
    impl, arch = decision.implementation, decision.architectures[0]
    if arch in impl:
        out["implementation"] = resolve_target(impl[arch], platform)
    if decision.mtp_architecture and "DeepseekV32MTPModel" in impl:
        out["mtp_implementation"] = resolve_target(impl["DeepseekV32MTPModel"], platform)
        out["mtp_enforce_eager"] = bool(decision.mtp_enforce_eager)
    return out


def path_mismatches(intended: Mapping, effective: EffectivePath) -> list[str]:
    """``"<field>: intended X, vLLM resolved Y (knob: K)"`` for each field of ``intended`` vLLM resolved otherwise."""
    seen = effective.to_dict()
    seen["mtp_enforce_eager"] = bool(seen["mtp_enforce_eager"])
    return [f"{name}: intended {value!r}, vLLM {effective.vllm_version} resolved {seen[name]!r} (knob: {KNOBS[name]})"
            for name, value in intended.items() if seen[name] != value]
