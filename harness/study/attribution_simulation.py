"""How often an attribution attributes an effect that is not there: simulated factorial runs on recorded sessions with
no true effect, judged by the product's own analysis (:func:`harness.judge.attribution.analyse`: OLS per metric and
level with session blocks as fixed effects, Holm over every effect tested).
``python -m harness.study.attribution_simulation --out results/attribution/false-attribution.json``.

The unit of replication is the server session: one observation of an attribution is one arm's session in one block
(a fresh ``vllm serve``, its level measured once), as in ``dsa-bench attribute``. A simulated run is ``blocks``
blocks × 2^k (or 2^(k−1)) sessions; its outcome is whether Holm attributed any effect; the rate over runs is the
familywise error rate over the run's family — every term × metric × level tested in it — which Holm (1979, "A simple
sequentially rejective multiple test procedure", Scand. J. Statist. 6:65–70) keeps ≤ α under any dependence between
the tests, given valid p-values. So the rate checks the p-values (the t reference with block fixed effects and few
blocks) on this machine's real noise; the rate per test (unadjusted p < α over all tests) is reported beside it.

Two pools of recorded sessions, neither with any effect between arms (:class:`Pool`):

- ``aa``: the A/A session recording (``tests/fixtures/recorded/real-sessions``: 36 fresh sessions of one path, each
  the mean of its 4 rounds at c = 1 and c = 4; :func:`aa_pool`). A run takes ``blocks × arms`` sessions —
  ``contiguous`` (consecutive in recorded time from a random start, as a real run's blocks ran back to back) or
  ``random`` (any, kept in time order) — cuts them into blocks in time order, and gives each block's sessions to the
  arms in a uniform random order (as :func:`harness.run.start.block_arms` orders a block's arms).
- ``residuals``: the served 2^3 attribution's own sessions (``tests/fixtures/recorded/attribution-2x3``) with every
  arm's effect removed: per metric and level on the analysis scale, ``e = y − arm mean − block mean + grand mean``
  (the two-way additive fit: no effect of any kind left, (arms − 1)(blocks − 1) df), each session's residuals kept
  together across metrics, then ``y* = block mean + e`` with the sessions permuted among the arms within each block
  (:func:`residual_pool`).

A planted effect (``planted``: term letters → log effect, e.g. ``{"A": -0.2}``) makes the check able to fail: log
throughput gains ``β·∏ x_i`` (x = level − ½, the model's own columns, so the model's coefficient is β), log TPOT
loses it (latency ÷ factor, as :func:`harness.study.session_simulation._scaled`); attributing a planted term is then
power, not a false attribution.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from harness.judge.attribution import LOG_METRICS, analyse
from harness.judge.factorial import LETTERS, arm_name, design_rows
from harness.study.session_simulation import clopper_pearson, session_pool

__all__ = ["Pool", "aa_pool", "residual_pool", "draw", "observations", "Rates", "simulate", "main"]

AA_RECORDING = "tests/fixtures/recorded/real-sessions"
RUN_RECORDING = "tests/fixtures/recorded/attribution-2x3"
METRICS = ("output_throughput", "server_mean_tpot_ms", "acceptance_length")
THROUGHPUT = ("output_throughput", "total_token_throughput", "request_throughput")


@dataclass(frozen=True)
class Pool:
    """Recorded sessions with no effect between them, in time order: ``values[i]`` = level → metric → value of
    session ``i`` (tok/s, ms, tokens); ``blocks[i]`` the recorded block a session must stay in (None: any block, the
    A/A pool), ``offsets`` level → metric → block → the block's mean on the analysis scale (the residual pool's
    ``y* = block mean + e``; empty for the A/A pool), ``name`` and where it came from (``source``)."""

    name: str
    source: str
    values: tuple[dict[str, dict[str, float]], ...]
    blocks: tuple[int | None, ...]
    offsets: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)


def _scale(metric: str, value: float) -> float:
    return math.log(value) if metric in LOG_METRICS else value


def _unscale(metric: str, value: float) -> float:
    return math.exp(value) if metric in LOG_METRICS else value


def aa_pool(manifest: Mapping[str, Any], levels: pd.DataFrame, requests: pd.DataFrame,
            metrics: Sequence[str] = (*METRICS, "mean_tpot_ms")) -> Pool:
    """The A/A recording's complete sessions (:func:`harness.study.session_simulation.session_pool`), each the mean
    over its rounds of every metric it measured (columns of ``metrics`` it lacks are left out: a recording without
    server TPOT has the client's, which the analysis takes in its place), per level ``c=<N>``.

    Raises:
        ValueError: fewer than 4 complete sessions.
    """
    pool = session_pool(dict(manifest), levels, requests)
    values = []
    for session in pool.sessions:
        per_level = {}
        for c, rows in session.levels.groupby("concurrency"):
            per_level[f"c={int(c)}"] = {m: float(pd.to_numeric(rows[m]).mean()) for m in metrics if m in rows
                                        and pd.to_numeric(rows[m]).notna().all()}
        values.append(per_level)
    return Pool("aa", "A/A session recording", tuple(values), (None,) * len(values))


def residual_pool(levels: pd.DataFrame, design: Mapping[str, Any], metrics: Sequence[str] = METRICS) -> Pool:
    """The served attribution's sessions with every arm effect removed (module docstring): one session per (arm,
    block), its residual per level and metric on the analysis scale (natural log for :data:`LOG_METRICS`).

    ``levels``: the run's ``levels.csv``; ``design``: ``{"arms": {arm: [0|1, …]}, "rounds_per_session": n}`` (the
    fixture's ``design.json``). Raises ValueError when an arm misses a block (the two-way fit needs them all)."""
    per_session = int(design.get("rounds_per_session", 1))
    frame = levels[levels["arm"].isin(list(design["arms"]))].copy()
    frame["block"] = pd.to_numeric(frame["round"]).astype(int) // per_session
    cells = frame.groupby(["arm", "block", "level"])
    values: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
    offsets: dict[str, dict[str, dict[int, float]]] = {}
    for level, rows in frame.groupby("level"):
        for metric in metrics:
            y = cells[metric].mean().xs(level, level="level").unstack("block").map(lambda v: _scale(metric, v))
            if y.isna().any().any():
                raise ValueError(f"{metric} @ {level}: every arm needs a value in every block for the two-way fit")
            resid = y.sub(y.mean(axis=1), axis=0).sub(y.mean(axis=0), axis=1) + float(y.to_numpy().mean())
            offsets.setdefault(str(level), {})[metric] = {int(b): float(v) for b, v in y.mean(axis=0).items()}
            for (arm, block), e in resid.stack().items():
                values.setdefault((str(arm), int(block)), {}).setdefault(str(level), {})[metric] = float(e)
    keys = sorted(values, key=lambda k: (k[1], k[0]))
    return Pool("residuals", "the served 2^3 attribution, arm effects removed", tuple(values[k] for k in keys),
                tuple(k[1] for k in keys), offsets)


