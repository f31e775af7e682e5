"""Score the arithmetic checkpoint in the reference model: ``python -m dsa_route.tiny.arith.evaluate [--n 128]``.

Each test problem (seed ``--seed``, default 1: the test split) is prompted 0-shot exactly as lm-eval's ``gsm8k`` task
prompts it (``"Question: {question}\\nAnswer:"``), decoded greedily by :class:`dsa_route.dsa.DsaForCausalLM` (sparse
attention over its KV cache, FP8 indexer, as served) until ``<|eos|>`` or ``--max-new-tokens``, and scored with
lm-eval's own ``gsm8k`` filters and metric, read from the installed task file: ``strict-match`` (``#### N``) and
``flexible-extract`` (the last number), then ``exact_match`` with the task's ``regexes_to_ignore`` and
``ignore_case``.

MTP acceptance proxy: the same prompts through ``DsaForCausalLM.generate_mtp`` (1 speculative token, vLLM's
acceptance definitions), each run for exactly its greedy answer's length so tokens past ``<|eos|>`` do not count.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dsa_route.dsa import DsaForCausalLM

from .model import CHECKPOINT_DIR
from .task import TEST_SEED, Problem, generate, prompt_text
from .tokenizer import EOS_ID, load_tokenizer


@functools.lru_cache(maxsize=1)
def gsm8k_task() -> dict:
    """lm-eval's installed ``tasks/gsm8k/gsm8k.yaml`` as a dict. Raises RuntimeError when lm-eval is missing."""
    import yaml

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("lm-eval is not installed; run scripts/setup.sh")
    return yaml.safe_load((Path(list(spec.submodule_search_locations)[0]) / "tasks/gsm8k/gsm8k.yaml").read_text())


def score(completion: str, answer: str) -> dict[str, bool]:
    """``{filter name: correct}`` for one completion against a GSM8K ``answer`` text, by lm-eval's gsm8k filters
    (``RegexFilter`` + ``take_first``) and ``exact_match`` settings."""
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter

    task = gsm8k_task()
    metric = task["metric_list"][0]
    result = {}
    for flt in task["filter_list"]:
        regex = flt["filter"][0]
        extracted = RegexFilter(regex["regex_pattern"], regex.get("group_select", 0)).apply([[completion]], [{}])
        em = exact_match_hf_evaluate([list(extracted)[0][0]], [answer], regexes_to_ignore=metric["regexes_to_ignore"],
                                     ignore_case=metric["ignore_case"],
                                     ignore_punctuation=metric["ignore_punctuation"])
        result[flt["name"]] = bool(em["exact_match"])
    return result


def prompt_ids(tok, problem: Problem) -> torch.Tensor:
    """``long [1, S]``: ``<|bos|>`` + the lm-eval prompt's tokens (as vLLM tokenizes it)."""
    return torch.tensor([tok.encode(prompt_text(problem.question)).ids])


@torch.no_grad()
def greedy(model: DsaForCausalLM, ids: torch.Tensor, max_new_tokens: int
           ) -> tuple[list[int], list[list[tuple[int, float]]]]:
    """Greedy tokens after ``ids [1,S]`` until ``<|eos|>`` (excluded) or ``max_new_tokens``, and at each of them the
    top 2 ``(id, log p)`` of the logits that chose it (nats, float32 log-softmax; the greedy token first): the
    prefill's last row for the first token, then one KV-cached decode step per token — what a server's ``logprobs``
    2 returns for a greedy request."""
    cache = model.new_cache(1, ids.shape[1] + max_new_tokens, with_mtp=False)
    logp = model.forward(ids, None, cache)[0, -1].float().log_softmax(-1)        # [V]
    out, tops = [], []
    token = int(logp.argmax())
    while token != EOS_ID and len(out) < max_new_tokens:
        runner_up = int(logp.index_fill(0, torch.tensor([token]), float("-inf")).argmax())
        out.append(token)
        tops.append([(token, float(logp[token])), (runner_up, float(logp[runner_up]))])
        logp = model.forward(torch.tensor([[token]]), None, cache)[0, -1].float().log_softmax(-1)
        token = int(logp.argmax())
    return out, tops


@dataclass
class EvalResult:
    """Accuracy per filter (fractions), ``n`` problems, MTP acceptance over ``mtp_n`` of them, the outputs and their
    decode-time top 2 (:func:`greedy`)."""

    n: int
    accuracy: dict[str, float]
    mtp_acceptance_rate: float | None = None
    mtp_acceptance_length: float | None = None
    mtp_n: int = 0
    outputs: list[list[int]] = field(default_factory=list, repr=False)
    decode_top: list[list[list[tuple[int, float]]]] = field(default_factory=list, repr=False)
    correct: list[dict[str, bool]] = field(default_factory=list, repr=False)


