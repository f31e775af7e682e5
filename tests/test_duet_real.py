"""A real duet (slow): `dsa-bench compare --duet` on the CPU default, two blocks, each arm's engine on its own core and
the cores exchanged in block 1. vLLM's CPU worker logs the cores it bound its OpenMP threads to
(``vllm/utils/ompmultiprocessing.py``: ``local_rank=0, core ids=[…]``), so the logs show where each engine ran."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.rundir import schema

REPO = Path(__file__).resolve().parent.parent
DSA_BENCH = Path(sys.executable).parent / "dsa-bench"

pytestmark = pytest.mark.slow


def test_a_duet_binds_each_engine_to_its_core_swaps_them_and_overlaps_the_levels(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run(["nice", "-n", "19", str(DSA_BENCH), "compare", "--scenario", "cpu-tiny-dsa", "--no-gsm8k",
                           "--concurrency", "1", "--num-prompts", "4", "--repeats", "2", "--duet",
                           "--place-baseline", "cores=0", "--place-candidate", "cores=1", "--swap-nodes",
                           "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=1500, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run_dir,) = list(out.iterdir())
    for arm, cores in (("baseline", ["[0]", "[1]"]), ("candidate", ["[1]", "[0]"])):
        log = (run_dir / schema.LOGS_DIR / f"{arm}-server.log").read_text(encoding="utf-8", errors="replace")
        bound = [line.rsplit("core ids=", 1)[1].strip() for line in log.splitlines() if "core ids=" in line]
        assert bound == cores, f"{arm}: {bound}"   # block 0 on its own core, block 1 on the other arm's
    manifest = json.loads((run_dir / schema.MANIFEST).read_text())
    arms = {arm["name"]: arm for arm in manifest["arms"]}
    assert [len(arm["sessions"]) for arm in arms.values()] == [2, 2]
    for key, base in arms["baseline"]["levels"].items():
        cand = arms["candidate"]["levels"][key]
        assert base["status"] == cand["status"] == "done"
        assert base["started_at"] < cand["finished_at"] and cand["started_at"] < base["finished_at"]
    levels = pd.read_csv(run_dir / schema.LEVELS)
    assert sorted(set(zip(levels["arm"], levels["round"], levels["session"]))) == [
        ("baseline", 0, 0), ("baseline", 1, 1), ("candidate", 0, 0), ("candidate", 1, 1)]
    assert any(note.startswith("duet:") for note in manifest["notes"])
