"""Verdict rates by simulation: experiments resampled from recorded repeats of one path (the A/A split: the same path
split in two), with an optional injected effect, decided by :mod:`harness.judge.verdict` and counted (:func:`simulate_gate`).

Rounds are resampled, not sessions, so a session effect is invisible here: the machine's figures and
:data:`~harness.judge.policy.RECOMMENDED_REPEATS` come from :mod:`harness.study.session_simulation` on recorded
sessions; this module serves the round-level proofs on ``tests/fixtures/recorded`` (``tests/test_verdict.py``).

Pure: functions of the ``levels.csv``/``requests.csv`` frames (schema: :mod:`harness.rundir.store`); no files, processes or
sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from harness.judge.policy import METRICS, GatePolicy, Status
from harness.metrics import succeeded
from harness.rundir.schema import Level
from harness.judge.verdict import CellInput, decide, overall

__all__ = ["RepeatPool", "repeat_pool", "SimulationResult", "simulate_gate"]


@dataclass(frozen=True)
class RepeatPool:
    """Recorded sweeps of one path, in time order, for resampling experiments.

    ``sweeps[i][level]`` = ``{"level": {column: value}, "request": {column: values}}`` of the i-th recorded repeat.
    """

    levels: tuple[int, ...]
    sweeps: tuple[dict[int, dict[str, dict[str, Any]]], ...]


def repeat_pool(levels, requests, arms: Sequence[str] = ("baseline",)) -> RepeatPool:
    """Collect the recorded repeats of ``arms`` (the same path) as a pool of sweeps in time order.

    With several arms (a recorded A/A run), repeat ``r`` contributes one sweep per arm, alternating ABBA.
    Only repeats present at every level are kept.
    """
    ok = succeeded(requests) if len(requests) else requests
    rows = levels[levels["arm"].astype(str).isin(arms)]
    level_list = tuple(sorted(Level.parse(v) for v in rows["level"].unique()))
    sweeps = []
    for repeat in sorted(int(r) for r in rows["round"].unique()):
        order = list(arms) if repeat % 2 == 0 else list(reversed(arms))
        for arm in order:
            sweep = {}
            for level in level_list:
                row = rows[(rows["arm"] == arm) & (rows["level"] == str(level)) & (rows["round"] == repeat)]
                if row.empty:
                    break
                frame = ok[(ok["arm"] == arm) & (ok["level"] == str(level)) & (ok["round"] == repeat)]
                sweep[level] = {
                    "level": row.iloc[-1].to_dict(),
                    "request": {c: frame[c].to_numpy(dtype=float)[np.isfinite(frame[c].to_numpy(dtype=float))]
                                for c in ("ttft_ms", "tpot_ms", "e2el_ms")},
                }
            else:
                sweeps.append(sweep)
    if len(sweeps) < 4:
        raise ValueError(f"the pool holds {len(sweeps)} complete sweeps; a split-in-two simulation needs ≥ 4")
    return RepeatPool(level_list, tuple(sweeps))


@dataclass(frozen=True)
class SimulationResult:
    """Verdict counts over ``n_sims`` simulated experiments of ``repeats`` paired repeats each."""

    counts: dict[str, int]
    n_sims: int
    repeats: int
    with_replacement: bool

    def rate(self, status: Status | str) -> float:
        return self.counts.get(str(status), 0) / self.n_sims


def simulate_gate(pool: RepeatPool, policy: GatePolicy, *, repeats: int, n_sims: int = 500, seed: int = 0,
                  throughput_factor: float = 1.0, latency_factor: float = 1.0,
                  n_resamples: int = 200) -> SimulationResult:
    """Verdict rates on experiments resampled from recorded data of one path (the A/A split: the same path split in two).

    Each experiment picks ``repeats`` of the pool's time-adjacent sweep pairs (0, 1), (2, 3), … without replacement
    (with replacement when the pool is too small, flagged in the result), and assigns the two sweeps of each pair to
    baseline and candidate at random — "the same arm split in two", paired as an ABBA run pairs them. An effect is
    injected by scaling the candidate: ``throughput_factor`` multiplies levels.csv throughputs, ``latency_factor``
    per-request latencies. Only levels.csv and requests.csv metrics can be simulated.

    ``n_resamples`` bootstrap resamples per cell suffice because the interval uses the bootstrap standard error.
    """
    unsupported = [n for n in policy.primary if METRICS[n].source not in ("level", "request")]
    if unsupported:
        raise ValueError(f"cannot simulate {unsupported} from levels.csv/requests.csv; drop them from the policy")
    rng = np.random.default_rng(seed)
    pairs = len(pool.sweeps) // 2
    with_replacement = pairs < repeats
    wanted = [lv for lv in pool.levels if policy.levels is None or lv in policy.levels]
    counts: dict[str, int] = {}
    for sim in range(n_sims):
        chosen = rng.choice(pairs, size=repeats, replace=with_replacement)
        swap = rng.random(repeats) < 0.5
        a_idx = [2 * p + int(s) for p, s in zip(chosen, swap)]
        b_idx = [2 * p + 1 - int(s) for p, s in zip(chosen, swap)]
        cells = []
        for name in policy.primary:
            spec = METRICS[name]
            for level in wanted:
                if spec.source == "level":
                    base = tuple(np.array([float(pool.sweeps[i][level]["level"][spec.column])]) for i in a_idx)
                    cand = tuple(np.array([float(pool.sweeps[i][level]["level"][spec.column]) * throughput_factor])
                                 for i in b_idx)
                else:
                    base = tuple(pool.sweeps[i][level]["request"][spec.column] for i in a_idx)
                    cand = tuple(pool.sweeps[i][level]["request"][spec.column] * latency_factor for i in b_idx)
                cells.append(CellInput(name, level, base, cand, tuple(range(repeats))))
        status, _ = overall(decide(cells, policy, n_resamples=n_resamples, seed=seed * 100_003 + sim))
        counts[str(status)] = counts.get(str(status), 0) + 1
    return SimulationResult(counts, n_sims, repeats, with_replacement)
