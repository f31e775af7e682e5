"""From a run's tables to a verdict: per-cell PASS/FAIL/INCONCLUSIVE/INVALID, overall.

Pure: functions of the typed manifest and the ``levels.csv``/``requests.csv``/``accuracy.csv`` frames (schema:
:mod:`harness.rundir.schema`; cells built by :mod:`harness.judge.cells`); no files, processes or sockets. :mod:`harness.gate` does the reading and writing. The metrics,
margins and policy are :mod:`harness.judge.policy`'s (margins' origin there); the validity checks :mod:`harness.judge.validity`'s.

A *cell* is one primary metric at one concurrency level (or GSM8K accuracy, which has no level). Per cell:

- **INVALID** when a validity check fails for either arm (:func:`~harness.judge.validity.check_validity`) or the data is
  missing;
- otherwise the candidate/baseline ratio (accuracy: difference) with its paired interval (:mod:`harness.judge.stats`) is
  tested against the metric's margin: **PASS** (non-inferior) when the cell's own test rejects "worse than the margin"
  at ``alpha`` (intersection–union, Berger 1982: no multiplicity adjustment on the PASS side, since PASS needs every
  cell); **FAIL** when Holm (1979) over the metric's family {pooled hypothesis (geometric mean of the per-level
  ratios), each level} rejects "within the margin" for it at ``alpha / K`` for ``K`` primary metrics
  (:func:`decide`); **INCONCLUSIVE** otherwise, or when the spread is degenerate (zero).

Overall: FAIL if any primary cell or pooled hypothesis FAILs; else INVALID if any is INVALID (or there are none); else INCONCLUSIVE if any
is; else PASS. Missing or unreadable data never yields PASS.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from harness.judge import advice, design_costs, paired_accuracy, planning, sequential, stalls, stats
from harness.judge.cell_result import EXACT, ZERO_SPREAD, CellResult
from harness.judge.cells import CellInput, build_cells
from harness.judge.policy import METRICS, RECOMMENDED_REPEATS, SEVERITY, GatePolicy, Metric, Status
from harness.judge.stalls import Stall
from harness.judge.validity import ValidityReport, check_validity
from harness.rundir.schema import Level, Manifest, Regime, level_regimes
from harness.rundir.v2 import with_level_column

__all__ = ["CellInput", "CellResult", "Verdict", "build_cells", "decide", "overall", "evaluate"]


# --------------------------------------------------------------------------------------------------------------- cells


def _cell_seed(seed: int, metric: str, level: Level | None) -> list[int]:
    """A stable per-cell seed: the same policy seed and cell give the same bootstrap on every machine. Levels of two
    regimes at one concurrency share it (their resamples are then dependent; Holm holds under any dependence), so a
    one-regime run keeps the seeds, hence the intervals, it had before levels had regimes."""
    return [seed, zlib.crc32(metric.encode()), 0 if level is None else level.concurrency + 1]


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
        diff = paired_accuracy.paired_difference(base, cand)
        test = paired_accuracy.mcnemar_exact(base, cand)
        result.baseline, result.candidate = 100 * diff.baseline, 100 * diff.candidate
        result.delta = 100 * diff.difference
        result.n_baseline = result.n_candidate = diff.n
        result.mcnemar = {"baseline_only": test.baseline_only, "candidate_only": test.candidate_only,
                          "both": test.both, "neither": test.neither, "p_value": test.p_value}
        result.accuracy = {"baseline_pct": 100 * diff.baseline, "baseline_stderr_pct": 100 * diff.baseline_stderr,
                           "candidate_pct": 100 * diff.candidate, "candidate_stderr_pct": 100 * diff.candidate_stderr,
                           "n": diff.n, "interval_center_pts": 100 * diff.adjusted}
        return result, _Test(diff.difference, diff.se, math.inf, policy.limit(cell.metric),
                             (test.baseline_only, test.candidate_only, diff.n))
    result.baseline = stats.statistic_of(cell.baseline, spec.statistic)
    result.candidate = stats.statistic_of(cell.candidate, spec.statistic)
    result.n_baseline = int(sum(a.size for a in cell.baseline))
    result.n_candidate = int(sum(a.size for a in cell.candidate))
    if result.baseline > 0 and result.candidate > 0:
        result.ratio = result.candidate / result.baseline
        result.delta = 100 * (result.ratio - 1)
    too_few = _too_few_sessions(cell, policy)
    if too_few:
        result.status = Status.INCONCLUSIVE if cell.primary else None
        result.repeats_needed = max(policy.min_sessions, RECOMMENDED_REPEATS)
        result.notes.append(too_few)
        return result, None
    try:                    # sessions only: resampling requests too counts request noise twice (issue #24, item 4)
        estimate = stats.paired_block_bootstrap(cell.baseline, cell.candidate, spec.statistic,
                                                n_resamples=n_resamples, seed=_cell_seed(seed, cell.metric, cell.level),
                                                resample_requests=False)
    except ValueError as error:
        result.reasons.append(f"no interval: {error}")
        result.status = Status.INVALID if cell.primary else None
        return result, None
    result.percentile_95 = (100 * (estimate.percentile_95[0] - 1), 100 * (estimate.percentile_95[1] - 1))
    return result, _Test(estimate.log_ratio, estimate.se, estimate.df, policy.limit(cell.metric),
                         exact=METRICS[cell.metric].repeats_exactly)


@dataclass(frozen=True)
class _Test:
    """A cell's test on its scale: ``estimate`` (log ratio, or proportion difference), ``se``, ``df`` (inf: normal),
    the margin ``limit``; ``score = (b, c, n)`` for an accuracy cell, tested by Tango's score test instead of the
    Wald statistic (``se``, Agresti–Min's, is then not used: the interval, the p-values and the questions a decision
    needs, :func:`harness.judge.paired_accuracy.samples_needed`, all come from the score test)."""

    estimate: float
    se: float
    df: float
    limit: float
    score: tuple[int, int, int] | None = None
    exact: bool = False

    def pvalues(self, higher_is_better: bool) -> tuple[float, float]:
        """``(p_pass, p_fail)`` against the margin."""
        if self.score is not None:
            return paired_accuracy.tango_pvalues(*self.score, self.limit)
        return stats.noninferiority_pvalues(self.estimate, self.se, self.df, self.limit, higher_is_better, self.exact)

    def interval(self, level: float) -> tuple[float, float]:
        """Two-sided interval at confidence ``1 − 2 level`` that agrees with :meth:`pvalues` at ``level``."""
        if self.score is not None:
            return paired_accuracy.tango_interval(*self.score, level)
        return stats.interval(self.estimate, self.se, self.df, level)


def _too_few_sessions(cell: CellInput, policy: GatePolicy) -> str | None:
    """Why a throughput/latency cell cannot be decided for want of server sessions, or None.

    The unit of replication is the server session: rounds inside one session share its offset (compile outcome,
    memory and thread placement), so they are not independent (Kalibera & Jones 2013)."""
    if cell.one_session:
        return ("each arm ran all its rounds in a single server session: rounds inside one session are not "
                f"independent; a PASS or FAIL needs ≥ {policy.min_sessions} sessions per arm")
    if len(cell.repeats) < policy.min_sessions:
        return (f"{len(cell.repeats)} paired session(s): a throughput/latency PASS or FAIL needs ≥ "
                f"{policy.min_sessions} per arm")
    return None


def _to_delta(spec: Metric, value: float) -> float:
    """Test scale → shown scale: log ratio → % change; proportion difference → points."""
    return 100 * value if spec.source == "accuracy" else 100 * math.expm1(value)


def decide(cells: Sequence[CellInput], policy: GatePolicy, *, n_resamples: int | None = None,
           seed: int | None = None, look: sequential.Look | None = None) -> list[CellResult]:
    """Decide every cell: INVALID from validity, else PASS/FAIL/INCONCLUSIVE by margin tests.

    PASS is an intersection–union test (Berger 1982): each primary cell is tested at ``α`` with no multiplicity
    adjustment, and the run passes only if every primary cell does. FAIL controls the family-wise error at ``α`` under
    any dependence: a Bonferroni split over the ``K`` primary metrics, and within each metric Holm (1979) at ``α/K``
    over the family {the metric's pooled hypothesis per regime (:func:`_pooled`, the geometric mean over the regime's
    testable levels), each level}. The pooled hypothesis carries a loss spread thinly over a regime's levels, the
    levels a loss confined to a few (a batch-1 decode regression): on 4 levels at sd 0.02, 8 sessions, a −10 % loss
    at one level is FAILed in 1.3 % of runs when the levels wait for the pooled test to reject first (the fixed
    sequence this replaces) and in ≥ 80 % with Holm over the family (results/statistics/README.md), at the cost of
    testing a uniform loss's pooled hypothesis at ``α/(K·(L+R))`` instead of ``α/K`` (``L`` levels, ``R`` regimes;
    a uniform loss also FAILs its levels).
    The returned list holds the cells in order, then one pooled result per metric and regime with more than one
    testable level (``pooled=True``). Intervals are shown at the level each cell was decided at (``α`` on the PASS
    side, its Holm level on the FAIL side), so an interval never contradicts its cell.

    Args:
        n_resamples, seed: override the policy's (simulations use fewer resamples and vary the seed).
        look: the look of a sequential design (:mod:`harness.judge.sequential`) the data is at: the metrics
            replicated by server session are tested at its nominal levels (:meth:`~harness.judge.sequential.Look.
            nominal`, for each overall error the PASS test and each Holm step has); accuracy, tested once, keeps the
            plain levels. None: the fixed design.
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
            result.p_pass, result.p_fail = test.pvalues(METRICS[cell.metric].higher_is_better)
            if test.score is None and stats.is_degenerate(test.se):
                result.degenerate = not test.exact
                result.notes.append(EXACT if test.exact else ZERO_SPREAD)
    metrics = list(dict.fromkeys(c.metric for c in cells if c.primary))
    pooled_results = []
    for metric in metrics:
        nominal = _nominal(metric, look)
        alpha = nominal(policy.alpha)
        share = policy.alpha / max(len(metrics), 1)
        members = [i for i, (c, t) in enumerate(zip(cells, tests)) if c.primary and c.metric == metric and t]
        if not members:
            continue
        family, pooled_tests = [results[i] for i in members], {}
        for regime in level_regimes(cells[i].level for i in members if cells[i].level is not None):
            mine = [cells[i] for i in members if cells[i].level is not None and cells[i].level.regime == regime]
            if len(mine) > 1:
                pooled, pooled_test = _pooled(metric, regime, mine, policy)
                pooled_results.append(pooled)
                if pooled_test is not None:
                    family.append(pooled)
                    pooled_tests[id(pooled)] = pooled_test
        p_fail = [r.p_fail for r in family]
        adjusted = stats.holm_adjust(p_fail)
        reject, levels = stats.holm_test(p_fail, share, nominal)
        for k, result in enumerate(family):
            result.p_fail_holm = min(1.0, len(metrics) * float(adjusted[k]))
            if result.pooled:
                result.status = Status.FAIL if reject[k] else None
                _set_interval(result, pooled_tests[id(result)], float(levels[k]))
                continue
            test = tests[members[k]]
            result.p_pass_holm, result.pass_level = result.p_pass, alpha
            if test.score is None and not math.isinf(test.df) and test.df >= 1:
                result.spread = planning.spread_upper_bound(test.se * math.sqrt(result.repeats), int(test.df),
                                                            planning.ADVICE_CONFIDENCE)
            if reject[k]:
                result.status, level = Status.FAIL, float(levels[k])
            elif stats.rejects(result.p_pass, alpha):
                result.status, level = Status.PASS, alpha
            else:
                result.status = Status.INCONCLUSIVE
                level = alpha if result.p_pass <= result.p_fail else float(levels[k])
                if test.score is not None:
                    result.samples_needed = paired_accuracy.samples_needed(*test.score, test.limit, level)
                else:
                    result.repeats_needed = advice.sessions_to_pass(test.se, test.df, result.repeats, test.limit,
                                                              policy.alpha)
            _set_interval(result, test, level)
    for i, (cell, test) in enumerate(zip(cells, tests)):
        if not cell.primary and test is not None:                   # diagnostics: no verdict, plain 95 %
            _set_interval(results[i], test, 0.025)
    return results + pooled_results


