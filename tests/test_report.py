"""HTML report: rendering from a crafted run dir, escaping, partial runs, optional sections, and a real browser load."""

from __future__ import annotations

import base64
import csv
import json
import math
import os
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.rundir import schema
from harness.rundir import store as records
from harness.render import render_report
from harness.render.html import render_html
from harness.metrics import OPTIONAL_COLUMNS
from harness.render.metrics_table import METRICS, delta_class, delta_pct, fmt_delta, fmt_value, summarize
from harness.render.view import build_context

FIXTURE = Path(__file__).parent / "fixtures" / "run_dir"
LEVELS = (1, 2, 4, 8)
XSS = "<script>alert(1)</script>"


# ----------------------------------------------------------------------------------------------- helpers
class _Page(HTMLParser):
    """Collects what the tests look at: level-table cells, images, tags, and text per element id."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.images: list[dict[str, str]] = []
        self.level_tables: set[int] = set()
        # (concurrency, metric column, "baseline" | "candidate" | "delta") → cell text
        self.cells: dict[tuple[int, str, str], str] = {}
        self.ids: set[str] = set()
        self._table: int | None = None
        self._metric: str | None = None
        self._cell: tuple[int, str, str] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        self.tags.append(tag)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "img":
            self.images.append(attrs)
        if tag == "table" and "level-table" in attrs.get("class", ""):
            self._table = int(attrs["data-concurrency"])
            self.level_tables.add(self._table)
        if tag == "tr" and self._table is not None:
            self._metric = attrs.get("data-metric")
        if tag == "td" and self._table is not None and self._metric:
            column = attrs.get("data-arm") or ("delta" if "data-delta" in attrs else None)
            if column:
                self._cell, self._text = (self._table, self._metric, column), []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell:
            self.cells[self._cell] = " ".join(" ".join(self._text).split())
            self._cell = None
        if tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell:
            self._text.append(data)


def parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def png_size(uri: str) -> tuple[int, int]:
    """Width and height from the IHDR chunk of a PNG data URI (asserts it is a PNG)."""
    prefix = "data:image/png;base64,"
    assert uri.startswith(prefix)
    data = base64.b64decode(uri[len(prefix):], validate=True)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def level_values() -> dict[tuple[str, int], dict[str, str]]:
    with open(FIXTURE / schema.LEVELS, newline="", encoding="utf-8") as handle:
        return {(row["arm"], int(row["concurrency"])): row for row in csv.DictReader(handle)}


def edit_manifest(run_dir: Path, change) -> None:
    path = run_dir / schema.MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    change(manifest)
    path.write_text(json.dumps(manifest), encoding="utf-8")


def keep_rows(run_dir: Path, name: str, keep) -> None:
    path = run_dir / name
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames, [row for row in reader if keep(row)]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(FIXTURE, target)
    return target


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[Path, str]:
    target = tmp_path_factory.mktemp("rendered") / "run"
    shutil.copytree(FIXTURE, target)
    path = render_report(target)
    return path, path.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------- pure parts
def test_delta_and_formatting():
    assert delta_pct(100.0, 110.0) == pytest.approx(10.0)
    assert delta_pct(0.0, 5.0) is None and delta_pct(None, 1.0) is None and delta_pct(1.0, math.nan) is None
    throughput, tpot = METRICS[0], next(m for m in METRICS if m.name == "mean_tpot_ms")
    assert throughput.higher_is_better and not tpot.higher_is_better
    assert delta_class(throughput, 5.0) == "better" and delta_class(tpot, 5.0) == "worse"
    assert delta_class(tpot, -5.0) == "better" and delta_class(tpot, 0.01) == "" and delta_class(tpot, None) == ""
    assert fmt_delta(-13.24) == "-13.2 %" and fmt_delta(None) == "—"
    assert fmt_value(1234.567) == "1,234.57" and fmt_value(0.12) == "0.120" and fmt_value(math.nan) == "—"
    assert summarize([3.0, math.nan, 1.0, 2.0]) == summarize([1.0, 2.0, 3.0])
    assert summarize([3.0, 1.0, 2.0]).value == 2.0 and summarize([]).value is None


# ----------------------------------------------------------------------------------------------- rendering
def test_render_writes_report_atomically_and_returns_path(rendered):
    path, html = rendered
    assert path.name == schema.REPORT and path.is_file()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".report.html.")]  # no temp file left
    assert html.startswith("<!DOCTYPE html>")


def test_level_tables_hold_the_fixture_numbers_and_deltas(rendered):
    _, html = rendered
    page = parse(html)
    assert page.level_tables == set(LEVELS)
    values = level_values()
    client = [m for m in METRICS if m.name not in OPTIONAL_COLUMNS]
    # the fixture predates the /metrics captures: no empty server rows
    assert not [key for key in page.cells if key[1] in OPTIONAL_COLUMNS]
    for concurrency in LEVELS:
        for metric in client:
            base = float(values[("baseline", concurrency)][metric.name])
            cand = float(values[("candidate", concurrency)][metric.name])
            assert page.cells[(concurrency, metric.name, "baseline")] == fmt_value(base)
            assert page.cells[(concurrency, metric.name, "candidate")] == fmt_value(cand)
            expected = f"{(cand - base) / base * 100:+.1f} %"
            assert page.cells[(concurrency, metric.name, "delta")] == expected, (concurrency, metric.name)
    # Literal spot checks against levels.csv, so a shared formatting bug cannot hide.
    assert page.cells[(1, "output_throughput", "baseline")] == "99.41"
    assert page.cells[(1, "output_throughput", "candidate")] == "86.29"
    assert page.cells[(1, "output_throughput", "delta")] == "-13.2 %"
    assert page.cells[(8, "mean_tpot_ms", "delta")] == "+8.3 %"


def test_page_has_context_formulas_and_no_external_resources(rendered):
    _, html = rendered
    page = parse(html)
    for needle in ("cpu-tiny", "DeepseekV3ForCausalLM", "0.32.0+cpu", "f47d303c8a1e", "VLLM_USE_V2_MODEL_RUNNER",
                   "vllm bench serve", "--compilation-config", "not available on this platform".capitalize(),
                   "TPOT = (E2EL − TTFT) / (output_len − 1)", "Δ % = (candidate − baseline) / baseline × 100",
                   "Harness share", "5.2 %", "Server disconnected without sending a response."):
        assert needle in html, needle
    assert {"answer", "forest", "next-step", "compared", "summary", "plots", "levels", "gsm8k", "parity", "mtp", "arms", "run",
            "definitions", "arm-differences"} <= page.ids
    assert html.count("Not measured in this run") == 3  # GSM8K, parity, MTP
    assert "No forest plot: no verdict.json yet." in html
    assert not {"script", "link", "iframe", "object", "embed"} & set(page.tags)
    assert all(img["src"].startswith("data:image/png;base64,") for img in page.images)
    assert "Content-Security-Policy" in html


def test_plots_are_embedded_pngs(rendered):
    _, html = rendered
    images = parse(html).images
    assert len(images) == 3
    for img in images:
        width, height = png_size(img["src"])
        assert width > 300 and height > 150
        assert img["alt"]


def test_strings_from_the_run_are_escaped(run_dir):
    def poison(manifest):
        manifest["scenario_name"] = XSS
        manifest["scenario"]["model"]["id"] = XSS
        manifest["notes"].append(f"note {XSS}")
        manifest["arms"]["candidate"]["server_env"]["EVIL"] = XSS
        manifest["arms"]["candidate"]["server_command"].append(XSS)
        manifest["arms"]["candidate"]["decision"]["reasons"].append(XSS)
        manifest["arms"]["candidate"]["attestation"] = {"valid": False, "mismatches": [XSS]}
        manifest["arms"]["baseline"]["levels"]["c4-r0"]["status"] = f"failed: {XSS}"
    edit_manifest(run_dir, poison)
    requests = (run_dir / schema.REQUESTS).read_text(encoding="utf-8")
    (run_dir / schema.REQUESTS).write_text(requests.replace("Server disconnected without sending a response.",
                                                             '"<script>alert(1)</script>"'), encoding="utf-8")
    html = render_report(run_dir).read_text(encoding="utf-8")
    assert XSS not in html
    assert "<script" not in html.lower()
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 8
    assert "INVALID" in html


def test_partial_run_with_only_baseline_renders(run_dir):
    def interrupt(manifest):
        manifest["status"] = "interrupted"
        manifest["ended_at"] = None
        manifest["timing"] = {}
        for key in manifest["arms"]["candidate"]["levels"]:
            manifest["arms"]["candidate"]["levels"][key] = {"status": "skipped: run stopped before this level"}
    edit_manifest(run_dir, interrupt)
    for name in (schema.LEVELS, schema.REQUESTS):
        keep_rows(run_dir, name, lambda row: row["arm"] == "baseline")
    html = render_report(run_dir).read_text(encoding="utf-8")
    page = parse(html)
    assert page.level_tables == set(LEVELS)
    assert page.cells[(2, "output_throughput", "baseline")] == "152.18"
    assert page.cells[(2, "output_throughput", "candidate")] == "—"
    assert page.cells[(2, "output_throughput", "delta")] == "—"
    assert "run status interrupted" in html
    # one reason, stated once, with the levels it applies to
    assert html.count(">skipped: run stopped before this level<") == 1     # the grouped reason; badges say "skipped"
    assert html.count("<code>skipped: run stopped before this level</code>") == 1
    assert "candidate c=1 r0, c=2 r0, c=4 r0, c=8 r0" in html
    assert len(page.images) == 3  # throughput, TPOT and throughput vs per-user speed, baseline only


def test_candidate_absent_from_manifest_and_no_csvs(run_dir):
    def strip(manifest):
        manifest["status"] = "running"
        del manifest["arms"]["candidate"]
        for key in manifest["arms"]["baseline"]["levels"]:
            manifest["arms"]["baseline"]["levels"][key] = {"status": "pending"}
    edit_manifest(run_dir, strip)
    (run_dir / schema.LEVELS).unlink()
    (run_dir / schema.REQUESTS).unlink()
    html = render_report(run_dir).read_text(encoding="utf-8")
    page = parse(html)
    assert page.level_tables == set(LEVELS)  # declared levels stay visible
    assert page.images == [] and "No plot: no level has results yet." in html
    assert "not started" in html and "pending" in html


def test_failed_level_stays_visible(run_dir):
    edit_manifest(run_dir, lambda m: m["arms"]["baseline"]["levels"]["c8-r0"].update(status="failed: server died"))
    keep_rows(run_dir, schema.LEVELS, lambda row: not (row["arm"] == "baseline" and row["concurrency"] == "8"))
    html = render_report(run_dir).read_text(encoding="utf-8")
    page = parse(html)
    assert 8 in page.level_tables
    assert page.cells[(8, "output_throughput", "baseline")] == "—"
    assert page.cells[(8, "output_throughput", "candidate")] == "227.00"
    assert '<span class="status failed" title="failed: server died">failed</span>' in html
    assert "<code>failed: server died</code> — 1 level(s): baseline c=8 r0" in html


def test_repeats_show_median_and_spread(run_dir):
    with open(run_dir / schema.LEVELS, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames, list(reader)
    extra = []
    for repeat, scale in ((1, 1.10), (2, 0.95)):
        for row in rows:
            copy = dict(row, repeat=str(repeat))
            copy["output_throughput"] = str(float(row["output_throughput"]) * scale)
            extra.append(copy)
    with open(run_dir / schema.LEVELS, "a", newline="", encoding="utf-8") as handle:
        csv.DictWriter(handle, fieldnames=fields, lineterminator="\n").writerows(extra)
    page = parse(render_report(run_dir).read_text(encoding="utf-8"))
    base = float(level_values()[("baseline", 1)]["output_throughput"])
    # median of (x, 1.10 x, 0.95 x) is x; spread min–max is 0.95 x – 1.10 x
    assert page.cells[(1, "output_throughput", "baseline")] == (
        f"{fmt_value(base)} {fmt_value(base * 0.95)}–{fmt_value(base * 1.10)}")


def test_optional_sections_slot_in(run_dir):
    sections = {
        "verdict": {"overall": "PASS", "policy": "default", "cells": [
            {"concurrency": 1, "metric": "output_throughput", "delta_pct": -13.2, "ci_low_pct": -15.0,
             "ci_high_pct": -11.0, "margin_pct": -3.0, "result": "FAIL", "note": XSS}]},
        "gsm8k": {"arms": [{"arm": "baseline", "filter": "flexible-extract", "accuracy_pct": 94.8, "stderr_pct": 0.6,
                            "n": 1319}],
                  "paired": [{"filter": "flexible-extract", "difference_pts": -0.2, "baseline_only": 7,
                              "candidate_only": 4, "p_value": 0.55}], "reference": "94.768 % (GLM-5.2 NVFP4)"},
        "parity": {"exact_match_rate_pct": 93.75, "prompts_total": 16, "tolerance": 0.01, "divergences": [
            {"prompt_index": 3, "prompt": XSS, "position": 17, "max_logprob_diff": 0.002, "margin": 0.0004,
             "near_tie": True}]},
        "mtp": "no speculative decoding in this scenario",
    }
    html = render_html(build_context(run_dir, sections))
    page = parse(html)
    assert {"verdict-cells", "gsm8k-arms", "gsm8k-paired", "parity-divergences"} <= page.ids
    assert "mtp-table" not in page.ids
    assert "Not measured in this run: no speculative decoding in this scenario." in html
    assert "94.768 % (GLM-5.2 NVFP4)" in html and "near-tie" in html and 'id="verdict-words"' in html
    assert XSS not in html
    assert 'id="plot-forest"' not in html and 'id="forest"' in html and 'data-result="FAIL"' in html
    # Producers may leave optional fields out: minimal dicts still render.
    minimal = {"verdict": {"overall": "INCONCLUSIVE"}, "gsm8k": {"arms": []}, "parity": {"exact_match_rate_pct": 100},
               "mtp": {"rows": [{"concurrency": 1, "arm": "candidate", "acceptance_rate_pct": "n/a"}]}}
    html = render_html(build_context(run_dir, minimal))
    assert "INCONCLUSIVE: the data can neither pass nor fail" in html and "mtp-table" in parse(html).ids
    assert "Not measured in this run" not in html
    with pytest.raises(ValueError, match="unknown report sections"):
        build_context(run_dir, {"bogus": 1})


def test_not_a_run_dir_raises(tmp_path):
    with pytest.raises(records.RunDirError, match="manifest.json: missing"):
        render_report(tmp_path)
    (tmp_path / schema.MANIFEST).write_text("{not json", encoding="utf-8")
    with pytest.raises(records.RunDirError, match="not valid JSON"):
        render_report(tmp_path)


# ----------------------------------------------------------------------------------------------- browser
def _chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


_PROBE = """<script>
window.addEventListener('load', function () {
  var out = document.createElement('pre');
  out.id = 'probe';
  var imgs = Array.prototype.map.call(document.images, function (i) {
    return {complete: i.complete, w: i.naturalWidth, h: i.naturalHeight, shown: i.getBoundingClientRect().width};
  });
  out.textContent = JSON.stringify({tables: document.querySelectorAll('table.level-table').length,
                                    rows: document.querySelectorAll('table.level-table tr[data-metric]').length,
                                    images: imgs, title: document.title});
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary on PATH (CI installs it: apt-get install chromium)")
def test_headless_chromium_loads_page_tables_and_decoded_images(rendered, tmp_path):
    """Chromium parses the page and decodes every embedded PNG.

    The report has no JavaScript (its CSP forbids scripts), so the test loads a copy with the CSP removed and a probe
    script appended that writes table counts and each image's naturalWidth into the DOM, then dumps the DOM.
    """
    path, html = rendered
    probe_page = tmp_path / "probe.html"
    stripped = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
    probe_page.write_text(stripped.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    base = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
            f"--user-data-dir={tmp_path / 'profile'}"]
    result = subprocess.run(base + ["--virtual-time-budget=5000", "--dump-dom", probe_page.as_uri()],
                            capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert match, f"probe missing from the dumped DOM (rc {result.returncode}): {result.stderr[-2000:]}"
    probe = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert probe["tables"] == len(LEVELS)
    assert probe["rows"] == len(LEVELS) * len([m for m in METRICS if m.name not in OPTIONAL_COLUMNS])   # no /metrics data
    assert probe["title"].startswith("dsa-bench report")
    assert len(probe["images"]) == 3
    for image in probe["images"]:
        assert image["complete"] and image["w"] > 300 and image["h"] > 150 and image["shown"] > 0, image

    # The real page (CSP on, no probe) renders to a non-blank screenshot.
    shot = tmp_path / "shot.png"
    subprocess.run(base + ["--hide-scrollbars", "--window-size=1280,2400", f"--screenshot={shot}", path.as_uri()],
                   capture_output=True, text=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 50_000
    assert png_size("data:image/png;base64," + base64.b64encode(shot.read_bytes()).decode()) == (1280, 2400)


def test_an_injected_arm_says_so(run_dir):
    html = render_report(run_dir).read_text(encoding="utf-8")
    assert "injected:" not in html
    edit_manifest(run_dir, lambda m: m["arms"]["candidate"].update(
        injection={"kind": "step-delay", "params": {"ms": 50.0}}))
    html = render_report(run_dir).read_text(encoding="utf-8")
    assert html.count("injected: step-delay ms=50") == 2  # the arms table and the arm's section


POOLED_FAIL = {"metric": "output_throughput", "label": "Output throughput", "concurrency": None, "primary": True,
               "result": "FAIL", "delta": -25.1, "ci_low": -31.0, "ci_high": -18.7, "delta_pct": -25.1,
               "ci_low_pct": -31.0, "ci_high_pct": -18.7, "margin": -3.0, "margin_pct": -3.0, "pooled": True,
               "notes": ["pooled over c=1, 2: geometric mean of the per-level ratios"], "note": ""}
POOLED_OPEN = {**POOLED_FAIL, "metric": "mean_tpot_ms", "label": "Mean TPOT", "result": None, "delta": 1.0,
               "delta_pct": 1.0, "ci_low": -2.0, "ci_high": 4.0, "ci_low_pct": -2.0, "ci_high_pct": 4.0, "margin": 3.0,
               "margin_pct": 3.0}


def test_pooled_hypotheses_are_shown_in_the_report_and_the_pr_summary(run_dir):
    from harness.render import summary
    from harness.render.output import VerdictView
    from harness.rundir.schema import VerdictDocument

    verdict = {"overall": "FAIL", "policy": "default", "cells": [], "pooled": [POOLED_FAIL, POOLED_OPEN]}
    html = render_html(build_context(run_dir, {"verdict": verdict}))
    assert html.count('data-pooled="true"') == 2
    assert "-25.10 %" in html and "not rejected" in html and "pooled over c=1, 2" in html
    document = VerdictDocument.model_validate({"run_id": "r", "overall": "FAIL", "exit_code": 1, "reason": "x",
                                               "pooled": [POOLED_FAIL, POOLED_OPEN]})
    text = summary.render(VerdictView(document, None, None, run_dir))
    assert "Pooled over each regime's levels" in text
    assert "Output throughput -25.1 % [-31.0, -18.7] (margin -3 %) ❌ FAIL" in text
    assert "Mean TPOT +1.0 % [-2.0, +4.0] (margin +3 %) not rejected" in text
