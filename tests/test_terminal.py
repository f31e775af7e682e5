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


def _two_regime_view():
    """A verdict with cells at two regimes (a short and a long one) at c=1 and c=64, figures as wide as a real
    run's: five-digit throughputs, Δ with a two-sided interval, a note mark on the verdict."""
    from pathlib import Path

    from harness.render.output import VerdictView
    from harness.rundir.documents import VerdictCell, VerdictDocument
    from harness.rundir.levels import Regime

    cells = [VerdictCell(metric=metric, label=METRICS[metric].label, level=str(regime.at(c)), regime=str(regime),
                         concurrency=c, result=result, baseline=12345.6, candidate=9876.5, delta=-47.2,
                         ci_low=-63.9, ci_high=-22.8, margin=-3.0, note="a note")
             for regime in (Regime("random", 1024, 512), Regime("gsm8k", 32768, 512))
             for c in (1, 64)
             for metric, result in (("output_throughput", "INCONCLUSIVE"), ("p99_tpot_ms", "FAIL"))]
    document = VerdictDocument(run_id="20261204-230000-glm-5.2-nvfp4-tp4", overall="FAIL", exit_code=1,
                               reason="a cell failed", cells=tuple(cells))
    return VerdictView(document, None, None, Path("."))


def test_two_regimes_fit_80_columns_with_every_figure_uncut():
    """Issue #26's levels carry a regime; at 80 columns the table must still show every cell's concurrency,
    figures, Δ and interval whole, and say which regime each row is."""
    text = terminal.render(_two_regime_view())
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text
    lines = text.splitlines()
    headings = [next(i for i, line in enumerate(lines) if line.strip() == regime)
                for regime in ("1024→512 random", "32768→512 gsm8k")]
    rows = [i for i, line in enumerate(lines) if "12,345.6" in line]
    assert len(rows) == 8 and headings[0] < rows[0] and rows[3] < headings[1] < rows[4]   # each under its regime
    for line in (lines[i] for i in rows):
        for figure in ("9,876.5", "-47.2 [-63.9, -22.8]", " -3 "):
            assert figure in line, (figure, line)
        assert "INCONCL (1)" in line or "FAIL (1)" in line, line
    abbrev = {METRICS[m].abbrev.split()[0]: len(METRICS[m].abbrev.split())
              for m in ("output_throughput", "p99_tpot_ms")}
    concurrency = [lines[i].split()[abbrev[lines[i].split()[0]]] for i in rows]
    assert concurrency == ["1", "1", "64", "64"] * 2
