"""What people read of an attribution: the effects table (``summary.md``, the terminal) and ``report.html`` with the
baseline → candidate waterfall. Reads only :class:`harness.rundir.schema.AttributionDocument` (never the judge or the
runner), so every page is re-buildable from ``attribution.json`` alone."""

from __future__ import annotations

import math
from pathlib import Path

import jinja2

from harness.render import plots
from harness.rundir.schema import AttributionDocument, InjectedSizes, WaterfallStep

__all__ = ["effect_rows", "size_rows", "step_rows", "sizes_headline", "summary_markdown", "terminal_table",
           "report_html", "waterfall_plot"]

TEMPLATE_DIR = Path(__file__).parent / "templates"


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:+.{digits}f}"


def _p(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.3g}" if value >= 1e-3 else f"{value:.1e}"


def effect_rows(document: AttributionDocument) -> list[dict[str, object]]:
    """One display row per effect: metric, level, term, letters, alias, estimate, percent, interval, p, Holm p,
    attributed, note — numbers as text (log effects to 3 decimals, percent to 1)."""
    rows = []
    for e in document.effects:
        rows.append({"metric": e.metric, "level": e.level, "term": e.term, "letters": e.letters, "alias": e.alias,
                     "estimate": _num(e.estimate), "percent": "" if e.percent is None else f"{e.percent:+.1f} %",
                     "interval": f"[{_num(e.ci_low)}, {_num(e.ci_high)}]", "p": _p(e.p), "p_holm": _p(e.p_holm),
                     "attributed": e.attributed, "note": e.note})
    return rows


def size_rows(sizes: InjectedSizes) -> list[dict[str, object]]:
    """One display row per size check: metric, level, term, estimate, interval, expected (with its range over the
    blocks), inside ("yes", "NO (by x)" or "—") — numbers as text, 3 decimals."""
    rows = []
    for c in sizes.checks:
        verdict = "—" if c.inside is None else "yes" if c.inside else f"NO (by {c.miss:.3f})"
        rows.append({"metric": c.metric, "level": c.level, "term": c.term, "estimate": _num(c.estimate),
                     "interval": f"[{_num(c.ci_low)}, {_num(c.ci_high)}]", "expected": _num(c.expected),
                     "range": f"{_num(c.expected_low)} … {_num(c.expected_high)}", "inside": verdict})
    return rows


def step_rows(sizes: InjectedSizes) -> list[dict[str, object]]:
    """One display row per delayed arm and route: arm, level, route, delay (ms), step and reference step (ms, one
    decimal), the sleeps per step the difference implies (two decimals) and the excess (ms)."""
    return [{"arm": s.arm, "level": s.level, "route": s.route, "delay": f"{s.delay_ms:g}", "step": f"{s.step_ms:.1f}",
             "reference": f"{s.reference_ms:.1f}", "sleeps": f"{s.sleeps_per_step:.2f}",
             "excess": f"{s.excess_ms:+.1f}"} for s in sizes.steps]


def sizes_headline(sizes: InjectedSizes) -> str:
    """``"injected sizes: 13 of 15 effects hold their expected size in their interval (delay_c on …)"``."""
    missed = [f"{c.term} on {c.metric} @ {c.level}" for c in sizes.checks if c.inside is False]
    return (f"injected sizes: {sizes.inside} of {sizes.checked} effects with an injected factor hold their expected "
            f"size in their interval" + (f"; outside: {', '.join(missed)}" if missed else ""))


def _sizes_markdown(sizes: InjectedSizes) -> list[str]:
    lines = ["", "### Injected effects: the expected size against the interval", "", sizes_headline(sizes) + ".",
             f"Assumption: {sizes.assumption}; references {sizes.reference}.", "",
             "| metric | level | term | estimate | interval | expected | over blocks | inside |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['metric']} | {r['level']} | {r['term']} | {r['estimate']} | {r['interval']} | {r['expected']} | "
              f"{r['range']} | {r['inside']} |" for r in size_rows(sizes)]
    lines += ["", "The assumption measured: step time of each delayed arm and of its reference (ms).", "",
              "| arm | level | route | delay ms | step | reference | sleeps per step | excess ms |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['arm']} | {r['level']} | {r['route']} | {r['delay']} | {r['step']} | {r['reference']} | "
              f"{r['sleeps']} | {r['excess']} |" for r in step_rows(sizes)]
    return lines + [f"- {note}" for note in sizes.notes]


