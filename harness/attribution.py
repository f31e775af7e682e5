"""``dsa-bench attribute``: a factorial attribution run's conclusion and its plan text.

The run itself is :func:`harness.compare.run` on a scenario with ``[attribution]`` (the plan carries the generated
arms, :mod:`harness.run.factors`; the runner runs them as sequential servers, each arm once per session block in a
seeded random order). This module then reads the run directory's ``levels.csv`` and manifest, turns them into
per-(arm, block) observations (:func:`observations`), fits the effects (:func:`harness.judge.attribution.analyse`),
checks the size of injected step delays' effects (:func:`harness.judge.injected_size.injected_sizes`), writes
``attribution.json`` (:class:`harness.rundir.schema.AttributionDocument`), ``summary.md`` and ``report.html``
(:mod:`harness.render.attribution`) and prints the effects table. :func:`recompute` does the same from a stored
``attribution.json`` alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.rundir import schema
from harness.rundir.store import RunDir, atomic_write_json, atomic_write_text

__all__ = ["observations", "conclude", "report", "plan_text", "write_documents", "build_document", "recompute",
           "delay_factors", "arm_delays"]


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
    from harness.render.attribution import report_html, summary_markdown
    from harness.run.factors import AttributionSpec

    store = RunDir(run_dir)
    manifest = store.manifest()
    factors, rows, _ = _design(manifest)
    spec = AttributionSpec.model_validate(manifest.scenario_value("attribution"))
    alpha = spec.alpha or manifest.scenario_value("gate", "alpha") or 0.05
    arms = [{"name": arm.name, "levels": dict(zip(factors, rows[arm.name])), "description": arm.description,
             "intended": arm.intended, "attested": arm.attestation.valid,
             "mismatches": list(arm.attestation.mismatches)} for arm in manifest.arms if arm.name in rows]
    document = build_document(observations(run_dir), spec, float(alpha), {
        "run_id": manifest.run_id, "scenario": manifest.scenario_name, "arms": arms,
        "schedule": [list(step) for step in manifest.schedule]})
    store.write_json(schema.ATTRIBUTION, document.model_dump(mode="json"))
    store.write_text(schema.SUMMARY, summary_markdown(document))
    store.write_text(schema.REPORT, report_html(document))
    return document


def build_document(rows: list[dict[str, Any]], spec, alpha: float, run: dict[str, Any],
                   notes: tuple[str, ...] = ()) -> schema.AttributionDocument:
    """The attribution document of ``rows`` (:func:`observations`) under ``spec`` (an
    :class:`~harness.run.factors.AttributionSpec`): the effects (:func:`harness.judge.attribution.analyse` over
    ``spec.metrics`` at ``alpha``) and, where factors are step delays, their size check
    (:func:`harness.judge.injected_size.injected_sizes`); ``run`` carries ``run_id``, ``scenario``, ``arms`` (each with
    ``intended["injection"]``, where the delays are read) and ``schedule``; ``notes`` are added to the analysis'."""
    from harness.judge.attribution import analyse
    from harness.judge.injected_size import injected_sizes

    factors = [f.name for f in spec.factors]
    design = spec.resolved_design()
    result = analyse(rows, factors, design, tuple(spec.metrics), alpha)
    result["notes"] = [*notes, *result["notes"]]
    injected = delay_factors(spec)
    sizes = None
    if injected:
        try:
            sizes = injected_sizes(rows, result["effects"], factors, design, arm_delays(run.get("arms") or []),
                                   injected)
        except ValueError as error:
            result["notes"].append(f"no size check of the injected effects: {error}")
    return schema.AttributionDocument.model_validate({
        **run, **result, "attribution": spec.model_dump(mode="json"), "injected_sizes": sizes})


def delay_factors(spec) -> list[str]:
    """The factors of ``spec`` whose "on" level is a ``step-delay`` injection and nothing else (no knob, env or
    flags): the ones whose effects have a known size."""
    from dsa_route.inject import parse_injection

    return [f.name for f in spec.factors if f.knob is None and not f.env and not f.extra_args
            and f.inject is not None and parse_injection(f.inject).kind == "step-delay"]


def arm_delays(arms: list[dict[str, Any]]) -> dict[str, float]:
    """Arm name → its step delay in ms (0 without one), from each arm's intended ``injection``
    (``"step-delay:62"``; the merged delays of its factors and injected interactions, :mod:`harness.run.factors`)."""
    from dsa_route.inject import parse_injection

    out = {}
    for arm in arms:
        injection = parse_injection((arm.get("intended") or {}).get("injection"))
        out[arm["name"]] = 1000.0 * injection.delay_s if injection is not None else 0.0
    return out


def recompute(path: Path) -> schema.AttributionDocument:
    """``dsa-bench attribute --report FILE.json``: the effects and the size check of a stored ``attribution.json``
    again, from its own observations (no run directory needed: a committed result). Writes the file back and
    ``<stem>-summary.md`` beside it; returns the document. The factors come from the file's ``attribution`` table, or,
    in a file written before it was stored, from the scenario the file names (said in its notes).

    Raises:
        UsageError: an unreadable or invalid file, or a named scenario whose factors are not the file's.
    """
    import json

    from pydantic import ValidationError

    from harness.compare import UsageError
    from harness.render.attribution import summary_markdown
    from harness.run.factors import AttributionSpec
    from harness.run.scenario import load_scenario

    try:
        old = schema.AttributionDocument.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as error:
        first = str(error).splitlines()[0] if not isinstance(error, ValidationError) else \
            f"{error.error_count()} invalid field(s), first {error.errors()[0]['loc']}: {error.errors()[0]['msg']}"
        raise UsageError(f"{path}: not a readable attribution.json ({first}); pass a run directory or the "
                         "attribution.json an attribution run wrote") from None
    notes: tuple[str, ...] = ()
    if old.attribution is not None:
        spec = AttributionSpec.model_validate(old.attribution)
    else:
        spec = load_scenario(old.scenario or "").attribution
        notes = (f"factors read from scenarios/{old.scenario}.toml as it is now (this file predates the stored "
                 "[attribution] table)",)
    if spec is None or [f.name for f in spec.factors] != old.factors:
        raise UsageError(f"{path}: its factors {old.factors} are not those of scenario {old.scenario} "
                         f"({[f.name for f in spec.factors] if spec else 'none'}); recompute it from its run directory")
    document = build_document([o.model_dump() for o in old.observations], spec, old.alpha, {
        "run_id": old.run_id, "scenario": old.scenario, "arms": old.arms, "schedule": old.schedule}, notes)
    atomic_write_json(path, document.model_dump(mode="json"))
    atomic_write_text(path.with_name(f"{path.stem}-summary.md"), summary_markdown(document))
    return document


def report(path: Path) -> int:
    """``dsa-bench attribute --report PATH``: a run directory's documents again, or (``PATH`` an
    ``attribution.json``) the file recomputed (:func:`recompute`); the table printed. Returns 0."""
    from rich.console import Console

    from harness.render.attribution import terminal_table

    document = recompute(path) if path.is_file() else write_documents(path)
    Console().print(terminal_table(document))
    print(path if path.is_file() else path / schema.REPORT)
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
    return "\n".join(lines) + "\n" + plan_view.compact(plan, estimate(plan), refusal, command="dsa-bench attribute")
