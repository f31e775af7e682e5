"""scripts/paired_requests.py separates a request's own (paired) work from a level-wide speed difference."""

import numpy as np
import pandas as pd

from scripts_loader import load_script


def _module():
    return load_script("paired_requests")


def test_a_level_wide_speed_shows_in_the_level_difference_not_in_the_requests():
    rng = np.random.default_rng(0)
    rows = []
    for level_round in range(40):
        work = rng.normal(0, 0.2, 16)                      # the same prompts on both arms
        speed = {"baseline": rng.normal(0, 0.05), "candidate": rng.normal(0, 0.05)}
        for arm in speed:
            noise = rng.normal(0, 0.01, 16)
            for index in range(16):
                rows.append({"arm": arm, "round": level_round, "level": "L", "concurrency": 1, "index": index,
                             "tpot_ms": 10 * np.exp(work[index] + speed[arm] + noise[index]), "error": np.nan})
    out = _module().table(pd.DataFrame(rows)).iloc[0]
    assert out.corr_same_request > 0.8
    assert abs(out.sd_request_diff - 0.01 * np.sqrt(2)) < 0.003
    assert abs(out.sd_level_diff - 0.05 * np.sqrt(2)) < 0.02 and out.iid_share < 0.01
