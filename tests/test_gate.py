"""harness.gate: run dir in; verdict.json, summary.md, dashboard JSON and exit code out; never PASS on bad data."""

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from harness import gate
from harness.judge.policy import GatePolicy, Status

QUIET_SESSIONS = 8   # sessions per arm of the synthetic quiet-machine pool's A/A runs (tests/fixtures/recorded/run)
from harness.rundir import store
from harness.rundir.store import RunDirError
from harness.rundir.schema import LevelKey

_SPEC = importlib.util.spec_from_file_location(
    "aa_split", Path(__file__).parent / "fixtures" / "recorded" / "aa_split.py")
aa = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(aa)

PERF = GatePolicy(primary=("output_throughput", "mean_tpot_ms"))
PERF_TOML = 'primary = ["output_throughput", "mean_tpot_ms"]\n'


def _run_dir(tmp_path, name="run", policy_fields=None, accuracy=None, **effect):
    manifest, levels, requests = aa.aa_run(QUIET_SESSIONS, **effect)
    if policy_fields is not None:
        manifest["scenario"]["gate"] = policy_fields
    return aa.write_run(tmp_path / name, manifest, levels, requests, accuracy)


def _strict_json(path):
    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token}")
    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.fixture(scope="module")
def passed(tmp_path_factory):
    run_dir = _run_dir(tmp_path_factory.mktemp("aa"), identical=True)
    return gate.run_gate(run_dir, PERF)


def test_aa_run_passes_and_writes_everything(passed):
    assert passed.status == Status.PASS and gate.exit_code(passed) == 0
    assert {p.name for p in passed.written} == {gate.VERDICT, gate.SUMMARY, gate.PYTORCH_JSON}
    assert not passed.write_errors


def test_verdict_json_schema(passed):
    document = _strict_json(passed.run_dir / gate.VERDICT)
    assert document["schema_version"] == gate.VERDICT_SCHEMA_VERSION and document["kind"] == "dsa-bench.verdict"
    assert document["overall"] == "PASS" and document["exit_code"] == 0 and document["policy_source"] == "argument"
    assert GatePolicy.model_validate(document["policy_fields"]) == PERF
    primary = document["cells"]
    assert len(primary) == 8 and all(c["primary"] and c["result"] == "PASS" for c in primary)
    for cell in primary:                                   # the keys the HTML report reads
        for key in ("concurrency", "metric", "delta_pct", "ci_low_pct", "ci_high_pct", "margin_pct", "result",
                    "note"):
            assert key in cell
        assert cell["ci_low_pct"] <= cell["delta_pct"] <= cell["ci_high_pct"]
    diagnostics = document["diagnostics"]
    assert diagnostics and all(not c["primary"] and c["result"] is None for c in diagnostics)


def test_summary_is_a_pr_comment(passed):
    text = (passed.run_dir / gate.SUMMARY).read_text()
    assert text.startswith("### ✅ dsa-bench gate: **PASS**")
    assert "| Conc. | Output tok/s base | cand | Δ tput [CI] | Mean TPOT ms base | cand | Δ TPOT [CI] |" in text
    assert text.count("| ✅ PASS |") == 4
    assert len(text) < 10_000


def test_summary_table_shows_the_gated_tpot(tmp_path):
    """With the server's mean TPOT gated (the CPU default's [gate] primary), the level table shows that TPOT and
    names it, and it is not listed a second time among the "other primary cells"."""
    manifest, levels, requests = aa.aa_run(QUIET_SESSIONS, identical=True)
    levels["server_mean_tpot_ms"] = levels["mean_tpot_ms"] * 1.5
    run_dir = aa.write_run(tmp_path / "run", manifest, levels, requests)
    result = gate.run_gate(run_dir, GatePolicy(primary=("output_throughput", "server_mean_tpot_ms")))
    text = (run_dir / gate.SUMMARY).read_text()
    assert "| Server mean TPOT ms base | cand | Δ TPOT [CI] |" in text
    first = next(c for c in result.document["cells"] if c["metric"] == "server_mean_tpot_ms")
    assert f"| {first['baseline']:.2f} |" in text
    assert "Other primary cells" not in text


