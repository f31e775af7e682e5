"""The kill matrix of ``dsa-bench calibrate --defects``: which gated cells each catalogue defect FAILs.

Per defect of :data:`dsa_route.inject.DEFECTS` (13 harmful, 2 harmless) one gated A/A comparison runs with the
defect injected into the candidate only (:func:`harness.compare.run_aa`); its ``verdict.json`` is read here.
A row's ``outcome`` is what the defect's ``harmful`` flag makes of the verdict:

==========  ================  =====================
            verdict FAIL      verdict not FAIL
==========  ================  =====================
harmful     caught            missed
harmless    false alarm       quiet
==========  ================  =====================

A missed defect stays in the catalogue and is reported as missed (issue #23). Pure apart from reading run
directories: no servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsa_route.inject import DEFECTS
from harness.rundir.schema import VERDICT, VerdictDocument

__all__ = ["KillRow", "parse_defects", "failed_cells", "kill_row", "render", "all_as_expected"]

OUTCOMES = {(True, True): "caught", (True, False): "missed", (False, True): "false alarm", (False, False): "quiet"}


@dataclass(frozen=True)
class KillRow:
    """One defect's run: its ``verdict`` (``overall`` of ``verdict.json``), the ``failed`` cells (names from
    :func:`failed_cells`), the run's wall time ``wall_s`` (seconds, None when not recorded) and ``run_dir``."""

    defect: str
    harmful: bool
    verdict: str
    failed: tuple[str, ...]
    wall_s: float | None
    run_dir: str

    @property
    def outcome(self) -> str:
        """``caught`` / ``missed`` / ``false alarm`` / ``quiet`` (module docstring)."""
        return OUTCOMES[(self.harmful, self.verdict == "FAIL")]

    def record(self) -> dict:
        """The row as the calibration record stores it."""
        return {"defect": self.defect, "harmful": self.harmful, "verdict": self.verdict, "outcome": self.outcome,
                "failed_cells": list(self.failed), "wall_s": self.wall_s, "run_dir": self.run_dir}


def parse_defects(text: str) -> tuple[str, ...]:
    """``"all"`` → every catalogue defect (catalogue order); ``"a,b"`` → those, in that order, each once.

    Raises:
        ValueError: an empty list or a name outside the catalogue (the message names the allowed values).
    """
    if text.strip() == "all":
        return tuple(DEFECTS)
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in DEFECTS]
    if not names or unknown:
        what = f"unknown defect(s) {', '.join(unknown)}" if unknown else "no defect named"
        raise ValueError(f"--defects: {what}; use all or a comma-separated list of {', '.join(DEFECTS)}")
    return names


def failed_cells(document: VerdictDocument) -> tuple[str, ...]:
    """The gated cells that FAILed: ``<metric> <where>`` for the per-level cells (``where``: ``c=N``), the metric
    alone for GSM8K (no level), ``<metric> pooled`` for the pooled hypotheses, and the correctness family's cell
    names."""
    cells = [c.named(c.metric) for c in document.cells if c.result == "FAIL"]
    cells += [f"{c.metric} pooled" for c in document.pooled if c.result == "FAIL"]
    cells += [c.name for c in document.correctness if c.result == "FAIL"]
    return tuple(cells)


def kill_row(defect: str, run_dir: Path, wall_s: float | None) -> KillRow:
    """The row of ``defect``'s gated run in ``run_dir``. Raises OSError / pydantic ValidationError when its
    ``verdict.json`` is missing or unreadable (the gate writes one for every finished run)."""
    document = VerdictDocument.model_validate_json((Path(run_dir) / VERDICT).read_text(encoding="utf-8"))
    return KillRow(defect, DEFECTS[defect].harmful, document.overall, failed_cells(document), wall_s, str(run_dir))


def render(rows: list[KillRow]) -> str:
    """The matrix as a Markdown table (one row per defect) and a count line."""
    lines = ["| defect | harmful | verdict | outcome | FAILed cells | wall |", "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        wall = f"{row.wall_s:.0f} s" if row.wall_s is not None else "—"
        lines.append(f"| `{row.defect}` | {'yes' if row.harmful else 'no'} | {row.verdict} | {row.outcome} | "
                     f"{', '.join(row.failed) or '—'} | {wall} |")
    counts = {outcome: sum(row.outcome == outcome for row in rows) for outcome in OUTCOMES.values()}
    lines.append("")
    lines.append(", ".join(f"{name}: {count}" for name, count in counts.items()))
    return "\n".join(lines)


def all_as_expected(rows: list[KillRow]) -> bool:
    """Every harmful defect caught and no harmless one FAILed."""
    return all(row.outcome in ("caught", "quiet") for row in rows)
