"""Verdict rates on recorded server sessions: simulated runs whose unit is a real ``vllm serve`` session, judged by the
gate's own :func:`harness.judge.verdict.evaluate`.

A recording is an A/A run (both arms one path, sequential servers, several rounds per session:
``tests/fixtures/recorded/record-sessions.toml``); its sessions form a pool (:func:`session_pool`). A simulated run
draws ``2 n`` of them without replacement and, in recorded time order, pairs them into ``n`` blocks whose earlier
session goes to the arm the runner would start the block with (:func:`draw_run`, the block order of
:func:`harness.judge.planning.baseline_first`, as :func:`harness.run.start.schedule` runs them). :func:`run_tables` writes the first ``m`` blocks out as the run
directory's tables (``levels.csv``/``requests.csv`` rows and a manifest, session ``j`` and rounds renumbered per arm,
an optional effect injected into the candidate) and :func:`judge_first` judges them exactly as ``dsa-bench gate``
does: the fixed design is the one-look case (``m = n``) of a sequential design that looks after each block.

Between-session variance stays in the error model because whole sessions are resampled, never rounds. Pure: functions
of the recording's frames and manifest; ``main`` (``python -m harness.study.session_simulation --recording DIR``) reads
files and prints the figures.
"""

from __future__ import annotations

import argparse
import copy
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.judge.calibration import paired_spread
from harness.judge.planning import baseline_first
from harness.judge.stalls import ESTIMATORS
from harness.judge.policy import GatePolicy, Status
from harness.judge.verdict import Verdict, evaluate
from harness.rundir.schema import LevelKey, Manifest

__all__ = ["RecordedSession", "SessionPool", "session_pool", "SimulatedRun", "draw_run", "run_tables", "judge_first",
           "Rates", "simulate", "noise", "Noise", "pooled_pair_spread", "clopper_pearson"]

THROUGHPUT_COLUMNS = ("output_throughput", "total_token_throughput", "request_throughput")
LATENCY_LEVEL_COLUMNS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                         "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms")
LATENCY_REQUEST_COLUMNS = ("ttft_ms", "tpot_ms", "e2el_ms", "max_itl_ms")


@dataclass(frozen=True)
class RecordedSession:
    """One recorded server session: its arm and index in the recording, start time, and its rows.

    ``levels``/``requests``: the session's levels.csv and requests.csv rows, ``rounds`` its rounds in run order."""

    arm: str
    index: int
    started_at: str
    rounds: tuple[int, ...]
    levels: pd.DataFrame = field(repr=False)
    requests: pd.DataFrame = field(repr=False)


@dataclass(frozen=True)
class SessionPool:
    """The complete sessions of a recording in time order (every level of every round done), and its manifest."""

    sessions: tuple[RecordedSession, ...]
    concurrency: tuple[int, ...]
    rounds_per_session: int
    manifest: dict[str, Any] = field(repr=False)


def session_pool(manifest: Manifest | dict[str, Any], levels: pd.DataFrame, requests: pd.DataFrame, *,
                 max_sessions: int | None = None) -> SessionPool:
    """The recording's complete sessions, oldest first (``max_sessions``: only the first that many).

    A session is complete when it ran ``workload.rounds_per_session`` rounds with every concurrency of the run in each
    (an interrupted last session is dropped). Raises ValueError when fewer than 4 sessions are complete.
    """
    data = manifest.model_dump(mode="json") if isinstance(manifest, Manifest) else manifest
    concurrency = tuple(sorted(int(c) for c in levels["concurrency"].unique()))
    per_session = int(data["scenario"]["workload"].get("rounds_per_session", 1))
    started = {(arm["name"], int(s["index"])): s["started_at"] for arm in data["arms"] for s in arm["sessions"]}
    sessions = []
    for (arm, index), rows in levels.groupby(["arm", "session"]):
        rounds = tuple(sorted(int(r) for r in rows["round"].unique()))
        counts = rows.groupby("round")["concurrency"].nunique()
        if len(rounds) != per_session or (counts != len(concurrency)).any():
            continue
        mine = requests[(requests["arm"] == arm) & (requests["session"] == index)]
        sessions.append(RecordedSession(str(arm), int(index), started[(str(arm), int(index))], rounds, rows, mine))
    sessions.sort(key=lambda s: (s.started_at, s.rounds))
    sessions = sessions[:max_sessions] if max_sessions else sessions
    if len(sessions) < 4:
        raise ValueError(f"the recording holds {len(sessions)} complete sessions; a simulation needs ≥ 4")
    return SessionPool(tuple(sessions), concurrency, per_session, data)


