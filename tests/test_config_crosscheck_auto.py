"""route="auto" agrees with the installed vLLM's own choice on every platform × architecture × environment row.

``routing.decide(route="auto")`` without ``vllm_choice`` uses its built-in vLLM 0.32 snapshot; here each row is also
put to the installed vLLM (``dsa_route.vllm_defaults.vllm_choice``: vLLM's own ``use_v2_model_runner``,
``_maybe_enable_breakable_cudagraph``, registry and ``SpeculativeConfig.hf_config_override`` under a simulated
platform). A disagreement means the snapshot is stale for the installed vLLM. XPU is not simulated (its platform module
needs Intel's runtime); tests/test_routing.py covers its rows.
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("vllm")

from dsa_route import routing, serve_path  # noqa: E402

MODEL_TYPES = {"DeepseekV32ForCausalLM": "deepseek_v32", "GlmMoeDsaForCausalLM": "glm_moe_dsa",
               "DeepseekV3ForCausalLM": "deepseek_v3", "LlamaForCausalLM": "llama",
               "KimiLinearForCausalLM": "kimi_linear", "DeepseekV41ForCausalLM": "deepseek_v41"}
PLATFORMS = ("cuda", "rocm", "cpu")
ENVS = ({}, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, {"VLLM_USE_V2_MODEL_RUNNER": "1"},
        {"VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}, {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}, {"TORCH_COMPILE_DISABLE": "1"},
        {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"})
# Intended divergence: on CPU dsa_route serves DSA models with dsa_route.vllm_cpu (vLLM's classes raise "Sparse
# Attention is not supported on CPU"), so the implementation is compared on GPUs only.
IMPLEMENTATION_COMPARED_ON = ("cuda", "rocm")


@pytest.fixture(scope="module")
def vd(supported_vllm):
    return supported_vllm


def disagreements(decision: routing.RouteDecision, choice: dict, env: dict) -> list[str]:
    """Field-by-field differences between decide(route="auto") and the installed vLLM's choice."""
    out = [f"{name}: decide {getattr(decision, name)!r}, vLLM {choice[name]!r}"
           for name in ("model_runner", "breakable_cudagraph", "compilation_mode")
           if getattr(decision, name) != choice[name]]
    graphs = serve_path.expected_observation(decision)["cudagraph_mode"]
    if graphs != choice["cudagraph_mode"]:
        out.append(f"cudagraph_mode: decide {graphs}, vLLM {choice['cudagraph_mode']}")
    if decision.platform in IMPLEMENTATION_COMPARED_ON:
        out += [f"implementation[{arch}]: decide {target}, vLLM {choice['registered'].get(arch)}"
                for arch, target in decision.implementation.items() if choice["registered"].get(arch) != target]
    if decision.mtp_architecture != choice["mtp_architecture"] and decision.is_dsa:
        out.append(f"mtp_architecture: decide {decision.mtp_architecture}, vLLM {choice['mtp_architecture']}")
    refusals = serve_path.startup_refusals(env, decision.platform)
    if bool(refusals) != bool(choice["refusal"]):
        out.append(f"refusal: decide {refusals}, vLLM {choice['refusal']!r}")
    return out


@pytest.mark.parametrize("platform", PLATFORMS)
def test_auto_agrees_with_installed_vllm(vd, platform):
    rows = 0
    for arch, env, mtp in itertools.product(MODEL_TYPES, ENVS, (False, True)):
        draft = MODEL_TYPES[arch] if mtp else None
        choice = vd.vllm_choice([arch], platform, env=env, speculative_model_type=draft)
        decision = routing.decide([arch], platform, env=env, speculative_model_type=draft)
        assert disagreements(decision, choice, env) == [], f"{platform} {arch} {env} mtp={mtp}"
        rows += 1
    assert rows == len(MODEL_TYPES) * len(ENVS) * 2


def test_the_rocm_dsa_default_is_mrv2_compiled_with_the_amd_module(vd):
    choice = vd.vllm_choice(["DeepseekV32ForCausalLM"], "rocm", speculative_model_type="deepseek_v32")
    assert (choice["model_runner"], choice["breakable_cudagraph"], choice["compilation_mode"]) == (
        "v2", False, "VLLM_COMPILE")
    assert choice["resolved"] == {
        "DeepseekV32ForCausalLM": "vllm.models.deepseek_v32.amd.model:DeepseekV32ForCausalLM",
        "DeepseekV32MTPModel": "vllm.models.deepseek_v32.amd.mtp:DeepseekV32MTP"}


def test_mrv2_on_cpu_without_triton_is_a_refusal_the_plan_can_report(vd):
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    choice = vd.vllm_choice(["DeepseekV32ForCausalLM"], "cpu", env=env, has_triton=False)
    assert choice["refusal"] == "Model Runner V2 requires Triton."
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in serve_path.startup_refusals(env, "cpu")[0]


def test_auto_given_the_installed_choice_follows_it(vd):
    choice = vd.vllm_choice(["GlmMoeDsaForCausalLM"], "rocm", speculative_model_type="glm_moe_dsa")
    decision = routing.decide(["GlmMoeDsaForCausalLM"], "rocm", speculative_model_type="glm_moe_dsa",
                              vllm_choice=choice)
    assert disagreements(decision, choice, {}) == []
    assert dict(decision.env) == {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}


def test_another_vllm_release_fails_in_one_line_naming_it(vd, monkeypatch):
    monkeypatch.setattr(vd, "SUPPORTED_VLLM", ("9.9.",))
    with pytest.raises(vd.VllmInternalsChanged) as caught:
        vd.vllm_choice(["DeepseekV32ForCausalLM"], "cuda")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("vLLM internals changed: installed vLLM 0.32")
