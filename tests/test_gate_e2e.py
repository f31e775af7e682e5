"""The gate on real vLLM CPU runs (slow): an A/A run never FAILs; a deliberately slowed candidate FAILs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DSA_BENCH = Path(sys.executable).parent / "dsa-bench"
SCENARIOS = Path(__file__).parent / "fixtures" / "gate_scenarios"

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def _compare_with_gate(scenario: str, out: Path) -> tuple[int, dict]:
    proc = subprocess.run([str(DSA_BENCH), "compare", "--scenario", str(SCENARIOS / f"{scenario}.toml"),
                           "--out", str(out), "--gate"], cwd=REPO, capture_output=True, text=True, timeout=1500)
    (run_dir,) = list(out.iterdir())
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == proc.returncode, proc.stderr[-3000:]
    return proc.returncode, verdict


def test_aa_run_is_never_fail(tmp_path):
    """Never FAIL. INVALID only from the coalesced-stream check on latency cells: vLLM CPU streams a share of these
    tiny requests' outputs in one burst (TTFT ≈ E2EL), so their TPOT is not a per-token figure."""
    code, verdict = _compare_with_gate("cpu-aa", tmp_path)
    assert verdict["overall"] in ("PASS", "INCONCLUSIVE", "INVALID"), verdict["reason"]
    assert code in (0, 3, 4)
    assert {cell["metric"] for cell in verdict["cells"]} == {"output_throughput", "mean_tpot_ms"}
    invalid = [cell for cell in verdict["cells"] if cell["result"] == "INVALID"]
    assert all(cell["metric"] == "mean_tpot_ms" for cell in invalid), verdict["reason"]
    assert (verdict["overall"] == "INVALID") == bool(invalid) and (not invalid or "burst" in verdict["reason"])
    assert all(cell["result"] != "FAIL" for cell in verdict["cells"])


def test_slowed_candidate_fails(slowed_duet_run):
    """tests/conftest.py's ``slowed_duet_run``: the CPU default with the candidate's engine steps slowed
    (step-delay:50), three session blocks per arm (the gate's min_sessions)."""
    proc, run_dir, _ = slowed_duet_run
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == proc.returncode, proc.stderr[-3000:]
    assert verdict["overall"] == "FAIL" and proc.returncode == 1, verdict["reason"]
    throughput = [c for c in verdict["cells"] if c["metric"] == "output_throughput"]
    assert throughput and all(c["result"] == "FAIL" for c in throughput)
