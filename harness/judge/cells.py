"""From a run's tables to the cells the verdict decides (:func:`build_cells`): per primary metric and level, the
paired values of both arms over the rounds valid in both, or why the cell is INVALID. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from harness.judge import stats
from harness.judge.policy import DIAGNOSTIC, METRICS, GatePolicy, Metric
from harness.judge.stalls import location_rounds
from harness.judge.validity import ValidityReport, keyed_groups, keyed_rows
from harness.metrics import GOODPUT, OPTIONAL_COLUMNS, SERVER_SIDE, succeeded
from harness.rundir.schema import Level, Manifest
from harness.rundir.v2 import with_level_column
from harness.metrics import finite_float


DROPPED_NOTE = ("measured in block 1 only: the budget's projection left this level out of the later blocks "
                "(manifest.json budget), so it is shown, not judged; the verdict covers the levels of every block")


@dataclass(frozen=True)
class CellInput:
    """The data of one cell, ready for :func:`decide`.

    ``baseline[i]``/``candidate[i]``: values of paired unit ``repeats[i]`` (per-request values, or a one-element
    array with the unit's figure). The unit is the server session when the rows record one (its rounds aggregated:
    requests pooled, per-round figures averaged), else the round. ``one_session``: every arm ran all its rounds in a
    single session, so the units are rounds that are not independent. Accuracy cells carry
    ``correct = (baseline, candidate)`` per question instead.
    ``invalid`` reasons make the cell INVALID; ``notes`` are shown but change nothing; ``shown`` are the arms'
    figures displayed beside an INVALID cell (from whatever data exists; never tested).
    """

    metric: str
    level: Level | None
    baseline: tuple[np.ndarray, ...] = ()
    candidate: tuple[np.ndarray, ...] = ()
    repeats: tuple[int, ...] = ()
    correct: tuple[np.ndarray, np.ndarray] | None = None
    invalid: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    primary: bool = True
    shown: tuple[float | None, float | None] = (None, None)
    one_session: bool = False


def _spec_values(row) -> float | None:
    """Acceptance length of one repeat: 1 + accepted/drafts from the counters when present, else the column."""
    drafts, accepted = finite_float(row.get("spec_drafts")), finite_float(row.get("spec_accepted_tokens"))
    if drafts is not None and accepted is not None:
        return 1.0 + accepted / drafts if drafts > 0 else None
    value = finite_float(row.get("acceptance_length"))
    return value if value is not None and value > 0 else None


def _position_rate(row, position: int) -> float | None:
    """Acceptance at draft ``position`` (1-based) of one repeat, from ``levels.csv`` ``acceptance_per_pos`` (rates
    joined by ``;``, :mod:`harness.run.spec_decode`); None where the run drafted fewer positions."""
    cell = row.get("acceptance_per_pos")
    parts = str(cell).split(";") if isinstance(cell, str) else [cell]
    return finite_float(parts[position - 1]) if position <= len(parts) else None


def _spec_rate(row) -> float | None:
    draft_tokens, accepted = finite_float(row.get("spec_draft_tokens")), finite_float(row.get("spec_accepted_tokens"))
    if draft_tokens is not None and accepted is not None:
        return accepted / draft_tokens if draft_tokens > 0 else None
    return finite_float(row.get("acceptance_rate"))


def build_cells(manifest: Manifest, levels, requests, accuracy, policy: GatePolicy,
                validity: ValidityReport, *, diagnostics: bool = True,
                excluded: Mapping[tuple[str, Level, int], str] | None = None) -> list[CellInput]:
    """The primary cells (every primary metric × every policy level, plus GSM8K) and, optionally, diagnostic ones.

    A cell uses the repeats that are valid in both arms, less the ``excluded`` rounds ``{(arm, level, round):
    why}`` (stalled rounds the policy's estimator leaves out, :func:`harness.judge.stalls.find_stalls`); a session's
    rounds are located by ``policy.estimator``. A cell whose every session lost its rounds that way is INVALID.
    Missing data (no levels.csv column, no requests.csv rows, no accuracy.csv, no MTP counters) makes a primary cell
    INVALID with a reason naming the file and the fix. A level the budget's projection left out of blocks 2 on
    (``manifest.budget.dropped``) has one session: its cells are diagnostic (:data:`DROPPED_NOTE`), so the verdict
    and each metric's pooled hypothesis are over the levels measured in every block.
    """
    levels, requests = (with_level_column(frame, manifest.scenario_data()) for frame in (levels, requests))
    base, cand = validity.arms["baseline"], validity.arms["candidate"]
    wanted_levels = policy.wanted_levels(validity.levels)
    level_rows = keyed_rows(levels)
    request_groups = keyed_groups(succeeded(requests) if len(requests) else requests)
    dropped = {Level.parse(level) for level in manifest.budget.dropped} if manifest.budget is not None else set()
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
        if not primary and not _has_data(spec, levels):
            continue
        for level in wanted_levels:
            cell = _level_cell(spec, level, primary and level not in dropped, validity, level_rows, request_groups,
                               levels, policy, base, cand, excluded or {})
            cells.append(replace(cell, notes=(*cell.notes, DROPPED_NOTE)) if primary and level in dropped else cell)
    return cells


def _has_data(spec: Metric, levels) -> bool:
    """False for an MTP metric without MTP columns (a draft position the run never drafted: likewise) and an optional metric (server-side, engine CPU) without its column's values (a run
    recorded without ``/metrics`` captures): a diagnostic cell is then left out rather than shown INVALID."""
    if spec.column == "acceptance_per_pos":
        position = int(spec.name.rsplit("_", 1)[1])
        return "acceptance_per_pos" in levels.columns and any(
            _position_rate({"acceptance_per_pos": v}, position) is not None for v in levels["acceptance_per_pos"])
    if spec.source == "spec":
        return _has_spec_data(levels)
    if spec.name in OPTIONAL_COLUMNS:
        return spec.column in levels.columns and levels[spec.column].notna().any()
    return True


def _has_spec_data(levels) -> bool:
    return any(c in levels.columns and levels[c].notna().any()
               for c in ("acceptance_length", "spec_drafts"))


def _level_cell(spec: Metric, level: Level, primary: bool, validity: ValidityReport, level_rows, request_groups,
                levels, policy: GatePolicy, base: str, cand: str,
                excluded: Mapping[tuple[str, Level, int], str]) -> CellInput:
    reasons = [r for arm in (base, cand) for r in validity.arm_reasons.get(arm, [])]
    if level not in validity.levels:
        reasons.append(f"level {level.label()} is not in this run")
    reasons += validity.level_reasons(level)
    if spec.unit == "ms" and spec.name not in OPTIONAL_COLUMNS:   # the engine's own figures see no client-side burst
        reasons += validity.level_latency_reasons(level)
    if spec.source in ("level", "request"):
        reasons += validity.performance_reasons
    if spec.name in OPTIONAL_COLUMNS and not _has_data(spec, levels):
        source = ("the server's /metrics captures" if spec.name in SERVER_SIDE else
                  "service-level objectives (the scenario's [slo])" if spec.name in GOODPUT else
                  "the engine's CPU time (/proc)")
        reasons.append(f"levels.csv has no {spec.column} values: the run was recorded without {source} (older "
                       f"dsa-bench, imported results, remote servers); drop {spec.name!r} from [gate].primary")
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
    kept = {arm: [i for i, r in enumerate(common) if (arm, level, r) not in excluded] for arm in (base, cand)}
    sessions = {arm: [_session_of(level_rows[(arm, level, r)]) for r in common] for arm in (base, cand)}
    if any(s is None for arm in sessions for s in sessions[arm]):
        both = [i for i in kept[base] if i in kept[cand]]
        return CellInput(spec.name, level, tuple(values[base][i] for i in both),
                         tuple(values[cand][i] for i in both), tuple(common[i] for i in both), primary=primary,
                         notes=("levels.csv records no session: each round is taken as its own session",))
    units = sorted(set(sessions[base][i] for i in kept[base]) & set(sessions[cand][i] for i in kept[cand]))
    lost = len(set(sessions[base]) & set(sessions[cand])) - len(units)
    if lost and not units:
        why = list(dict.fromkeys(excluded[(arm, level, r)] for arm in (base, cand) for r in common
                                 if (arm, level, r) in excluded))
        shown = tuple(_shown_value(spec, arm, level, level_rows, request_groups, levels) for arm in (base, cand))
        return CellInput(spec.name, level, invalid=(f"every session's rounds at {level.label()} were flagged as stalled "
                                                    f"and excluded ({'; '.join(why[:2])})",),
                         primary=primary, shown=shown)
    notes = ((f"{lost} session(s) left out: every round of theirs at {level.label()} was flagged as stalled",)
             if lost else ())
    one_session = len(set(sessions[base])) == 1 and len(set(sessions[cand])) == 1 and len(common) > 1
    grouped = {arm: tuple(_session_values(spec, [values[arm][i] for i in kept[arm]],
                                          [sessions[arm][i] for i in kept[arm]], unit, policy.estimator)
                          for unit in units) for arm in (base, cand)}
    return CellInput(spec.name, level, grouped[base], grouped[cand], tuple(units), primary=primary,
                     one_session=one_session, notes=notes)


def _session_of(row) -> int | None:
    value = finite_float(row.get("session"))
    return None if value is None else int(value)


def _session_values(spec: Metric, values: list[np.ndarray], sessions: list[int], unit: int,
                    estimator: str = "mean") -> np.ndarray:
    """One session's values: its located rounds' requests pooled (request metrics), or their figures averaged.

    The located rounds are all of the session's, or under ``estimator = "median"`` the middle one or two ranked by
    the round's figure of the metric (:func:`harness.judge.stalls.location_rounds`)."""
    mine = [v for v, s in zip(values, sessions) if s == unit]
    if estimator == "median":
        mine = [mine[i] for i in location_rounds([stats.statistic_of([v], spec.statistic) for v in mine], estimator)]
    pooled = np.concatenate(mine)
    return pooled if spec.source == "request" else np.array([pooled.mean()])


def _shown_value(spec: Metric, arm: str, level: Level, level_rows, request_groups, levels) -> float | None:
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


def _cell_values(spec: Metric, row, frame, levels) -> np.ndarray | str:
    """One repeat's values for a cell, or a reason string when they are missing."""
    if spec.source == "level":
        value = finite_float(row.get(spec.column))
        if value is None or value <= 0:
            return f"levels.csv {spec.column} is empty or not positive"
        return np.array([value])
    if spec.source == "spec":
        value = (_spec_values(row) if spec.name == "acceptance_length" else
                 _position_rate(row, int(spec.name.rsplit("_", 1)[1])) if spec.column == "acceptance_per_pos" else
                 _spec_rate(row))
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
            "accuracy.csv is absent or empty: GSM8K did not run (accuracy/summary.json says why; rerun with "
            "--gsm8k-data DIR, or with --no-gsm8k to leave accuracy out of the verdict)"]), primary=primary)
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
