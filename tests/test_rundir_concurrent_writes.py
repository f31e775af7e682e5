"""Two writers of one run directory at once (the arms' GSM8K threads, a duet's two clients), each with its own
``RunDir``: neither loses the other's rows. The fresh-clone run of 2026-12-05 lost the candidate's accuracy rows
when both arms' ``replace_accuracy_rows`` read the file before either wrote it."""

from __future__ import annotations

import threading

from harness.rundir.store import RunDir


def _rows(arm: str, n: int = 200) -> list[dict]:
    return [{"arm": arm, "question_id": q, "filter": "flexible-extract", "correct": q % 2} for q in range(n)]


def test_both_arms_accuracy_rows_survive_simultaneous_replacement(tmp_path):
    for attempt in range(20):
        run = tmp_path / f"run{attempt}"
        run.mkdir()
        start = threading.Barrier(2)

        def write(arm: str) -> None:
            store = RunDir(run)                  # each thread its own RunDir, as harness.run.accuracy builds them
            start.wait()
            store.replace_accuracy_rows(arm, _rows(arm))

        threads = [threading.Thread(target=write, args=(arm,)) for arm in ("baseline", "candidate")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        arms = [row["arm"] for row in RunDir(run).accuracy_rows()]
        assert arms.count("baseline") == arms.count("candidate") == 200, f"attempt {attempt}"
