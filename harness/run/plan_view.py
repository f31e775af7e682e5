"""``dsa-bench plan``'s three views of a plan: compact (default, ≤ 60 lines for any shipped scenario), verbose (every
level's bench command) and JSON (everything, machine-readable). Pure: plan and estimate in, text out."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from pathlib import Path

from harness.run.estimate import Estimate
from harness.run.plan import ArmPlan, Plan


def _arm_lines(arm: ArmPlan, *, reasons: bool) -> list[str]:
    lines = ["", f"== arm {arm.name} (route={arm.route}) =="]
    if arm.intended.get("injection"):
        lines.append(f"  injected: {arm.intended['injection']} (calibration injection, applied by the dsa_route plugin)")
    if reasons:
        lines += [f"  reason: {reason}" for reason in arm.decision.reasons]
    else:
        decision = arm.decision
        lines.append(f"  decision: model_runner={decision.model_runner} "
                     f"breakable_cudagraph={int(bool(decision.breakable_cudagraph))} "
                     f"compilation_mode={decision.compilation_mode} "
                     f"mtp={decision.mtp_architecture or 'none'} "
                     f"impl={json.dumps(dict(decision.implementation), separators=(',', ':'))}")
    lines += [f"  not available on this platform: {item}" for item in arm.unavailable]
    lines.append(f"  intended path: {json.dumps(arm.intended)}")
    lines.append(f"  server env: {' '.join(f'{k}={shlex.quote(v)}' for k, v in sorted(arm.server_env.items()))}")
    lines.append(f"  server: {shlex.join(arm.server_argv('<port>'))}")
    return lines


def _header(plan: Plan, refusal: str | None, design: str | None, command: str) -> list[str]:
    """The scenario and machine, which machine's study chose the run design (``design``:
    :func:`harness.render.designs.design_choice`; None: not looked up), refusals (what ``command``, e.g.
    ``"dsa-bench compare"``, would refuse) and notes."""
    lines = [f"scenario: {plan.scenario.name} on {plan.machine.name} ({plan.machine.device})"]
    if design is not None:
        lines.append(f"run design: {design}")
    if refusal:
        lines.append(f"note: `{command}` would refuse on this machine: {refusal}")
    lines += [f"note: {note}" for note in plan.notes]
    lines += [f"warning: arm {arm.name}: {why} (`{command}` refuses this)"
              for arm in plan.arms for why in arm.refusals]
    return lines


def _grid_lines(plan: Plan) -> list[str]:
    """The level grid: one line per regime (its tokens in → out, dataset, concurrencies and prompt counts), every
    level in one run, one schedule and one verdict."""
    work = plan.scenario.workload
    levels = work.levels()
    lines = [f"levels: {len(levels)} (regime × concurrency) × rounds 0..{plan.rounds() - 1} = {len(plan.levels())} "
             f"per arm ({_order_text(plan)}; levels {work.level_order} per round)"]
    for regime in plan.regimes():
        mine = [level for level in levels if level.regime == regime]
        counts = ", ".join(f"c={level.concurrency}:{work.num_prompts(level)}" for level in mine)
        lines.append(f"  tokens {regime.label()}: prompts per level {counts} (+{work.warmups} warmups)")
    if work.min_level_s:
        lines.append(f"  prompts per level: ≥ {work.min_level_s:g} s per level, counts set by a pilot (one level each "
                     f"at the counts above on the first server started; never fewer, a multiple of c, the same for "
                     f"both arms and every round)")
    return lines + [_placement_line(plan)]


def _order_text(plan: Plan) -> str:
    """How servers and arms take turns: sequential blocks, concurrent servers (one session or a fresh pair per
    block), or a duet (both arms loaded at once)."""
    serve, work = plan.scenario.serve, plan.scenario.workload
    if not serve.concurrent_servers:
        return (f"one server session per arm and block of {work.rounds_per_session} round(s), "
                f"{'ABBA' if work.block_order == 'abba' else 'seeded random'} arm order per block")
    sessions = (f"a fresh pair of sessions per block of {work.rounds_per_session} round(s)"
                if plan.scenario.fresh_session_per_block() else "one session each for the run")
    turns = "both arms loaded at once per level (duet)" if serve.duet else "arms alternate per level (ABBA)"
    return f"both servers up together, {sessions}; {turns}"


def _placement_line(plan: Plan) -> str:
    """Where each arm runs in blocks 0 and 1 (``[cluster]``)."""
    spec = plan.scenario.cluster
    slots = spec.slots([arm.name for arm in plan.arms])
    if len(slots) > 2 and len({slot.describe() for slot in slots.values()}) == 1:
        where = f"every arm: {next(iter(slots.values())).describe()}, one server at a time"
    else:
        where = "; ".join(f"{name}: {slot.describe()}" for name, slot in slots.items())
    address = f" at {spec.address}" if spec.backend == "ray" else ""
    return (f"placement ({spec.backend}{address}): {where}"
            + (" — swapped every other block" if spec.swap_nodes else ""))


def compact(plan: Plan, estimate: Estimate, refusal: str | None = None, design: str | None = None,
            command: str = "dsa-bench compare") -> str:
    """Decision + server command per arm, one bench template, the level × round grid and the estimate; refusals
    are what ``command`` would refuse."""
    lines = _header(plan, refusal, design, command)
    for arm in plan.arms:
        lines += _arm_lines(arm, reasons=False)
    lines += [""] + [f"bench {regime.label()} (each arm, each level; --verbose lists them): "
                     f"{shlex.join(plan.bench_template(plan.arms[0], regime))}" for regime in plan.regimes()]
    lines += _grid_lines(plan)
    lines += ["", estimate.line(), f"prior: {estimate.prior['source']}"]
    return "\n".join(lines) + "\n"


def verbose(plan: Plan, estimate: Estimate, refusal: str | None = None, design: str | None = None) -> str:
    """Every reason, and every level's bench command per arm."""
    lines = _header(plan, refusal, design, "dsa-bench compare")
    for arm in plan.arms:
        lines += _arm_lines(arm, reasons=True)
        for key in plan.levels():
            argv = plan.bench_argv(arm, key, "http://127.0.0.1:<port>", Path("<run-dir>/raw"))
            lines.append(f"  bench {plan.label(key.level)} r={key.round}: {shlex.join(argv)}")
    lines += [""] + _grid_lines(plan) + ["", estimate.line(), f"prior: {estimate.prior['source']}"]
    return "\n".join(lines) + "\n"


