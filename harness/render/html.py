"""Render ``report.html`` for a run directory: jinja2 with autoescape on, figures embedded as data URIs.

The page is self-contained (no network, no JavaScript; a Content-Security-Policy meta tag forbids both) and is
re-buildable from the run directory alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import jinja2

from harness.rundir import schema
from harness.rundir.schema import VerdictDocument
from harness.rundir.store import RunDir, RunDirError
from harness.render import plots
from harness.render.metrics_table import DELTA_FORMULA, Summary, fmt_delta, fmt_value
from harness.rundir import store as records
from harness.render.view import build_context

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATE = "report.html.j2"


def _fmt_spread(summary: Summary) -> str:
    """``min–max`` of a summary over repeats (empty when there is at most one repeat)."""
    if summary.n <= 1 or summary.low is None or summary.high is None:
        return ""
    return f"{fmt_value(summary.low)}–{fmt_value(summary.high)}"


def _fmt_count(summary: Summary) -> str:
    if summary.value is None:
        return "—"
    text = f"{summary.value:g}"
    if summary.n > 1 and summary.low != summary.high:
        text += f" ({summary.low:g}–{summary.high:g})"
    return text


def _fmt_p(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "—"
    if not math.isfinite(number):
        return "—"
    return f"{number:.3g}" if number >= 1e-3 else f"{number:.1e}"


def environment() -> jinja2.Environment:
    """The jinja2 environment of the report: autoescape on for every template, undefined names are errors."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(value=fmt_value, delta=fmt_delta, spread=_fmt_spread, num=_fmt_count, pvalue=_fmt_p)
    return env


def render_html(context: Mapping[str, Any]) -> str:
    """Render the report page from a context built by :func:`harness.render.view.build_context`.

    Adds the figures (see :mod:`harness.render.plots`): the forest plot of the verdict, the speed plots, MTP acceptance
    per draft position and start-up per arm. Returns the HTML text.

    Raises:
        jinja2.TemplateError: the template is missing or refers to a name the context lacks (a bug, not bad data).
    """
    mtp, startup = context["sections"].get("mtp"), context.get("startup")
    figures = {
        "forest": plots.forest_plot(context["answer"]["rows"]),
        "speed": plots.make_plots(context["levels"]),
        "acceptance": plots.acceptance_plot(mtp["rows"] or [], records.finite_float(mtp["num_speculative_tokens"]))
        if isinstance(mtp, Mapping) else None,
        "startup": plots.startup_plot(startup["values"]) if startup else None,
    }
    return environment().get_template(TEMPLATE).render(**context, plots=figures, delta_formula=DELTA_FORMULA)


def stored_sections(run_dir: Path) -> dict[str, Any]:
    """Sections stored in the run dir by later stages: ``verdict.json`` (written by :mod:`harness.gate`).

    An unreadable verdict.json is reported in the section instead of failing the whole report."""
    store = RunDir(run_dir)
    try:
        document = store.read_document(schema.VERDICT, VerdictDocument, f"re-run `dsa-bench gate {run_dir}`")
    except (OSError, RunDirError) as error:
        return {"verdict": f"verdict.json is unreadable ({error})"}
    return {} if document is None else {"verdict": document.model_dump(mode="json")}


def render_report(run_dir: Path, sections: Mapping[str, Any] | None = None) -> Path:
    """Render ``run_dir/report.html`` from the run directory's stored files and return its path.

    Works on partial run directories (one arm, failed or missing levels, no CSVs yet). The file is written atomically
    (temp file + ``os.replace``). ``sections`` optionally fills the verdict/GSM8K/parity/MTP sections; see
    :func:`harness.render.view.build_context` for their shapes.

    Raises:
        harness.rundir.store.RunDirError: ``run_dir`` is not a run directory, or its manifest/CSVs are unreadable.
        OSError: ``run_dir`` is not writable.
    """
    run_dir = Path(run_dir)
    if sections is None:
        sections = stored_sections(run_dir)
    html = render_html(build_context(run_dir, sections))
    return RunDir(run_dir).write_text(schema.REPORT, html)
