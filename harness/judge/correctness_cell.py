"""The cell type and the rule of the correctness family (:mod:`harness.judge.divergence`: the family, its cells and
their derivation; :mod:`harness.judge.decode_divergence`: the decode cell): each cell counts the prompts whose A/B
value lies beyond the run's own A/A envelope (``exceed``), within it by more than the tie band (``below``) or
neither (ties), and tests the counts with the exact one-sided sign test (Dixon & Mood 1946) at α / 4, Bonferroni over
the family's four cells (:data:`CELLS`). Pure: no files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from harness.rundir.schema import Status

FAMILY = "correctness"
CELLS = ("token_divergence", "confidence_loss", "decode_divergence", "parity")


@dataclass
class CorrectnessCell:
    """One cell of the correctness family.

    ``exceed``/``below``/``ties``: prompt counts (module docstring); ``p_fail``: the sign test's one-sided p-value;
    ``alpha``: the level it is tested at (α / 4); ``test``: the test that gave ``p_fail``. ``ab``/``aa``: run summaries of the A/B and envelope
    (:func:`harness.judge.token_compare.summary`, or parity's exact-match rates). ``first``: the first divergent prompt
    (index, position) of the A/B. ``cdf``: the per-token ``|Δ log p|`` quantiles (0–100 %) of A/B and A/A (the report's CDF).
    """

    name: str
    status: Status
    reasons: list[str] = field(default_factory=list)
    exceed: int = 0
    below: int = 0
    ties: int = 0
    p_fail: float | None = None
    alpha: float | None = None
    ab: dict[str, Any] = field(default_factory=dict)
    aa: dict[str, Any] = field(default_factory=dict)
    first: tuple[int, int] | None = None
    cdf: dict[str, list[float]] = field(default_factory=dict)
    test: str = "sign test"

    def describe(self) -> str:
        """One line for the summary and the terminal."""
        if self.status == Status.INVALID:
            return f"{self.name}: INVALID — {'; '.join(self.reasons)}"
        where = (f"; first divergence: prompt {self.first[0]} at token {self.first[1]}"
                 if self.first is not None else "")
        return (f"{self.name}: {self.status} — {self.exceed} prompt(s) beyond the A/A envelope, {self.below} within "
                f"it by more, {self.ties} tied; {self.test} p = {self.p_fail:.3g} vs α/{len(CELLS)} = {self.alpha:g}"
                f"{where}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "family": FAMILY, "result": str(self.status), "reasons": list(self.reasons),
                "exceed": self.exceed, "below": self.below, "ties": self.ties, "p_fail": self.p_fail,
                "alpha": self.alpha, "ab": self.ab, "aa": self.aa,
                "first": None if self.first is None else list(self.first), "cdf": self.cdf, "test": self.test,
                "note": self.describe()}


def sign_test(exceed: int, below: int) -> float:
    """One-sided exact sign test: ``P(Binomial(exceed + below, 1/2) ≥ exceed)`` (1.0 with no untied prompt)."""
    n = exceed + below
    return float(sum(math.comb(n, k) for k in range(exceed, n + 1)) / 2 ** n) if n else 1.0


def status_of(exceed: int, below: int, aa_unstable: int, alpha: float) -> Status:
    """FAIL / PASS by the sign test at ``alpha`` / len(:data:`CELLS`); INVALID when ``aa_unstable`` prompts alone
    would FAIL."""
    level = alpha / len(CELLS)
    if sign_test(aa_unstable, 0) <= level:
        return Status.INVALID
    return Status.FAIL if sign_test(exceed, below) <= level else Status.PASS


def cell_from_counts(name: str, exceed: int, below: int, ties: int, aa_unstable: int, alpha: float) -> CorrectnessCell:
    """The cell's status from its counts; INVALID when ``aa_unstable`` prompts of the envelope alone would FAIL."""
    level = alpha / len(CELLS)
    status = status_of(exceed, below, aa_unstable, alpha)
    if status == Status.INVALID:
        return CorrectnessCell(name, Status.INVALID, [
            f"the A/A envelope is unstable: the baseline differs from itself on {aa_unstable} prompt(s), which the "
            "same test would call a defect; rerun on a quieter machine or check the baseline's determinism"],
            exceed, below, ties, alpha=level)
    return CorrectnessCell(name, status, [], exceed, below, ties, sign_test(exceed, below), level)


def envelope_counts(ab: Sequence[float], envelope: Sequence[float], tolerance: float) -> tuple[int, int, int]:
    """(exceed, below, unstable) prompt counts from paired per-prompt values (A/B, envelope) and the tie band
    ``tolerance`` (same unit); a NaN compares false, a tie."""
    return (sum(1 for a, e in zip(ab, envelope) if a > e + tolerance),
            sum(1 for a, e in zip(ab, envelope) if e > a + tolerance),
            sum(1 for e in envelope if e > tolerance))


def quantiles(values: Sequence[float]) -> list[float]:
    """The 0, 1, …, 100 % quantiles of ``values`` (empty: [])."""
    return [float(v) for v in np.quantile(values, np.linspace(0, 1, 101))] if len(values) else []
