"""Turn a run directory into the plain data the report template shows (the "view model").

Reads only through :class:`harness.rundir.store.RunDir` (the typed manifest, ``levels.csv``, ``requests.csv``, the
summaries and the file listing of ``raw/`` and ``logs/``); writes nothing. Every field tolerates a partial run: an arm,
a level or a CSV that is missing yields "not run"/"—" in the page instead of an exception.

Sections that later issues fill (verdict with intervals, GSM8K per arm with McNemar, output parity, MTP acceptance)
are passed in as plain dicts through ``sections=``; see :data:`SECTION_KEYS` and :func:`build_context`. The GSM8K,
parity and MTP sections are also read from the run directory when not passed (:func:`load_sections`: ``parity.json``,
``accuracy/summary.json``, the MTP columns of ``levels.csv``). Without data the page says "not measured in this run".
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

from harness.rundir import schema
from harness.rundir import store as records
from harness.rundir.schema import MTP_COLUMNS, ArmRecord, Manifest
from harness.rundir.store import RunDir
from harness.metrics import achieved_concurrency, succeeded
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

SECTION_KEYS: tuple[str, ...] = ("verdict", "gsm8k", "parity", "mtp")
"""Optional sections the template renders when given data (see :func:`build_context` for their shapes)."""


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
    requests: int               # rows in requests.csv
    request_errors: int
    output_len_range: str       # server-counted output tokens of successful requests, "min–max"
    errors: list[tuple[str, int]]  # distinct error messages with counts, most frequent first (at most 5)


@dataclass(frozen=True)
class LevelView:
    """One concurrency level: per-arm facts and the metric rows of its table."""

    concurrency: int
    arms: dict[str, ArmLevel]
    rows: list[MetricRow]
    max_repeats: int

    @property
    def anchor(self) -> str:
        """HTML id of the level's section."""
        return f"level-c{self.concurrency}"

    @property
    def has_data(self) -> bool:
        """Whether any arm has a ``levels.csv`` row at this level."""
        return any(arm.repeats for arm in self.arms.values())


@dataclass(frozen=True)
class PathRow:
    """One key of the intended vs observed execution path of an arm."""

    key: str
    intended: str
    observed: str
    mismatch: bool


@dataclass
class ArmView:
    """An arm as configured and attested in the manifest."""

    name: str
    present: bool
    route: str = "—"
    description: str = ""
    decision_items: list[tuple[str, str]] = field(default_factory=list)
    decision_reasons: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    server_command: str = ""
    server_env: list[tuple[str, str]] = field(default_factory=list)
    reproduce: str = ""
    bench_command: str = ""
    path_rows: list[PathRow] = field(default_factory=list)
    attestation: str = "unknown"       # "valid" | "INVALID" | "unknown"
    mismatches: list[str] = field(default_factory=list)
    server_start_s: float | None = None
    base_url: str = ""


@dataclass(frozen=True)
class Banner:
    """A line shown at the top of the page; ``kind`` is a CSS class: "invalid", "warn" or "info"."""

    kind: str
    text: str


class _Lenient(dict):
    """A section dict whose missing keys read as ``None``, so a producer may leave optional fields out."""

    def __missing__(self, key: str) -> None:
        return None


