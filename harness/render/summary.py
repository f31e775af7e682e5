"""``summary.md``: a PR-comment-sized markdown verdict (also appended to ``$GITHUB_STEP_SUMMARY``), from
``verdict.json``'s document. A few KB, well under GitHub's 65,536-character comment limit."""

from __future__ import annotations

from harness.render.answer import forest_rows, next_step
from harness.render.designs import designs_section
from harness.render.output import ICON, MAX_LIST, Output, VerdictView, fmt, status_text
from harness.rundir.schema import SEVERITY, SUMMARY, Level, Regime, Status, VerdictCell


def delta_text(cell: VerdictCell | None) -> str:
    """``"+1.2 % [-0.4, +2.8]"`` (``pt`` for GSM8K), ``—`` without a Δ."""
    if cell is None or cell.delta is None:
        return "—"
    unit, digits = (" pt", 2) if cell.delta_unit == "pt" else (" %", 1)
    text = f"{cell.delta:+.{digits}f}{unit}"
    if cell.ci_low is not None and cell.ci_high is not None:
        text += f" [{cell.ci_low:+.{digits}f}, {cell.ci_high:+.{digits}f}]"
    return text


def render(view: VerdictView) -> str:
    """Verdict line, one row per level (throughput and mean TPOT of both arms with Δ and interval, MTP acceptance
    length, the level's verdict), GSM8K with McNemar, and collapsed details."""
    document, manifest = view.document, view.manifest
    names = document.arms
    lines = [f"### {ICON[document.overall]} dsa-bench gate: **{document.overall}**", ""]
    head = (f"`{names['candidate']}` vs `{names['baseline']}` · run `{document.run_id}`"
            f" · model `{manifest.model_name() if manifest is not None else 'unknown'}`")
    if manifest is not None and manifest.platform.device:
        head += f" · {manifest.platform.name} ({manifest.platform.device})"
    lines += [head, "", f"> {document.reason}", "", _next_step(view), ""]
    if manifest is not None and manifest.imported_from:
        lines += ["Imported, not attested: measured by other tooling (`dsa-bench import`); neither arm's execution "
                  "path was observed.", ""]
    if not document.evaluated:
        lines += ["No figures: the run's data could not be read. Fix or re-run it (`dsa-bench compare --resume "
                  f"{view.run_dir}`) and gate again."]
        return "\n".join(lines) + "\n"
    lines += _level_table(view)
    lines += _pooled_lines(document.pooled, len({c.regime for c in document.cells if c.regime}))
    lines += _slo_lines(document.slo)
    lines += _prefix_cache_lines(document.prefix_cache)
    accuracy = view.cell_map().get(("gsm8k_accuracy", None))
    if accuracy is not None:
        lines += [_gsm8k_line(accuracy, document.policy_fields.get("gsm8k_filter", "")), ""]
    lines += _correctness_lines(document.correctness)
    shown = {"output_throughput", tpot_metric(document), "acceptance_length", "gsm8k_accuracy"}
    others = [c for c in document.cells if c.metric not in shown]
    if others:
        lines.append("Other primary cells: " + "; ".join(
            f"{_name(c)} {delta_text(c)} {status_text(c.result)}" for c in others))
        lines.append("")
    lines += _details(view)
    return "\n".join(lines) + "\n"


def _next_step(view: VerdictView) -> str:
    """The report's next-step sentence (:func:`harness.render.answer.next_step`), so the PR comment and the first
    screen say the same."""
    verdict = view.document.model_dump(mode="json")
    found = designs_section(view.manifest, verdict) if view.manifest is not None else None
    return next_step(verdict, forest_rows(verdict), found, str(view.run_dir))


def tpot_metric(document) -> str:
    """The TPOT the level table shows: the gated one (``server_mean_tpot_ms`` where ``[gate] primary`` names the
    server's mean TPOT, as the CPU default does), else the client's ``mean_tpot_ms``."""
    return "server_mean_tpot_ms" if any(c.metric == "server_mean_tpot_ms" for c in document.cells) else "mean_tpot_ms"


