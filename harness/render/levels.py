"""The per-level view of a run: for each level (regime × concurrency), each arm's status and load facts (manifest, ``levels.csv``,
``requests.csv``) and the metric rows of its table (median and min–max over rounds, Δ %). Pure: reads the frames it is
given, writes nothing; a level that failed or never ran stays visible as "not run"."""

from __future__ import annotations

from dataclasses import dataclass

from harness.metrics import OPTIONAL_COLUMNS, achieved_concurrency, succeeded
from harness.render.metrics_table import (
    ARMS,
    BASELINE,
    CANDIDATE,
    METRICS,
    Metric,
    Summary,
    delta_class,
    delta_pct,
    summarize,
)
from harness.rundir import store as records
from harness.rundir.schema import ArmRecord, Level, LevelState, Manifest, level_state, workload_levels


@dataclass(frozen=True)
class MetricRow:
    """One metric at one level: baseline and candidate summaries over repeats, and Δ % of their medians."""

    metric: Metric
    baseline: Summary
    candidate: Summary
    delta: float | None
    delta_class: str


@dataclass(frozen=True)
class ArmLevel:
    """What one arm did at one level: status from the manifest, load facts from the CSVs."""

    status: str                 # "done", "failed: <reason>", "skipped", "not run", or "r0: done; r1: failed: …"
    status_class: str           # "ok" | "failed" | "missing"
    status_short: str           # the word before the reason: "done", "failed", "skipped", "pending", "not run", "mixed"
    repeats: int                # rows in levels.csv
    completed: Summary
    failed: Summary
    duration_s: Summary
    max_concurrent: Summary
    client_cpu_util: Summary    # benchmark client CPU seconds / level wall seconds
    host_steal: Summary         # the host's CPU steal share over the level (0..1, /proc/stat)
    load_avg: Summary           # the host's 1-minute load average at the level's end
    requests: int               # rows in requests.csv
    request_errors: int
    output_len_range: str       # server-counted output tokens of successful requests, "min–max"
    errors: list[tuple[str, int]]  # distinct error messages with counts, most frequent first (at most 5)


@dataclass(frozen=True)
class LevelView:
    """One level (a regime at a concurrency): per-arm facts and the metric rows of its table."""

    level: Level
    arms: dict[str, ArmLevel]
    rows: list[MetricRow]
    max_repeats: int

    @property
    def concurrency(self) -> int:
        return self.level.concurrency

    @property
    def regime(self) -> str:
        """The level's regime as shown: ``"1024→512 random"``."""
        return self.level.regime.label()

    @property
    def anchor(self) -> str:
        """HTML id of the level's section."""
        return f"level-{self.level}"

    @property
    def has_data(self) -> bool:
        """Whether any arm has a ``levels.csv`` row at this level."""
        return any(arm.repeats for arm in self.arms.values())


def _level_statuses(arm: ArmRecord | None) -> dict[Level, list[tuple[int, str]]]:
    """``{level: [(round, status), ...]}`` from an arm's manifest levels (unparseable keys skipped)."""
    result: dict[Level, list[tuple[int, str]]] = {}
    for key, info in arm.level_items() if arm is not None else []:
        result.setdefault(key.level, []).append((key.round, info.status or "unknown"))
    return result


def _status_text(entries: list[tuple[int, str]]) -> tuple[str, str, str]:
    """(full text, CSS class, short word) of a level's manifest statuses over its repeats."""
    if not entries:
        return "not run", "missing", "not run"
    statuses = [status for _, status in entries]
    if len(set(statuses)) == 1:
        text, short = statuses[0], statuses[0].partition(":")[0]
    else:
        text = "; ".join(f"r{repeat}: {status}" for repeat, status in entries)
        short = "mixed"
    if all(status == "done" for status in statuses):
        return text, "ok", short
    if any(level_state(status) is LevelState.FAILED for status in statuses):
        return text, "failed", short
    return text, "missing", short


def _level_universe(manifest: Manifest, levels, requests) -> list[Level]:
    """Every level the run declared or touched: scenario workload, manifest level keys and both CSVs."""
    found = workload_levels(manifest.scenario_value("workload"))
    for arm in manifest.arms:
        found.update(_level_statuses(arm))
    for frame in (levels, requests):
        if len(frame):
            found.update(level for level in map(Level.parse, frame["level"].dropna().unique()) if level is not None)
    return sorted(found)


