"""``dsa-bench``: one CLI, subcommands ``compare``, ``plan``, ``report``, ``gate``, ``import``, ``calibrate``.

The CLI builds one scenario object (file + flag overrides) and hands it to one entry point. Bad input ends with a
one-line error naming the fix and exit code 2, before anything is started.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from harness.cli_flags import UsageError  # noqa: F401 (the CLI's usage error; re-exported)
from harness.cli_flags import add_scenario_flags as _add_scenario_flags, duration as _duration, overrides as _overrides
from harness.run.scenario import REPO_ROOT, ScenarioError, find_scenario, load_scenario

USAGE_ERROR = 2



def default_scenario(machine_name: str, tp: int | None, quant: str | None) -> str:
    """The embedded default: ``cpu-tiny-dsa`` (a tiny DeepSeek-V3.2 served through dsa_route) without CUDA; on CUDA the
    headline GLM run unless TP 8 / FP8 asks for DeepSeek-V3.2."""
    if machine_name != "cuda":
        return "cpu-tiny-dsa"
    if tp == 8 or quant == "fp8":
        return "deepseek-v3.2-fp8-tp8"
    return "glm-5.2-nvfp4-tp4"


def _build_plan(args: argparse.Namespace, *, to_run: bool):
    """Scenario + overrides → plan. ``to_run``: refuse (PlanError) what this machine cannot run; otherwise plan for
    the scenario's platform and return the refusal as a note."""
    from harness.run import builds, machine
    from harness.run.installed_vllm import auto_choice
    from harness.run.models import locate
    from harness.run.plan import PlanError, build_plan, check_machine, planning_machine

    host = machine.detect()
    name = args.scenario or default_scenario(host.name, args.tp, args.quant)
    scenario = load_scenario(name, _overrides(args)).effective()
    source = str(find_scenario(name))
    if to_run:
        check_machine(scenario, host)
        if scenario.cluster.backend == "ray" and importlib.util.find_spec("ray") is None:
            raise UsageError('cluster.backend = "ray" needs Ray: pip install -e ".[ray]" (ray==2.60.0) on every node')
        plan = replace(build_plan(scenario, host, locate(scenario), auto_choice), scenario_file=source)
        builds.require(plan.arms)
        refusals = [f"arm {arm.name}: {why}" for arm in plan.arms for why in arm.refusals]
        if refusals:
            raise PlanError("; ".join(refusals))
        return plan, None
    try:
        check_machine(scenario, host)
        refusal = None
    except PlanError as error:
        refusal = str(error)
    planned = build_plan(scenario, planning_machine(scenario, host), locate(scenario), auto_choice)
    return replace(planned, scenario_file=source), refusal


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the plan (compact; ``--verbose``: every reason and bench command; ``--json``: everything) and its cost
    estimate; start nothing."""
    from harness.run import plan_view
    from harness.run.estimate import estimate

    plan, refusal = _build_plan(args, to_run=False)
    view = plan_view.as_json if args.json else plan_view.verbose if args.verbose else plan_view.compact
    sys.stdout.write(view(plan, estimate(plan), refusal))
    return 0


def _base_urls(args: argparse.Namespace) -> dict[str, str] | None:
    given = {"baseline": args.base_url_baseline, "candidate": args.base_url_candidate}
    if not any(given.values()):
        return None
    if not all(given.values()):
        raise UsageError("--base-url-baseline and --base-url-candidate go together; give both servers' URLs")
    for arm, url in given.items():
        if not re.fullmatch(r"https?://[^\s/]+(:\d+)?/?", url):
            raise UsageError(f"--base-url-{arm} {url!r} is not a server URL; use e.g. http://host:8000")
    return given


def _resume_plan(args: argparse.Namespace):
    """The stored plan of ``--resume RUN_DIR``; refuse (UsageError) when the scenario or installed versions changed."""
    from harness.run import machine
    from harness.run.models import locate
    from harness.run.plan import build_plan, check_machine
    from harness.run.scenario import scenario_from_dict
    from harness.rundir import store

    run_dir = Path(args.resume)
    manifest = store.RunDir(run_dir).manifest()
    stored = scenario_from_dict(manifest.scenario, f"{run_dir}/manifest.json")
    overrides = _overrides(args)
    if args.scenario:
        wanted = load_scenario(args.scenario, overrides).effective()
    elif overrides:  # flags on top of the stored scenario (its file may be anywhere, not a name in scenarios/)
        data = json.loads(json.dumps(manifest.scenario))
        for dotted, value in overrides.items():
            *parents, leaf = dotted.split(".")
            node = data
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        wanted = scenario_from_dict(data, f"{run_dir}/manifest.json (with CLI overrides)").effective()
    if args.scenario or overrides:
        old, new = _flatten(stored.model_dump(mode="json")), _flatten(wanted.model_dump(mode="json"))
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        if changed:
            raise UsageError(f"cannot resume {run_dir}: the scenario changed ({', '.join(changed[:5])}); "
                             f"resume with the same scenario or start a new run")
    now, then = machine.versions(), manifest.versions
    changed = [f"{k} {then.get(k)} → {now.get(k)}" for k in ("vllm", "torch", "dsa_bench", "lm_eval", "python")
               if then.get(k) != now.get(k)]
    if changed:
        raise UsageError(f"cannot resume {run_dir}: installed versions changed ({'; '.join(changed)}); "
                         f"results would not be comparable — start a new run")
    try:  # resume rewrites the manifest and CSVs: refuse a read-only run dir before any server starts
        store.atomic_write_text(run_dir / ".write-test", "ok")
        (run_dir / ".write-test").unlink()
    except OSError as error:
        raise UsageError(f"cannot write to {run_dir} ({error.strerror or error}); resume needs a writable run "
                         f"directory — copy it somewhere writable and resume the copy") from None
    host = machine.detect()
    check_machine(stored, host)
    plan = build_plan(stored, host, locate(stored))
    _same_builds(plan, manifest, run_dir)
    return plan, run_dir, manifest


def _same_builds(plan, manifest, run_dir: Path) -> None:
    """Refuse (UsageError) a resume whose arms' vLLM builds changed since the run started (RECORD hash, version)."""
    from harness.run import builds

    builds.require(plan.arms)
    for arm in plan.arms:
        then = manifest.arm(arm.name).build if manifest.arm(arm.name) else None
        if then is None or then.error:
            continue
        now = builds.record(arm)
        if (now.get("version"), now.get("record_sha256")) != (then.version, then.record_sha256):
            raise UsageError(f"cannot resume {run_dir}: arm {arm.name}'s vLLM build changed ({then.version} → "
                             f"{now.get('version')}, RECORD {str(then.record_sha256)[:12]} → "
                             f"{str(now.get('record_sha256'))[:12]}); start a new run")


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): data}


