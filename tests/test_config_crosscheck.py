"""Each GPU arm's flags and environment, run through the installed vLLM's own configuration code on CUDA and ROCm.

The plan's server command and environment per arm (harness.plan from routing.decide + serve_overrides) go through
what ``vllm serve`` does before it loads weights — the dsa_route plugin on that argv and env, vLLM's serve parser,
``EngineArgs.create_engine_config`` with the scenario's config.json — under a simulated platform
(dsa_route.vllm_resolve). The effective path must equal the plan's intended one. No server, no GPU: ~10 s for the
vLLM import (once per module) plus well under a second per resolution.

Failures: ``vLLM internals changed: …`` (one line, naming the installed version) when vLLM is a release these checks do
not read; a list of ``field: intended X, vLLM resolved Y (knob: K)`` when an arm's knobs no longer select its path.
Skipped only where vLLM is not installed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from harness.run import plan as plan_mod  # noqa: E402
from harness.run.machine import Machine  # noqa: E402
from harness.run.models import locate  # noqa: E402
from harness.run.scenario import load_scenario, resolve_path  # noqa: E402

V32 = "DeepseekV32ForCausalLM"
NVIDIA = "vllm.models.deepseek_v32.nvidia"
GENERIC = "vllm.model_executor.models.deepseek_v2"
GENERIC_MTP = "vllm.model_executor.models.deepseek_mtp:DeepSeekMTP"

# Scenario → platforms it is checked on (NVFP4 is NVIDIA-only; DeepSeek-V3.2 FP8 also runs on ROCm).
# Each headline scenario holds its short and its long-context levels in one run, so one server command per arm serves
# every level (its --max-model-len covers the longest, checked by vLLM's own config code against the model's).
CASES = [("glm-5.2-nvfp4-tp4", "cuda"), ("deepseek-v3.2-fp8-tp8", "cuda"), ("deepseek-v3.2-fp8-tp8", "rocm")]

# Intended divergences between a real `vllm serve` of the arm and this check, each with its reason.
INTENDED_DIVERGENCES = {
    "model": "the hub id is replaced by the scenario's --hf-config-path directory (the same config.json; no hub here)",
    "tokenizer": "--tokenizer is dropped and --skip-tokenizer-init added (the tokenizer files would need the hub)",
    "platform": "vllm/platforms/cuda.py and rocm.py are imported with stand-ins for the CUDA extension and the GCN "
                "arch query (gfx942), and report compute capability 10.0 and 8 GPUs; no kernel is loaded",
    "model_info": "vLLM inspects model classes in a subprocess (vllm/model_executor/models/registry.py "
                  "_run_in_subprocess), which runs on the real CPU platform: vllm.models.deepseek_v32's interface "
                  "flags come from the generic classes it re-exports there",
    "kv_cache_dtype": "GLM on SM10x: vLLM itself turns kv_cache_dtype auto into fp8_e4m3 (vllm/model_executor/models/"
                      "config.py GlmMoeDsaForCausalLM.verify_and_update_config); decide() takes the dtype as given",
    "mtp_architecture": "vLLM names every DSA draft DeepseekV32MTPModel; the baseline's pre-change DeepSeekMTPModel is "
                        "that name registered to the generic DeepSeekMTP class, so the class is compared, not the name",
    "cpu_implementation": "on CPU (not checked here) dsa_route serves DSA with dsa_route.vllm_cpu instead of vLLM's "
                          "classes, which raise 'Sparse Attention is not supported on CPU'",
}

# PR #52861's before/after path per platform, written out (not derived from the decision).
PINNED = {
    ("cuda", "baseline"): ("v1", "VLLM_COMPILE", "FULL_AND_PIECEWISE", False, GENERIC, GENERIC_MTP, True),
    ("cuda", "candidate"): ("v2", "NONE", "FULL_AND_PIECEWISE", True, NVIDIA, f"{NVIDIA}.mtp:DeepseekV32MTP", False),
    ("rocm", "baseline"): ("v1", "VLLM_COMPILE", "FULL_AND_PIECEWISE", False, GENERIC, GENERIC_MTP, True),
    ("rocm", "candidate"): ("v2", "NONE", "FULL_AND_PIECEWISE", True, GENERIC, GENERIC_MTP, False),
}


@pytest.fixture(scope="module")
def vd(supported_vllm):
    """dsa_route.vllm_resolve after the version gate (vLLM imported once for the module)."""
    from dsa_route import vllm_resolve

    return vllm_resolve


def gpu_plan(name: str, platform: str, overrides: dict | None = None) -> plan_mod.Plan:
    """The scenario's plan on a GPU node of ``platform`` with its GPU count (what the plan writes there)."""
    scenario = load_scenario(name, overrides)
    machine = Machine(name=platform, device=f"planned {platform} node", cpu_count=16,
                      gpu_count=scenario.serve.tensor_parallel_size, has_triton=True)
    return plan_mod.build_plan(scenario, machine, locate(scenario))