def _design_text(document: AttributionDocument) -> str:
    k = len(document.factors)
    if document.design == "half":
        return f"2^({k}−1) fraction, {document.generator} (resolution IV)"
    return f"full 2^{k} design"


def summary_markdown(document: AttributionDocument) -> str:
    """``summary.md``: the design in one line, then the effects table (attributed effects in bold), then the size
    check of injected effects where there is one."""
    lines = [f"## dsa-bench attribution — {document.scenario}", "",
             f"{_design_text(document)}, {document.blocks} session block(s), α = {document.alpha:g}, Holm over "
             f"{document.tests} effects. {document.model}.", "",
             "| metric | level | term | estimate | as % | interval | Holm p | attributed |",
             "|---|---|---|---|---|---|---|---|"]
    for row in effect_rows(document):
        mark = "**" if row["attributed"] else ""
        alias = f" (= {row['alias']})" if row["alias"] else ""
        lines.append(f"| {row['metric']} | {row['level']} | {mark}{row['term']}{alias}{mark} | {row['estimate']} | "
                     f"{row['percent']} | {row['interval']} | {row['p_holm']} | {'yes' if row['attributed'] else 'no'} |")
    if document.injected_sizes is not None:
        lines += _sizes_markdown(document.injected_sizes)
    lines += ["", *[f"- {note}" for note in document.notes], ""]
    return "\n".join(lines)


def terminal_table(document: AttributionDocument) -> str:
    """The effects as a plain-text table for the terminal (one line per effect)."""
    out = [f"attribution ({_design_text(document)}, {document.blocks} blocks, Holm over {document.tests} at "
           f"α = {document.alpha:g}):"]
    for row in effect_rows(document):
        out.append(f"  {row['metric']:<22} {row['level']:<22} {row['term']:<20} {row['estimate']:>8} "
                   f"{row['percent']:>9} {row['interval']:<20} Holm p {row['p_holm']:<8} "
                   f"{'ATTRIBUTED' if row['attributed'] else ''}")
    if document.injected_sizes is not None:
        out.append(sizes_headline(document.injected_sizes))
    return "\n".join(out)


def waterfall_plot(key: str, steps: list[WaterfallStep]) -> plots.Plot | None:
    """A waterfall of one metric at one level: the baseline's fitted value, each factor's step (green up, red
    down), the candidate's fitted value. Log metrics are drawn as ratios to the baseline (e^(y − y₀))."""
    if not steps:
        return None
    log = not key.startswith("acceptance")
    start = steps[0].before
    value = (lambda y: math.exp(y - start)) if log else (lambda y: y)
    figure, axes = plots.new_figure((7.2, 3.4))
    labels = ["baseline", *[f"+{s.factor}" for s in steps], "candidate"]
    axes.bar(0, value(start), color="#4c72b0")
    for i, step in enumerate(steps, start=1):
        low, high = sorted((value(step.before), value(step.after)))
        axes.bar(i, high - low, bottom=low, color="#1a7f37" if step.after >= step.before else "#cf222e")
    axes.bar(len(steps) + 1, value(steps[-1].after), color="#dd8452")
    axes.set_xticks(range(len(labels)), labels)
    axes.set_ylabel("ratio to baseline" if log else key.split(" @ ")[0])
    return plots.Plot(key=key, title=key, alt=f"waterfall of {key}",
                      caption=f"{key}: the fitted model from every factor off to every factor on, one factor at a time "
                              "in factor order" + (" (ratio to the baseline's fitted value)" if log else ""),
                      uri=plots.png_data_uri(figure))


def report_html(document: AttributionDocument) -> str:
    """``report.html`` of an attribution run: design, effects table, waterfalls, arms, notes (self-contained)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), autoescape=True)
    figures = [plots_ for key, steps in document.waterfall.items()
               for plots_ in [waterfall_plot(key, steps)] if plots_ is not None]
    return env.get_template("attribution.html.j2").render(
        doc=document, rows=effect_rows(document), plots=figures, design_text=_design_text(document),
        sizes=document.injected_sizes,
        size_rows=size_rows(document.injected_sizes) if document.injected_sizes is not None else [],
        step_rows=step_rows(document.injected_sizes) if document.injected_sizes is not None else [],
        sizes_headline=sizes_headline(document.injected_sizes) if document.injected_sizes is not None else "")