def _nominal(metric: str, look: sequential.Look | None):
    """Overall error → the level ``metric`` is tested at: this look's nominal level for session-replicated metrics,
    the error itself for accuracy and for the fixed design."""
    if look is None or METRICS[metric].source == "accuracy":
        return lambda a: a
    return look.nominal


def _pooled(metric: str, regime: Regime, members: Sequence[CellInput], policy: GatePolicy
            ) -> tuple[CellResult, _Test | None]:
    """The metric's pooled hypothesis over one ``regime``'s levels: the geometric mean of their ratios against the
    margin. Levels of different regimes (lengths, datasets) are never pooled: a long-context level measures another
    quantity than a short one (where DSA's indexer drops keys vs where it keeps all), so a loss confined to one regime
    must not be averaged away by the other's levels; each regime has its own pooled hypothesis in the metric's Holm
    family (:func:`decide`).

    Per paired unit ``u`` common to every member cell, ``d_u = mean_l(log S(cand_{l,u}) − log S(base_{l,u}))``
    (``S`` the metric's statistic of that unit's values); the estimate is ``mean_u d_u`` with the paired-t standard
    error ``sd(d)/sqrt(n)`` on ``n − 1`` df (the unit of replication is the session pair). Returns the result with its
    p-values and the test (None with fewer than two common units); :func:`decide` tests it in the metric's Holm family
    (it opens no PASS: that is per cell).
    """
    spec = METRICS[metric]
    common = sorted(set.intersection(*(set(c.repeats) for c in members)))
    where = ", ".join(str(c.level.concurrency) for c in members)
    result = CellResult(metric, None, True, None, margin=policy.margin(metric), repeats=len(common), pooled=True,
                        regime=regime,
                        notes=[f"pooled over {regime.label()} at c={where}: geometric mean of the per-level ratios, "
                               "tested with the levels (Holm over each regime's pooled hypothesis and each level)"])
    diffs = []
    for unit in common:
        logs = []
        for cell in members:
            k = cell.repeats.index(unit)
            logs.append(math.log(stats.statistic_of([cell.candidate[k]], spec.statistic))
                        - math.log(stats.statistic_of([cell.baseline[k]], spec.statistic)))
        diffs.append(sum(logs) / len(logs))
    if len(diffs) < 2:
        result.notes.append(f"{len(diffs)} unit(s) common to every level: not tested")
        return result, None
    d = np.asarray(diffs)
    estimate, se, df = float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)), float(d.size - 1)
    result.ratio, result.delta = math.exp(estimate), _to_delta(spec, estimate)
    test = _Test(estimate, se, df, policy.limit(metric), exact=spec.repeats_exactly)
    result.p_pass, result.p_fail = test.pvalues(spec.higher_is_better)
    return result, test


