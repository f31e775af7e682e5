"""``dsa-bench``: one CLI, subcommands ``compare``, ``plan``, ``report``, ``gate``.

The CLI builds one scenario object (file + flag overrides) and hands it to one entry point. Bad input ends with a
one-line error naming the fix and exit code 2, before anything is started.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

from harness.scenario import REPO_ROOT, ScenarioError, load_scenario

USAGE_ERROR = 2


class UsageError(ValueError):
    """Bad command-line input; the message is printed as one line and the exit code is 2."""


def _levels(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 1,2,4") from None


def _add_scenario_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scenario and overrides (flags override the scenario file)")
    group.add_argument("--scenario", help="scenario name in scenarios/ or a TOML path "
                                          "(default: cpu-tiny without CUDA; glm-5.2-nvfp4-tp4 with CUDA)")
    group.add_argument("--model", help="model path or Hugging Face id (overrides model.id)")
    group.add_argument("--tp", type=int, help="tensor parallel size (serve.tensor_parallel_size)")
    group.add_argument("--quant", help="quantization: none, fp8, nvfp4, … (serve.quantization)")
    group.add_argument("--kv-cache-dtype", help="auto, fp8, fp8_ds_mla, … (serve.kv_cache_dtype)")
    group.add_argument("--concurrency", type=_levels, help="levels, e.g. 1,2,4 (workload.concurrency)")
    group.add_argument("--num-prompts", type=int, help="prompts per level (at least one per concurrent slot)")
    group.add_argument("--input-len", type=int, help="random-dataset input tokens (workload.input_len)")
    group.add_argument("--output-len", type=int, help="output tokens per request (workload.output_len)")
    group.add_argument("--repeats", type=int, help="sweeps per arm (workload.repeats)")
    mtp = group.add_mutually_exclusive_group()
    mtp.add_argument("--mtp", type=int, metavar="K", help="MTP with K speculative tokens")
    mtp.add_argument("--no-mtp", action="store_true", help="turn MTP off")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    mapping = {
        "model": "model.id", "tp": "serve.tensor_parallel_size", "quant": "serve.quantization",
        "kv_cache_dtype": "serve.kv_cache_dtype", "concurrency": "workload.concurrency",
        "input_len": "workload.input_len", "output_len": "workload.output_len", "repeats": "workload.repeats",
        "mtp": "mtp.num_speculative_tokens",
    }
    overrides = {key: getattr(args, flag) for flag, key in mapping.items() if getattr(args, flag) is not None}
    if args.no_mtp:
        overrides["mtp.num_speculative_tokens"] = 0
    if args.num_prompts is not None:
        overrides["workload.min_prompts"] = args.num_prompts
        overrides["workload.prompts_per_concurrency"] = 1
    return overrides


def default_scenario(machine_name: str, tp: int | None, quant: str | None) -> str:
    """The embedded default: ``cpu-tiny`` without CUDA; on CUDA the headline GLM run unless TP 8 / FP8 asks for
    DeepSeek-V3.2."""
    if machine_name != "cuda":
        return "cpu-tiny"
    if tp == 8 or quant == "fp8":
        return "deepseek-v3.2-fp8-tp8"
    return "glm-5.2-nvfp4-tp4"


def _build_plan(args: argparse.Namespace, *, to_run: bool):
    """Scenario + overrides → plan. ``to_run``: refuse (PlanError) what this machine cannot run; otherwise plan for
    the scenario's platform and return the refusal as a note."""
    from harness import machine
    from harness.plan import PlanError, build_plan, check_machine, planning_machine

    host = machine.detect()
    name = args.scenario or default_scenario(host.name, args.tp, args.quant)
    scenario = load_scenario(name, _overrides(args))
    if to_run:
        check_machine(scenario, host)
        return build_plan(scenario, host), None
    try:
        check_machine(scenario, host)
        refusal = None
    except PlanError as error:
        refusal = str(error)
    return build_plan(scenario, planning_machine(scenario, host)), refusal


