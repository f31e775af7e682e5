"""The correctness family of gated cells — teacher-forced token divergence, decode-time divergence and output parity
— each judged against the A/A envelope the same run measured. Pure: functions of scorings and parity rows
(:mod:`harness.run.scoring`, :mod:`harness.run.parity` rows), no files.

**Unit of replication: the prompt** (the parity prompts, 32 on the CPU default). The three cells compare the A/B
comparison (the reference — the baseline's first session, all prompts at once — against the candidate) with the
A/A envelope: the reference against the baseline's second session and against the baseline's first session with
the prompts sent one at a time (another batch composition: batch variance, vLLM #57815).

- ``token_divergence``: per prompt the mean over its continuation's positions of ``|Δ log p|`` of the forced token
  (nats / token). Prompt ``i`` *exceeds* when its A/B value is above the envelope (the larger A/A value) by more than
  :data:`TOKEN_TOLERANCE`, is *below* when the envelope is above the A/B by as much; other prompts are ties.
- ``decode_divergence``: per prompt the mean ``|Δ log p|`` (nats / token) of the greedy token at each position of
  the two collections' common prefix (the positions before their first differing token, where both arms decoded
  the same prefix and chose the same token), each arm's log p as its own decode computed it (the parity requests'
  ``logprobs``, :mod:`harness.run.parity`): the decode path, KV cache and the indexer's k-cache as decode writes it,
  which teacher forcing (a prefill) never runs. Exceed / below / ties as ``token_divergence``, same tie band; a
  prompt with no common prefix in a comparison (first tokens differ: the parity cell's case) is a tie. Measured on
  the reference model (``results/defects/README.md``, "Decode-time divergence").
- ``parity``: per prompt the first position where the greedy outputs differ (∞ when identical). Prompt ``i``
  exceeds when the A/B diverges earlier than every A/A comparison, is below when an A/A comparison diverges earlier.

**Rule** (every cell): the exact one-sided sign test on the non-tied prompts (Dixon & Mood 1946): FAIL when
``P(Binomial(exceed + below, 1/2) ≥ exceed) ≤ α / 3`` — Bonferroni over the family's three cells (:data:`CELLS`) at
the gate's α; on 32 prompts a cell FAILs from 6 prompts beyond the envelope with none below (2⁻⁶ ≤ α/3 = 0.0167 at
α = 0.05). A candidate that is an A/A replicate of the baseline makes its A/B value exchangeable with each A/A value,
so a prompt exceeds the larger of two A/A values with probability ≤ 1/3 ≤ 1/2 given it is not tied: the test's
false-FAIL rate is ≤ α/3 per cell if prompts are independent. Prompts share a server session, so independence is
an assumption; the rate is shown on recorded A/A sessions instead (``tests/fixtures/recorded/scoring-aa``,
``tests/test_divergence.py``). **INVALID** when the envelope itself is unstable: the A/A values exceed the tolerance
(divergence) or diverge (parity) on so many prompts that the same test would FAIL the baseline against itself.

:data:`TOKEN_TOLERANCE` is the floor below which a per-prompt difference is a tie. It is needed because this
machine's A/A is bit-exact (recorded: 0.0 nats at all 1525 positions across three sessions and both batch
compositions), so without a floor any numerical change — a compiled vs an eager path — would FAIL. Decode-time
log-probs are not bit-exact A/A: another batch composition (the prompts one at a time) moves them by up to 0.0006
nats at a token, 0.000014 per prompt, another session by 0.000002 per prompt; the compile-off change moves them by
0.000145 per prompt (median), 0.00096 (max), as it moves the forced ones (the recorded parity of
``tests/fixtures/recorded/scoring-aa``, ``tests/test_divergence.py``), so the same floor serves both divergences.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from harness.judge import token_compare
from harness.rundir.schema import Status

FAMILY = "correctness"
CELLS = ("token_divergence", "decode_divergence", "parity")
TOKEN_TOLERANCE = 0.002
"""Nats per token, the per-prompt mean ``|Δ log p|`` that counts as a tie (the default of the policy's
``token_tolerance``). Derived from the recordings, not assumed:

