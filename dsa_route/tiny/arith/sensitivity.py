"""Does the arithmetic checkpoint's accuracy depend on the DSA path? ``python -m dsa_route.tiny.arith.sensitivity``.

Runs the test problems through the reference model (:mod:`.evaluate`) once on the correct path and once per
injected defect, and prints, per defect, the accuracy (strict / flexible, points) and its drop against the correct
path, *parity*: the fraction of problems whose greedy answer is token-for-token the correct path's, and the
*teacher-forced divergence* the served gate's ``token_divergence`` cell measures (:mod:`harness.judge.divergence`):
per problem the mean over the correct path's greedy tokens of ``|Δ log p|`` (nats / token) when the defective path
scores exactly those tokens (one prefill of prompt + continuation, as ``prompt_logprobs`` scores them), summarised as
its median and the number of problems above ``--tolerance`` (default 0.002, the gate's ``TOKEN_TOLERANCE``), and two
decode-time measures (each path's own KV-cached decode, :func:`dsa_route.tiny.arith.evaluate.greedy`: the decode path,
which teacher forcing never runs):

- *decode divergence between the paths*: per problem the mean ``|Δ log p|`` of the greedy token over the two paths'
  common greedy prefix (before their first differing token), both paths' log p as their decode computed it;
- *decode against prefill* (the served ``decode_divergence`` cell,
  ``harness.judge.decode_divergence.runner_up_gaps``): per
  problem the mean over a path's own greedy tokens of ``|log p_decode − log p_prefill|`` of the decode's runner-up
  token, the prefill a teacher-forced forward over prompt + that path's output; ``above``: problems beyond the correct
  path's own gap by more than ``--decode-tolerance`` (default 0.05, the gate's ``DECODE_TOLERANCE``).

Defects: the catalogue :data:`dsa_route.inject.DEFECTS` (each installed on the whole model by
:func:`dsa_route.dsa.injections.install`, the same hooks the serving path's per-arm ``inject`` setting switches on).
Defects that act on MTP drafts only (``min_spec_tokens`` > 0: greedy answers cannot change) are left out.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from collections.abc import Iterator

import torch

from dsa_route.dsa import DsaForCausalLM
from dsa_route.dsa.injections import install
from dsa_route.inject import DEFECTS

from .evaluate import TEST_SEED, cli_load, cli_parser, evaluate, prompt_ids
from .task import Problem, generate

INJECTIONS = tuple(kind for kind, spec in DEFECTS.items() if not spec.min_spec_tokens)  # greedy-visible
DEFAULT_TOLERANCE = 0.002
"""Nats per token: ``harness.judge.divergence.TOKEN_TOLERANCE``, the per-prompt tie of the served cell (this package
does not import the harness)."""
DEFAULT_DECODE_TOLERANCE = 0.05
"""Nats per position: ``harness.judge.decode_divergence.DECODE_TOLERANCE``, the served decode cell's tie band."""
MIN_DROP_POINTS, MAX_PARITY = 15.0, 0.5
"""What "sparse attention matters" means for the checkpoint: each defect loses at least this many strict-match
points and keeps fewer than this share of the correct path's answers token for token."""


@contextlib.contextmanager
def injected(model: DsaForCausalLM, kind: str) -> Iterator[None]:
    """Defect ``kind`` (:data:`INJECTIONS`) installed on ``model`` inside the block; the correct path restored on exit.
    Raises ValueError for an unknown kind."""
    install(model, kind)
    try:
        yield
    finally:
        install(model, None)


@torch.no_grad()
def forced_logsoftmax(model: DsaForCausalLM, tok, problems: list[Problem],
                      outputs: list[list[int]]) -> list[torch.Tensor]:
    """Per problem ``float32 [len(output), V]``: the log-softmax predicting each of ``outputs``' tokens after the
    prompt, scored in one forward over prompt + output (no KV cache: a prefill, as vLLM's ``prompt_logprobs`` scores a
    sequence)."""
    rows = []
    for problem, output in zip(problems, outputs):
        prompt = prompt_ids(tok, problem)                                         # [1, S]
        ids = torch.cat((prompt, torch.tensor([output], dtype=prompt.dtype)), dim=1)  # [1, S + O]
        rows.append(model(ids)[0, prompt.shape[1] - 1:-1].float().log_softmax(-1))  # [O, V]
    return rows