def cmd_compare(args: argparse.Namespace) -> int:
    """Run both arms and write the run directory and report. Exit 0 when every level is done, 1 otherwise."""
    return run_compare(args)[0]


def run_compare(args: argparse.Namespace) -> tuple[int, Path]:
    """:func:`cmd_compare`'s work: (its exit code, the run directory)."""
    from rich.console import Console
    from rich.markup import escape

    from harness.run import procs
    from harness.run.runner import Runner, RunOptions
    from harness.run.start import new_run_dir

    from harness.run import accuracy

    from harness.rundir import store

    options = RunOptions(continue_on_error=args.continue_on_error, base_urls=_base_urls(args))
    if args.resume and store.RunDir(Path(args.resume)).manifest().status == "done":
        # a finished run: nothing to re-run, and its timing stays as measured
        Console(stderr=True).print(f"nothing to resume: {args.resume} is complete; its report and verdict stand "
                                   f"(dsa-bench report / gate {args.resume})")
        return 0, Path(args.resume)
    if args.resume:
        plan, run_dir, stored = _resume_plan(args)
    else:
        plan, _ = _build_plan(args, to_run=options.base_urls is None)
        run_dir, stored = None, None
        if plan.scenario.cluster.aa_check and options.base_urls is None:
            from harness.calibrate import run_aa_check

            options.aa_check = run_aa_check(args)
    if plan.scenario.accuracy.enabled:   # a wrong explicit data dir is an error before anything starts
        try:
            spec = plan.scenario.accuracy
            options.gsm8k = accuracy.resolve_data_dir(args.gsm8k_data, spec.data_dir, task=spec.task,
                                                      limit=spec.limit)
        except accuracy.AccuracyError as error:
            raise UsageError(str(error)) from None
    options.budget_s = args.budget if args.budget is not None else plan.scenario.workload.budget_s
    if run_dir is None:
        run_dir = new_run_dir(Path(args.out), plan.scenario.name)
    console = Console(stderr=True)
    console.print(f"dsa-bench: {plan.scenario.name} on {plan.machine.name} → {run_dir}")
    if options.gsm8k is not None and options.gsm8k.source == "skip":
        console.print(f"[yellow]{escape(options.gsm8k.reason)}[/] — give --gsm8k-data DIR (GSM8K train.jsonl + "
                      "test.jsonl), or --no-gsm8k to leave accuracy out of the verdict")
    procs.cleanup_on_exit()
    try:
        manifest = Runner(plan, run_dir, options, console, resume_manifest=stored).run()
    except (KeyboardInterrupt, procs.Interrupted):
        console.print(f"[red]interrupted[/]: finished levels are in {run_dir}")
        console.print(f"to run the rest: dsa-bench compare --resume {run_dir}")
        _conclude(run_dir, console)
        return 130, run_dir
    gate_code = _conclude(run_dir, console)
    timing = manifest["timing"]
    console.print(f"wall {timing['wall_s']:.0f} s, harness overhead {timing['harness_overhead_s']:.0f} s "
                  f"({100 * (timing['harness_share'] or 0):.1f} %); report: {run_dir / 'report.html'}")
    if manifest.get("estimate"):
        low, high = manifest["estimate"]["wall_s"]
        console.print(f"the plan estimated {low:.0f}–{high:.0f} s (manifest estimate vs timing)")
    if args.gate:
        return gate_code, run_dir
    return (0 if manifest["status"] == "done" else 1), run_dir


