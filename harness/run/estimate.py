"""What a plan will cost before it runs: wall time (a min–max range) and GPU-hours. Pure: plan in, numbers out.

The model, per part (each with the low and the high end of a stated throughput prior, :data:`PRIORS`):

- server starts: sessions (one per arm and session block where each block is a fresh session —
  ``Scenario.fresh_session_per_block`` — else one per arm; ``harness.run.start.schedule``) × the start-up prior,
  counted once per block where concurrent servers start together (:func:`start_ups`);
- load levels: per arm and level, ``(num_prompts(c) + warmups) / min(c, saturation)`` waves, each one request's
  latency ``input_len / prefill_tok_s + output_len / decode_tok_s`` (decode_tok_s: one sequence's output rate;
  above ``saturation`` concurrent sequences the server is taken as compute-bound, so more concurrency adds waves,
  not throughput); with the duration floor ``workload.min_level_s`` a level takes at least that long (its count is
  set by a pilot at run time, harness.run.pilot), and the pilot adds one level per concurrency on one arm at the
  scenario's counts;
  under ``serve.duet`` both arms' levels run at the same time, so the arms' level time is one arm's;
- output parity: per arm (its first session; harness.run.runner collects it once), ``parity.n + parity.long_n`` greedy requests of ``parity.max_tokens`` tokens, all sent at once
  (harness.run.parity.collect), so ``ceil(n / saturation)`` waves;
- GSM8K: per arm, ``limit`` (None: the 1319-question test set, lm-eval task ``gsm8k``) questions of a
  ``GSM8K_PROMPT_TOKENS`` few-shot prompt and ``GSM8K_OUTPUT_TOKENS`` generated tokens (lm-eval's ``max_gen_toks``
  for gsm8k), ``num_concurrent`` at a time; task ``tiny-arith``: ``ARITH_PROMPT_TOKENS`` and ``ARITH_OUTPUT_TOKENS``
  (the longest 0-shot prompt and answer of its first 32 parity problems, measured on the committed checkpoint).

GPU-hours = wall hours × GPUs held: ``tensor_parallel_size`` per server, × the arms when both servers stay up.
The priors are assumptions, not measurements; ``dsa-bench compare`` records the estimate next to the actual timing
(manifest ``estimate`` and ``timing``) so they can be calibrated.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from harness.run.placement import start_together
from harness.run.plan import Plan
from harness.rundir.schema import LevelKey

GSM8K_TEST_QUESTIONS = 1319                     # GSM8K test split (Cobbe et al. 2021), lm-eval task "gsm8k"
GSM8K_PROMPT_TOKENS = 900                       # 5-shot chain-of-thought prompt + question, ≈ 150 tokens per example
GSM8K_OUTPUT_TOKENS = 256                       # lm-eval gsm8k generation_kwargs max_gen_toks
ARITH_PROMPT_TOKENS, ARITH_OUTPUT_TOKENS = 93, 70  # tiny-arith 0-shot: longest prompt / greedy answer of 32 problems


@dataclass(frozen=True)
class Prior:
    """Assumed throughput of one platform, each as (low, high): tokens/s and seconds. ``source`` says where from."""

    decode_tok_s: tuple[float, float]        # one sequence's output tokens/s
    prefill_tok_s: tuple[float, float]       # prompt tokens/s of one request
    saturation: int                          # concurrent sequences beyond which aggregate throughput stops growing
    server_start_s: tuple[float, float]      # spawn → first completion
    source: str


PRIORS = {
    "cpu": Prior(decode_tok_s=(120.0, 250.0), prefill_tok_s=(500.0, 2000.0), saturation=4,
                 server_start_s=(25.0, 65.0),
                 source="measured for the tiny CPU scenarios on 2 cores (cpu-tiny-dsa A/A runs, 2026-12-01: server "
                        "starts 24–65 s, median 26–40; one sequence decodes ≈ 130–220 tok/s with MTP); calibrate "
                        "against the manifest's timing"),
    "cuda": Prior(decode_tok_s=(80.0, 150.0), prefill_tok_s=(20000.0, 40000.0), saturation=256,
                  server_start_s=(300.0, 900.0),
                  source="assumed for a 600B-class MoE (GLM-5.x / DeepSeek-V3.2) at TP 4–8 on B200/H200 with MTP: "
                         "a batch-1 decode rate, a prefill rate and a compile + graph-capture start; not measured "
                         "here — calibrate against a run's manifest timing"),
}


@dataclass(frozen=True)
class Estimate:
    """Seconds as (min, max) per part and in all; ``gpus``: GPUs held for the wall time (0 on CPU)."""

    parts: dict[str, tuple[float, float]]
    wall_s: tuple[float, float]
    gpus: int
    gpu_hours: tuple[float, float]
    sessions: int
    prior: dict

    def to_dict(self) -> dict:
        """JSON-ready (manifest ``estimate``)."""
        return asdict(self)

    def line(self) -> str:
        """One line for the terminal."""
        hours = "" if not self.gpus else (f", {self.gpu_hours[0]:.1f}–{self.gpu_hours[1]:.1f} GPU-hours "
                                          f"({self.gpus} GPUs held)")
        parts = ", ".join(f"{name} {_duration(low)}–{_duration(high)}" for name, (low, high) in self.parts.items())
        return (f"estimate: wall {_duration(self.wall_s[0])}–{_duration(self.wall_s[1])}{hours}; "
                f"{self.sessions} server sessions; {parts}")


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _request_s(input_len: int, output_len: int, prior: Prior, end: int) -> float:
    """One request's latency (s) at the ``end`` (0: slow, 1: fast) of the prior."""
    return input_len / prior.prefill_tok_s[end] + output_len / prior.decode_tok_s[end]


