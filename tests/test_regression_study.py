"""``python -m harness.study.regression`` (issue #24's figures) on a few runs: the command writes one JSON per figure,
a one-level −10 % loss is FAILed and an A/A is not (the committed 60/400-run figures are in results/statistics/)."""

from __future__ import annotations

import json

from harness.study import regression


def test_figures_on_recorded_sessions_fail_a_local_loss_and_not_an_aa(tmp_path, capsys):
    assert regression.main(["--runs", "4", "--resamples", "100", "--only", "local-loss-one-of-4,aa-fixed",
                            "--out", str(tmp_path)]) == 0
    loss = json.loads((tmp_path / "local-loss-one-of-4.json").read_text())
    aa = json.loads((tmp_path / "aa-fixed.json").read_text())
    assert loss["runs"] == aa["runs"] == 4 and loss["sessions"] == 8
    assert loss["overall"]["FAIL"]["k"] == 4, loss["overall"]
    assert aa["overall"]["FAIL"]["k"] == 0, aa["overall"]
    assert "local-loss-one-of-4:" in capsys.readouterr().out
