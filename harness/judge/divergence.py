"""The correctness family of gated cells — teacher-forced token divergence, confidence loss, decode-time divergence
and output parity — each judged against the A/A envelope the same run measured. Pure: functions of scorings and parity rows
(:mod:`harness.run.scoring`, :mod:`harness.run.parity` rows), no files.

**Unit of replication: the prompt** (the parity prompts, 32 on the CPU default). The three cells compare the A/B
comparison (the reference — the baseline's first session, all prompts at once — against the candidate) with the
A/A envelope: the reference against the baseline's second session and against the baseline's first session with
the prompts sent one at a time (another batch composition: batch variance, vLLM #57815).

- ``token_divergence``: per prompt the mean over its continuation's positions of ``|Δ log p|`` of the forced token
  (nats / token). Prompt ``i`` *exceeds* when its A/B value is above the envelope (the larger A/A value) by more than
  :data:`TOKEN_TOLERANCE`, is *below* when the envelope is above the A/B by as much; other prompts are ties.
- ``confidence_loss``: does the candidate lose confidence in the reference's tokens? Per prompt the mean change of the
  forced token's log-odds against its top-k competitors (nats / token, signed; :mod:`harness.judge.confidence`),
  the candidate's against the A/A's; FAIL by a one-sided Wilcoxon signed-rank test shifted by
  :data:`~harness.judge.confidence.CONFIDENCE_TOLERANCE` (the rule and its derivation are in that module). It sees
  the quiet defects that cost information at the size of a harmless numerics change (``topk-lost-key``): those
  move ``|Δ log p|`` as little as rounding does, but in one direction. On the reference model it FAILs
  ``topk-lost-key`` in 99.9 % of 32-prompt resamples; served on the default (2026-12-05) the shift was two-thirds
  of that and the cell missed it narrowly, p = 0.0197 against α/4 (``results/defects/kill-matrix.md``).
- ``decode_divergence``: does the arm's decode agree with its own prefill? Per prompt the mean over the common
  prefix of the session's and the reference's greedy outputs of ``|log p_decode − log p_forced|`` of the
  decode's runner-up token (nats / position, :func:`runner_up_gaps`): ``log p_decode`` from the parity request's
  ``logprobs`` (vLLM 0.32 ``entrypoints/openai/completion/protocol.py``: ``CompletionRequest.logprobs`` :62,
  ``CompletionLogProbs.top_logprobs`` :651; the log-softmax of the raw logits by default, ``config/model.py:287``
  ``logprobs_mode = "raw_logprobs"``), ``log p_forced`` from the same session's teacher-forced scoring of the same
  token after the same prefix. The A/B value is the candidate's gap, the envelope the largest of the baseline
  sessions' own gaps (:data:`DECODE_LABELS`); tie band :data:`DECODE_TOLERANCE`. It sees what the two others
  cannot: a defect of the decode path alone (KV cache, the indexer's k-cache as decode writes it) leaves the
  prefill scoring and most greedy tokens alone but pulls decode away from prefill, while a numerical change of the
  whole path (compiled vs eager) moves both alike and cancels. The between-arm decode ``|Δ log p|`` was measured
  too and does not separate the decode-only defect from that change (``results/defects/README.md``,
  "Decode-time divergence").
- ``parity``: per prompt the first position where the greedy outputs differ (∞ when identical). Prompt ``i``
  exceeds when the A/B diverges earlier than every A/A comparison, is below when an A/A comparison diverges earlier.

**Rule** (every cell but ``confidence_loss``): the exact one-sided sign test on the non-tied prompts (Dixon & Mood
1946): FAIL when ``P(Binomial(exceed + below, 1/2) ≥ exceed) ≤ α / 4`` — Bonferroni over the family's four cells
(:data:`CELLS`) at the gate's α; a cell FAILs from 7 prompts beyond the envelope with none below (2⁻⁷ ≤ α/4 = 0.0125
at α = 0.05). A candidate that is an A/A replicate of the baseline makes its A/B value exchangeable with each A/A value,
so a prompt exceeds the larger of two A/A values with probability ≤ 1/3 ≤ 1/2 given it is not tied: the test's
false-FAIL rate is ≤ α/4 per cell if prompts are independent. Prompts share a server session, so independence is
an assumption; the rate is shown on recorded A/A sessions instead (``tests/fixtures/recorded/scoring-aa``,
``tests/test_divergence.py``). **INVALID** when the envelope itself is unstable: the A/A values exceed the tolerance
(divergences) or diverge (parity) on so many prompts that the same test would FAIL the baseline against itself.

:data:`TOKEN_TOLERANCE` and :data:`DECODE_TOLERANCE` are the floors below which a per-prompt difference is a tie.
The forced scorings' A/A is bit-exact on this machine (recorded: 0.0 nats at all 1525 positions across three
sessions and both batch compositions), so without a floor any numerical change — a compiled vs an eager path —
would FAIL. Decode is not bit-exact A/A: a batch of one rounds the bf16 logits otherwise than a batch of 32 (up to
0.0006 nats at a greedy token, 0.025 per prompt at the runner-up), hence the decode cell's own floor.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from harness.judge import confidence, token_compare
from harness.judge.correctness_cell import CELLS, CorrectnessCell, cell_from_counts, envelope_counts, quantiles
from harness.judge.decode_divergence import DECODE_TOLERANCE, decode_cell, has_decode_logprobs
from harness.rundir.schema import Status

CONFIDENCE_TOLERANCE = confidence.CONFIDENCE_TOLERANCE
TOKEN_TOLERANCE = 0.002
"""Nats per token, the per-prompt mean ``|Δ log p|`` that counts as a tie (the default of the policy's
``token_tolerance``). Derived from the recordings, not assumed:

