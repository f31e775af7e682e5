"""``dsa-bench``: one CLI, subcommands ``compare``, ``plan``, ``report``, ``gate``, ``import``, ``calibrate``,
``attribute``.

The CLI builds one scenario object (file + flag overrides) and hands it to one entry point. Bad input ends with a
one-line error naming the fix and exit code 2, before anything is started.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from harness import compare
from harness.cli_flags import add_scenario_flags as _add_scenario_flags, compare_request, duration as _duration
from harness.cli_flags import overrides as _overrides
from harness.compare import CompareRequest, UsageError, build_plan
from harness.run.scenario import REPO_ROOT, ScenarioError
from harness.study.calibrate import add_parser as add_calibrate, cmd_calibrate as calibrate_with

USAGE_ERROR = 2


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the plan (compact; ``--verbose``: every reason and bench command; ``--json``: everything) and its cost
    estimate; start nothing."""
    from harness.render.designs import design_choice
    from harness.run import plan_view
    from harness.run.estimate import estimate
    from harness.rundir.schema import Platform

    plan, refusal = build_plan(CompareRequest(scenario=args.scenario, overrides=_overrides(args)), to_run=False)
    view = plan_view.as_json if args.json else plan_view.verbose if args.verbose else plan_view.compact
    design = design_choice(Platform.model_validate(plan.machine.to_dict()).identity(), plan.scenario.design)
    sys.stdout.write(view(plan, estimate(plan), refusal, design))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Run both arms and write the run directory and report (:func:`harness.compare.run`). Exit 0 when every level
    is done, 1 otherwise (``--gate``: the gate's code; 130 interrupted)."""
    urls = {arm: url for arm, url in (("baseline", args.base_url_baseline), ("candidate", args.base_url_candidate))
            if url}
    request = compare_request(args, resume=args.resume, base_urls=urls or None, gate=args.gate,
                              continue_on_error=args.continue_on_error)
    return compare.run(request).exit_code


def cmd_attribute(args: argparse.Namespace) -> int:
    """``dsa-bench attribute``: the factorial attribution of a scenario's ``[attribution]`` factors
    (:mod:`harness.attribution`). ``--plan``: the design, each generated arm's path and the cost; start nothing.
    ``--report PATH``: the effects of a finished run again (a run directory, or a stored ``attribution.json``). Exit 0
    when every level was measured, else 1."""
    from harness import attribution

    if args.report:
        return attribution.report(Path(args.report))
    if args.plan:
        plan, refusal = build_plan(CompareRequest(scenario=args.scenario, overrides=_overrides(args), attribute=True),
                                   to_run=False)   # a combination vLLM refuses raises PlanError (exit 2)
        sys.stdout.write(attribution.plan_text(plan, refusal))
        return 0
    return compare.run(compare_request(args, attribute=True)).exit_code


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``dsa-bench calibrate``: the scenario flags made into a request, then
    :func:`harness.study.calibrate.cmd_calibrate`."""
    return calibrate_with(args, compare_request(args))


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
        if message.endswith("expected one argument"):   # argparse reads a value such as -3m as another flag
            message += "; a value that starts with '-' goes after '=', e.g. --budget=12m"
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
    attribute = sub.add_parser(
        "attribute", allow_abbrev=False, help="factorial attribution: which knob of the change gives the effect")
    _add_scenario_flags(attribute)
    attribute.add_argument("--out", default=str(REPO_ROOT / "results"), help="results root (default: results/)")
    attribute.add_argument("--budget", type=_duration, metavar="TIME", help="wall-clock budget (default: "
                                                                            "workload.budget_s)")
    attribute.add_argument("--plan", action="store_true", help="print the design, every arm's path and the cost")
    attribute.add_argument("--report", metavar="PATH", help="compute the effects of a finished run again (its run "
                                                          "directory, or a stored attribution.json alone)")
    attribute.set_defaults(func=cmd_attribute, resume=None, continue_on_error=False)
    calibrate = add_calibrate(sub)
    _add_scenario_flags(calibrate)
    calibrate.add_argument("--out", default=str(REPO_ROOT / "results"), help="results root (default: results/)")
    calibrate.add_argument("--budget", type=_duration, metavar="TIME", help="each run's budget, e.g. 12m")
    calibrate.set_defaults(func=cmd_calibrate)
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
        print(f"dsa-bench {args.command}: error: {error}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
