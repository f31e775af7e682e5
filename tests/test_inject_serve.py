"""A calibration injection on real vLLM CPU servers (slow): tests/conftest.py's ``slowed_duet_run``, `dsa-bench compare
--inject-candidate step-delay:50` on cpu-tiny-dsa — the plugin states it, attestation accepts it, the manifest and the
report name it, and the candidate's steps really sleep."""

import json

import pandas as pd
import pytest

from real_runs import STEP_DELAY_MS
from harness.rundir import schema

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def test_manifest_records_and_attests_the_candidates_injection(slowed_duet_run):
    run_dir = slowed_duet_run.run_dir
    arms = {arm["name"]: arm for arm in json.loads((run_dir / schema.MANIFEST).read_text())["arms"]}
    base, cand = arms["baseline"], arms["candidate"]
    injection = f"step-delay:{STEP_DELAY_MS}"
    assert cand["injection"] == {"kind": "step-delay", "params": {"ms": float(STEP_DELAY_MS)}}
    assert base["injection"] is None
    assert cand["intended"]["injection"] == injection and cand["observed"]["injection"] == injection
    assert cand["observed"]["injection_applied"] == injection  # the model class's own line
    assert base["observed"]["injection"] is None and base["observed"]["injection_applied"] is None
    assert base["attestation"]["valid"] and cand["attestation"]["valid"]
    assert f"injected: step-delay ms={STEP_DELAY_MS}" in (run_dir / schema.REPORT).read_text()


def test_the_candidates_steps_sleep(slowed_duet_run):
    """Every real engine step of the candidate sleeps STEP_DELAY_MS, and an MTP step (k = 1) yields at most 2 tokens
    per request, so its TPOT cannot be below STEP_DELAY_MS / 2 (a lower bound from the sleep, not a timing race)."""
    levels = pd.read_csv(slowed_duet_run.run_dir / schema.LEVELS)
    candidate = levels[levels["arm"] == "candidate"]
    assert len(candidate) == 3 and (candidate["median_tpot_ms"] >= 0.9 * STEP_DELAY_MS / 2).all()
