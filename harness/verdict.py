"""From a run's tables to a verdict: gate policy, cell validity, per-cell PASS/FAIL/INCONCLUSIVE/INVALID, overall.

Pure: functions of the manifest dict and the ``levels.csv``/``requests.csv``/``accuracy.csv`` frames (schema:
:mod:`harness.records`); no files, processes or sockets. :mod:`harness.gate` does the reading and writing.

A *cell* is one primary metric at one concurrency level (or GSM8K accuracy, which has no level). Per cell:

- **INVALID** when a validity check fails for either arm (:func:`check_validity`) or the data is missing;
- otherwise the candidate/baseline ratio (accuracy: difference) with its paired interval (:mod:`harness.stats`) is
  tested against the metric's margin, Holm-corrected across all primary cells (Holm 1979), one family for PASS
  claims and one for FAIL claims, each at family-wise level ``alpha``:
  **PASS** (non-inferior: the interval excludes a loss larger than the margin), **FAIL** (the interval lies entirely
  beyond the margin on the bad side), **INCONCLUSIVE** (neither; with the repeats the observed spread would need).

Overall: FAIL if any primary cell FAILs; else INVALID if any is INVALID (or there are none); else INCONCLUSIVE if any
is; else PASS. Missing or unreadable data never yields PASS.

Margins' origin: the defaults are issue 6's (throughput −3 %, mean TPOT +3 %, GSM8K −1 point, MTP acceptance length
−2 %). For scale: one arm's standard error on the full 1319-question GSM8K
test set at the upstream 94.8 % is 0.61 points (the paired difference's is smaller when few answers change), and with
the recorded fixture's run-to-run noise (per-repeat throughput CV ≈ 1.1–1.5 %) :data:`RECOMMENDED_REPEATS` repeats
resolve a 5 % loss against the 3 % margin (power figures in ``tests/test_verdict.py``). p99 latencies, if made primary,
default to +10 %: a tail quantile is far noisier.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness import stats

__all__ = [
    "Status", "SEVERITY", "MetricSpec", "METRICS", "DEFAULT_PRIMARY", "RECOMMENDED_REPEATS", "GatePolicy",
    "CellInput", "CellResult", "Verdict", "ValidityReport",
    "check_validity", "build_cells", "decide", "overall", "evaluate",
    "RepeatPool", "repeat_pool", "SimulationResult", "simulate_gate",
]

RECOMMENDED_REPEATS = 8
"""Default ``workload.repeats`` recommended for gated runs: the smallest count at which the simulation on the
recorded fixture FAILs a 5 % throughput regression in ≥ 90 % of resamples (see ``tests/test_verdict.py``)."""


class Status(str, Enum):
    """A cell's or the run's verdict. ``str`` so it serialises as its name."""

    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    INVALID = "INVALID"

    def __str__(self) -> str:
        return self.value


Source = Literal["level", "request", "spec", "accuracy"]


@dataclass(frozen=True)
class MetricSpec:
    """What a gateable metric is and where it comes from.

    Attributes:
        name: the key used in the policy (and, for levels.csv metrics, the levels.csv column).
        source: ``level`` — the per-repeat figure of a levels.csv column (bootstrap over repeats);
            ``request`` — per-request values of a requests.csv ``column`` reduced by ``statistic`` (two-stage
            bootstrap); ``spec`` — per-repeat MTP figure from levels.csv (issue 5 columns); ``accuracy`` — GSM8K.
        default_margin: tolerated change on the bad side: percent of the baseline for ratio metrics (negative for
            higher-is-better), accuracy points for ``accuracy``.
    """

    name: str
    label: str
    unit: str
    higher_is_better: bool
    source: Source
    default_margin: float
    column: str = ""
    statistic: str = "mean"

    @property
    def margin_unit(self) -> str:
        return "pt" if self.source == "accuracy" else "%"


def _request_metrics() -> dict[str, MetricSpec]:
    specs = {}
    for column, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E latency")):
        for statistic, margin in (("mean", 3.0), ("median", 3.0), ("p99", 10.0)):
            name = f"{statistic}_{column}"
            specs[name] = MetricSpec(name, f"{statistic.capitalize() if statistic != 'p99' else 'P99'} {label}", "ms",
                                     False, "request", margin, column, statistic)
    return specs


METRICS: dict[str, MetricSpec] = {
    "output_throughput": MetricSpec("output_throughput", "Output throughput", "tok/s", True, "level", -3.0,
                                    "output_throughput"),
    "total_token_throughput": MetricSpec("total_token_throughput", "Total token throughput", "tok/s", True, "level",
                                         -3.0, "total_token_throughput"),
    "request_throughput": MetricSpec("request_throughput", "Request throughput", "req/s", True, "level", -3.0,
                                     "request_throughput"),
    **_request_metrics(),
    "acceptance_length": MetricSpec("acceptance_length", "MTP acceptance length", "tokens", True, "spec", -2.0,
                                    "acceptance_length"),
    "acceptance_rate": MetricSpec("acceptance_rate", "MTP acceptance rate", "", True, "spec", -2.0,
                                  "acceptance_rate"),
    "gsm8k_accuracy": MetricSpec("gsm8k_accuracy", "GSM8K accuracy", "%", True, "accuracy", -1.0),
}
"""Every metric a policy may name. p99 latency margins default to +10 %: a tail quantile is far noisier."""

DEFAULT_PRIMARY: tuple[str, ...] = ("output_throughput", "mean_tpot_ms", "gsm8k_accuracy", "acceptance_length")
DIAGNOSTIC: tuple[str, ...] = ("output_throughput", "total_token_throughput", "mean_tpot_ms", "p99_tpot_ms",
                               "mean_ttft_ms", "p99_ttft_ms", "mean_e2el_ms", "acceptance_length")
"""Metrics shown with an unadjusted 95 % interval when not primary (no verdict)."""


class GatePolicy(BaseModel):
    """The gate's policy: the scenario's ``[gate]`` table, or a ``--policy`` TOML file with the same fields.

    Example::

        [gate]
        primary = ["output_throughput", "mean_tpot_ms", "gsm8k_accuracy", "acceptance_length"]
        alpha = 0.05
        levels = [1, 8]              # default: every level of the run
        [gate.margins]               # per metric; % of baseline, or accuracy points for gsm8k_accuracy
        output_throughput = -3.0
        mean_tpot_ms = 3.0
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    primary: tuple[str, ...] = DEFAULT_PRIMARY
    margins: dict[str, float] = Field(default_factory=dict)
    levels: tuple[int, ...] | None = None
    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    min_repeats: int = Field(2, ge=2)
    bootstrap_resamples: int = Field(1000, ge=100, le=100_000)
    seed: int = Field(0, ge=0)
    gsm8k_filter: str = "flexible-extract"
    max_failed_fraction: float = Field(0.01, ge=0.0, le=1.0)
    min_concurrency_fraction: float = Field(0.8, ge=0.0, le=1.0)
    max_client_cpu_util: float = Field(0.9, gt=0.0)
    max_output_len_mismatch_fraction: float = Field(0.0, ge=0.0, le=1.0)
    min_requests_per_concurrency: float = Field(2.0, ge=0.0)
    min_requests_for_p99: int = Field(100, ge=1)
    require_attestation: bool = True

    @field_validator("primary")
    @classmethod
    def _known_primary(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in value if name not in METRICS]
        if unknown:
            raise ValueError(f"unknown primary metrics {unknown}; choose from {sorted(METRICS)}")
        if not value:
            raise ValueError("primary must name at least one metric")
        if len(set(value)) != len(value):
            raise ValueError("primary lists a metric twice")
        return value

    @field_validator("levels")
    @classmethod
    def _positive_levels(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or any(level <= 0 for level in value)):
            raise ValueError("levels must be positive concurrencies (omit the key for every level of the run)")
        return None if value is None else tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _margins_match_direction(self) -> "GatePolicy":
        for name, margin in self.margins.items():
            spec = METRICS.get(name)
            if spec is None:
                raise ValueError(f"margins names unknown metric {name!r}; choose from {sorted(METRICS)}")
            bad = margin > 0 if spec.higher_is_better else margin < 0
            if bad or not math.isfinite(margin) or (spec.margin_unit == "%" and abs(margin) >= 100):
                sign = "≤ 0" if spec.higher_is_better else "≥ 0"
                raise ValueError(f"margins.{name} = {margin}: {spec.label} is "
                                 f"{'higher' if spec.higher_is_better else 'lower'}-is-better, so its margin "
                                 f"(the tolerated change on the bad side) must be {sign}"
                                 f"{' and above -100 %' if spec.margin_unit == '%' else ''}")
        return self

    def margin(self, name: str) -> float:
        """The margin of ``name``: the policy's override or the metric's default (percent or accuracy points)."""
        return float(self.margins.get(name, METRICS[name].default_margin))

    def limit(self, name: str) -> float:
        """The margin on the test scale: ``log(1 + margin/100)`` for ratios, ``margin/100`` for accuracy."""
        margin = self.margin(name)
        return margin / 100.0 if METRICS[name].source == "accuracy" else math.log1p(margin / 100.0)

    def without(self, *names: str) -> "GatePolicy":
        """This policy with ``names`` dropped from ``primary`` (e.g. for ``--no-mtp``/``--no-gsm8k`` runs)."""
        return self.model_copy(update={"primary": tuple(n for n in self.primary if n not in names)})

    def describe(self) -> str:
        """One line: the margins and the correction."""
        parts = [f"{n} {self.margin(n):+g}{' pt' if METRICS[n].margin_unit == 'pt' else ' %'}" for n in self.primary]
        return (f"non-inferiority, Holm-corrected at α = {self.alpha:g} per family (PASS, FAIL); margins: "
                + ", ".join(parts))


