"""The verdict against realistic regressions (issue #24), measured on the recorded server sessions with injected
effects: ``python -m harness.study.regression --out results/statistics``.

Every figure judges simulated runs with the gate's own :func:`harness.judge.verdict.evaluate`. A run draws whole
recorded A/A sessions (:func:`harness.study.session_simulation.draw_run`: ``2 n`` of them, random block order), so
between-session variance, stalls and tails are the recording's, not a noise model; the recorded noise is scaled to a
paired-block sd of ``--spread`` (:func:`harness.study.sequential_simulation.shrink_noise`: the CPU recording at a GPU's
spread; its shape kept). An effect is injected into the candidate's rows only:

- ``uniform``/``local``: throughputs × f and times ÷ f at every level / at the levels named;
- ``latency``: TPOT (and ITL) × f, throughput unchanged (the size of the request-metric cell at its margin);
- ``stalls``: each candidate round (one level of one round) independently with probability p is a stall: × f as above.

The recording holds two levels (c = 1, 4). The four-level runs join recorded session ``k`` and ``k + S/2`` into one
session whose levels are c = 1, 4 (the first) and 2, 8 (the second, relabelled; their achieved concurrency is not the
label, so the study's policy turns the achieved-concurrency check off): 18 four-level sessions, so a run of 8 per arm
uses 16 of them and its variety comes mostly from the block order — the levels of one virtual session are less
correlated than a real session's (ρ between the two halves ≈ the between-session one).

The sequential-versus-fixed figures gate output throughput alone on the recorded two levels: the recording's mean
TPOT is far noisier than its throughput once the throughput is scaled to 2 % (the scaling acts on throughput
deviations; a round's TPOT keeps its own request-level noise), so with TPOT primary no design PASSes an equal
candidate and the comparison would say nothing.

Outcomes are counted with Clopper–Pearson 95 % intervals and written as JSON (one file per figure) and a README.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.study import session_simulation as sim
from harness.judge.policy import GatePolicy, Status
from harness.rundir.schema import Level
from harness.study.sequential_simulation import shrink_noise
from harness.judge.verdict import evaluate
from harness.rundir.schema import Manifest

RECORDING = "tests/fixtures/recorded/real-sessions"
PRIMARY = ("output_throughput", "mean_tpot_ms")
TPOT_REQUEST_COLUMNS = ("tpot_ms",)
TPOT_LEVEL_COLUMNS = ("mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms")


@dataclass(frozen=True)
class Effect:
    """What the candidate's rows carry: ``kind`` (module docstring), ``factor``, the ``levels`` of a local effect,
    the stall ``probability``."""

    kind: str = "none"
    factor: float = 1.0
    levels: tuple[int, ...] = ()
    probability: float = 0.0

    def describe(self) -> str:
        if self.kind == "none":
            return "equal candidate (A/A)"
        if self.kind == "stalls":
            return f"candidate rounds stall with p = {self.probability:g} at × {self.factor:g}"
        where = f" at c = {', '.join(map(str, self.levels))}" if self.levels else " at every level"
        return f"{self.kind} × {self.factor:g}{where}"


def four_level_pool(pool: sim.SessionPool) -> sim.SessionPool:
    """Sessions ``k`` and ``k + S/2`` joined (module docstring): levels c of the second become 2 c."""
    half = len(pool.sessions) // 2
    joined = []
    for first, second in zip(pool.sessions[:half], pool.sessions[half:2 * half]):
        rounds = dict(zip(second.rounds, first.rounds))
        parts = []
        for frame in (second.levels, second.requests):
            frame = frame.copy()
            frame["concurrency"] = frame["concurrency"] * 2
            frame["level"] = [str(Level.parse(v).regime.at(int(c)))
                              for v, c in zip(frame["level"], frame["concurrency"])]
            frame["round"] = frame["round"].map(rounds)
            frame["arm"], frame["session"] = first.arm, first.index
            parts.append(frame)
        joined.append(replace(first, levels=pd.concat([first.levels, parts[0]], ignore_index=True),
                              requests=pd.concat([first.requests, parts[1]], ignore_index=True)))
    levels = tuple(sorted({*pool.concurrency, *(2 * c for c in pool.concurrency)}))
    manifest = json.loads(json.dumps(pool.manifest))
    manifest["scenario"]["workload"]["concurrency"] = list(levels)
    return sim.SessionPool(tuple(joined), levels, pool.rounds_per_session, manifest)


def _scale(levels: pd.DataFrame, requests: pd.DataFrame, rows: pd.Series, request_rows: pd.Series, kind: str,
           factor: float) -> None:
    """In place: ``rows``/``request_rows`` (boolean masks) carry a throughput change (× factor, times ÷ factor) or,
    for ``latency``, TPOT × factor."""
    if kind == "latency":
        for column in TPOT_LEVEL_COLUMNS:
            levels.loc[rows, column] *= factor
        for column in TPOT_REQUEST_COLUMNS:
            requests.loc[request_rows, column] *= factor
        return
    for column in sim.THROUGHPUT_COLUMNS:
        levels.loc[rows, column] *= factor
    for column in sim.LATENCY_LEVEL_COLUMNS:
        if column in levels.columns:
            levels.loc[rows, column] /= factor
    for column in sim.LATENCY_REQUEST_COLUMNS:
        if column in requests.columns:
            requests.loc[request_rows, column] /= factor


def inject(levels: pd.DataFrame, requests: pd.DataFrame, effect: Effect, rng: np.random.Generator
           ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's tables with ``effect`` in the candidate's rows (copies)."""
    levels, requests = levels.copy(), requests.copy()
    cand, cand_requests = levels["arm"] == "candidate", requests["arm"] == "candidate"
    if effect.kind in ("uniform", "local", "latency"):
        at = levels["concurrency"].isin(effect.levels) if effect.levels else True
        at_requests = requests["concurrency"].isin(effect.levels) if effect.levels else True
        _scale(levels, requests, cand & at, cand_requests & at_requests, effect.kind, effect.factor)
    elif effect.kind == "stalls":
        stalled = cand & (rng.random(len(levels)) < effect.probability)
        keys = set(zip(levels.loc[stalled, "concurrency"], levels.loc[stalled, "round"]))
        hit = cand_requests & pd.Series([k in keys for k in zip(requests["concurrency"], requests["round"])],
                                        index=requests.index)
        _scale(levels, requests, stalled, hit, "uniform", effect.factor)
    return levels, requests


