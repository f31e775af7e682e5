"""Report figures: matplotlib (Agg canvas, no pyplot global state) rendered to base64 PNG ``data:`` URIs.

Each function takes plain rows (the level views of :mod:`harness.render.levels`, the forest rows of
:mod:`harness.render.answer`, the MTP rows of :mod:`harness.render.sections`, the manifest's start-up records) and
returns a :class:`Plot`, or ``None`` when there is no data for it. Per level, medians across rounds are plotted with
the min–max spread as error bars when a level has more than one round; the forest plot draws ``verdict.json``'s own
intervals. No text from the run (model names, notes) is drawn into a figure: labels come from the metric registry.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from harness.render.answer import ForestRow, row_text
from harness.render.metrics_table import ARMS, Summary
from harness.render.levels import LevelView

ARM_COLORS = {"baseline": "#4c72b0", "candidate": "#dd8452"}
STATUS_COLORS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "INCONCLUSIVE": "#9a6700", "INVALID": "#8250df", None: "#59636e"}
"""Forest-plot colours by cell result (None: a pooled hypothesis that was not rejected)."""
DPI = 110


@dataclass(frozen=True)
class Plot:
    """One embedded figure: ``uri`` is a ``data:image/png;base64,…`` URI; ``alt`` and ``caption`` are plain text."""

    key: str
    title: str
    alt: str
    caption: str
    uri: str


def png_data_uri(figure: Figure) -> str:
    """Render ``figure`` with the Agg canvas and return it as a ``data:image/png;base64,`` URI."""
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def new_figure(size: tuple[float, float] = (7.2, 3.6)) -> tuple[Figure, object]:
    """A matplotlib figure (inches, at :data:`DPI`) with one grid axes, not registered with pyplot."""
    figure = Figure(figsize=size, layout="constrained")
    axes = figure.add_subplot(1, 1, 1)
    axes.grid(True, which="major", alpha=0.3)
    return figure, axes


def concurrency_axis(axes, levels: Sequence[int]) -> None:
    """A log₂ concurrency x axis with one tick per level."""
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator(list(levels)))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_xticklabels([str(c) for c in levels])
    axes.set_xlabel("concurrency (max concurrent requests, log₂ scale)")
    if len(levels) == 1:
        axes.set_xlim(levels[0] / 1.5, levels[0] * 1.5)


def _series(levels: Sequence[LevelView], arm: str, column: str) -> tuple[list[int], list[Summary]]:
    xs, points = [], []
    for level in levels:
        for row in level.rows:
            if row.metric.name == column:
                summary = row.baseline if arm == "baseline" else row.candidate
                if summary.value is not None:
                    xs.append(level.concurrency)
                    points.append(summary)
    return xs, points


def _draw(axes, xs, points: Sequence[Summary], **style) -> None:
    ys = [p.value for p in points]
    if any(p.n > 1 for p in points):
        yerr = [[p.value - p.low for p in points], [p.high - p.value for p in points]]
        axes.errorbar(xs, ys, yerr=yerr, capsize=3, **style)
    else:
        axes.plot(xs, ys, **style)


def throughput_plot(levels: Sequence[LevelView]) -> Plot | None:
    """Output throughput (tok/s) vs concurrency, one line per arm; ``None`` when no arm has a value."""
    figure, axes = new_figure()
    drawn = []
    for arm in ARMS:
        xs, points = _series(levels, arm, "output_throughput")
        if xs:
            _draw(axes, xs, points, marker="o", color=ARM_COLORS[arm], label=arm)
            drawn.extend(xs)
    if not drawn:
        return None
    concurrency_axis(axes, sorted(set(drawn)))
    axes.set_ylabel("output throughput (tok/s)")
    axes.set_ylim(bottom=0)
    axes.legend(loc="best")
    axes.set_title("Output throughput vs concurrency (higher is better)")
    return Plot("throughput", "Output throughput vs concurrency",
                "Line chart: output throughput in tokens per second against concurrency, baseline and candidate.",
                "Output throughput = Σ output tokens (server-counted) / benchmark duration.", png_data_uri(figure))


def tpot_plot(levels: Sequence[LevelView]) -> Plot | None:
    """Mean (solid) and p99 (dashed) TPOT in ms vs concurrency, per arm; ``None`` when no arm has a value."""
    figure, axes = new_figure()
    drawn = []
    for arm in ARMS:
        for column, style, label in (("mean_tpot_ms", "-", "mean"), ("p99_tpot_ms", "--", "p99")):
            xs, points = _series(levels, arm, column)
            if xs:
                _draw(axes, xs, points, marker="o" if style == "-" else "s", linestyle=style,
                      color=ARM_COLORS[arm], label=f"{arm} {label} TPOT")
                drawn.extend(xs)
    if not drawn:
        return None
    concurrency_axis(axes, sorted(set(drawn)))
    axes.set_ylabel("TPOT (ms)")
    axes.set_ylim(bottom=0)
    axes.legend(loc="best", fontsize="small")
    axes.set_title("Mean and p99 TPOT vs concurrency (lower is better)")
    return Plot("tpot", "Mean and p99 TPOT vs concurrency",
                "Line chart: mean and p99 time per output token in milliseconds against concurrency, both arms.",
                "TPOT = (E2EL − TTFT) / (output_len − 1) per request, output_len counted by the server.",
                png_data_uri(figure))


def forest_plot(rows: Sequence[ForestRow]) -> Plot | None:
    """The forest plot of the verdict: one row per primary cell and pooled hypothesis (``verdict.json``'s
    ``delta`` with its interval ``[ci_low, ci_high]``), the margin as a dashed tick on each row, coloured by result.

    The x axis is Δ in % of baseline (accuracy rows: points) and follows the points and margins; an interval that
    runs off it ends in an arrow (its bounds are in the numbers table under the plot). ``None`` without rows."""
    if not rows:
        return None
    height = 0.9 + 0.34 * len(rows)
    figure, axes = new_figure((7.6, height))
    axes.grid(True, axis="x", alpha=0.3)
    axes.grid(False, axis="y")
    shown = [v for r in rows for v in (r.delta, r.margin) if v is not None]
    span = max(10.0, 1.6 * max(abs(v) for v in shown)) if shown else 10.0
    for y, row in enumerate(rows):
        color = STATUS_COLORS.get(row.status, STATUS_COLORS[None])
        if row.low is not None and row.high is not None:
            low, high = max(row.low, -span), min(row.high, span)
            axes.plot([low, high], [y, y], color=color, linewidth=2.2, solid_capstyle="butt")
            for end, bound, marker in ((low, row.low, "<"), (high, row.high, ">")):
                if bound != end:
                    axes.plot([end], [y], marker=marker, color=color, markersize=6)
        if row.delta is not None:
            x = max(min(row.delta, span), -span)
            axes.plot([x], [y], marker="D" if row.pooled else "o", color=color, markersize=6)
            if row.gap:                     # no interval: say why beside the point ("not enough sessions (2 of 4)")
                axes.text(x, y - 0.22, row.gap, color=color, fontsize=7, va="bottom", ha="center")
        else:
            axes.text(0, y, "no estimate", color=color, fontsize=8, va="center", ha="center")
        axes.plot([row.margin, row.margin], [y - 0.38, y + 0.38], color="#cf222e", linestyle="--", linewidth=1.2)
    axes.axvline(0.0, color="black", linewidth=0.8)
    axes.set_xlim(-span, span)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels([f"{r.label} {r.where} [{r.status or 'not rejected'}]" for r in rows], fontsize=8)
    axes.set_xlabel("Δ % vs baseline (GSM8K: points); dashed red: margin")
    return Plot("forest", "Forest plot of the verdict",
                "Forest plot, one row per primary cell: " + "; ".join(row_text(r) + f", {r.status or 'not rejected'}"
                                                                    for r in rows) + ".",
                "Dot: Δ (diamond: pooled over levels); bar: the verdict's interval at the level it was tested; dashed "
                "red: the margin. Green PASS, red FAIL, amber INCONCLUSIVE, purple INVALID.", png_data_uri(figure))


def pareto_plot(levels: Sequence[LevelView]) -> Plot | None:
    """Output throughput (tok/s, y) against per-user speed 1000 / mean TPOT (tok/s per request, x), one point per
    level and arm, both arms overlaid, min–max across rounds as error bars on both axes: the view ``vllm bench sweep
    plot_pareto`` draws for one arm (``vllm/benchmarks/sweep/plot_pareto.py``). ``None`` without both figures."""
    figure, axes = new_figure()
    drawn = False
    for arm in ARMS:
        xs, ys, xerr, yerr, labels = [], [], [[], []], [[], []], []
        for level in levels:
            rows = {row.metric.name: row for row in level.rows}
            if "output_throughput" not in rows or "mean_tpot_ms" not in rows:
                continue
            tput = rows["output_throughput"].baseline if arm == "baseline" else rows["output_throughput"].candidate
            tpot = rows["mean_tpot_ms"].baseline if arm == "baseline" else rows["mean_tpot_ms"].candidate
            if tput.value is None or not tpot.value:
                continue
            speed = 1000.0 / tpot.value
            xs.append(speed)
            ys.append(tput.value)
            slow, fast = (1000.0 / tpot.high, 1000.0 / tpot.low) if tpot.n > 1 and tpot.low else (speed, speed)
            xerr[0].append(speed - slow), xerr[1].append(fast - speed)
            yerr[0].append(tput.value - (tput.low if tput.n > 1 else tput.value))
            yerr[1].append((tput.high if tput.n > 1 else tput.value) - tput.value)
            labels.append(level.concurrency)
        if not xs:
            continue
        drawn = True
        axes.errorbar(xs, ys, xerr=xerr, yerr=yerr, marker="o", capsize=3, color=ARM_COLORS[arm], label=arm)
        for x, y, c in zip(xs, ys, labels):
            axes.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8,
                          color=ARM_COLORS[arm])
    if not drawn:
        return None
    axes.set_xlabel("per-user speed: 1000 / mean TPOT (tok/s per request)")
    axes.set_ylabel("output throughput (tok/s)")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.legend(loc="best")
    axes.set_title("Throughput vs per-user speed (up and right is better)")
    return Plot("pareto", "Throughput vs per-user speed",
                "Scatter: output throughput against per-user speed (1000 / mean TPOT) per concurrency level, "
                "baseline and candidate overlaid.",
                "One point per level (medians across rounds; bars: min–max); vllm bench sweep plot_pareto's view, "
                "both arms on one chart.", png_data_uri(figure))


def acceptance_plot(rows: Sequence[Mapping[str, Any]], k: float | None = None) -> Plot | None:
    """MTP acceptance per draft position per arm (grouped bars, %), pooled over levels weighted by drafts; the
    rows are :func:`harness.render.sections.mtp_section`'s (``per_position`` in %, ``drafts``). ``k``, the
    speculative tokens per draft, fixes the positions shown. ``None`` without per-position data."""
    pooled: dict[str, list[float]] = {}
    for arm in ARMS:
        weighted, total = [], 0.0
        for row in rows:
            if row.get("arm") != arm or not row.get("per_position") or not row.get("drafts"):
                continue
            total += row["drafts"]
            for i, value in enumerate(row["per_position"]):
                if i == len(weighted):
                    weighted.append(0.0)
                weighted[i] += value * row["drafts"]
        if total:
            pooled[arm] = [w / total for w in weighted]
    if not pooled:
        return None
    positions = int(k) if k else max(len(v) for v in pooled.values())
    figure, axes = new_figure()
    width = 0.8 / len(pooled)
    for i, (arm, values) in enumerate(pooled.items()):
        xs = [p + 1 + (i - (len(pooled) - 1) / 2) * width for p in range(min(positions, len(values)))]
        axes.bar(xs, values[:len(xs)], width=width, color=ARM_COLORS[arm], label=arm)
    axes.set_xticks(range(1, positions + 1))
    axes.set_xlabel("draft position")
    axes.set_ylabel("accepted at this position (% of drafts)")
    axes.set_ylim(0, 100)
    axes.legend(loc="best")
    axes.set_title("MTP acceptance per draft position (higher is better)")
    return Plot("acceptance", "MTP acceptance per draft position",
                "Bar chart: share of drafts whose token at each draft position was accepted, per arm.",
                "Per position i: accepted at position i / drafts, over all measured levels (vllm:spec_decode_* "
                "counters).", png_data_uri(figure))


STARTUP_PARTS = (("ready_s", "ready"), ("model_load_s", "model load"), ("compile_s", "compile"),
                 ("graph_capture_s", "graph capture"), ("engine_init_s", "engine init"))
"""The start-up figures drawn per arm (``StartupRecord`` fields, seconds)."""


def startup_plot(values: Mapping[str, Mapping[str, Sequence[float]]]) -> Plot | None:
    """Start-up seconds per arm: median over the arm's server sessions with min–max bars, for each of
    :data:`STARTUP_PARTS`. ``values``: ``{arm: {field: [seconds per session]}}``. ``None`` without values."""
    import statistics

    parts = [(field, label) for field, label in STARTUP_PARTS if any(values.get(a, {}).get(field) for a in values)]
    if not parts:
        return None
    figure, axes = new_figure((7.2, 1.2 + 0.5 * len(parts)))
    height = 0.8 / max(len(values), 1)
    for i, (arm, fields) in enumerate(values.items()):
        ys, medians, err = [], [], [[], []]
        for j, (field, _) in enumerate(parts):
            series = list(fields.get(field) or [])
            if not series:
                continue
            median = statistics.median(series)
            ys.append(j + (i - (len(values) - 1) / 2) * height)
            medians.append(median)
            err[0].append(median - min(series)), err[1].append(max(series) - median)
        axes.barh(ys, medians, height=height, xerr=err, capsize=3, color=ARM_COLORS.get(arm, "#59636e"), label=arm)
    axes.set_yticks(range(len(parts)))
    axes.set_yticklabels([label for _, label in parts])
    axes.set_ylim(len(parts) - 0.5, -0.5)
    axes.set_xlabel("seconds (median over server sessions; bars: min–max)")
    axes.legend(loc="best")
    axes.set_title("Start-up per arm (shorter is better)")
    return Plot("startup", "Start-up per arm",
                "Horizontal bar chart: seconds to ready, model load, compile and engine init per arm.",
                "From each server session's log lines and the readiness probe (spawn → first completion).",
                png_data_uri(figure))


def make_plots(levels: Sequence[LevelView]) -> list[Plot]:
    """The speed figures that have data, in page order (throughput, TPOT, throughput vs per-user speed); with more
    than one regime, each figure once per regime (its levels alone: one x axis is one input and output length),
    titled with the regime."""
    regimes = sorted({level.level.regime for level in levels})
    plots = []
    for regime in regimes:
        mine = [level for level in levels if level.level.regime == regime]
        for plot in (throughput_plot(mine), tpot_plot(mine), pareto_plot(mine)):
            if plot is not None and len(regimes) > 1:
                plot = replace(plot, key=f"{plot.key}-{regime}", title=f"{plot.title} · tokens {regime.label()}")
            if plot is not None:
                plots.append(plot)
    return plots
