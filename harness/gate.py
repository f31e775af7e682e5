"""The CI gate: a run directory → verdict, ``verdict.json``, ``summary.md``, dashboard JSON, exit code.

:func:`run_gate` reads the run directory through :class:`harness.rundir.store.RunDir`, decides with
:mod:`harness.judge.verdict`, and writes, atomically:

- ``verdict.json`` — schema below (``schema_version`` 1);
- ``summary.md`` — a PR-comment-sized markdown verdict (also appended to ``$GITHUB_STEP_SUMMARY`` when set);
- ``benchmark.pytorch.json`` — per arm and level figures in the PyTorch OSS benchmark format that vLLM's dashboard
  reads (the records of ``vllm/benchmarks/lib/utils.py:convert_to_pytorch_benchmark_format``, vLLM 0.32).

It never passes on missing or unreadable data: an unreadable ``levels.csv``/``requests.csv``/``accuracy.csv``, or a
``manifest.json`` that breaks the schema, gives INVALID (with the file and the fix); only a missing run directory or a
manifest that is not a JSON object of a readable version raises :class:`RunDirError` (the CLI's usage error, exit 2). Exit codes (:func:`exit_code`): 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 4 INVALID.

``verdict.json``::

    schema_version: 1, kind: "dsa-bench.verdict", run_id, run_dir, created_at (ISO 8601 UTC), run_status,
    overall: "PASS"|"FAIL"|"INCONCLUSIVE"|"INVALID", exit_code, reason (one sentence),
    policy: str (one line), policy_source: "argument"|"manifest"|"default", policy_fields {GatePolicy fields},
    arms {baseline: name, candidate: name},
    cells [ {metric, label, unit, concurrency (null for GSM8K), primary, result,
             higher_is_better, baseline, candidate, ratio, delta, ci_low, ci_high, delta_unit ("%"|"pt"), ci_level,
             margin, p_pass, p_fail, p_pass_holm, p_fail_holm, repeats, repeats_needed, samples_needed,
             n_baseline, n_candidate, percentile_95, reasons [str], notes [str], note,
             delta_pct, ci_low_pct, ci_high_pct, margin_pct (null for GSM8K),
             (GSM8K) delta_pts, ci_low_pts, ci_high_pts, margin_pts, mcnemar {...}, accuracy {...}} ],
    diagnostics [ same keys, primary false, result null: non-primary metrics, unadjusted 95 % interval ],
    gsm8k: null | {arms [{arm, filter, accuracy_pct, stderr_pct, n}], paired [{filter, difference_pts,
                   baseline_only, candidate_only, p_value}]}        # the HTML report's GSM8K section shape
    validity {failures [{arm, concurrency, repeat, check, detail}], not_checked [str]},
    notes [str]
"""

from __future__ import annotations

import math
import os
import sys
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from harness.judge.policy import METRICS, SEVERITY, GatePolicy, Status
from harness.judge.verdict import Verdict, evaluate
from harness.rundir import schema
from harness.rundir.schema import PYTORCH_JSON, SUMMARY, VERDICT, Manifest
from harness.rundir.store import RunDir, RunDirError, SchemaError, json_text

__all__ = [
    "VERDICT_SCHEMA_VERSION", "VERDICT", "SUMMARY", "PYTORCH_JSON", "EXIT_CODES",
    "PolicyError", "GateResult", "exit_code", "load_policy", "run_gate", "render_summary", "pytorch_records",
    "print_gate", "gate_main",
]

VERDICT_SCHEMA_VERSION = 1
EXIT_CODES: dict[Status, int] = {Status.PASS: 0, Status.FAIL: 1, Status.INCONCLUSIVE: 3, Status.INVALID: 4}

_ICON = {Status.PASS: "✅", Status.FAIL: "❌", Status.INCONCLUSIVE: "⚠️", Status.INVALID: "🚫"}
_STYLE = {Status.PASS: "green", Status.FAIL: "bold red", Status.INCONCLUSIVE: "yellow", Status.INVALID: "magenta"}
_MAX_LIST = 15


class PolicyError(ValueError):
    """A policy file or the manifest's ``scenario.gate`` is invalid; ``str(error)`` is one line naming the fix."""


