"""The ``confidence_loss`` cell's statistic and test: does the candidate lose confidence in the reference's tokens?
Pure (numpy, scipy): functions of scoring rows (:mod:`harness.run.scoring`), no files.

**Statistic.** Per forced position the log-odds of the forced token ``t`` against the other entries of the same
scoring's top-k list (nats):

    ℓ = log p(t) − log Σ_{j ∈ top-k, j ≠ t} p(j)

and per prompt the mean over its positions of ``ℓ_candidate − ℓ_reference`` (nats / token; positions where either
side's ℓ is undefined are left out). The top-k alternatives carry nearly all the mass a confident model leaves
beside ``t``, so ``ℓ`` is the logit margin of ``t`` against its competitors, without the single runner-up's choice
(which depends on which side names it). It is antisymmetric: swapping the arms negates it.

**Why a signed statistic** (``results/defects/README.md``, "A signed signal: confidence in the reference's tokens").
The token_divergence cell reads ``|Δ log p|`` of the forced token, which a confident model keeps at ≈ 0 whatever
the logits do, and any change moves it: a defect that costs information (``topk-lost-key`` drops the selected key
the indexer ranks last) moves it as little as a harmless numerics change (compile off). The *direction* separates
them. Rounding noise moves ``ℓ`` both ways; a defect that removes information makes the model less sure of the
reference's choices, ``ℓ`` falls on most prompts. On the reference model (the first 64 test problems, the committed
checkpoint; ``results/defects/confidence-n64.json``) ``topk-lost-key`` lowers ``ℓ`` on 58 of 64 prompts (per-prompt
mean −0.0190 nats / token), while the recorded harmless compile-off change shifts the mean by +0.0019 (−0.0019 with
the arms swapped; ``tests/fixtures/recorded/scoring-aa``) and the catalogue's harmless changes by < 0.0001.

**Rule.** ``d_i`` = the A/B value minus the A/A value of prompt ``i`` (the first A/A comparison present; the
forced scorings' A/A is bit-exact here, so ``d_i`` is the A/B value). A candidate exchangeable with the A/A
replicate makes ``d_i`` symmetric about 0. A correct change may shift the mean log-odds by up to
:data:`CONFIDENCE_TOLERANCE` (its band: the policy's ``confidence_tolerance``), so the null is "location of
``d`` ≥ −tolerance", tested by the one-sided Wilcoxon signed-rank test (Wilcoxon 1945; scipy
``stats.wilcoxon``, exact null distribution for up to 50 untied prompts, normal approximation with tie correction
beyond) on ``d_i + tolerance``, at the family's cell α. Its size is ≤ the cell α at the null's boundary, by
construction; the recorded A/A and harmless changes are simulated in :mod:`harness.study.divergence_simulation`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

CONFIDENCE_TOLERANCE = 0.003
"""Nats per token: the largest mean shift of the forced tokens' log-odds a correct change may make (the default of
the policy's ``confidence_tolerance``). Derived from the recordings: the harmless compile-off candidate of the served
default (``tests/fixtures/recorded/scoring-aa``) shifts the per-prompt mean by +0.0019 against the baseline and
−0.0019 the other way round, the catalogue's harmless changes by < 0.0001 (``results/defects/confidence-n64.json``);
0.003 is about 1.6 times the largest. Resampled over its 32 prompts, the compile-off change FAILs 0.08 % of runs
(20 of 24,000: 12 session pairs, both directions; ``python -m harness.study.divergence_simulation``), the
catalogue's harmless changes none of 1000 at 32 or 64 prompts, while ``topk-lost-key`` (mean −0.0190) FAILs in
99.9 % of 32-prompt resamples and all 64-prompt ones (``--reference``, ``results/defects/README.md``)."""


def log_odds(row: Mapping[str, Any]) -> list[float]:
    """Per forced position of one scoring row (``logprobs`` of the forced tokens, ``top``: per position the top-k
    ``[id, logprob]`` list) the forced token's log-odds against the other top-k entries (nats): ``log p(t) − log
    Σ_{j ≠ t} p(j)`` over the list; the forced token is recognised in the list by its logprob (the row does not
    carry its id). NaN where the forced logprob is not finite or no other entry has mass."""
    out = []
    for forced, top in zip(row["logprobs"], row["top"]):
        if not math.isfinite(forced) or not top:
            out.append(math.nan)
            continue
        masses = [math.exp(lp) for _, lp in top if math.isfinite(lp)]
        same = [i for i, (_, lp) in enumerate(top) if lp == forced]
        rest = sum(masses) - (math.exp(forced) if same else 0.0)
        out.append(forced - math.log(rest) if rest > 0 else math.nan)
    return out


def prompt_shifts(reference: Sequence[Mapping], other: Sequence[Mapping]) -> dict[int, float]:
    """Per prompt the mean over positions of ``log_odds(other) − log_odds(reference)`` (nats / token; 0.0 for a
    prompt without a defined position). Raises ValueError when the rows cover different sequences or lengths."""
    by_index = {int(row["index"]): row for row in other}
    if sorted(by_index) != sorted(int(row["index"]) for row in reference):
        raise ValueError("the two scorings cover different sequences")
    shifts = {}
    for row in reference:
        index = int(row["index"])
        if len(by_index[index]["logprobs"]) != len(row["logprobs"]):
            raise ValueError(f"sequence {index}: the scorings have different lengths")
        delta = np.asarray(log_odds(by_index[index]), dtype=float) - np.asarray(log_odds(row), dtype=float)
        finite = delta[np.isfinite(delta)]
        shifts[index] = float(finite.mean()) if finite.size else 0.0
    return shifts


def position_shifts(reference: Sequence[Mapping], other: Sequence[Mapping]) -> list[float]:
    """Every finite per-position ``log_odds(other) − log_odds(reference)`` (nats), prompts in index order."""
    by_index = {int(row["index"]): row for row in other}
    values = []
    for row in sorted(reference, key=lambda r: int(r["index"])):
        delta = np.asarray(log_odds(by_index[int(row["index"])]), dtype=float) - np.asarray(log_odds(row), dtype=float)
        values += [float(v) for v in delta if math.isfinite(v)]
    return values


def wilcoxon_less(values: Sequence[float]) -> float:
    """One-sided Wilcoxon signed-rank p-value that ``values`` are centred below 0 (``scipy.stats.wilcoxon``,
    ``alternative="less"``, zeros dropped — Wilcoxon's own treatment; exact when ≤ 50 untied values remain); 1.0
    when no value is non-zero."""
    from scipy import stats

    nonzero = np.asarray([v for v in values if v != 0 and math.isfinite(v)], dtype=float)
    if nonzero.size == 0:
        return 1.0
    return float(stats.wilcoxon(nonzero, alternative="less").pvalue)


def shifted(ab: Sequence[float], envelope: Sequence[float], tolerance: float) -> np.ndarray:
    """``d_i + tolerance`` (module docstring) from paired per-prompt A/B and A/A values."""
    return np.asarray(ab, dtype=float) - np.asarray(envelope, dtype=float) + tolerance


def counts(ab: Sequence[float], envelope: Sequence[float], tolerance: float) -> tuple[int, int, int]:
    """(lower, higher, ties): prompts whose ``d_i`` lies below −tolerance (more confidence lost than the band allows),
    above it, and exactly on it (identical scorings and a zero A/A)."""
    d = shifted(ab, envelope, tolerance)
    return int((d < 0).sum()), int((d > 0).sum()), int((d == 0).sum())


def p_fail(ab: Sequence[float], envelope: Sequence[float], tolerance: float) -> float:
    """The rule's p-value: :func:`wilcoxon_less` of ``d_i + tolerance``."""
    return wilcoxon_less(shifted(ab, envelope, tolerance))