def forced_logprobs(rows: list[torch.Tensor], outputs: list[list[int]]) -> list[torch.Tensor]:
    """Per problem ``float32 [len(output)]``: log p of each of ``outputs``' tokens in :func:`forced_logsoftmax` rows."""
    return [row.gather(1, torch.tensor(output, dtype=torch.long)[:, None])[:, 0] for row, output in zip(rows, outputs)]


SCORING_TOP_K = 20
"""Top entries per position in :func:`scoring_rows`: what the served scoring requests (``prompt_logprobs`` 20)."""


def scoring_rows(rows: list[torch.Tensor], outputs: list[list[int]], top_k: int = SCORING_TOP_K) -> list[dict]:
    """:func:`forced_logsoftmax` rows as the served scoring's rows (``harness.run.scoring.parse_scores``: per
    problem ``{"index", "logprobs": [log p of each forced token], "top": [[[id, log p] × top_k] per position]}``,
    nats), so the harness's correctness statistics read the reference model's scorings unchanged."""
    out = []
    for index, (row, output) in enumerate(zip(rows, outputs)):
        values, ids = row.topk(min(top_k, row.shape[-1]), dim=-1)                   # [O, k]
        out.append({"index": index, "logprobs": [float(row[k, t]) for k, t in enumerate(output)],
                    "top": [[[int(i), float(v)] for i, v in zip(ids[k], values[k])] for k in range(len(output))]})
    return out


def divergence(base: list[torch.Tensor], other: list[torch.Tensor], tolerance: float) -> dict:
    """Per-problem mean ``|Δ log p|`` (nats / token; empty outputs left out) summarised: ``median``, ``max`` and
    ``above`` (problems past ``tolerance``) of ``scored`` problems, and ``per_problem`` (the values, problem order)."""
    per_problem = [float((a - b).abs().mean()) for a, b in zip(base, other) if len(a)]
    return _summary(per_problem, sum(v > tolerance for v in per_problem), tolerance)


