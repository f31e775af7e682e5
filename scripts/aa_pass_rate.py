"""How often would an unchanged candidate PASS every throughput and TPOT cell of the default at ``n`` session blocks?
(issue #27's done-when: in ≥ 3 of 5 runs within the budget.) Resampled from recorded A/A runs, blocks as the unit.

Each recorded block of the given A/A run directories is one vector of paired log ratios (candidate − baseline), one
per level and metric (output throughput, server mean TPOT; ``scripts/aa_level_spread.py``'s pairing: a block's rounds
averaged). A simulated run draws ``n`` blocks with replacement and judges each cell as the gate's fixed design does
(``harness.judge.verdict``: the paired t on the blocks' log ratios, ``n − 1`` df, one-sided at α against the margin:
throughput ≥ −3 %, TPOT ≤ +3 %, ``harness.judge.stats.noninferiority_pvalues``); the run PASSes when every cell does
(intersection–union). The level-pooled hypotheses only matter for FAIL and are left out. Resampling whole blocks keeps
each block's offset common to its levels, as the real runs have it (Efron & Tibshirani 1993, the bootstrap of
independent units).

    PYTHONPATH=. .venv/bin/python scripts/aa_pass_rate.py results/carryover/aa-calibrate-5/* --blocks 6,8,10,12
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
from scipy import stats

from harness.cli_flags import at_least
from harness.judge.policy import GatePolicy

SPEC = {"output_throughput": (+1, 0.97), "server_mean_tpot_ms": (-1, 1.03)}
"""Per metric: +1 where higher is better (a loss is a fall), and the margin as a ratio (``GatePolicy`` defaults)."""


def block_matrix(run_dirs: list[Path]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(blocks × cells) paired log ratios, each cell oriented so that a loss is negative; per cell the log margin in
    that orientation (a PASS needs the lower bound above it); the cells' names.

    Raises:
        ValueError: a run directory without ``levels.csv``, or the runs' blocks cover different levels.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location("aa_level_spread", Path(__file__).with_name("aa_level_spread.py"))
    spread = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(spread)
    missing = [str(run) for run in run_dirs if not (run / "levels.csv").is_file()]
    if missing:
        raise ValueError(f"no levels.csv in {', '.join(missing)}: pass A/A run directories")
    ratios = spread.paired_log_ratios(run_dirs)
    wide = ratios.pivot_table(index=["run", "session"], columns="level", values=list(SPEC))
    if wide.isna().any().any():
        raise ValueError("the runs' blocks do not all cover the same levels")
    cells = [f"{metric} {level}" for metric, level in wide.columns]
    signs = np.array([SPEC[metric][0] for metric, _ in wide.columns])
    limits = np.array([SPEC[metric][0] * math.log(SPEC[metric][1]) for metric, _ in wide.columns])
    return wide.to_numpy() * signs, limits, cells


def pass_rate(matrix: np.ndarray, limits: np.ndarray, blocks: int, sims: int, alpha: float,
              rng: np.random.Generator) -> tuple[float, np.ndarray]:
    """The share of ``sims`` runs of ``blocks`` resampled blocks in which every cell PASSes, and each cell's own PASS
    share. A cell PASSes when its one-sided ``1 − alpha`` lower t bound on the mean log ratio clears its ``limits``
    entry (:func:`block_matrix`)."""
    t = stats.t.ppf(1 - alpha, blocks - 1)
    draws = matrix[rng.integers(0, len(matrix), size=(sims, blocks))]        # sims × blocks × cells
    lower = draws.mean(axis=1) - t * draws.std(axis=1, ddof=1) / math.sqrt(blocks)
    passed = lower > limits
    return float(passed.all(axis=1).mean()), passed.mean(axis=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="A/A run directories (each with levels.csv)")
    parser.add_argument("--blocks", type=lambda text: [at_least(2)(part) for part in text.split(",")],
                        default=[6, 8, 10, 12], help="session blocks per simulated run, each ≥ 2 (comma-separated)")
    parser.add_argument("--sims", type=at_least(1), default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        matrix, limits, cells = block_matrix(args.runs)
    except ValueError as error:
        parser.exit(2, f"aa_pass_rate: error: {error}\n")
    policy, rng = GatePolicy(), np.random.default_rng(args.seed)
    print(f"{len(matrix)} recorded blocks, {len(cells)} cells; α = {policy.alpha} one-sided, margins ±3 %")
    for blocks in args.blocks:
        every, each = pass_rate(matrix, limits, blocks, args.sims, policy.alpha, rng)
        worst = min(range(len(cells)), key=lambda i: each[i])
        print(f"n = {blocks:2d}: all {len(cells)} cells PASS in {100 * every:5.1f} % of runs "
              f"(P(≥ 3 of 5 runs) = {100 * stats.binom.sf(2, 5, every):5.1f} %); "
              f"weakest cell {cells[worst]}: {100 * each[worst]:.1f} %")


if __name__ == "__main__":
    main()