def _set_interval(result: CellResult, test: _Test, level: float) -> None:
    spec = result.spec
    low, high = test.interval(level)
    result.ci_low, result.ci_high, result.ci_level = _to_delta(spec, low), _to_delta(spec, high), 1 - 2 * level
    if test.score is not None:
        result.notes.append("Tango (1998) score interval against the margin (restricted MLE); the exact McNemar "
                            "p-value shown tests equality and decides nothing")


def overall(results: Sequence[CellResult], block_s: float | None = None) -> tuple[Status, str]:
    """The run's verdict from its primary cells, and one sentence saying why.

    FAIL if any primary cell or pooled hypothesis FAILs; else INVALID if any cell is INVALID (or no primary cell
    exists); else INCONCLUSIVE if any is; else PASS (every primary cell passed: the intersection–union test).
    An INCONCLUSIVE reason gives the joint probability that every session-replicated primary cell PASSes an
    unchanged candidate and the sessions per arm for 90 % of it (:func:`_joint_advice`: PASS needs every cell, so a
    per-cell power misleads) and, with ``block_s`` (the run's median seconds per session block,
    :func:`harness.judge.design_costs.block_wall_s`), the minutes the missing ones add.
    """
    cells = [r for r in results if r.primary and not r.pooled]
    if not cells:
        return Status.INVALID, "no primary cells: the run holds none of the policy's metrics and levels"
    primary = cells + [r for r in results if r.pooled and r.status == Status.FAIL]
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
        need = advice.joint_sessions_needed(cells)
        joint = advice.joint_advice(cells, need)
        now = min((c.repeats for c in advice.tested(cells)), default=0)
        minutes = (f" (≈{(need - now) * block_s / 60:.0f} more minutes at {block_s:.0f} s per session block)"
                   if need is not None and need > now and block_s else "")
        tail = f"; {joint}{minutes}" if joint else "; see each cell's note"
        return worst, f"{len(hit)} primary cell(s) INCONCLUSIVE ({which}){tail}"
    return worst, f"all {len(cells)} primary cells are non-inferior within their margins"


