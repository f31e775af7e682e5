"""One comparison, typed end to end: a :class:`CompareRequest` → plan (or the stored plan of a resumed run) →
:class:`harness.run.runner.Runner` → conclusion (the gate's verdict, then the report) → a :class:`CompareResult`.

``dsa-bench compare`` (:mod:`harness.cli`), ``dsa-bench calibrate`` and the design study (:mod:`harness.study`) all
build a request and call :func:`run`; none of them passes an ``argparse.Namespace``. Bad input raises
:class:`UsageError` (or the scenario/plan/run errors :func:`harness.cli.main` prints as one line, exit 2) before any
server starts.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from harness.run import parity, text_prompts
from harness.run.gsm8k_data import AccuracyError
from harness.run.scenario import REPO_ROOT, apply_overrides, find_scenario, load_scenario

__all__ = ["UsageError", "CompareRequest", "CompareResult", "INTERRUPTED", "default_scenario", "build_plan", "run"]

INTERRUPTED = 130
"""The exit code of a comparison stopped by Ctrl-C or SIGTERM (finished levels stay on disk)."""


class UsageError(ValueError):
    """Bad input; the message is printed as one line and the exit code is 2."""


class CompareRequest(BaseModel):
    """What to compare and how: the scenario (a name in ``scenarios/`` or a TOML path; None: the machine's default,
    :func:`default_scenario`) with dotted ``overrides`` on top (``{"workload.repeats": 4}``), where the run directory
    goes (``out``), the measurement ``budget_s`` (seconds; None: ``workload.budget_s``), a run directory to
    ``resume``, ``base_urls`` (arm → URL of a server started by other tooling), whether the gate's exit code is the
    result's (``gate``), the GSM8K folder (``gsm8k_data``) and ``continue_on_error``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scenario: str | None = None
    overrides: dict[str, Any] = {}
    out: Path = REPO_ROOT / "results"
    budget_s: float | None = None
    resume: Path | None = None
    base_urls: dict[str, str] | None = None
    gate: bool = False
    gsm8k_data: Path | None = None
    continue_on_error: bool = False
    attribute: bool = False   # `dsa-bench attribute`: a scenario with [attribution] (and only such a one)

    @field_validator("base_urls")
    @classmethod
    def _both_servers(cls, urls: dict[str, str] | None) -> dict[str, str] | None:
        if urls is None:
            return None
        if set(urls) != {"baseline", "candidate"}:
            raise ValueError("--base-url-baseline and --base-url-candidate go together; give both servers' URLs")
        for arm, url in urls.items():
            if not re.fullmatch(r"https?://[^\s/]+(:\d+)?/?", url):
                raise ValueError(f"--base-url-{arm} {url!r} is not a server URL; use e.g. http://host:8000")
        return urls

    def scenario_name(self, machine_name: str) -> str:
        """The scenario asked for, or this machine's default for the requested TP size and quantization."""
        return self.scenario or default_scenario(machine_name, self.overrides.get("serve.tensor_parallel_size"),
                                                 self.overrides.get("serve.quantization"))


class CompareResult(BaseModel):
    """How a comparison ended: ``exit_code`` (0 every level done, 1 not, 130 interrupted; with ``gate``: the gate's
    0 PASS, 1 FAIL, 3 INCONCLUSIVE, 4 INVALID), its ``run_dir``, the run's ``status`` and the gate's code
    (``gate_code``; 4 when the verdict could not be computed; None: no run was made)."""

    exit_code: int
    run_dir: Path
    status: str | None = None
    gate_code: int | None = None


def default_scenario(machine_name: str, tp: int | None, quant: str | None) -> str:
    """The embedded default: ``cpu-tiny-dsa`` (a tiny DeepSeek-V3.2 served through dsa_route) without CUDA; on CUDA the
    headline GLM run unless TP 8 / FP8 asks for DeepSeek-V3.2."""
    if machine_name != "cuda":
        return "cpu-tiny-dsa"
    if tp == 8 or quant == "fp8":
        return "deepseek-v3.2-fp8-tp8"
    return "glm-5.2-nvfp4-tp4"