# --------------------------------------------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class CellInput:
    """The data of one cell, ready for :func:`decide`.

    ``baseline[i]``/``candidate[i]``: values of paired repeat ``repeats[i]`` (per-request values, or a one-element
    array with the per-repeat figure). Accuracy cells carry ``correct = (baseline, candidate)`` per question instead.
    ``invalid`` reasons make the cell INVALID; ``notes`` are shown but change nothing; ``shown`` are the arms'
    figures displayed beside an INVALID cell (from whatever data exists; never tested).
    """

    metric: str
    level: int | None
    baseline: tuple[np.ndarray, ...] = ()
    candidate: tuple[np.ndarray, ...] = ()
    repeats: tuple[int, ...] = ()
    correct: tuple[np.ndarray, np.ndarray] | None = None
    invalid: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    primary: bool = True
    shown: tuple[float | None, float | None] = (None, None)


@dataclass
class CellResult:
    """One cell's outcome. ``delta``/``ci_*``/``margin`` are in % of baseline (``delta_unit`` "%") or accuracy points
    ("pt"); ``ci_level`` is the two-sided confidence of the interval shown (the Holm level the cell was tested at)."""

    metric: str
    level: int | None
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

    @property
    def spec(self) -> MetricSpec:
        return METRICS[self.metric]

    @property
    def where(self) -> str:
        return "GSM8K" if self.level is None else f"c={self.level}"

    def note(self) -> str:
        """One line for tables: why INVALID, what INCONCLUSIVE needs, or empty."""
        if self.reasons:
            return "; ".join(self.reasons)
        if self.status == Status.INCONCLUSIVE:
            if self.ci_low is None and self.notes:                 # too few repeats for any interval
                return f"{self.notes[0]}; run ≈{self.repeats_needed}"
            if self.repeats_needed is not None:
                return f"≈{self.repeats_needed} repeats would settle it (now {self.repeats})"
            if self.samples_needed is not None:
                return f"≈{self.samples_needed} questions would settle it (now {self.n_baseline})"
            return "the estimate sits on the margin (over 1000 repeats would be needed)"
        return ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; carries the keys the HTML report reads (``concurrency``, ``metric``, ``delta_pct``,
        ``ci_low_pct``, ``ci_high_pct``, ``margin_pct``, ``result``, ``note``)."""
        spec = self.spec
        data: dict[str, Any] = {
            "metric": self.metric, "label": spec.label, "unit": spec.unit, "concurrency": self.level,
            "primary": self.primary, "result": None if self.status is None else str(self.status),
            "higher_is_better": spec.higher_is_better, "baseline": self.baseline, "candidate": self.candidate,
            "ratio": self.ratio, "delta": self.delta, "ci_low": self.ci_low, "ci_high": self.ci_high,
            "delta_unit": spec.margin_unit, "ci_level": self.ci_level, "margin": self.margin,
            "p_pass": self.p_pass, "p_fail": self.p_fail, "p_pass_holm": self.p_pass_holm,
            "p_fail_holm": self.p_fail_holm, "repeats": self.repeats, "repeats_needed": self.repeats_needed,
            "samples_needed": self.samples_needed, "n_baseline": self.n_baseline, "n_candidate": self.n_candidate,
            "percentile_95": None if self.percentile_95 is None else list(self.percentile_95),
            "reasons": list(self.reasons), "notes": list(self.notes), "note": self.note(),
        }
        percent = spec.margin_unit == "%"                      # the *_pct keys exist on every cell (None for GSM8K)
        data.update(delta_pct=self.delta if percent else None, ci_low_pct=self.ci_low if percent else None,
                    ci_high_pct=self.ci_high if percent else None, margin_pct=self.margin if percent else None)
        if not percent:
            data.update(delta_pts=self.delta, ci_low_pts=self.ci_low, ci_high_pts=self.ci_high,
                        margin_pts=self.margin, mcnemar=self.mcnemar, accuracy=self.accuracy)
        return data


def _cell_seed(seed: int, metric: str, level: int | None) -> list[int]:
    """A stable per-cell seed: the same policy seed and cell give the same bootstrap on every machine."""
    return [seed, zlib.crc32(metric.encode()), 0 if level is None else level + 1]


def _estimate(cell: CellInput, policy: GatePolicy, n_resamples: int, seed: int) -> tuple[CellResult, tuple | None]:
    """A cell's point figures and, when testable, ``(estimate, se, df, limit)`` on the test scale."""
    spec = METRICS[cell.metric]
    result = CellResult(cell.metric, cell.level, cell.primary, None, list(cell.invalid), margin=policy.margin(
        cell.metric), repeats=len(cell.repeats), notes=list(cell.notes))
    if cell.invalid:
        result.status = Status.INVALID if cell.primary else None
        result.baseline, result.candidate = cell.shown
        return result, None
    if spec.source == "accuracy":
        assert cell.correct is not None
        base, cand = cell.correct
        diff = stats.paired_difference(base, cand)
        test = stats.mcnemar_exact(base, cand)
        result.baseline, result.candidate = 100 * diff.baseline, 100 * diff.candidate
        result.delta = 100 * diff.difference
        result.n_baseline = result.n_candidate = diff.n
        result.mcnemar = {"baseline_only": test.baseline_only, "candidate_only": test.candidate_only,
                          "both": test.both, "neither": test.neither, "p_value": test.p_value}
        result.accuracy = {"baseline_pct": 100 * diff.baseline, "baseline_stderr_pct": 100 * diff.baseline_stderr,
                           "candidate_pct": 100 * diff.candidate, "candidate_stderr_pct": 100 * diff.candidate_stderr,
                           "n": diff.n, "interval_center_pts": 100 * diff.adjusted}
        return result, (diff.adjusted, diff.se, math.inf, policy.limit(cell.metric))
    result.baseline = stats.statistic_of(cell.baseline, spec.statistic)
    result.candidate = stats.statistic_of(cell.candidate, spec.statistic)
    result.n_baseline = int(sum(a.size for a in cell.baseline))
    result.n_candidate = int(sum(a.size for a in cell.candidate))
    if result.baseline > 0 and result.candidate > 0:
        result.ratio = result.candidate / result.baseline
        result.delta = 100 * (result.ratio - 1)
    if len(cell.repeats) < policy.min_repeats:
        result.status = Status.INCONCLUSIVE if cell.primary else None
        result.repeats_needed = max(policy.min_repeats, RECOMMENDED_REPEATS)
        result.notes.append(f"{len(cell.repeats)} paired repeat(s): an interval needs ≥ {policy.min_repeats}")
        return result, None
    try:
        estimate = stats.paired_block_bootstrap(cell.baseline, cell.candidate, spec.statistic,
                                                n_resamples=n_resamples, seed=_cell_seed(seed, cell.metric, cell.level),
                                                resample_requests=spec.source == "request")
    except ValueError as error:
        result.reasons.append(f"no interval: {error}")
        result.status = Status.INVALID if cell.primary else None
        return result, None
    result.percentile_95 = (100 * (estimate.percentile_95[0] - 1), 100 * (estimate.percentile_95[1] - 1))
    return result, (estimate.log_ratio, estimate.se, estimate.df, policy.limit(cell.metric))


