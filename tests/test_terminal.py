"""The gate's terminal table at 80 columns (issue #25): no cell cut off, every abbreviation named in the legend."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from harness.gate import print_gate, run_gate, view_of
from harness.metrics import METRICS
from harness.render import terminal
from report_runs import build


@pytest.mark.parametrize("kind", ("fail", "imported"))
def test_the_table_fits_80_columns_with_nothing_cut_off(tmp_path, kind):
    run_dir = build(kind, tmp_path / kind)
    console = Console(record=True, width=80, file=io.StringIO())
    result = run_gate(run_dir, write=False)
    print_gate(result, console)
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text
    rows = [line.split() for line in text.splitlines()]
    legend = " ".join(text.split())
    cells = view_of(result).document.cells
    assert cells
    for cell in cells:
        abbrev = METRICS[cell.metric].abbrev
        row = [r for r in rows if " ".join(r).startswith(abbrev + " ")
               and (cell.concurrency is None or str(cell.concurrency) in r)]
        assert row and terminal.SHORT[str(cell.result)] in row[0], (abbrev, cell.concurrency)
        assert f"{abbrev} = {cell.label}" in legend


def test_every_metric_has_a_short_unique_abbreviation():
    abbrevs = [metric.abbrev for metric in METRICS.values()]
    assert all(0 < len(a) <= 9 for a in abbrevs) and len(set(abbrevs)) == len(abbrevs)