def serve_args(arm: plan_mod.ArmPlan) -> list[str]:
    """``vllm serve`` arguments of the arm with the intended divergences "model" and "tokenizer" applied."""
    args = list(arm.server_args)
    config_dir = args[args.index("--hf-config-path") + 1]
    at = args.index("--tokenizer")
    del args[at:at + 2]
    assert (resolve_path(config_dir) / "config.json").exists()
    return [config_dir, *args, "--skip-tokenizer-init"]


def arm_cases():
    return [pytest.param(name, platform, route, id=f"{name}-{platform}-{route}")
            for name, platform in CASES for route in ("baseline", "candidate")]


@pytest.mark.parametrize("name, platform, route", arm_cases())
def test_each_arm_resolves_to_its_intended_path(vd, name, platform, route):
    arm = next(a for a in gpu_plan(name, platform).arms if a.route == route)
    effective = vd.resolve_serve(serve_args(arm), arm.server_env, platform)
    intended = vd.intended_path(arm.intended, arm.decision, platform)
    assert vd.path_mismatches(intended, effective) == []
    runner, mode, graphs, breakable, impl, mtp_impl, eager = PINNED[(platform, route)]
    assert (effective.model_runner, effective.compilation_mode, effective.cudagraph_mode,
            effective.breakable_cudagraph) == (runner, mode, graphs, breakable)
    assert effective.implementation.startswith(impl + ".") or effective.implementation.startswith(impl + ":")
    assert (effective.mtp_architecture, effective.mtp_implementation) == ("DeepseekV32MTPModel", mtp_impl)
    assert bool(effective.mtp_enforce_eager) == eager


@pytest.mark.parametrize("name, platform, route", arm_cases())
def test_the_arm_env_and_flags_alone_select_the_runner_and_graphs(vd, name, platform, route):
    """Without the plugin (e.g. another vLLM build without dsa_route), the plan's env + flags still pin everything but
    the class choice."""
    arm = next(a for a in gpu_plan(name, platform).arms if a.route == route)
    effective = vd.resolve_serve(serve_args(arm), arm.server_env, platform, apply_plugin=False)
    intended = vd.intended_path(arm.intended, arm.decision, platform)
    for field in ("implementation", "mtp_implementation"):
        intended.pop(field, None)  # the class choice is the plugin's registry entry
    assert vd.path_mismatches(intended, effective) == []


@pytest.mark.parametrize("name, platform, route, knob, field", [
    ("glm-5.2-nvfp4-tp4", "cuda", "baseline", "VLLM_USE_V2_MODEL_RUNNER", "model_runner"),
    ("glm-5.2-nvfp4-tp4", "cuda", "baseline", "VLLM_USE_BREAKABLE_CUDAGRAPH", "breakable_cudagraph"),
    ("deepseek-v3.2-fp8-tp8", "rocm", "candidate", "VLLM_USE_BREAKABLE_CUDAGRAPH", "breakable_cudagraph"),
])
def test_dropping_an_arm_knob_fails_naming_it(vd, name, platform, route, knob, field):
    arm = next(a for a in gpu_plan(name, platform).arms if a.route == route)
    broken = {k: v for k, v in arm.server_env.items() if k != knob}
    effective = vd.resolve_serve(serve_args(arm), broken, platform, apply_plugin=False)
    mismatches = vd.path_mismatches(vd.intended_path(arm.intended, arm.decision, platform), effective)
    assert any(m.startswith(f"{field}:") and f"knob: {knob}" in m for m in mismatches), mismatches


def test_the_cuda_candidate_is_vllm_032s_own_default(vd):
    """On CUDA, vLLM 0.32 itself picks the candidate's runner and graphs for GLM: its knobs are a pin, not a change."""
    arm = next(a for a in gpu_plan("glm-5.2-nvfp4-tp4", "cuda").arms if a.route == "candidate")
    bare = {k: v for k, v in arm.server_env.items() if k not in ("VLLM_USE_V2_MODEL_RUNNER",
                                                                  "VLLM_USE_BREAKABLE_CUDAGRAPH")}
    effective = vd.resolve_serve(serve_args(arm), bare, "cuda", apply_plugin=False)
    assert (effective.model_runner, effective.breakable_cudagraph, effective.compilation_mode) == ("v2", True, "NONE")


def test_a_swapped_compilation_config_fails_naming_it(vd):
    base, cand = gpu_plan("glm-5.2-nvfp4-tp4", "cuda").arms
    args = serve_args(base)
    args[args.index("--compilation-config") + 1] = cand.server_args[cand.server_args.index("--compilation-config") + 1]
    effective = vd.resolve_serve(args, {k: v for k, v in base.server_env.items() if k != "DSA_ROUTE"}, "cuda",
                                 apply_plugin=False)
    mismatches = vd.path_mismatches(vd.intended_path(base.intended, base.decision, "cuda"), effective)
    assert any("knob: --compilation-config mode" in m for m in mismatches), mismatches