@dataclass
class GateResult:
    """What :func:`run_gate` found and wrote.

    ``verdict`` is None when the data could not be read (``status`` is then INVALID and ``reason`` says why).
    ``written`` lists the files written; ``write_errors`` the ones that could not be (the verdict stands).
    """

    run_dir: Path
    status: Status
    reason: str
    manifest: Manifest | None                   # None: manifest.json breaks the schema (the reason says where)
    policy: GatePolicy
    policy_source: str
    verdict: Verdict | None = None
    summary: str = ""
    document: dict[str, Any] = field(default_factory=dict)
    written: list[Path] = field(default_factory=list)
    write_errors: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def run_id(self) -> str:
        return self.manifest.run_id if self.manifest is not None and self.manifest.run_id else self.run_dir.name


def exit_code(verdict: GateResult | Status | str) -> int:
    """The process exit code of a verdict: 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 4 INVALID (2 stays the usage error)."""
    if isinstance(verdict, GateResult):
        return verdict.exit_code
    return EXIT_CODES[Status(str(verdict))]


def _policy_fields(data: Mapping[str, Any]) -> Mapping[str, Any]:
    gate = data.get("gate")
    return gate if isinstance(gate, Mapping) else data


def load_policy(path: Path) -> GatePolicy:
    """Read a gate policy from TOML: the ``[gate]`` table's fields at top level, or a file with a ``[gate]`` table
    (so a scenario file works too).

    Raises:
        PolicyError: unreadable file, bad TOML, or a field that fails validation (one line).
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise PolicyError(f"{path}: cannot read the policy file ({error.strerror or error})") from error
    except tomllib.TOMLDecodeError as error:
        raise PolicyError(f"{path}: not valid TOML ({error})") from error
    return _validate_policy(_policy_fields(data), str(path))


def _validate_policy(fields: Mapping[str, Any], source: str) -> GatePolicy:
    try:
        return GatePolicy.model_validate(dict(fields))
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "gate"
        raise PolicyError(f"{source}: gate.{where}: {first.get('msg')}") from error


def _policy_from_manifest(manifest: Manifest | None) -> tuple[GatePolicy, str]:
    gate = manifest.scenario_value("gate") if manifest is not None else None
    if isinstance(gate, Mapping):
        return _validate_policy(gate, "manifest.json scenario"), "manifest"
    return GatePolicy(), "default"


def _read_tables(store: RunDir, policy: GatePolicy):
    """levels, requests and accuracy frames with numeric keys; RunDirError names the broken file."""
    metric_columns = tuple(METRICS[n].column for n in policy.primary if METRICS[n].source == "level")
    return store.levels(required=metric_columns, numeric=True), store.requests(numeric=True), store.accuracy()


def run_gate(run_dir: Path, policy: GatePolicy | None = None, *, write: bool = True) -> GateResult:
    """Compute the verdict of ``run_dir`` and (``write``) write ``verdict.json``, ``summary.md`` and
    ``benchmark.pytorch.json`` into it, appending the summary to ``$GITHUB_STEP_SUMMARY`` when set.

    ``policy`` None: the manifest's ``scenario.gate`` (what the run was planned with), else :class:`GatePolicy`'s
    defaults.

    Raises:
        RunDirError: ``run_dir`` or its ``manifest.json`` is missing or unreadable (nothing to gate; exit 2).
        PolicyError: the manifest's ``scenario.gate`` is not a valid policy.
    """
    run_dir = Path(run_dir)
    store = RunDir(run_dir)
    manifest, broken = None, None
    try:
        manifest = store.manifest()
    except SchemaError as error:
        broken = error
    source = "argument"
    if policy is None:
        policy, source = _policy_from_manifest(manifest)
    result = GateResult(run_dir, Status.INVALID, "", manifest, policy, source)
    levels = None
    try:
        if broken is not None:
            raise broken
        levels, requests, accuracy = _read_tables(store, policy)
    except RunDirError as error:
        result.reason = f"unreadable data: {error}"
    if levels is not None:
        try:
            result.verdict = evaluate(result.manifest, levels, requests, accuracy, policy)
            result.status, result.reason = result.verdict.status, result.verdict.reason
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            # Data the checks did not anticipate: never a PASS, and say what broke.
            result.reason = f"could not evaluate the run's data ({type(error).__name__}: {error})"
            levels = None
    result.document = verdict_document(result)
    result.summary = render_summary(result)
    if write:
        _write_outputs(result, levels)
    return result


def _write_outputs(result: GateResult, levels) -> None:
    outputs: list[tuple[Path, Any]] = [(result.run_dir / VERDICT, result.document),
                                       (result.run_dir / SUMMARY, result.summary)]
    if levels is not None and result.manifest is not None:
        outputs.append((result.run_dir / PYTORCH_JSON, pytorch_records(result.manifest, levels, result)))
    store = RunDir(result.run_dir)
    for path, content in outputs:
        try:
            store.write_text(path.name, content if isinstance(content, str) else json_text(content))
            result.written.append(path)
        except OSError as error:
            result.write_errors.append(f"{path}: {error.strerror or error}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as handle:
                handle.write(result.summary + "\n")
        except OSError as error:
            result.write_errors.append(f"$GITHUB_STEP_SUMMARY {step_summary}: {error.strerror or error}")


def verdict_document(result: GateResult) -> dict[str, Any]:
    """The ``verdict.json`` content (schema in the module docstring)."""
    verdict = result.verdict
    cells = [c.to_dict() for c in verdict.primary] if verdict else []
    diagnostics = [c.to_dict() for c in verdict.diagnostics] if verdict else []
    gsm8k = None
    for cell in verdict.cells if verdict else []:
        if cell.metric == "gsm8k_accuracy" and cell.accuracy:
            names = verdict.validity.arms
            gsm8k = {
                "arms": [{"arm": names[role], "filter": result.policy.gsm8k_filter,
                          "accuracy_pct": cell.accuracy[f"{role}_pct"],
                          "stderr_pct": cell.accuracy[f"{role}_stderr_pct"], "n": cell.accuracy["n"]}
                         for role in ("baseline", "candidate")],
                "paired": [{"filter": result.policy.gsm8k_filter, "difference_pts": cell.delta,
                            "baseline_only": cell.mcnemar["baseline_only"],
                            "candidate_only": cell.mcnemar["candidate_only"], "p_value": cell.mcnemar["p_value"]}],
            }
    return {
        "schema_version": VERDICT_SCHEMA_VERSION, "kind": "dsa-bench.verdict",
        "run_id": result.run_id, "run_dir": str(result.run_dir),
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run_status": result.manifest.status if result.manifest is not None else None,
        "overall": str(result.status), "exit_code": result.exit_code, "reason": result.reason,
        "policy": result.policy.describe(), "policy_source": result.policy_source,
        "policy_fields": result.policy.model_dump(mode="json"),
        "arms": dict(verdict.validity.arms) if verdict else {"baseline": "baseline", "candidate": "candidate"},
        "cells": cells, "diagnostics": diagnostics, "gsm8k": gsm8k,
        "validity": {"failures": verdict.validity.failures if verdict else [],
                     "not_checked": verdict.validity.not_checked if verdict else []},
        "notes": verdict.notes if verdict else [],
    }


# -------------------------------------------------------------------------------------------------------- summary.md


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:,.{digits}f}"


def _digits(value: float | None) -> int:
    return 2 if value is not None and abs(value) < 100 else 1


def _delta_text(cell) -> str:
    if cell is None or cell.delta is None:
        return "—"
    unit, digits = (" pt", 2) if cell.spec.margin_unit == "pt" else (" %", 1)
    text = f"{cell.delta:+.{digits}f}{unit}"
    if cell.ci_low is not None and cell.ci_high is not None:
        text += f" [{cell.ci_low:+.{digits}f}, {cell.ci_high:+.{digits}f}]"
    return text


def _status_text(status: Status | None) -> str:
    return "" if status is None else f"{_ICON[status]} {status}"


def _cell_map(verdict: Verdict) -> dict[tuple[str, int | None], Any]:
    found: dict[tuple[str, int | None], Any] = {}
    for cell in verdict.cells:                                      # primary first: it wins over a diagnostic twin
        found.setdefault((cell.metric, cell.level), cell)
    return found


def render_summary(result: GateResult) -> str:
    """``summary.md``: verdict line, one row per level (throughput and mean TPOT of both arms with Δ and interval,
    MTP acceptance length, the level's verdict), GSM8K with McNemar, and collapsed details. A few KB, well under
    GitHub's 65,536-character comment limit."""
    status, verdict, manifest = result.status, result.verdict, result.manifest
    names = verdict.validity.arms if verdict else {"baseline": "baseline", "candidate": "candidate"}
    lines = [f"### {_ICON[status]} dsa-bench gate: **{status}**", ""]
    head = (f"`{names['candidate']}` vs `{names['baseline']}` · run `{result.run_id}`"
            f" · model `{manifest.model_name() if manifest is not None else 'unknown'}`")
    if manifest is not None and manifest.platform.device:
        head += f" · {manifest.platform.name} ({manifest.platform.device})"
    lines += [head, "", f"> {result.reason}", ""]
    if verdict is None:
        lines += ["No figures: the run's data could not be read. Fix or re-run it (`dsa-bench compare --resume "
                  f"{result.run_dir}`) and gate again."]
        return "\n".join(lines) + "\n"
    cells = _cell_map(verdict)
    levels = sorted({c.level for c in verdict.cells if c.level is not None})
    show_mtp = any(m == "acceptance_length" for m, _ in cells)
    header = ["Conc.", "Output tok/s base", "cand", "Δ tput [CI]", "Mean TPOT ms base", "cand", "Δ TPOT [CI]"]
    if show_mtp:
        header.append("MTP accept. length base → cand")
    header.append("Verdict")
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join(["--:"] * 3 + [":--"] + ["--:"] * 2 + [":--"] * (
        len(header) - 6)) + "|"]
    for level in levels:
        tput, tpot = cells.get(("output_throughput", level)), cells.get(("mean_tpot_ms", level))
        row = [str(level), _fmt(tput and tput.baseline), _fmt(tput and tput.candidate), _delta_text(tput),
               _fmt(tpot and tpot.baseline, 2), _fmt(tpot and tpot.candidate, 2), _delta_text(tpot)]
        if show_mtp:
            mtp = cells.get(("acceptance_length", level))
            row.append("—" if mtp is None or mtp.baseline is None or mtp.candidate is None else
                       f"{mtp.baseline:.2f} → {mtp.candidate:.2f}" + (
                           "" if mtp.delta is None else f" ({mtp.delta:+.1f} %)"))
        statuses = [c.status for c in verdict.primary if c.level == level and c.status is not None]
        row.append(_status_text(min(statuses, key=lambda s: SEVERITY[s])) if statuses else "")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    accuracy = cells.get(("gsm8k_accuracy", None))
    if accuracy is not None:
        lines.append(_gsm8k_line(accuracy, result.policy))
        lines.append("")
    shown = {"output_throughput", "mean_tpot_ms", "acceptance_length", "gsm8k_accuracy"}
    others = [c for c in verdict.primary if c.metric not in shown]
    if others:
        lines.append("Other primary cells: " + "; ".join(
            f"{c.spec.label} {c.where} {_delta_text(c)} {_status_text(c.status)}" for c in others))
        lines.append("")
    lines += _details(result)
    return "\n".join(lines) + "\n"


