"""What one run's design costs per decision: the paired spread of a metric per session block, the wall time a block
takes, and their product.

Unit: the session block (one server session per arm, ``workload.rounds_per_session`` rounds each). Per block ``s``,
``d_s`` is the candidate's minus the baseline's session mean of the metric's log (rounds averaged as
:mod:`harness.judge.cells` does), per level (:func:`harness.judge.calibration.paired_spread`) and pooled over
levels within each regime as the gate's pooled hypothesis pools them (the mean over the regime's levels of the
per-level ``d``; levels of two regimes are never pooled, :func:`harness.judge.verdict.decide`). The spread ``sd(d)``
carries a two-sided 95 % interval from the χ² distribution on ``n − 1`` degrees of freedom,
``sd·sqrt(df / χ²_{0.975, df})`` to ``sd·sqrt(df / χ²_{0.025, df})``. In an A/B run the true effect is the same in
every block, so ``sd(d)`` estimates the same noise as in an A/A run.

Cost per decision. A decision needs a standard error ``σ`` of the mean paired log ratio, ``n = sd² / σ²`` blocks, so
its wall time is ``sd² × T_block / σ²``; a run decides every regime's pooled hypothesis, so its ``sd`` is the
noisiest regime's (:func:`pooled_spread`, which names it). Designs compare by ``cost = sd² × T_block`` (seconds; one
block's time at a unit log-ratio variance), reported also as the minutes to a 1 % standard error
(``cost / 0.01² / 60``). ``T_block`` is the median time between the ends of consecutive blocks, the first block timed
from the first server start (server starts, warm-ups and levels included: what the gate's ``--budget`` counts per
block; the median keeps a resume's gap or the first block's parity prompts out). The blocks a ±3 % decision needs:
the one-sided t-test at 0.025 (the FAIL side's α/K for the default two speed metrics) with 90 % power at a distance
``|log 0.97|`` from the margin (:func:`harness.judge.planning.sessions_for_power`, Julious 2004), at the spread and at
its 95 % upper bound.

Pure: the manifest and the levels frame in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import chi2

from harness.judge.calibration import kept_rounds, paired_spread
from harness.judge.planning import sessions_for_power, spread_upper_bound
from harness.rundir.schema import Level, LevelKey, Manifest, Regime, level_regimes

__all__ = ["SpreadEstimate", "sd_interval", "complete_blocks", "pooled_spread", "pooled_spreads", "level_spreads",
           "block_wall_s",
           "DecisionCost", "decision_cost", "run_noise", "DECISION_LOSS", "DECISION_LEVEL", "DECISION_POWER"]

DECISION_LOSS = 0.03
"""The ±3 % a decision resolves (the default throughput margin, :mod:`harness.judge.policy`)."""
DECISION_LEVEL = 0.025
"""One-sided level of the decision's test: α / K for α = 0.05 and the default two gated speed metrics."""
DECISION_POWER = 0.90


@dataclass(frozen=True)
class SpreadEstimate:
    """``sd`` of the per-block paired log ratio (log units) over ``pairs`` blocks (``level`` None: pooled over the
    levels of ``regime``), its two-sided 95 % χ² interval (``low``, ``high``) and one-sided 95 % upper bound
    ``upper``; NaN below 2 pairs. ``regime`` is None for one level's estimate (its level names it) and for a frame
    with no level of a known regime."""

    level: Level | None
    pairs: int
    sd: float
    low: float
    high: float
    upper: float
    regime: Regime | None = None


