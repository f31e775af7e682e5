"""The CLI: plan output, overrides, and bad input that ends with one line and exit 2 before anything starts."""

import os
import stat

import pytest

from harness.run import procs
from harness.cli import _overrides, build_parser, main
from harness.compare import default_scenario, exit_note


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_cpu_tiny_shows_both_arms_and_what_the_cpu_build_lacks(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path))
    code, out, _ = _run(capsys, "plan", "--scenario", "cpu-tiny", "--concurrency", "1,2", "--repeats", "1",
                        "--verbose")
    assert code == 0
    assert "== arm baseline (route=baseline) ==" in out and "== arm candidate (route=candidate) ==" in out
    assert out.count("vllm serve ") == 2 and out.count("bench c=") == 4
    assert "not available on this platform" in out
    assert "--max-concurrency 2" in out and "--ignore-eos" in out and "--save-detailed" in out


def test_plan_cpu_tiny_dsa_says_both_arms_use_dsa_routes_cpu_class(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path))
    code, out, _ = _run(capsys, "plan", "--scenario", "cpu-tiny-dsa", "--concurrency", "1", "--repeats", "1")
    assert code == 0
    assert "dsa_route's CPU implementation (dsa_route.vllm_cpu.model:DsaCpuForCausalLM)" in " ".join(out.split())


def test_plan_works_for_a_gpu_scenario_on_any_machine(capsys):
    code, out, _ = _run(capsys, "plan", "--scenario", "glm-5.2-nvfp4-tp4", "--verbose")
    assert code == 0
    assert "--tensor-parallel-size 4" in out and "--quantization modelopt_fp4" in out
    assert '"num_speculative_tokens":3' in out and "--max-concurrency 1024" in out


@pytest.mark.parametrize("flags,needle", [
    (["--tp", "4"], "--tp 4 requires a CUDA machine"),
    (["--quant", "nvfp4"], "--quant nvfp4 requires a CUDA machine"),
    (["--scenario", "glm-5.2-nvfp4-tp4"], "requires a CUDA machine"),
    (["--scenario", "nope"], "no such scenario"),
    (["--kv-cache-dtype", "fp8"], "CPU MLA backend"),
    (["--model", "/nonexistent/model"], "does not exist"),
    (["--input-len", "999999"], "exceeds model.max_model_len"),
])
def test_compare_refuses_bad_input_with_one_line_and_exit_2(capsys, tmp_path, flags, needle):
    from harness.run import machine

    if machine.detect().name == "cuda" and ("CUDA" in needle or "CPU" in needle):
        pytest.skip("this machine has CUDA")
    code, _, err = _run(capsys, "compare", "--out", str(tmp_path / "results"), *flags)
    assert code == 2
    assert err.startswith("dsa-bench compare: error: ") and needle in err and err.count("\n") == 1
    assert not (tmp_path / "results").exists() and procs.live_children() == []


def test_unwritable_results_dir_is_refused_before_any_server(capsys, tmp_path):
    if os.geteuid() == 0:  # root writes through permission bits: make the parent a regular file instead
        (tmp_path / "file").write_text("")
        out = tmp_path / "file" / "results"
    else:
        out = tmp_path / "ro"
        out.mkdir()
        out.chmod(stat.S_IRUSR | stat.S_IXUSR)
    code, _, err = _run(capsys, "compare", "--out", str(out))
    assert code == 2 and "cannot write results" in err and "--out" in err
    assert procs.live_children() == []


def test_report_and_gate_on_missing_run_dir_exit_2(capsys, tmp_path):
    for command in ("report", "gate"):
        code, _, err = _run(capsys, command, str(tmp_path / "missing"))
        assert code == 2 and "no such run directory" in err
        code, _, err = _run(capsys, command, str(tmp_path))
        assert code == 2 and "manifest.json" in err


def test_flags_map_to_scenario_keys():
    args = build_parser().parse_args(["compare", "--tp", "4", "--quant", "nvfp4", "--concurrency", "1,2,4",
                                      "--num-prompts", "10", "--no-mtp", "--model", "/m"])
    assert _overrides(args) == {
        "model.id": "/m", "serve.tensor_parallel_size": 4, "serve.quantization": "nvfp4",
        "workload.concurrency": [1, 2, 4], "mtp.num_speculative_tokens": 0,
        "workload.min_prompts": 10, "workload.prompts_per_concurrency": 1,
    }


def test_default_scenario_by_machine():
    assert default_scenario("cpu", None, None) == "cpu-tiny-dsa"
    assert default_scenario("cuda", 4, "nvfp4") == "glm-5.2-nvfp4-tp4"
    assert default_scenario("cuda", 8, "fp8") == "deepseek-v3.2-fp8-tp8"


@pytest.mark.parametrize("argv,needle", [
    (["plan", "--concurrency", "1,,2"], "'1,,2' is not a comma-separated list of positive integers"),
    (["plan", "--out", "x"], "unrecognized arguments: --out x"),   # no prefix-matching onto --output-len
    (["bogus"], "invalid choice: 'bogus'"),
])
def test_malformed_flags_are_one_line_usage_errors(capsys, argv, needle):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and needle in err and err.count("\n") == 1 and "--help)" in err


def test_resume_of_a_finished_run_changes_nothing(tmp_path, capsys):
    import shutil
    from pathlib import Path

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "fixtures" / "run_dir", run_dir)
    before = (run_dir / "manifest.json").read_bytes()
    assert main(["compare", "--resume", str(run_dir)]) == 0
    assert "nothing to resume" in capsys.readouterr().err
    assert (run_dir / "manifest.json").read_bytes() == before


def test_compare_without_gate_says_which_exit_code_it_returns(tmp_path):
    note = exit_note(False, 0, 3, tmp_path)
    assert note.startswith("dsa-bench compare exits 0 (every level done)") and f"dsa-bench gate {tmp_path}" in note
    assert "exits 1 (not every level done)" in exit_note(False, 1, 0, tmp_path)
    assert exit_note(True, 0, 3, tmp_path) is None and exit_note(False, 0, 0, tmp_path) is None