def test_a_refused_environment_raises_vllms_message(vd):
    arm = gpu_plan("glm-5.2-nvfp4-tp4", "cuda").arms[1]
    with pytest.raises(vd.VllmRefusal, match="Model Runner V2 requires Triton"):
        vd.resolve_serve(serve_args(arm), arm.server_env, "cuda", has_triton=False, apply_plugin=False)


def test_the_simulation_leaves_no_trace(vd):
    import os

    from vllm import ModelRegistry
    from vllm.platforms import current_platform

    before = (type(current_platform), dict(os.environ), {a: str(m) for a, m in ModelRegistry.models.items()})
    arm = gpu_plan("deepseek-v3.2-fp8-tp8", "rocm").arms[0]
    vd.resolve_serve(serve_args(arm), arm.server_env, "rocm")
    assert (type(current_platform), dict(os.environ), {a: str(m) for a, m in ModelRegistry.models.items()}) == before
    assert V32 in ModelRegistry.models



# --- every arm an attribution design generates ------------------------------------------------------------------

ATTRIBUTION = "glm-5.2-nvfp4-tp4-attribution"
ATTRIBUTION_FACTORS = ("implementation", "runner", "breakable", "mtp_eager")   # the arm name's digits, in this order


@pytest.fixture(scope="module")
def attribution_plan(supported_vllm):
    scenario = load_scenario(ATTRIBUTION)
    assert tuple(f.name for f in scenario.attribution.factors) == ATTRIBUTION_FACTORS
    return gpu_plan(ATTRIBUTION, "cuda")


@pytest.mark.parametrize("arm_name", [pytest.param(n, id=f"{ATTRIBUTION}-{n}")
                                      for n in load_scenario(ATTRIBUTION).arm_names()])
def test_every_generated_attribution_arm_resolves_to_its_knobs(vd, attribution_plan, arm_name):
    """Each of the 2^(4−1) arms: vLLM's own config code on its command resolves the plan's intended path, and that
    path is the one its factor levels name (written out here from the knobs, not derived from the decision)."""
    arm = next(a for a in attribution_plan.arms if a.name == arm_name)
    effective = vd.resolve_serve(serve_args(arm), arm.server_env, "cuda")
    assert vd.path_mismatches(vd.intended_path(arm.intended, arm.decision, "cuda"), effective) == []
    impl, runner, breakable, draft_graphs = (int(c) for c in arm_name[1:])
    assert (effective.model_runner, effective.breakable_cudagraph, effective.compilation_mode) == (
        ("v1", "v2")[runner], bool(breakable), ("VLLM_COMPILE", "NONE")[breakable])
    assert effective.implementation.startswith((GENERIC + ":", NVIDIA + ".")[impl])
    assert effective.mtp_implementation == (GENERIC_MTP, f"{NVIDIA}.mtp:DeepseekV32MTP")[impl]
    assert bool(effective.mtp_enforce_eager) == (not draft_graphs)


def test_the_generated_arms_are_the_designs_eight_distinct_paths(vd, attribution_plan):
    paths = {tuple(sorted(vd.intended_path(arm.intended, arm.decision, "cuda").items()))
             for arm in attribution_plan.arms}
    assert len(attribution_plan.arms) == 8 and len(paths) == 8 and not any(a.refusals for a in attribution_plan.arms)


def test_a_knob_vllm_resolves_otherwise_is_caught_and_the_plan_refuses_it(vd):
    """compilation_mode=VLLM_COMPILE on the candidate route: the decision intends VLLM_COMPILE with breakable graphs
    on, which vLLM 0.32 answers with NONE (_maybe_enable_breakable_cudagraph). The cross-check names the field and
    the knob; the plan refuses the arm with the same reason (dsa_route.knobs.decision_refusals), so an attribution
    design holding it exits 2 before anything starts."""
    plan = gpu_plan("glm-5.2-nvfp4-tp4", "cuda", {"arms.candidate.knobs": {"compilation_mode": "VLLM_COMPILE"}})
    arm = next(a for a in plan.arms if a.name == "candidate")
    assert arm.intended["compilation_mode"] == "VLLM_COMPILE" and arm.intended["breakable_cudagraph"] is True
    effective = vd.resolve_serve(serve_args(arm), arm.server_env, "cuda")
    mismatches = vd.path_mismatches(vd.intended_path(arm.intended, arm.decision, "cuda"), effective)
    assert any(m.startswith("compilation_mode: intended 'VLLM_COMPILE'") and "resolved 'NONE'" in m
               and "knob: --compilation-config mode" in m for m in mismatches), mismatches
    assert len(arm.refusals) == 1 and "breakable_cudagraph=on with compilation_mode=VLLM_COMPILE" in arm.refusals[0]