def sessions(plan: Plan) -> int:
    """Server sessions the run starts (harness.run.start.schedule: one per arm and block, or both servers kept up)."""
    per_arm = plan.scenario.workload.repeats if plan.scenario.fresh_session_per_block() else 1
    return len(plan.arms) * per_arm


def start_ups(plan: Plan) -> int:
    """Start-ups one after the other: :func:`sessions`, or one per block where concurrent servers start together
    (:func:`harness.run.placement.start_together` on the arms' declared slots)."""
    slots = plan.scenario.cluster.slots([arm.name for arm in plan.arms])
    together = plan.scenario.serve.concurrent_servers and start_together(list(slots.values()), plan.machine.gpu_count)
    return sessions(plan) // len(plan.arms) if together else sessions(plan)


def _level_s(plan: Plan, key: LevelKey, prior: Prior, end: int) -> float:
    """One level at the scenario's count, warmups included (s)."""
    work = plan.scenario.workload
    waves = (work.num_prompts(key.level) + work.warmups) / min(key.concurrency, prior.saturation)
    return math.ceil(waves) * _request_s(key.level.input_len, key.level.output_len, prior, end)


def _levels_s(plan: Plan, prior: Prior, end: int) -> float:
    floor = plan.scenario.workload.min_level_s
    arms = 1 if plan.scenario.serve.duet else len(plan.arms)
    return arms * sum(max(_level_s(plan, key, prior, end), floor) for key in plan.levels())


def _pilot_s(plan: Plan, prior: Prior, end: int) -> float:
    """The pilot (harness.run.pilot): one level per level of the grid on one arm at the scenario's counts; 0 without a
    floor."""
    if not plan.scenario.workload.min_level_s:
        return 0.0
    return sum(_level_s(plan, key, prior, end) for key in plan.levels() if key.round == 0)


def _gsm8k_s(plan: Plan, prior: Prior, end: int) -> float:
    spec = plan.scenario.accuracy
    if not spec.enabled:
        return 0.0
    if spec.task == "tiny-arith":
        questions, lengths = spec.limit or 0, (ARITH_PROMPT_TOKENS, ARITH_OUTPUT_TOKENS)
    else:
        questions = GSM8K_TEST_QUESTIONS if spec.limit is None else min(spec.limit, GSM8K_TEST_QUESTIONS)
        lengths = (GSM8K_PROMPT_TOKENS, GSM8K_OUTPUT_TOKENS)
    waves = math.ceil(questions / min(spec.num_concurrent, prior.saturation))
    return len(plan.arms) * waves * _request_s(*lengths, prior, end)


def estimate(plan: Plan, prior: Prior | None = None) -> Estimate:
    """The cost of ``plan`` under ``prior`` (None: :data:`PRIORS` of the plan's machine)."""
    prior = prior or PRIORS["cuda" if plan.machine.name == "cuda" else "cpu"]
    count = sessions(plan)

    def parts_at(end: int) -> dict[str, float]:
        return {"server starts": start_ups(plan) * prior.server_start_s[1 - end],
                "load levels": _levels_s(plan, prior, end),
                "pilot": _pilot_s(plan, prior, end),
                "parity": len(plan.arms) * math.ceil(plan.scenario.parity.total / prior.saturation)
                * _request_s(0, plan.scenario.parity.max_tokens, prior, end),
                "GSM8K": _gsm8k_s(plan, prior, end)}

    slow, fast = parts_at(0), parts_at(1)
    ranges = {name: (round(fast[name], 1), round(slow[name], 1)) for name in slow if slow[name] > 0}
    wall = (round(sum(fast.values()), 1), round(sum(slow.values()), 1))
    serve = plan.scenario.serve
    gpus = 0 if plan.machine.name != "cuda" else serve.tensor_parallel_size * (
        len(plan.arms) if serve.concurrent_servers else 1)
    return Estimate(parts=ranges, wall_s=wall, gpus=gpus,
                    gpu_hours=(round(wall[0] * gpus / 3600, 2), round(wall[1] * gpus / 3600, 2)),
                    sessions=count, prior=asdict(prior))