def _to_delta(spec: MetricSpec, value: float) -> float:
    """Test scale → shown scale: log ratio → % change; proportion difference → points."""
    return 100 * value if spec.source == "accuracy" else 100 * math.expm1(value)


def decide(cells: Sequence[CellInput], policy: GatePolicy, *, n_resamples: int | None = None,
           seed: int | None = None) -> list[CellResult]:
    """Decide every cell: INVALID from validity, else PASS/FAIL/INCONCLUSIVE by Holm-corrected margin tests.

    Primary cells with an estimate form the Holm families (PASS claims, FAIL claims; ``m`` = their number);
    non-primary cells get an unadjusted two-sided 95 % interval and no status. Each interval is shown at the
    two-sided confidence ``1 − 2a``, ``a`` being the level Holm tested the cell at (:func:`harness.stats.holm_test`),
    so a PASS cell's interval clears the margin and an INCONCLUSIVE one's touches it.

    Args:
        n_resamples, seed: override the policy's (simulations use fewer resamples and vary the seed).
    """
    n_resamples = policy.bootstrap_resamples if n_resamples is None else n_resamples
    seed = policy.seed if seed is None else seed
    results, tests = [], []
    for cell in cells:
        # Diagnostics get fewer resamples: the standard error settles by a few hundred (Efron & Tibshirani §6.4).
        result, test = _estimate(cell, policy, n_resamples if cell.primary else min(n_resamples, 400), seed)
        results.append(result)
        tests.append(test)
        if test is not None:
            spec = METRICS[cell.metric]
            result.p_pass, result.p_fail = stats.noninferiority_pvalues(*test, spec.higher_is_better)
    family = [i for i, (c, t) in enumerate(zip(cells, tests)) if c.primary and t is not None]
    m = len(family)
    if m:
        p_pass = [results[i].p_pass for i in family]
        p_fail = [results[i].p_fail for i in family]
        reject_pass, level_pass = stats.holm_test(p_pass, policy.alpha)
        reject_fail, level_fail = stats.holm_test(p_fail, policy.alpha)
        adj_pass, adj_fail = stats.holm_adjust(p_pass), stats.holm_adjust(p_fail)
        for k, i in enumerate(family):
            result, (estimate, se, df, limit) = results[i], tests[i]
            result.p_pass_holm, result.p_fail_holm = float(adj_pass[k]), float(adj_fail[k])
            if reject_fail[k]:
                result.status, level = Status.FAIL, level_fail[k]
            elif reject_pass[k]:
                result.status, level = Status.PASS, level_pass[k]
            else:
                result.status = Status.INCONCLUSIVE
                level = level_fail[k] if result.p_fail < result.p_pass else level_pass[k]
                distance = abs(estimate - limit)
                if math.isinf(df):
                    result.samples_needed = stats.samples_needed(distance, se, result.n_baseline or 0,
                                                                 policy.alpha / m)
                else:
                    result.repeats_needed = stats.repeats_needed(distance, se, result.repeats, policy.alpha / m)
            _set_interval(result, estimate, se, df, float(level))
    for i, (cell, test) in enumerate(zip(cells, tests)):
        if not cell.primary and test is not None:                   # diagnostics: no verdict, plain 95 %
            _set_interval(results[i], test[0], test[1], test[2], 0.025)
    return results