def build_plan(request: CompareRequest, *, to_run: bool):
    """Scenario + overrides → (plan, refusal). ``to_run``: refuse (PlanError) what this machine cannot run; otherwise
    plan for the scenario's platform and return the refusal as a note (None: none)."""
    from harness.run import builds, machine
    from harness.run.installed_vllm import auto_choice
    from harness.run.models import locate
    from harness.run.plan import PlanError, build_plan as plan_of, check_machine, planning_machine

    host = machine.detect()
    name = request.scenario_name(host.name)
    scenario = load_scenario(name, request.overrides).effective()
    source = str(find_scenario(name))
    if request.attribute != (scenario.attribution is not None):
        raise UsageError(f"scenario {scenario.name} declares [attribution]: run it with dsa-bench attribute"
                         if scenario.attribution is not None else
                         f"scenario {scenario.name} has no [attribution] factors; dsa-bench attribute needs them "
                         "(e.g. --scenario cpu-tiny-dsa-attribution)")
    if to_run:
        check_machine(scenario, host)
        if scenario.cluster.backend == "ray" and importlib.util.find_spec("ray") is None:
            raise UsageError('cluster.backend = "ray" needs Ray: pip install -e ".[ray]" (ray==2.60.0) on every node')
        location = locate(scenario)
        plan = replace(plan_of(scenario, host, location, auto_choice), scenario_file=source)
        builds.require(plan.arms)
        try:
            text_prompts.check_text_data(scenario)
        except AccuracyError as error:
            raise UsageError(str(error)) from None
        too_long = parity.length_error(scenario.parity, location.tokenizer, scenario.model.max_model_len)
        if too_long:
            raise UsageError(too_long)
        refusals = [f"arm {arm.name}: {why}" for arm in plan.arms for why in arm.refusals]
        if refusals:
            raise PlanError("; ".join(refusals))
        return plan, None
    location = locate(scenario)
    try:
        check_machine(scenario, host)
        refusal = parity.length_error(scenario.parity, location.tokenizer, scenario.model.max_model_len)
    except PlanError as error:
        refusal = str(error)
    planned = plan_of(scenario, planning_machine(scenario, host), location, auto_choice)
    return replace(planned, scenario_file=source), refusal


def _resume_plan(request: CompareRequest):
    """The stored plan of ``request.resume``: (plan, run_dir, manifest); refuse (UsageError) when the scenario or the
    installed versions changed, or the run directory is read-only."""
    from harness.run import machine
    from harness.run.models import locate
    from harness.run.plan import build_plan as plan_of, check_machine
    from harness.run.scenario import scenario_from_dict
    from harness.rundir import store

    run_dir = Path(request.resume)
    manifest = store.RunDir(run_dir).manifest()
    stored = scenario_from_dict(manifest.scenario, f"{run_dir}/manifest.json")
    if request.scenario:
        wanted = load_scenario(request.scenario, request.overrides).effective()
    elif request.overrides:  # flags on top of the stored scenario (its file may be anywhere, not a name in scenarios/)
        data = apply_overrides(json.loads(json.dumps(manifest.scenario)), request.overrides)
        wanted = scenario_from_dict(data, f"{run_dir}/manifest.json (with CLI overrides)").effective()
    if request.scenario or request.overrides:
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
        store.probe_writable(run_dir)
    except OSError as error:
        raise UsageError(f"cannot write to {run_dir} ({error.strerror or error}); resume needs a writable run "
                         f"directory — copy it somewhere writable and resume the copy") from None
    host = machine.detect()
    check_machine(stored, host)
    plan = plan_of(stored, host, locate(stored))
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


def _options(request: CompareRequest, plan):
    """The runner's options: failure policy, base URLs, budget, GSM8K data (a wrong explicit folder is a UsageError
    before anything starts)."""
    from harness.run import accuracy
    from harness.run.runner import RunOptions

    options = RunOptions(continue_on_error=request.continue_on_error, base_urls=request.base_urls)
    if plan.scenario.accuracy.enabled:
        spec = plan.scenario.accuracy
        try:
            options.gsm8k = accuracy.resolve_data_dir(None if request.gsm8k_data is None else str(request.gsm8k_data),
                                                      spec.data_dir, task=spec.task, limit=spec.limit)
        except accuracy.AccuracyError as error:
            raise UsageError(str(error)) from None
    options.budget_s = request.budget_s if request.budget_s is not None else plan.scenario.workload.budget_s
    return options


def run(request: CompareRequest) -> CompareResult:
    """Run both arms into a new run directory (or the rest of ``request.resume``), then the gate and the report."""
    from rich.console import Console
    from rich.markup import escape

    from harness.run import procs, runner
    from harness.run.start import new_run_dir
    from harness.rundir import store

    console = Console(stderr=True)
    if request.resume and store.RunDir(request.resume).manifest().status == "done":
        # a finished run: nothing to re-run, and its timing stays as measured
        console.print(f"nothing to resume: {request.resume} is complete; its report and verdict stand "
                      f"(dsa-bench report / gate {request.resume})")
        return CompareResult(exit_code=0, run_dir=request.resume, status="done")
    if request.resume:
        plan, run_dir, stored = _resume_plan(request)
    else:
        plan, _ = build_plan(request, to_run=request.base_urls is None)
        run_dir, stored = None, None
    options = _options(request, plan)
    if stored is None and plan.scenario.cluster.aa_check and request.base_urls is None:
        options.aa_check = run_aa_check(request)
    if run_dir is None:
        run_dir = new_run_dir(Path(request.out), plan.scenario.name)
    console.print(f"dsa-bench: {plan.scenario.name} on {plan.machine.name} → {run_dir}")
    if options.gsm8k is not None and options.gsm8k.source == "skip":
        console.print(f"[yellow]{escape(options.gsm8k.reason)}[/] — give --gsm8k-data DIR (GSM8K train.jsonl + "
                      "test.jsonl), or --no-gsm8k to leave accuracy out of the verdict")
    procs.cleanup_on_exit()
    try:
        manifest = runner.Runner(plan, run_dir, options, console, resume_manifest=stored).run()
    except (KeyboardInterrupt, procs.Interrupted):
        console.print(f"[red]interrupted[/]: finished levels are in {run_dir}")
        console.print(f"to run the rest: dsa-bench compare --resume {run_dir}")
        return CompareResult(exit_code=INTERRUPTED, run_dir=run_dir, gate_code=_conclusion(plan)(run_dir, console))
    gate_code = _conclusion(plan)(run_dir, console)
    timing = manifest.timing
    console.print(f"wall {timing['wall_s']:.0f} s, harness overhead {timing['harness_overhead_s']:.0f} s "
                  f"({100 * (timing['harness_share'] or 0):.1f} %); report: {run_dir / 'report.html'}")
    if manifest.estimate and manifest.estimate.wall_s:
        low, high = manifest.estimate.wall_s
        console.print(f"the plan estimated {low:.0f}–{high:.0f} s (manifest estimate vs timing)")
    done = 0 if manifest.status == "done" else 1
    note = exit_note(request.gate, done, gate_code, run_dir)
    if note:
        console.print(f"[dim]{escape(note)}[/]", highlight=False)
    return CompareResult(exit_code=gate_code if request.gate else done, run_dir=run_dir, status=manifest.status,
                         gate_code=gate_code)