def _first(manifest: Manifest, levels: pd.DataFrame, requests: pd.DataFrame, m: int
           ) -> tuple[Manifest, pd.DataFrame, pd.DataFrame]:
    """The tables of a run's first ``m`` blocks (a sequential look)."""
    data = manifest.model_dump(mode="json")
    data["scenario"]["workload"]["repeats"] = m
    for arm in data["arms"]:
        arm["levels"] = {k: v for k, v in arm["levels"].items() if v.get("session", 0) < m}
        arm["sessions"] = arm["sessions"][:m]
    return (Manifest.model_validate(data), levels[levels["session"] < m], requests[requests["session"] < m])


@dataclass
class Outcome:
    """Counts over ``runs``: overall status, and per primary cell (``metric c=level`` / ``metric pooled``) status."""

    runs: int = 0
    overall: dict[str, int] | None = None
    cells: dict[str, dict[str, int]] | None = None
    sessions_used: list[int] | None = None

    def add(self, verdict, m: int) -> None:
        self.runs += 1
        self.overall = self.overall or {}
        self.cells = self.cells or {}
        self.sessions_used = (self.sessions_used or []) + [m]
        self.overall[str(verdict.status)] = self.overall.get(str(verdict.status), 0) + 1
        for cell in verdict.cells:
            if cell.primary:
                name = f"{cell.metric} " + ("pooled" if cell.pooled else f"c={cell.level}")
                counts = self.cells.setdefault(name, {})
                counts[str(cell.status)] = counts.get(str(cell.status), 0) + 1

    def rate(self, status: str, cell: str | None = None) -> dict[str, float]:
        k = (self.overall if cell is None else self.cells.get(cell, {})).get(status, 0)
        low, high = sim.clopper_pearson(k, self.runs)
        return {"rate": k / self.runs, "low": low, "high": high, "k": k, "n": self.runs}


