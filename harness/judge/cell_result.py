"""A verdict's cell result (:class:`CellResult`): what :func:`harness.judge.verdict.decide` found for one primary metric at
one level (or GSM8K, or a regime's pooled hypothesis) — both arms' figures, the interval, the p-values, the status and
the one-line note tables show."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.judge import planning
from harness.judge.policy import METRICS, Metric, Status
from harness.rundir.schema import Level, Regime

__all__ = ["CellResult", "EXACT", "ZERO_SPREAD"]


# MTP acceptance counts repeat exactly when the engine is deterministic (vLLM's uni executor, fixed prompts, greedy):
# every session's paired difference is then the same, and that common value is the difference for this workload.
EXACT = ("identical in every session: an MTP count that repeats exactly (a deterministic engine), so the common "
         "difference is decided against the margin as it stands")
ZERO_SPREAD = ("zero spread: the paired values do not vary (identical or copied repeats), so no interval can be "
               "trusted; degenerate, never a verdict")
"""The note of a session cell whose paired timings do not vary (a copied run: a timing never repeats exactly): it stays
INCONCLUSIVE, and this is what its one-line note says (not sessions advice)."""


@dataclass
class CellResult:
    """One cell's outcome. ``delta``/``ci_*``/``margin`` are in % of baseline (``delta_unit`` "%") or accuracy points
    ("pt"); ``ci_level`` is the two-sided confidence of the interval shown (the Holm level the cell was tested at)."""

    metric: str
    level: Level | None
    primary: bool
    status: Status | None
    reasons: list[str] = field(default_factory=list)
    baseline: float | None = None
    candidate: float | None = None
    ratio: float | None = None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_level: float | None = None
    margin: float | None = None
    p_pass: float | None = None
    p_fail: float | None = None
    p_pass_holm: float | None = None
    p_fail_holm: float | None = None
    repeats: int = 0
    repeats_needed: int | None = None
    samples_needed: int | None = None
    n_baseline: int | None = None
    n_candidate: int | None = None
    percentile_95: tuple[float, float] | None = None
    mcnemar: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    pooled: bool = False
    regime: Regime | None = None
    """A pooled result's regime (its levels'); a level cell's is its level's."""
    spread: float | None = None
    """Per-session spread ``se·√n`` of the test statistic at its :data:`~harness.judge.planning.ADVICE_CONFIDENCE`
    upper bound (session cells that were tested; the advice's input)."""
    pass_level: float | None = None
    """The level its PASS was tested at (α, or a sequential look's nominal level)."""
    degenerate: bool = False
    """Zero spread: the paired values do not vary, so no interval is trusted and the cell is never decided."""

    @property
    def spec(self) -> Metric:
        return METRICS[self.metric]

    @property
    def where(self) -> str:
        if self.pooled:
            return f"all levels of {self.regime.label()} (pooled)" if self.regime else "all levels (pooled)"
        return "GSM8K" if self.level is None else self.level.label()

    def note(self) -> str:
        """One line for tables: why INVALID, what INCONCLUSIVE needs, or empty."""
        if self.reasons:
            return "; ".join(self.reasons)
        if self.status == Status.INCONCLUSIVE:
            if self.degenerate:                                   # its own note, not sessions advice
                return ZERO_SPREAD
            if self.ci_low is None and self.notes:                 # too few repeats for any interval
                return f"{self.notes[0]}; run ≈{self.repeats_needed}"
            if self.repeats_needed is not None and self.repeats_needed <= self.repeats:
                return (f"the estimate sits near the margin: {self.repeats} sessions would already pass an "
                        "unchanged candidate at this spread")
            if self.repeats_needed is not None:
                return (f"≈{self.repeats_needed} sessions per arm for 90 % power to pass this cell for an unchanged "
                        f"candidate (spread at its {100 * planning.ADVICE_CONFIDENCE:g} % upper bound; now "
                        f"{self.repeats})")
            if self.samples_needed is not None:
                return f"≈{self.samples_needed} questions would settle it (now {self.n_baseline})"
            return "the spread is too wide for any affordable number of sessions"
        return ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; carries the keys the HTML report reads (``concurrency``, ``metric``, ``delta_pct``,
        ``ci_low_pct``, ``ci_high_pct``, ``margin_pct``, ``result``, ``note``)."""
        spec = self.spec
        data: dict[str, Any] = {
            "metric": self.metric, "label": spec.label, "unit": spec.unit,
            "concurrency": None if self.level is None else self.level.concurrency,
            "level": None if self.level is None else str(self.level),
            "regime": str(self.regime or (self.level.regime if self.level else "")) or None,
            "primary": self.primary, "result": None if self.status is None else str(self.status),
            "higher_is_better": spec.higher_is_better, "baseline": self.baseline, "candidate": self.candidate,
            "ratio": self.ratio, "delta": self.delta, "ci_low": self.ci_low, "ci_high": self.ci_high,
            "delta_unit": spec.margin_unit, "ci_level": self.ci_level, "margin": self.margin,
            "p_pass": self.p_pass, "p_fail": self.p_fail, "p_pass_holm": self.p_pass_holm,
            "p_fail_holm": self.p_fail_holm, "repeats": self.repeats, "repeats_needed": self.repeats_needed,
            "samples_needed": self.samples_needed, "n_baseline": self.n_baseline, "n_candidate": self.n_candidate,
            "percentile_95": None if self.percentile_95 is None else list(self.percentile_95),
            "reasons": list(self.reasons), "notes": list(self.notes), "note": self.note(), "pooled": self.pooled,
            "spread": self.spread,
        }
        percent = spec.margin_unit == "%"                      # the *_pct keys exist on every cell (None for GSM8K)
        data.update(delta_pct=self.delta if percent else None, ci_low_pct=self.ci_low if percent else None,
                    ci_high_pct=self.ci_high if percent else None, margin_pct=self.margin if percent else None)
        if not percent:
            data.update(delta_pts=self.delta, ci_low_pts=self.ci_low, ci_high_pts=self.ci_high,
                        margin_pts=self.margin, mcnemar=self.mcnemar, accuracy=self.accuracy)
        return data
