"""Plan ↔ vLLM's start-up refusals and the installed vLLM's own choice for ``route = "auto"`` arms."""

import re
from pathlib import Path

from harness.cli import main
from harness.run import plan as plan_mod
from harness.run.machine import detect
from harness.run.models import locate
from harness.run.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def _scenario_file(tmp_path: Path, arm_tables: str) -> Path:
    """cpu-tiny with its arm tables replaced by ``arm_tables``."""
    text = (SCENARIOS / "cpu-tiny.toml").read_text()
    text = re.sub(r"\[arms\.baseline\].*?(?=\[workload\])", arm_tables, text, flags=re.S)
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


MRV2_ON_CPU = """[arms.baseline]
route = "baseline"

[arms.candidate]
route = "candidate"
env = { VLLM_USE_V2_MODEL_RUNNER = "1" }

"""


def test_plan_warns_and_compare_refuses_an_env_vllm_would_not_start(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    path = _scenario_file(tmp_path, MRV2_ON_CPU)
    assert main(["plan", "--scenario", str(path), "--concurrency", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "warning: arm candidate: VLLM_USE_V2_MODEL_RUNNER=1 on cpu without Triton" in out
    assert "warning: arm baseline" not in out
    code = main(["compare", "--scenario", str(path), "--out", str(tmp_path / "results"), "--no-gsm8k"])
    err = capsys.readouterr().err
    assert code == 2 and "arm candidate: VLLM_USE_V2_MODEL_RUNNER=1" in err and err.count("\n") == 1
    assert not (tmp_path / "results").exists()


def test_auto_arm_asks_the_installed_vllm_and_pinned_arms_do_not(tmp_path, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    path = _scenario_file(tmp_path, '[arms.baseline]\nroute = "baseline"\n\n[arms.candidate]\nroute = "auto"\n\n')
    scenario = load_scenario(str(path), {}).effective()
    asked = []

    def ask(architecture, machine, env, draft_type):
        asked.append((architecture, machine.name, dict(env), draft_type))
        return {"vllm_version": "9.9", "model_runner": "v1", "breakable_cudagraph": False, "mtp_architecture": None,
                "refusal": None}

    built = plan_mod.build_plan(scenario, detect(), locate(scenario), ask)
    assert asked == [("DeepseekV3ForCausalLM", detect().name, {"VLLM_CPU_KVCACHE_SPACE": "1"}, "deepseek_v3")]
    auto = built.arms[1]
    assert any("the installed vLLM 9.9 chooses v1" in reason for reason in auto.decision.reasons)
    assert auto.refusals == () and built.arms[0].refusals == ()


def test_auto_arm_with_the_real_installed_vllm(tmp_path, monkeypatch):
    from harness.run.installed_vllm import auto_choice

    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    path = _scenario_file(tmp_path, '[arms.baseline]\nroute = "baseline"\n\n[arms.candidate]\nroute = "auto"\n\n')
    scenario = load_scenario(str(path), {}).effective()
    choice = auto_choice(scenario.model.architecture, detect(), dict(scenario.serve.env), "deepseek_v3")
    built = plan_mod.build_plan(scenario, detect(), locate(scenario), auto_choice)
    if choice is None:   # vLLM absent or another release: the snapshot decides
        assert not any("the installed vLLM" in r for r in built.arms[1].decision.reasons)
    else:
        assert built.arms[1].decision.model_runner == choice["model_runner"]
        assert any("the installed vLLM" in r for r in built.arms[1].decision.reasons)


def test_a_core_this_machine_does_not_offer_is_refused_before_anything_starts(tmp_path, capsys):
    import os

    import pytest

    missing = max(os.sched_getaffinity(0)) + 1
    scenario = load_scenario("cpu-tiny-dsa", {"cluster.arms.candidate": {"cpu_cores": str(missing)}}).effective()
    with pytest.raises(plan_mod.PlanError, match=rf"core\(s\) \[{missing}\].*--place-candidate cores=N"):
        plan_mod.check_machine(scenario, detect())
    assert main(["compare", "--place-candidate", f"cores={missing}", "--no-gsm8k", "--out", str(tmp_path)]) == 2
    assert "does not offer" in capsys.readouterr().err and list(tmp_path.iterdir()) == []
