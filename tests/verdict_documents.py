"""The verdict documents ``dsa-bench compare``, ``report``, ``gate``, ``import`` and ``calibrate`` make from the
committed recordings, normalized (run-directory paths and creation times out), for ``tests/test_verdict_documents.py``.

``compare`` and ``calibrate`` run their real entry points with :class:`harness.run.runner.Runner` replaced by a stand-in
that copies a recording into the new run directory (no server starts); everything after it — the gate, the report,
the calibration figures — is the product's own code.

Refresh the expected documents (only when a verdict is meant to change, and say why in the commit):
``PYTHONPATH=$PWD .venv/bin/python tests/verdict_documents.py``.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXPECTED = FIXTURES / "verdicts"
RECORDINGS = ("compare_run", "run_dir", "recorded/real-cpu", "recorded/real-sessions", "recorded/run")
VOLATILE = ("created_at", "run_dir")
"""verdict.json keys that name where and when the verdict was made, not what it says."""


def _normal(text: str, root: Path) -> str:
    return text.replace(str(root), "<TMP>")


def _verdict(run_dir: Path, root: Path) -> dict[str, Any]:
    document = json.loads(_normal((run_dir / "verdict.json").read_text(encoding="utf-8"), root))
    for key in VOLATILE:
        document.pop(key, None)
    return {"verdict": document,
            "summary": _normal((run_dir / "summary.md").read_text(encoding="utf-8"), root)}


def _copy(name: str, root: Path) -> Path:
    target = root / name.replace("/", "-")
    shutil.copytree(FIXTURES / name, target)
    return target


def gate(name: str, root: Path) -> dict[str, Any]:
    """``dsa-bench gate`` on a copy of the recording ``name``."""
    from harness.cli import main

    run_dir = _copy(name, root)
    return {"exit_code": main(["gate", str(run_dir)]), **_verdict(run_dir, root)}


def report(name: str, root: Path) -> dict[str, Any]:
    """``dsa-bench gate`` then ``dsa-bench report`` on a copy of the recording ``name``: the verdict the report
    states."""
    from harness.cli import main

    run_dir = _copy(name, root)
    main(["gate", str(run_dir)])
    code = main(["report", str(run_dir)])
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    overall = re.search(r'id="verdict-words" class="verdict-overall ([A-Z]+)', html)
    return {"exit_code": code, "overall": overall.group(1) if overall else None}


def imported(root: Path) -> dict[str, Any]:
    """``dsa-bench import`` of ``compare_run``'s raw vLLM JSON (one index row per level), then ``dsa-bench gate``."""
    from harness.cli import main
    from harness.rundir.store import RunDir

    source = FIXTURES / "compare_run"
    shutil.copytree(source / "raw", root / "bench")
    rows = [{"arm": arm.name, "session": level.session, "concurrency": key.concurrency, "round": 0,
             "path": f"bench/{Path(level.raw).name}"}
            for arm in RunDir(source).manifest().arms for key, level in arm.level_items()]
    with (root / "index.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["arm", "session", "concurrency", "round", "path"])
        writer.writeheader()
        writer.writerows(rows)
    code = main(["import", str(root / "index.csv"), "--out", str(root / "imported")])
    return {"exit_code": code, "gate_exit_code": main(["gate", str(root / "imported")]),
            **_verdict(root / "imported", root)}


class RecordedRunner:
    """Stands in for :class:`harness.run.runner.Runner`: copies ``recording`` into the run directory; returns its
    manifest as the runner does."""

    recording = FIXTURES / "compare_run"
    seen: list[dict[str, Any]] = []

    def __init__(self, plan, run_dir: Path, options, console=None, resume_manifest=None):
        self.plan, self.run_dir = plan, Path(run_dir)
        RecordedRunner.seen.append({"scenario": plan.scenario.name,
                                    "candidate_inject": plan.scenario.arms["candidate"].inject})

    def run(self):
        from harness.rundir.store import RunDir

        shutil.copytree(self.recording, self.run_dir, dirs_exist_ok=True)
        return RunDir(self.run_dir).manifest()


def _with_recorded_runner(call):
    from harness.run import runner

    real, RecordedRunner.seen = runner.Runner, []
    runner.Runner = RecordedRunner
    try:
        return call()
    finally:
        runner.Runner = real


def compare(root: Path) -> dict[str, Any]:
    """``dsa-bench compare --scenario cpu-tiny-dsa --no-gsm8k --gate`` with the recorded runner."""
    from harness.cli import main

    out = root / "compare"
    code = _with_recorded_runner(lambda: main(["compare", "--scenario", "cpu-tiny-dsa", "--no-gsm8k", "--gate",
                                               "--out", str(out)]))
    (run_dir,) = out.iterdir()
    return {"exit_code": code, "runs": RecordedRunner.seen, **_verdict(run_dir, root)}


def calibrate(root: Path) -> dict[str, Any]:
    """``dsa-bench calibrate --scenario cpu-tiny-dsa --no-gsm8k --aa-runs 2`` with the recorded runner: its
    calibration record."""
    from harness.cli import main

    out = root / "calibrate"
    out.mkdir()
    code = _with_recorded_runner(lambda: main(["calibrate", "--scenario", "cpu-tiny-dsa", "--no-gsm8k",
                                               "--aa-runs", "2", "--out", str(out)]))
    (record,) = out.glob("calibration-*.json")
    document = json.loads(_normal(record.read_text(encoding="utf-8"), root))
    for run in [document["aa"], *document["aa_runs"], document["slowdown"]]:
        run["run_dir"] = re.sub(r"/\d{8}-\d{6}-", "/<STAMP>-", run["run_dir"])
    return {"exit_code": code, "runs": RecordedRunner.seen, "calibration": document}


def documents(root: Path) -> dict[str, dict[str, Any]]:
    """Every case's document, keyed by the file name it is expected in (``root``: an empty scratch folder)."""
    out: dict[str, dict[str, Any]] = {}
    for folder in ("gate", "report", "import"):
        (root / folder).mkdir()
    for name in RECORDINGS:
        out[f"gate-{name.replace('/', '-')}"] = gate(name, root / "gate")
    for name in ("compare_run", "recorded/real-sessions"):
        out[f"report-{name.replace('/', '-')}"] = report(name, root / "report")
    out["import"] = imported(root / "import")
    out["compare"] = compare(root)
    out["calibrate"] = calibrate(root)
    return out


def dump(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        made = documents(Path(scratch))
    EXPECTED.mkdir(exist_ok=True)
    for key, document in made.items():
        (EXPECTED / f"{key}.json").write_text(dump(document), encoding="utf-8")
    print(f"written: {len(made)} documents to {EXPECTED}", file=sys.stderr)