def cmd_plan(args: argparse.Namespace) -> int:
    """Print each arm's decision, reasons, server command + env and benchmark command; start nothing."""
    plan, refusal = _build_plan(args, to_run=False)
    out = sys.stdout
    out.write(f"scenario: {plan.scenario.name} on {plan.machine.name} ({plan.machine.device})\n")
    if refusal:
        out.write(f"note: `dsa-bench compare` would refuse on this machine: {refusal}\n")
    for note in plan.notes:
        out.write(f"note: {note}\n")
    for arm in plan.arms:
        out.write(f"\n== arm {arm.name} (route={arm.route}) ==\n")
        for reason in arm.decision.get("reasons", []):
            out.write(f"  reason: {reason}\n")
        for item in arm.unavailable:
            out.write(f"  not available on this platform: {item}\n")
        out.write(f"  intended path: {json.dumps(arm.intended)}\n")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(arm.server_env.items()))
        out.write(f"  server env: {env}\n")
        out.write(f"  server: {shlex.join(arm.server_argv('<port>'))}\n")
        for concurrency, repeat in plan.levels():
            argv = plan.bench_argv(arm, concurrency, repeat, "http://127.0.0.1:<port>", Path("<run-dir>/raw"))
            out.write(f"  bench c={concurrency} r={repeat}: {shlex.join(argv)}\n")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Run both arms and write the run directory and report. Exit 0 when every level is done, 1 otherwise."""
    from rich.console import Console

    from harness import procs
    from harness.runner import Runner, RunOptions, new_run_dir

    plan, _ = _build_plan(args, to_run=True)
    console = Console(stderr=True)
    run_dir = new_run_dir(Path(args.out), plan.scenario.name)
    console.print(f"dsa-bench: {plan.scenario.name} on {plan.machine.name} → {run_dir}")
    procs.cleanup_on_exit()
    try:
        manifest = Runner(plan, run_dir, RunOptions(out_dir=Path(args.out),
                                                    continue_on_error=args.continue_on_error), console).run()
    except (KeyboardInterrupt, procs.Interrupted):
        console.print(f"[red]interrupted[/]: finished levels are in {run_dir}")
        _render(run_dir, console)
        return 130
    _render(run_dir, console)
    timing = manifest["timing"]
    console.print(f"wall {timing['wall_s']:.0f} s, harness overhead {timing['harness_overhead_s']:.0f} s "
                  f"({100 * (timing['harness_share'] or 0):.1f} %); report: {run_dir / 'report.html'}")
    if args.gate:
        from harness.gate import exit_code, print_gate, run_gate

        result = run_gate(run_dir)
        print_gate(result, console)
        return exit_code(result)
    return 0 if manifest["status"] == "done" else 1


def _render(run_dir: Path, console) -> None:
    from harness.report import render_report

    try:
        render_report(run_dir)
    except Exception as error:  # noqa: BLE001 — the data is on disk; `dsa-bench report` can retry
        console.print(f"[red]report rendering failed ({error}); re-run `dsa-bench report {run_dir}`[/]")


def cmd_report(args: argparse.Namespace) -> int:
    """Re-render ``report.html`` from a run directory's stored files."""
    from harness.report import render_report

    print(render_report(Path(args.run_dir)))
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    """Compute the verdict of a run directory; exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 4 INVALID."""
    from rich.console import Console

    from harness.gate import exit_code, load_policy, print_gate, run_gate

    policy = load_policy(Path(args.policy)) if args.policy else None
    result = run_gate(Path(args.run_dir), policy)
    print_gate(result, Console())
    return exit_code(result)


def build_parser() -> argparse.ArgumentParser:
    """The ``dsa-bench`` argument parser."""
    parser = argparse.ArgumentParser(prog="dsa-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    compare = sub.add_parser("compare", help="run baseline vs candidate on real vLLM and write a report")
    _add_scenario_flags(compare)
    compare.add_argument("--out", default=str(REPO_ROOT / "results"), help="results root (default: results/)")
    compare.add_argument("--continue-on-error", action="store_true", help="record a failed level and go on")
    compare.add_argument("--gate", action="store_true", help="run the gate at the end and exit with its code")
    compare.set_defaults(func=cmd_compare)
    plan = sub.add_parser("plan", help="print each arm's server/benchmark commands and environment; run nothing")
    _add_scenario_flags(plan)
    plan.set_defaults(func=cmd_plan)
    report = sub.add_parser("report", help="re-render report.html from a run directory")
    report.add_argument("run_dir")
    report.set_defaults(func=cmd_report)
    gate = sub.add_parser("gate", help="verdict of a run directory (exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 4 INVALID)")
    gate.add_argument("run_dir")
    gate.add_argument("--policy", help="TOML file with the [gate] policy fields")
    gate.set_defaults(func=cmd_gate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dsa-bench`` console script. Returns the exit code."""
    from harness.plan import PlanError
    from harness.records import RunDirError
    from harness.runner import RunError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ScenarioError, PlanError, RunError, RunDirError, UsageError) as error:
        print(f"dsa-bench: error: {error}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
