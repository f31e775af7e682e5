"""The duration floor ``workload.min_level_s``: a pilot sizes every level so its measured window lasts at least that.

A level's throughput is a mean over its window; a window of 1.4–7 s (the tiny CPU scenarios' levels) is dominated by
per-request noise and ramp-up/drain, a longer one averages it out. The prompt count must stay the same for both arms
and every round — the comparison is paired on identical workloads — so it is fixed once, before the first measured
level, from one pilot level per concurrency on the first server the schedule starts (any arm: the count depends on
the scenario's load, not on which path serves it), and recorded in the manifest (``pilot``,
:class:`harness.rundir.pilot.PilotRecord`); ``--resume`` reuses the recorded counts.

Sizing (:func:`size_level`): with the scenario's count ``n`` at concurrency ``c`` and the pilot's measured duration
``d`` (vLLM's ``duration``, warmups excluded), ``n' = max(n, ⌈n · S / d⌉ rounded up to a multiple of c)`` — every
wave of requests full — capped where the planned time ``d · n' / n`` would exceed ``level_timeout_s /``
:data:`~harness.run.workload_spec.LEVEL_TIMEOUT_HEADROOM`. Throughput per request is taken as constant in ``n`` (the
level is a closed loop at fixed concurrency), so a level's duration grows linearly with its count.

The pilot is not a measurement: its levels are not in ``levels.csv``; their raw JSON stays in ``raw/`` as
``pilot-<arm>-<level>.json`` (:func:`harness.run.plan.pilot_raw_name`). It does warm the first server a little more than
the other arm's first session (a few extra requests of other prompts before the first measured level's own warmups).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from harness.run.load import LevelError, read_bench_json
from harness.run.plan import ArmPlan, Plan, pilot_raw_name
from harness.run.run_manifest import ManifestWriter
from harness.run.workload_spec import LEVEL_TIMEOUT_HEADROOM
from harness.run.start import now
from harness.rundir import schema


class Sized(NamedTuple):
    """The count of one concurrency's measured levels and whether the timeout cap cut it."""

    num_prompts: int
    capped: bool


def size_level(num_prompts: int, concurrency: int, duration_s: float, min_level_s: float,
               level_timeout_s: float) -> Sized:
    """Prompts per measured level so that it lasts ≥ ``min_level_s`` seconds (module docstring).

    Args:
        num_prompts: the scenario's count at ``concurrency`` (the pilot sent it; the result is never below it).
        duration_s: the pilot level's measured duration in seconds (> 0).
        min_level_s: the floor in seconds (> 0).
        level_timeout_s: ``workload.level_timeout_s``; planned time stays ≤ it / ``LEVEL_TIMEOUT_HEADROOM``.

    Raises:
        ValueError: a non-positive count, concurrency, duration or floor.
    """
    if num_prompts < 1 or concurrency < 1 or not duration_s > 0 or not min_level_s > 0:
        raise ValueError(f"size_level needs positive values, got num_prompts={num_prompts}, "
                         f"concurrency={concurrency}, duration_s={duration_s}, min_level_s={min_level_s}")
    if duration_s >= min_level_s:
        return Sized(num_prompts, False)
    wanted = math.ceil(math.ceil(num_prompts * min_level_s / duration_s) / concurrency) * concurrency
    per_prompt_s = duration_s / num_prompts
    most = math.floor(level_timeout_s / LEVEL_TIMEOUT_HEADROOM / per_prompt_s / concurrency) * concurrency
    if wanted > most:
        return Sized(max(num_prompts, most), True)
    return Sized(wanted, False)


class Client(Protocol):
    """What the pilot needs of a load client (harness.run.load.LoadClient, a Ray node's RayLoadClient)."""

    def run(self, argv: list[str], log_path: Path, timeout_s: float) -> dict[str, Any]: ...


def run_pilot(plan: Plan, arm: ArmPlan, server: Any, client: Client, run_dir: Path,
              session: int | None) -> schema.PilotRecord:
    """One pilot level per level of ``plan``'s grid on ``arm``'s running ``server`` (``base_url``,
    ``served_model_name``); returns the manifest's ``pilot`` record. A pilot level that fails keeps the scenario's
    count at that concurrency (its ``error`` says why); the measured levels then fail or pass on their own."""
    work = plan.scenario.workload
    raw_dir = run_dir / schema.RAW_DIR
    raw_dir.mkdir(exist_ok=True)
    started, levels = time.monotonic(), []
    for grid_level in work.levels():
        count = work.num_prompts(grid_level)
        name = pilot_raw_name(arm.name, grid_level)
        argv = plan.pilot_argv(arm, grid_level, server.base_url, raw_dir, server.served_model_name)
        level = {"level": str(grid_level), "concurrency": grid_level.concurrency, "pilot_prompts": count,
                 "num_prompts": count, "raw": f"{schema.RAW_DIR}/{name}"}
        try:
            level.update(_measured(client, argv, run_dir / schema.LOGS_DIR / f"{arm.name}-pilot.log",
                                   raw_dir / name, work.level_timeout_s))
            level.update(size_level(count, grid_level.concurrency, level["duration_s"], work.min_level_s,
                                    work.level_timeout_s)._asdict())
        except (LevelError, ValueError) as error:
            level.update(error=str(error), raw=None)
        levels.append(level)
    return schema.PilotRecord(min_level_s=work.min_level_s, arm=arm.name, session=session, at=now(),
                              wall_s=round(time.monotonic() - started, 2), levels=levels)


def _measured(client: Client, argv: list[str], log_path: Path, raw_path: Path, timeout_s: float) -> dict[str, Any]:
    """Run one pilot level; its measured duration (seconds).

    Raises:
        LevelError: the client failed, timed out, or measured no duration (no request completed).
    """
    reply = client.run(argv, log_path, timeout_s)
    if not reply["ok"]:
        raise LevelError(f"pilot benchmark failed: {reply['error']}")
    bench = read_bench_json(raw_path)
    duration = bench.get("duration")
    if not bench.get("completed") or not isinstance(duration, (int, float)) or not duration > 0:
        raise LevelError(f"the pilot completed {bench.get('completed')} requests in {duration} s; nothing to size by")
    return {"duration_s": round(float(duration), 3)}



CAPPED_NOTE = ("The duration floor (workload.min_level_s) was capped at some concurrency: the count it asked for "
               "would not fit under workload.level_timeout_s with its headroom (manifest pilot, capped); raise "
               "level_timeout_s for the full floor.")


def apply(writer: ManifestWriter, plan: Plan, run_dir: Path) -> Plan:
    """``plan`` with the counts of the manifest's ``pilot``; its arms' ``bench_command`` (the first level's argv)
    rewritten with them, and :data:`CAPPED_NOTE` added to its ``notes`` when the cap cut a count."""
    record = writer.manifest.pilot
    sized = plan.with_prompt_counts(record.counts())
    first = sized.levels()[0]
    for arm in sized.arms:
        if writer.arm(arm.name).bench_command is not None:
            writer.update_arm(arm.name, bench_command=sized.bench_argv(
                arm, first, "http://127.0.0.1:<port>", run_dir / schema.RAW_DIR))
    if any(level.capped for level in record.levels):
        writer.add_note(CAPPED_NOTE)
    return sized
