"""Where a level's paired spread lives (issue #27): the same request's work against the level-wide speed.

Both arms of the default get the same prompts per level (the random dataset is seeded per level), so request ``i``
of a level does the same work on either arm. Per concurrency this prints the correlation of the same request's log
TPOT across the arms, the sd of its candidate − baseline log TPOT, that sd ÷ √(requests per level) — the share the
requests' own noise contributes to a level's paired difference if requests were independent — and the sd of the
level's paired difference itself (mean over its requests).

    PYTHONPATH=. .venv/bin/python scripts/paired_requests.py results/carryover/quiet-compare-requests.csv.gz
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd


def table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per concurrency from a run's ``requests.csv`` (columns arm, round, level, concurrency, index, tpot_ms,
    error)."""
    ok = requests[requests.error.isna() & (requests.tpot_ms > 0)].assign(lt=lambda f: np.log(f.tpot_ms))
    rows = []
    for concurrency, group in ok.groupby("concurrency"):
        wide = group.pivot_table(index=["round", "level", "index"], columns="arm", values="lt").dropna()
        diff = wide.candidate - wide.baseline
        within = diff - diff.groupby(level=[0, 1]).transform("mean")
        level_diff = diff.groupby(level=[0, 1]).mean()
        per_level = diff.groupby(level=[0, 1]).size().median()
        rows.append({"concurrency": concurrency, "corr_same_request": wide.baseline.corr(wide.candidate),
                     "sd_request_diff": within.std(), "iid_share": within.std() / np.sqrt(per_level),
                     "sd_level_diff": level_diff.std(ddof=1), "levels": len(level_diff)})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    for path in sys.argv[1:] or ["results/carryover/quiet-compare-requests.csv.gz"]:
        print(path)
        print(table(pd.read_csv(path)).round(3).to_string(index=False))
