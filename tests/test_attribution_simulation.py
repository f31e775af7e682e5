"""The simulated false-attribution rate (harness.study.attribution_simulation): recorded sessions with no effect,
assigned to the arms of a 2^k design, judged by the product's own OLS + Holm. Tiny sizes here; the committed figures
are results/attribution/false-attribution.json."""

import json
import math
from pathlib import Path

import pytest

from harness.judge.factorial import design_rows
from harness.study import attribution_simulation as sim

ROOT = Path(__file__).resolve().parents[1]
FACTORS = ["a", "b", "c"]


@pytest.fixture(scope="module")
def run_pool():
    return sim._read_run(ROOT / sim.RUN_RECORDING)


@pytest.fixture(scope="module")
def aa():
    return sim._read_aa(ROOT / sim.AA_RECORDING)


def test_the_residual_pool_has_no_arm_effect_left(run_pool):
    assert len(run_pool.values) == 24 and sorted(set(run_pool.blocks)) == [0, 1, 2]
    level = next(iter(run_pool.values[0]))
    for metric in sim.METRICS:   # the two-way residuals sum to 0 within every block (and every arm)
        for block in range(3):
            assert sum(v[level][metric] for v, b in zip(run_pool.values, run_pool.blocks) if b == block) \
                == pytest.approx(0, abs=1e-9)
    observed = sim.observations(run_pool, [[i for i, b in enumerate(run_pool.blocks) if b == 0]], FACTORS, "full")
    assert all(o["output_throughput"] > 100 for o in observed)   # back on the tok/s scale, the block's mean added


def test_draws_give_every_arm_one_session_per_block(aa, run_pool):
    rng = __import__("numpy").random.default_rng(0)
    drawn = sim.draw(aa, 3, 8, rng)
    flat = [i for block in drawn for i in block]
    assert len(drawn) == 3 and len(set(flat)) == 24 and max(flat) - min(flat) == 23   # contiguous in time
    assert [sorted(b) for b in sim.draw(run_pool, 3, 8, rng)] == [
        [i for i, b in enumerate(run_pool.blocks) if b == block] for block in range(3)]
    with pytest.raises(ValueError, match="need 40 sessions; the aa pool holds 36"):
        sim.draw(aa, 5, 8, rng)


def test_a_planted_effect_moves_exactly_its_column(run_pool):
    drawn = [[i for i, b in enumerate(run_pool.blocks) if b == 0]]
    plain = sim.observations(run_pool, drawn, FACTORS, "full")
    moved = sim.observations(run_pool, drawn, FACTORS, "full", planted={"AB": -0.4})
    for row, before, after in zip(design_rows(3), plain, moved):
        sign = (row[0] - 0.5) * (row[1] - 0.5)
        assert math.log(after["output_throughput"] / before["output_throughput"]) == pytest.approx(-0.4 * sign)
        assert math.log(after["server_mean_tpot_ms"] / before["server_mean_tpot_ms"]) == pytest.approx(0.4 * sign)
        assert after["acceptance_length"] == before["acceptance_length"]


def test_a_planted_effect_is_attributed_and_not_counted_false(run_pool, aa):
    found = sim.simulate(run_pool, runs=20, blocks=3, factors=FACTORS, seed=3, planted={"A": -0.3})
    assert found.planted_found == {"A": 20} and "A" not in found.false_by_term
    null = sim.simulate(aa, runs=40, blocks=3, factors=FACTORS, seed=3)
    assert null.tests == 24 and null.planted_found == {}   # 6 terms × 2 metrics × 2 levels (acceptance: flat)
    assert null.false_runs <= 4 and 0.01 < null.raw_rejections / null.tested < 0.1
    record = null.record()
    assert record["interval_95"][0] <= record["rate"] <= record["interval_95"][1]


def test_the_script_writes_its_cases_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    out = tmp_path / "rates.json"
    code = sim.main(["--runs", "3", "--planted-runs", "2", "--out", str(out)])
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == 2 * len(sim.CASES) and {c["pool"] for c in cases} == {"aa", "residuals"}
    assert code == (0 if all(c["rate"] <= 0.05 for c in cases if not c["planted"]) else 1)
    capsys.readouterr()
    assert sim.main(["--run", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "cannot read the recordings" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as stop:
        sim.main(["--runs", "many"])
    assert stop.value.code == 2 and capsys.readouterr().err.count("\n") == 1
