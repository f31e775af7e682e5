"""The design study: which run design gives a decision on this machine for the least wall time.

``python -m harness.study.design_study run --designs NAME,... --blocks K [--out results/design-study/]`` runs each named
design of the design file (:mod:`harness.study.design_file`, default ``scenarios/design-study/cpu.toml``) as a real A/A
``dsa-bench compare`` (the candidate a copy of the baseline arm, :func:`harness.compare.aa_overrides`; K session
blocks, GSM8K off, gated), one after the other, into ``<out>/runs/``; each run directory gets ``design.json`` (the
design, its overrides, the host's load average before and after, transparent-huge-page settings). Then it analyzes
them as ``analyze`` does.

``python -m harness.study.design_study calibrate [--blocks 3]`` is a machine's first, short study: ``run`` over the
design file's ``calibrate`` designs (the scenario's own design and the ones it was chosen over), so a machine with no
study of its own gets one (``results/design-study/<machine>.json``, which the plan and the report then cite).

``python -m harness.study.design_study analyze RUN_DIR...`` computes each run's row (:func:`harness.study.design_analysis.
analyze_run`), merges them by design name into ``<out>/<machine>.json`` (a design measured again replaces its row)
and prints the markdown table the README takes verbatim, with the cheapest design (least spread² × wall time per
block). Bad input (an unknown design or override key, a missing run directory) is one line and exit 2, nothing run.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from harness.compare import CompareRequest
from harness.study.design_analysis import DESIGN_RECORD, analyze_run, machine_key
from harness.study.design_file import DEFAULT_FILE, Design, DesignFileError, read_designs, resolve
from harness.study.design_table import cheapest, markdown
from harness.render.designs import STUDY_KIND
from harness.run.scenario import REPO_ROOT
from harness.rundir.store import atomic_write_text

__all__ = ["main", "run_designs", "write_study"]

THP_FILES = ("enabled", "defrag")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def host_state() -> dict[str, Any]:
    """The 1/5/15-minute load average and the transparent-huge-page settings (read-only; host configuration)."""
    thp = {name: _read(f"/sys/kernel/mm/transparent_hugepage/{name}") for name in THP_FILES}
    return {"loadavg": _read("/proc/loadavg"), "thp": thp}


def compare_request(scenario: str, blocks: int, out: Path) -> CompareRequest:
    """``dsa-bench compare --scenario S --repeats K --no-gsm8k --gate --out OUT`` as a request."""
    return CompareRequest(scenario=scenario, out=out, gate=True,
                          overrides={"workload.repeats": blocks, "gate.max_sessions": None, "accuracy.enabled": False})


def run_designs(designs: list[Design], scenario: str, blocks: int, out: Path) -> list[Path]:
    """Run each design as a gated A/A compare into ``out/runs``; returns the run directories made (a Ctrl-C stops
    after the finished ones)."""
    from harness.compare import run_aa

    made = []
    for design in designs:
        if design.skipped:
            print(f"design {design.name}: skipped — {design.skipped}", file=sys.stderr)
            continue
        before = host_state()
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        try:
            # every design runs its K blocks: the scenario's budget (cpu-tiny-dsa: 12 min) would cut slow designs short
            code, run_dir = run_aa(compare_request(scenario, blocks, out / "runs"), None,
                                   {"workload.budget_s": None, **design.overrides})
        except KeyboardInterrupt:
            print(f"design {design.name}: interrupted; analyzing the finished runs", file=sys.stderr)
            break
        except Exception as error:  # noqa: BLE001 — one design that cannot start must not lose the others' runs
            print(f"design {design.name}: not run ({type(error).__name__}: {error})", file=sys.stderr)
            continue
        after = host_state()
        record = {"design": design.name, "description": design.description, "base": design.base,
                  "overrides": design.overrides, "scenario": scenario, "blocks": blocks, "exit_code": code,
                  "started_at": started, "ended_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "loadavg_before": before["loadavg"], "loadavg_after": after["loadavg"], "thp": before["thp"]}
        atomic_write_text(Path(run_dir) / DESIGN_RECORD, json.dumps(record, indent=2) + "\n")
        made.append(Path(run_dir))
    return made


def write_study(rows: list[dict[str, Any]], out: Path) -> Path:
    """Merge ``rows`` by design name into ``out/<machine>.json`` and return its path. Raises DesignFileError when
    the rows come from different machines."""
    machines = {json.dumps(row["machine"], sort_keys=True) for row in rows}
    if len(machines) != 1:
        raise DesignFileError(f"the run directories come from {len(machines)} machines; analyze one machine's "
                              "runs at a time")
    machine = rows[0]["machine"]
    path = Path(out) / f"{machine_key(machine)}.json"
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))["designs"] if path.exists() else []
    except (ValueError, KeyError, TypeError) as error:
        raise DesignFileError(f"{path} is not a design study ({error}); move it away or fix it") from None
    names = {row["design"] for row in rows}
    merged = [row for row in kept if row["design"] not in names] + rows
    best = cheapest(merged)
    document = {"kind": STUDY_KIND, "schema_version": 1, "machine": machine,
                "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "cost_unit": "s (sd² of the per-block paired log ratio × median wall seconds per block)",
                "cheapest": best["design"] if best else None, "designs": merged}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def _analyze(run_dirs: list[Path], out: Path, estimators: str) -> int:
    missing = [str(d) for d in run_dirs if not (Path(d) / "manifest.json").is_file()]
    if missing:
        raise DesignFileError(f"{missing[0]} is not a run directory (no manifest.json); pass run directories")
    rows = [analyze_run(d, tuple(name.strip() for name in estimators.split(",") if name.strip())) for d in run_dirs]
    path = write_study(rows, out)
    document = json.loads(path.read_text(encoding="utf-8"))
    print(markdown(document["designs"]))
    if document["cheapest"]:
        best = next(row for row in document["designs"] if row["design"] == document["cheapest"])
        print(f"\ncheapest measured: {best['design']} — overrides for the CPU default: "
              f"{json.dumps(best['overrides'])}")
    print(f"written: {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.study.design_study", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the named designs as real A/A compares, then analyze them")
    run.add_argument("--designs", required=True, help="comma-separated design names of the design file")
    run.add_argument("--blocks", type=int, default=8, help="session blocks per design (workload.repeats; default 8)")
    run.add_argument("--control-base", help="the design the control = true designs build on (default: the file's)")
    calibrate = sub.add_parser("calibrate", help="a machine's first, short study: run the design file's calibrate "
                                                 "designs, then analyze them")
    calibrate.add_argument("--blocks", type=int, default=3, help="session blocks per design (default 3)")
    calibrate.set_defaults(control_base=None)
    for command in (run, calibrate):
        command.add_argument("--design-file", type=Path, default=DEFAULT_FILE, help=f"default {DEFAULT_FILE}")
    analyze = sub.add_parser("analyze", help="the study rows of existing run directories")
    analyze.add_argument("run_dirs", nargs="+", type=Path)
    for command in (run, calibrate, analyze):
        command.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "design-study",
                             help="where <machine>.json goes (run directories under OUT/runs)")
        command.add_argument("--robust-estimators", default="exclude-stalls,median", metavar="NAMES",
                             help="paired_spread estimators read as robust analyses (the [gate] estimator values; "
                                  "skipped where this build has none; default exclude-stalls,median)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exit 0 on success, 2 on bad input (one line, nothing run)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "analyze":
            return _analyze(args.run_dirs, args.out, args.robust_estimators)
        if args.blocks < 2:
            raise DesignFileError(f"--blocks {args.blocks}: a paired spread needs at least 2 blocks")
        designs_file = read_designs(args.design_file)
        if args.command == "calibrate" and not designs_file.calibrate:
            raise DesignFileError(f"{args.design_file}: no calibrate = [...] list of designs; add one or use run")
        names = (list(designs_file.calibrate) if args.command == "calibrate"
                 else [n.strip() for n in args.designs.split(",") if n.strip()])
        designs = resolve(designs_file, names, args.control_base)
        made = run_designs(designs, designs_file.scenario, args.blocks, args.out)
        return _analyze(made, args.out, args.robust_estimators) if made else 1
    except DesignFileError as error:
        print(f"design-study: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