def sd_interval(sd: float, df: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided ``confidence`` interval of a standard deviation on ``df`` degrees of freedom (χ²). Raises ValueError
    for ``df < 1``."""
    if df < 1:
        raise ValueError(f"a spread on {df} degrees of freedom has no interval")
    tail = (1.0 - confidence) / 2.0
    return float(sd * math.sqrt(df / chi2.ppf(1.0 - tail, df))), float(sd * math.sqrt(df / chi2.ppf(tail, df)))


def _estimate(level: Level | None, pairs: int, sd: float, regime: Regime | None = None) -> SpreadEstimate:
    if pairs < 2 or not math.isfinite(sd):
        return SpreadEstimate(level, pairs, math.nan, math.nan, math.nan, math.nan, regime)
    low, high = sd_interval(sd, pairs - 1)
    return SpreadEstimate(level, pairs, sd, low, high, spread_upper_bound(sd, pairs - 1), regime)


def complete_blocks(levels: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows of the sessions that measured ``column`` (> 0) at every level of the run, the same number of rounds
    at each, in sessions present in both arms — so a mean over all of a session's rows weighs every level alike."""
    rows = levels.dropna(subset=["session", column])
    rows = rows[rows[column] > 0]
    if rows.empty:
        return rows
    wanted = rows["level"].nunique()
    counts = rows.groupby(["arm", "session", "level"]).size().unstack("level")
    balanced = counts[(counts.notna().sum(axis=1) == wanted) & (counts.nunique(axis=1) == 1)].index
    keep = pd.MultiIndex.from_frame(rows[["arm", "session"]]).isin(balanced)
    rows = rows[keep]
    shared = set.intersection(*(set(frame["session"]) for _, frame in rows.groupby("arm"))) \
        if rows["arm"].nunique() == 2 else set()
    return rows[rows["session"].isin(shared)]


def level_spreads(levels: pd.DataFrame, column: str = "output_throughput", **options: Any) -> list[SpreadEstimate]:
    """:class:`SpreadEstimate` of ``column`` at every level (``options`` go to
    :func:`harness.judge.calibration.paired_spread`)."""
    return [_estimate(row.level, row.pairs, row.sd) for row in paired_spread(levels, column, **options)]


def pooled_spreads(levels: pd.DataFrame, column: str = "output_throughput", *, estimator: str = "mean",
                   max_steal_fraction: float = 0.10) -> list[SpreadEstimate]:
    """One :class:`SpreadEstimate` of ``column`` per regime of ``levels`` (sorted; a ``level`` id that is no
    :class:`Level` is left out), each pooled over that regime's levels only (:func:`_regime_spread`), as the gate's
    pooled hypothesis per regime pools them; a one-level regime's is its level's spread."""
    ids = {text: Level.parse(text) for text in levels["level"].dropna().unique()} if "level" in levels else {}
    return [_regime_spread(levels[levels["level"].isin([t for t, lv in ids.items() if lv and lv.regime == regime])],
                           regime, column, estimator, max_steal_fraction)
            for regime in level_regimes(lv for lv in ids.values() if lv is not None)]


def pooled_spread(levels: pd.DataFrame, column: str = "output_throughput", *, estimator: str = "mean",
                  max_steal_fraction: float = 0.10) -> SpreadEstimate:
    """The run's pooled :class:`SpreadEstimate` of ``column``: the noisiest regime's of :func:`pooled_spreads` (the
    largest finite ``sd``; its ``regime`` says which), since a decision needs every regime's pooled hypothesis and
    the noisiest needs the most blocks. With one regime, that regime's; none estimable, the first regime's (NaN);
    no regime, NaN with 0 pairs."""
    spreads = pooled_spreads(levels, column, estimator=estimator, max_steal_fraction=max_steal_fraction)
    finite = [s for s in spreads if math.isfinite(s.sd)]
    if finite:
        return max(finite, key=lambda s: s.sd)
    return spreads[0] if spreads else _estimate(None, 0, math.nan)


def _regime_spread(levels: pd.DataFrame, regime: Regime, column: str, estimator: str,
                   max_steal_fraction: float) -> SpreadEstimate:
    """:class:`SpreadEstimate` of ``column`` over one regime's rows ``levels``: per block, the mean over its levels of
    the per-level log ratio of the arms' session figures, each session's figure at a level its rounds' location
    under ``estimator`` (the ``[gate] estimator`` rule: mean or median of the rounds kept,
    :func:`harness.judge.calibration.kept_rounds`) — on complete blocks (:func:`complete_blocks`) only, and among
    them the sessions that kept a round at every level."""
    rows = kept_rounds(complete_blocks(levels, column), estimator, max_steal_fraction)
    if rows.empty:
        return _estimate(None, 0, math.nan, regime)
    location = "median" if estimator == "median" else "mean"
    per_level = (rows.assign(log=np.log(rows[column].astype(float)))
                 .groupby(["arm", "session", "level"])["log"].agg(location).unstack("level"))
    per_session = per_level.dropna().mean(axis=1)
    if per_session.index.get_level_values("arm").nunique() != 2:
        return _estimate(None, 0, math.nan, regime)
    base, cand = per_session.xs("baseline"), per_session.xs("candidate")
    d = (cand - base).dropna().to_numpy()
    return _estimate(None, int(d.size), float(d.std(ddof=1)) if d.size > 1 else math.nan, regime)


def _time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None


def block_wall_s(manifest: Manifest) -> tuple[float | None, int]:
    """(median seconds per session block, blocks timed): the gaps between consecutive blocks' last level ends, the
    first from the run's first server start (None when fewer than one block finished or nothing is timed)."""
    per_session = manifest.rounds_per_session()
    ends: dict[int, datetime] = {}
    starts = []
    for arm in manifest.arms:
        starts += [t for s in arm.sessions if (t := _time(s.started_at)) is not None]
        for key, record in arm.levels.items():
            parsed, finished = LevelKey.parse(key), _time(record.finished_at)
            if parsed is None or finished is None or record.status != "done":
                continue
            block = parsed.round // per_session
            ends[block] = max(ends.get(block, finished), finished)
    if not ends or not starts:
        return None, 0
    times = [min(starts)] + sorted(ends.values())
    gaps = np.diff([t.timestamp() for t in times])
    return float(np.median(gaps)), len(gaps)


@dataclass(frozen=True)
class DecisionCost:
    """A design's cost per decision from its pooled spread ``sd`` (and 95 % upper bound ``upper``) and the median
    wall seconds of a block: ``cost_s = sd² × wall_per_block_s``; minutes to a 1 % standard error; blocks (and
    minutes) a ±3 % decision needs at ``sd`` and at ``upper`` (None where not estimable or beyond 10 000)."""

    wall_per_block_s: float | None
    cost_s: float | None
    minutes_to_1pct_se: float | None
    blocks_3pct: int | None
    blocks_3pct_upper: int | None
    minutes_3pct: float | None


def decision_cost(sd: float, upper: float, wall_per_block_s: float | None) -> DecisionCost:
    """:class:`DecisionCost` of a spread and a block time (the module docstring gives the formulas)."""
    distance = abs(math.log1p(-DECISION_LOSS))
    finite = math.isfinite(sd)
    blocks = sessions_for_power(sd, distance, DECISION_LEVEL, DECISION_POWER) if finite else None
    blocks_upper = sessions_for_power(upper, distance, DECISION_LEVEL, DECISION_POWER) if math.isfinite(upper) else None
    if wall_per_block_s is None or not finite:
        return DecisionCost(wall_per_block_s, None, None, blocks, blocks_upper, None)
    cost = sd ** 2 * wall_per_block_s
    return DecisionCost(wall_per_block_s, cost, cost / 0.01 ** 2 / 60.0, blocks, blocks_upper,
                        None if blocks is None else blocks * wall_per_block_s / 60.0)


def run_noise(manifest: Manifest, levels: pd.DataFrame, column: str = "output_throughput",
              **options: Any) -> dict[str, Any]:
    """This run's noise and cost per decision of ``column``, as plain data: ``{"column", "levels": [SpreadEstimate],
    "pooled": SpreadEstimate, "pooled_regimes": [SpreadEstimate], "blocks_timed", **DecisionCost}`` (NaN → None for
    JSON): ``pooled_regimes`` one per regime (:func:`pooled_spreads`), ``pooled`` and the cost the noisiest of them
    (:func:`pooled_spread`), each naming its ``regime``. The pooled spreads leave out the levels the budget's
    projection dropped from blocks 2 on (``manifest.budget``), as the gate's pooled hypothesis does: over every
    level, only block 1 would be complete."""
    dropped = manifest.budget.dropped if manifest.budget is not None else ()
    kept = levels[~levels["level"].isin(dropped)] if dropped else levels
    regimes = pooled_spreads(kept, column, **options)
    pooled = pooled_spread(kept, column, **options)
    wall, timed = block_wall_s(manifest)
    cost = decision_cost(pooled.sd, pooled.upper, wall)
    return _plain({"column": column, "levels": [_spread_data(s) for s in level_spreads(levels, column, **options)],
                   "pooled": _spread_data(pooled), "pooled_regimes": [_spread_data(s) for s in regimes],
                   "blocks_timed": timed, **asdict(cost)})


def _spread_data(spread: SpreadEstimate) -> dict[str, Any]:
    """A :class:`SpreadEstimate` as JSON data: its level as ``level`` (the id) and ``concurrency`` (None pooled); a
    pooled one's ``regime`` as its id (a level's estimate has no ``regime`` key: its level id names it)."""
    level, data = spread.level, asdict(spread)
    regime = data.pop("regime")
    extra = {"regime": str(regime)} if regime is not None else {}
    return {**data, "level": None if level is None else str(level),
            "concurrency": None if level is None else level.concurrency, **extra}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