def run_figure(pool: sim.SessionPool, policy: GatePolicy, effect: Effect, *, sessions: int, runs: int, seed: int,
               min_sessions: int | None = None) -> Outcome:
    """``runs`` simulated runs of at most ``sessions`` blocks; with ``min_sessions`` a sequential design looking
    after each block from ``min_sessions`` on and stopping at PASS or FAIL (``policy`` must carry that design)."""
    rng = np.random.default_rng(seed)
    out = Outcome()
    for _ in range(runs):
        run = sim.draw_run(pool, sessions, rng)
        manifest, levels, requests = sim.run_tables(pool, run, sessions)
        levels, requests = inject(levels, requests, effect, rng)
        looks = range(min_sessions, sessions + 1) if min_sessions else (sessions,)
        for m in looks:
            verdict = evaluate(*_first(manifest, levels, requests, m), None, policy, diagnostics=False)
            if verdict.status in (Status.PASS, Status.FAIL):
                break
        out.add(verdict, m)
    return out


def figures(args) -> list[dict[str, Any]]:
    """The done-when figures of issue #24 (each a dict written as JSON)."""
    from harness.rundir.store import RunDir

    store = RunDir(args.recording)
    recorded = sim.session_pool(store.manifest(), store.levels(numeric=True), store.requests(numeric=True))
    pool2 = shrink_noise(recorded, args.spread)
    pool4 = shrink_noise(four_level_pool(recorded), args.spread)
    base = GatePolicy(primary=PRIMARY, bootstrap_resamples=args.resamples, min_concurrency_fraction=0.0)
    n = args.sessions
    speed = base.model_copy(update={"primary": ("output_throughput",)})
    sequential = speed.model_copy(update={"min_sessions": 3, "max_sessions": 6})   # scenarios/cpu-tiny-dsa.toml
    fixed = speed.model_copy(update={"min_sessions": 3})
    stalls = Effect("stalls", 0.65, probability=0.25)
    plan: list[tuple[str, sim.SessionPool, GatePolicy, Effect, dict[str, Any]]] = [   # in order of importance
        ("local-loss-one-of-4", pool4, base, Effect("local", 0.90, (1,)), {}),
        ("candidate-stalls-exclude-stalls", pool4, base, stalls, {}),
        ("aa-fixed", pool4, base, Effect(), {}),
        ("sequential-3-6-equal", pool2, sequential, Effect(), {"sessions": 6, "min_sessions": 3}),
        ("fixed-6-equal", pool2, fixed, Effect(), {"sessions": 6}),
        ("throughput-at-margin", pool4, base, Effect("uniform", 0.97), {}),
        ("tpot-at-margin", pool4, base, Effect("latency", 1.03), {}),
        ("candidate-stalls-median", pool4, base.model_copy(update={"estimator": "median"}), stalls, {}),
        ("candidate-stalls-mean", pool4, base.model_copy(update={"estimator": "mean"}), stalls, {}),
        ("sequential-3-6-loss", pool2, sequential, Effect("uniform", 0.90), {"sessions": 6, "min_sessions": 3}),
        ("fixed-6-loss", pool2, fixed, Effect("uniform", 0.90), {"sessions": 6}),
        ("sequential-3-6-at-margin", pool2, sequential, Effect("uniform", 0.97), {"sessions": 6, "min_sessions": 3}),
        ("fixed-6-at-margin", pool2, fixed, Effect("uniform", 0.97), {"sessions": 6}),
        ("uniform-loss", pool4, base, Effect("uniform", 0.90), {}),
    ]
    wanted = set(args.only.split(",")) if args.only else None
    out = []
    for k, (name, pool, policy, effect, extra) in enumerate(plan):
        if wanted and name not in wanted:
            continue
        started = time.monotonic()
        sessions = extra.get("sessions", n)
        outcome = run_figure(pool, policy, effect, sessions=sessions, runs=args.runs, seed=args.seed + k,
                             min_sessions=extra.get("min_sessions"))
        figure = {"name": name, "effect": effect.describe(), "levels": list(pool.concurrency),
                  "sessions": sessions, "sequential_from": extra.get("min_sessions"), "spread": args.spread,
                  "estimator": policy.estimator, "primary": list(policy.primary), "runs": outcome.runs,
                  "overall": {s: outcome.rate(s) for s in ("PASS", "FAIL", "INCONCLUSIVE", "INVALID")},
                  "cells": {c: {s: outcome.rate(s, c) for s in counts} for c, counts in sorted(outcome.cells.items())},
                  "mean_sessions": float(np.mean(outcome.sessions_used)), "seed": args.seed + k,
                  "seconds": round(time.monotonic() - started, 1)}
        out.append(figure)
        print(f"{name}: {effect.describe()}; PASS {_pct(figure['overall']['PASS'])}, FAIL "
              f"{_pct(figure['overall']['FAIL'])}, mean sessions {figure['mean_sessions']:.2f} "
              f"({figure['seconds']} s)", flush=True)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"{name}.json").write_text(json.dumps(figure, indent=1) + "\n")
    return out