def _set_interval(result: CellResult, estimate: float, se: float, df: float, level: float) -> None:
    spec = result.spec
    low, high = stats.interval(estimate, se, df, level)
    result.ci_low, result.ci_high, result.ci_level = _to_delta(spec, low), _to_delta(spec, high), 1 - 2 * level
    if spec.source == "accuracy":
        result.notes.append(f"interval centred at the Agresti–Min estimate {_to_delta(spec, estimate):+.2f} pt")


SEVERITY = {Status.FAIL: 0, Status.INVALID: 1, Status.INCONCLUSIVE: 2, Status.PASS: 3}
"""Worst first: the overall verdict is the most severe primary cell's."""


def overall(results: Sequence[CellResult]) -> tuple[Status, str]:
    """The run's verdict from its primary cells, and one sentence saying why.

    FAIL if any FAILs; else INVALID if any is INVALID (or no primary cell exists); else INCONCLUSIVE if any is; else
    PASS.
    """
    primary = [r for r in results if r.primary]
    if not primary:
        return Status.INVALID, "no primary cells: the run holds none of the policy's metrics and levels"
    worst = min((r.status for r in primary), key=lambda s: SEVERITY[s])
    hit = [r for r in primary if r.status == worst]
    first = hit[0]
    which = _which(hit)
    if worst == Status.FAIL:
        return worst, (f"{len(hit)} primary cell(s) beyond the margin ({which}), e.g. {first.spec.label} at "
                       f"{first.where}: {first.delta:+.2f} {first.spec.margin_unit} [{first.ci_low:+.2f}, "
                       f"{first.ci_high:+.2f}] vs margin {first.margin:+g} {first.spec.margin_unit}")
    if worst == Status.INVALID:
        return worst, f"{len(hit)} primary cell(s) INVALID ({which}), e.g. {first.where}: {first.note()}"
    if worst == Status.INCONCLUSIVE:
        needs = [r.repeats_needed for r in hit if r.repeats_needed is not None]
        tail = (f"; at the observed spread ≈{max(needs)} repeats would settle them" if needs
                else "; see each cell's note")
        return worst, f"{len(hit)} primary cell(s) INCONCLUSIVE ({which}){tail}"
    return worst, f"all {len(primary)} primary cells are non-inferior within their margins"


def _which(cells: Sequence[CellResult]) -> str:
    """``Output throughput c=1, 8; GSM8K accuracy``: cells grouped by metric."""
    groups: dict[str, list[str]] = {}
    for cell in cells:
        groups.setdefault(cell.spec.label, []).append("" if cell.level is None else str(cell.level))
    return "; ".join(label + (" c=" + ", ".join(v for v in levels if v) if any(levels) else "")
                     for label, levels in groups.items())


# ------------------------------------------------------------------------------------------------------------ validity


_LEVEL_KEY = re.compile(r"^c(\d+)-r(\d+)$")


@dataclass
class ValidityReport:
    """Validity of a run's data, per arm and level.

    Attributes:
        arms: ``{"baseline": name, "candidate": name}`` (arm names in the tables).
        reasons: ``{(arm, level): [(repeat or None, detail)]}`` — any makes every cell of that level INVALID
            (:meth:`level_reasons` words them).
        arm_reasons: ``{arm: [reason]}`` — reasons that invalidate every cell of the arm (attestation).
        done: ``{(arm, level): {repeat}}`` — repeats whose data passed every check.
        no_requests: ``{(arm, level): {repeat}}`` — done repeats without requests.csv rows (request metrics only).
        levels: every level the run planned or holds.
        not_checked: checks that could not run on this data, with why.
        failures: one record per failed check ``{arm, concurrency, repeat, check, detail}``.
    """

    arms: dict[str, str]
    reasons: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    arm_reasons: dict[str, list[str]] = field(default_factory=dict)
    done: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    no_requests: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    levels: tuple[int, ...] = ()
    not_checked: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def fail(self, arm: str, level: int, repeat: int | None, check: str, detail: str) -> None:
        self.reasons.setdefault((arm, level), []).append((repeat, detail))
        self.failures.append({"arm": arm, "concurrency": level, "repeat": repeat, "check": check, "detail": detail})

    def level_reasons(self, level: int) -> list[str]:
        """The level's failures for both arms, one line per distinct problem: ``baseline r0, r3: <detail>``."""
        grouped: dict[str, dict[str, list[int | None]]] = {}
        for role in ("baseline", "candidate"):
            for repeat, detail in self.reasons.get((self.arms[role], level), []):
                grouped.setdefault(detail, {}).setdefault(role, []).append(repeat)
        lines = []
        for detail, roles in grouped.items():
            who = []
            for role, repeats in roles.items():
                shown = [f"r{r}" for r in repeats if r is not None]
                if len(shown) > 4:
                    shown = shown[:3] + [f"… ({len(shown)} repeats)"]
                who.append(role + (" " + ", ".join(shown) if shown else ""))
            lines.append(f"{' and '.join(who)}: {detail}")
        return lines