@dataclass(frozen=True)
class SimulatedRun:
    """A drawn run: ``blocks[j] = (baseline session, candidate session)`` (indices into the pool) in run order."""

    blocks: tuple[tuple[int, int], ...]


def draw_run(pool: SessionPool, n: int, rng: np.random.Generator, *, contiguous: bool = False,
             order: str = "random") -> SimulatedRun:
    """``n`` blocks from ``2 n`` pool sessions drawn without replacement, kept in recorded time order, each block's
    earlier session going to the arm the runner would start it with (:func:`harness.judge.planning.baseline_first`
    under ``order``, for a run seed drawn from ``rng``).

    ``contiguous``: ``2 n`` consecutive sessions from a random start instead (a real run's time structure: each block's
    two sessions ran back to back, so slow drift of the host's load is shared within a block). Raises ValueError when
    the pool holds fewer than ``2 n`` sessions."""
    if 2 * n > len(pool.sessions):
        raise ValueError(f"{n} sessions per arm need {2 * n} recorded sessions; the pool holds {len(pool.sessions)}")
    if contiguous:
        start = int(rng.integers(0, len(pool.sessions) - 2 * n + 1))
        chosen = list(range(start, start + 2 * n))
    else:
        chosen = sorted(rng.choice(len(pool.sessions), size=2 * n, replace=False).tolist())
    seed = int(rng.integers(0, 2**31))
    blocks = tuple((chosen[2 * j], chosen[2 * j + 1]) if baseline_first(seed, j, order)
                   else (chosen[2 * j + 1], chosen[2 * j]) for j in range(n))
    return SimulatedRun(blocks)


def _relabel(frame: pd.DataFrame, arm: str, session: int, rounds: Sequence[int], per_session: int) -> pd.DataFrame:
    out = frame.copy()
    out["arm"], out["session"] = arm, session
    out["round"] = out["round"].map({r: session * per_session + k for k, r in enumerate(rounds)})
    return out


