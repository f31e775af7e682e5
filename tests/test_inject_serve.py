"""A calibration injection on a real vLLM CPU server (slow): `dsa-bench compare --inject-candidate step-delay:50` on
cpu-tiny-dsa — the plugin states it, attestation accepts it, the manifest and the report name it, and the candidate's
steps really sleep."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.rundir import schema

REPO = Path(__file__).resolve().parent.parent
DSA_BENCH = Path(sys.executable).parent / "dsa-bench"
DELAY_MS = 50

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    proc = subprocess.run([str(DSA_BENCH), "compare", "--scenario", "cpu-tiny-dsa", "--concurrency", "4",
                           "--num-prompts", "8", "--repeats", "1", "--no-gsm8k",
                           "--inject-candidate", f"step-delay:{DELAY_MS}", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = list(out.iterdir())
    return run


def test_manifest_records_and_attests_the_candidates_injection(run_dir):
    arms = {arm["name"]: arm for arm in json.loads((run_dir / schema.MANIFEST).read_text())["arms"]}
    base, cand = arms["baseline"], arms["candidate"]
    assert cand["injection"] == {"kind": "step-delay", "params": {"ms": float(DELAY_MS)}} and base["injection"] is None
    assert cand["intended"]["injection"] == f"step-delay:{DELAY_MS}" and cand["observed"]["injection"] == (
        f"step-delay:{DELAY_MS}")
    assert cand["observed"]["injection_applied"] == f"step-delay:{DELAY_MS}"  # the model class's own line
    assert base["observed"]["injection"] is None and base["observed"]["injection_applied"] is None
    assert base["attestation"]["valid"] and cand["attestation"]["valid"]
    assert "injected: step-delay ms=50" in (run_dir / schema.REPORT).read_text()


def test_the_candidates_steps_sleep(run_dir):
    """Every real engine step of the candidate sleeps DELAY_MS, and an MTP step (k = 1) yields at most 2 tokens per
    request, so its TPOT cannot be below DELAY_MS / 2 (a lower bound from the sleep, not a timing race)."""
    levels = pd.read_csv(run_dir / schema.LEVELS).set_index("arm")
    assert levels.loc["candidate", "median_tpot_ms"] >= 0.9 * DELAY_MS / 2