def as_json(plan: Plan, estimate: Estimate, refusal: str | None = None, design: str | None = None) -> str:
    """Everything: scenario, machine, notes, arms (decision, env, server argv), every level's bench argv, estimate."""
    levels = []
    for key in plan.levels():
        levels.append({
            "key": str(key), "level": str(key.level), "regime": str(key.level.regime), "dataset": key.level.dataset,
            "concurrency": key.concurrency, "round": key.round, "input_len": key.level.input_len,
            "output_len": key.level.output_len, "num_prompts": plan.num_prompts(key.level),
            "num_prompts_set_by_pilot": bool(plan.scenario.workload.min_level_s),
            "bench_argv": {arm.name: plan.bench_argv(arm, key, "http://127.0.0.1:<port>", Path("<run-dir>/raw"))
                           for arm in plan.arms}})
    document = {
        "scenario": plan.scenario.model_dump(mode="json"), "scenario_file": plan.scenario_file,
        "machine": plan.machine.to_dict(), "design": design, "refusal": refusal, "notes": list(plan.notes),
        "arms": [{**asdict(arm), "server_argv": arm.server_argv("<port>")} for arm in plan.arms],
        "levels": levels, "estimate": estimate.to_dict(),
    }
    return json.dumps(document, indent=2) + "\n"
