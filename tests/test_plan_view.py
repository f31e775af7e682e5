"""``dsa-bench plan`` views (compact ≤ 60 lines, --verbose, --json) and the cost estimate."""

import json
from dataclasses import replace

import pytest

from harness.cli import main
from harness.run import estimate as estimate_mod
from harness.run import plan as plan_mod
from harness.run.models import locate
from harness.run.scenario import load_scenario

GPU = plan_mod.Machine(name="cuda", device="planned", cpu_count=16, gpu_count=8, has_triton=True)


def _plan(name: str, **workload) -> plan_mod.Plan:
    scenario = load_scenario(name, {f"workload.{k}": v for k, v in workload.items()}).effective()
    return plan_mod.build_plan(scenario, GPU, locate(scenario))


@pytest.mark.parametrize("name", ["glm-5.2-nvfp4-tp4", "deepseek-v3.2-fp8-tp8"])
def test_compact_plan_fits_60_lines_with_one_bench_template_and_an_estimate(capsys, name):
    assert main(["plan", "--scenario", name]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 60
    assert out.count("vllm serve ") == 2 and out.count("vllm bench serve") == 2   # one template per regime
    assert "--max-concurrency '<c>'" in out and "× rounds 0..7" in out
    # issue #26: the short (dense) and the long-context (sparse) levels in one grid and one estimate
    assert "tokens 1024→512 random: prompts per level c=1:32" in out and "tokens 32768→512 random" in out
    assert out.count("estimate: wall ") == 1 and "levels: 14 (regime × concurrency)" in out
    assert "estimate: wall " in out and "GPU-hours" in out and "prior: assumed" in out


def test_verbose_lists_every_level_and_json_everything(capsys):
    assert main(["plan", "--scenario", "glm-5.2-nvfp4-tp4", "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert verbose.count("  bench c=") == 2 * (11 + 3) * 8
    assert main(["plan", "--scenario", "glm-5.2-nvfp4-tp4", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document) >= {"scenario", "machine", "refusal", "notes", "arms", "levels", "estimate"}
    assert [arm["name"] for arm in document["arms"]] == ["baseline", "candidate"]
    assert {"server_argv", "server_env", "decision", "intended", "refusals"} <= set(document["arms"][0])
    assert len(document["levels"]) == (11 + 3) * 8 and set(document["levels"][0]["bench_argv"]) == {"baseline",
                                                                                                   "candidate"}
    assert {level["regime"] for level in document["levels"]} == {"random-i1024-o512", "random-i32768-o512"}
    assert {"wall_s", "gpu_hours", "gpus", "parts", "sessions", "prior"} <= set(document["estimate"])


def test_estimate_grows_with_repeats_and_levels_and_gpu_hours_follow_gpus_held():
    small = estimate_mod.estimate(_plan("glm-5.2-nvfp4-tp4", repeats=2, concurrency=[1, 2]))
    more_repeats = estimate_mod.estimate(_plan("glm-5.2-nvfp4-tp4", repeats=4, concurrency=[1, 2]))
    more_levels = estimate_mod.estimate(_plan("glm-5.2-nvfp4-tp4", repeats=2, concurrency=[1, 2, 64]))
    for bigger in (more_repeats, more_levels):
        assert bigger.wall_s[0] > small.wall_s[0] and bigger.wall_s[1] > small.wall_s[1]
    assert small.wall_s[0] < small.wall_s[1]
    assert small.gpus == 4 and small.sessions == 4
    assert small.gpu_hours[1] == pytest.approx(small.wall_s[1] * 4 / 3600, rel=1e-3)
    plan = _plan("glm-5.2-nvfp4-tp4", repeats=2, concurrency=[1, 2])
    both_up = replace(plan, scenario=plan.scenario.model_copy(
        update={"serve": plan.scenario.serve.model_copy(update={"concurrent_servers": True})}))
    assert estimate_mod.estimate(both_up).gpus == 8 and estimate_mod.estimate(both_up).sessions == 2


def test_estimate_counts_gsm8k_only_when_enabled():
    plan = _plan("glm-5.2-nvfp4-tp4", repeats=1, concurrency=[1])
    off = replace(plan, scenario=plan.scenario.model_copy(
        update={"accuracy": plan.scenario.accuracy.model_copy(update={"enabled": False})}))
    assert "GSM8K" in estimate_mod.estimate(plan).parts and "GSM8K" not in estimate_mod.estimate(off).parts


def test_compare_records_the_estimate_in_the_manifest_schema(tmp_path):
    from harness.run.runner import Runner, RunOptions
    from harness.rundir.store import RunDir

    plan = _plan("glm-5.2-nvfp4-tp4", repeats=1, concurrency=[1])
    runner = Runner(plan, tmp_path, RunOptions())
    runner._save()
    stored = RunDir(tmp_path).manifest().estimate
    assert stored is not None and stored.wall_s == estimate_mod.estimate(plan).wall_s and stored.gpus == 4