def draw(pool: Pool, blocks: int, arms: int, rng: np.random.Generator, *, contiguous: bool = True
         ) -> list[list[int]]:
    """``blocks`` lists of ``arms`` pool indices, each list in the order the arms of the design receive them (a
    uniform random permutation per block). The A/A pool: ``blocks × arms`` sessions, consecutive from a random start
    (``contiguous``) or any (kept in time order), cut into blocks in time order. The residual pool: its recorded
    blocks (the first ``blocks``), each permuted.

    Raises:
        ValueError: the pool holds too few sessions (or blocks, or sessions per block).
    """
    if pool.offsets:
        recorded = sorted({b for b in pool.blocks if b is not None})
        if blocks > len(recorded):
            raise ValueError(f"{blocks} blocks: the residual pool holds {len(recorded)}")
        out = []
        for block in recorded[:blocks]:
            members = [i for i, b in enumerate(pool.blocks) if b == block]
            if len(members) != arms:
                raise ValueError(f"recorded block {block} holds {len(members)} sessions, the design {arms} arms")
            out.append([members[j] for j in rng.permutation(arms)])
        return out
    need = blocks * arms
    if need > len(pool.values):
        raise ValueError(f"{blocks} blocks × {arms} arms need {need} sessions; the {pool.name} pool holds "
                         f"{len(pool.values)}")
    if contiguous:
        start = int(rng.integers(0, len(pool.values) - need + 1))
        chosen = list(range(start, start + need))
    else:
        chosen = sorted(rng.choice(len(pool.values), size=need, replace=False).tolist())
    return [[chosen[b * arms + j] for j in rng.permutation(arms)] for b in range(blocks)]