def _level_table(view: VerdictView) -> list[str]:
    cells = view.cell_map()
    document = view.document
    levels = sorted({c.level for c in (*document.cells, *document.diagnostics) if Level.parse(c.level)},
                    key=Level.parse)
    several = len({Level.parse(level).regime for level in levels}) > 1
    show_mtp = any(metric == "acceptance_length" for metric, _ in cells)
    tpot_name = tpot_metric(document)
    header = ["Level" if several else "Conc.", "Output tok/s base", "cand", "Δ tput [CI]",
              f"{'Server mean' if tpot_name == 'server_mean_tpot_ms' else 'Mean'} TPOT ms base", "cand", "Δ TPOT [CI]"]
    if show_mtp:
        header.append("MTP accept. length base → cand")
    header.append("Verdict")
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["--:"] * 3 + [":--"] + ["--:"] * 2 + [":--"] * (len(header) - 6)) + "|"]
    for level in levels:
        tput, tpot = cells.get(("output_throughput", level)), cells.get((tpot_name, level))
        shown = Level.parse(level).label(regime=several) if several else str(Level.parse(level).concurrency)
        row = [shown, fmt(tput and tput.baseline), fmt(tput and tput.candidate), delta_text(tput),
               fmt(tpot and tpot.baseline, 2), fmt(tpot and tpot.candidate, 2), delta_text(tpot)]
        if show_mtp:
            mtp = cells.get(("acceptance_length", level))
            row.append("—" if mtp is None or mtp.baseline is None or mtp.candidate is None else
                       f"{mtp.baseline:.2f} → {mtp.candidate:.2f}" + (
                           "" if mtp.delta is None else f" ({mtp.delta:+.1f} %)"))
        statuses = [Status(c.result) for c in document.cells if c.level == level and c.result is not None]
        row.append(status_text(min(statuses, key=lambda s: SEVERITY[s])) if statuses else "")
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""]


def pooled_result(cell: VerdictCell) -> str:
    """A pooled hypothesis' outcome: its FAIL, "not rejected" when tested, "not tested" without an estimate."""
    if cell.result is not None:
        return status_text(cell.result)
    return "not rejected" if cell.delta is not None else "not tested"


def _pooled_lines(pooled, regimes: int = 1) -> list[str]:
    """One line: each metric's pooled hypothesis per regime (geometric mean of the per-level ratios), tested for
    FAIL with the levels; each names its regime when the run has ``regimes`` > 1 (a one-level regime has none)."""
    if not pooled:
        return []
    several = regimes > 1 or len({c.regime for c in pooled}) > 1
    return ["Pooled over each regime's levels (geometric mean of the per-level ratios; tested for FAIL with the "
            "levels, Holm): " + "; ".join(
                f"{c.label}{_regime_text(c) if several else ''} {delta_text(c)} (margin {c.margin:+g} %) "
                f"{pooled_result(c)}" for c in pooled), ""]


def _regime_text(cell: VerdictCell) -> str:
    regime = Regime.parse(cell.regime)
    return f" ({regime.label()})" if regime is not None else ""


def _slo_lines(rows) -> list[str]:
    """One line: per level, each arm's SLO attainment and its exact one-sided lower bound (harness.judge.attainment);
    nothing for a run without ``[slo]``."""
    if not rows:
        return []
    confidence = 100 * (1 - rows[0]["alpha"])
    return [f"SLO attainment (requests meeting every objective of [slo]; exact one-sided {confidence:g} % lower "
            "bound): " + _per_level(rows, lambda row: f"{100 * row['share']:.1f} % (≥ {100 * row['lower']:.1f} %, "
                                                      f"{row['good']}/{row['requests']})"), ""]


def _prefix_cache_lines(rows) -> list[str]:
    """One line: per level where an arm found a cached prompt token, each arm's prefix-cache hit rate
    (harness.judge.prefix_cache); nothing where no level hit the cache."""
    hit = {row["level"] for row in rows if row["hits"]}
    rows = [row for row in rows if row["level"] in hit]
    if not rows:
        return []
    return ["Prefix-cache hit rate (prompt tokens found cached / looked up, each arm's /metrics; not gated): "
            + _per_level(rows, lambda row: f"{100 * row['rate']:.1f} % ({row['hits']}/{row['queries']} tokens)"), ""]


def _per_level(rows, text) -> str:
    """``"<level>: <arm> <text(row)>, …; …"`` over per-arm rows with a ``level`` id, the regime in the label only
    when the rows span several."""
    several = len({Level.parse(row["level"]).regime for row in rows if Level.parse(row["level"])}) > 1
    by_level: dict[str, list[str]] = {}
    for row in rows:
        parsed = Level.parse(row["level"])
        where = parsed.label(regime=several) if parsed else row["level"]
        by_level.setdefault(where, []).append(f"{row['arm']} {text(row)}")
    return "; ".join(f"{where}: {', '.join(arms)}" for where, arms in by_level.items())


def _gsm8k_line(cell: VerdictCell, gsm8k_filter: str) -> str:
    label = f"**GSM8K** ({gsm8k_filter}"
    if cell.accuracy is None or cell.mcnemar is None:
        return f"{label}): {status_text(cell.result)} — {cell.note}"
    acc, mc = cell.accuracy, cell.mcnemar
    return (f"{label}, n = {acc['n']}): baseline {acc['baseline_pct']:.2f} ± {acc['baseline_stderr_pct']:.2f} %, "
            f"candidate {acc['candidate_pct']:.2f} ± {acc['candidate_stderr_pct']:.2f} %, Δ {delta_text(cell)} "
            f"(margin {cell.margin:+g} pt); discordant {mc['baseline_only']} baseline-only / {mc['candidate_only']} "
            f"candidate-only, McNemar exact p = {mc['p_value']:.3g} · {status_text(cell.result)}")


