"""``dsa-bench attribute``: a factorial attribution run's conclusion and its plan text.

The run itself is :func:`harness.compare.run` on a scenario with ``[attribution]`` (the plan carries the generated
arms, :mod:`harness.run.factors`; the runner runs them as sequential servers, each arm once per session block in a
seeded random order). This module then reads the run directory's ``levels.csv`` and manifest, turns them into
per-(arm, block) observations (:func:`observations`), fits the effects (:func:`harness.judge.attribution.analyse`),
writes ``attribution.json`` (:class:`harness.rundir.schema.AttributionDocument`), ``summary.md`` and ``report.html``
(:mod:`harness.render.attribution`) and prints the effects table.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.rundir import schema
from harness.rundir.store import RunDir

__all__ = ["observations", "conclude", "report", "plan_text"]


def _design(manifest: schema.Manifest) -> tuple[list[str], dict[str, tuple[int, ...]], str]:
    """(factor names, arm → 0/1 row, design "full"|"half") from the manifest's resolved scenario."""
    from harness.judge.factorial import arm_name, design_rows
    from harness.run.factors import AttributionSpec

    spec = AttributionSpec.model_validate(manifest.scenario_value("attribution"))
    design = spec.resolved_design()
    rows = {arm_name(row): row for row in design_rows(len(spec.factors), design)}
    return [f.name for f in spec.factors], rows, design


def observations(run_dir: Path) -> list[dict[str, Any]]:
    """One row per (arm, block, level) of a run: ``{"arm", "block", "session", "level", "levels": {factor: 0|1},
    "output_throughput", "server_mean_tpot_ms", "mean_tpot_ms", "acceptance_length", "engine_steps_per_s",
    "tokens_per_step", "load_avg_1m"}`` — the mean over the block's rounds of that arm's session (tok/s, ms, tokens;
    None where the column is empty). Only ``done`` levels count (levels.csv holds nothing else).

    Raises:
        RunDirError / SchemaError: an unreadable run directory.
    """
    store = RunDir(run_dir)
    manifest = store.manifest()
    factors, rows, _ = _design(manifest)
    per_session = manifest.rounds_per_session()
    table = store.levels()
    columns = ("output_throughput", "server_mean_tpot_ms", "mean_tpot_ms", "acceptance_length", "engine_steps_per_s",
               "tokens_per_step", "load_avg_1m")
    out: dict[tuple[str, int, str], dict[str, Any]] = {}
    for record in table.to_dict("records"):
        arm = str(record["arm"])
        if arm not in rows:
            continue
        block = int(record["round"]) // per_session
        label = str(record["level"])
        entry = out.setdefault((arm, block, label), {
            "arm": arm, "block": block, "session": _int(record.get("session")), "level": label,
            "levels": dict(zip(factors, rows[arm])), "_n": 0, **{c: [] for c in columns}})
        entry["_n"] += 1
        for column in columns:
            value = _float(record.get(column))
            if value is not None:
                entry[column].append(value)
    result = []
    for entry in out.values():
        for column in columns:
            values = entry[column]
            entry[column] = sum(values) / len(values) if values else None
        entry["rounds"] = entry.pop("_n")
        result.append(entry)
    return sorted(result, key=lambda e: (e["level"], e["block"], e["arm"]))


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    number = _float(value)
    return None if number is None else int(number)


def conclude(run_dir: Path, console) -> int:
    """After the run: observations → effects → ``attribution.json``, ``summary.md``, ``report.html``; the table on
    the terminal. Returns 0 when the effects were computed, 4 when not (the measurements stay on disk; ``dsa-bench
    attribute --report RUN_DIR`` redoes it)."""
    from rich.markup import escape

    try:
        document = write_documents(Path(run_dir))
    except Exception as error:  # noqa: BLE001 — the run's data is on disk whatever fails here
        console.print(f"[red]attribution failed ({escape(str(error))}); re-run `dsa-bench attribute --report "
                      f"{run_dir}`[/]")
        return 4
    from harness.render.attribution import terminal_table

    console.print(terminal_table(document))
    return 0


