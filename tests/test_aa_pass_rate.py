"""scripts/aa_pass_rate.py resamples recorded A/A blocks and judges every throughput and TPOT cell as the gate does."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scripts_loader import load_script


def _module():
    return load_script("aa_pass_rate")


def _run(tmp_path: Path, name: str, blocks: int, spread: float, candidate_speed: float, seed: int) -> Path:
    rng, rows = np.random.default_rng(seed), []
    for session in range(blocks):
        for level in ("random-i64-o32-c1", "random-i64-o32-c4"):
            noise = rng.normal(0, spread)
            for arm, speed in (("baseline", 1.0), ("candidate", candidate_speed * np.exp(noise))):
                rows.append({"arm": arm, "session": session, "round": session, "level": level,
                             "output_throughput": 200 * speed, "server_mean_tpot_ms": 10 / speed})
    run = tmp_path / name
    run.mkdir()
    pd.DataFrame(rows).to_csv(run / "levels.csv", index=False)
    return run


def test_a_quiet_unchanged_candidate_passes_every_cell_and_a_slower_one_never(tmp_path):
    module, rng = _module(), np.random.default_rng(0)
    quiet = module.block_matrix([_run(tmp_path, "quiet", 12, 0.005, 1.0, 1)])
    every, each = module.pass_rate(*quiet[:2], blocks=6, sims=2000, alpha=0.05, rng=rng)
    assert every > 0.99 and len(each) == 4
    slow = module.block_matrix([_run(tmp_path, "slow", 12, 0.005, 0.95, 2)])
    assert module.pass_rate(*slow[:2], blocks=6, sims=2000, alpha=0.05, rng=rng)[0] == 0.0


def test_more_blocks_pass_more_often_at_a_spread_near_the_margin(tmp_path):
    module, rng = _module(), np.random.default_rng(0)
    matrix, limits, cells = module.block_matrix([_run(tmp_path, "noisy", 40, 0.03, 1.0, 3)])
    assert cells[0].startswith("output_throughput") and limits[0] == pytest.approx(np.log(0.97))
    rates = [module.pass_rate(matrix, limits, blocks, 4000, 0.05, rng)[0] for blocks in (4, 12)]
    assert rates[0] < rates[1]


def test_a_directory_without_levels_csv_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no levels.csv"):
        _module().block_matrix([tmp_path])
