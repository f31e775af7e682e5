"""Each arm's prefix-cache hit rate per level (issue #26): ``levels.csv`` ``prefix_cache_hits`` over
``prefix_cache_queries`` (tokens, each arm's own ``/metrics`` over the measured windows:
:mod:`harness.run.server_metrics`), pooled over the arm's rounds of the level. Shown beside the verdict, never gated:
a hit rate is neither better nor worse in itself, but two arms that cache the same prompts differently (a candidate
that disables the cache, another block size) make a throughput difference at a ``prefix_repetition`` level a
caching difference — this says which."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from harness.metrics import finite_float
from harness.rundir.schema import Level

__all__ = ["PrefixCache", "prefix_cache"]


@dataclass(frozen=True)
class PrefixCache:
    """One arm at one level: ``hits`` of ``queries`` prompt tokens were found cached; ``rate`` = hits / queries."""

    level: str
    arm: str
    hits: int
    queries: int
    rate: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prefix_cache(levels) -> list[PrefixCache]:
    """Per level and arm of ``levels`` (a ``levels.csv`` frame) whose rounds looked tokens up in the prefix cache:
    its :class:`PrefixCache`, in level order; empty where no window recorded a query (no ``/metrics`` captures,
    prefix caching off)."""
    if not len(levels) or "prefix_cache_queries" not in levels.columns:
        return []
    out = []
    for (text, arm), frame in levels.groupby(["level", "arm"]):
        pairs = [(finite_float(h), finite_float(q)) for h, q in zip(frame["prefix_cache_hits"],
                                                                    frame["prefix_cache_queries"])]
        pairs = [(int(h), int(q)) for h, q in pairs if h is not None and q]
        if not pairs or Level.parse(text) is None:
            continue
        hits, queries = sum(h for h, _ in pairs), sum(q for _, q in pairs)
        out.append(PrefixCache(str(text), str(arm), hits, queries, hits / queries))
    return sorted(out, key=lambda row: (Level.parse(row.level), row.arm))
