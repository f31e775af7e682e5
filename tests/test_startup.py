"""Start-up metrics from the server's own log lines: real vLLM CPU logs, the CUDA fixtures, and lines formatted from
the installed vLLM's own format strings."""

import ast
from pathlib import Path

import pytest

from harness.run.startup import FIELDS, startup_from_log

LOGS = Path(__file__).parent / "fixtures" / "logs"


def test_cpu_logs_compiled_arm_spends_its_start_compiling_and_the_eager_arm_does_not():
    compiled = startup_from_log((LOGS / "cpu-baseline.log").read_text())
    eager = startup_from_log((LOGS / "cpu-candidate.log").read_text())
    assert compiled["compile_s"] == 82.0            # 22:56:06 "Warming up model for the compilation..." → 22:57:28
    assert eager["compile_s"] is None
    assert compiled["engine_init_s"] == 82.73 and eager["engine_init_s"] == 3.34
    assert compiled["kv_cache_tokens"] == eager["kv_cache_tokens"] == 233008
    assert compiled["kv_cache_gib"] == 1.0 and compiled["model_init_s"] == pytest.approx(0.313071, abs=1e-3)
    assert compiled["api_server_s"] > eager["api_server_s"]
    assert compiled["graph_capture_s"] is None and compiled["weights_s"] is None   # no such lines on CPU


def test_cuda_fixtures_give_compile_and_graph_capture_per_slowest_worker():
    baseline = startup_from_log((LOGS / "cuda_dsv32_baseline.log").read_text())
    candidate = startup_from_log((LOGS / "cuda_dsv32_candidate.log").read_text())
    assert baseline["compile_s"] == 58.12 and candidate["compile_s"] is None
    assert baseline["graph_capture_s"] == candidate["graph_capture_s"] == 14.0
    assert baseline["graph_memory_gib"] == 1.37


def _installed_format(relative: str, start: str) -> str:
    """The format string in the installed vLLM's ``relative`` source that starts with ``start`` (adjacent literals
    are one constant in the AST)."""
    vllm = pytest.importorskip("vllm")
    tree = ast.parse((Path(vllm.__file__).parent / relative).read_text())
    found = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value.startswith(start)]
    assert found, f"vLLM internals changed: {relative} has no {start!r} line"
    return min(found, key=len)


def test_lines_formatted_from_the_installed_vllm_strings_parse():
    lines = {
        "v1/worker/gpu/model_runner.py": ("Model loading took", ("71.25", 123.456789)),
        "model_executor/model_loader/default_loader.py": ("Loading weights took", (98.76,)),
        "v1/worker/gpu_worker.py": ("Available KV cache memory", ("40.5",)),
        "v1/core/kv_cache_utils.py": ("%s KV cache size", ("GPU", "1,234,567", "8,192", 150.7)),
        "v1/engine/core.py": ("init engine (profile, create kv cache, warmup model) took", (321.0,)),
        "compilation/monitor.py": ("%storch.compile took", ("[backbone] ", 58.1)),
    }
    text = []
    for pid, (relative, (start, args)) in enumerate(lines.items()):
        fmt = _installed_format(relative, start)
        text.append(f"(Worker_TP0 pid={pid}) INFO 08-20 10:00:0{pid} [x.py:1] " + fmt % args)
    parsed = startup_from_log("\n".join(text))
    assert parsed["model_load_s"] == pytest.approx(123.456789, abs=1e-3) and parsed["model_load_gib"] == 71.25
    assert parsed["weights_s"] == 98.76 and parsed["kv_cache_gib"] == 40.5
    assert parsed["kv_cache_tokens"] == 1234567 and parsed["engine_init_s"] == 321.0
    assert parsed["compile_s"] == 58.1
    assert set(parsed) == set(FIELDS)


def test_tensor_parallel_workers_keep_the_slowest_and_sum_per_process():
    log = "\n".join([
        "(Worker_TP0 pid=1) INFO 08-20 10:00:01 [monitor.py:20] [backbone] torch.compile took 10.00 s in total",
        "(Worker_TP0 pid=1) INFO 08-20 10:00:02 [monitor.py:20] [eagle_head] torch.compile took 2.00 s in total",
        "(Worker_TP1 pid=2) INFO 08-20 10:00:03 [monitor.py:20] [backbone] torch.compile took 11.00 s in total",
    ])
    assert startup_from_log(log)["compile_s"] == 12.0


def test_nvidia_smi_compute_apps_are_summed_per_pid():
    from harness.run.procs import gpu_mib_by_pid

    text = "1234, 70000\n1234, 69000\n999, 10\n[Not Supported], x\n"
    assert gpu_mib_by_pid(text) == {1234: 139000.0, 999: 10.0}