def _which(cells: Sequence[CellResult]) -> str:
    """``Output throughput c=1, 8; GSM8K accuracy``: cells grouped by metric, and by regime where they span several
    (``Output throughput c=1, 8 (1024→512 random), c=4 (32768→512 random)``)."""
    regimes = {cell.level.regime for cell in cells if cell.level is not None}
    groups: dict[str, dict[Regime | None, list[int]]] = {}
    for cell in cells:
        at = groups.setdefault(cell.spec.label, {})
        if cell.level is not None:
            at.setdefault(cell.level.regime, []).append(cell.level.concurrency)
    parts = []
    for label, by_regime in groups.items():
        shown = [f"c={', '.join(map(str, levels))}" + (f" ({regime.label()})" if len(regimes) > 1 else "")
                 for regime, levels in by_regime.items()]
        parts.append(label + (" " + ", ".join(shown) if shown else ""))
    return "; ".join(parts)


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
    stalls: list[Stall] = field(default_factory=list)
    """Rounds flagged as stalled (:func:`harness.judge.stalls.find_stalls`), each saying whether it was excluded."""
    sessions_needed: int | None = None
    """INCONCLUSIVE only: :func:`joint_sessions_needed` of the primary cells (None otherwise or beyond the cap)."""

    @property
    def primary(self) -> list[CellResult]:
        return [c for c in self.cells if c.primary and not c.pooled]

    @property
    def pooled(self) -> list[CellResult]:
        """The pooled hypotheses (one per metric with several testable levels), tested first on the FAIL side."""
        return [c for c in self.cells if c.pooled]

    @property
    def diagnostics(self) -> list[CellResult]:
        return [c for c in self.cells if not c.primary]


