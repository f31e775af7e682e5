"""Per-position MTP acceptance of the default's checkpoint in the reference model, with and without a catalogue
defect (issue #23: does ``mtp-hidden-unnormed`` do anything on this model?).

Greedy speculative decoding (:func:`dsa_route.dsa.mtp.speculative_generate`: vLLM's MTP proposer and rejection
sampler at temperature 0), ``--k`` drafts per round, ``--new`` tokens per problem, on ``--n`` tiny-arith test problems
(seed 2, the served parity prompts' seed; 4–8 distractors). Prints one JSON object: per path, the drafts and the
acceptance rate at each draft position.

    PYTHONPATH=. .venv/bin/python scripts/mtp_acceptance_reference.py --n 64 > results/defects/mtp-hidden-unnormed-reference.json
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from dsa_route.dsa.mtp import speculative_generate
from dsa_route.tiny.arith.evaluate import load, prompt_ids
from dsa_route.tiny.arith.sensitivity import injected
from dsa_route.tiny.arith.task import generate


def acceptance(model, tok, problems, k: int, new: int) -> dict:
    """``{"drafts", "per_position": [accepted / drafts at position 1..k]}`` over ``problems``."""
    accepted, drafts = [0] * k, 0
    for problem in problems:
        _, stats = speculative_generate(model, prompt_ids(tok, problem), new, k)
        drafts += stats.num_drafts
        accepted = [a + b for a, b in zip(accepted, stats.accepted_per_pos)]
    return {"drafts": drafts, "per_position": [round(a / drafts, 4) for a in accepted]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="dsa_route/tiny/arith/checkpoint-long")
    ap.add_argument("--defect", default="mtp-hidden-unnormed")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--new", type=int, default=48)
    args = ap.parse_args()
    model, tok = load(args.checkpoint)
    problems = generate(args.n, 2, min_distractors=4, max_distractors=8)
    out = {"args": vars(args)}
    for name, context in (("correct", contextlib.nullcontext()), (args.defect, injected(model, args.defect))):
        with context:
            out[name] = acceptance(model, tok, problems, args.k, args.new)
    norm = next(m for m in model.modules() if type(m).__name__ == "MTPLayer").shared_head.norm.weight.float()
    out["shared_head_norm_weight"] = {"min": round(norm.min().item(), 3), "max": round(norm.max().item(), 3),
                                      "sd": round(norm.std().item(), 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
