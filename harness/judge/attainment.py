"""SLO attainment per arm and level with an exact binomial bound (issue #26 item 4). Pure: a function of ``levels.csv``.

A level's attainment is the share of its completed requests that met every objective of the scenario's ``[slo]``
(``levels.csv`` ``slo_attainment``, from vLLM's goodput: :func:`harness.run.load.parse_bench_result`). Over an arm's
rounds of a level, ``good = Σ round(slo_attainment × completed)`` of ``n = Σ completed`` requests; the bound is the
exact one-sided Clopper–Pearson lower limit at confidence ``1 − α``: the largest ``p`` with
``P(Binomial(n, p) ≥ good) ≤ α``, i.e. ``Beta(α; good, n − good + 1)`` (Clopper & Pearson 1934, Biometrika
26:404).
It is the statement MLPerf LoadGen's early stopping makes about a latency percentile (``loadgen/early_stopping.cc``:
from ``n`` queries and the ones over the bound, the percentile an exact binomial tail still supports). Requests of
one server session are not independent draws, so the bound describes the measured requests; the comparison of the
arms is the paired ``slo_attainment`` / ``request_goodput`` cells (:mod:`harness.judge.cells`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from scipy.stats import beta

from harness.metrics import finite_float
from harness.rundir.schema import Level

__all__ = ["Attainment", "attainment_bound", "slo_attainment"]


@dataclass(frozen=True)
class Attainment:
    """One arm at one level: ``good`` of ``requests`` met every SLO; ``share`` = good / requests (0..1) and
    ``lower`` its exact one-sided lower bound at confidence ``1 − alpha``."""

    level: str
    arm: str
    good: int
    requests: int
    share: float
    lower: float
    alpha: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def attainment_bound(good: int, n: int, alpha: float) -> float:
    """The exact one-sided lower bound of a binomial proportion: ``Beta(α; good, n − good + 1)``, 0 when ``good`` is
    0 (Clopper & Pearson 1934).

    Raises:
        ValueError: ``n < 1``, ``good`` outside ``0..n`` or ``alpha`` outside (0, 1).
    """
    if n < 1 or not 0 <= good <= n or not 0 < alpha < 1:
        raise ValueError(f"an attainment bound needs 0 ≤ good ≤ n, n ≥ 1 and 0 < α < 1 (got {good}, {n}, "
                         f"{alpha})")
    return 0.0 if good == 0 else float(beta.ppf(alpha, good, n - good + 1))


def slo_attainment(levels, alpha: float) -> list[Attainment]:
    """Per level and arm of ``levels`` (a ``levels.csv`` frame with a ``level`` column) that recorded
    ``slo_attainment``: its :class:`Attainment`, in level order; empty for a run measured without ``[slo]``."""
    if not len(levels) or "slo_attainment" not in levels.columns:
        return []
    out = []
    for (text, arm), frame in levels.groupby(["level", "arm"]):
        pairs = [(finite_float(a), finite_float(c)) for a, c in zip(frame["slo_attainment"], frame["completed"])]
        pairs = [(a, int(c)) for a, c in pairs if a is not None and c]
        if not pairs or Level.parse(text) is None:
            continue
        good, n = sum(round(a * c) for a, c in pairs), sum(c for _, c in pairs)
        out.append(Attainment(str(text), str(arm), good, n, good / n, attainment_bound(good, n, alpha), alpha))
    return sorted(out, key=lambda row: (Level.parse(row.level), row.arm))