def evaluate(manifest: Manifest, levels, requests, accuracy, policy: GatePolicy, *,
             diagnostics: bool = True) -> Verdict:
    """Validity checks, stalled rounds, cells, decisions and the overall verdict of one run (pure).

    A sequential policy (``max_sessions`` set) tests the session-replicated cells at the α of the look the data is at
    (:func:`harness.judge.sequential.look_of`). Frames without a ``level`` column (the schema-2 layout) are read as
    the scenario's one regime (:func:`harness.rundir.v2.with_level_column`)."""
    levels, requests = (with_level_column(frame, manifest.scenario_data()) for frame in (levels, requests))
    validity = check_validity(manifest, levels, requests, policy)
    flagged = stalls.find_stalls(levels, max_steal_fraction=policy.max_steal_fraction, estimator=policy.estimator,
                                 rounds=validity.done)
    excluded = {s.key: s.reason for s in flagged if s.excluded}
    cells = build_cells(manifest, levels, requests, accuracy, policy, validity, diagnostics=diagnostics,
                        excluded=excluded)
    look = sequential.look_of(policy, levels)
    results = decide(cells, policy, look=look)
    sessions_replicated = sequential.paired_sessions(levels) > 1   # more blocks bring more sessions
    status, reason = overall(results, design_costs.block_wall_s(manifest)[0] if sessions_replicated else None)
    notes = [] if look is None else [look.describe()]
    stall_note = stalls.describe(flagged, policy.estimator)
    if stall_note:
        notes.append(stall_note)
    check = manifest.aa_check
    if check is not None:
        notes.append(f"A/A check across the placements before this run: {check.overall} ({check.run_dir})"
                     + (" — the placements differ: swapping cancels a constant node effect, not one that interacts "
                        "with the arms" if check.overall == "FAIL" else ""))
    if manifest.budget is not None and manifest.budget.outcome == "adapted":
        notes.append(manifest.budget.describe())
    if manifest.stopped is not None:
        notes.append(f"the run stopped before its last planned session block — {manifest.stopped.reason}")
    run_status = manifest.status
    if run_status != "done":
        notes.append(f"run status is {run_status!r}: cells of levels that did not finish are INVALID")
    notes += [f"not checked — {n}" for n in validity.not_checked]
    needed = advice.joint_sessions_needed([r for r in results if r.primary and not r.pooled]) \
        if status == Status.INCONCLUSIVE else None
    return Verdict(status, reason, results, validity, policy, notes, flagged, needed)
