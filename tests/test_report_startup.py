"""report.html's start-up table per arm (harness.render.startup) from the manifest's per-session start-up records."""

import shutil
from pathlib import Path

from harness.render import render_report
from harness.render.html import environment
from harness.render.startup import startup_section
from harness.rundir.schema import Manifest

FIXTURE = Path(__file__).parent / "fixtures" / "run_dir"


def _manifest(platform: str, startups: dict[str, list[dict]]) -> Manifest:
    modes = {"baseline": "VLLM_COMPILE", "candidate": "NONE"}
    return Manifest.model_validate({"run_id": "r", "platform": {"name": platform}, "arms": [
        {"name": name, "route": name, "intended": {"compilation_mode": modes[name]},
         "sessions": [{"index": i, "startup": s} for i, s in enumerate(startups.get(name, []))]}
        for name in modes]})


STARTUPS = {
    "baseline": [{"ready_s": 120.0, "compile_s": 82.0, "kv_cache_tokens": 233008, "peak_rss_gib": 3.5},
                 {"ready_s": 130.0, "compile_s": 90.0, "kv_cache_tokens": 233008, "peak_rss_gib": 3.7}],
    "candidate": [{"ready_s": 40.0, "compile_s": None, "kv_cache_tokens": 233008, "peak_rss_gib": 2.9}],
}


def test_startup_table_per_arm_with_sessions_interval_kv_capacity_peak_memory_and_the_cpu_note():
    html = environment().get_template("startup.html.j2").render(startup=startup_section(_manifest("cpu", STARTUPS)),
                                                                       plots={"startup": None})
    assert "<th>baseline</th><th>candidate</th>" in html
    assert "125 (120–130, n=2)" in html and "<td>40</td>" in html
    assert "86 (82–90, n=2)" in html and "<td>—</td>" in html      # the eager arm has no compile line
    assert "233,008" in html and "peak resident memory" in html and "2.9" in html
    assert "CUDA-graph capture" not in html                          # no arm has the row
    assert "the compiled arm recompiles at every server start" in html and "Compiled here: baseline." in html


def test_no_cpu_note_on_gpu_and_no_section_without_records():
    assert startup_section(_manifest("cuda", STARTUPS))["notes"] == []
    assert startup_section(_manifest("cpu", {})) is None


def test_report_html_has_the_startup_section(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "run")
    html = render_report(tmp_path / "run").read_text()
    assert '<section id="startup">' in html and "No start-up metrics recorded in this run" in html