def write_documents(run_dir: Path) -> schema.AttributionDocument:
    """Compute and write ``attribution.json``, ``summary.md`` and ``report.html`` of ``run_dir``; returns the
    document."""
    from harness.judge.attribution import analyse
    from harness.render.attribution import report_html, summary_markdown

    store = RunDir(run_dir)
    manifest = store.manifest()
    factors, rows, design = _design(manifest)
    spec = manifest.scenario_value("attribution") or {}
    alpha = spec.get("alpha") or manifest.scenario_value("gate", "alpha") or 0.05
    metrics = tuple(spec.get("metrics") or ("output_throughput", "server_mean_tpot_ms", "acceptance_length"))
    result = analyse(observations(run_dir), factors, design, metrics, float(alpha))
    document = schema.AttributionDocument.model_validate({
        "run_id": manifest.run_id, "scenario": manifest.scenario_name, **result,
        "arms": [{"name": arm.name, "levels": dict(zip(factors, rows[arm.name])), "description": arm.description,
                  "intended": arm.intended, "attested": arm.attestation.valid,
                  "mismatches": list(arm.attestation.mismatches)} for arm in manifest.arms if arm.name in rows],
        "schedule": [list(step) for step in manifest.schedule],
    })
    store.write_json(schema.ATTRIBUTION, document.model_dump(mode="json"))
    store.write_text(schema.SUMMARY, summary_markdown(document))
    store.write_text(schema.REPORT, report_html(document))
    return document


def report(run_dir: Path) -> int:
    """``dsa-bench attribute --report RUN_DIR``: the documents again, the table printed. Returns 0."""
    from rich.console import Console

    from harness.render.attribution import terminal_table

    document = write_documents(run_dir)
    Console().print(terminal_table(document))
    print(run_dir / schema.REPORT)
    return 0


def plan_text(plan, refusal: str | None) -> str:
    """``dsa-bench attribute --plan``: the design (factors, arms, aliases, order, α), then every arm's path and the
    cost (:mod:`harness.run.plan_view`, :mod:`harness.run.estimate`)."""
    from harness.run import plan_view
    from harness.run.estimate import estimate
    from harness.judge.factorial import LETTERS, aliases, design_rows, effect_terms

    spec = plan.scenario.attribution
    design = spec.resolved_design()
    k = len(spec.factors)
    rows = design_rows(k, design)
    terms = effect_terms(k, design)
    alias = aliases(k, design)
    alpha = spec.alpha or plan.scenario.gate.alpha
    lines = [f"attribution: {k} factor(s), {'full 2^%d' % k if design == 'full' else '2^(4−1) fraction, D = ABC, I = ABCD (resolution IV)'}: "
             f"{len(rows)} arms per session block × {plan.scenario.workload.repeats} blocks = "
             f"{len(rows) * plan.scenario.workload.repeats} server sessions, one server at a time, each block's arm "
             f"order a seeded random permutation (random.Random(f\"{{workload.seed}}:arms:{{block}}\"))"]
    for letter, factor in zip(LETTERS, spec.factors):
        lines.append(f"  {letter} = {factor.name}: off {factor.describe(False)} → on {factor.describe(True)}"
                     + (f" ({factor.description})" if factor.description else ""))
    for interaction in spec.interactions:
        lines.append(f"  injected interaction (calibration): {interaction.inject} where "
                     f"{' and '.join(interaction.factors)} are on")
    names = ["".join(LETTERS[i] for i in term) for term in terms]
    tested = len(terms) * len(spec.metrics)
    lines.append(f"effects: {', '.join(n + ('=' + alias[n] if n in alias else '') for n in names)}"
                 + (f"; main effects aliased with 3-factor interactions ({', '.join(n + '=' + alias[n] for n in names if len(n) == 1)})" if alias else "")
                 + f"; OLS over (arm, block) with session blocks as fixed effects; Holm over {len(terms)} effects × "
                   f"{len(spec.metrics)} metrics = {tested} tests at α = {alpha:g} per level")
    lines.append("arms: " + "; ".join(f"{arm.name} ({arm.description})" for arm in plan.arms))
    lines.append("")
    return "\n".join(lines) + "\n" + plan_view.compact(plan, estimate(plan), refusal)
