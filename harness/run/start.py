"""What a run starts from: its new run directory, the order of its levels (:func:`schedule`) and what of the
environment may be written down (secrets redacted), plus the clock and load readings the manifest records."""

from __future__ import annotations

import datetime as dt
import os
import random
from pathlib import Path
from typing import Any

from harness.judge.planning import baseline_first
from harness.rundir import store as rundir_store
from harness.run.plan import Plan
from harness.rundir.schema import Level


# Never written to the run directory or logs: any variable whose name contains one of these.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


class RunError(RuntimeError):
    """The run could not start (bad output dir, …); ``str(error)`` is one line for the user (exit code 2)."""


def load_avg() -> str:
    """The host's 1/5/15-minute load averages (runnable processes; compare with ``cpu_count``): noise context."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unavailable"


def now(timespec: str = "seconds") -> str:
    """UTC now in ISO 8601 (``timespec="milliseconds"`` for level start and end times, whose overlap matters)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec=timespec)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with values of secret-looking variables (API keys, tokens) replaced by ``<redacted>``."""
    return {k: ("<redacted>" if any(m in k.upper() for m in SECRET_MARKERS) else v) for k, v in env.items()}


def redacted_scenario(scenario: dict[str, Any]) -> dict[str, Any]:
    """The resolved scenario for the manifest with secret-looking env values (in ``serve.env`` and each arm's
    ``env``) replaced, so a key written into a scenario file never reaches the run dir or the report."""
    scenario["serve"]["env"] = redact_env(scenario["serve"]["env"])
    for arm in scenario["arms"].values():
        arm["env"] = redact_env(arm["env"])
    return scenario


def round_order(plan: Plan, round_: int) -> list[Level]:
    """The levels of round ``round_`` in run order: sorted (each regime's by concurrency), or
    (``workload.level_order = "shuffled"``) a permutation drawn from ``random.Random(f"{workload.seed}:{round_}")``
    — the same for both arms and on resume."""
    levels = sorted(plan.scenario.workload.levels())
    if plan.scenario.workload.level_order == "shuffled":
        random.Random(f"{plan.scenario.workload.seed}:{round_}").shuffle(levels)
    return levels


def schedule(plan: Plan) -> list[tuple[str, Level, int]]:
    """(arm, level, round) in run order, over :meth:`Plan.levels`, each round's levels in :func:`round_order`.

    Sequential servers: session blocks, each every arm one after the other in the order :func:`block_arms` draws
    (two arms: :func:`~harness.judge.planning.baseline_first`, ``workload.block_order``: a seeded coin per block, or
    ABBA); in a block one arm's server session measures ``workload.rounds_per_session`` consecutive rounds
    (:meth:`Plan.block_of`).
    Concurrent servers: both arms' servers are up together and alternate per level in ABBA order, so drift hits
    both arms alike; which arm starts each block's ABBA sequence is drawn like the sequential order (the arm that runs
    a level right after its own previous level is measured warm — up to ±25 % at one level on this 2-core VM — so a
    fixed sequence would tie that carryover to one arm at each level) — one session each for the run, or a fresh
    pair per session block
    (:meth:`~harness.run.scenario.Scenario.fresh_session_per_block`). Duet (``serve.duet``): the same order, each
    step's two entries (one per arm, same level and round) back to back; the runner sends them at the same time
    (:func:`harness.run.duet.steps`).
    """
    names = [arm.name for arm in plan.arms]
    rounds = range(plan.rounds())
    work = plan.scenario.workload
    blocks = range(work.repeats)
    if plan.scenario.serve.concurrent_servers:
        order = []
        for block in blocks:
            first = names if baseline_first(work.seed, block, work.block_order) else names[::-1]
            steps = [(c, r) for r in rounds if plan.block_of(r) == block for c in round_order(plan, r)]
            order += [(name, c, r) for step, (c, r) in enumerate(steps)
                      for name in (first if step % 2 == 0 else first[::-1])]
        return order
    return [(name, c, r) for block in blocks for name in block_arms(names, work.seed, block, work.block_order)
            for r in rounds if plan.block_of(r) == block for c in round_order(plan, r)]


def block_arms(names: list[str], seed: int, block: int, block_order: str = "random") -> list[str]:
    """The order of the arms' server sessions in sequential session block ``block``. Two arms: the baseline first or
    second by :func:`~harness.judge.planning.baseline_first` (a seeded coin, or ABBA). More (an attribution's
    generated arms): a permutation drawn from ``random.Random(f"{seed}:arms:{block}")``, new each block — every arm
    once per block, its position random, so drift within a block is not tied to one factor level."""
    if len(names) == 2:
        return names if baseline_first(seed, block, block_order) else names[::-1]
    order = list(names)
    random.Random(f"{seed}:arms:{block}").shuffle(order)
    return order


def new_run_dir(out_dir: Path, scenario_name: str) -> Path:
    """Create ``out_dir/<UTC timestamp>-<scenario>`` and prove it is writable.

    Raises:
        RunError: the directory cannot be created or written (nothing has been started).
    """
    run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S") + f"-{scenario_name}"
    run_dir = out_dir / run_id
    try:
        run_dir.mkdir(parents=True, exist_ok=False)
        rundir_store.probe_writable(run_dir)
    except OSError as error:
        raise RunError(f"cannot write results to {run_dir} ({error.strerror or error}); "
                       f"pass a writable directory with --out") from None
    return run_dir
