"""The reviewer's first screen in a real browser (issue #25): for the default, a FAILed, an INVALID and an imported
run (built from committed recordings by ``tests/report_runs.py``, no server started), headless Chromium at 1400 px
wide must show the verdict, the forest plot and the next step inside the first 1000 px; the page with every
``<details>`` collapsed is at most 8,000 px tall; no sentence appears more than twice; every ``<img>`` has alt text.
And the forest plot's numbers are ``verdict.json``'s cells."""

from __future__ import annotations

import html as htmllib
import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from report_runs import KINDS, build
from test_report import _chromium

WIDTH, FIRST_SCREEN, MAX_COLLAPSED = 1400, 1000, 8000

# Appended to a copy of the page without its CSP (the report itself runs no script): the bottom edge of the answer's
# parts, the collapsed page's height, and each image's alt, written into the DOM for --dump-dom.
_PROBE = """<script>
window.addEventListener('load', function () {
  function bottom(id) { var e = document.getElementById(id); return e ? e.getBoundingClientRect().bottom : null; }
  var out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({
    verdict: bottom('verdict-words'), forest: bottom('forest'), next: bottom('next-step'),
    height: document.documentElement.scrollHeight,
    open: document.querySelectorAll('details[open]').length,
    images: Array.prototype.map.call(document.images, function (i) { return i.getAttribute('alt'); }),
    text: document.body.innerText});
  document.body.appendChild(out);
});
</script>"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reports")
    return {kind: build(kind, root / kind) for kind in KINDS}


def _probe(report: Path, profile: Path) -> dict:
    page = report.with_name("probe.html")
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", report.read_text(encoding="utf-8"))
    page.write_text(text.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", f"--window-size={WIDTH},{FIRST_SCREEN}", "--hide-scrollbars",
               "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert match, f"probe missing from the dumped DOM (rc {result.returncode}): {result.stderr[-2000:]}"
    return json.loads(htmllib.unescape(match.group(1)))


def _sentences(text: str) -> list[str]:
    """Sentences of the visible text: split at . ! ? or a line end; short fragments (labels, numbers) left out."""
    parts = re.split(r"(?<=[.!?])\s+|\n", text)
    return [p.strip() for p in parts if len(p.strip()) >= 40]


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary on PATH (CI installs it: apt-get install chromium)")
@pytest.mark.parametrize("kind", KINDS)
def test_first_screen_holds_the_answer_and_the_rest_is_collapsed(runs, kind, tmp_path):
    probe = _probe(runs[kind] / "report.html", tmp_path / "profile")
    verdict = json.loads((runs[kind] / "verdict.json").read_text(encoding="utf-8"))
    assert probe["open"] == 0
    for part in ("verdict", "forest", "next"):
        assert probe[part] is not None and 0 < probe[part] <= FIRST_SCREEN, (kind, part, probe[part])
    assert probe["height"] <= MAX_COLLAPSED, (kind, probe["height"])
    assert probe["images"] and all(alt and alt.strip() for alt in probe["images"]), probe["images"]
    counts: dict[str, int] = {}
    for sentence in _sentences(probe["text"]):
        counts[sentence] = counts.get(sentence, 0) + 1
    assert not {s: n for s, n in counts.items() if n > 2}, kind
    assert verdict["overall"] in probe["text"]


def _cells(verdict: dict) -> dict[tuple[str, str], tuple]:
    rows = {}
    for cell in [*verdict["cells"], *(verdict.get("pooled") or [])]:
        where = "pooled" if cell.get("pooled") else ("GSM8K" if cell.get("concurrency") is None
                                                     else f"c={cell['concurrency']}")
        rows[(cell["metric"], where)] = (cell.get("delta"), cell.get("ci_low"), cell.get("ci_high"),
                                         cell.get("margin"), cell.get("result") or "")
    return rows


def _number(text: str) -> float | None:
    return float(text) if text not in ("", "None") else None


@pytest.mark.parametrize("kind", ("fail", "invalid"))
def test_forest_plot_numbers_are_verdict_json_cells(runs, kind):
    verdict = json.loads((runs[kind] / "verdict.json").read_text(encoding="utf-8"))
    page = (runs[kind] / "report.html").read_text(encoding="utf-8")
    shown = {}
    for row in re.finditer(r'<tr class="forest-row"([^>]*)>', page):
        attrs = dict(re.findall(r'data-([a-z]+)="([^"]*)"', row.group(1)))
        shown[(htmllib.unescape(attrs["metric"]), attrs["where"])] = (
            _number(attrs["delta"]), _number(attrs["low"]), _number(attrs["high"]), _number(attrs["margin"]),
            attrs["result"])
    expected = _cells(verdict)
    assert set(shown) == set(expected) and shown
    for key, values in expected.items():
        for got, want in zip(shown[key], values):
            if isinstance(want, float) or isinstance(got, float):
                assert got is not None and want is not None and math.isclose(got, want, rel_tol=1e-12), key
            else:
                assert got == want or (want is None and got is None), key
    alt = re.search(r'<figure id="forest">\s*<img [^>]*alt="([^"]*)"', page).group(1)
    assert len(re.findall(r"c=\d|pooled|GSM8K", htmllib.unescape(alt))) >= len(expected)


@pytest.mark.parametrize("kind", KINDS)
def test_summary_md_is_a_pr_comment_of_at_most_60_lines_with_the_verdict_and_next_step(runs, kind):
    summary = (runs[kind] / "summary.md").read_text(encoding="utf-8")
    verdict = json.loads((runs[kind] / "verdict.json").read_text(encoding="utf-8"))
    lines = summary.splitlines()
    assert len(lines) <= 60, (kind, len(lines))
    assert f"**{verdict['overall']}**" in lines[0]
    assert any(line.startswith("> ") for line in lines[:8]), "the reason sits right under the verdict"
    page = (runs[kind] / "report.html").read_text(encoding="utf-8")
    shown = re.search(r'<p id="next-step">(.*?)</p>', page, re.S).group(1)
    step = next(line for line in lines if line.startswith("Next: "))
    assert htmllib.unescape(shown) == step, "summary.md and the report's first screen give the same next step"