def _gsm8k_line(cell, policy: GatePolicy) -> str:
    label = f"**GSM8K** ({policy.gsm8k_filter}"
    if cell.accuracy is None:
        return f"{label}): {_status_text(cell.status)} — {cell.note()}"
    acc, mc = cell.accuracy, cell.mcnemar
    return (f"{label}, n = {acc['n']}): baseline {acc['baseline_pct']:.2f} ± {acc['baseline_stderr_pct']:.2f} %, "
            f"candidate {acc['candidate_pct']:.2f} ± {acc['candidate_stderr_pct']:.2f} %, Δ {_delta_text(cell)} "
            f"(margin {cell.margin:+g} pt); discordant {mc['baseline_only']} baseline-only / {mc['candidate_only']} "
            f"candidate-only, McNemar exact p = {mc['p_value']:.3g} · {_status_text(cell.status)}")


def _details(result: GateResult) -> list[str]:
    verdict = result.verdict
    assert verdict is not None
    primary = verdict.primary
    repeats = sorted({c.repeats for c in primary if c.level is not None and c.repeats})
    levels_conf = sorted({round(100 * c.ci_level, 2) for c in primary if c.ci_level is not None})
    confidence = "—" if not levels_conf else (f"{levels_conf[0]:g} %" if len(levels_conf) == 1
                                              else f"{levels_conf[0]:g}–{levels_conf[-1]:g} %")
    lines = ["<details><summary>How to read this</summary>", "",
             f"Δ = candidate / baseline − 1 (GSM8K: difference in points). Paired repeats per level: "
             f"{', '.join(map(str, repeats)) or '—'}. Intervals: paired block bootstrap (repeats, then requests; "
             "Efron & Tibshirani 1993) standard error with Student-t on repeats − 1 degrees of freedom; GSM8K: "
             "Agresti–Min paired interval. Each primary interval is two-sided at the level Holm's step-down tested "
             f"it at ({confidence}); other metrics 95 %, no verdict.",
             "PASS: the interval clears the margin; FAIL: it lies wholly beyond it; INCONCLUSIVE: neither; "
             "INVALID: a validity check failed or data is missing.", "",
             f"Policy ({result.policy_source}): {result.policy.describe()}.", "", "</details>", ""]
    problems = [f"{c.spec.label} {c.where}: {c.note()}" for c in primary if c.status == Status.INVALID]
    needs = [f"{c.spec.label} {c.where}: {c.note()}" for c in primary if c.status == Status.INCONCLUSIVE]
    for title, items in (("INVALID cells", problems), ("INCONCLUSIVE cells", needs),
                         ("Notes", verdict.notes)):
        if items:
            lines += [f"<details><summary>{title} ({len(items)})</summary>", ""]
            lines += [f"- {item}" for item in items[:_MAX_LIST]]
            if len(items) > _MAX_LIST:
                lines.append(f"- … and {len(items) - _MAX_LIST} more (see verdict.json)")
            lines += ["", "</details>", ""]
    return lines


