"""The embedded CPU default can see a broken DSA path (slow: real vLLM servers): `dsa-bench compare --gate
--inject-candidate topk-random` on cpu-tiny-dsa (the trained arithmetic checkpoint) — the candidate attends to random
keys instead of the indexer's top-k, so the gate FAILs the accuracy cell (exit code 1) and parity drops below 50 %."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.rundir import schema

REPO = Path(__file__).resolve().parent.parent
DSA_BENCH = Path(sys.executable).parent / "dsa-bench"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    # One short load level (the load sweep is not what this test is about); GSM8K and parity as the default runs them
    # but on 64 questions: a ≈ 50-point loss FAILs there too.
    proc = subprocess.run([str(DSA_BENCH), "compare", "--gate", "--concurrency", "1", "--num-prompts", "8",
                           "--repeats", "1", "--gsm8k-limit", "64", "--inject-candidate", "topk-random",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=1500)
    (run_dir,) = list(out.iterdir())
    return proc, run_dir


def test_the_gate_fails_the_accuracy_cell(run):
    proc, run_dir = run
    assert proc.returncode == 1, proc.stderr[-4000:]
    verdict = json.loads((run_dir / schema.VERDICT).read_text())
    assert verdict["overall"] == "FAIL" and verdict["exit_code"] == 1
    cell = next(c for c in verdict["cells"] if c["metric"] == "gsm8k_accuracy")
    assert cell["result"] == "FAIL" and cell["delta"] <= -15


def test_parity_drops_below_half_and_the_run_names_task_and_injection(run):
    _, run_dir = run
    parity = json.loads((run_dir / schema.PARITY).read_text())
    assert parity["prompts_total"] == 64 and parity["exact_match_rate_pct"] < 50     # 32 short + 32 long prompts
    arms = {arm["name"]: arm for arm in json.loads((run_dir / schema.MANIFEST).read_text())["arms"]}
    assert arms["candidate"]["injection"]["kind"] == "topk-random" and arms["baseline"]["injection"] is None
    summary = json.loads((run_dir / schema.ACCURACY_SUMMARY).read_text())
    assert summary["arms"]["baseline"]["data"].startswith("tiny-arith:")
    html = (run_dir / schema.REPORT).read_text()
    assert "tiny-arith" in html and "injected: topk-random" in html