def _lenient(value: Any) -> Any:
    """Copy ``value`` with every mapping turned into a :class:`_Lenient` (lists and tuples walked)."""
    if isinstance(value, Mapping):
        return _Lenient({str(k): _lenient(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return [_lenient(v) for v in value]
    return value


def _show(value: Any) -> str:
    """A manifest value as text: strings as they are, ``None`` as ``—``, anything else as compact JSON."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not token[1].isdigit() and token[1] != "."


def _flag_groups(argv: Any) -> list[list[str]]:
    """Split an argv list into groups: the leading positionals, then one group per flag with its values."""
    groups: list[list[str]] = [[]]
    for token in (str(part) for part in (argv if isinstance(argv, (list, tuple)) else [])):
        if _is_flag(token) and groups[-1]:
            groups.append([])
        groups[-1].append(token)
    return [group for group in groups if group]


def _argv(value: Any) -> str:
    """An argv list as shell-quoted, copy-pastable text: one ``--flag value`` per line, joined by `` \\``.

    A string is shown as it is.
    """
    if not isinstance(value, (list, tuple)):
        return _show(value) if value else ""
    return " \\\n  ".join(" ".join(shlex.quote(token) for token in group) for group in _flag_groups(value))


_VOLATILE_FLAGS = ("--port", "--base-url", "--result-filename", "--result-dir")
"""Flags that differ between arms by construction (ports, file names); left out of the arm comparison."""


def arm_differences(base: ArmRecord | None, cand: ArmRecord | None) -> list[tuple[str, str, str]]:
    """What differs between the baseline and candidate launch: ``(what, baseline, candidate)`` rows.

    Compares server flags (ports and result paths excluded), server environment and benchmark flags. Empty when the
    arms launch identically (the caller warns: two identical arms compare nothing) or when an arm is missing.
    """
    if base is None or cand is None:
        return []
    rows: list[tuple[str, str, str]] = []
    for field_name, label in (("server_command", "server"), ("bench_command", "benchmark")):
        groups = [
            {group[0]: " ".join(group[1:])
             for group in _flag_groups(getattr(arm, field_name)) if group[0] not in _VOLATILE_FLAGS}
            for arm in (base, cand)
        ]
        for key in list(groups[0]) + [k for k in groups[1] if k not in groups[0]]:
            left, right = groups[0].get(key), groups[1].get(key)
            if left != right:
                rows.append((f"{label} {key}", "absent" if left is None else (left or "(set)"),
                             "absent" if right is None else (right or "(set)")))
    envs = [arm.server_env for arm in (base, cand)]
    for key in sorted(set(envs[0]) | set(envs[1])):
        left, right = envs[0].get(key), envs[1].get(key)
        if left != right:
            rows.append((f"env {key}", "unset" if left is None else str(left),
                         "unset" if right is None else str(right)))
    return rows


def model_label(manifest: Manifest) -> str:
    """The model the run served, from the resolved scenario (``model.path``/``id``/``name``, or a plain string)."""
    model = manifest.scenario_value("model")
    if isinstance(model, Mapping):
        for key in ("path", "id", "name"):
            if model.get(key):
                return str(model[key])
        return _show(model)
    return str(model) if model else "—"


def model_details(manifest: Manifest) -> list[tuple[str, str]]:
    """The scenario's model block as (key, value) pairs, for the header."""
    model = manifest.scenario_value("model")
    if isinstance(model, Mapping):
        return [(str(key), _show(value)) for key, value in model.items()]
    return []


def _level_statuses(arm: ArmRecord | None) -> dict[int, list[tuple[int, str]]]:
    """``{concurrency: [(round, status), ...]}`` from an arm's manifest levels (unparseable keys skipped)."""
    result: dict[int, list[tuple[int, str]]] = {}
    for key, info in arm.level_items() if arm is not None else []:
        result.setdefault(key.concurrency, []).append((key.round, info.status or "unknown"))
    return result


def _status_text(entries: list[tuple[int, str]]) -> tuple[str, str, str]:
    """(full text, CSS class, short word) of a level's manifest statuses over its repeats."""
    if not entries:
        return "not run", "missing", "not run"
    statuses = [status for _, status in entries]
    if len(set(statuses)) == 1:
        text, short = statuses[0], statuses[0].split(":")[0]
    else:
        text = "; ".join(f"r{repeat}: {status}" for repeat, status in entries)
        short = "mixed"
    if all(status == "done" for status in statuses):
        return text, "ok", short
    if any(status.startswith("failed") for status in statuses):
        return text, "failed", short
    return text, "missing", short


def _level_universe(manifest: Manifest, levels, requests) -> list[int]:
    """Every concurrency the run declared or touched: scenario workload, manifest level keys and both CSVs."""
    found: set[int] = set()
    declared = manifest.scenario_value("workload", "concurrency")
    if isinstance(declared, (list, tuple)):
        found.update(int(c) for c in declared if isinstance(c, (int, float)) and not isinstance(c, bool))
    for arm in manifest.arms:
        found.update(_level_statuses(arm))
    for frame in (levels, requests):
        if len(frame):
            found.update(int(c) for c in frame["concurrency"].dropna().unique())
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


def build_levels(manifest: Manifest, levels, requests) -> list[LevelView]:
    """One :class:`LevelView` per concurrency, including levels that failed or never ran (kept visible).

    ``levels``/``requests`` are the frames of :meth:`RunDir.levels` and :meth:`RunDir.requests`.
    """
    statuses = {arm: _level_statuses(manifest.arm(arm)) for arm in ARMS}
    views = []
    for concurrency in _level_universe(manifest, levels, requests):
        per_arm: dict[str, ArmLevel] = {}
        frames = {}
        for arm in ARMS:
            rows = levels[(levels["arm"] == arm) & (levels["concurrency"] == concurrency)] if len(levels) else levels
            reqs = (requests[(requests["arm"] == arm) & (requests["concurrency"] == concurrency)]
                    if len(requests) else requests)
            frames[arm] = rows
            status, status_class, short = _status_text(statuses[arm].get(concurrency, []))
            if status == "not run" and len(rows):
                status, status_class, short = "done (no manifest status)", "ok", "done"
            n_requests, n_errors, length_range, errors = _request_facts(reqs)
            per_arm[arm] = ArmLevel(
                status=status, status_class=status_class, status_short=short, repeats=len(rows),
                completed=_summary_of(rows, "completed"), failed=_summary_of(rows, "failed"),
                duration_s=_summary_of(rows, "duration_s"),
                max_concurrent=_achieved(reqs),
                client_cpu_util=_summary_of(rows, "client_cpu_util"),
                requests=n_requests, request_errors=n_errors, output_len_range=length_range, errors=errors,
            )
        metric_rows = []
        for metric in METRICS:
            base = _summary_of(frames[BASELINE], metric.name)
            cand = _summary_of(frames[CANDIDATE], metric.name)
            delta = delta_pct(base.value, cand.value)
            metric_rows.append(MetricRow(metric, base, cand, delta, delta_class(metric, delta)))
        views.append(LevelView(concurrency, per_arm, metric_rows, max(a.repeats for a in per_arm.values())))
    return views


def build_arm(name: str, arm: ArmRecord | None) -> ArmView:
    """An :class:`ArmView` of the manifest's arm ``name`` (``present=False`` when the arm is absent)."""
    if arm is None:
        return ArmView(name=name, present=False)
    reasons: list[str] = []
    items: list[tuple[str, str]] = []
    for key, value in arm.decision.items():
        if key == "reasons" and isinstance(value, (list, tuple)):
            reasons = [_show(reason) for reason in value]
        else:
            items.append((str(key), _show(value)))
    env_items = sorted((str(k), _show(v)) for k, v in arm.server_env.items())
    command = _argv(arm.server_command)
    assignments = [f"{key}={shlex.quote(value)}" for key, value in env_items]
    reproduce = " \\\n".join(assignments + ([command] if command else []))
    intended, observed = arm.intended, arm.observed
    mismatches = [_show(m) for m in arm.attestation.mismatches]
    mismatch_text = " ".join(mismatches)
    path_rows = []
    for key in list(intended) + [k for k in observed if k not in intended]:
        want, got = intended.get(key), observed.get(key)
        differs = key in intended and key in observed and want != got
        path_rows.append(PathRow(
            key=str(key), intended=_show(want) if key in intended else "—",
            observed=_show(got) if key in observed else "not observed",
            mismatch=differs or (bool(mismatches) and str(key) in mismatch_text),
        ))
    valid = arm.attestation.valid
    return ArmView(
        name=name, present=True, route=_show(arm.route), description=_show(arm.description),
        decision_items=items, decision_reasons=reasons,
        unavailable=[_show(u) for u in arm.unavailable],
        server_command=command, server_env=env_items, reproduce=reproduce,
        bench_command=_argv(arm.bench_command), path_rows=path_rows,
        attestation="valid" if valid is True else ("INVALID" if valid is False or mismatches else "unknown"),
        mismatches=mismatches, server_start_s=records.finite_float(arm.server_start_s),
        base_url=_show(arm.base_url or ""),
    )


def _timing(manifest: Manifest) -> list[tuple[str, str]]:
    """Harness timing rows: wall, server start, benchmark, client import, overhead, each with its share of wall."""
    timing = manifest.timing
    if not timing:
        return []
    wall = records.finite_float(timing.get("wall_s"))
    rows = []
    for key, label in (("wall_s", "Wall time"), ("server_start_s", "Server start (both arms)"),
                       ("benchmark_s", "Benchmark (measured load, incl. warmups)"),
                       ("client_import_s", "Benchmark client import (once)"),
                       ("harness_overhead_s", "Harness overhead")):
        if key not in timing and key == "client_import_s":
            continue
        value = records.finite_float(timing.get(key))
        text = "—" if value is None else f"{value:,.1f} s"
        if value is not None and wall and key != "wall_s":
            text += f" ({value / wall * 100:.1f} % of wall)"
        rows.append((label, text))
    share = records.finite_float(timing.get("harness_share"))
    overhead = records.finite_float(timing.get("harness_overhead_s"))
    if share is None and overhead is not None and wall:
        share = overhead / wall
    rows.append(("Harness share", "—" if share is None else f"{share * 100:.1f} %"))
    return rows


def _schedule(manifest: Manifest) -> str:
    """The run order from the manifest's ``schedule`` ((arm, concurrency, round) items) as one line."""
    return " → ".join(f"{arm} c{concurrency} r{round_}" for arm, concurrency, round_ in manifest.schedule)


def _banners(manifest: Manifest, arms: list[ArmView], levels: list[LevelView],
             differences: list[tuple[str, str, str]]) -> list[Banner]:
    banners = []
    if all(arm.present for arm in arms) and not differences:
        banners.append(Banner("warn", "The two arms have identical server commands, environments and benchmark "
                                      "commands: this run compares a path with itself (fine for an A/A check only)."))
    for arm in arms:
        if arm.attestation == "INVALID":
            detail = "; ".join(arm.mismatches) or "attestation.valid is false"
            banners.append(Banner("invalid", f"INVALID: the {arm.name} arm did not run its intended path ({detail})."))
    status = manifest.status
    if status != "done":
        banners.append(Banner("warn", f"Partial run: run status is '{_show(status)}'; figures cover what finished."))
    for arm in arms:
        if not arm.present:
            banners.append(Banner("warn", f"The {arm.name} arm is missing from the manifest (not started)."))
    troubled = [
        f"c={level.concurrency} {name}: {info.status}"
        for level in levels for name, info in level.arms.items() if info.status_class != "ok"
    ]
    if troubled:
        banners.append(Banner("warn", "Levels not completed: " + "; ".join(troubled) + "."))
    return banners


# ----------------------------------------------------------------------------------------------- report sections
GSM8K_REFERENCE_PCT = 94.768
GSM8K_REFERENCE = f"{GSM8K_REFERENCE_PCT} % GSM8K exact_match on GLM-5.2 NVFP4 (upstream figure)"
MTP_REFERENCE_PCT = 79.1
MTP_REFERENCE = f"{MTP_REFERENCE_PCT} % MTP acceptance rate (upstream figure)"
GSM8K_FILTERS = ("strict-match", "flexible-extract")


def _is_gpu_scenario(manifest: Manifest) -> bool:
    return manifest.scenario_value("platform") == "cuda"


def _pct(value: Any) -> float | None:
    number = records.finite_float(value)
    return None if number is None else 100.0 * number


def gsm8k_section(summary: Any, gpu: bool, verdict: Any = None) -> dict[str, Any] | str | None:
    """The ``gsm8k`` section from ``accuracy/summary.json`` (see harness.run.accuracy.summarize): per arm and filter
    accuracy ± stderr in %, the paired rows, why an arm is missing, and the upstream reference on GPU scenarios.
    A skipped run gives its reason (a string: "not measured: <reason>").

    The paired row of the gated filter carries the verdict's interval (``verdict.json``'s GSM8K cell: Agresti–Min at
    the level Holm's procedure tested it); the page shows no second interval for the same comparison."""
    if not isinstance(summary, Mapping):
        return None
    if summary.get("status") == "skipped":
        return _show(summary.get("reason") or "GSM8K skipped")
    rows, notes = [], []
    for arm in ARMS:
        info = (summary.get("arms") or {}).get(arm)
        if not isinstance(info, Mapping):
            continue
        filters = info.get("filters") if isinstance(info.get("filters"), Mapping) else {}
        if info.get("status") != "done" or not filters:
            notes.append(f"{arm}: {_show(info.get('status'))}")
            continue
        for name in [f for f in GSM8K_FILTERS if f in filters] + [f for f in filters if f not in GSM8K_FILTERS]:
            values = filters[name] if isinstance(filters[name], Mapping) else {}
            rows.append({"arm": arm, "filter": name, "accuracy_pct": _pct(values.get("accuracy")),
                         "stderr_pct": _pct(values.get("stderr")), "n": values.get("n")})
    gated, cell = _verdict_gsm8k(verdict)
    paired = []
    for row in summary.get("paired") or []:
        if isinstance(row, Mapping):
            own = cell if row.get("filter") == gated else {}
            paired.append({**row, "ci_low_pts": own.get("ci_low_pts"), "ci_high_pts": own.get("ci_high_pts"),
                           "ci_level": own.get("ci_level")})
    first = next((info for info in (summary.get("arms") or {}).values()
                  if isinstance(info, Mapping) and info.get("status") == "done"), {})
    setup = ""
    if first:
        limit = first.get("limit")
        setup = (f"lm-eval task {_show(first.get('task'))}, {_show(first.get('num_fewshot'))}-shot, "
                 f"{'full test set' if limit in (None, '') else f'first {limit} questions'}, data: "
                 f"{_show(first.get('source'))}")
    return {"arms": rows, "paired": paired, "notes": notes, "setup": setup,
            "reference": GSM8K_REFERENCE if gpu else None, "reference_pct": GSM8K_REFERENCE_PCT if gpu else None}


def _verdict_gsm8k(verdict: Any) -> tuple[str | None, Mapping[str, Any]]:
    """(the gated GSM8K filter, the verdict's GSM8K cell) of a ``verdict.json`` document, (None, {}) without one."""
    if not isinstance(verdict, Mapping):
        return None, {}
    fields = verdict.get("policy_fields") if isinstance(verdict.get("policy_fields"), Mapping) else {}
    cell = next((c for c in verdict.get("cells") or [] if isinstance(c, Mapping)
                 and c.get("metric") == "gsm8k_accuracy"), {})
    return fields.get("gsm8k_filter"), cell


def parity_section(result: Any) -> dict[str, Any] | None:
    """The ``parity`` section from ``parity.json`` (harness.run.parity.compare's result, already in the report's shape)."""
    return dict(result) if isinstance(result, Mapping) else None


def _pooled_mtp(frame) -> dict[str, Any]:
    """Acceptance over the repeats of one arm × level: counts summed, ratios recomputed from the sums
    (rate = Σaccepted / Σdraft tokens, length = 1 + Σaccepted / Σdrafts, per position weighted by drafts);
    without counts, the median of the stored ratios."""
    drafts = [records.finite_float(v) for v in frame["spec_drafts"]] if "spec_drafts" in frame else []
    tokens = [records.finite_float(v) for v in frame["spec_draft_tokens"]] if "spec_draft_tokens" in frame else []
    accepted = [records.finite_float(v) for v in frame["spec_accepted_tokens"]] if "spec_accepted_tokens" in frame else []
    per_pos_cells = list(frame["acceptance_per_pos"]) if "acceptance_per_pos" in frame else [None] * len(frame)
    complete = [i for i in range(len(frame))
                if drafts and tokens and accepted and None not in (drafts[i], tokens[i], accepted[i])]
    if complete and sum(drafts[i] for i in complete) > 0:
        total_drafts = sum(drafts[i] for i in complete)
        total_tokens = sum(tokens[i] for i in complete)
        total_accepted = sum(accepted[i] for i in complete)
        weighted: list[float] = []
        for i in complete:
            for pos, value in enumerate(_per_pos(per_pos_cells[i])):
                if pos == len(weighted):
                    weighted.append(0.0)
                weighted[pos] += value * drafts[i]
        return {"acceptance_rate_pct": 100.0 * total_accepted / total_tokens if total_tokens else None,
                "acceptance_length": 1.0 + total_accepted / total_drafts,
                "per_position": [100.0 * w / total_drafts for w in weighted],
                "drafts": int(total_drafts), "draft_tokens": int(total_tokens), "accepted": int(total_accepted)}
    rates = [records.finite_float(v) for v in frame["acceptance_rate"]] if "acceptance_rate" in frame else []
    lengths = [records.finite_float(v) for v in frame["acceptance_length"]] if "acceptance_length" in frame else []
    rate, length = summarize([r for r in rates if r is not None]), summarize([x for x in lengths if x is not None])
    return {"acceptance_rate_pct": None if rate.value is None else 100.0 * rate.value,
            "acceptance_length": length.value, "per_position": [],
            "drafts": int(sum(d for d in drafts if d is not None)) if drafts else None,
            "draft_tokens": None, "accepted": None}


def _per_pos(cell: Any) -> list[float]:
    """A ``levels.csv`` ``acceptance_per_pos`` cell (fractions joined by ``;``) as a list."""
    if records.finite_float(cell) is not None:
        return [float(cell)]
    if not isinstance(cell, str) or not cell.strip():
        return []
    values = [records.finite_float(part) for part in cell.split(";")]
    return [v for v in values if v is not None]


def mtp_section(levels, manifest: Manifest) -> dict[str, Any] | str | None:
    """The ``mtp`` section from the MTP columns of ``levels.csv``: one row per level × arm, and the reference on GPU
    scenarios. A run with MTP off says so; a run whose levels.csv has no acceptance yields None."""
    mtp = manifest.scenario_value("mtp")
    mtp = mtp if isinstance(mtp, Mapping) else {}
    if mtp and not mtp.get("num_speculative_tokens"):
        return "MTP is off in this run (mtp.num_speculative_tokens = 0)"
    present = [c for c in MTP_COLUMNS if c in levels.columns]
    if not len(levels) or "acceptance_rate" not in present:
        return None
    has_value = levels["acceptance_rate"].map(lambda v: records.finite_float(v) is not None)
    if "spec_drafts" in present:
        has_value |= levels["spec_drafts"].map(lambda v: records.finite_float(v) is not None)
    if not has_value.any():
        return None
    rows = []
    for concurrency in sorted(int(c) for c in levels["concurrency"].dropna().unique()):
        for arm in ARMS:
            frame = levels[(levels["arm"] == arm) & (levels["concurrency"] == concurrency) & has_value]
            if len(frame):
                rows.append({"concurrency": concurrency, "arm": arm, **_pooled_mtp(frame)})
    k = mtp.get("num_speculative_tokens") if mtp else None
    gpu = _is_gpu_scenario(manifest)
    return {"rows": rows, "num_speculative_tokens": k, "plot": _acceptance_plot(rows, records.finite_float(k)),
            "reference": MTP_REFERENCE if gpu else None, "reference_pct": MTP_REFERENCE_PCT if gpu else None}


def _acceptance_plot(rows: list[dict[str, Any]], k: float | None = None) -> dict[str, str] | None:
    """Acceptance length vs concurrency, one line per arm, as ``{"uri", "alt", "caption"}`` (None without data).

    The y axis spans 1 (no draft accepted) to 1 + ``k`` (every draft accepted) when ``k``, the speculative tokens per
    draft, is known.

    Drawn here rather than in :mod:`harness.render.plots` because it needs only the MTP rows (plots imports this
    module, hence the import inside the function).
    """
    from harness.render import plots

    figure, axes = plots._figure()
    drawn = []
    for arm in ARMS:
        points = [(r["concurrency"], r["acceptance_length"]) for r in rows
                  if r["arm"] == arm and records.finite_float(r.get("acceptance_length")) is not None]
        if points:
            axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=plots.ARM_COLORS[arm],
                      label=arm)
            drawn.extend(p[0] for p in points)
    if not drawn:
        return None
    plots._concurrency_axis(axes, sorted(set(drawn)))
    axes.set_ylabel("acceptance length (tokens per step)")
    highest = max(float(r["acceptance_length"]) for r in rows if records.finite_float(r.get("acceptance_length")) is not None)
    axes.set_ylim(0.95, max(1.0 + k if k else 0.0, highest) + 0.05)
    axes.legend(loc="best")
    axes.set_title("MTP acceptance length vs concurrency (higher is better)")
    return {"uri": plots.png_data_uri(figure),
            "alt": "Line chart: MTP acceptance length (tokens per target step) against concurrency, per arm.",
            "caption": "Acceptance length = 1 + accepted draft tokens / drafts over each level's measured window."}


def load_sections(store: RunDir, manifest: Manifest, levels, verdict: Any = None) -> dict[str, Any]:
    """The GSM8K, parity and MTP sections read from the run directory (values None when it has no such data);
    ``verdict`` (the verdict section) gives the GSM8K interval."""
    gpu = _is_gpu_scenario(manifest)
    gsm8k, parity = store.accuracy_summary(), store.parity_summary()
    return {
        "gsm8k": gsm8k_section(gsm8k.model_dump(mode="json") if gsm8k is not None else None, gpu, verdict),
        "parity": parity_section(parity.model_dump(mode="json") if parity is not None else None),
        "mtp": mtp_section(levels, manifest),
    }


def build_context(run_dir: Path, sections: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything the template needs, read from ``run_dir``.

    ``sections`` optionally fills the later-issue sections (each key absent or ``None`` → "not measured in this run";
    a string → "not measured" with that reason). Keys not passed are read from the run directory
    (:func:`load_sections`). Shapes (all values plain, all strings escaped by the template):

    - ``verdict``: ``{"overall": "PASS"|"FAIL"|"INCONCLUSIVE"|"INVALID", "policy": str, "cells": [{"concurrency",
      "metric", "delta_pct", "ci_low_pct", "ci_high_pct", "margin_pct", "result", "note"}]}``; cells whose metric is a
      ``levels.csv`` column also give the Δ % plot its error bars.
    - ``gsm8k``: ``{"arms": [{"arm", "filter", "accuracy_pct", "stderr_pct", "n"}], "paired": [{"filter",
      "difference_pts", "baseline_only", "candidate_only", "p_value", "ci_low_pts", "ci_high_pts", "ci_level"}],
      "notes": [str],
      "setup": str, "reference": str}``.
    - ``parity``: ``{"exact_match_rate_pct", "prompts_total", "tolerance", "max_logprob_diff", "near_ties",
      "failures", "divergences": [{"prompt_index", "prompt", "position", "max_logprob_diff", "margin",
      "near_tie"}]}``.
    - ``mtp``: ``{"rows": [{"concurrency", "arm", "acceptance_rate_pct", "acceptance_length", "per_position" (%),
      "drafts", "draft_tokens", "accepted"}], "num_speculative_tokens", "plot": {"uri", "alt", "caption"},
      "reference": str}``.

    Raises:
        RunDirError: the manifest is missing/unreadable, or a CSV exists but is unreadable or lacks a column.
    """
    store = RunDir(run_dir)
    manifest = store.manifest()
    levels, requests = store.levels(), store.requests()
    arms = [build_arm(name, manifest.arm(name)) for name in ARMS]
    level_views = build_levels(manifest, levels, requests)
    differences = arm_differences(manifest.arm(BASELINE), manifest.arm(CANDIDATE))
    started, ended = _parse_time(manifest.started_at), _parse_time(manifest.ended_at)
    elapsed = f"{(ended - started).total_seconds():,.0f} s" if started and ended else "—"
    platform = manifest.platform.model_dump()
    scenario = manifest.scenario
    given = dict(sections or {})
    unknown = set(given) - set(SECTION_KEYS)
    if unknown:
        raise ValueError(f"unknown report sections {sorted(unknown)}; expected a subset of {SECTION_KEYS}")
    for key, value in load_sections(store, manifest, levels, given.get("verdict")).items():
        given.setdefault(key, value)        # a section passed in wins over the run directory's files
    return {
        "run_id": _show(manifest.run_id or store.path.name),
        "status": _show(manifest.status),
        "schema_version": _show(store.version),
        "started_at": _show(manifest.started_at),
        "ended_at": _show(manifest.ended_at),
        "elapsed": elapsed,
        "scenario_name": _show(manifest.scenario_name),
        "scenario_file": _show(manifest.scenario_file),
        "scenario_description": _show(scenario.get("description") or ""),
        "scenario_json": json.dumps(scenario, indent=2, default=str) if scenario else "",
        "model": model_label(manifest),
        "model_details": model_details(manifest),
        "platform": [(str(k), _show(v)) for k, v in platform.items() if v is not None],
        "platform_name": _show(manifest.platform.name),
        "device": _show(manifest.platform.device),
        "versions": [(str(k), _show(v)) for k, v in manifest.versions.items()],
        "git_sha": _show(manifest.git_sha),
        "notes": [_show(note) for note in manifest.notes],
        "timing": _timing(manifest),
        "schedule": _schedule(manifest),
        "arms": arms,
        "levels": level_views,
        "differences": differences,
        "banners": _banners(manifest, arms, level_views, differences),
        "files": store.listing(),
        "metrics": METRICS,
        "sections": {key: _lenient(given.get(key)) for key in SECTION_KEYS},
    }
