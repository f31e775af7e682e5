"""The CI gate: a run directory → verdict (:mod:`harness.judge`) → ``verdict.json`` and the outputs of
:mod:`harness.render` (``summary.md``, dashboard JSON, terminal table) → exit code.

:func:`run_gate` reads the run directory through :class:`harness.rundir.store.RunDir`, decides with
:mod:`harness.judge.verdict`, and writes, atomically:

- ``verdict.json`` — schema below (``schema_version`` 1);
- ``summary.md`` — :mod:`harness.render.summary` (also appended to ``$GITHUB_STEP_SUMMARY`` when set);
- ``benchmark.pytorch.json`` — :mod:`harness.render.dashboard`.

It never passes on missing or unreadable data: an unreadable ``levels.csv``/``requests.csv``/``accuracy.csv``, or a
``manifest.json`` that breaks the schema, gives INVALID (with the file and the fix); only a missing run directory or a
manifest that is not a JSON object of a readable version raises :class:`RunDirError` (the CLI's usage error, exit 2).
Exit codes (:func:`exit_code`): 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 4 INVALID.

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
    pooled [ same keys, pooled true, concurrency null: per primary metric with several levels, the geometric mean
             of the per-level ratios; result "FAIL" or null (not rejected / not tested) ],
    gsm8k: null | {arms [{arm, filter, accuracy_pct, stderr_pct, n}], paired [{filter, difference_pts,
                   baseline_only, candidate_only, p_value}]}        # the HTML report's GSM8K section shape
    validity {failures [{arm, concurrency, round, check, detail}], not_checked [str]},
    notes [str], evaluated: bool (false: the data could not be read, no figures),
    sessions_needed: null | int   # INCONCLUSIVE: sessions per arm for 90 % that every primary cell PASSes an
                                  # unchanged candidate (harness.judge.advice.joint_sessions_needed)
    noise: null | {column, levels [{concurrency, pairs, sd, low, high, upper}], pooled {same}, blocks_timed,
                   wall_per_block_s, cost_s, minutes_to_1pct_se, blocks_3pct, blocks_3pct_upper, minutes_3pct}
           # this run's paired spread of output throughput per session block and its cost per decision
           # (harness.judge.design_costs.run_noise; an A/B's spread estimates the noise as well as an A/A's)
    stalls [{arm, concurrency, round, session, reason, excluded}]   # flagged rounds (harness.judge.stalls)
    slo [{level, arm, good, requests, share, lower, alpha}]   # SLO attainment per arm and level with its exact
                                                              # one-sided lower bound (harness.judge.attainment)
    prefix_cache [{level, arm, hits, queries, rate}]   # each arm's prefix-cache hit rate per level, tokens pooled
                                                       # over its rounds (harness.judge.prefix_cache; not gated)
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from harness.judge import divergence
from harness.judge.correctness_cell import CorrectnessCell
from harness.judge.attainment import slo_attainment
from harness.judge.prefix_cache import prefix_cache
from harness.judge.design_costs import run_noise
from harness.judge.policy import METRICS, GatePolicy, Status
from harness.judge.verdict import Verdict, evaluate
from harness.render import dashboard, summary, terminal
from harness.render.output import VerdictView
from harness.rundir.schema import EXIT_CODES, PYTORCH_JSON, STOPPED, SUMMARY, VERDICT, Manifest, VerdictDocument
from harness.rundir.store import RunDir, RunDirError, SchemaError, json_text
from harness.rundir.files import first_error

__all__ = [
    "VERDICT_SCHEMA_VERSION", "VERDICT", "SUMMARY", "PYTORCH_JSON", "EXIT_CODES",
    "PolicyError", "GateResult", "exit_code", "load_policy", "look", "run_gate", "print_gate",
]

VERDICT_SCHEMA_VERSION = 1
FILE_OUTPUTS = (summary.OUTPUT, dashboard.OUTPUT)

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
    levels: Any = None                          # the levels.csv frame the verdict read (None: unreadable)
    summary: str = ""
    document: dict[str, Any] = field(default_factory=dict)
    written: list[Path] = field(default_factory=list)
    write_errors: list[str] = field(default_factory=list)
    correctness: list[CorrectnessCell] = field(default_factory=list)   # token divergence, parity

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
        raise PolicyError(first_error(error, f"{source}: gate.{{where}}: {{message}}")) from error


def _policy_from_manifest(manifest: Manifest | None) -> tuple[GatePolicy, str]:
    gate = manifest.scenario_value("gate") if manifest is not None else None
    if isinstance(gate, Mapping):
        return _validate_policy(gate, "manifest.json scenario"), "manifest"
    return GatePolicy(), "default"


def _read_tables(store: RunDir, policy: GatePolicy):
    """levels, requests and accuracy frames with numeric keys; RunDirError names the broken file."""
    metric_columns = tuple(METRICS[n].column for n in policy.primary if METRICS[n].source == "level")
    return store.levels(required=metric_columns, numeric=True), store.requests(numeric=True), store.accuracy()


def look(run_dir: Path) -> Verdict | None:
    """A sequential run's look at the session blocks finished so far (None: the manifest's policy is the fixed
    design, or the data cannot be read yet).

    The levels not yet run count as not planned (``stopped``). Accuracy is tested once, by the final gate, so at a look
    it has no data; the policy stays whole, so the FAIL side splits α over the same metrics as the final gate. The
    returned status is that of the session-replicated cells at this look's α (:mod:`harness.judge.sequential`): FAIL
    when one of them FAILs, PASS when every one of them PASSes, else INCONCLUSIVE.
    """
    store = RunDir(Path(run_dir))
    try:
        manifest = store.manifest()
        policy, _ = _policy_from_manifest(manifest)
        if policy.max_sessions is None:
            return None
        levels, requests, _ = _read_tables(store, policy)
    except (RunDirError, PolicyError, ValueError):
        return None
    data = manifest.model_dump(mode="json")
    for arm in data["arms"]:
        for level in arm["levels"].values():
            if level["status"] == "pending":
                level["status"] = f"{STOPPED}: not run yet at this look"
    verdict = evaluate(Manifest.model_validate(data), levels, requests, None, policy, diagnostics=False)
    session_cells = [c for c in verdict.cells if c.primary and METRICS[c.metric].source != "accuracy"]
    failed = [c for c in session_cells if c.status == Status.FAIL]
    if failed:
        return replace(verdict, status=Status.FAIL, reason=f"{len(failed)} session-replicated cell(s) FAIL")
    if session_cells and all(c.status == Status.PASS for c in session_cells if not c.pooled):
        return replace(verdict, status=Status.PASS, reason="every session-replicated cell PASSes")
    return replace(verdict, status=Status.INCONCLUSIVE, reason="no session-replicated cell decided")


def tokens_gated(manifest: Manifest) -> bool:
    """Whether the run was planned with the correctness cells: ``[parity] gated`` recorded true (a manifest from
    before the cells lacks the key: not gated) and real weights
    (never ``load_format = "dummy"``: why, in ``harness.run.scenario.ParitySpec.gated``)."""
    return (manifest.scenario_value("parity", "gated") is True
            and manifest.scenario_value("model", "load_format") != "dummy")


def correctness_cells(store: RunDir, manifest: Manifest | None, policy: GatePolicy) -> list[CorrectnessCell]:
    """The correctness family (:func:`harness.judge.divergence.judge`) from ``scoring/`` and ``parity/`` (none when
    the run does not gate tokens).

    Raises:
        RunDirError: a file exists but is not valid JSON.
    """
    if manifest is None or not tokens_gated(manifest):
        return []
    fix = "rerun the run's checks (dsa-bench compare --resume)"
    read = {folder: {label: (store.read_json(f"{folder}/{label}.json", fix) or {}).get("results")
                     for label in divergence.SCORINGS} for folder in ("scoring", "parity")}
    return divergence.judge(read["scoring"], read["parity"], policy.alpha, policy.token_tolerance,
                            policy.decode_tolerance, policy.confidence_tolerance)


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
            result.correctness = correctness_cells(store, result.manifest, policy)
            result.status, result.reason = divergence.merge(result.verdict.status, result.verdict.reason,
                                                            result.correctness)
        except (ValueError, TypeError, KeyError, AttributeError, RunDirError) as error:
            # Data the checks did not anticipate: never a PASS, and say what broke.
            result.reason = f"could not evaluate the run's data ({type(error).__name__}: {error})"
            levels = None
    result.levels = levels
    result.document = verdict_document(result)
    view = view_of(result)
    result.summary = summary.render(view)
    if write:
        _write_outputs(result, view)
    return result


def _write_outputs(result: GateResult, view: VerdictView) -> None:
    outputs = [(VERDICT, json_text(result.document))]
    outputs += [(output.file, output.render(view)) for output in FILE_OUTPUTS
                if output.file != PYTORCH_JSON or (result.levels is not None and result.manifest is not None)]
    store = RunDir(result.run_dir)
    for name, text in outputs:
        path = store.file(name)
        try:
            store.write_text(name, text)
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


def store_json(data: Any) -> Any:
    """``data`` as it reads back from JSON (non-finite floats → None, numpy scalars → Python)."""
    return json.loads(json_text(data))


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
        "pooled": [c.to_dict() for c in verdict.pooled] if verdict else [],
        "validity": {"failures": verdict.validity.failures if verdict else [],
                     "not_checked": verdict.validity.not_checked if verdict else []},
        "notes": verdict.notes if verdict else [], "evaluated": verdict is not None,
        "sessions_needed": verdict.sessions_needed if verdict else None,
        "noise": _noise(result),
        "stalls": [s.to_dict() for s in verdict.stalls] if verdict else [],
        "correctness": [c.to_dict() for c in result.correctness],
        "slo": [row.to_dict() for row in slo_attainment(result.levels, result.policy.alpha)]
        if result.levels is not None and verdict is not None else [],
        "prefix_cache": [row.to_dict() for row in prefix_cache(result.levels)]
        if result.levels is not None and verdict is not None else [],
    }


def _noise(result: GateResult) -> dict[str, Any] | None:
    """This run's paired spread and cost per decision (None without readable data or a throughput column)."""
    if result.manifest is None or result.levels is None or "output_throughput" not in result.levels.columns:
        return None
    try:
        return run_noise(result.manifest, result.levels)
    except (ValueError, KeyError, TypeError):
        return None


def view_of(result: GateResult) -> VerdictView:
    """What the outputs render: the typed verdict document, the manifest and the levels frame."""
    return VerdictView(VerdictDocument.model_validate(store_json(result.document)), result.manifest, result.levels,
                       result.run_dir, tuple(result.written), tuple(result.write_errors))


def print_gate(result: GateResult, console=None) -> None:
    """Print the verdict table and line (stdout by default); see :mod:`harness.render.terminal`."""
    terminal.print_view(view_of(result), console)
