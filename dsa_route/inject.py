"""Calibration injections: defects and slowdowns switched on for one arm on purpose, to check that the gate sees them.

One environment variable, :data:`ENV_INJECT` (``DSA_ROUTE_INJECT``), carries an arm's injection from the harness
(``[arms.<name>] inject = "..."``) to every process of that arm's ``vllm serve``; :func:`parse_injection` is the one
parser (the scenario, the plugin and the model hooks all use it). Kinds:

- ``topk-random``: each query's indexer selection is replaced by ``index_topk`` keys drawn uniformly (seeded) from the
  keys it may see (:func:`dsa_route.dsa.injections.random_topk_indices`) — sparse attention still runs, on the wrong tokens;
- ``indexer-rope-flip``: every lightning indexer's RoPE pair layout is flipped, half-split ↔ interleaved (the
  DeepSeek-V3.2 / GLM-5 difference, :mod:`dsa_route.dsa.rope`), so the indexer scores positions wrongly while MLA
  stays correct (:func:`dsa_route.dsa.injections.flip_indexer_rope_`);
- ``step-delay:<ms>``: a sleep of ``<ms>`` milliseconds (> 0, ≤ 10 000) per model forward — a known slowdown.

The first two need dsa_route's CPU DSA path (:mod:`dsa_route.vllm_cpu`, :data:`NEEDS_DSA_CPU`); so does
``step-delay`` today (its sleep sits in the first attention layer's opaque op, so it runs once per forward whether or
not vLLM compiles the model). This module is pure (no torch, no vLLM: the scenario and the plan read it); the tensor
side lives in :mod:`dsa_route.dsa.injections`, the hooks in :func:`dsa_route.vllm_cpu.model.apply_injection`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

ENV_INJECT = "DSA_ROUTE_INJECT"
KINDS: tuple[str, ...] = ("topk-random", "indexer-rope-flip", "step-delay")
ALLOWED = "topk-random, indexer-rope-flip, step-delay:<ms>"
NEEDS_DSA_CPU = frozenset(KINDS)  # every kind is applied inside dsa_route.vllm_cpu
MAX_DELAY_MS = 10_000.0
TOPK_RANDOM_SEED = 0


@dataclass(frozen=True)
class Injection:
    """A parsed injection: ``kind`` (one of :data:`KINDS`) and ``params`` (``{"ms": float}`` for step-delay)."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> str:
        """The text form, the inverse of :func:`parse_injection` (e.g. ``"step-delay:50"``)."""
        if self.kind == "step-delay":
            ms = float(self.params["ms"])
            return f"step-delay:{int(ms) if ms.is_integer() else ms}"
        return self.kind

    @property
    def delay_s(self) -> float:
        """Seconds of sleep per model forward (0.0 unless step-delay)."""
        return float(self.params["ms"]) / 1000.0 if self.kind == "step-delay" else 0.0

    def record(self) -> dict[str, Any]:
        """``{"kind", "params"}`` as the manifest's ``Injection`` record stores it."""
        return {"kind": self.kind, "params": dict(self.params)}


def parse_injection(text: str | None) -> Injection | None:
    """``"topk-random" | "indexer-rope-flip" | "step-delay:<ms>"`` → :class:`Injection`; None or blank → None.

    Raises ValueError naming the allowed values for an unknown kind, a missing, non-numeric, non-positive or
    > :data:`MAX_DELAY_MS` delay, or a parameter on a kind that takes none.
    """
    if text is None or not text.strip():
        return None
    kind, colon, arg = text.strip().partition(":")
    if kind not in KINDS:
        raise ValueError(f"inject: unknown kind {text!r}; use one of {ALLOWED}")
    if kind != "step-delay":
        if colon:
            raise ValueError(f"inject: {kind} takes no parameter, got {text!r}; use one of {ALLOWED}")
        return Injection(kind)
    try:
        ms = float(arg)
    except ValueError:
        raise ValueError(f"inject: step-delay needs milliseconds, e.g. step-delay:50, got {text!r}") from None
    if not math.isfinite(ms) or not 0 < ms <= MAX_DELAY_MS:
        raise ValueError(f"inject: step-delay milliseconds must be in (0, {MAX_DELAY_MS:g}], got {text!r}")
    return Injection(kind, {"ms": ms})


def injection_from_env(environ: Mapping[str, str]) -> Injection | None:
    """The injection :data:`ENV_INJECT` asks for (None when unset). Raises ValueError like :func:`parse_injection`."""
    return parse_injection(environ.get(ENV_INJECT))