- the **harmless** candidate of the default (CompilationMode.NONE vs VLLM_COMPILE, ``scoring-aa/``, two sessions ×
  32 prompts against three baseline sessions) is a fixed numerical difference: per prompt median 0.00012, 90th
  percentile 0.00058, max 0.00096 (per token max 0.045, no arg-max flip). The floor is twice its max, so that
  change has no prompt beyond it (another CPU's vector code may round differently: the factor 2 is its room), and
  the sign test FAILs only from 7 prompts on (6 while the family had three cells);
- the **catalogue defects** (``results/defects/README.md``, the reference model on the committed checkpoint): at
  0.002, 13–22 of the first 32 test problems exceed for the quiet defects that change 11–28 % of greedy answers
  while accuracy moves < 2 points (``softmax-scale-small``, ``visibility-off-by-one``, ``index-topk-half``); at the
  former 0.01 (one bf16 rounding step of a logit near 10 at a quarter of the positions) they had 3–11, so two of
  them passed. ``topk-lost-key`` and ``indexer-fp8-scale-floor`` (median 0.0003, at the harmless change's own level)
  and ``stale-index-key`` (decode only: 0 under teacher forcing) stay below any floor that passes the harmless
  change."""


def _per_prompt_mean(comparison: Mapping[str, Any]) -> dict[int, float]:
    return {int(p["index"]): float(np.nanmean(p["abs_dlogp"])) if len(p["abs_dlogp"]) else 0.0
            for p in comparison["prompts"]}


def token_values(reference: Sequence[Mapping], candidate: Sequence[Mapping], aa: Sequence[Sequence[Mapping]]
                 ) -> tuple[dict[int, float], dict[int, float]]:
    """Per prompt the A/B mean ``|Δ log p|`` and the A/A envelope (the larger A/A value), nats / token."""
    ab = _per_prompt_mean(token_compare.compare_scores(reference, candidate))
    aa_values = [_per_prompt_mean(token_compare.compare_scores(reference, rows)) for rows in aa]
    return ab, {i: max(values[i] for values in aa_values) for i in ab}


def divergence_cell(reference: Sequence[Mapping], candidate: Sequence[Mapping], aa: Sequence[Sequence[Mapping]],
                    alpha: float, tolerance: float = TOKEN_TOLERANCE) -> CorrectnessCell:
    """The ``token_divergence`` cell from scorings (:func:`harness.run.scoring.score` rows) of the same sequences:
    the ``reference``, the ``candidate`` and the A/A ``aa`` scorings (≥ 1).

    Raises:
        ValueError: no A/A scoring, or the scorings cover different sequences.
    """
    if not aa:
        raise ValueError("the divergence cell needs at least one A/A scoring")
    ab, envelope = token_values(reference, candidate, aa)
    keys = sorted(ab)
    exceed, below, unstable = envelope_counts([ab[i] for i in keys], [envelope[i] for i in keys], tolerance)
    cell = cell_from_counts("token_divergence", exceed, below, len(ab) - exceed - below, unstable, alpha)
    ab_cmp = token_compare.compare_scores(reference, candidate)
    aa_cmps = [token_compare.compare_scores(reference, rows) for rows in aa]
    cell.first = next(((p["index"], pos) for p in ab_cmp["prompts"] for pos, d in enumerate(p["abs_dlogp"])
                       if ab[p["index"]] > envelope[p["index"]] + tolerance and d > tolerance), None)
    aa_tokens = [v for c in aa_cmps for p in c["prompts"] for v in p["abs_dlogp"] if math.isfinite(v)]
    cell.ab = {**ab_cmp["summary"], "kl_lb_max": _max_kl(ab_cmp)}
    cell.aa = {**token_compare.summary(aa_tokens, [f for c in aa_cmps for p in c["prompts"] for f in p["flip"]]),
               "comparisons": len(aa_cmps)}
    ab_tokens = [v for p in ab_cmp["prompts"] for v in p["abs_dlogp"] if math.isfinite(v)]
    cell.cdf = {"quantiles": [q / 100 for q in range(101)], "ab": quantiles(ab_tokens), "aa": quantiles(aa_tokens)}
    return cell


def _max_kl(comparison: Mapping[str, Any]) -> float | None:
    values = [v for p in comparison["prompts"] for v in p["kl_lb"] if math.isfinite(v)]
    return max(values) if values else None


def confidence_values(reference: Sequence[Mapping], candidate: Sequence[Mapping], aa: Sequence[Sequence[Mapping]]
                      ) -> tuple[dict[int, float], dict[int, float]]:
    """Per prompt the A/B mean log-odds shift of the forced tokens (candidate against reference, nats / token,
    :func:`harness.judge.confidence.prompt_shifts`) and the A/A one (the first A/A scoring against the reference).

    Raises:
        ValueError: the scorings cover different sequences.
    """
    ab = confidence.prompt_shifts(reference, candidate)
    aa_values = confidence.prompt_shifts(reference, aa[0])
    return ab, {i: aa_values[i] for i in ab}


def confidence_status(ab: Sequence[float], envelope: Sequence[float], alpha: float,
                      tolerance: float = CONFIDENCE_TOLERANCE) -> tuple[Status, float]:
    """``(status, p)`` of the ``confidence_loss`` rule on paired per-prompt values (:mod:`harness.judge.confidence`):
    FAIL when the shifted Wilcoxon p ≤ α / len(:data:`CELLS`); INVALID when the A/A values alone (against zero)
    would FAIL — the baseline loses confidence against itself."""
    level = alpha / len(CELLS)
    if confidence.p_fail(envelope, [0.0] * len(envelope), tolerance) <= level:
        return Status.INVALID, math.nan
    p = confidence.p_fail(ab, envelope, tolerance)
    return (Status.FAIL if p <= level else Status.PASS), p


def confidence_cell(reference: Sequence[Mapping], candidate: Sequence[Mapping], aa: Sequence[Sequence[Mapping]],
                    alpha: float, tolerance: float = CONFIDENCE_TOLERANCE) -> CorrectnessCell:
    """The ``confidence_loss`` cell from scorings of the same sequences (the ``reference``, the ``candidate``, the
    A/A ``aa`` scorings, ≥ 1; the first is the envelope: :func:`judge` puts the baseline's second session first, a
    replicate of what the candidate is, where it has one). ``exceed`` / ``below`` / ``ties``: prompts whose
    A/B-minus-A/A shift lies below −``tolerance``, above it, exactly on it; ``p_fail``: the one-sided shifted
    Wilcoxon p; ``ab`` / ``aa``: the per-prompt shifts' summary (``mean``, ``median``, ``min``, nats / token);
    ``first``: the exceeding prompt of largest loss and its position of largest loss; ``cdf``: per-position
    log-odds shift quantiles of A/B and A/A (signed, nats).

    Raises:
        ValueError: no A/A scoring, or the scorings cover different sequences.
    """
    if not aa:
        raise ValueError("the confidence cell needs at least one A/A scoring")
    ab, envelope = confidence_values(reference, candidate, aa)
    keys = sorted(ab)
    a, e = [ab[i] for i in keys], [envelope[i] for i in keys]
    status, p = confidence_status(a, e, alpha, tolerance)
    lower, higher, ties = confidence.counts(a, e, tolerance)
    level = alpha / len(CELLS)
    if status == Status.INVALID:
        return CorrectnessCell("confidence_loss", Status.INVALID, [
            "the A/A envelope is unstable: the baseline loses confidence in its own tokens against itself, which the "
            "same test would call a defect; rerun on a quieter machine or check the baseline's determinism"],
            lower, higher, ties, alpha=level, test="Wilcoxon signed-rank test")
    cell = CorrectnessCell("confidence_loss", status, [], lower, higher, ties, p, level,
                           test="Wilcoxon signed-rank test")
    losses = sorted((ab[i] - envelope[i], i) for i in keys if ab[i] - envelope[i] < -tolerance)
    if losses:
        index = losses[0][1]
        ref_row = next(r for r in reference if int(r["index"]) == index)
        cand_row = next(r for r in candidate if int(r["index"]) == index)
        delta = np.asarray(confidence.log_odds(cand_row)) - np.asarray(confidence.log_odds(ref_row))
        cell.first = (index, int(np.nanargmin(delta))) if np.isfinite(delta).any() else None

    def spread(values: Sequence[float]) -> dict[str, float]:
        return {"mean": float(np.mean(values)), "median": float(np.median(values)), "min": float(np.min(values)),
                "prompts": len(values)}
    cell.ab, cell.aa = {**spread(a), "tolerance": tolerance}, {**spread(e), "comparisons": 1}
    cell.cdf = {"quantiles": [q / 100 for q in range(101)],
                "ab": quantiles(confidence.position_shifts(reference, candidate)),
                "aa": quantiles(confidence.position_shifts(reference, aa[0]))}
    return cell


def _first_positions(reference: Sequence[Mapping], other: Sequence[Mapping]) -> dict[int, float]:
    """Per prompt the first greedy divergence position of ``other`` against ``reference`` (∞ when identical)."""
    by_index = {int(row["index"]): row for row in other}
    if sorted(by_index) != sorted(int(row["index"]) for row in reference):
        raise ValueError("the parity collections cover different prompts")
    return {int(row["index"]): token_compare.first_divergence(row["token_ids"], by_index[int(row["index"])]["token_ids"])
            for row in reference}


def parity_values(reference: Sequence[Mapping], candidate: Sequence[Mapping], aa: Sequence[Sequence[Mapping]]
                  ) -> tuple[dict[int, float], dict[int, float]]:
    """Per prompt the A/B first divergence position and the A/A envelope (the earliest A/A one); ∞ = identical."""
    ab = _first_positions(reference, candidate)
    aa_positions = [_first_positions(reference, rows) for rows in aa]
    return ab, {i: min(positions[i] for positions in aa_positions) for i in ab}


def parity_counts(ab: Sequence[float], envelope: Sequence[float]) -> tuple[int, int, int]:
    """(exceed, below, unstable) prompt counts of the parity cell from paired per-prompt positions."""
    return (sum(1 for a, e in zip(ab, envelope) if a < e), sum(1 for a, e in zip(ab, envelope) if e < a),
            sum(1 for e in envelope if math.isfinite(e)))


def parity_cell(reference: Sequence[Mapping], candidate: Sequence[Mapping], aa: Sequence[Sequence[Mapping]],
                alpha: float) -> CorrectnessCell:
    """The gated ``parity`` cell from greedy outputs (:func:`harness.run.parity.collect` rows): the ``reference``,
    the ``candidate`` and the A/A ``aa`` collections (≥ 1).

    Raises:
        ValueError: no A/A collection, or the collections cover different prompts.
    """
    if not aa:
        raise ValueError("the parity cell needs at least one A/A collection")
    ab, envelope = parity_values(reference, candidate, aa)
    keys = sorted(ab)
    exceed, below, unstable = parity_counts([ab[i] for i in keys], [envelope[i] for i in keys])
    cell = cell_from_counts("parity", exceed, below, len(ab) - exceed - below, unstable, alpha)
    diverging = sorted((pos, i) for i, pos in ab.items() if pos < envelope[i])
    cell.first = (diverging[0][1], int(diverging[0][0])) if diverging else None
    total = len(ab)
    cell.ab = {"exact_match_rate_pct": 100.0 * sum(1 for v in ab.values() if math.isinf(v)) / total,
               "prompts": total}
    cell.aa = {"exact_match_rate_pct": 100.0 * sum(1 for v in envelope.values() if math.isinf(v)) / total,
               "comparisons": len(aa)}
    return cell


# ---------------------------------------------------------------------------------------------------- the family
SCORINGS = ("baseline", "baseline-one", "baseline-2", "candidate")
"""The run's scoring labels (``scoring/<label>.json``; the runner's ``arm_checks.SCORING_LABELS``): the reference,
its one-at-a-time batch, the baseline's second session and the candidate. The A/A parity collections carry the same
labels (``parity/<label>.json``); ``parity/baseline.json`` and ``parity/candidate.json`` are the usual pair."""
AA_LABELS = ("baseline-one", "baseline-2")


def judge(scorings: Mapping[str, Sequence[Mapping] | None], greedy: Mapping[str, Sequence[Mapping] | None],
          alpha: float, tolerance: float = TOKEN_TOLERANCE, decode_tolerance: float = DECODE_TOLERANCE,
          confidence_tolerance: float = CONFIDENCE_TOLERANCE) -> list[CorrectnessCell]:
    """The family's cells from what the run directory holds (``None`` for a file that is absent): ``scorings`` and
    ``greedy`` keyed by :data:`SCORINGS` labels; ``tolerance`` / ``decode_tolerance`` / ``confidence_tolerance``: the
    bands of ``token_divergence`` (nats / token), ``decode_divergence`` (nats / position) and ``confidence_loss``
    (nats / token). An A/A label may be missing (a
    run of one session has no ``baseline-2``: the envelope is then the batch composition alone, and a note says so);
    a missing reference or candidate, or no A/A at all, makes the cell INVALID with the files to fix.
    ``decode_divergence`` needs both folders and is left out (not measured) when a present parity file's rows lack
    the top log-probs (:func:`has_decode_logprobs`)."""
    cells = []
    builders = (("token_divergence", ("scoring",)), ("confidence_loss", ("scoring",)),
                ("decode_divergence", ("scoring", "parity")), ("parity", ("parity",)))
    data = {"scoring": scorings, "parity": greedy}
    for name, folders in builders:
        if name == "decode_divergence" and not all(has_decode_logprobs(rows) for rows in greedy.values() if rows):
            continue
        present = {label: all(data[f].get(label) is not None for f in folders) for label in SCORINGS}
        missing = [f"{f}/{label}.json" for label in ("baseline", "candidate") for f in folders
                   if data[f].get(label) is None]
        aa = [label for label in AA_LABELS if present[label]]
        if not aa:
            missing.append(f"{'+'.join(folders)}/{{{','.join(AA_LABELS)}}}.json (the A/A envelope)")
        if missing:
            cells.append(CorrectnessCell(name, Status.INVALID, [
                f"{', '.join(missing)} absent: the server died or the run predates the correctness cells; rerun "
                "(dsa-bench compare --resume) or set [parity] gated = false"]))
            continue
        try:
            if name == "decode_divergence":
                cell = decode_cell(scorings, greedy, alpha, decode_tolerance)
            elif name == "confidence_loss":
                rows = data["scoring"]
                first = sorted(aa, key=lambda label: label != "baseline-2")  # another session, the same batch
                cell = confidence_cell(rows["baseline"], rows["candidate"], [rows[label] for label in first], alpha,
                                       confidence_tolerance)
            else:
                build = divergence_cell if name == "token_divergence" else parity_cell
                rows = data[folders[0]]
                cell = build(rows["baseline"], rows["candidate"], [rows[label] for label in aa], alpha,
                             *((tolerance,) if name == "token_divergence" else ()))
        except ValueError as error:
            cell = CorrectnessCell(name, Status.INVALID, [f"{'+'.join(folders)}: {error}; rerun the run's checks"])
        if len(aa) < len(AA_LABELS):
            cell.reasons.append("A/A envelope from " + ", ".join(aa) + " only")
        cells.append(cell)
    return cells


def merge(status: Status, reason: str, cells: Sequence[CorrectnessCell]) -> tuple[Status, str]:
    """The run's verdict with the correctness family: FAIL when a cell FAILs (the reason names its first divergent
    prompt and token), else INVALID when one is INVALID and the rest did not FAIL; otherwise unchanged."""
    failed = [c for c in cells if c.status == Status.FAIL]
    if failed:
        return Status.FAIL, "; ".join(c.describe() for c in failed) + (
            f" (and: {reason})" if status == Status.FAIL else "")
    invalid = [c for c in cells if c.status == Status.INVALID]
    if invalid and status != Status.FAIL:
        return Status.INVALID, "; ".join(c.describe() for c in invalid)
    return status, reason