def _request_facts(frame) -> tuple[int, int, str, list[tuple[str, int]]]:
    if not len(frame):
        return 0, 0, "—", []
    # The column is float (all NaN) when no request failed, so map cell by cell instead of fillna("").
    errors = frame["error"].map(lambda v: "" if records.finite_float(v) is None and not isinstance(v, str) else str(v)).str.strip()
    bad = errors != ""
    ok_lens = frame.loc[~bad, "output_len"].dropna()
    if len(ok_lens):
        low, high = int(ok_lens.min()), int(ok_lens.max())
        length_range = f"{low}" if low == high else f"{low}–{high}"
    else:
        length_range = "—"
    counts = errors[bad].value_counts()
    distinct = [(str(message), int(count)) for message, count in counts.head(5).items()]
    return len(frame), int(bad.sum()), length_range, distinct


def _summary_of(frame, column: str) -> Summary:
    # A column the schema does not have (yet, or any more) reads as "not measured", never as an error.
    if not len(frame) or column not in frame.columns:
        return Summary(None, None, None, 0)
    return summarize([records.finite_float(v) if records.finite_float(v) is not None else float("nan") for v in frame[column].tolist()])


def _achieved(reqs) -> Summary:
    """Achieved concurrency per repeat by Little's law (Σ E2EL / span of the successful requests), summarized."""
    if not len(reqs):
        return Summary(None, None, None, 0)
    values = []
    for _, group in reqs.groupby("round"):
        value = achieved_concurrency(succeeded(group))
        values.append(value if value is not None else float("nan"))
    return summarize(values)


def _shown_metrics(levels) -> tuple[Metric, ...]:
    """The per-level table's metrics: every client metric, and the optional ones (:data:`OPTIONAL_COLUMNS`:
    server-side, engine CPU) only when ``levels.csv`` has a value for them (a run recorded without ``/metrics``
    captures shows no empty server rows)."""
    def has_data(name: str) -> bool:
        return name in levels.columns and levels[name].notna().any()

    return tuple(m for m in METRICS if m.name not in OPTIONAL_COLUMNS or has_data(m.name))


def build_levels(manifest: Manifest, levels, requests) -> list[LevelView]:
    """One :class:`LevelView` per level, including levels that failed or never ran (kept visible).

    ``levels``/``requests`` are the frames of :meth:`RunDir.levels` and :meth:`RunDir.requests`.
    """
    statuses = {arm: _level_statuses(manifest.arm(arm)) for arm in ARMS}
    shown = _shown_metrics(levels)
    views = []
    for level in _level_universe(manifest, levels, requests):
        per_arm: dict[str, ArmLevel] = {}
        frames = {}
        for arm in ARMS:
            rows = levels[(levels["arm"] == arm) & (levels["level"] == str(level))] if len(levels) else levels
            reqs = (requests[(requests["arm"] == arm) & (requests["level"] == str(level))]
                    if len(requests) else requests)
            frames[arm] = rows
            status, status_class, short = _status_text(statuses[arm].get(level, []))
            if status == "not run" and len(rows):
                status, status_class, short = "done (no manifest status)", "ok", "done"
            n_requests, n_errors, length_range, errors = _request_facts(reqs)
            per_arm[arm] = ArmLevel(
                status=status, status_class=status_class, status_short=short, repeats=len(rows),
                completed=_summary_of(rows, "completed"), failed=_summary_of(rows, "failed"),
                duration_s=_summary_of(rows, "duration_s"),
                max_concurrent=_achieved(reqs),
                client_cpu_util=_summary_of(rows, "client_cpu_util"),
                host_steal=_summary_of(rows, "host_steal_fraction"), load_avg=_summary_of(rows, "load_avg_1m"),
                requests=n_requests, request_errors=n_errors, output_len_range=length_range, errors=errors,
            )
        metric_rows = []
        for metric in shown:
            base = _summary_of(frames[BASELINE], metric.name)
            cand = _summary_of(frames[CANDIDATE], metric.name)
            delta = delta_pct(base.value, cand.value)
            metric_rows.append(MetricRow(metric, base, cand, delta, delta_class(metric, delta)))
        views.append(LevelView(level, per_arm, metric_rows, max(a.repeats for a in per_arm.values())))
    return views