def _conclude(run_dir: Path, console) -> int:
    """Verdict (verdict.json, summary.md) then report.html, from the stored files. Returns the gate's exit code.

    A failure here loses nothing: the measurements are on disk and `dsa-bench gate/report RUN_DIR` can redo it."""
    from rich.markup import escape

    from harness.gate import exit_code, print_gate, run_gate
    from harness.render import render_report

    code = 4
    try:
        result = run_gate(run_dir)
        print_gate(result, console)
        code = exit_code(result)
    except Exception as error:  # noqa: BLE001
        console.print(f"[red]verdict failed ({escape(str(error))}); re-run `dsa-bench gate {run_dir}`[/]")
    try:
        render_report(run_dir)
    except Exception as error:  # noqa: BLE001
        console.print(f"[red]report rendering failed ({escape(str(error))}); re-run `dsa-bench report {run_dir}`[/]")
    return code


def cmd_report(args: argparse.Namespace) -> int:
    """Re-render ``report.html`` from a run directory's stored files."""
    from harness.render import render_report

    print(render_report(Path(args.run_dir)))
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    """Compute the verdict of a run directory; exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 4 INVALID."""
    from rich.console import Console

    from harness.gate import exit_code, load_policy, print_gate, run_gate

    policy = load_policy(Path(args.policy)) if args.policy else None
    result = run_gate(Path(args.run_dir), policy)
    print_gate(result, Console())
    if Path(args.run_dir, "report.html").exists():  # keep the report's verdict section in step with verdict.json
        from harness.rundir.store import RunDirError
        from harness.render import render_report

        try:
            render_report(Path(args.run_dir))
        except (RunDirError, OSError) as error:  # the verdict (e.g. INVALID on a corrupted CSV) keeps its exit code
            print(f"dsa-bench: report.html not updated: {error}", file=sys.stderr)
    return exit_code(result)