def _scaled(levels: pd.DataFrame, requests: pd.DataFrame, factor: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A throughput change by ``factor``: throughputs × factor, latencies ÷ factor (levels and requests)."""
    levels, requests = levels.copy(), requests.copy()
    for column in THROUGHPUT_COLUMNS:
        levels[column] = levels[column] * factor
    for column in LATENCY_LEVEL_COLUMNS:
        if column in levels.columns:
            levels[column] = levels[column] / factor
    for column in LATENCY_REQUEST_COLUMNS:
        if column in requests.columns:
            requests[column] = requests[column] / factor
    return levels, requests


def run_tables(pool: SessionPool, run: SimulatedRun, m: int, *, throughput_factor: float = 1.0
               ) -> tuple[Manifest, pd.DataFrame, pd.DataFrame]:
    """The run directory's manifest, levels and requests of the first ``m`` blocks of ``run``.

    Block ``j``'s sessions become session ``j`` of each arm, their rounds ``j·k … j·k + k − 1`` (``k`` rounds per
    session); the candidate's rows carry ``throughput_factor`` (:func:`_scaled`). The manifest is the recording's with
    ``workload.repeats = m`` and every level ``done``."""
    level_parts, request_parts = [], []
    entries: dict[str, dict[str, Any]] = {"baseline": {}, "candidate": {}}
    for j, pair in enumerate(run.blocks[:m]):
        for arm, index in zip(("baseline", "candidate"), pair):
            session = pool.sessions[index]
            levels = _relabel(session.levels, arm, j, session.rounds, pool.rounds_per_session)
            requests = _relabel(session.requests, arm, j, session.rounds, pool.rounds_per_session)
            if arm == "candidate" and throughput_factor != 1.0:
                levels, requests = _scaled(levels, requests, throughput_factor)
            level_parts.append(levels)
            request_parts.append(requests)
            for c, r in zip(levels["concurrency"], levels["round"]):
                entries[arm][str(LevelKey(int(c), int(r)))] = {"status": "done", "session": j}
    data = copy.deepcopy(pool.manifest)
    data["scenario"]["workload"]["repeats"] = m
    data["status"] = "done"
    for arm in data["arms"]:
        arm["levels"] = entries[arm["name"]]
        arm["sessions"] = arm["sessions"][:m]
    return Manifest.model_validate(data), pd.concat(level_parts, ignore_index=True), pd.concat(request_parts,
                                                                                             ignore_index=True)


def judge_first(pool: SessionPool, run: SimulatedRun, m: int, policy: GatePolicy, *,
                throughput_factor: float = 1.0) -> Verdict:
    """The gate's verdict (:func:`harness.judge.verdict.evaluate`, no accuracy) on the first ``m`` blocks of ``run``:
    one look of a sequential design; ``m = len(run.blocks)`` is the fixed design."""
    manifest, levels, requests = run_tables(pool, run, m, throughput_factor=throughput_factor)
    return evaluate(manifest, levels, requests, None, policy, diagnostics=False)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval for ``k`` successes in ``n`` trials (Clopper & Pearson 1934, via scipy)."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


@dataclass
class Rates:
    """Verdicts of ``n_sims`` simulated runs of ``sessions`` sessions per arm.

    ``counts``: overall status → runs; ``cell_fails``: cell (``metric c=level``, or ``metric pooled``) → runs in which
    that cell FAILed."""

    sessions: int
    throughput_factor: float
    n_sims: int
    counts: dict[str, int] = field(default_factory=dict)
    cell_fails: dict[str, int] = field(default_factory=dict)

    def rate(self, status: Status | str) -> float:
        return self.counts.get(str(status), 0) / self.n_sims

    def interval(self, status: Status | str) -> tuple[float, float]:
        return clopper_pearson(self.counts.get(str(status), 0), self.n_sims)


def simulate(pool: SessionPool, policy: GatePolicy, *, sessions: int, n_sims: int, seed: int = 0,
             throughput_factor: float = 1.0, contiguous: bool = False, order: str = "random") -> Rates:
    """Judge ``n_sims`` runs drawn by :func:`draw_run` (fixed design, ``sessions`` per arm) and count verdicts."""
    rng = np.random.default_rng(seed)
    rates = Rates(sessions, throughput_factor, n_sims)
    for _ in range(n_sims):
        verdict = judge_first(pool, draw_run(pool, sessions, rng, contiguous=contiguous, order=order), sessions, policy,
                              throughput_factor=throughput_factor)
        rates.counts[str(verdict.status)] = rates.counts.get(str(verdict.status), 0) + 1
        for cell in verdict.cells:
            if cell.primary and cell.status == Status.FAIL:
                name = f"{cell.metric} " + ("pooled" if cell.pooled else f"c={cell.level}")
                rates.cell_fails[name] = rates.cell_fails.get(name, 0) + 1
    return rates


@dataclass(frozen=True)
class Noise:
    """Log-throughput spread at one level: within a session (rounds), between sessions, and per paired block.

    ``within``: pooled sd of a round around its session's mean (``within_df`` degrees of freedom); ``between``: the
    session variance component, ``sqrt(max(0, var(session means) − within²/k))`` (one-way random effects, Searle,
    Casella & McCulloch 1992 §3.5); ``session_means``: sd of the session means; ``pair``: sd of the log ratio of
    time-adjacent session means (the unit a paired run tests), with ``pair_upper``, its one-sided 95 % upper bound
    (chi-square on ``pair_df``)."""

    concurrency: int
    sessions: int
    within: float
    within_df: int
    session_means: float
    between: float
    pair: float
    pair_df: int
    pair_upper: float


def _upper_sd(sd: float, df: int, confidence: float = 0.95) -> float:
    from scipy.stats import chi2

    return float(sd * math.sqrt(df / chi2.ppf(1 - confidence, df)))


def noise(pool: SessionPool, column: str = "output_throughput") -> list[Noise]:
    """:class:`Noise` of ``column`` (log scale) at every level of the pool."""
    out = []
    for level in pool.concurrency:
        per_session = [np.log(s.levels.loc[s.levels["concurrency"] == level, column].to_numpy(dtype=float))
                       for s in pool.sessions]
        means = np.array([x.mean() for x in per_session])
        k = pool.rounds_per_session
        within_df = sum(x.size - 1 for x in per_session)
        within = math.sqrt(sum(((x - x.mean()) ** 2).sum() for x in per_session) / within_df) if within_df else 0.0
        sd_means = float(means.std(ddof=1))
        between = math.sqrt(max(0.0, sd_means ** 2 - within ** 2 / k))
        pairs = np.array([means[2 * j + 1] - means[2 * j] for j in range(len(means) // 2)])
        pair = float(pairs.std(ddof=1)) if pairs.size > 1 else math.nan
        out.append(Noise(level, len(per_session), within, within_df, sd_means, between, pair, pairs.size - 1,
                         _upper_sd(pair, pairs.size - 1) if pairs.size > 1 else math.nan))
    return out


def pooled_pair_spread(pool: SessionPool, column: str = "output_throughput") -> tuple[float, int]:
    """(sd, df) of the per-block paired log ratio, levels pooled as the gate's pooled hypothesis pools them
    (``verdict._pooled``: per block, the mean over levels of log(candidate session mean / baseline session mean)),
    over the time-adjacent blocks (0, 1), (2, 3), … of the pool (signs in ABBA assignment; the spread of an A/A
    recording does not depend on them beyond noise)."""
    def mean_at(session: RecordedSession, level: int) -> float:
        return float(session.levels.loc[session.levels["concurrency"] == level, column].mean())

    diffs = []
    for j in range(len(pool.sessions) // 2):
        first, second = pool.sessions[2 * j], pool.sessions[2 * j + 1]
        base, cand = (first, second) if j % 2 == 0 else (second, first)
        diffs.append(np.mean([math.log(mean_at(cand, c) / mean_at(base, c)) for c in pool.concurrency]))
    d = np.asarray(diffs)
    return float(d.std(ddof=1)), d.size - 1


def _pct(rate: float, ci: tuple[float, float]) -> str:
    return f"{100 * rate:5.1f} % [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the noise, A/A false-FAIL and power figures of a recording (benchmark script, minutes)."""
    from harness.rundir.store import RunDir

    parser = argparse.ArgumentParser(prog="python -m harness.study.session_simulation", description=main.__doc__)
    parser.add_argument("--recording", required=True, help="run directory of an A/A session recording")
    parser.add_argument("--sessions", default="4,6,8", help="sessions per arm to simulate (comma-separated)")
    parser.add_argument("--sims", type=int, default=400, help="simulated runs per figure")
    parser.add_argument("--loss", type=float, default=0.10, help="injected throughput loss for the power figure")
    parser.add_argument("--draw", choices=("random", "contiguous"), default="random",
                        help="random: 2n sessions from anywhere in the recording; contiguous: 2n consecutive ones")
    parser.add_argument("--order", choices=("random", "abba"), default="random",
                        help="block order of the simulated runs (workload.block_order)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resamples", type=int, default=200, help="bootstrap resamples per cell")
    parser.add_argument("--estimators", default="mean",
                        help=f"[gate] estimators to compare (comma-separated, of {', '.join(ESTIMATORS)})")
    args = parser.parse_args(argv)
    estimators = [e for e in args.estimators.split(",") if e]
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown:
        parser.error(f"unknown estimator(s) {unknown}; choose from {', '.join(ESTIMATORS)}")
    store = RunDir(args.recording)
    pool = session_pool(store.manifest(), store.levels(numeric=True), store.requests(numeric=True))
    policy = GatePolicy(primary=("output_throughput", "mean_tpot_ms"), bootstrap_resamples=args.resamples,
                        estimator=estimators[0])
    print(f"recording {args.recording}: {len(pool.sessions)} complete sessions × {pool.rounds_per_session} rounds, "
          f"levels {list(pool.concurrency)}; policy {policy.describe()}")
    print("log output throughput: level, sessions, within-session sd (df), sd of session means, between-session sd, "
          "paired-block sd [95 % upper bound]")
    for row in noise(pool):
        print(f"  c={row.concurrency}: {row.sessions}, {row.within:.3f} ({row.within_df}), {row.session_means:.3f}, "
              f"{row.between:.3f}, {row.pair:.3f} [{row.pair_upper:.3f}]")
    sd, df = pooled_pair_spread(pool)
    print(f"  levels pooled (the pooled hypothesis' unit): paired-block sd {sd:.3f} on {df} df "
          f"[95 % upper bound {_upper_sd(sd, df):.3f}]")
    for estimator in estimators:
        spreads = paired_spread(store.levels(numeric=True), estimator=estimator)
        print(f"estimator {estimator!r}: paired session spread of log output throughput over the recording's "
              "arm-labelled pairs: " + ", ".join(f"c={x.concurrency} {x.sd:.3f} [{x.upper:.3f}] ({x.pairs} pairs)"
                                                  for x in spreads))
        judged = policy.model_copy(update={"estimator": estimator})
        for n in (int(x) for x in args.sessions.split(",")):
            if 2 * n > len(pool.sessions):
                print(f"n={n}: needs {2 * n} sessions, the pool holds {len(pool.sessions)}; skipped")
                continue
            draw = dict(sessions=n, n_sims=args.sims, contiguous=args.draw == "contiguous", order=args.order)
            aa = simulate(pool, judged, seed=args.seed, **draw)
            loss = simulate(pool, judged, seed=args.seed + 1, throughput_factor=1.0 - args.loss, **draw)
            print(f"| {estimator} | {n} | {args.sims} ({args.draw} draws, {args.order} block order) | A/A FAIL "
                  f"{_pct(aa.rate('FAIL'), aa.interval('FAIL'))} | A/A PASS "
                  f"{_pct(aa.rate('PASS'), aa.interval('PASS'))} | {100 * args.loss:g} % loss FAIL "
                  f"{_pct(loss.rate('FAIL'), loss.interval('FAIL'))} |")
            print(f"    A/A verdicts {aa.counts}; FAIL per cell {aa.cell_fails or '{}'}")
            print(f"    loss verdicts {loss.counts}; FAIL per cell {loss.cell_fails}")
    print("exact Wilcoxon signed-rank, smallest one-sided p at n pairs (every difference one sign): "
          + ", ".join(f"n={n} {p:.4f}" for n, p in wilcoxon_floor(range(3, 9))))
    return 0


def wilcoxon_floor(pairs: Sequence[int]) -> list[tuple[int, float]]:
    """The smallest one-sided p-value scipy's exact Wilcoxon signed-rank test can give at each ``n`` (all ``n``
    differences of one sign: ``2**-n``): below the level a cell is tested at it can never reject."""
    from scipy.stats import wilcoxon

    return [(n, float(wilcoxon(np.arange(1.0, n + 1), alternative="greater", method="exact").pvalue))
            for n in pairs]


if __name__ == "__main__":
    raise SystemExit(main())