def evaluate(model: DsaForCausalLM, tok, problems: list[Problem], *, max_new_tokens: int = 96,
             mtp_n: int = 0) -> EvalResult:
    """Greedy answers and scores for ``problems``; MTP acceptance on the first ``mtp_n`` of them."""
    outputs, decode_top, correct = [], [], []
    for p in problems:
        out, tops = greedy(model, prompt_ids(tok, p), max_new_tokens)
        outputs.append(out)
        decode_top.append(tops)
        correct.append(score(tok.decode(out), p.answer))
    accuracy = {name: sum(c[name] for c in correct) / len(problems) for name in correct[0]}
    result = EvalResult(n=len(problems), accuracy=accuracy, outputs=outputs, decode_top=decode_top,
                        correct=correct)
    if mtp_n and model.config.num_nextn_predict_layers:
        rounds = drafted = accepted = 0
        for p, out in list(zip(problems, outputs))[:mtp_n]:
            if len(out) < 2:
                continue
            _, stats = model.generate_mtp(prompt_ids(tok, p), len(out), 1)
            rounds, drafted = rounds + stats.num_drafts, drafted + stats.num_draft_tokens
            accepted += stats.num_accepted_tokens
            result.mtp_n += 1
        if drafted:
            result.mtp_acceptance_rate = accepted / drafted
            result.mtp_acceptance_length = 1 + accepted / rounds
    return result


def load(checkpoint: str | Path, dtype: str = "bfloat16") -> tuple[DsaForCausalLM, object]:
    """``(model, tokenizer)`` from a checkpoint directory, the model in ``dtype``."""
    return (DsaForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, dtype)), load_tokenizer(checkpoint))


def cli_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """The options the evaluation scripts share: checkpoint, number of test problems, seed, dtype, MTP proxy size,
    threads."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    ap.add_argument("--checkpoint", default=str(CHECKPOINT_DIR))
    ap.add_argument("--n", type=int, default=128, help="test problems (default %(default)s)")
    ap.add_argument("--seed", type=int, default=TEST_SEED, help="problem stream (default %(default)s: the test split)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--mtp-n", type=int, default=32, help="problems for the MTP acceptance proxy (0: skip)")
    ap.add_argument("--threads", type=int, default=2)
    return ap


def cli_load(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[DsaForCausalLM, object] | None:
    """Check the shared options and load the checkpoint; None (after a one-line error) when it is missing."""
    if args.n <= 0:
        ap.error("--n must be > 0")
    if not (Path(args.checkpoint) / "config.json").is_file():
        print(f"{args.checkpoint}: no checkpoint (config.json missing); pass --checkpoint DIR", file=sys.stderr)
        return None
    torch.set_num_threads(args.threads)
    return load(args.checkpoint, args.dtype)


def main(argv: list[str] | None = None) -> int:
    ap = cli_parser("python -m dsa_route.tiny.arith.evaluate", __doc__)
    ap.add_argument("--show", type=int, default=0, help="print this many completions")
    ap.add_argument("--distractors", type=int, nargs=2, metavar=("MIN", "MAX"), default=(4, 8),
                    help="distractor sentences per problem (default %(default)s, the training range; more: longer "
                         "prompts, the indexer selecting from more keys)")
    args = ap.parse_args(argv)
    low, high = args.distractors
    if not 0 <= low <= high:
        ap.error("--distractors needs 0 <= MIN <= MAX")
    loaded = cli_load(ap, args)
    if loaded is None:
        return 2
    model, tok = loaded
    problems = generate(args.n, args.seed, min_distractors=low, max_distractors=high)
    result = evaluate(model, tok, problems, mtp_n=args.mtp_n)
    for p, out in list(zip(problems, result.outputs))[:args.show]:
        print(f"--- target {p.target}\n{tok.decode(out)}")
    lengths = sorted(prompt_ids(tok, p).shape[-1] for p in problems)
    figures = {k: v for k, v in asdict(result).items() if k not in ("outputs", "decode_top", "correct")}
    spread = {"min": lengths[0], "median": lengths[len(lengths) // 2], "max": lengths[-1]}
    print(json.dumps({**figures, "distractors": [low, high], "prompt_tokens": spread}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