def _correctness_lines(cells) -> list[str]:
    """The correctness family: per cell its outcome against the A/A envelope and, when it FAILs, the first divergent
    prompt and token (0-based index into the continuation)."""
    lines = []
    for cell in cells:
        if cell.result == "INVALID":
            lines.append(f"**{cell.name}** (vs the A/A envelope): {status_text(cell.result)} — {'; '.join(cell.reasons)}")
            continue
        if cell.name == "token_divergence":
            figures = (f"per-token |Δ log p| A/B p99 {fmt(cell.ab.get('p99'), 4)}, max {fmt(cell.ab.get('max'), 4)} "
                       f"nats, arg-max flips {fmt(100 * (cell.ab.get('flip_share') or 0.0), 1)} % · A/A max "
                       f"{fmt(cell.aa.get('max'), 4)}")
        elif cell.name == "confidence_loss":
            figures = (f"forced tokens' log-odds shift per prompt A/B mean {fmt(cell.ab.get('mean'), 4)}, lowest "
                       f"{fmt(cell.ab.get('min'), 4)} nats/token · A/A mean {fmt(cell.aa.get('mean'), 4)} · band "
                       f"{fmt(cell.ab.get('tolerance'), 4)}")
        elif cell.name == "decode_divergence":
            figures = (f"decode vs own prefill, runner-up |Δ log p| over {cell.ab.get('positions', '—')} of "
                       f"{cell.ab.get('tokens', '—')} positions: A/B p99 {fmt(cell.ab.get('p99'), 4)}, max "
                       f"{fmt(cell.ab.get('max'), 4)} nats · A/A max {fmt(cell.aa.get('max'), 4)}")
        else:
            figures = (f"exact match A/B {fmt(cell.ab.get('exact_match_rate_pct'))} %, A/A "
                       f"{fmt(cell.aa.get('exact_match_rate_pct'))} %")
        first = (f"; first divergent prompt {cell.first[0]} at token {cell.first[1]}"
                 if cell.first is not None and cell.result == "FAIL" else "")
        lines.append(f"**{cell.name}** (vs the A/A envelope): {figures}; {cell.exceed} prompt(s) beyond it, "
                     f"{cell.below} within it by more, {getattr(cell, 'test', None) or 'sign test'} p = "
                     f"{cell.p_fail:.3g} (cell α = {cell.alpha:g})"
                     f"{first} · {status_text(cell.result)}")
    return lines + [""] if lines else []


def _name(cell) -> str:
    """``"Output throughput c=4"``; the GSM8K cell by its label alone (:meth:`VerdictCell.named`)."""
    return cell.named(cell.label)


def _details(view: VerdictView) -> list[str]:
    document = view.document
    primary = document.cells
    repeats = sorted({c.repeats for c in primary if c.concurrency is not None and c.repeats})
    levels_conf = sorted({round(100 * c.ci_level, 2) for c in primary if c.ci_level is not None})
    confidence = "—" if not levels_conf else (f"{levels_conf[0]:g} %" if len(levels_conf) == 1
                                              else f"{levels_conf[0]:g}–{levels_conf[-1]:g} %")
    lines = ["<details><summary>How to read this</summary>", "",
             f"Δ = candidate / baseline − 1 (GSM8K: difference in points). Paired sessions per level: "
             f"{', '.join(map(str, repeats)) or '—'}. Intervals: paired bootstrap over sessions (each session's "
             "statistic over all its requests; Efron & Tibshirani 1993) standard error with Student-t on sessions − 1 "
             "degrees of freedom; GSM8K: Tango's (1998) score test against the margin. Each primary interval is "
             "two-sided at the level Holm's step-down tested "
             f"it at ({confidence}); other metrics 95 %, no verdict.",
             "PASS: the interval clears the margin; FAIL: it lies wholly beyond it; INCONCLUSIVE: neither; "
             "INVALID: a validity check failed or data is missing.", "",
             f"Policy ({document.policy_source}): {document.policy}.", "", "</details>", ""]
    problems = [f"{_name(c)}: {c.note}" for c in primary if c.result == "INVALID"]
    needs = [f"{_name(c)}: {c.note}" for c in primary if c.result == "INCONCLUSIVE"]
    for title, items in (("INVALID cells", problems), ("INCONCLUSIVE cells", needs), ("Notes", list(document.notes))):
        if items:
            lines += [f"<details><summary>{title} ({len(items)})</summary>", ""]
            lines += [f"- {item}" for item in items[:MAX_LIST]]
            if len(items) > MAX_LIST:
                lines.append(f"- … and {len(items) - MAX_LIST} more (see verdict.json)")
            lines += ["", "</details>", ""]
    return lines


OUTPUT = Output(SUMMARY, render)