def exit_note(gate: bool, done: int, gate_code: int, run_dir: Path) -> str | None:
    """The line that says which exit code ``compare`` returns when it is not the verdict's (``gate`` False and the
    two differ): the verdict line above it prints the gate's code, ``compare`` without ``--gate`` exits ``done``
    (0 every level done, 1 not). None when there is nothing to tell apart."""
    if gate or gate_code == done:
        return None
    state = "every level done" if done == 0 else "not every level done"
    return (f"dsa-bench compare exits {done} ({state}); the verdict's exit code {gate_code} is what "
            f"`dsa-bench gate {run_dir}` returns, and `compare --gate` in CI")


def aa_overrides(baseline: Any, inject: str | None) -> dict[str, Any]:
    """Dotted scenario overrides that make the candidate arm the baseline arm (``baseline``: its ArmSpec), with
    ``inject`` on the candidate (None: a plain A/A)."""
    return {"allow_identical_arms": True, "arms.candidate.route": baseline.route,
            "arms.candidate.extra_args": list(baseline.extra_args), "arms.candidate.env": dict(baseline.env),
            "arms.candidate.vllm": baseline.vllm, "arms.candidate.inject": inject,
            "arms.candidate.description": f"A/A copy of the baseline arm{f' with inject {inject}' if inject else ''}"}


def run_aa(request: CompareRequest, inject: str | None, extra: dict[str, Any] | None = None) -> tuple[int, Path]:
    """A gated comparison (:func:`run`) of ``request``'s scenario with the candidate made the baseline arm
    (:func:`aa_overrides`, ``inject`` on the candidate) and ``extra`` dotted overrides on top: (its exit code, its run
    directory). The A/A check, ``dsa-bench calibrate`` and the design study run their A/A pairs through it.

    Raises:
        KeyboardInterrupt: the comparison was interrupted (Ctrl-C, SIGTERM; its exit code 130) — so a caller running
            several never starts the next one.
    """
    from harness.run import machine

    name = request.scenario_name(machine.detect().name)
    overrides = {**request.overrides, **aa_overrides(load_scenario(name).arms["baseline"], inject), **(extra or {})}
    aa = request.model_copy(update={"scenario": name, "overrides": overrides, "gate": True, "resume": None,
                                    "continue_on_error": False, "base_urls": None})
    result = run(aa)
    if result.exit_code == INTERRUPTED:
        raise KeyboardInterrupt(f"interrupted: {result.run_dir}")
    return result.exit_code, result.run_dir


def run_aa_check(request: CompareRequest) -> dict[str, Any]:
    """``[cluster] aa_check``: before the A/B, an A/A run of the baseline arm on both arms' placements, not swapped
    (so a node or core-set effect shows instead of cancelling), in its own run directory and gated. Returns the A/B
    manifest's ``aa_check`` record: ``{run_dir, overall, reason}`` of that run's ``verdict.json``."""
    from harness.rundir.schema import VERDICT

    _, run_dir = run_aa(request, None, {"cluster.aa_check": False, "cluster.swap_nodes": False})
    verdict = json.loads((run_dir / VERDICT).read_text(encoding="utf-8"))
    return {"run_dir": str(run_dir), "overall": verdict.get("overall"), "reason": verdict.get("reason")}


def _conclusion(plan):
    """How a run ends: the gate's verdict and report (:func:`conclude`), or an attribution's effects
    (:func:`harness.attribution.conclude`)."""
    if plan.scenario.attribution is None:
        return conclude
    from harness.attribution import conclude as conclude_attribution

    return conclude_attribution


def conclude(run_dir: Path, console) -> int:
    """Verdict (verdict.json, summary.md) then report.html, from the stored files. Returns the gate's exit code
    (4 when the verdict failed).

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