def cmd_import(args: argparse.Namespace) -> int:
    """Build a run directory from ``vllm bench serve --save-detailed`` JSON files listed in an index CSV."""
    from harness.run.importer import ImportInputError, import_run

    try:
        out = import_run(Path(args.index_csv), Path(args.out))
    except ImportInputError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"cannot write {args.out} ({error.strerror or error}); pass a writable --out") from None
    print(f"imported into {out}: not attested (gate it with a policy that says require_attestation = false, "
          f"e.g. dsa-bench gate {out} --policy FILE)")
    return 0


class _OneLineErrors(argparse.ArgumentParser):
    """argparse with a one-line usage error (``prog: error: … (see prog --help)``, exit 2) instead of the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``dsa-bench`` argument parser."""
    parser = _OneLineErrors(prog="dsa-bench", description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineErrors)
    compare = sub.add_parser(
        "compare", allow_abbrev=False, help="run baseline vs candidate on real vLLM and write a report")
    _add_scenario_flags(compare)
    compare.add_argument("--out", default=str(REPO_ROOT / "results"), help="results root (default: results/)")
    compare.add_argument("--continue-on-error", action="store_true", help="record a failed level and go on")
    compare.add_argument("--budget", type=_duration, metavar="TIME",
                         help="wall-clock budget for the measurements, e.g. 12m or 3h (default: workload.budget_s): no "
                              "session block starts that would end past it (with --max-sessions the run also stops at "
                              "PASS or FAIL)")
    compare.add_argument("--gate", action="store_true", help="run the gate at the end and exit with its code")
    compare.add_argument("--resume", metavar="RUN_DIR", help="re-run only the levels of RUN_DIR that are not done")
    compare.add_argument("--base-url-baseline", metavar="URL", help="benchmark an already running baseline server")
    compare.add_argument("--base-url-candidate", metavar="URL", help="benchmark an already running candidate server")
    compare.set_defaults(func=cmd_compare)
    plan = sub.add_parser(
        "plan", allow_abbrev=False, help="print each arm's server/benchmark commands and environment; run nothing")
    _add_scenario_flags(plan)
    views = plan.add_mutually_exclusive_group()
    views.add_argument("--verbose", action="store_true", help="every reason and every level's bench command")
    views.add_argument("--json", action="store_true", help="everything, as JSON")
    plan.set_defaults(func=cmd_plan)
    report = sub.add_parser(
        "report", allow_abbrev=False, help="re-render report.html from a run directory")
    report.add_argument("run_dir")
    report.set_defaults(func=cmd_report)
    gate = sub.add_parser(
        "gate", allow_abbrev=False, help="verdict of a run directory (exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 4 INVALID)")
    gate.add_argument("run_dir")
    gate.add_argument("--policy", help="TOML file with the [gate] policy fields")
    gate.set_defaults(func=cmd_gate)
    imported = sub.add_parser(
        "import", allow_abbrev=False,
        help="build a run directory from `vllm bench serve --save-detailed` JSON files listed in an index CSV")
    imported.add_argument("index_csv", help="CSV with columns arm, session, concurrency, path (relative to the CSV's "
                                            "folder) and optional round")
    imported.add_argument("--out", required=True, help="the new run directory (must not exist or be empty)")
    imported.set_defaults(func=cmd_import)
    from harness.calibrate import add_parser as add_calibrate

    calibrate = add_calibrate(sub)
    _add_scenario_flags(calibrate)
    calibrate.add_argument("--out", default=str(REPO_ROOT / "results"), help="results root (default: results/)")
    calibrate.add_argument("--budget", type=_duration, metavar="TIME", help="each run's budget, e.g. 12m")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dsa-bench`` console script. Returns the exit code."""
    from harness.gate import PolicyError
    from harness.run.plan import PlanError
    from harness.rundir.store import RunDirError
    from harness.run.start import RunError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ScenarioError, PlanError, RunError, RunDirError, PolicyError, UsageError) as error:
        print(f"dsa-bench: error: {error}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
