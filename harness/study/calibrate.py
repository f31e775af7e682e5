"""``dsa-bench calibrate``: what the gate can and cannot see on this machine, measured with the design it will use.

Real ``compare`` runs of the scenario, same design and budget:

1. **A/A**, ``--aa-runs N`` times (default 1) — the candidate arm is made a copy of the baseline arm (route, extra
   args, env, vLLM build; ``allow_identical_arms``): any FAIL is a false alarm, counted over the N runs.
2. **Known slowdown** — the same A/A pair with a calibration injection in the candidate only (default
   ``step-delay:2``: the dsa_route plugin sleeps 2 ms per target-model forward, ≈ 13–25 % of the tiny default's
   engine step at c = 8…1, :mod:`dsa_route.inject`), recorded in the
   manifest and attested like any injection: it should FAIL.
3. **Defects** (``--defects all|a,b``, instead of the slowdown run) — one such run per catalogue defect of
   :data:`dsa_route.inject.DEFECTS` on the candidate; the kill matrix (:mod:`harness.study.kill_matrix`) prints, per
   defect, the verdict, the FAILed cells and the wall time: harmful ones should be caught, harmless ones quiet.
   Every defect's plan is built before anything starts, so one the scenario cannot apply (a model dsa_route's CPU
   classes do not serve, an MTP defect without enough speculative tokens) is a one-line error, exit 2.

It prints every verdict, the last A/A run's paired session spread of output throughput per level
(:func:`harness.judge.calibration.paired_spread`) and the smallest throughput loss that design detects at 80 % power
(:func:`harness.judge.calibration.detectable_loss`), and writes them to ``<out>/calibration-<timestamp>.json``.
Exit code: 0 when no A/A run FAILed and the slowdown did (with ``--defects``: every harmful defect caught, no
harmless one FAILed), 1 otherwise (2: bad input, nothing started).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from harness.compare import INTERRUPTED, CompareRequest, UsageError, aa_overrides, run_aa

__all__ = ["add_parser", "cmd_calibrate"]

DEFAULT_SLOWDOWN = "step-delay:2"


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``calibrate`` subcommand (the scenario flags, ``--out``/``--budget`` and the command itself, which calls
    :func:`cmd_calibrate` with the request the flags make, are added by the CLI)."""
    parser = sub.add_parser("calibrate", allow_abbrev=False,
                            help="A/A run + known injected slowdown: false alarm?, caught?, spread, detectable loss")
    parser.add_argument("--slowdown", default=DEFAULT_SLOWDOWN, metavar="KIND",
                        help=f"the candidate's injection in the slowdown run (default {DEFAULT_SLOWDOWN})")
    parser.add_argument("--defects", metavar="all|A,B",
                        help="run the kill matrix over these catalogue defects (all: every one) instead of the "
                             "slowdown run")
    parser.add_argument("--aa-runs", type=int, default=1, metavar="N",
                        help="A/A runs before the slowdown run (default 1); the false alarms are counted over them")
    return parser


