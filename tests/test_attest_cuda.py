"""harness.attest on CUDA server logs of each GPU arm (tests/fixtures/logs/cuda_*.log, see the README there).

The fixtures are synthetic (no GPU here) but every line is an installed-vLLM format string at the file:line its log
prefix names, filled with the arm's configuration as vLLM's own config code resolved it on a simulated CUDA node
(tests/fixtures/make_cuda_logs.py). ``test_fixture_lines_are_still_vllms`` fails when vLLM moves or rewords them.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from harness.run import plan as plan_mod
from harness.run.attest import attest, observe_from_log
from harness.rundir.schema import Observation
from harness.run.machine import Machine
from harness.run.models import locate
from harness.run.scenario import load_scenario

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "logs"
ARMS = [("glm-5.2-nvfp4-tp4", "glm", "baseline"), ("glm-5.2-nvfp4-tp4", "glm", "candidate"),
        ("deepseek-v3.2-fp8-tp8", "dsv32", "baseline"), ("deepseek-v3.2-fp8-tp8", "dsv32", "candidate")]


def intended(name: str, route: str) -> dict:
    """The arm's intended path from the plan on a CUDA node (what `dsa-bench compare` attests against)."""
    scenario = load_scenario(name)
    machine = Machine(name="cuda", device="planned", cpu_count=16, gpu_count=scenario.serve.tensor_parallel_size,
                      has_triton=True)
    return next(a for a in plan_mod.build_plan(scenario, machine, locate(scenario)).arms if a.route == route).intended


def observed(short: str, label: str) -> Observation:
    return observe_from_log((LOGS / f"cuda_{short}_{label}.log").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name, short, route", ARMS)
def test_each_cuda_arm_log_attests_valid(name, short, route):
    assert attest(intended(name, route), observed(short, route)) == {"valid": True, "mismatches": [],
                                                                     "not_observed": []}


@pytest.mark.parametrize("name, short", [("glm-5.2-nvfp4-tp4", "glm"), ("deepseek-v3.2-fp8-tp8", "dsv32")])
def test_swapped_cuda_logs_attest_invalid(name, short):
    as_candidate = attest(intended(name, "candidate"), observed(short, "baseline"))
    assert not as_candidate["valid"]
    assert [m.split(":")[0] for m in as_candidate["mismatches"]] == [
        "route", "model_runner", "compilation_mode", "breakable_cudagraph"]
    as_baseline = attest(intended(name, "baseline"), observed(short, "candidate"))
    assert as_baseline["mismatches"] == [
        "route: intended 'baseline', observed 'candidate'", "model_runner: intended 'v1', observed 'v2'",
        "compilation_mode: intended 'VLLM_COMPILE', observed 'NONE'",
        "breakable_cudagraph: intended False, observed True"]


def test_cuda_only_lines_are_parsed():
    cand, base = observed("glm", "candidate"), observed("glm", "baseline")
    assert "gpu_worker.py" in cand.model_runner_evidence and "Using V2 Model Runner" in cand.model_runner_evidence
    assert "gpu_model_runner.py" in base.model_runner_evidence  # MRV1's capture line
    assert cand.breakable_wrapper is True and base.breakable_wrapper is False
    assert cand.attention_backends == ("FLASHINFER_MLA_SPARSE",)  # SM100, fp8 KV: FlashInfer before FlashMLA
    assert observed("dsv32", "candidate").attention_backends == ("FLASH_ATTN_MLA_SPARSE",)  # SM90
    sizes = cand.cudagraph_capture_sizes
    assert sizes and list(sizes) == sorted(sizes) and sizes[0] == 1
    assert (cand.graph_capture_s, cand.graph_capture_gib) == (14.0, 1.37)
    assert base.compiled is True and cand.compiled is None
    assert cand.kv_cache_dtype == "fp8_e4m3"  # vLLM's own choice for GLM on SM10x
    assert cand.dsa_route_consistent is True and cand.dsa_route_lines == 6  # API server, engine, 4 workers


def test_vllm_deciding_by_itself_auto_enables_breakable_graphs():
    off = observed("glm", "off")
    assert off.route == "off" and off.breakable_auto_enabled is True
    assert (off.model_runner, off.compilation_mode, off.breakable_cudagraph) == ("v2", "NONE", True)
    result = attest(intended("glm-5.2-nvfp4-tp4", "candidate"), off)
    assert result["mismatches"] == ["route: intended 'candidate', observed 'off'"]


def _generator():
    spec = importlib.util.spec_from_file_location("make_cuda_logs", FIXTURES / "make_cuda_logs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fixture_lines_are_still_vllms():
    """Each [file:line] in the fixtures is where the installed vLLM logs that format string."""
    vllm = pytest.importorskip("vllm")
    make = _generator()
    vllm_dir = Path(vllm.__file__).parent
    cited = {f"[{make.logged_at(vllm_dir, rel, fmt)}]": fmt for rel, fmt in make.LINES.values()}
    seen = 0
    for log in sorted(LOGS.glob("cuda_*.log")):
        for line in log.read_text(encoding="utf-8").splitlines():
            if (m := re.search(r"\[[\w.]+\.py:\d+\] ", line)) is None:
                continue
            where = m.group(0).strip()
            assert where in cited, f"{log.name}: {where} is not where vLLM {vllm.__version__} logs it: {line[:120]}"
            fmt = cited[where].removeprefix('message: str = "').removesuffix('"')
            pattern = re.escape(fmt).replace("%s", ".*").replace(r"%\.0f", r"[\d.]+").replace(r"%\.2f", r"[\d.]+")
            assert re.search(pattern, line[m.end():]), f"{log.name}: {line[:120]} is not {fmt!r}"
            seen += 1
    assert seen > 50