def observations(pool: Pool, drawn: Sequence[Sequence[int]], factors: Sequence[str], design: str,
                 planted: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """The drawn sessions as :func:`harness.judge.attribution.analyse` rows (``arm``, ``block``, ``level``,
    ``levels``, the metrics), a planted effect added (module docstring)."""
    rows = design_rows(len(factors), design)
    out = []
    for block, members in enumerate(drawn):
        for row, index in zip(rows, members):
            x = [v - 0.5 for v in row]
            shift = sum(beta * math.prod(x[LETTERS.index(c)] for c in term)
                        for term, beta in (planted or {}).items())
            for level, metrics in pool.values[index].items():
                entry: dict[str, Any] = {"arm": arm_name(row), "block": block, "level": level,
                                         "levels": dict(zip(factors, row))}
                for metric, value in metrics.items():
                    if pool.offsets:
                        recorded = pool.blocks[index]
                        value = _unscale(metric, pool.offsets[level][metric][recorded] + value)
                    if metric in THROUGHPUT:
                        value *= math.exp(shift)
                    elif metric in LOG_METRICS:
                        value *= math.exp(-shift)
                    entry[metric] = value
                out.append(entry)
    return out


@dataclass
class Rates:
    """Outcomes of ``runs`` simulated runs: ``false_runs`` with any false attribution (the familywise error),
    ``false_by_term`` term letters → runs in which it was falsely attributed, ``tests`` (effects tested per run, the
    Holm family; the largest seen) and ``raw_rejections`` (tests with unadjusted p < α, over ``runs × tests``),
    ``planted_found`` planted term → runs in which it was attributed on throughput."""

    runs: int
    alpha: float
    false_runs: int = 0
    false_by_term: dict[str, int] = field(default_factory=dict)
    tests: int = 0
    tested: int = 0
    raw_rejections: int = 0
    planted_found: dict[str, int] = field(default_factory=dict)

    def rate(self) -> float:
        return self.false_runs / self.runs if self.runs else math.nan

    def interval(self) -> tuple[float, float]:
        """Clopper–Pearson 95 % interval of the familywise rate (Clopper & Pearson 1934)."""
        return clopper_pearson(self.false_runs, self.runs)

    def record(self) -> dict[str, Any]:
        low, high = self.interval()
        return {"runs": self.runs, "alpha": self.alpha, "false_runs": self.false_runs, "rate": self.rate(),
                "interval_95": [low, high], "tests_per_run": self.tests, "false_by_term": self.false_by_term,
                "per_test_rate": self.raw_rejections / self.tested if self.tested else None,
                "planted_found": self.planted_found}


def simulate(pool: Pool, *, runs: int, blocks: int, factors: Sequence[str], design: str = "full",
             metrics: Sequence[str] = METRICS, alpha: float = 0.05, seed: int = 0, contiguous: bool = True,
             planted: Mapping[str, float] | None = None) -> Rates:
    """``runs`` simulated attributions (:func:`draw`, :func:`observations`) judged by
    :func:`harness.judge.attribution.analyse`; counts as in :class:`Rates`."""
    rng = np.random.default_rng(seed)
    arms = len(design_rows(len(factors), design))
    rates = Rates(runs, alpha, planted_found={term: 0 for term in planted or {}})
    for _ in range(runs):
        rows = observations(pool, draw(pool, blocks, arms, rng, contiguous=contiguous), factors, design, planted)
        effects = [e for e in analyse(rows, factors, design, metrics, alpha)["effects"] if e["p"] is not None]
        rates.tests = max(rates.tests, len(effects))
        rates.tested += len(effects)
        rates.raw_rejections += sum(e["p"] < alpha for e in effects)
        wrong = {e["letters"] for e in effects if e.get("attributed") and e["letters"] not in (planted or {})}
        rates.false_runs += bool(wrong)
        for letters in wrong:
            rates.false_by_term[letters] = rates.false_by_term.get(letters, 0) + 1
        for term in planted or {}:
            rates.planted_found[term] += any(e.get("attributed") and e["letters"] == term
                                             and e["metric"] in THROUGHPUT for e in effects)
    return rates


def _read_aa(folder: Path) -> Pool:
    from harness.rundir.store import RunDir

    store = RunDir(folder)
    return aa_pool(store.manifest().model_dump(mode="json"), store.levels(numeric=True), store.requests(numeric=True))


def _read_run(folder: Path) -> Pool:
    design = json.loads((folder / "design.json").read_text(encoding="utf-8"))
    return residual_pool(pd.read_csv(folder / "levels.csv"), design)


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit 2 (as the ``dsa-bench`` CLI's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


CASES = (  # (pool, factors, design, blocks, contiguous draws)
    ("aa", 3, "full", 3, True), ("aa", 3, "full", 3, False), ("aa", 3, "full", 4, True),
    ("aa", 4, "half", 4, True), ("residuals", 3, "full", 3, True),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cases of :data:`CASES` and write their rates as JSON (benchmark script: minutes). Exit 0 when every
    null case's familywise rate is ≤ α, 1 when one is not, 2 on bad input (one line)."""
    parser = _OneLineParser(prog="python -m harness.study.attribution_simulation", description=main.__doc__)
    parser.add_argument("--aa", default=AA_RECORDING, help="the A/A session recording (run directory)")
    parser.add_argument("--run", default=RUN_RECORDING, help="the attribution fixture (levels.csv, design.json)")
    parser.add_argument("--runs", type=int, default=2000, help="simulated runs per null case")
    parser.add_argument("--planted-runs", type=int, default=500, help="simulated runs per case with the planted effect")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plant", type=float, default=-0.2, help="log effect planted on A for the power line")
    parser.add_argument("--out", help="write the rates here as JSON")
    args = parser.parse_args(argv)
    if min(args.runs, args.planted_runs) < 1 or not 0 < args.alpha < 1:
        print("attribution_simulation: error: --runs and --planted-runs must be ≥ 1 and --alpha in (0, 1)",
              file=sys.stderr)
        return 2
    try:
        pools = {"aa": _read_aa(Path(args.aa)), "residuals": _read_run(Path(args.run))}
    except (OSError, ValueError, KeyError) as error:
        print(f"attribution_simulation: error: cannot read the recordings ({str(error).splitlines()[0]}); pass "
              f"--aa {AA_RECORDING} and --run {RUN_RECORDING}", file=sys.stderr)
        return 2
    cases, ok = [], True
    for name, k, design, blocks, contiguous in CASES:
        factors = [f"f{i}" for i in range(k)]
        for planted in (None, {"A": args.plant}):
            started = time.monotonic()
            runs = args.runs if planted is None else args.planted_runs
            rates = simulate(pools[name], runs=runs, blocks=blocks, factors=factors, design=design,
                             alpha=args.alpha, seed=args.seed, contiguous=contiguous, planted=planted)
            record = {"pool": name, "source": pools[name].source, "factors": k, "design": design, "blocks": blocks,
                      "draws": "recorded blocks" if pools[name].offsets else "contiguous" if contiguous else "random",
                      "planted": planted or {},
                      **rates.record(), "wall_s": round(time.monotonic() - started, 1)}
            cases.append(record)
            ok &= planted is not None or rates.rate() <= args.alpha
            low, high = rates.interval()
            print(f"{name:9} 2^{k if design == 'full' else f'({k}-1)'} × {blocks} blocks ({record['draws']}) "
                  f"planted {planted or '-'}: false attribution {100 * rates.rate():.1f} % [{100 * low:.1f}, "
                  f"{100 * high:.1f}] of {runs} runs, {rates.tests} tests each, per test "
                  f"{100 * record['per_test_rate']:.2f} %" + (f", planted found {rates.planted_found}" if planted
                                                                else ""), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": "python -m harness.study.attribution_simulation "
                                              + " ".join(argv if argv is not None else sys.argv[1:]),
                                              "alpha": args.alpha, "seed": args.seed, "cases": cases}, indent=2)
                                  + "\n", encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