- the **harmless** candidate of the default (CompilationMode.NONE vs VLLM_COMPILE, ``scoring-aa/``, two sessions ×
  32 prompts against three baseline sessions) is a fixed numerical difference: per prompt median 0.00012, 90th
  percentile 0.00058, max 0.00096 (per token max 0.045, no arg-max flip). The floor is twice its max, so that
  change has no prompt beyond it (another CPU's vector code may round differently: the factor 2 is its room), and
  the sign test FAILs only from 6 of 32 prompts on;
- the **catalogue defects** (``results/defects/README.md``, the reference model on the committed checkpoint): at
  0.002, 13–22 of the first 32 test problems exceed for the quiet defects that change 11–28 % of greedy answers
  while accuracy moves < 2 points (``softmax-scale-small``, ``visibility-off-by-one``, ``index-topk-half``); at the
  former 0.01 (one bf16 rounding step of a logit near 10 at a quarter of the positions) they had 3–11, so two of
  them passed. ``topk-lost-key`` and ``indexer-fp8-scale-floor`` (median 0.0003, at the harmless change's own level)
  and ``stale-index-key`` (decode only: 0 under teacher forcing) stay below any floor that passes the harmless
  change."""


@dataclass
class CorrectnessCell:
    """One cell of the correctness family.

    ``exceed``/``below``/``ties``: prompt counts (module docstring); ``p_fail``: the sign test's one-sided p-value;
    ``alpha``: the level it is tested at (α / 3). ``ab``/``aa``: run summaries of the A/B and envelope
    (:func:`harness.judge.token_compare.summary`, or parity's exact-match rates). ``first``: the first divergent prompt
    (index, position) of the A/B. ``cdf``: the per-token ``|Δ log p|`` quantiles (0–100 %) of A/B and A/A (the report's CDF).
    """

    name: str
    status: Status
    reasons: list[str] = field(default_factory=list)
    exceed: int = 0
    below: int = 0
    ties: int = 0
    p_fail: float | None = None
    alpha: float | None = None
    ab: dict[str, Any] = field(default_factory=dict)
    aa: dict[str, Any] = field(default_factory=dict)
    first: tuple[int, int] | None = None
    cdf: dict[str, list[float]] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for the summary and the terminal."""
        if self.status == Status.INVALID:
            return f"{self.name}: INVALID — {'; '.join(self.reasons)}"
        where = (f"; first divergence: prompt {self.first[0]} at token {self.first[1]}"
                 if self.first is not None else "")
        return (f"{self.name}: {self.status} — {self.exceed} prompt(s) beyond the A/A envelope, {self.below} within "
                f"it by more, {self.ties} tied; sign test p = {self.p_fail:.3g} vs α/{len(CELLS)} = {self.alpha:g}"
                f"{where}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "family": FAMILY, "result": str(self.status), "reasons": list(self.reasons),
                "exceed": self.exceed, "below": self.below, "ties": self.ties, "p_fail": self.p_fail,
                "alpha": self.alpha, "ab": self.ab, "aa": self.aa,
                "first": None if self.first is None else list(self.first), "cdf": self.cdf,
                "note": self.describe()}


def sign_test(exceed: int, below: int) -> float:
    """One-sided exact sign test: ``P(Binomial(exceed + below, 1/2) ≥ exceed)`` (1.0 with no untied prompt)."""
    n = exceed + below
    return float(sum(math.comb(n, k) for k in range(exceed, n + 1)) / 2 ** n) if n else 1.0


def status_of(exceed: int, below: int, aa_unstable: int, alpha: float) -> Status:
    """FAIL / PASS by the sign test at ``alpha`` / len(:data:`CELLS`); INVALID when ``aa_unstable`` prompts alone
    would FAIL."""
    level = alpha / len(CELLS)
    if sign_test(aa_unstable, 0) <= level:
        return Status.INVALID
    return Status.FAIL if sign_test(exceed, below) <= level else Status.PASS


def _verdict(name: str, exceed: int, below: int, ties: int, aa_unstable: int, alpha: float) -> CorrectnessCell:
    """The cell's status from its counts; INVALID when ``aa_unstable`` prompts of the envelope alone would FAIL."""
    level = alpha / len(CELLS)
    status = status_of(exceed, below, aa_unstable, alpha)
    if status == Status.INVALID:
        return CorrectnessCell(name, Status.INVALID, [
            f"the A/A envelope is unstable: the baseline differs from itself on {aa_unstable} prompt(s), which the "
            "same test would call a defect; rerun on a quieter machine or check the baseline's determinism"],
            exceed, below, ties, alpha=level)
    return CorrectnessCell(name, status, [], exceed, below, ties, sign_test(exceed, below), level)


def _per_prompt_mean(comparison: Mapping[str, Any]) -> dict[int, float]:
    return {int(p["index"]): float(np.nanmean(p["abs_dlogp"])) if len(p["abs_dlogp"]) else 0.0
            for p in comparison["prompts"]}


def token_values(reference: Sequence[Mapping], candidate: Sequence[Mapping], aa: Sequence[Sequence[Mapping]]
                 ) -> tuple[dict[int, float], dict[int, float]]:
    """Per prompt the A/B mean ``|Δ log p|`` and the A/A envelope (the larger A/A value), nats / token."""
    ab = _per_prompt_mean(token_compare.compare_scores(reference, candidate))
    aa_values = [_per_prompt_mean(token_compare.compare_scores(reference, rows)) for rows in aa]
    return ab, {i: max(values[i] for values in aa_values) for i in ab}


def token_counts(ab: Sequence[float], envelope: Sequence[float], tolerance: float = TOKEN_TOLERANCE
                 ) -> tuple[int, int, int]:
    """(exceed, below, unstable) prompt counts of the divergence cell from paired per-prompt values."""
    return (sum(1 for a, e in zip(ab, envelope) if a > e + tolerance),
            sum(1 for a, e in zip(ab, envelope) if e > a + tolerance),
            sum(1 for e in envelope if e > tolerance))


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
    exceed, below, unstable = token_counts([ab[i] for i in keys], [envelope[i] for i in keys], tolerance)
    cell = _verdict("token_divergence", exceed, below, len(ab) - exceed - below, unstable, alpha)
    ab_cmp = token_compare.compare_scores(reference, candidate)
    aa_cmps = [token_compare.compare_scores(reference, rows) for rows in aa]
    cell.first = next(((p["index"], pos) for p in ab_cmp["prompts"] for pos, d in enumerate(p["abs_dlogp"])
                       if ab[p["index"]] > envelope[p["index"]] + tolerance and d > tolerance), None)
    aa_tokens = [v for c in aa_cmps for p in c["prompts"] for v in p["abs_dlogp"] if math.isfinite(v)]
    cell.ab = {**ab_cmp["summary"], "kl_lb_max": _max_kl(ab_cmp)}
    cell.aa = {**token_compare.summary(aa_tokens, [f for c in aa_cmps for p in c["prompts"] for f in p["flip"]]),
               "comparisons": len(aa_cmps)}
    ab_tokens = [v for p in ab_cmp["prompts"] for v in p["abs_dlogp"] if math.isfinite(v)]
    cell.cdf = {"quantiles": [q / 100 for q in range(101)], "ab": _quantiles(ab_tokens), "aa": _quantiles(aa_tokens)}
    return cell


def _quantiles(values: Sequence[float]) -> list[float]:
    """The 0, 1, …, 100 % quantiles of ``values`` (empty: [])."""
    return [float(v) for v in np.quantile(values, np.linspace(0, 1, 101))] if len(values) else []


def _max_kl(comparison: Mapping[str, Any]) -> float | None:
    values = [v for p in comparison["prompts"] for v in p["kl_lb"] if math.isfinite(v)]
    return max(values) if values else None


def _decode_deltas(reference: Sequence[Mapping], other: Sequence[Mapping]) -> dict[int, list[float]]:
    """Per prompt the per-position ``|Δ log p|`` (nats) of the greedy token over the common prefix of two parity
    collections (positions before the first differing token; a missing log p is left out)."""
    by_index = {int(row["index"]): row for row in other}
    if sorted(by_index) != sorted(int(row["index"]) for row in reference):
        raise ValueError("the parity collections cover different prompts")
    deltas = {}
    for row in reference:
        twin = by_index[int(row["index"])]
        first = token_compare.first_divergence(row["token_ids"], twin["token_ids"])
        common = len(row["token_ids"]) if math.isinf(first) else int(first)
        pairs = zip(row["logprobs"][:common], twin["logprobs"][:common])
        deltas[int(row["index"])] = [abs(a - b) for a, b in pairs if math.isfinite(a) and math.isfinite(b)]
    return deltas


def has_decode_logprobs(rows: Sequence[Mapping]) -> bool:
    """Whether parity rows carry the greedy tokens' decode-time log p (``logprobs``, one per token: every
    :func:`harness.run.parity.collect` row does; a row of other tooling or a hand-made file may not)."""
    return all(len(row.get("logprobs") or ()) == len(row["token_ids"]) for row in rows)


def decode_values(reference: Sequence[Mapping], candidate: Sequence[Mapping], aa: Sequence[Sequence[Mapping]]
                  ) -> tuple[dict[int, float], dict[int, float]]:
    """Per prompt the A/B mean ``|Δ log p|`` over the common greedy prefix and the A/A envelope (the larger A/A
    value), nats / token. A prompt without common prefix in a comparison is NaN there, so it ties
    (:func:`token_counts` compares NaN false); the envelope is the larger finite A/A value (NaN when none)."""
    def means(other: Sequence[Mapping]) -> dict[int, float]:
        return {i: float(np.mean(d)) if d else math.nan for i, d in _decode_deltas(reference, other).items()}
    ab = means(candidate)
    aa_values = [means(rows) for rows in aa]
    return ab, {i: max((v[i] for v in aa_values if math.isfinite(v[i])), default=math.nan) for i in ab}


def decode_cell(reference: Sequence[Mapping], candidate: Sequence[Mapping], aa: Sequence[Sequence[Mapping]],
                alpha: float, tolerance: float = TOKEN_TOLERANCE) -> CorrectnessCell:
    """The ``decode_divergence`` cell from greedy outputs and their decode-time log p
    (:func:`harness.run.parity.collect` rows): the ``reference``, the ``candidate`` and the A/A ``aa`` collections
    (≥ 1); ``tolerance``: the tie band (nats / token). ``ab`` / ``aa``: the per-token ``|Δ log p|`` summary over the
    common prefixes (:func:`harness.judge.token_compare.summary`; no arg-max flips there by construction), the A/B
    with ``common_tokens`` of the reference's ``tokens``.

    Raises:
        ValueError: no A/A collection, or the collections cover different prompts.
    """
    if not aa:
        raise ValueError("the decode divergence cell needs at least one A/A collection")
    ab, envelope = decode_values(reference, candidate, aa)
    keys = sorted(ab)
    exceed, below, unstable = token_counts([ab[i] for i in keys], [envelope[i] for i in keys], tolerance)
    cell = _verdict("decode_divergence", exceed, below, len(ab) - exceed - below, unstable, alpha)
    ab_deltas = _decode_deltas(reference, candidate)
    aa_deltas = [_decode_deltas(reference, rows) for rows in aa]
    cell.first = next(((i, pos) for i in keys if ab[i] > envelope[i] + tolerance
                       for pos, d in enumerate(ab_deltas[i]) if d > tolerance), None)
    ab_tokens = [v for i in keys for v in ab_deltas[i]]
    aa_tokens = [v for deltas in aa_deltas for i in keys for v in deltas[i]]
    cell.ab = {**token_compare.summary(ab_tokens, []), "common_tokens": len(ab_tokens),
               "tokens": sum(len(row["token_ids"]) for row in reference)}
    cell.aa = {**token_compare.summary(aa_tokens, []), "comparisons": len(aa)}
    cell.cdf = {"quantiles": [q / 100 for q in range(101)], "ab": _quantiles(ab_tokens), "aa": _quantiles(aa_tokens)}
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
    cell = _verdict("parity", exceed, below, len(ab) - exceed - below, unstable, alpha)
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
          alpha: float, tolerance: float = TOKEN_TOLERANCE) -> list[CorrectnessCell]:
    """The family's cells from what the run directory holds (``None`` for a file that is absent): ``scorings`` and
    ``greedy`` keyed by :data:`SCORINGS` labels; ``tolerance``: the divergence cells' tie band (nats / token). An A/A
    label may be missing (a run of one session has no ``baseline-2``: the envelope is then the batch composition
    alone, and a note says so); a missing reference or candidate, or no A/A at all, makes the cell INVALID with the
    file to fix. ``decode_divergence`` is left out (not measured) when a present parity file's rows lack the decode
    log p (:func:`has_decode_logprobs`)."""
    cells = []
    builders = (("token_divergence", "scoring", scorings, functools.partial(divergence_cell, tolerance=tolerance)),
                ("decode_divergence", "parity", greedy, functools.partial(decode_cell, tolerance=tolerance)),
                ("parity", "parity", greedy, parity_cell))
    for name, folder, data, build in builders:
        if name == "decode_divergence" and not all(has_decode_logprobs(rows) for rows in data.values() if rows):
            continue
        missing = [f"{folder}/{label}.json" for label in ("baseline", "candidate") if data.get(label) is None]
        aa = [data[label] for label in AA_LABELS if data.get(label) is not None]
        if not aa:
            missing.append(f"{folder}/{{{','.join(AA_LABELS)}}}.json (the A/A envelope)")
        if missing:
            cells.append(CorrectnessCell(name, Status.INVALID, [
                f"{', '.join(missing)} absent: the server died or the run predates the correctness cells; rerun "
                "(dsa-bench compare --resume) or set [parity] gated = false"]))
            continue
        try:
            cell = build(data["baseline"], data["candidate"], aa, alpha)
        except ValueError as error:
            cell = CorrectnessCell(name, Status.INVALID, [f"{folder}: {error}; rerun the run's checks"])
        if len(aa) < len(AA_LABELS):
            cell.reasons.append("A/A envelope from " + ", ".join(l for l in AA_LABELS if data.get(l) is not None)
                                + " only")
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
