"""A real duet (slow): tests/conftest.py's ``slowed_duet_run`` — `dsa-bench compare --duet` on the CPU default, three
blocks, each arm's engine on its own core and the cores exchanged every block. vLLM's CPU worker logs the cores it
bound its OpenMP threads to (``vllm/utils/ompmultiprocessing.py``: ``local_rank=0, core ids=[…]``), so the logs show
where each engine ran."""

import json

import pandas as pd
import pytest

from harness.rundir import schema

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def test_a_duet_binds_each_engine_to_its_core_swaps_them_and_overlaps_the_levels(slowed_duet_run):
    run_dir = slowed_duet_run.run_dir
    for arm, cores in (("baseline", ["[0]", "[1]", "[0]"]), ("candidate", ["[1]", "[0]", "[1]"])):
        log = (run_dir / schema.LOGS_DIR / f"{arm}-server.log").read_text(encoding="utf-8", errors="replace")
        bound = [line.rsplit("core ids=", 1)[1].strip() for line in log.splitlines() if "core ids=" in line]
        assert bound == cores, f"{arm}: {bound}"   # even blocks on its own core, odd blocks on the other arm's
    manifest = json.loads((run_dir / schema.MANIFEST).read_text())
    arms = {arm["name"]: arm for arm in manifest["arms"]}
    assert [len(arm["sessions"]) for arm in arms.values()] == [3, 3]
    for key, base in arms["baseline"]["levels"].items():
        cand = arms["candidate"]["levels"][key]
        assert base["status"] == cand["status"] == "done"
        assert base["started_at"] < cand["finished_at"] and cand["started_at"] < base["finished_at"]
    levels = pd.read_csv(run_dir / schema.LEVELS)
    assert sorted(set(zip(levels["arm"], levels["round"], levels["session"]))) == [
        (arm, block, block) for arm in ("baseline", "candidate") for block in range(3)]
    assert any(note.startswith("duet:") for note in manifest["notes"])
