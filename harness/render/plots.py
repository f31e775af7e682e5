"""Report figures: matplotlib (Agg canvas, no pyplot global state) rendered to base64 PNG ``data:`` URIs.

Each function takes the level views from :mod:`harness.render.view` and returns a :class:`Plot`, or ``None`` when no
level has data for it. Medians across repeats are plotted; when a level has more than one repeat the min–max spread
is drawn as error bars. No text from the run (model names, notes) is drawn into a figure.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from harness.render.metrics_table import ARMS, METRIC_BY_NAME, Summary
from harness.render.view import LevelView

ARM_COLORS = {"baseline": "#4c72b0", "candidate": "#dd8452"}
DELTA_METRICS = ("output_throughput", "mean_tpot_ms", "p99_tpot_ms", "mean_ttft_ms")
DELTA_COLORS = {"output_throughput": "#2a9d8f", "mean_tpot_ms": "#8e5ea2", "p99_tpot_ms": "#c44e52",
                "mean_ttft_ms": "#937860"}
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


def _figure() -> tuple[Figure, object]:
    figure = Figure(figsize=(7.2, 3.6), layout="constrained")
    axes = figure.add_subplot(1, 1, 1)
    axes.grid(True, which="major", alpha=0.3)
    return figure, axes


def _concurrency_axis(axes, levels: Sequence[int]) -> None:
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
    figure, axes = _figure()
    drawn = []
    for arm in ARMS:
        xs, points = _series(levels, arm, "output_throughput")
        if xs:
            _draw(axes, xs, points, marker="o", color=ARM_COLORS[arm], label=arm)
            drawn.extend(xs)
    if not drawn:
        return None
    _concurrency_axis(axes, sorted(set(drawn)))
    axes.set_ylabel("output throughput (tok/s)")
    axes.set_ylim(bottom=0)
    axes.legend(loc="best")
    axes.set_title("Output throughput vs concurrency (higher is better)")
    return Plot("throughput", "Output throughput vs concurrency",
                "Line chart: output throughput in tokens per second against concurrency, baseline and candidate.",
                "Output throughput = Σ output tokens (server-counted) / benchmark duration.", png_data_uri(figure))


def tpot_plot(levels: Sequence[LevelView]) -> Plot | None:
    """Mean (solid) and p99 (dashed) TPOT in ms vs concurrency, per arm; ``None`` when no arm has a value."""
    figure, axes = _figure()
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
    _concurrency_axis(axes, sorted(set(drawn)))
    axes.set_ylabel("TPOT (ms)")
    axes.set_ylim(bottom=0)
    axes.legend(loc="best", fontsize="small")
    axes.set_title("Mean and p99 TPOT vs concurrency (lower is better)")
    return Plot("tpot", "Mean and p99 TPOT vs concurrency",
                "Line chart: mean and p99 time per output token in milliseconds against concurrency, both arms.",
                "TPOT = (E2EL − TTFT) / (output_len − 1) per request, output_len counted by the server.",
                png_data_uri(figure))


def delta_plot(levels: Sequence[LevelView],
               intervals: Mapping[tuple[str, int], tuple[float, float]] | None = None) -> Plot | None:
    """Δ % (candidate vs baseline medians) vs concurrency for the headline metrics; ``None`` when no Δ exists.

    ``intervals`` maps ``(levels.csv column, concurrency)`` to a confidence interval ``(low %, high %)`` (from the
    verdict), drawn as error bars where given.
    """
    intervals = intervals or {}
    figure, axes = _figure()
    drawn: list[int] = []
    values: list[float] = []
    for column in DELTA_METRICS:
        metric = METRIC_BY_NAME[column]
        xs, ys, low, high = [], [], [], []
        for level in levels:
            row = next(r for r in level.rows if r.metric.name == column)
            if row.delta is None:
                continue
            xs.append(level.concurrency)
            ys.append(row.delta)
            lo, hi = intervals.get((column, level.concurrency), (row.delta, row.delta))
            low.append(max(row.delta - lo, 0.0))
            high.append(max(hi - row.delta, 0.0))
        if not xs:
            continue
        label = f"{metric.label} ({metric.better})"
        if any(low) or any(high):
            axes.errorbar(xs, ys, yerr=[low, high], capsize=3, marker="o", color=DELTA_COLORS[column], label=label)
        else:
            axes.plot(xs, ys, marker="o", color=DELTA_COLORS[column], label=label)
        drawn.extend(xs)
        values.extend(ys)
    if not drawn:
        return None
    # Axis from the points, not the bars: a wide interval (few repeats, noisy level) would flatten every line.
    pad = max(5.0, 0.5 * (max(values) - min(values)))
    axes.set_ylim(min(min(values), 0.0) - pad, max(max(values), 0.0) + pad)
    axes.axhline(0.0, color="black", linewidth=0.8)
    _concurrency_axis(axes, sorted(set(drawn)))
    axes.set_ylabel("Δ % (candidate vs baseline)")
    axes.legend(loc="best", fontsize="small")
    axes.set_title("Δ % vs concurrency")
    caption = "Δ % = (candidate − baseline) / baseline × 100 of the medians across repeats."
    if intervals:
        caption += (" Error bars: the verdict's confidence intervals; the axis follows the points, so a bar that runs"
                    " off it is cut (its bounds are in the verdict table).")
    return Plot("delta", "Δ % vs concurrency",
                "Line chart: percent change of candidate over baseline against concurrency for output throughput, "
                "mean TPOT, p99 TPOT and mean TTFT.", caption, png_data_uri(figure))


def make_plots(levels: Sequence[LevelView],
               intervals: Mapping[tuple[str, int], tuple[float, float]] | None = None) -> list[Plot]:
    """All report figures that have data, in page order (throughput, TPOT, Δ %)."""
    plots = [throughput_plot(levels), tpot_plot(levels), delta_plot(levels, intervals)]
    return [plot for plot in plots if plot is not None]
