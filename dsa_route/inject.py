"""Calibration injections: defects and slowdowns switched on for one arm on purpose, to check that the gate sees them.

One environment variable, :data:`ENV_INJECT` (``DSA_ROUTE_INJECT``), carries an arm's injection from the harness
(``[arms.<name>] inject = "..."``) to every process of that arm's ``vllm serve``; :func:`parse_injection` is the one
parser (the scenario, the plan, the plugin and the model hooks all use it). Kinds:

- a **defect** of :data:`DEFECTS`, the catalogue of realistic DSA bugs (each names the upstream bug class it stands
  for, whether it is harmful, and what the scenario must exercise for it to apply). The tensor side is
  :mod:`dsa_route.dsa.injections`, one implementation that both the reference model (:mod:`dsa_route.dsa`) and the
  vLLM CPU classes (:mod:`dsa_route.vllm_cpu`) call at the same points;
- ``step-delay:<ms>``: a sleep of ``<ms>`` milliseconds (> 0, ≤ 10 000) per model forward — a known slowdown.

Every kind needs dsa_route's CPU DSA path (:mod:`dsa_route.vllm_cpu`, :data:`NEEDS_DSA_CPU`); ``step-delay``'s sleep
sits in the first attention layer's opaque op, so it runs once per forward whether or not vLLM compiles the model.
This module is pure (no torch, no vLLM: the scenario and the plan read it); the hooks are applied by
:func:`dsa_route.vllm_cpu.model.apply_injection` and :func:`dsa_route.dsa.injections.install`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

ENV_INJECT = "DSA_ROUTE_INJECT"
MAX_DELAY_MS = 10_000.0
TOPK_RANDOM_SEED = 0

# yarn_get_mscale(40, 1.0)² (dsa_route.dsa.config.yarn_get_mscale; DeepSeek-V3's rope_scaling factor 40, mscale_all_dim
# 1.0): the factor vLLM's deepseek_v2 multiplies the softmax scale by (``self.scaling * mscale * mscale``).
MSCALE_SQ_FACTOR_40 = (0.1 * math.log(40) + 1) ** 2   # 1.874
MSCALE_FACTOR_2 = 0.1 * math.log(2) + 1               # 1.069: one mscale of a factor-2 context extension


@dataclass(frozen=True)
class DefectSpec:
    """One catalogue defect: what it changes (the fields read by :mod:`dsa_route.dsa.injections`), whether it is
    ``harmful`` (a correct gate must FAIL it) and the upstream bug class it stands for (``cites``).

    Fields (all default to the correct path):
        visibility_shift: added to each query's exclusive key end in the indexer (``-1``: its own key is not visible
            to the indexer, so sparse MLA never attends to it; clamped so every query keeps its first key).
        stale_newest_key: the indexer key of each request's newest token is read before it is written (zeros: a
            fresh page) — the indexer scores that token as 0.
        selection: ``exact`` (:func:`dsa_route.dsa.topk.topk_indices`), ``random`` (uniform over the visible keys,
            seeded), ``lost-boundary`` (the lowest-scoring selected key is dropped to ``-1`` in each row with more visible keys
            than it keeps),
            ``pad-zero`` (the ``-1`` padding of rows with fewer than ``index_topk`` visible keys reads as key 0,
            attended once per pad), ``descending`` (the same set in descending score order), ``tie-last`` (among
            scores tied at the k-th place the higher key index wins).
        topk_divisor: the selection keeps ``index_topk // topk_divisor`` keys (a wrong ``index_topk``).
        softmax_factor: multiplies the sparse MLA softmax scale.
        rope_flip_q_heads: share of the indexer's query heads (the last ones) whose RoPE uses the other pair layout.
        rope_flip_k: the indexer key's RoPE uses the other pair layout too.
        fp8_scale_floor: the indexer query's ue8m0 block scale is rounded down to a power of two (not up), so the
            block's largest values saturate at ±448.
        mtp_unnormed: the MTP draft recycles its pre-norm hidden into the next draft step (not ``shared_head.norm``).
        min_spec_tokens: MTP draft tokens the scenario must run for the defect to act (0: none needed).
    """

    harmful: bool
    cites: str
    visibility_shift: int = 0
    stale_newest_key: bool = False
    selection: str = "exact"
    topk_divisor: int = 1
    softmax_factor: float = 1.0
    rope_flip_q_heads: float = 0.0
    rope_flip_k: bool = False
    fp8_scale_floor: bool = False
    mtp_unnormed: bool = False
    min_spec_tokens: int = 0


DEFECTS: dict[str, DefectSpec] = {
    "visibility-off-by-one": DefectSpec(
        True, "causal-visibility off-by-one in the indexer's key range (cu_seqlen_ke = position instead of "
              "position + 1, vLLM deepseek_v2 Indexer / fp8_mqa_logits contract)", visibility_shift=-1),
    "topk-lost-key": DefectSpec(
        True, "lost top-k keys: persistent_topk silently drops candidates when many scores share a bin (vLLM #51782)",
        selection="lost-boundary"),
    "topk-bin-overflow": DefectSpec(
        True, "lost top-k candidates, the whole threshold bin: persistent_topk's stash overflows, so the keys of the "
              "k-th score's coarse histogram bin reach refinement in arrival order, not by score (vLLM #51782, "
              "PRs #52149 / #55314: up to 2,042 of 2,048 selected values wrong on GLM-5.2)",
        selection="bin-overflow"),
    "topk-pad-zero": DefectSpec(
        True, "extra top-k keys: the -1 padding of a short row read as key 0 (a kernel that treats index 0 as valid "
              "instead of -1 = unused, FlashMLA sparse topk_indices contract)", selection="pad-zero"),
    "topk-random": DefectSpec(
        True, "a selection unrelated to the indexer scores (the indexer's output ignored)", selection="random"),
    "index-topk-half": DefectSpec(
        True, "a wrong index_topk (half the configured width, e.g. a field read from the wrong config)",
        topk_divisor=2),
    "softmax-scale-large": DefectSpec(
        True, "softmax-scale / mscale error, large: YaRN mscale² of factor 40 (×1.874, vLLM deepseek_v2 "
              "`self.scaling * mscale * mscale`) applied where none belongs", softmax_factor=MSCALE_SQ_FACTOR_40),
    "softmax-scale-small": DefectSpec(
        True, "softmax-scale / mscale error, small: one mscale of a factor-2 extension (×1.069)",
        softmax_factor=MSCALE_FACTOR_2),
    "indexer-rope-partial": DefectSpec(
        True, "indexer RoPE layout wrong on part of the heads: a fused indexer RoPE kernel's layout (sglang #30342, "
              "−2.4 GSM8K points); half the query heads interleaved instead of half-split", rope_flip_q_heads=0.5),
    "indexer-rope-flip": DefectSpec(
        True, "indexer RoPE pair layout flipped on every head, query and key (the DeepSeek-V3.2 / GLM-5 "
              "half-split vs interleaved difference, dsa_route.dsa.rope)", rope_flip_q_heads=1.0, rope_flip_k=True),
    "stale-index-key": DefectSpec(
        True, "stale indexer keys for the newest token: the indexer k-cache read before this step's insertion "
              "(vLLM indexer_k_quant_and_cache ordered after the logits)", stale_newest_key=True),
    "indexer-fp8-scale-floor": DefectSpec(
        True, "FP8 scale error: the ue8m0 block scale rounded down instead of up (DeepSeek-V3.2-Exp kernel.py "
              "fast_round_scale = 2^ceil(log2(amax/448))), so the largest values saturate", fp8_scale_floor=True),
    "mtp-hidden-unnormed": DefectSpec(
        True, "MTP hidden state not normalised: the draft recycles the pre-norm hidden, acceptance collapses after "
              "draft position 0 (GLM-5, vLLM #46075)", mtp_unnormed=True, min_spec_tokens=2),
    "topk-order": DefectSpec(
        False, "harmless: the same selected keys in another order (descending score instead of ascending key; "
               "sparse MLA treats a row as a set)", selection="descending"),
    "topk-tie-last": DefectSpec(
        False, "harmless: an equivalent tie rule (among scores tied at the k-th place the higher key index wins "
               "instead of the lower)", selection="tie-last"),
}

KINDS: tuple[str, ...] = (*DEFECTS, "step-delay")
ALLOWED = ", ".join((*DEFECTS, "step-delay:<ms>"))
NEEDS_DSA_CPU = frozenset(KINDS)  # every kind is applied inside dsa_route.vllm_cpu


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
