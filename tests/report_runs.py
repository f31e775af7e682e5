"""The four run directories the report's browser test opens, built from committed recordings (no server started).

- ``default``: 2 A/A session blocks (fewer than the policy's ``min_sessions``, as a short default run) drawn from the real session recording of the default tiny DSA model
  (``tests/fixtures/recorded/real-sessions``, :func:`harness.study.session_simulation.run_tables`), gated.
- ``fail``: 4 blocks (``min_sessions``) with the candidate's throughput scaled by 0.5 (an injected regression), gated.
- ``invalid``: the recording itself, gated: it was interrupted, so its unfinished levels make cells INVALID.
- ``imported``: ``dsa-bench import`` of the real compare run's own ``vllm bench serve`` JSON
  (``tests/fixtures/compare_run/raw``), gated.

Each is then rendered with ``dsa-bench report``. ``python tests/report_runs.py OUT`` builds all four under OUT.
"""

from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

import numpy as np

from harness.cli import main as cli
from harness.study import session_simulation as sim
from harness.rundir import schema
from harness.rundir.store import RunDir

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RECORDING = FIXTURES / "recorded" / "real-sessions"
COMPARE_RUN = FIXTURES / "compare_run"
KINDS = ("default", "fail", "invalid", "imported")
SEED = 11


def _drawn(out: Path, blocks: int, throughput_factor: float) -> Path:
    store = RunDir(RECORDING)
    pool = sim.session_pool(store.manifest(), store.levels(numeric=True), store.requests(numeric=True),
                            max_sessions=2 * blocks)
    run = sim.draw_run(pool, blocks, np.random.default_rng(SEED), contiguous=True)
    manifest, levels, requests = sim.run_tables(pool, run, blocks, throughput_factor=throughput_factor)
    out.mkdir(parents=True)
    target = RunDir(out)
    target.write_manifest(manifest.model_dump(mode="json"))
    target.write_text(schema.LEVELS, levels.to_csv(index=False))
    target.write_text(schema.REQUESTS, requests.to_csv(index=False))
    return out


def _imported(out: Path) -> Path:
    folder = out.parent / f"{out.name}-bench"
    shutil.copytree(COMPARE_RUN / "raw", folder / "bench")
    rows = [{"arm": arm.name, "session": level.session, "concurrency": key.concurrency, "round": 0,
             "path": f"bench/{Path(level.raw).name}"}
            for arm in RunDir(COMPARE_RUN).manifest().arms for key, level in arm.level_items()]
    index = folder / "index.csv"
    with index.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["arm", "session", "concurrency", "round", "path"])
        writer.writeheader()
        writer.writerows(rows)
    if cli(["import", str(index), "--out", str(out)]) != 0:
        raise RuntimeError(f"dsa-bench import of {index} failed")
    return out


def build(kind: str, out: Path) -> Path:
    """Build, gate and render the run ``kind`` (one of :data:`KINDS`) at ``out`` (must not exist); returns ``out``."""
    if kind == "default":
        _drawn(out, 2, 1.0)
    elif kind == "fail":
        _drawn(out, 4, 0.5)
    elif kind == "invalid":
        shutil.copytree(RECORDING, out)
    elif kind == "imported":
        _imported(out)
    else:
        raise ValueError(f"unknown run kind {kind!r}; expected one of {KINDS}")
    cli(["gate", str(out)])             # exit code = the verdict; verdict.json is what the report reads
    if cli(["report", str(out)]) != 0:
        raise RuntimeError(f"dsa-bench report {out} failed")
    return out


if __name__ == "__main__":
    for name in KINDS:
        print(build(name, Path(sys.argv[1]) / name))
