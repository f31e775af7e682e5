"""The gate's simulation on a REAL recording (tests/fixtures/recorded/real-cpu: one path, 16 sweeps, on a loaded
2-core CPU machine; per-repeat throughput CV 16–20 %).

Measured with the seeds below, 8 paired repeats, primary metrics output throughput and mean TPOT at levels 1/2/4/8:
A/A (the same path split in two), 500 resamples: FAIL 0.4 % (2), INCONCLUSIVE 99.6 %; 5 % throughput loss, 500 resamples: FAIL 5.4 %,
INCONCLUSIVE 94.6 %, never PASS. At this noise the gate does what it must — false alarms within α, no false pass — and says
INCONCLUSIVE with the repeats it would need; the ≥ 90 % power at 8 repeats holds for CV ≲ 2 % (synthetic pool,
tests/test_verdict.py).
"""

from pathlib import Path

import pytest

from harness.study import simulation
from harness.judge.policy import GatePolicy, Status
from harness.rundir.store import RunDir

REAL = Path(__file__).parent / "fixtures" / "recorded" / "real-cpu"
PERF = GatePolicy(primary=("output_throughput", "mean_tpot_ms"))
REPEATS = 8   # the pool's 16 sweeps as 8 pairs, drawn without replacement


@pytest.fixture(scope="module")
def pool():
    store = RunDir(REAL)           # a version-1 recording, read through the upgrade
    manifest = store.manifest()
    assert manifest.scenario["allow_identical_arms"] and manifest.status == "done"
    levels, requests = store.levels(), store.requests()
    return simulation.repeat_pool(levels, requests, ("baseline", "candidate"))


def test_real_aa_false_alarms_at_most_one_percent(pool):
    result = simulation.simulate_gate(pool, PERF, repeats=REPEATS, n_sims=500, seed=21)
    assert result.rate(Status.FAIL) <= 0.01, result.counts


def test_real_regression_is_never_passed(pool):
    result = simulation.simulate_gate(pool, PERF, repeats=REPEATS, n_sims=500, seed=22,
                                      throughput_factor=0.95)
    print(f"5 % throughput loss on the real pool at {REPEATS} repeats: {result.counts}")
    assert result.rate(Status.PASS) == 0, result.counts
    assert result.rate(Status.FAIL) + result.rate(Status.INCONCLUSIVE) == 1.0, result.counts