def _figures(run_dir: Path) -> dict[str, Any]:
    from harness.judge.calibration import detectable_loss, paired_spread
    from harness.judge.design_costs import pooled_spread, pooled_spreads
    from harness.rundir.store import RunDir

    store = RunDir(run_dir)
    manifest = store.manifest()
    verdict = json.loads(store.file("verdict.json").read_text(encoding="utf-8"))
    policy = verdict.get("policy_fields") or {}
    level = float(policy.get("alpha", 0.05)) / max(len(policy.get("primary") or [1]), 1)
    margin = float((policy.get("margins") or {}).get("output_throughput", -3.0))
    levels = store.levels(numeric=True)
    options = {"estimator": str(policy.get("estimator", "mean")),
               "max_steal_fraction": float(policy.get("max_steal_fraction", 0.10))}
    spreads = []
    for row in paired_spread(levels, **options):
        entry = {"level": str(row.level), "where": row.level.label(), "concurrency": row.level.concurrency,
                 "pairs": row.pairs, "sd": row.sd, "sd_upper": row.upper}
        if row.pairs >= 2:
            entry["detectable_loss_pct"] = detectable_loss(row.sd, row.pairs, margin, level)
            entry["detectable_loss_pct_upper"] = detectable_loss(row.upper, row.pairs, margin, level)
        spreads.append(entry)
    if "engine_cpu_ms_per_token" in levels.columns and levels["engine_cpu_ms_per_token"].notna().any():
        # the contention-robust cost beside it: is it less noisy?
        cpu = {str(row.level): row for row in paired_spread(levels, "engine_cpu_ms_per_token", **options)}
        for entry in spreads:
            row = cpu.get(entry["level"])
            entry["engine_cpu_sd"] = row.sd if row is not None and row.pairs >= 2 else None
    pooled = pooled_spread(levels, **options)     # what the FAIL side tests first: a regime's levels' geometric mean
    several = len(pooled_spreads(levels, **options)) > 1
    where = (f"all levels of {pooled.regime.label()} (pooled; the noisiest regime)" if several and pooled.regime
             else "all levels (pooled)")
    pooled_entry = {"pairs": pooled.pairs, "sd": pooled.sd, "sd_upper": pooled.upper, "where": where,
                    "regime": None if pooled.regime is None else str(pooled.regime)}
    if pooled.pairs >= 2:
        pooled_entry["detectable_loss_pct"] = detectable_loss(pooled.sd, pooled.pairs, margin, level)
        pooled_entry["detectable_loss_pct_upper"] = detectable_loss(pooled.upper, pooled.pairs, margin, level)
    return {"run_dir": str(run_dir), "overall": verdict.get("overall"), "reason": verdict.get("reason"),
            "stopped": manifest.stopped.reason if manifest.stopped else None,
            "wall_s": manifest.timing.get("wall_s"), "spread": spreads, "pooled_spread": pooled_entry,
            "tested_at": level}


def _print_aa(aa_runs: list[dict[str, Any]]) -> None:
    for index, aa in enumerate(aa_runs, 1):
        print(f"A/A {index}/{len(aa_runs)}: {aa['overall']} ("
              f"{'false alarm' if aa['overall'] == 'FAIL' else 'no false alarm'}) in {aa['wall_s'] or 0:.0f} s — "
              f"{aa['stopped'] or aa['reason']}")
    false_alarms = sum(aa["overall"] == "FAIL" for aa in aa_runs)
    print(f"A/A false alarms: {false_alarms} of {len(aa_runs)} run(s)")


def _print(aa_runs: list[dict[str, Any]], slow: dict[str, Any], slowdown: str) -> None:
    _print_aa(aa_runs)
    aa = aa_runs[-1]
    print(f"{slowdown} on the candidate: {slow['overall']} ({'caught' if slow['overall'] == 'FAIL' else 'NOT caught'})"
          f" in {slow['wall_s'] or 0:.0f} s — {slow['stopped'] or slow['reason']}")
    print(f"A/A paired session spread of log output throughput, and the smallest loss FAILed at 80 % power "
          f"(one-sided {aa['tested_at']:.4f}, the last A/A run's sessions):")
    for row in [*aa["spread"], {"where": "all levels (pooled)", **aa["pooled_spread"]}]:
        loss = (f"{row['detectable_loss_pct']:.1f} % ({row['detectable_loss_pct_upper']:.1f} % at the sd's 95 % "
                "upper bound)") if "detectable_loss_pct" in row else "not estimable (< 2 session pairs)"
        cpu = (f"; engine CPU / token sd {row['engine_cpu_sd']:.3f}"
               if isinstance(row.get("engine_cpu_sd"), float) and row["engine_cpu_sd"] == row["engine_cpu_sd"] else "")
        print(f"  {row['where']}: sd {row['sd']:.3f} over {row['pairs']} pair(s) → {loss}{cpu}")


