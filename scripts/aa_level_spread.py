"""Per-level paired spread of A/A runs (issue #27's figure): the sd of candidate − baseline log output throughput and
log server TPOT per level, over every session block of the given run directories, with its 95 % χ² interval.

The unit is the session block (one fresh pair of servers; ``levels.csv`` ``session`` within a run, each run's blocks
its own). Pooled: the root mean square of the per-level sds (the levels weigh equally). Issue #27's target: ≤ 0.02
per level over ≥ 12 blocks.

With ``--components`` it splits the paired spread of log output throughput per level into the session block's common
offset (the sd over blocks of the mean over its levels, less that mean's share of the level noise) and the rest, the
level's own (its requests' share of that: scripts/paired_requests.py). A directory holds a run's ``levels.csv`` (the
recorded A/A runs: results/carryover/aa-uni/, aa-shuffled/, aa-no-aslr/).

    PYTHONPATH=. .venv/bin/python scripts/aa_level_spread.py RUN_DIR [RUN_DIR ...]
    PYTHONPATH=. .venv/bin/python scripts/aa_level_spread.py --components results/carryover/aa-uni/*
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

METRICS = ("output_throughput", "server_mean_tpot_ms")


def paired_log_ratios(run_dirs: list[Path]) -> pd.DataFrame:
    """One row per (run, block, level): the candidate − baseline log ratio of each of :data:`METRICS`, each arm's
    figure the mean over the block's rounds (``workload.rounds_per_session``; the gate's session value).

    Raises:
        ValueError: a ``levels.csv`` without the columns a dsa-bench run writes."""
    parts = []
    for run in run_dirs:
        levels = pd.read_csv(run / "levels.csv")
        absent = [column for column in ("arm", "session", "level", *METRICS) if column not in levels.columns]
        if absent:
            raise ValueError(f"{run / 'levels.csv'} lacks {', '.join(absent)}: not a dsa-bench run's levels.csv")
        wide = levels.pivot_table(index=["level", "session"], columns="arm", values=list(METRICS)).dropna()
        ratios = pd.DataFrame({m: np.log(wide[m]["candidate"] / wide[m]["baseline"]) for m in METRICS})
        parts.append(ratios.reset_index().assign(run=run.name))
    return pd.concat(parts, ignore_index=True)


def spread_table(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per level and metric: blocks, sd and its 95 % χ² interval; a last row pools the levels (root mean square)."""
    rows = []
    for level, group in ratios.groupby("level"):
        row = {"level": level, "blocks": len(group)}
        for metric in METRICS:
            sd, dof = group[metric].std(ddof=1), len(group) - 1
            row[metric] = f"{sd:.3f} [{sd * np.sqrt(dof / stats.chi2.ppf(0.975, dof)):.3f}, " \
                          f"{sd * np.sqrt(dof / stats.chi2.ppf(0.025, dof)):.3f}]"
            row[f"_{metric}"] = sd
        rows.append(row)
    table = pd.DataFrame(rows)
    pooled = {"level": "pooled (rms)", "blocks": int(table.blocks.sum())}
    for metric in METRICS:
        pooled[metric] = f"{np.sqrt((table[f'_{metric}'] ** 2).mean()):.3f}"
    return pd.concat([table, pd.DataFrame([pooled])], ignore_index=True)[["level", "blocks", *METRICS]]


def components_table(run_dirs: list[Path]) -> pd.DataFrame:
    """Per level (``--components``, module docstring): measured paired sd of log output throughput, the block offset
    and the level's own rest (root of the variance left); sds on the log scale."""
    ratios = paired_log_ratios(run_dirs).set_index(["run", "session", "level"])["output_throughput"]
    blocks = ratios.groupby(["run", "session"]).mean()
    levels = ratios.index.get_level_values("level").nunique()
    measured = ratios.groupby("level").std()
    block = math.sqrt(max(blocks.var() - (measured ** 2).mean() / levels, 0.0))
    table = pd.DataFrame({"measured": measured, "block offset": block})
    table["level's own"] = np.sqrt((measured ** 2 - block ** 2).clip(lower=0))
    return table.round(3).reset_index()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="a run directory holding levels.csv")
    ap.add_argument("--components", action="store_true", help="the block offset and the level's own part")
    args = ap.parse_args()
    missing = [str(run) for run in args.runs if not (run / "levels.csv").is_file()]
    if missing:
        ap.error(f"no levels.csv in {', '.join(missing)}: give run directories (results/<run-id>/)")
    try:
        table = components_table(args.runs) if args.components else spread_table(paired_log_ratios(args.runs))
    except ValueError as error:
        ap.exit(2, f"aa_level_spread: error: {error}\n")
    print(table.to_markdown(index=False))


if __name__ == "__main__":
    main()
