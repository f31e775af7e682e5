"""The verdict on the terminal: the primary cells as a rich table, their notes, the verdict line."""

from __future__ import annotations

import io

from harness.metrics import METRICS
from harness.render.output import MAX_LIST, Output, VerdictView, fmt
from harness.rundir.schema import Regime

STYLE = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow", "INVALID": "magenta"}


SHORT = {"PASS": "PASS", "FAIL": "FAIL", "INCONCLUSIVE": "INCONCL", "INVALID": "INVALID"}
"""The verdict column's words: INCONCLUSIVE is shortened (named in the legend) so the table fits 80 columns."""


def _digits(value: float | None) -> int:
    return 2 if value is not None and abs(value) < 100 else 1


def _delta(cell) -> str:
    """``"-47.2 [-63.9, -22.8]"``: Δ and its interval, in the cell's unit (the legend names units)."""
    if cell.delta is None:
        return "—"
    if cell.ci_low is None or cell.ci_high is None:
        return f"{cell.delta:+.1f}"
    return f"{cell.delta:+.1f} [{cell.ci_low:+.1f}, {cell.ci_high:+.1f}]"


def _legend(cells) -> str:
    """One line naming each abbreviation the table used, with its unit, then how to read Δ."""
    seen: dict[str, str] = {}
    for cell in cells:
        metric = METRICS.get(cell.metric)
        if metric is not None:
            unit = f", {metric.unit}" if metric.unit else ""
            seen.setdefault(metric.abbrev, f"{metric.abbrev} = {cell.label}{unit}")
    levels = sorted({float(f"{100 * c.ci_level:.3g}") for c in cells if c.ci_level is not None})
    tested = f" at {levels[0]:g}–{levels[-1]:g} %" if len(levels) > 1 else (f" at {levels[0]:g} %" if levels else "")
    return ("; ".join(seen.values()) + f". Δ [interval{tested}] and margin: % of baseline (GSM8K: points); "
            "INCONCL = INCONCLUSIVE; (n) = note n below.")


def _tables(document):
    """The primary cells in ≤ 80 columns, one row each (abbreviated metric names, Δ with its interval in one
    column): one table, or one per regime when the run has several (each titled with its regime, so the "c" column
    stays the concurrency and no figure is cut), and the numbered notes the rows' marks refer to."""
    notes: dict[str, list[str]] = {}   # note → the cells it applies to, numbered in order of first use
    groups: dict[str | None, list] = {}
    for cell in document.cells:
        groups.setdefault(cell.regime, []).append(cell)
    title = f"dsa-bench gate · {document.run_id}"
    if len(groups.keys() - {None}) < 2:         # one regime (and GSM8K's cells, which have none): one table
        return [_table(title, document.cells, notes)], _numbered(notes)
    tables = [_table(_regime_title(regime), cells, notes) for regime, cells in groups.items()]
    return [title, *tables], _numbered(notes)


def _regime_title(regime: str | None) -> str:
    """A regime table's title: ``"1024→512 random"`` (input → output tokens, dataset), ``"GSM8K"`` for no regime."""
    parsed = Regime.parse(regime)
    return parsed.label() if parsed is not None else "GSM8K"


def _table(title: str, cells, notes: dict[str, list[str]]):
    """One rich table of ``cells`` under ``title``; each cell's note is numbered into ``notes`` (shared by the
    tables of one verdict, so the numbers run on)."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name, justify, wrap in (("metric", "left", True), ("c", "right", False), ("base", "right", False),
                                ("cand", "right", False), ("Δ \\[interval]", "right", True),
                                ("margin", "right", False), ("verdict", "left", True)):
        table.add_column(name, justify=justify, no_wrap=not wrap)   # too wide: words wrap, never a figure cut
    for cell in cells:
        metric = METRICS.get(cell.metric)
        mark = ""
        if cell.note:
            notes.setdefault(cell.note, []).append(cell.named(metric.abbrev if metric else cell.metric))
            mark = f" ({list(notes).index(cell.note) + 1})"
        verdict = f"[{STYLE[str(cell.result)]}]{SHORT[str(cell.result)]}[/]{mark}"
        concurrency = "" if cell.concurrency is None else str(cell.concurrency)
        table.add_row(metric.abbrev if metric else cell.metric, concurrency,
                      fmt(cell.baseline, _digits(cell.baseline)), fmt(cell.candidate, _digits(cell.candidate)),
                      _delta(cell), f"{cell.margin:+g}", verdict)
    return table


def _numbered(notes: dict[str, list[str]]) -> list[str]:
    return [f"{', '.join(where)}: {note}" for note, where in notes.items()]


def render(view: VerdictView) -> str:
    """What :func:`print_view` prints, as plain text (80 columns, the narrowest terminal it is laid out for)."""
    from rich.console import Console

    console = Console(record=True, width=80, file=io.StringIO())
    print_view(view, console)
    return console.export_text()


def print_view(view: VerdictView, console=None) -> None:
    """Print the primary cells as a table, their notes, write errors and the verdict line (stdout by default)."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    document = view.document
    if document.evaluated:
        tables, notes = _tables(document)
        for table in tables:
            console.print(table)
        console.print(escape(_legend(document.cells)), style="dim", highlight=False)
        for i, note in enumerate(notes[:MAX_LIST], 1):
            console.print(f"  ({i}) {escape(note)}", highlight=False)
        if len(notes) > MAX_LIST:
            console.print(f"  … and {len(notes) - MAX_LIST} more in verdict.json", highlight=False)
        for note in document.notes:
            console.print(f"[dim]note: {escape(note)}[/]", highlight=False)
    for error in view.write_errors:
        console.print(f"[red]could not write[/] {escape(error)}", highlight=False)
    console.print(f"[{STYLE[document.overall]}]{document.overall}[/] (exit {document.exit_code}): "
                  f"{escape(document.reason)}", highlight=False)
    if view.written:
        console.print(f"[dim]wrote {', '.join(p.name for p in view.written)} in {escape(str(view.run_dir))}[/]",
                      highlight=False)


OUTPUT = Output(None, render)
