"""The verdict on the terminal: the primary cells as a rich table, their notes, the verdict line."""

from __future__ import annotations

import io

from harness.render.output import MAX_LIST, Output, VerdictView, fmt

STYLE = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow", "INVALID": "magenta"}


def _digits(value: float | None) -> int:
    return 2 if value is not None and abs(value) < 100 else 1


def render(view: VerdictView) -> str:
    """What :func:`print_view` prints, as plain text (200 columns)."""
    from rich.console import Console

    console = Console(record=True, width=200, file=io.StringIO())
    print_view(view, console)
    return console.export_text()


def print_view(view: VerdictView, console=None) -> None:
    """Print the primary cells as a table, their notes, write errors and the verdict line (stdout by default)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    document = view.document
    if document.evaluated:
        table = Table(title=f"dsa-bench gate · {escape(document.run_id)}", title_justify="left")
        for name, justify in (("metric", "left"), ("c", "right"), ("baseline", "right"), ("candidate", "right"),
                              ("Δ", "right"), ("interval", "right"), ("margin", "right"), ("verdict", "left")):
            table.add_column(name, justify=justify)
        notes = []
        for cell in document.cells:
            unit = cell.delta_unit
            interval = "—" if cell.ci_low is None or cell.ci_high is None or cell.ci_level is None else (
                f"[{cell.ci_low:+.2f}, {cell.ci_high:+.2f}] @{100 * cell.ci_level:.3g}%")
            mark = ""
            if cell.note:
                notes.append(f"{cell.label} {cell.where}: {cell.note}")
                mark = f" ({len(notes)})"
            table.add_row(cell.label, "" if cell.concurrency is None else str(cell.concurrency),
                          fmt(cell.baseline, _digits(cell.baseline)), fmt(cell.candidate, _digits(cell.candidate)),
                          "—" if cell.delta is None else f"{cell.delta:+.2f} {unit}", escape(interval),
                          f"{cell.margin:+g} {unit}", f"[{STYLE[str(cell.result)]}]{cell.result}[/]{mark}")
        console.print(table)
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
