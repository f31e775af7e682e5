"""The group-sequential design (:mod:`harness.judge.sequential`) on recorded server sessions: error rates including
every look, and sessions used, against the fixed design of the same maximum.

A simulated sequential run is :func:`harness.study.session_simulation.draw_run` with ``max_sessions`` blocks, judged
by the gate's own :func:`harness.judge.verdict.evaluate` after each block from ``min_sessions`` on
(:func:`~harness.study.session_simulation.judge_first`) and stopped at the first PASS or FAIL. A false FAIL at *any*
look counts, so the A/A rate is the design's real family-wise error under repeated looks.

:func:`shrink_noise` keeps the recording's noise *shape* (which rounds and sessions stalled, the tails) and scales its
*size*: every level row's deviation of log throughput from the pool's mean at its level is multiplied by
``target / pair`` (``pair``: the recorded paired-block sd, :func:`~harness.study.session_simulation.noise`), its
times (latencies, request start offsets, duration) by the inverse factor — the CPU recording at a GPU's spread (e.g. 2 %).

Pure apart from :func:`main` (``python -m harness.study.sequential_simulation --recording DIR``), which prints.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd

from harness.judge.policy import GatePolicy, Status
from harness.study.session_simulation import (LATENCY_LEVEL_COLUMNS, LATENCY_REQUEST_COLUMNS, THROUGHPUT_COLUMNS,
                                              SessionPool, clopper_pearson, draw_run, judge_first, noise)

__all__ = ["SequentialRates", "simulate_sequential", "shrink_noise"]

DECIDED = (Status.PASS, Status.FAIL)


@dataclass
class SequentialRates:
    """Outcomes of ``n_sims`` simulated sequential runs: final status → runs, and sessions per arm at the stop."""

    policy: GatePolicy
    throughput_factor: float
    n_sims: int
    counts: dict[str, int] = field(default_factory=dict)
    stops: list[int] = field(default_factory=list)

    def rate(self, status: Status | str) -> float:
        return self.counts.get(str(status), 0) / self.n_sims

    def interval(self, status: Status | str) -> tuple[float, float]:
        return clopper_pearson(self.counts.get(str(status), 0), self.n_sims)

    @property
    def mean_sessions(self) -> float:
        """Expected sessions per arm the design used (the fixed design always uses ``max_sessions``)."""
        return float(np.mean(self.stops))


def simulate_sequential(pool: SessionPool, policy: GatePolicy, *, n_sims: int, seed: int = 0,
                        throughput_factor: float = 1.0) -> SequentialRates:
    """Judge ``n_sims`` sequential runs of ``policy`` (its ``max_sessions`` must be set) on ``pool``.

    Raises ValueError when the policy is not sequential or the pool holds fewer than ``2 · max_sessions`` sessions.
    """
    if policy.max_sessions is None:
        raise ValueError("the policy is the fixed design: set max_sessions for a sequential simulation")
    rng = np.random.default_rng(seed)
    rates = SequentialRates(policy, throughput_factor, n_sims)
    for _ in range(n_sims):
        run = draw_run(pool, policy.max_sessions, rng)
        for m in range(policy.min_sessions, policy.max_sessions + 1):
            status = judge_first(pool, run, m, policy, throughput_factor=throughput_factor).status
            if status in DECIDED or m == policy.max_sessions:
                break
        rates.counts[str(status)] = rates.counts.get(str(status), 0) + 1
        rates.stops.append(m)
    return rates


def shrink_noise(pool: SessionPool, target: float, column: str = "output_throughput") -> SessionPool:
    """``pool`` with its log-``column`` deviations scaled so each level's paired-block sd is ``target``.

    A level row ``(concurrency c, round r)`` of value ``x`` gets the factor ``f = exp((s_c − 1)(log x − μ_c))``
    (``μ_c``: the pool's mean log value at ``c``, ``s_c = target / pair_c``) on its throughputs and ``1 / f`` on its
    times and its requests' times (so the achieved concurrency, Σ E2EL / span, is unchanged). Raises ValueError when a level's recorded paired sd is not positive."""
    scale = {row.concurrency: target / row.pair for row in noise(pool, column)}
    if any(not math.isfinite(s) or s <= 0 for s in scale.values()):
        raise ValueError(f"recorded paired sd must be positive at every level to scale it, got {scale}")
    centre = {c: float(np.mean([np.log(s.levels.loc[s.levels["concurrency"] == c, column].to_numpy(float)).mean()
                                for s in pool.sessions])) for c in pool.concurrency}
    return replace(pool, sessions=tuple(replace(s, **_shrunk(s.levels, s.requests, scale, centre, column))
                                        for s in pool.sessions))


def _shrunk(levels: pd.DataFrame, requests: pd.DataFrame, scale: dict[int, float], centre: dict[int, float],
            column: str) -> dict[str, pd.DataFrame]:
    levels, requests = levels.copy(), requests.copy()
    factors = np.exp([(scale[int(c)] - 1.0) * (math.log(x) - centre[int(c)])
                      for c, x in zip(levels["concurrency"], levels[column])])
    for name in THROUGHPUT_COLUMNS:
        levels[name] = levels[name] * factors
    for name in (*LATENCY_LEVEL_COLUMNS, "duration_s"):
        if name in levels.columns:
            levels[name] = levels[name] / factors
    by_round = {(int(c), int(r)): f for c, r, f in zip(levels["concurrency"], levels["round"], factors)}
    request_factor = [by_round.get((int(c), int(r)), 1.0) for c, r in zip(requests["concurrency"], requests["round"])]
    for name in (*LATENCY_REQUEST_COLUMNS, "start_s"):          # all of a round's times: its concurrency holds
        if name in requests.columns:
            requests[name] = requests[name] / np.asarray(request_factor)
    return {"levels": levels, "requests": requests}


def _pct(rate: float, ci: tuple[float, float]) -> str:
    return f"{100 * rate:5.1f} % [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def main(argv: Sequence[str] | None = None) -> int:
    """Print A/A false-FAIL (all looks), power and sessions used of the sequential design vs the fixed one."""
    from harness.study.session_simulation import session_pool
    from harness.rundir.store import RunDir

    parser = argparse.ArgumentParser(prog="python -m harness.study.sequential_simulation", description=main.__doc__)
    parser.add_argument("--recording", required=True, help="run directory of an A/A session recording")
    parser.add_argument("--min-sessions", type=int, default=4)
    parser.add_argument("--max-sessions", type=int, default=8)
    parser.add_argument("--spending", default="pocock", choices=("pocock", "obrien-fleming"))
    parser.add_argument("--spread", type=float, default=None,
                        help="scale the recorded noise to this paired-block sd of log throughput (e.g. 0.02)")
    parser.add_argument("--sims", type=int, default=200, help="simulated runs per figure")
    parser.add_argument("--loss", type=float, default=0.10, help="injected throughput loss for the power figure")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resamples", type=int, default=200, help="bootstrap resamples per cell")
    args = parser.parse_args(argv)
    store = RunDir(args.recording)
    pool = session_pool(store.manifest(), store.levels(numeric=True), store.requests(numeric=True))
    if args.spread is not None:
        pool = shrink_noise(pool, args.spread)
    base = GatePolicy(primary=("output_throughput", "mean_tpot_ms"), bootstrap_resamples=args.resamples,
                      min_sessions=args.min_sessions)
    sequential = base.model_copy(update={"max_sessions": args.max_sessions, "spending": args.spending})
    fixed = base.model_copy(update={"min_sessions": args.max_sessions, "max_sessions": args.max_sessions})
    print(f"recording {args.recording}: {len(pool.sessions)} sessions"
          + (f", noise scaled to a paired sd of {args.spread:g}" if args.spread is not None else ", noise as recorded"))
    for name, policy in (("sequential", sequential), ("fixed", fixed)):
        aa = simulate_sequential(pool, policy, n_sims=args.sims, seed=args.seed)
        loss = simulate_sequential(pool, policy, n_sims=args.sims, seed=args.seed + 1,
                                   throughput_factor=1.0 - args.loss)
        print(f"{name} ({policy.min_sessions}–{policy.max_sessions} sessions per arm, {args.sims} runs): "
              f"A/A FAIL {_pct(aa.rate('FAIL'), aa.interval('FAIL'))}, mean sessions {aa.mean_sessions:.2f}; "
              f"{100 * args.loss:g} % loss FAIL {_pct(loss.rate('FAIL'), loss.interval('FAIL'))}, "
              f"mean sessions {loss.mean_sessions:.2f}")
        print(f"    A/A verdicts {aa.counts}; loss verdicts {loss.counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
