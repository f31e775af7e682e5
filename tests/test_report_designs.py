"""report.html's "Designs measured on this machine": the committed study of this machine class, and this run's own
paired spread and cost per decision (verdict.json's noise)."""

import html
import json
import re
import shutil

import pytest

from harness.study import design_study
from harness.gate import run_gate
from harness.render import designs, render_report
from harness.rundir.store import RunDir

COMPARE_RUN = "tests/fixtures/compare_run"
RECORDING = "tests/fixtures/recorded/real-sessions"


@pytest.fixture
def run_dir(tmp_path):
    target = tmp_path / "run"
    shutil.copytree(COMPARE_RUN, target)
    return target


def _section(html):
    start = html.index('<section id="designs">')
    return html[start:html.index("</section>", start)]


def test_this_runs_spread_and_cost_are_in_the_verdict_and_the_report(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(designs, "STUDY_DIR", tmp_path / "no-study")
    noise = run_gate(run_dir).document["noise"]
    assert noise["pooled"]["pairs"] == 3 and noise["cost_s"] == pytest.approx(
        noise["pooled"]["sd"] ** 2 * noise["wall_per_block_s"])
    assert json.loads(RunDir(run_dir).file("verdict.json").read_text())["noise"] == noise
    section = _section(render_report(run_dir).read_text())
    pooled = noise["pooled"]
    assert f"{pooled['sd']:.3f} [{pooled['low']:.3f}, {pooled['high']:.3f}], 3 pairs" in section
    assert f"{noise['cost_s']:.4f}" in section
    assert "No design study measured on cpu, AMD EPYC, 2 CPUs" in section


def test_the_study_of_this_machine_is_shown_cheapest_first(run_dir, tmp_path, monkeypatch, capsys):
    study_dir = tmp_path / "study"
    assert design_study.main(["analyze", RECORDING, COMPARE_RUN, "--out", str(study_dir)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(designs, "STUDY_DIR", study_dir)
    run_gate(run_dir)
    section = _section(render_report(run_dir).read_text())
    (study,) = study_dir.glob("*.json")
    rows = json.loads(study.read_text())["designs"]
    order = [name for name in re.findall(r"<td><code>([^<]+)</code>", section)]
    assert order == [row["design"] for row in sorted(rows, key=lambda r: r["spread"]["cost_s"])]
    cheapest = json.loads(study.read_text())["cheapest"]
    assert f"<code>{cheapest}</code> (cheapest)" in section and study.name in section


def test_a_study_of_another_machine_is_not_shown(run_dir, tmp_path, monkeypatch, capsys):
    study_dir = tmp_path / "study"
    assert design_study.main(["analyze", COMPARE_RUN, "--out", str(study_dir)]) == 0
    capsys.readouterr()
    (study,) = study_dir.glob("*.json")
    document = json.loads(study.read_text())
    document["machine"]["cpu_count"] = 64
    study.write_text(json.dumps(document))
    monkeypatch.setattr(designs, "STUDY_DIR", study_dir)
    section = " ".join(_section(render_report(run_dir).read_text()).split())
    assert "No design study measured" in section and 'id="design-study"' not in section
    # Issue #25: which design ran, where its error rates were measured (that machine named), how to measure this one.
    manifest = RunDir(run_dir).manifest()
    assert f"This run's design: {designs.design_ran(manifest)}." in section
    assert designs.design_ran(manifest).startswith(("fixed (", "group-sequential ("))
    assert f"measured on another machine: cpu, AMD EPYC, 64 CPUs (results/design-study/{study.name})" in section
    assert designs.MEASURE_COMMAND in section


XEON = {"name": "cpu", "device": "Intel(R) Xeon(R) Processor", "cpu_count": 2, "gpu_count": 0}
EPYC = {"name": "cpu", "device": "AMD EPYC", "cpu_count": 2, "gpu_count": 0}


def _study(folder, machine, cheapest, updated_at="2026-12-01T18:47:26+00:00"):
    """A minimal study document of ``machine`` whose cheapest design is ``cheapest``, under its machine key."""
    from harness.study.design_analysis import machine_key

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{machine_key(machine)}.json"
    path.write_text(json.dumps({"kind": designs.STUDY_KIND, "machine": machine, "updated_at": updated_at,
                                "cheapest": cheapest, "designs": []}))
    return path


def test_the_design_is_chosen_by_this_machines_study_or_says_whose(tmp_path):
    """Issue #27 item 3: which machine's study chose the run design, in the plan's and the report's words."""
    _study(tmp_path, EPYC, "concurrent-pinned")
    assert designs.design_choice(EPYC, "concurrent-pinned", tmp_path) == (
        "design concurrent-pinned chosen by the study of cpu-2cpu-amd-epyc, measured 2026-12-01 "
        "(results/design-study/cpu-2cpu-amd-epyc.json)")
    assert designs.design_choice(XEON, "concurrent-pinned", tmp_path) == (
        "no study of this machine (cpu, Intel(R) Xeon(R) Processor, 2 CPUs); ran the scenario's design "
        "concurrent-pinned, chosen by the study of cpu-2cpu-amd-epyc, measured 2026-12-01; make one with "
        f"{designs.MEASURE_COMMAND}")
    _study(tmp_path, XEON, "sequential-1r", "2026-12-04T20:00:00+00:00")
    assert designs.design_choice(XEON, "concurrent-pinned", tmp_path).startswith(
        "the study of cpu-2cpu-intel-r-xeon-r-processor, measured 2026-12-04, found sequential-1r cheapest; this run "
        "ran the scenario's design concurrent-pinned")
    assert designs.design_choice(XEON, None, tmp_path / "none").startswith(
        "no study of this machine (cpu, Intel(R) Xeon(R) Processor, 2 CPUs); ran the scenario's own settings (no "
        "design-study design); make one with")


def test_the_report_and_the_plan_say_which_machines_study_chose_the_design(run_dir, tmp_path, monkeypatch, capsys):
    from harness import cli
    from harness.run import machine
    from harness.rundir.schema import Platform

    _study(tmp_path / "study", EPYC, "concurrent-pinned")
    monkeypatch.setattr(designs, "STUDY_DIR", tmp_path / "study")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["platform"]["device"] = XEON["device"]
    manifest["scenario"]["design"] = "concurrent-pinned"
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    section = html.unescape(" ".join(_section(render_report(run_dir).read_text()).split()))
    assert ("Run design: no study of this machine (cpu, Intel(R) Xeon(R) Processor, 2 CPUs); ran the scenario's "
            "design concurrent-pinned, chosen by the study of cpu-2cpu-amd-epyc") in section
    assert cli.main(["plan", "--scenario", "cpu-tiny-dsa"]) == 0
    plan = capsys.readouterr().out
    (line,) = [line for line in plan.splitlines() if line.startswith("run design: ")]
    host = Platform.model_validate(machine.detect().to_dict()).identity()
    assert line == "run design: " + designs.design_choice(host, "concurrent-pinned")
    assert cli.main(["plan", "--scenario", "cpu-tiny-dsa", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["design"] == line.removeprefix("run design: ")


def test_the_next_step_never_advises_the_design_the_run_already_ran():
    """The review of 2026-12-04: a run of concurrent-pinned was told concurrent-pinned "would be cheaper"."""
    from harness.render.answer import _cheaper_design

    study = {"cheapest": "concurrent-pinned", "rows": [{"design": "concurrent-pinned", "cost_s": 0.0083}]}
    assert _cheaper_design({"study": study, "design": "concurrent-pinned"}, 4.6) == ""
    assert _cheaper_design({"study": study, "design": "sequential-1r"}, 4.6).startswith(
        "the design concurrent-pinned would be cheaper: 0.0083")
    assert _cheaper_design({"study": study, "design": None}, 0.001) == ""        # the run was cheaper itself




def test_the_verdict_and_the_next_step_quote_one_sessions_figure(tmp_path, monkeypatch):
    """The fresh-clone review of 2026-12-05: summary.md's verdict said ≈724 sessions per arm, its "Next" line ≈580
    (the largest single cell's figure). Both now quote the verdict's joint figure (``sessions_needed``), here an A/A
    of 4 recorded session blocks whose spread puts it beyond the advice's cap, and no per-cell figure."""
    from harness.render.answer import _inconclusive_step
    from report_runs import _drawn

    monkeypatch.setattr(designs, "STUDY_DIR", tmp_path / "no-study")
    run = _drawn(tmp_path / "aa4", 4, 1.0)
    document = run_gate(run).document
    assert document["overall"] == "INCONCLUSIVE" and document["sessions_needed"] is None
    assert "more than the 1000-session cap" in document["reason"]
    render_report(run)
    step = next(line for line in RunDir(run).file("summary.md").read_text().splitlines() if line.startswith("Next:"))
    assert "more sessions per arm than the advice's cap" in step and "would decide" not in step, step
    cells = [{"result": "INCONCLUSIVE", "repeats_needed": 580, "repeats": 4}]
    step = _inconclusive_step({"cells": cells, "sessions_needed": 724, "noise": {"wall_per_block_s": 143}}, [], None)
    assert "≈724 sessions per arm would decide (≈720 more session blocks" in step, step
    assert "≈580" in _inconclusive_step({"cells": cells}, [], None)      # a verdict.json from before the field


def test_the_next_step_names_the_gsm8k_cell_without_a_level():
    """summary.md read "GSM8K accuracy (%) at GSM8K undecided" (fresh-clone review, 2026-12-05)."""
    from harness.render.answer import ForestRow, _levels_text

    def row(label, where):
        return ForestRow(metric="m", label=label, where=where, concurrency=None, pooled=False, delta=None, low=None,
                         high=None, margin=0.0, unit="%", status="INCONCLUSIVE", higher_is_better=True, gap="",
                         note="")

    text = _levels_text([row("Output throughput (tok/s)", "c=1"), row("Output throughput (tok/s)", "c=4"),
                         row("GSM8K accuracy (%)", "GSM8K")])
    assert text == "Output throughput (tok/s) at c=1, c=4; GSM8K accuracy (%)"


def test_an_interrupted_run_is_told_to_resume():
    """The fresh-clone review of 2026-12-05: an interrupted run's "Next" line advised fixing the cells' INVALID
    reasons (levels not run) and running the comparison again, where `compare --resume` runs just what is missing."""
    from harness.render.answer import next_step

    verdict = {"overall": "INVALID", "run_status": "interrupted",
               "cells": [{"result": "INVALID", "note": "not run (skipped: run stopped before this level)"}]}
    assert next_step(verdict, [], None, "results/RUN").startswith(
        "Next: finish the run with `dsa-bench compare --resume results/RUN`")
    assert "fix what made" in next_step({**verdict, "run_status": "done"}, [], None, "results/RUN")