def _vllm_converter():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "benchmarks" / "lib" / "utils.py"
    if not path.exists():
        pytest.skip(f"{path} not found")
    module_spec = importlib.util.spec_from_file_location("vllm_bench_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)                  # the file imports only the standard library
    return module.convert_to_pytorch_benchmark_format


def test_pytorch_json_has_vllms_record_shape(passed, monkeypatch):
    records = _strict_json(passed.run_dir / gate.PYTORCH_JSON)
    assert len({(r["metric"]["extra_info"]["arm"], r["metric"]["extra_info"]["concurrency"]) for r in records}) == 8
    ours = next(r for r in records if r["metric"]["name"] == "output_throughput")
    convert = _vllm_converter()
    monkeypatch.setenv("SAVE_TO_PYTORCH_BENCHMARK_FORMAT", "1")
    import argparse
    theirs = convert(argparse.Namespace(**ours["benchmark"]["extra_info"]["args"]),
                     {"output_throughput": ours["metric"]["benchmark_values"]}, ours["metric"]["extra_info"])[0]

    def shape(record):
        return {k: shape(v) if isinstance(v, dict) and k != "args" and k != "extra_info" or k == "benchmark"
                else type(v).__name__ for k, v in record.items()}

    assert shape(ours) == shape(theirs)
    assert set(ours["benchmark"]["extra_info"]) == set(theirs["benchmark"]["extra_info"])
    assert ours["metric"]["benchmark_values"] == [pytest.approx(sum(
        ours["metric"]["extra_info"]["repeat_values"]) / QUIET_SESSIONS)]


def test_regression_fails_with_exit_1(tmp_path):
    result = gate.run_gate(_run_dir(tmp_path, first_pair=4, throughput_factor=0.90), PERF)
    assert result.status == Status.FAIL and gate.exit_code(result) == 1
    assert "beyond the margin" in result.reason
    assert (tmp_path / "run" / gate.SUMMARY).read_text().startswith("### ❌ dsa-bench gate: **FAIL**")


def test_exit_codes():
    assert [gate.exit_code(s) for s in ("PASS", "FAIL", "INCONCLUSIVE", "INVALID")] == [0, 1, 3, 4]
    assert gate.exit_code(Status.INVALID) == 4


def test_policy_comes_from_the_manifest_when_not_given(tmp_path):
    run_dir = _run_dir(tmp_path, policy_fields={"primary": ["output_throughput"], "margins": {
        "output_throughput": -5.0}})
    result = gate.run_gate(run_dir)
    assert result.policy_source == "manifest" and result.policy.margin("output_throughput") == -5.0
    assert {c.metric for c in result.verdict.primary} == {"output_throughput"}
    assert result.status in (Status.PASS, Status.INCONCLUSIVE)
    default = gate.run_gate(_run_dir(tmp_path, "default", policy_fields={}), write=False)
    assert default.policy == GatePolicy() and default.status == Status.INVALID   # GSM8K and MTP data absent


def test_load_policy_reads_a_gate_table_or_top_level_fields(tmp_path):
    flat = tmp_path / "flat.toml"
    flat.write_text(PERF_TOML + "alpha = 0.01\n[margins]\nmean_tpot_ms = 5.0\n")
    scenario = tmp_path / "scenario.toml"
    scenario.write_text('name = "x"\n[gate]\n' + PERF_TOML)
    assert gate.load_policy(flat).alpha == 0.01 and gate.load_policy(flat).margin("mean_tpot_ms") == 5.0
    assert gate.load_policy(scenario) == PERF
    bad = tmp_path / "bad.toml"
    bad.write_text("primary = [\n")
    with pytest.raises(gate.PolicyError, match="not valid TOML"):
        gate.load_policy(bad)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("[margins]\noutput_throughput = 3.0\n")
    with pytest.raises(gate.PolicyError, match=r"wrong.toml: gate\..*must be ≤ 0"):
        gate.load_policy(wrong)
    with pytest.raises(gate.PolicyError, match="cannot read"):
        gate.load_policy(tmp_path / "missing.toml")


def test_missing_run_dir_or_manifest_raises(tmp_path):
    with pytest.raises(RunDirError, match="no such run directory"):
        gate.run_gate(tmp_path / "nope")
    with pytest.raises(RunDirError, match="manifest.json"):
        gate.run_gate(tmp_path)


def test_corrupted_levels_csv_is_invalid_and_still_reported(tmp_path):
    run_dir = _run_dir(tmp_path)
    (run_dir / "levels.csv").write_text("arm,concurrency\n\"unterminated\n")
    result = gate.run_gate(run_dir, PERF)
    assert result.status == Status.INVALID and gate.exit_code(result) == 4
    assert "levels.csv" in result.reason
    assert _strict_json(run_dir / gate.VERDICT)["overall"] == "INVALID"
    assert "could not be read" in (run_dir / gate.SUMMARY).read_text()


def test_non_numeric_keys_are_invalid(tmp_path):
    run_dir = _run_dir(tmp_path)
    frame = pd.read_csv(run_dir / "levels.csv")
    frame["concurrency"] = frame["concurrency"].astype(str)
    frame.loc[0, "concurrency"] = "eight"
    frame.to_csv(run_dir / "levels.csv", index=False)
    result = gate.run_gate(run_dir, PERF, write=False)
    assert result.status == Status.INVALID and "non-numeric concurrency" in result.reason


def test_text_in_a_request_column_is_invalid(tmp_path):
    run_dir = _run_dir(tmp_path)
    frame = pd.read_csv(run_dir / "requests.csv")
    frame["ttft_ms"] = frame["ttft_ms"].astype(str)
    frame.loc[5, "ttft_ms"] = "oops"
    frame.to_csv(run_dir / "requests.csv", index=False)
    result = gate.run_gate(run_dir, PERF, write=False)
    assert result.status == Status.INVALID and "requests.csv: non-numeric ttft_ms" in result.reason


def test_partial_run_is_invalid_never_pass(tmp_path):
    """A run interrupted before the candidate's last level: the missing cells make it INVALID."""
    manifest, levels, requests = aa.aa_run(QUIET_SESSIONS)
    manifest["status"] = "interrupted"
    for key in [k for k in aa.arm(manifest, "candidate")["levels"] if LevelKey.parse(k).concurrency == 8]:
        del aa.arm(manifest, "candidate")["levels"][key]
    keep = ~((levels["arm"] == "candidate") & (levels["concurrency"] == 8))
    keep_requests = ~((requests["arm"] == "candidate") & (requests["concurrency"] == 8))
    run_dir = aa.write_run(tmp_path / "partial", manifest, levels[keep], requests[keep_requests])
    result = gate.run_gate(run_dir, PERF)
    assert result.status == Status.INVALID
    invalid = {(c.metric, c.level.concurrency) for c in result.verdict.primary if c.status == Status.INVALID}
    assert invalid == {("output_throughput", 8), ("mean_tpot_ms", 8)}
    assert any("interrupted" in n for n in result.verdict.notes)


def test_run_with_no_levels_yet_is_invalid(tmp_path):
    manifest, _, _ = aa.aa_run(2)
    manifest["status"] = "running"
    for arm in manifest["arms"]:
        arm["levels"] = {}
    manifest["scenario"]["workload"].pop("concurrency")
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    result = gate.run_gate(run_dir, PERF)
    assert result.status == Status.INVALID and "no primary cells" in result.reason


def test_gsm8k_in_summary_and_report_section(tmp_path):
    rows = [{"arm": arm, "question_id": i, "filter": f, "correct": int(i % 20 != 0 or (arm == "baseline" and i == 0)),
             "extracted": "1"} for arm in ("baseline", "candidate") for i in range(400)
            for f in ("strict-match", "flexible-extract")]
    policy = GatePolicy(primary=("output_throughput", "mean_tpot_ms", "gsm8k_accuracy"))
    result = gate.run_gate(_run_dir(tmp_path, accuracy=pd.DataFrame(rows)), policy)
    text = result.summary
    assert "**GSM8K** (flexible-extract, n = 400)" in text and "McNemar exact p = 1" in text
    section = _strict_json(tmp_path / "run" / gate.VERDICT)["gsm8k"]
    assert section["paired"][0]["baseline_only"] == 1 and section["paired"][0]["candidate_only"] == 0
    assert [a["arm"] for a in section["arms"]] == ["baseline", "candidate"] and section["arms"][0]["n"] == 400


def test_github_step_summary_is_appended(tmp_path, monkeypatch):
    step = tmp_path / "step.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    result = gate.run_gate(_run_dir(tmp_path), PERF)
    assert step.read_text() == "earlier step\n" + result.summary + "\n"


def test_unwritable_run_dir_still_gives_a_verdict(tmp_path, monkeypatch):
    run_dir = _run_dir(tmp_path, identical=True)

    def refuse(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(store, "atomic_write_text", refuse)
    result = gate.run_gate(run_dir, PERF)
    assert result.status == Status.PASS and len(result.write_errors) == 3 and not result.written
    console = Console(record=True, width=200)
    gate.print_gate(result, console)
    assert "could not write" in console.export_text()


def test_dsa_bench_gate_prints_the_table_and_exits_with_the_verdict(tmp_path, capsys):
    from harness.cli import main

    run_dir = _run_dir(tmp_path, first_pair=4, throughput_factor=0.90)
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(PERF_TOML)
    assert main(["gate", str(run_dir), "--policy", str(policy_file)]) == 1
    out = capsys.readouterr().out
    assert "Output throughput" in out and "FAIL (exit 1)" in out and "wrote verdict.json" in out
    assert main(["gate", str(tmp_path / "missing")]) == 2
    policy_file.write_text("alpha = 2\n")
    assert main(["gate", str(run_dir), "--policy", str(policy_file)]) == 2
    assert "policy.toml: gate.alpha" in capsys.readouterr().err


def test_rows_relabelled_to_an_undeclared_level_make_the_run_invalid(tmp_path):
    """A hand-edited levels.csv / requests.csv whose rows are copied to a regime the scenario and manifest.json
    never declared (here 4096 tokens in, at c=1) is no level of the run: its cells are INVALID with a reason naming
    it, so the verdict is INVALID, never a PASS over a phantom level."""
    run_dir = _run_dir(tmp_path, identical=True)
    assert gate.run_gate(run_dir, PERF, write=False).status == Status.PASS
    for name in ("levels.csv", "requests.csv"):
        frame = pd.read_csv(run_dir / name)
        phantom = frame[frame["level"] == "random-i128-o32-c1"].assign(level="random-i4096-o32-c1")
        pd.concat([frame, phantom]).to_csv(run_dir / name, index=False)
    result = gate.run_gate(run_dir, PERF, write=False)
    assert result.status == Status.INVALID and gate.exit_code(result) == 4
    assert "random-i4096-o32-c1" in result.reason and "not declared" in result.reason, result.reason
    invalid = {str(c.level) for c in result.verdict.primary if c.status == Status.INVALID}
    assert invalid == {"random-i4096-o32-c1"}