def accuracy_size(n: int, discordance: float, margin: float = -0.01) -> dict[str, float]:
    """Exact size of the accuracy PASS at the margin: P(Tango's score test rejects "worse than the margin") when
    ``p_cand − p_base = margin`` and ``P(discordant) = discordance``, by summing the trinomial law of the discordant
    counts ``(b, c)`` (and the old Agresti–Min Wald's, for comparison)."""
    from scipy.stats import multinomial, norm

    from harness.judge import paired_accuracy

    p10, p01 = (discordance - margin) / 2, (discordance + margin) / 2
    z = norm.ppf(0.95)
    top = int(min(n, n * discordance + 12 * math.sqrt(n * discordance) + 20))
    size_score = size_wald = 0.0
    for b in range(top + 1):
        for c in range(top + 1 - b):
            prob = multinomial.pmf([b, c, n - b - c], n, [p10, p01, 1 - p10 - p01])
            if prob < 1e-15:
                continue
            if paired_accuracy.tango_z(b, c, n, margin) > z:
                size_score += prob
            bb, cc, na = b + 0.5, c + 0.5, n + 2.0
            se = math.sqrt(max(bb + cc - (cc - bb) ** 2 / na, 0.0)) / na
            if ((cc - bb) / na - margin) / se > z:
                size_wald += prob
    return {"n": n, "discordance": discordance, "margin": margin, "size_tango": size_score,
            "size_agresti_min_wald": size_wald}


def _pct(rate: dict[str, float]) -> str:
    return f"{100 * rate['rate']:.1f} % [{100 * rate['low']:.1f}, {100 * rate['high']:.1f}]"


def main(argv: Sequence[str] | None = None) -> int:
    """Simulate the issue-#24 figures on the recorded sessions and write them as JSON (minutes to an hour)."""
    parser = argparse.ArgumentParser(prog="python -m harness.study.regression", description=main.__doc__)
    parser.add_argument("--recording", default=RECORDING, help="run directory of an A/A session recording")
    parser.add_argument("--out", default=None, help="directory for <figure>.json (and accuracy.json)")
    parser.add_argument("--runs", type=int, default=200, help="simulated runs per figure")
    parser.add_argument("--sessions", type=int, default=8, help="sessions per arm of the fixed-design figures")
    parser.add_argument("--spread", type=float, default=0.02, help="paired-block sd the recorded noise is scaled to")
    parser.add_argument("--resamples", type=int, default=200, help="bootstrap resamples per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated figure names (default: all)")
    parser.add_argument("--accuracy", action="store_true", help="also the exact accuracy sizes (about a minute)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.spread <= 0:
        parser.error("--runs must be ≥ 1 and --spread > 0")
    if args.accuracy:
        sizes = [accuracy_size(n, q) for n, q in ((1319, 0.011), (1319, 0.015), (1319, 0.03), (500, 0.011))]
        for row in sizes:
            print(f"accuracy n={row['n']} discordance {row['discordance']:.3f}: PASS size at the margin — Tango "
                  f"{100 * row['size_tango']:.2f} %, Agresti–Min Wald {100 * row['size_agresti_min_wald']:.2f} %")
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "accuracy.json").write_text(json.dumps(sizes, indent=1) + "\n")
    figures(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
