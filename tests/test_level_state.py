"""Level statuses are read through one parser (harness.rundir.schema.level_state), never by prefix matching."""

import subprocess

import pytest

from harness.rundir.schema import LevelRecord, LevelState, level_reason, level_state


@pytest.mark.parametrize("status, state, reason", [
    ("done", LevelState.DONE, ""),
    ("pending", LevelState.PENDING, ""),
    ("failed: server died during the level", LevelState.FAILED, "server died during the level"),
    ("skipped: run stopped before this level", LevelState.SKIPPED, "run stopped before this level"),
    ("stopped: decided at look 2", LevelState.STOPPED, "decided at look 2"),
    ("failedx: no", None, "no"),
    (None, None, ""),
])
def test_status_text_splits_into_state_and_reason(status, state, reason):
    assert level_state(status) is state and level_reason(status) == reason
    if status is not None:
        record = LevelRecord(status=status)
        assert record.state is state and record.reason == reason


def test_no_level_status_is_matched_by_prefix_in_the_harness():
    found = subprocess.run(["git", "grep", "-n", "-E", r"(status|STOPPED)[^\n]*\.startswith\(|startswith\((schema\.)?STOPPED",
                            "--", "harness"], capture_output=True, text=True).stdout
    assert found == "", found