def _summary(per_problem: list[float], above: int, tolerance: float) -> dict:
    """``scored``, ``median``, ``max``, ``above`` (of ``tolerance``) and the ``per_problem`` values (6 decimals)."""
    ordered = sorted(per_problem)
    return {"scored": len(ordered), "median": ordered[len(ordered) // 2] if ordered else None,
            "max": ordered[-1] if ordered else None, "above": above, "tolerance": tolerance,
            "per_problem": [round(v, 6) for v in per_problem]}


def decode_divergence(base_ids: list[list[int]], base_top: list[list], ids: list[list[int]], top: list[list],
                      tolerance: float) -> dict:
    """:func:`divergence`'s summary of the per-problem mean ``|Δ log p|`` (nats / token) of two greedy decodes' own
    log p of their greedy token (``top``: :func:`dsa_route.tiny.arith.evaluate.greedy`'s) over their common prefix
    (the positions before the first differing token: both decoded the same prefix there), plus ``common_tokens``
    (summed over problems) of ``base_tokens``. Problems whose first tokens differ (no common prefix) are left out."""
    per_problem, common = [], 0
    for a, ta, b, tb in zip(base_ids, base_top, ids, top):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        common += n
        if n:
            per_problem.append(sum(abs(ta[i][0][1] - tb[i][0][1]) for i in range(n)) / n)
    return {**_summary(per_problem, sum(v > tolerance for v in per_problem), tolerance),
            "common_tokens": common, "base_tokens": sum(map(len, base_ids))}


def decode_gaps(top: list[list], rows: list[torch.Tensor]) -> list[float | None]:
    """Per problem the mean over its greedy tokens of ``|log p_decode − log p_prefill|`` of the decode's runner-up
    (nats / position): ``top`` from :func:`dsa_route.tiny.arith.evaluate.greedy`, ``rows`` the same path's
    :func:`forced_logsoftmax` of its own outputs; None for an empty output."""
    gaps = []
    for positions, row in zip(top, rows):
        values = [abs(runner_up[1] - float(row[k, runner_up[0]])) for k, (_, runner_up) in enumerate(positions)]
        gaps.append(sum(values) / len(values) if values else None)
    return gaps


def decode_gap_summary(gaps: list[float | None], correct: list[float | None], tolerance: float) -> dict:
    """:func:`decode_gaps` of a path summarised as :func:`divergence`; ``above``: problems whose gap exceeds the
    correct path's by more than ``tolerance`` (the served cell's rule, the correct path as the envelope), also over
    the first 32 (``above_32``, the served default's parity prompts)."""
    pairs = [(g, c) for g, c in zip(gaps, correct) if g is not None and c is not None]
    beyond = [g > c + tolerance for g, c in pairs]
    return {**_summary([g for g, _ in pairs], sum(beyond), tolerance), "above_32": sum(beyond[:32])}


def run(model: DsaForCausalLM, tok, n: int, seed: int = TEST_SEED, kinds: tuple[str, ...] = INJECTIONS,
        mtp_n: int = 0, tolerance: float = DEFAULT_TOLERANCE,
        decode_tolerance: float = DEFAULT_DECODE_TOLERANCE, distractors: tuple[int, int] = (4, 8),
        scorings: dict | None = None) -> dict:
    """``{"correct": {accuracy, mtp_acceptance_rate, mtp_n, decode_vs_prefill}, "<kind>": {accuracy, drop_points,
    parity, divergence, decode_divergence, decode_vs_prefill}}`` over ``n`` test problems (MTP acceptance of the
    correct path on the first ``mtp_n``; divergence: :func:`divergence` of the correct path's greedy tokens scored on
    both paths; decode_divergence: :func:`decode_divergence` of both paths' greedy decodes; decode_vs_prefill:
    :func:`decode_gap_summary` of each path's :func:`decode_gaps`). ``distractors``: the test problems' distractor
    range (:func:`.task.make_problem`; more: longer prompts). ``scorings`` (a dict, filled in): the served-format
    teacher-forced scoring rows (:func:`scoring_rows`) of the correct path's greedy tokens, under ``"correct"`` and
    each defect's name, with the ``"outputs"`` they score."""
    problems = generate(n, seed, min_distractors=distractors[0], max_distractors=distractors[1])
    base = evaluate(model, tok, problems, mtp_n=mtp_n)
    base_rows = forced_logsoftmax(model, tok, problems, base.outputs)
    if scorings is not None:
        scorings.update(outputs=base.outputs, correct=scoring_rows(base_rows, base.outputs))
    base_scores = forced_logprobs(base_rows, base.outputs)
    base_gaps = decode_gaps(base.decode_top, base_rows)
    lengths = sorted(prompt_ids(tok, p).shape[-1] for p in problems)
    report: dict = {"n": n, "distractors": list(distractors),
                    "prompt_tokens": {"min": lengths[0], "median": lengths[len(lengths) // 2], "max": lengths[-1]},
                    "correct": {"accuracy": base.accuracy, "mtp_acceptance_rate": base.mtp_acceptance_rate,
                                "mtp_n": base.mtp_n,
                                "decode_vs_prefill": decode_gap_summary(base_gaps, base_gaps, decode_tolerance)}}
    for kind in kinds:
        with injected(model, kind):
            res = evaluate(model, tok, problems)
            forced = forced_logsoftmax(model, tok, problems, base.outputs)
            scores = forced_logprobs(forced, base.outputs)
            gaps = decode_gaps(res.decode_top, forced_logsoftmax(model, tok, problems, res.outputs))
        if scorings is not None:
            scorings[kind] = scoring_rows(forced, base.outputs)
        same = sum(a == b for a, b in zip(base.outputs, res.outputs)) / n
        report[kind] = {"accuracy": res.accuracy, "parity": same,
                        "divergence": divergence(base_scores, scores, tolerance),
                        "decode_divergence": decode_divergence(base.outputs, base.decode_top, res.outputs,
                                                               res.decode_top, tolerance),
                        "decode_vs_prefill": decode_gap_summary(gaps, base_gaps, decode_tolerance),
                        "drop_points": {f: round(100 * (base.accuracy[f] - res.accuracy[f]), 1) for f in res.accuracy}}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = cli_parser("python -m dsa_route.tiny.arith.sensitivity", __doc__)
    ap.add_argument("--inject", action="append", choices=INJECTIONS, help="defects to try (default: all)")
    ap.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                    help="nats / token: a problem's mean |Δ log p| above it counts (default %(default)s)")
    ap.add_argument("--decode-tolerance", type=float, default=DEFAULT_DECODE_TOLERANCE,
                    help="nats / position: a problem's decode-vs-prefill gap beyond the correct path's by more "
                         "counts (default %(default)s)")
    ap.add_argument("--distractors", type=int, nargs=2, metavar=("MIN", "MAX"), default=(4, 8),
                    help="distractor sentences per test problem (default %(default)s, the committed checkpoint's "
                         "training range; more: longer prompts)")
    ap.add_argument("--scorings-out", default=None,
                    help="write the correct path's and each defect's teacher-forced scoring rows (served format, "
                         "top 20) to this JSON file (for python -m harness.study.divergence_simulation --reference)")
    args = ap.parse_args(argv)
    if not 0 <= args.distractors[0] <= args.distractors[1]:
        ap.error("--distractors needs 0 <= MIN <= MAX")
    if args.tolerance <= 0 or args.decode_tolerance <= 0:
        ap.error("--tolerance and --decode-tolerance must be > 0 (nats)")
    loaded = cli_load(ap, args)
    if loaded is None:
        return 2
    model, tok = loaded
    scorings: dict | None = {} if args.scorings_out else None
    report = run(model, tok, args.n, args.seed, tuple(args.inject or INJECTIONS), args.mtp_n, args.tolerance,
                 args.decode_tolerance, tuple(args.distractors), scorings)
    if scorings is not None:
        meta = {"checkpoint": args.checkpoint, "n": args.n, "seed": args.seed, "distractors": list(args.distractors),
                "top_k": SCORING_TOP_K}
        Path(args.scorings_out).write_text(json.dumps({**meta, **scorings}))
    for kind in ("correct", *(args.inject or INJECTIONS)):
        r = report[kind]
        acc = " ".join(f"{f} {100 * a:5.1f} %" for f, a in r["accuracy"].items())
        extra = "" if kind == "correct" else (
            f"  drop {r['drop_points']} pts  parity {100 * r['parity']:.1f} %  divergence {_line(r['divergence'])}"
            f"  decode {_line(r['decode_divergence'])}  decode vs prefill {_line(r['decode_vs_prefill'], 'nats/position')}")
        print(f"{kind:24s} {acc}{extra}")
    print(json.dumps(report))
    met = [k for k in (args.inject or INJECTIONS) if sensitive(report[k])]
    print(f"sparse attention matters (drop ≥ {MIN_DROP_POINTS:g} pts strict-match and parity < "
          f"{100 * MAX_PARITY:g} %): {len(met)}/{len(args.inject or INJECTIONS)} defects")
    return 0


def _line(summary: dict, unit: str = "nats/token") -> str:
    """``median … max … <unit>, above/scored above tolerance`` of a :func:`divergence` summary."""
    def fmt(value: float | None) -> str:
        return "—" if value is None else f"{value:.4f}"
    return (f"median {fmt(summary['median'])} max {fmt(summary['max'])} {unit}, "
            f"{summary['above']}/{summary['scored']} above {summary['tolerance']:g}")


def sensitive(defect: dict) -> bool:
    """Whether one defect's entry of :func:`run` meets :data:`MIN_DROP_POINTS` and :data:`MAX_PARITY`."""
    return defect["drop_points"]["strict-match"] >= MIN_DROP_POINTS and defect["parity"] < MAX_PARITY


if __name__ == "__main__":
    sys.exit(main())
