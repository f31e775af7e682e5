"""The one interface of the verdict outputs (``summary.md``, ``benchmark.pytorch.json``, the terminal table): each
module exposes ``FILE`` (the run-directory file it writes, None for the terminal) and ``render(view) -> str``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

from harness.rundir.schema import Manifest, VerdictCell, VerdictDocument

ICON = {"PASS": "✅", "FAIL": "❌", "INCONCLUSIVE": "⚠️", "INVALID": "🚫"}
MAX_LIST = 15


@dataclass(frozen=True)
class VerdictView:
    """What every output renders: the verdict document, the run's manifest (None when it breaks the schema), the
    ``levels.csv`` frame (None when unreadable), the run directory, and what the gate wrote or could not."""

    document: VerdictDocument
    manifest: Manifest | None
    levels: Any
    run_dir: Path
    written: tuple[Path, ...] = ()
    write_errors: tuple[str, ...] = field(default=())

    def cell_map(self) -> dict[tuple[str, str | None], VerdictCell]:
        """``{(metric, level id): cell}`` (``str(Level)``; None for GSM8K), a primary cell winning over a diagnostic
        twin."""
        found: dict[tuple[str, str | None], VerdictCell] = {}
        for cell in (*self.document.cells, *self.document.diagnostics):
            found.setdefault((cell.metric, cell.level), cell)
        return found


class Output(NamedTuple):
    """One output: the file it writes (None: printed, not written) and its renderer."""

    file: str | None
    render: Callable[[VerdictView], str]


def fmt(value: float | None, digits: int = 1) -> str:
    """A figure with thousands separators, ``—`` when missing or not finite."""
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:,.{digits}f}"


def status_text(status: str | None) -> str:
    """``"✅ PASS"``-style text, empty for None."""
    return "" if status is None else f"{ICON[str(status)]} {status}"
