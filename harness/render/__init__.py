"""The HTML report of a run directory: ``render_report(run_dir)`` writes ``run_dir/report.html``.

Reads only the run directory (through :mod:`harness.rundir.store`); never imports the server, load or runner modules, so a
report is reproducible from stored results alone.
"""

from harness.render.html import render_report

__all__ = ["render_report"]