def cmd_calibrate(args: argparse.Namespace, request: CompareRequest) -> int:
    """Run the A/A and the slowdown (or defect) comparisons of ``request`` (what the CLI made of the scenario flags)
    with ``args``' calibrate options (``slowdown``, ``defects``, ``aa_runs``, ``out``), print and store what they
    show."""
    from dsa_route.inject import parse_injection

    if args.inject_candidate:
        raise UsageError("calibrate sets the candidate's injection itself: drop --inject-candidate (use --slowdown)")
    try:
        parse_injection(args.slowdown)
    except ValueError as error:
        raise UsageError(f"--slowdown: {error}") from None
    if args.aa_runs < 1:
        raise UsageError(f"--aa-runs must be ≥ 1, not {args.aa_runs}")
    defects, skipped = _checked_defects(request, args.defects) if args.defects else ((), {})
    try:
        aa_runs = [_figures(run_aa(request, None)[1]) for _ in range(args.aa_runs)]
        if defects:
            rows = [_defect_row(request, defect) for defect in defects]
        else:
            slow = _figures(run_aa(request, args.slowdown)[1])
    except KeyboardInterrupt as stop:
        print(f"calibrate: {stop or 'interrupted'}; no further runs", file=sys.stderr)
        return INTERRUPTED
    record: dict[str, Any] = {"aa": aa_runs[-1], "aa_runs": aa_runs,
                              "false_alarms": sum(aa["overall"] == "FAIL" for aa in aa_runs)}
    if defects:
        from harness.study.kill_matrix import all_as_expected, render

        _print_aa(aa_runs)
        print(render(rows))
        for defect, why in skipped.items():
            print(f"not run: {defect} — {why}")
        record["kill_matrix"] = [row.record() for row in rows]
        record["not_run"] = skipped
        passed = all_as_expected(rows)
    else:
        _print(aa_runs, slow, args.slowdown)
        record["slowdown"] = {**slow, "injection": args.slowdown}
        passed = slow["overall"] == "FAIL"
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) / f"calibration-{stamp}.json"
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"written: {out}")
    return 0 if record["false_alarms"] == 0 and passed else 1


def _checked_defects(request: CompareRequest, text: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the defects ``--defects`` names that will run, {defect: why not} for those ``all`` leaves out), each planned
    as its A/A run (:func:`aa_overrides`) before anything starts. ``all`` leaves out what the scenario cannot apply
    (e.g. ``mtp-hidden-unnormed`` without ``--mtp 2``) and says why; a defect named explicitly must apply.

    Raises:
        UsageError: a name outside the catalogue, a named defect whose plan is refused (PlanError's reason), or
            ``all`` with nothing the scenario can apply.
    """
    from harness import compare
    from harness.run import machine
    from harness.run.plan import PlanError
    from harness.run.scenario import load_scenario
    from harness.study.kill_matrix import parse_defects

    try:
        named = parse_defects(text)
    except ValueError as error:
        raise UsageError(str(error)) from None
    name = request.scenario_name(machine.detect().name)
    baseline = load_scenario(name, request.overrides).arms["baseline"]
    runnable, skipped = [], {}
    for defect in named:
        planned = request.model_copy(update={"scenario": name,
                                             "overrides": {**request.overrides, **aa_overrides(baseline, defect)}})
        try:
            compare.build_plan(planned, to_run=True)
            runnable.append(defect)
        except PlanError as error:
            if text.strip() != "all":
                raise UsageError(f"--defects {defect}: {error}") from None
            skipped[defect] = str(error)
    if not runnable:
        first, why = next(iter(skipped.items()))
        raise UsageError(f"--defects all: the scenario {name} can apply none of the {len(skipped)} defects "
                         f"(e.g. {first}: {why})")
    return tuple(runnable), skipped


def _defect_row(request: CompareRequest, defect: str):
    """One defect's gated A/A run (the defect on the candidate) as a kill-matrix row."""
    from harness.study.kill_matrix import kill_row

    run_dir = run_aa(request, defect)[1]
    return kill_row(defect, run_dir, _figures(run_dir)["wall_s"])
