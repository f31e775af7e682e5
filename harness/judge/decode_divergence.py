"""The ``decode_divergence`` cell of the correctness family (:mod:`harness.judge.divergence`'s docstring: what it
measures and why): does each session's decode agree with its own prefill? Pure: functions of scoring and parity rows.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from harness.judge import token_compare
from harness.judge.correctness_cell import CorrectnessCell, cell_from_counts, envelope_counts, quantiles

DECODE_TOLERANCE = 0.05
"""Nats per position, the per-prompt mean runner-up decode-vs-prefill gap beyond the envelope that counts
(``decode_divergence``; the default of the policy's ``decode_tolerance``). Derived from the recordings: on the
served default (``tests/fixtures/recorded/scoring-aa``, each session's parity against its own scoring, both batch
compositions) the three baseline sessions' and the two compile-off candidate sessions' per-prompt gap is at most
0.0252 (median 0–0.0022; bf16 logits, whose step at a logit of 8–16 is 0.0625, round differently in a batch of one
and a batch of 32): the band is twice that. On the reference model (``results/defects/decode-divergence-n64.json``)
``stale-index-key``'s per-prompt gap is 0.034–0.187 (median 0.077), 27 of the first 32 prompts beyond the band
over the correct path's; the correct path, the harmless changes, ``topk-lost-key`` and ``indexer-fp8-scale-floor``
stay ≤ 0.023 (the latter two act in prefill and decode alike). Served (``results/defects/README.md``, "Decode against
prefill"), ``stale-index-key``'s candidate gap is median 0.042, max 0.079 per prompt against the baseline sessions'
≤ 0.017: 9 of 32 prompts beyond the band, FAIL (6 needed then, 7 in the family of four)."""


def runner_up_gaps(decoded: Sequence[Mapping], forced: Sequence[Mapping], reference: Sequence[Mapping]
                   ) -> dict[int, list[float]]:
    """One server session's decode against its own prefill, per prompt and position (nats): ``|log p_decode(r) −
    log p_forced(r)|`` of the **runner-up** ``r`` — the decode's highest-ranked top-logprob entry other than its
    greedy token — at each position of the common prefix of the session's greedy output (``decoded``, parity rows)
    and the reference's (``reference``), where the session's teacher-forced scoring (``forced``, scoring rows of the
    reference's continuation) scored the same token after the same prefix. A position whose runner-up is missing
    from either top list is NaN (left out of every mean).

    The runner-up, not the greedy token: the model is confident (the default's greedy tokens have median log p
    −3·10⁻⁶), so the greedy token's log p sits at 0 whatever the logits do, while the runner-up's moves with the
    logit gap itself.

    Raises:
        ValueError: the rows cover different prompts.
    """
    by_forced = {int(row["index"]): row for row in forced}
    by_reference = {int(row["index"]): row for row in reference}
    if sorted(by_forced) != sorted(int(row["index"]) for row in decoded) or sorted(by_reference) != sorted(by_forced):
        raise ValueError("the parity and scoring rows cover different prompts")
    gaps = {}
    for row in decoded:
        index = int(row["index"])
        first = token_compare.first_divergence(row["token_ids"], by_reference[index]["token_ids"])
        common = len(row["token_ids"]) if math.isinf(first) else int(first)
        values = []
        for token, top, top_forced in zip(row["token_ids"][:common], row["top"], by_forced[index]["top"]):
            runner_up = next(((int(t), float(lp)) for t, lp in top if int(t) != int(token)), None)
            scored = {int(t): float(lp) for t, lp in top_forced}
            found = runner_up is not None and runner_up[0] in scored
            values.append(abs(runner_up[1] - scored[runner_up[0]]) if found else math.nan)
        gaps[index] = values
    return gaps


def has_decode_logprobs(rows: Sequence[Mapping]) -> bool:
    """Whether parity rows carry the top log-probs of each greedy position (``top``, one list per token: every
    :func:`harness.run.parity.collect` row does; rows written by other tooling may not)."""
    return all(len(row.get("top") or ()) == len(row["token_ids"]) for row in rows)


DECODE_LABELS = ("baseline", "baseline-one", "baseline-2")
"""The sessions whose decode-vs-prefill gaps form the ``decode_divergence`` envelope: the reference itself, its
one-at-a-time batch and the baseline's second session (every label with both a scoring and a parity file)."""


def decode_values(scorings: Mapping[str, Sequence[Mapping] | None], greedy: Mapping[str, Sequence[Mapping] | None]
                  ) -> tuple[dict[int, float], dict[int, float]]:
    """Per prompt the candidate's mean runner-up gap (:func:`runner_up_gaps`, nats / position) and the A/A envelope,
    the largest of the baseline sessions' (:data:`DECODE_LABELS` present in both mappings). A prompt without a
    compared position is NaN, a tie (:func:`~harness.judge.correctness_cell.envelope_counts` compares NaN
    false); so is an envelope with no finite
    value.

    Raises:
        ValueError: the rows cover different prompts.
    """
    reference = greedy["baseline"]

    def means(label: str) -> dict[int, float]:
        gaps = runner_up_gaps(greedy[label], scorings[label], reference)
        return {i: float(np.nanmean(v)) if any(map(math.isfinite, v)) else math.nan for i, v in gaps.items()}
    ab = means("candidate")
    aa = [means(label) for label in DECODE_LABELS if scorings.get(label) is not None and greedy.get(label) is not None]
    return ab, {i: max((v[i] for v in aa if math.isfinite(v[i])), default=math.nan) for i in ab}


def decode_cell(scorings: Mapping[str, Sequence[Mapping] | None], greedy: Mapping[str, Sequence[Mapping] | None],
                alpha: float, tolerance: float = DECODE_TOLERANCE) -> CorrectnessCell:
    """The ``decode_divergence`` cell from the sessions' scorings and greedy outputs, keyed by
    :data:`harness.judge.divergence.SCORINGS` labels (the candidate, the reference and ≥ 1 A/A label with both files); ``tolerance``: the tie band (nats /
    position, :data:`DECODE_TOLERANCE`). ``ab`` / ``aa``: the per-position gap summary
    (:func:`harness.judge.token_compare.summary`), the A/B's with ``positions`` compared of the reference's
    ``tokens``; ``first``: the first exceeding prompt's first position with a gap beyond the band.

    Raises:
        ValueError: the rows cover different prompts.
    """
    ab, envelope = decode_values(scorings, greedy)
    keys = sorted(ab)
    exceed, below, unstable = envelope_counts([ab[i] for i in keys], [envelope[i] for i in keys], tolerance)
    cell = cell_from_counts("decode_divergence", exceed, below, len(ab) - exceed - below, unstable, alpha)
    reference = greedy["baseline"]
    ab_gaps = runner_up_gaps(greedy["candidate"], scorings["candidate"], reference)
    aa_gaps = [runner_up_gaps(greedy[label], scorings[label], reference) for label in DECODE_LABELS
               if scorings.get(label) is not None and greedy.get(label) is not None]
    cell.first = next(((i, pos) for i in keys if ab[i] > envelope[i] + tolerance
                       for pos, d in enumerate(ab_gaps[i]) if d > tolerance), None)
    ab_tokens = [v for i in keys for v in ab_gaps[i] if math.isfinite(v)]
    aa_tokens = [v for gaps in aa_gaps for i in keys for v in gaps[i] if math.isfinite(v)]
    cell.ab = {**token_compare.summary(ab_tokens, []), "tokens": sum(len(row["token_ids"]) for row in reference)}
    cell.aa = {**token_compare.summary(aa_tokens, []), "comparisons": len(aa_gaps)}
    cell.cdf = {"quantiles": [q / 100 for q in range(101)], "ab": quantiles(ab_tokens), "aa": quantiles(aa_tokens)}
    return cell