def _arm_names(manifest: Mapping[str, Any]) -> dict[str, str]:
    names = {"baseline": "baseline", "candidate": "candidate"}
    arms = manifest.get("arms")
    if isinstance(arms, Mapping):
        for name, arm in arms.items():
            if isinstance(arm, Mapping) and arm.get("route") in names:
                names[arm["route"]] = str(name)
    return names


def _flag_value(argv: Any, flag: str) -> str | None:
    if not isinstance(argv, (list, tuple)):
        return None
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            return str(argv[i + 1])
        if isinstance(item, str) and item.startswith(flag + "="):
            return item.split("=", 1)[1]
    return None


def _expected_output_len(arm: Mapping[str, Any] | None) -> int | None:
    """Requested output length when every request must produce exactly it (``--ignore-eos``, no length range)."""
    argv = (arm or {}).get("bench_command")
    if not isinstance(argv, (list, tuple)) or "--ignore-eos" not in argv:
        return None
    try:
        if float(_flag_value(argv, "--random-range-ratio") or 0) != 0:
            return None
        length = _flag_value(argv, "--random-output-len")
        return int(length) if length is not None else None
    except ValueError:
        return None


def _num(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _achieved_concurrency(frame) -> float | None:
    """Time-averaged number of requests in flight over the level (Little's law): Σ E2EL / (last end − first start),
    from the per-request timeline (``start_s``, ``e2el_ms``). A client that keeps ``c`` requests in flight scores
    about ``c``; ramp-up and drain lower it a little. (Counting requests in flight at each request's start is biased
    low under ``--ignore-eos``: equal-length requests finish together and their replacements start one by one.)"""
    start = frame["start_s"].to_numpy(dtype=float)
    latency = frame["e2el_ms"].to_numpy(dtype=float) / 1000.0
    ok = np.isfinite(start) & np.isfinite(latency)
    start, latency = start[ok], latency[ok]
    if start.size == 0:
        return None
    span = float((start + latency).max() - start.min())
    return float(latency.sum() / span) if span > 0 else None


def _succeeded(frame):
    error = frame["error"]
    return frame[error.isna() | (error.astype(str).str.strip() == "")]


def check_validity(manifest: Mapping[str, Any], levels, requests, policy: GatePolicy) -> ValidityReport:
    """Run every validity check of issue 6 on the run's data.

    Per arm and level (any failure → the level's cells are INVALID): a planned repeat not ``done`` (failed, skipped,
    missing — issue 7's partial runs); a done repeat without its levels.csv row; failed requests above
    ``max_failed_fraction``; fewer than ``min_requests_per_concurrency × c`` completed requests (ramp-up and drain
    dominate); achieved concurrency below ``min_concurrency_fraction × c`` by vLLM's ``max_concurrent_requests`` or by
    the per-request timeline; the client saturated (``client_cpu_util`` ≥ ``max_client_cpu_util``); under
    ``--ignore-eos``, server-counted output tokens differing from the requested length; requests.csv rows disagreeing
    with levels.csv counts. Per arm: the observed path differs from the intended one (attestation), or, with
    ``require_attestation``, was not attested.
    """
    report = ValidityReport(arms=_arm_names(manifest))
    arms_manifest = manifest.get("arms") if isinstance(manifest.get("arms"), Mapping) else {}
    scenario = manifest.get("scenario") if isinstance(manifest.get("scenario"), Mapping) else {}
    workload = scenario.get("workload") if isinstance(scenario.get("workload"), Mapping) else {}
    planned_levels = {int(c) for c in workload.get("concurrency") or [] if _num(c)}
    planned_repeats = int(workload["repeats"]) if _num(workload.get("repeats")) else None
    level_set = set(planned_levels) | {int(c) for c in levels["concurrency"].dropna()}
    statuses: dict[tuple[str, int], dict[int, str]] = {}
    for role, arm in report.arms.items():
        arm_data = arms_manifest.get(arm) if isinstance(arms_manifest.get(arm), Mapping) else {}
        for key, entry in (arm_data.get("levels") or {}).items():
            match = _LEVEL_KEY.match(str(key))
            if match:
                status = entry.get("status") if isinstance(entry, Mapping) else entry
                statuses.setdefault((arm, int(match.group(1))), {})[int(match.group(2))] = str(status)
                level_set.add(int(match.group(1)))
        attestation = arm_data.get("attestation")
        if isinstance(attestation, Mapping) and attestation.get("valid") is False:
            mismatches = "; ".join(str(m) for m in attestation.get("mismatches") or []) or "no details"
            report.arm_reasons.setdefault(arm, []).append(f"{role}: observed path differs from intended ({mismatches})")
        elif not (isinstance(attestation, Mapping) and attestation.get("valid") is True) and policy.require_attestation:
            report.arm_reasons.setdefault(arm, []).append(
                f"{role}: execution path not attested (manifest.json has no arms.{arm}.attestation)")
    report.levels = tuple(sorted(level_set))

    has_cpu = "client_cpu_util" in levels.columns and levels["client_cpu_util"].notna().any()
    if not has_cpu:
        report.not_checked.append("client saturation: levels.csv has no client_cpu_util")
    has_requested = "requested_output_len" in requests.columns
    level_rows = {(str(a), int(c), int(r)): row for (a, c, r), row in
                  levels.drop_duplicates(["arm", "concurrency", "repeat"], keep="last")
                  .set_index(["arm", "concurrency", "repeat"]).iterrows()} if len(levels) else {}
    request_groups = {(str(a), int(c), int(r)): frame for (a, c, r), frame in
                      requests.groupby(["arm", "concurrency", "repeat"])} if len(requests) else {}
    if not request_groups:
        report.not_checked.append("timeline concurrency and output lengths: requests.csv is absent or empty")
    expected_len = {arm: _expected_output_len(arms_manifest.get(arm)) for arm in report.arms.values()}
    if not has_requested and not any(v is not None for v in expected_len.values()):
        report.not_checked.append("output lengths: not an --ignore-eos run with a fixed --random-output-len")

    for arm in report.arms.values():
        for level in report.levels:
            recorded = statuses.get((arm, level), {})
            rows = {r for (a, c, r) in level_rows if a == arm and c == level}
            planned = set(recorded) | rows | (set(range(planned_repeats)) if planned_repeats else set())
            if not planned:
                report.fail(arm, level, None, "missing", "level not run (no manifest entry, no levels.csv row)")
                continue
            done = set()
            for repeat in sorted(planned):
                status = recorded.get(repeat, "done" if repeat in rows and not recorded else None)
                if status is None:
                    report.fail(arm, level, repeat, "missing", "not run (no manifest entry)")
                elif status != "done":
                    report.fail(arm, level, repeat, "status", f"{status}" if status.startswith("failed")
                                else f"not run ({status})")
                elif repeat not in rows:
                    report.fail(arm, level, repeat, "missing", "done in manifest.json but no levels.csv row")
                elif _check_repeat(report, policy, arm, level, repeat, level_rows[(arm, level, repeat)],
                                   request_groups.get((arm, level, repeat)), expected_len[arm], has_requested):
                    done.add(repeat)
            report.done[(arm, level)] = done
            report.no_requests[(arm, level)] = {r for r in done if (arm, level, r) not in request_groups}
    return report


def _check_repeat(report: ValidityReport, policy: GatePolicy, arm: str, level: int, repeat: int, row,
                  frame, expected_len: int | None, has_requested: bool) -> bool:
    """Checks on one done repeat; records failures and returns whether it passed them all."""
    before = len(report.failures)
    completed, failed = _num(row.get("completed")) or 0.0, _num(row.get("failed")) or 0.0
    total = completed + failed
    if completed <= 0:
        report.fail(arm, level, repeat, "failed_requests", "no completed requests")
    elif failed / total > policy.max_failed_fraction:
        report.fail(arm, level, repeat, "failed_requests",
                    f"{failed:.0f} of {total:.0f} requests failed (> {100 * policy.max_failed_fraction:g} %)")
    if 0 < completed < policy.min_requests_per_concurrency * level:
        report.fail(arm, level, repeat, "too_few_requests",
                    f"{completed:.0f} requests at concurrency {level}: fewer than "
                    f"{policy.min_requests_per_concurrency:g}×{level}, ramp-up and drain dominate")
    peak = _num(row.get("max_concurrent_requests"))
    if peak is not None and peak < policy.min_concurrency_fraction * level:
        report.fail(arm, level, repeat, "concurrency", f"vLLM's max_concurrent_requests {peak:.0f} far below "
                                                       f"the level {level}")
    cpu = _num(row.get("client_cpu_util"))
    if cpu is not None and cpu >= policy.max_client_cpu_util:
        report.fail(arm, level, repeat, "client_saturated",
                    f"benchmark client used {100 * cpu:.0f} % of a core (≥ {100 * policy.max_client_cpu_util:g} %): "
                    "the client, not the server, may be the bottleneck")
    if frame is not None:
        if len(frame) != total:
            report.fail(arm, level, repeat, "request_rows", f"requests.csv has {len(frame)} rows, levels.csv "
                                                            f"counts {total:.0f} requests")
        ok = _succeeded(frame)
        achieved = _achieved_concurrency(ok)
        if achieved is not None and achieved < policy.min_concurrency_fraction * level:
            report.fail(arm, level, repeat, "concurrency",
                        f"achieved concurrency {achieved:.2f} (Σ E2EL / span) far below {level}")
        expected = ok["requested_output_len"] if has_requested else (
            None if expected_len is None else expected_len)
        if expected is not None:
            wanted = np.asarray(expected, dtype=float) if has_requested else np.full(len(ok), float(expected_len))
            got = ok["output_len"].to_numpy(dtype=float)
            checkable = np.isfinite(wanted)
            mismatched = int((got[checkable] != wanted[checkable]).sum())
            if checkable.any() and mismatched / checkable.sum() > policy.max_output_len_mismatch_fraction:
                report.fail(arm, level, repeat, "output_len",
                            f"{mismatched} of {int(checkable.sum())} requests produced a different number of tokens "
                            "than requested under --ignore-eos (the server stopped early or counted differently)")
    return len(report.failures) == before


# -------------------------------------------------------------------------------------------------------- cell building


def _spec_values(row) -> float | None:
    """Acceptance length of one repeat: 1 + accepted/drafts from the counters when present, else the column."""
    drafts, accepted = _num(row.get("spec_drafts")), _num(row.get("spec_accepted_tokens"))
    if drafts is not None and accepted is not None:
        return 1.0 + accepted / drafts if drafts > 0 else None
    value = _num(row.get("acceptance_length"))
    return value if value is not None and value > 0 else None


def _spec_rate(row) -> float | None:
    draft_tokens, accepted = _num(row.get("spec_draft_tokens")), _num(row.get("spec_accepted_tokens"))
    if draft_tokens is not None and accepted is not None:
        return accepted / draft_tokens if draft_tokens > 0 else None
    return _num(row.get("acceptance_rate"))


def build_cells(manifest: Mapping[str, Any], levels, requests, accuracy, policy: GatePolicy,
                validity: ValidityReport, *, diagnostics: bool = True) -> list[CellInput]:
    """The primary cells (every primary metric × every policy level, plus GSM8K) and, optionally, diagnostic ones.

    A cell uses the repeats that are valid in both arms. Missing data (no levels.csv column, no requests.csv rows, no
    accuracy.csv, no MTP counters) makes a primary cell INVALID with a reason naming the file and the fix.
    """
    base, cand = validity.arms["baseline"], validity.arms["candidate"]
    wanted_levels = policy.levels if policy.levels is not None else validity.levels
    rows = levels.drop_duplicates(["arm", "concurrency", "repeat"], keep="last")
    level_rows = {(str(a), int(c), int(r)): row for (a, c, r), row in
                  rows.set_index(["arm", "concurrency", "repeat"]).iterrows()} if len(rows) else {}
    ok_requests = _succeeded(requests) if len(requests) else requests
    request_groups = {(str(a), int(c), int(r)): frame for (a, c, r), frame in
                      ok_requests.groupby(["arm", "concurrency", "repeat"])} if len(ok_requests) else {}
    names = list(policy.primary)
    if diagnostics:
        names += [n for n in DIAGNOSTIC if n not in policy.primary]
    cells = []
    for name in names:
        spec = METRICS[name]
        primary = name in policy.primary
        if spec.source == "accuracy":
            cells.append(_accuracy_cell(accuracy, policy, validity, base, cand))
            continue
        if not primary and spec.source == "spec" and not _has_spec_data(levels):
            continue
        for level in wanted_levels:
            cells.append(_level_cell(spec, level, primary, validity, level_rows, request_groups, levels, policy,
                                     base, cand))
    return cells


def _has_spec_data(levels) -> bool:
    return any(c in levels.columns and levels[c].notna().any()
               for c in ("acceptance_length", "spec_drafts"))


def _level_cell(spec: MetricSpec, level: int, primary: bool, validity: ValidityReport, level_rows, request_groups,
                levels, policy: GatePolicy, base: str, cand: str) -> CellInput:
    reasons = [r for arm in (base, cand) for r in validity.arm_reasons.get(arm, [])]
    if level not in validity.levels:
        reasons.append(f"level {level} is not in this run")
    reasons += validity.level_reasons(level)
    if spec.source == "spec" and not _has_spec_data(levels):
        reasons.append("levels.csv has no MTP columns (acceptance_length, spec_drafts …): MTP was off or not "
                       f"recorded; with MTP off, drop {spec.name!r} from [gate].primary")
    common = sorted(validity.done.get((base, level), set()) & validity.done.get((cand, level), set()))
    if not common and not reasons:
        reasons.append("no repeat done in both arms")
    values: dict[str, list[np.ndarray]] = {base: [], cand: []}
    if not reasons:
        for arm in (base, cand):
            for repeat in common:
                value = _cell_values(spec, level_rows[(arm, level, repeat)], request_groups.get((arm, level, repeat)),
                                     levels)
                if isinstance(value, str):
                    reasons.append(f"{'baseline' if arm == base else 'candidate'} r{repeat}: {value}")
                else:
                    values[arm].append(value)
        if spec.statistic.startswith("p") and spec.source == "request" and not reasons:
            for arm in (base, cand):
                n = sum(v.size for v in values[arm])
                if n < policy.min_requests_for_p99:
                    reasons.append(f"{'baseline' if arm == base else 'candidate'}: {n} requests over {len(common)} "
                                   f"repeat(s), fewer than the {policy.min_requests_for_p99} a p99 needs")
    reasons = list(dict.fromkeys(reasons))
    if reasons:
        shown = tuple(_shown_value(spec, arm, level, level_rows, request_groups, levels) for arm in (base, cand))
        return CellInput(spec.name, level, invalid=tuple(reasons), primary=primary, shown=shown)
    return CellInput(spec.name, level, tuple(values[base]), tuple(values[cand]), tuple(common), primary=primary)


def _shown_value(spec: MetricSpec, arm: str, level: int, level_rows, request_groups, levels) -> float | None:
    """The arm's figure over whatever repeats it has, valid or not: shown beside an INVALID cell, never tested."""
    values = []
    for (a, c, r), row in level_rows.items():
        if a == arm and c == level:
            value = _cell_values(spec, row, request_groups.get((a, c, r)), levels)
            if not isinstance(value, str):
                values.append(value)
    try:
        return stats.statistic_of(values, spec.statistic) if values else None
    except ValueError:
        return None


def _cell_values(spec: MetricSpec, row, frame, levels) -> np.ndarray | str:
    """One repeat's values for a cell, or a reason string when they are missing."""
    if spec.source == "level":
        value = _num(row.get(spec.column))
        if value is None or value <= 0:
            return f"levels.csv {spec.column} is empty or not positive"
        return np.array([value])
    if spec.source == "spec":
        value = _spec_values(row) if spec.name == "acceptance_length" else _spec_rate(row)
        if value is None or value <= 0:
            return f"no MTP {spec.name} in this window (no drafts, or a zero rate: a ratio is undefined)"
        return np.array([value])
    if frame is None:
        return "no successful requests in requests.csv"
    values = frame[spec.column].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return f"requests.csv has no {spec.column} values"
    return values


def _accuracy_cell(accuracy, policy: GatePolicy, validity: ValidityReport, base: str, cand: str) -> CellInput:
    name = "gsm8k_accuracy"
    primary = name in policy.primary
    reasons = [r for arm in (base, cand) for r in validity.arm_reasons.get(arm, [])]
    if accuracy is None or len(accuracy) == 0:
        return CellInput(name, None, invalid=tuple(reasons + [
            "accuracy.csv is absent or empty: GSM8K did not run (drop 'gsm8k_accuracy' from [gate].primary for a "
            "run without it)"]), primary=primary)
    frame = accuracy[accuracy["filter"].astype(str) == policy.gsm8k_filter]
    per_arm = {}
    for arm in (base, cand):
        rows = frame[frame["arm"].astype(str) == arm]
        if rows.empty:
            reasons.append(f"accuracy.csv has no {policy.gsm8k_filter!r} rows for {arm}")
            continue
        if rows["question_id"].duplicated().any():
            reasons.append(f"accuracy.csv repeats question ids for {arm}")
        per_arm[arm] = rows.drop_duplicates("question_id", keep="last").set_index("question_id")["correct"]
    if not reasons:
        ids_b, ids_c = set(per_arm[base].index), set(per_arm[cand].index)
        if ids_b != ids_c:
            reasons.append(f"the arms answered different questions (baseline {len(ids_b)}, candidate {len(ids_c)}, "
                           f"common {len(ids_b & ids_c)}): a paired comparison needs the same set")
        elif len(ids_b) < 2:
            reasons.append("fewer than two GSM8K questions")
    if reasons:
        return CellInput(name, None, invalid=tuple(dict.fromkeys(reasons)), primary=primary)
    order = sorted(per_arm[base].index, key=str)
    try:
        correct = tuple(_as_bool(per_arm[arm].loc[order]) for arm in (base, cand))
    except ValueError as error:
        return CellInput(name, None, invalid=(f"accuracy.csv: {error}",), primary=primary)
    return CellInput(name, None, correct=correct, primary=primary)


def _as_bool(series) -> np.ndarray:
    text = series.astype(str).str.strip().str.lower()
    mapping = {"1": True, "1.0": True, "true": True, "0": False, "0.0": False, "false": False}
    unknown = sorted(set(text) - set(mapping))
    if unknown:
        raise ValueError(f"'correct' must be 0/1 or true/false, found {unknown[:3]}")
    return text.map(mapping).to_numpy(dtype=bool)


# ------------------------------------------------------------------------------------------------------------ evaluate


@dataclass
class Verdict:
    """The gate's answer for one run: overall status and reason, primary and diagnostic cells, validity."""

    status: Status
    reason: str
    cells: list[CellResult]
    validity: ValidityReport
    policy: GatePolicy
    notes: list[str] = field(default_factory=list)

    @property
    def primary(self) -> list[CellResult]:
        return [c for c in self.cells if c.primary]

    @property
    def diagnostics(self) -> list[CellResult]:
        return [c for c in self.cells if not c.primary]


def evaluate(manifest: Mapping[str, Any], levels, requests, accuracy, policy: GatePolicy, *,
             diagnostics: bool = True) -> Verdict:
    """Validity checks, cells, decisions and the overall verdict of one run (pure)."""
    validity = check_validity(manifest, levels, requests, policy)
    cells = build_cells(manifest, levels, requests, accuracy, policy, validity, diagnostics=diagnostics)
    results = decide(cells, policy)
    status, reason = overall(results)
    notes = []
    run_status = manifest.get("status")
    if run_status not in (None, "done"):
        notes.append(f"run status is {run_status!r}: cells of levels that did not finish are INVALID")
    notes += [f"not checked — {n}" for n in validity.not_checked]
    return Verdict(status, reason, results, validity, policy, notes)


# ---------------------------------------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class RepeatPool:
    """Recorded sweeps of one path, in time order, for resampling experiments.

    ``sweeps[i][level]`` = ``{"level": {column: value}, "request": {column: values}}`` of the i-th recorded repeat.
    """

    levels: tuple[int, ...]
    sweeps: tuple[dict[int, dict[str, dict[str, Any]]], ...]


def repeat_pool(levels, requests, arms: Sequence[str] = ("baseline",)) -> RepeatPool:
    """Collect the recorded repeats of ``arms`` (the same path) as a pool of sweeps in time order.

    With several arms (a recorded A/A run), repeat ``r`` contributes one sweep per arm, alternating ABBA.
    Only repeats present at every level are kept.
    """
    ok = _succeeded(requests) if len(requests) else requests
    rows = levels[levels["arm"].astype(str).isin(arms)]
    level_list = tuple(sorted(int(c) for c in rows["concurrency"].unique()))
    sweeps = []
    for repeat in sorted(int(r) for r in rows["repeat"].unique()):
        order = list(arms) if repeat % 2 == 0 else list(reversed(arms))
        for arm in order:
            sweep = {}
            for level in level_list:
                row = rows[(rows["arm"] == arm) & (rows["concurrency"] == level) & (rows["repeat"] == repeat)]
                if row.empty:
                    break
                frame = ok[(ok["arm"] == arm) & (ok["concurrency"] == level) & (ok["repeat"] == repeat)]
                sweep[level] = {
                    "level": row.iloc[-1].to_dict(),
                    "request": {c: frame[c].to_numpy(dtype=float)[np.isfinite(frame[c].to_numpy(dtype=float))]
                                for c in ("ttft_ms", "tpot_ms", "e2el_ms")},
                }
            else:
                sweeps.append(sweep)
    if len(sweeps) < 4:
        raise ValueError(f"the pool holds {len(sweeps)} complete sweeps; a split-in-two simulation needs ≥ 4")
    return RepeatPool(level_list, tuple(sweeps))


@dataclass(frozen=True)
class SimulationResult:
    """Verdict counts over ``n_sims`` simulated experiments of ``repeats`` paired repeats each."""

    counts: dict[str, int]
    n_sims: int
    repeats: int
    with_replacement: bool

    def rate(self, status: Status | str) -> float:
        return self.counts.get(str(status), 0) / self.n_sims


def simulate_gate(pool: RepeatPool, policy: GatePolicy, *, repeats: int, n_sims: int = 500, seed: int = 0,
                  throughput_factor: float = 1.0, latency_factor: float = 1.0,
                  n_resamples: int = 200) -> SimulationResult:
    """Verdict rates on experiments resampled from recorded data of one path (the A/A split of issue 6's proof).

    Each experiment picks ``repeats`` of the pool's time-adjacent sweep pairs (0, 1), (2, 3), … without replacement
    (with replacement when the pool is too small, flagged in the result), and assigns the two sweeps of each pair to
    baseline and candidate at random — "the same arm split in two", paired as an ABBA run pairs them. An effect is
    injected by scaling the candidate: ``throughput_factor`` multiplies levels.csv throughputs, ``latency_factor``
    per-request latencies. Only levels.csv and requests.csv metrics can be simulated.

    ``n_resamples`` bootstrap resamples per cell suffice because the interval uses the bootstrap standard error.
    """
    unsupported = [n for n in policy.primary if METRICS[n].source not in ("level", "request")]
    if unsupported:
        raise ValueError(f"cannot simulate {unsupported} from levels.csv/requests.csv; drop them from the policy")
    rng = np.random.default_rng(seed)
    pairs = len(pool.sweeps) // 2
    with_replacement = pairs < repeats
    wanted = [lv for lv in pool.levels if policy.levels is None or lv in policy.levels]
    counts: dict[str, int] = {}
    for sim in range(n_sims):
        chosen = rng.choice(pairs, size=repeats, replace=with_replacement)
        swap = rng.random(repeats) < 0.5
        a_idx = [2 * p + int(s) for p, s in zip(chosen, swap)]
        b_idx = [2 * p + 1 - int(s) for p, s in zip(chosen, swap)]
        cells = []
        for name in policy.primary:
            spec = METRICS[name]
            for level in wanted:
                if spec.source == "level":
                    base = tuple(np.array([float(pool.sweeps[i][level]["level"][spec.column])]) for i in a_idx)
                    cand = tuple(np.array([float(pool.sweeps[i][level]["level"][spec.column]) * throughput_factor])
                                 for i in b_idx)
                else:
                    base = tuple(pool.sweeps[i][level]["request"][spec.column] for i in a_idx)
                    cand = tuple(pool.sweeps[i][level]["request"][spec.column] * latency_factor for i in b_idx)
                cells.append(CellInput(name, level, base, cand, tuple(range(repeats))))
        status, _ = overall(decide(cells, policy, n_resamples=n_resamples, seed=seed * 100_003 + sim))
        counts[str(status)] = counts.get(str(status), 0) + 1
    return SimulationResult(counts, n_sims, repeats, with_replacement)
