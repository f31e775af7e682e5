"""Per-knob overrides of the routing decision (dsa_route.knobs): pure, one knob at a time, vLLM's refusals."""

import pytest

from dsa_route import plugin, routing, serve_path
from dsa_route.knobs import (ENV_KNOBS, KNOBS, KnobError, check_knobs, decision_refusals, knob_refusals, knobs_from_env,
                             knobs_to_env)

GLM = "GlmMoeDsaForCausalLM"
V32 = "DeepseekV32ForCausalLM"


def cuda(route="baseline", knobs=None):
    return routing.decide([GLM], "cuda", route=route, speculative_model_type="glm_moe_dsa", knobs=knobs)


PATH = ("model_runner", "breakable_cudagraph", "compilation_mode", "implementation", "mtp_architecture",
        "mtp_enforce_eager", "env")


def path(decision):
    return {name: getattr(decision, name) for name in PATH}


def test_every_knob_at_its_candidate_value_is_the_candidate_path():
    moved = cuda(knobs={knob: values[1] for knob, values in KNOBS.items()})
    assert path(moved) == path(cuda("candidate"))


def test_no_knobs_is_the_route_itself():
    assert cuda(knobs={}) == cuda() and cuda(knobs=None).to_dict() == cuda().to_dict()
    assert "knobs" not in cuda().to_dict() and "knobs=" not in cuda().summary()


@pytest.mark.parametrize("knob, field, value", [
    ("model_runner", "model_runner", "v2"),
    ("breakable_cudagraph", "breakable_cudagraph", True),
    ("compilation_mode", "compilation_mode", "NONE"),
    ("mtp_draft_eager", "mtp_enforce_eager", False),
])
def test_one_knob_moves_one_field_and_records_itself(knob, field, value):
    base, moved = cuda(), cuda(knobs={knob: KNOBS[knob][1]})
    assert getattr(moved, field) == value != getattr(base, field)
    assert moved.knobs == {knob: KNOBS[knob][1]} and moved.to_dict()["knobs"] == {knob: KNOBS[knob][1]}
    assert any(r.startswith(f"knob: {knob}=") for r in moved.reasons)
    unchanged = {"implementation", "model_runner", "mtp_architecture"} - {field}
    assert all(getattr(moved, name) == getattr(base, name) for name in unchanged)


def test_breakable_graphs_bring_compilation_none_as_vllm_does():
    assert cuda(knobs={"breakable_cudagraph": "on"}).compilation_mode == "NONE"
    assert cuda("candidate", knobs={"breakable_cudagraph": "off"}).compilation_mode == "VLLM_COMPILE"


def test_implementation_knob_switches_target_and_draft_class():
    moved = cuda(knobs={"implementation": "platform"})
    assert moved.implementation == {GLM: "vllm.models.deepseek_v32:GlmMoeDsaForCausalLM",
                                    "DeepseekV32MTPModel": "vllm.models.deepseek_v32:DeepseekV32MTP"}
    assert moved.mtp_architecture == "DeepseekV32MTPModel"
    on_cpu = routing.decide([V32], "cpu", route="baseline", knobs={"implementation": "platform"})
    assert on_cpu.implementation == routing.decide([V32], "cpu", route="baseline").implementation


def test_serve_overrides_carry_the_knobs_to_the_plugin_and_it_applies_them():
    decision = routing.decide([V32], "cpu", route="baseline", speculative_model_type="deepseek_v32",
                              has_triton=False, knobs={"compilation_mode": "NONE"})
    args, env, _ = serve_path.serve_overrides(decision, "cpu", has_triton=False, num_speculative_tokens=1)
    assert env[ENV_KNOBS] == "compilation_mode=NONE" and '"mode":"NONE"' in args[1]
    assert serve_path.expected_observation(decision, "cpu", has_triton=False)["compilation_mode"] == "NONE"
    assert knobs_from_env(env) == {"compilation_mode": "NONE"}
    assert ENV_KNOBS not in serve_path.serve_overrides(routing.decide([V32], "cpu", route="baseline"), "cpu").env


def test_knob_text_round_trips_and_bad_text_is_one_line():
    knobs = {"model_runner": "v2", "compilation_mode": "NONE"}
    assert knobs_from_env({ENV_KNOBS: knobs_to_env(knobs)}) == knobs
    assert knobs_from_env({}) == {} and knobs_from_env({ENV_KNOBS: " "}) == {}
    for text, match in [("model_runner", "not knob=value"), ("graphs=on", "unknown knob 'graphs'"),
                        ("model_runner=v3", "allowed: v1 or v2")]:
        with pytest.raises(KnobError, match=match):
            knobs_from_env({ENV_KNOBS: text})
    with pytest.raises(KnobError):
        check_knobs({"compilation_mode": "PIECEWISE"})


def test_refused_combinations_name_vllms_source():
    assert knob_refusals({"model_runner": "v2"}, "cpu", has_triton=False)[0].startswith(
        "model_runner=v2 on cpu without Triton")
    assert knob_refusals({"model_runner": "v2"}, "cuda", has_triton=True) == []
    both = knob_refusals({"breakable_cudagraph": "on", "compilation_mode": "VLLM_COMPILE"}, "cuda", has_triton=True)
    assert len(both) == 1 and "_maybe_enable_breakable_cudagraph" in both[0]
    assert knob_refusals({"breakable_cudagraph": "on", "model_runner": "v1"}, "cuda", has_triton=True) == []


def test_a_knob_meets_the_routes_own_values_in_the_refusal():
    compiled = {"compilation_mode": "VLLM_COMPILE"}
    refused = decision_refusals(cuda("candidate", knobs=compiled), compiled, "cuda", has_triton=True)
    assert len(refused) == 1 and "breakable_cudagraph=on with compilation_mode=VLLM_COMPILE" in refused[0]
    assert decision_refusals(cuda("baseline", knobs=compiled), compiled, "cuda", has_triton=True) == []
    assert decision_refusals(cuda("candidate"), {}, "cuda", has_triton=True) == []   # the route alone: vLLM's own
    on_cpu = routing.decide([V32], "cpu", route="candidate", has_triton=False, knobs={"compilation_mode": "NONE"})
    assert decision_refusals(on_cpu, {"compilation_mode": "NONE"}, "cpu", has_triton=False) == []   # MRV2: V1 there


class _Probe:
    platform, device_capability, has_triton = "cpu", None, False

    def __init__(self):
        self.registry, self.registered = {}, {}

    def module_exists(self, name):
        return True

    def register_model(self, arch, target):
        self.registered[arch] = target


def test_the_plugin_reads_the_knobs_and_refuses_bad_ones(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32"}')
    argv = ["vllm", "serve", str(tmp_path)]
    env = {"DSA_ROUTE": "baseline", ENV_KNOBS: "compilation_mode=NONE"}
    line, _ = plugin.apply(env, argv, _Probe)
    assert "compilation_mode=NONE" in line and 'knobs={"compilation_mode":"NONE"}' in line
    line, _ = plugin.apply({"DSA_ROUTE": "baseline", ENV_KNOBS: "turbo=on"}, argv, _Probe)
    assert "route=invalid" in line and "unknown knob 'turbo'" in line
