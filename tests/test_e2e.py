"""End to end on real vLLM (slow): `dsa-bench compare` on cpu-tiny with two levels and few prompts."""

import json
import os
import subprocess
import uuid
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.rundir import schema
from harness.run.accuracy import DEFAULT_DATA_DIR
from fakes.support import tagged_processes

REPO = Path(__file__).resolve().parent.parent
DSA_BENCH = Path(sys.executable).parent / "dsa-bench"

pytestmark = pytest.mark.slow
# GSM8K comes from ../shared/data/gsm8k (harness.run.accuracy.DEFAULT_DATA_DIR); without it the run skips GSM8K.
NEEDS_GSM8K = pytest.mark.skipif(not (DEFAULT_DATA_DIR / "test.jsonl").is_file(),
                                 reason=f"no GSM8K data at {DEFAULT_DATA_DIR}")
TAG = uuid.uuid4().hex


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    env = {**os.environ, "DSA_FAULT_TEST_TAG": TAG}   # inherited by every process the run starts
    proc = subprocess.run([str(DSA_BENCH), "compare", "--scenario", "cpu-tiny", "--concurrency", "1,4",
                           "--num-prompts", "8", "--repeats", "2", "--gsm8k-limit", "2", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=1500, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = list(out.iterdir())
    return run


def test_run_dir_has_both_arms_with_throughput(run_dir):
    levels = pd.read_csv(run_dir / schema.LEVELS)
    assert sorted(levels["arm"].unique()) == ["baseline", "candidate"]
    assert sorted(levels["concurrency"].unique()) == [1, 4] and sorted(levels["round"].unique()) == [0, 1]
    assert (levels["output_throughput"] > 0).all() and (levels["failed"] == 0).all()
    assert (levels["completed"] == 8).all()
    requests = pd.read_csv(run_dir / schema.REQUESTS)
    assert len(requests) == 8 * 8 and requests["tpot_ms"].notna().all()
    assert len(list((run_dir / schema.RAW_DIR).glob("*.json"))) == 8


def test_mtp_acceptance_is_the_known_answer(run_dir):
    """cpu-tiny serves the repeat-last checkpoint: every draft is accepted (acceptance length 1 + 1 = 2)."""
    levels = pd.read_csv(run_dir / schema.LEVELS)
    assert (levels["spec_drafts"] > 0).all()
    assert (levels["acceptance_rate"] == 1.0).all() and (levels["acceptance_length"] == 2.0).all()


@NEEDS_GSM8K
def test_gsm8k_and_parity_ran_on_both_arms(run_dir):
    accuracy = pd.read_csv(run_dir / "accuracy.csv")
    assert sorted(accuracy["arm"].unique()) == ["baseline", "candidate"]
    assert set(accuracy["filter"]) == {"strict-match", "flexible-extract"}
    assert len(accuracy) == 2 * 2 * 2   # arms × filters × questions
    summary = json.loads((run_dir / "accuracy" / "summary.json").read_text())
    assert summary["status"] == "done" and summary["paired"]
    parity = json.loads((run_dir / "parity.json").read_text())
    assert parity["prompts_total"] == 16 and 0 <= parity["exact_match_rate_pct"] <= 100


def test_manifest_records_commands_versions_and_the_paths(run_dir):
    manifest = json.loads((run_dir / schema.MANIFEST).read_text())
    assert manifest["status"] == "done" and manifest["versions"]["vllm"]
    arms = {arm["name"]: arm for arm in manifest["arms"]}
    base, cand = arms["baseline"], arms["candidate"]
    assert base["server_command"] != cand["server_command"]
    assert all(level["status"] == "done" for arm in (base, cand) for level in arm["levels"].values())
    assert base["attestation"]["valid"] and cand["attestation"]["valid"]
    assert base["observed"] and cand["observed"]
    timing = manifest["timing"]
    assert 0 <= timing["harness_overhead_s"] < timing["wall_s"]
    assert (run_dir / schema.LOGS_DIR / "baseline-server.log").stat().st_size > 0


def test_report_and_verdict_render(run_dir):
    html = (run_dir / schema.REPORT).read_text()
    assert "<table" in html and "data:image/png;base64," in html
    assert "baseline" in html and "candidate" in html
    assert ("McNemar" in html) == (DEFAULT_DATA_DIR / "test.jsonl").is_file()  # GSM8K's paired test, when it ran
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["overall"] in ("PASS", "FAIL", "INCONCLUSIVE", "INVALID") and verdict["cells"]
    assert (run_dir / "summary.md").read_text().startswith("### ")


def test_no_process_left_running(run_dir):
    """Servers, engine cores, workers, the benchmark client and lm-eval: none outlives the run."""
    assert tagged_processes(TAG) == []