# --------------------------------------------------------------------------------------------- PyTorch benchmark JSON

_DASHBOARD_METRICS = ("output_throughput", "total_token_throughput", "request_throughput", "mean_ttft_ms",
                      "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                      "p99_itl_ms", "mean_e2el_ms", "acceptance_length", "acceptance_rate")


def pytorch_records(manifest: Manifest, levels, result: GateResult | None = None) -> list[dict[str, Any]]:
    """Per arm × level × metric records in the PyTorch OSS benchmark format, as vLLM writes them.

    Same record shape as ``convert_to_pytorch_benchmark_format`` (vLLM 0.32, ``benchmarks/lib/utils.py``):
    ``{"benchmark": {"name": "vLLM benchmark", "extra_info": {"args", "compilation_config.mode",
    "optimization_level", "use_compile"}}, "model": {"name"}, "metric": {"name", "benchmark_values", "extra_info"}}``.
    ``benchmark_values`` holds one value, the mean over the level's repeats (vLLM writes one value per run); the
    per-repeat values, the arm and the gate's Δ/interval for that cell are in ``metric.extra_info``. Written always
    (vLLM only when ``SAVE_TO_PYTORCH_BENCHMARK_FORMAT`` is set) and without importing vLLM.
    """
    import pandas as pd

    model = manifest.model_name()
    tensor_parallel_size = manifest.scenario_value("serve", "tensor_parallel_size") or 1
    cells = _cell_map(result.verdict) if result is not None and result.verdict is not None else {}
    out = []
    for (arm, level), frame in levels.groupby(["arm", "concurrency"]):
        record = manifest.arm(str(arm))
        route = record.route if record is not None else None
        mode = record.intended.get("compilation_mode") if record is not None else None
        args = {"model": model, "max_concurrency": int(level), "arm": arm, "route": route,
                "num_prompts": int(frame["completed"].max() + frame["failed"].max()),
                "tensor_parallel_size": tensor_parallel_size, "dataset_name": "random",
                "run_id": manifest.run_id}
        for metric in _DASHBOARD_METRICS:
            if metric not in frame.columns:
                continue
            values = pd.to_numeric(frame[metric], errors="coerce").dropna()
            if values.empty:
                continue
            extra = {"arm": arm, "route": route, "concurrency": int(level),
                     "repeat_values": [float(v) for v in values], "repeats": int(values.size)}
            cell = cells.get((metric, int(level)))
            if cell is not None and cell.delta is not None:
                extra.update(delta_pct=cell.delta, ci_low_pct=cell.ci_low, ci_high_pct=cell.ci_high,
                             gate_result=None if cell.status is None else str(cell.status))
            out.append({
                "benchmark": {"name": "vLLM benchmark", "extra_info": {
                    "args": args, "compilation_config.mode": "" if mode is None else str(mode),
                    "optimization_level": "", "use_compile": mode not in (None, "NONE", "0", 0)}},
                "model": {"name": model},
                "metric": {"name": metric, "benchmark_values": [float(values.mean())], "extra_info": extra},
            })
    return out


# ------------------------------------------------------------------------------------------------------------ terminal


def print_gate(result: GateResult, console=None) -> None:
    """Print the primary cells as a table, their notes, and the verdict line with rich (stdout by default)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    verdict = result.verdict
    if verdict is not None:
        table = Table(title=f"dsa-bench gate · {escape(result.run_id)}",
                      title_justify="left")
        for name, justify in (("metric", "left"), ("c", "right"), ("baseline", "right"), ("candidate", "right"),
                              ("Δ", "right"), ("interval", "right"), ("margin", "right"), ("verdict", "left")):
            table.add_column(name, justify=justify)
        notes = []
        for cell in verdict.primary:
            unit = cell.spec.margin_unit
            interval = "—" if cell.ci_low is None else (
                f"[{cell.ci_low:+.2f}, {cell.ci_high:+.2f}] @{100 * cell.ci_level:.3g}%")
            mark = ""
            if cell.note():
                notes.append(f"{cell.spec.label} {cell.where}: {cell.note()}")
                mark = f" ({len(notes)})"
            table.add_row(cell.spec.label, "" if cell.level is None else str(cell.level),
                          _fmt(cell.baseline, _digits(cell.baseline)), _fmt(cell.candidate, _digits(cell.candidate)),
                          "—" if cell.delta is None else f"{cell.delta:+.2f} {unit}", escape(interval),
                          f"{cell.margin:+g} {unit}", f"[{_STYLE[cell.status]}]{cell.status}[/]{mark}")
        console.print(table)
        for i, note in enumerate(notes[:_MAX_LIST], 1):
            console.print(f"  ({i}) {escape(note)}", highlight=False)
        if len(notes) > _MAX_LIST:
            console.print(f"  … and {len(notes) - _MAX_LIST} more in verdict.json", highlight=False)
        for note in verdict.notes:
            console.print(f"[dim]note: {escape(note)}[/]", highlight=False)
    for error in result.write_errors:
        console.print(f"[red]could not write[/] {escape(error)}", highlight=False)
    console.print(f"[{_STYLE[result.status]}]{result.status}[/] (exit {result.exit_code}): {escape(result.reason)}",
                  highlight=False)
    if result.written:
        console.print(f"[dim]wrote {', '.join(p.name for p in result.written)} in {escape(str(result.run_dir))}[/]",
                      highlight=False)


def gate_main(run_dir: Path, policy_file: Path | None = None, *, console=None) -> int:
    """Everything ``dsa-bench gate RUN_DIR [--policy FILE]`` does; returns the exit code.

    Usage errors (missing run dir or manifest, bad policy) print one line and return 2.
    """
    from rich.console import Console

    console = console or Console()
    try:
        policy = load_policy(Path(policy_file)) if policy_file else None
        result = run_gate(Path(run_dir), policy)
    except (RunDirError, PolicyError) as error:
        print(f"dsa-bench gate: {error}", file=sys.stderr)
        return 2
    print_gate(result, console)
    return result.exit_code
