"""Output parity between the arms: the same fixed prompts, greedy, to each arm's server; compare the token ids.

Before the load sweep each arm gets the scenario's ``[parity]`` prompts (:func:`prompts_of`: :func:`fixed_prompts`,
or the arithmetic task's own 0-shot prompts, :func:`task_prompts`, short and optionally long; default 16, all sent at
once unless
``concurrency`` says otherwise; see :func:`collect`), ``max_tokens`` 64, temperature 0, ``ignore_eos`` by default
(every prompt yields exactly ``max_tokens`` tokens; off, a request stops at the model's end of sequence),
``logprobs`` 2 (the sampled token's logprob plus the top 2), ``return_token_ids`` and
``return_tokens_as_token_ids`` (top-logprob keys are ``"token_id:<id>"``, unambiguous even when two byte-level tokens
decode to the same text). Fields as in vLLM 0.32 ``entrypoints/openai/completion/protocol.py``
(``CompletionRequest``, ``CompletionResponseChoice.token_ids``, ``CompletionLogProbs``).

:func:`compare` reports, over prompts: the exact-match rate (identical token-id sequences), the first divergence
position per prompt (0-based index into the generated tokens), and the largest ``|Δ logprob|`` of the sampled token at
matched positions (natural log, nats). At a divergence it gives each arm's top-1 − top-2 logprob margin and labels the
divergence a **near-tie** when, in both arms, the two competing tokens are the arm's top two and their logprobs are
within ``near_tie_tol`` nats: then the arms differ by which side of a tie rounding fell, not by what they compute.
Dummy weights make every logit equal (top-1 logprob = −ln V), so every divergence there is a near-tie; use the
known-answer checkpoint (:mod:`dsa_route.tiny.v3` preset ``tiny-deepseek-v3-repeat``) for a parity check that means something.

Run-dir files: ``parity/<arm>.json`` (what :func:`collect` returned, plus the request settings) and ``parity.json``
(the :func:`compare` result; the report's ``parity`` section reads it).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any, Mapping, Sequence

from harness.run.scenario import ParitySpec
from harness.rundir import schema
from harness.rundir import store as records
from harness.rundir.store import RunDir


DEFAULT_NEAR_TIE_TOL = 0.05
"""Nats. bfloat16 keeps 8 significant bits (relative rounding 2⁻⁹ ≈ 0.2 %), so two execution paths of one model can
move a logit of magnitude ~10–20 by a few hundredths; two tokens closer than this are a tie for parity purposes."""

_SUBJECTS = ("Natalia", "The farmer", "A baker", "Tom", "The library", "Maria", "A train", "The school", "Wei", "Sofia")
_ACTIONS = ("sold 48 clips in April and half as many in May.", "buys 3 boxes of 12 eggs each week.",
            "reads 25 pages every day for two weeks.", "walks 4 miles to the park and back.",
            "bakes 60 cookies and gives away a third of them.", "saves 7 dollars a day for 30 days.",
            "has 5 red marbles and twice as many blue ones.", "travels 120 miles in 3 hours.")
_TAILS = ("How many are there in total?", "What is the answer?", "Let's think step by step.",
          "Explain the result in one sentence.", "Answer:", "The total is", "", "So the number is")


def fixed_prompts(n: int = 16, seed: int = 0) -> list[str]:
    """``n`` deterministic English prompts (a function of ``n`` and ``seed`` only; no tokenizer needed).

    GSM8K-like sentences of varied length (1–4 sentences), plus a few plain arithmetic lines, so the prompts cover
    the words and digits every tokenizer of the tiny model was trained on.
    """
    rng = random.Random(seed)
    prompts = []
    for index in range(n):
        if index % 4 == 3:
            a, b = rng.randrange(10, 999), rng.randrange(2, 99)
            prompts.append(f"{a} + {b} = {a + b}. {b} * {a % 50} =")
            continue
        sentences = [f"{rng.choice(_SUBJECTS)} {rng.choice(_ACTIONS)}" for _ in range(1 + index % 3)]
        tail = rng.choice(_TAILS)
        prompts.append(" ".join(sentences + ([tail] if tail else [])))
    return prompts


PARITY_TASK_SEED = 2
"""Seed of the ``tiny-arith`` parity problems: a stream neither the test split (1) nor the training stream (0)."""


def task_prompts(n: int = 16, seed: int = PARITY_TASK_SEED, distractors: tuple[int, int] = (4, 8)) -> list[str]:
    """``n`` 0-shot prompts of the arithmetic task (:mod:`dsa_route.tiny.arith.task`), exactly as lm-eval's ``gsm8k``
    prompts them (``"Question: …\nAnswer:"``): what the trained ``tiny-deepseek-v32-arith`` model answers.
    ``distractors``: (min, max) distractor sentences per problem (4–8: the task's own; more: longer prompts)."""
    from dsa_route.tiny.arith.task import generate, prompt_text

    low, high = distractors
    return [prompt_text(problem.question)
            for problem in generate(n, seed, min_distractors=low, max_distractors=high)]


def prompts_of(spec: ParitySpec) -> list[str]:
    """The parity prompts of a scenario's ``[parity]``: ``n`` of ``prompts`` (``generic`` or ``tiny-arith``), then
    ``long_n`` long ``tiny-arith`` ones (``long_distractors``). Prompt ``i ≥ n`` is long."""
    if spec.prompts == "generic":
        return fixed_prompts(spec.n)
    return task_prompts(spec.n) + (task_prompts(spec.long_n, distractors=spec.long_distractors) if spec.long_n else [])


def length_error(spec: ParitySpec, tokenizer: str, max_model_len: int) -> str | None:
    """One line when the longest parity prompt plus ``spec.max_tokens`` exceeds ``max_model_len`` (vLLM answers such a
    request with 400 and every correctness cell goes INVALID); None when it fits or ``tokenizer`` (a model directory)
    has no local ``tokenizer.json`` (a Hugging Face id: the fixed generic prompts are ≈ 30 tokens)."""
    path = Path(tokenizer) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    encoder = Tokenizer.from_file(str(path))
    longest = max(len(encoder.encode(text).ids) for text in prompts_of(spec))
    if longest + spec.max_tokens <= max_model_len:
        return None
    return (f"the longest parity prompt ({longest} tokens) + parity.max_tokens {spec.max_tokens} exceeds "
            f"model.max_model_len {max_model_len}; lower parity.long_distractors or parity.max_tokens, or raise "
            "model.max_model_len")


def _token_id(key: str) -> int:
    """``"token_id:123"`` → 123 (``return_tokens_as_token_ids`` format)."""
    return int(str(key).rsplit(":", 1)[-1])


def parse_choice(choice: Mapping[str, Any]) -> dict[str, Any]:
    """One ``/v1/completions`` choice (requested as :func:`request_body` does) → ``{"token_ids", "logprobs",
    "top", "prompt_token_ids"}``: the generated ids, each id's logprob, per position the top entries
    ``[[id, logprob], ...]`` sorted by logprob (descending), and the prompt's ids as the server tokenized them
    (``CompletionResponseChoice.prompt_token_ids``; what :mod:`harness.run.scoring` forces).

    Raises:
        ValueError: the choice lacks ``token_ids`` or ``logprobs`` (the server ignored ``return_token_ids``).
    """
    token_ids = choice.get("token_ids")
    logprobs = choice.get("logprobs") or {}
    if token_ids is None or not logprobs.get("token_logprobs"):
        raise ValueError("completion has no token_ids/logprobs; the server must honour return_token_ids and logprobs")
    top = []
    for entry in logprobs.get("top_logprobs") or []:
        pairs = sorted(((_token_id(k), float(v)) for k, v in (entry or {}).items()), key=lambda kv: -kv[1])
        top.append([[tid, lp] for tid, lp in pairs])
    chosen = [float(v) if v is not None else float("nan") for v in logprobs["token_logprobs"]]
    if len(chosen) != len(token_ids):
        raise ValueError(f"token_ids ({len(token_ids)}) and token_logprobs ({len(chosen)}) differ in length")
    prompt_ids = choice.get("prompt_token_ids")
    return {"token_ids": [int(t) for t in token_ids], "logprobs": chosen, "top": top,
            "prompt_token_ids": None if prompt_ids is None else [int(t) for t in prompt_ids]}


def request_body(served_model_name: str, prompt: str, max_tokens: int, seed: int = 0,
                 ignore_eos: bool = True) -> dict[str, Any]:
    """The ``/v1/completions`` body of one parity request (greedy, ``max_tokens`` — exactly that many unless
    ``ignore_eos`` is false —, logprobs top 2, token ids)."""
    return {"model": served_model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "seed": seed, "ignore_eos": ignore_eos, "logprobs": 2, "return_token_ids": True,
            "return_tokens_as_token_ids": True}


def collect(base_url: str, served_model_name: str, prompts: Sequence[str], max_tokens: int = 64,
            headers: Mapping[str, str] | None = None, timeout_s: float = 300.0,
            concurrency: int | None = None, ignore_eos: bool = True) -> list[dict[str, Any]]:
    """Send the prompts, at most ``concurrency`` in flight (None: all at once), and record the generated tokens.

    All at once is the default because it is ~9× faster on 2 CPU cores (16 × 64 tokens on cpu-tiny: 2.9 s against
    26.5 s one by one) and both arms then get the same request pattern; ``concurrency=1`` gives every request a batch
    of its own, which rules out batch-size-dependent numerics as a cause of a divergence.

    Returns one dict per prompt, in prompt order: ``{"index", "prompt", "text", "finish_reason", "token_ids",
    "logprobs", "top"}`` (see :func:`parse_choice`).

    Raises:
        requests.RequestException: a request failed or timed out (``timeout_s`` per request).
        ValueError: an answer lacks token ids or logprobs.
    """
    from concurrent.futures import ThreadPoolExecutor

    import requests

    def one(index: int) -> dict[str, Any]:
        prompt = prompts[index]
        response = requests.post(f"{base_url}/v1/completions",
                                 json=request_body(served_model_name, prompt, max_tokens, ignore_eos=ignore_eos),
                                 headers=dict(headers or {}), timeout=timeout_s)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        return {"index": index, "prompt": prompt, "text": choice.get("text", ""),
                "finish_reason": choice.get("finish_reason"), **parse_choice(choice)}

    if not prompts:
        return []
    workers = max(1, min(len(prompts), concurrency or len(prompts)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, range(len(prompts))))


def _margin(top: Sequence[Sequence[float]]) -> float | None:
    """Top-1 − top-2 logprob at one position (None with fewer than two entries)."""
    return float(top[0][1]) - float(top[1][1]) if len(top) >= 2 else None


def _gap(top: Sequence[Sequence[float]], first: int, second: int) -> float | None:
    """``|logprob(first) − logprob(second)|`` when both ids are among this position's top two, else None."""
    best = {int(tid): float(lp) for tid, lp in list(top)[:2]}
    if first in best and second in best:
        return abs(best[first] - best[second])
    return None


def compare_prompt(base: Mapping[str, Any], cand: Mapping[str, Any], near_tie_tol: float) -> dict[str, Any]:
    """One prompt's comparison: first divergence, matched tokens, max |Δ logprob| at matched positions and, at a
    divergence, each arm's margin and the near-tie label (see the module docstring)."""
    ids_b, ids_c = list(base["token_ids"]), list(cand["token_ids"])
    length = min(len(ids_b), len(ids_c))
    first = next((i for i in range(length) if ids_b[i] != ids_c[i]), None)
    if first is None and len(ids_b) != len(ids_c):
        first = length
    matched = length if first is None else first
    diffs = [abs(base["logprobs"][i] - cand["logprobs"][i]) for i in range(matched)
             if math.isfinite(base["logprobs"][i]) and math.isfinite(cand["logprobs"][i])]
    result: dict[str, Any] = {
        "prompt_index": base.get("index"), "prompt": base.get("prompt", ""),
        "match": first is None, "position": first, "matched_tokens": matched,
        "tokens_baseline": len(ids_b), "tokens_candidate": len(ids_c),
        "max_logprob_diff": max(diffs) if diffs else None,
        "margin_baseline": None, "margin_candidate": None, "margin": None, "near_tie": None,
        "token_baseline": None, "token_candidate": None,
    }
    if first is not None and first < length:
        top_b = base["top"][first] if first < len(base.get("top", [])) else []
        top_c = cand["top"][first] if first < len(cand.get("top", [])) else []
        gap_b, gap_c = _gap(top_b, ids_b[first], ids_c[first]), _gap(top_c, ids_b[first], ids_c[first])
        margin_b, margin_c = _margin(top_b), _margin(top_c)
        result.update({
            "token_baseline": ids_b[first], "token_candidate": ids_c[first],
            "margin_baseline": margin_b, "margin_candidate": margin_c,
            "margin": max((m for m in (margin_b, margin_c) if m is not None), default=None),
            "near_tie": gap_b is not None and gap_c is not None and max(gap_b, gap_c) <= near_tie_tol,
        })
    elif first is not None:
        result["near_tie"] = False   # one arm stopped earlier: not a tie between two tokens
    return result


def compare(baseline: Sequence[Mapping[str, Any]], candidate: Sequence[Mapping[str, Any]],
            near_tie_tol: float = DEFAULT_NEAR_TIE_TOL) -> dict[str, Any]:
    """Compare two :func:`collect` results prompt by prompt (paired by ``index``).

    Returns the report's ``parity`` section::

        {"prompts_total", "exact_matches", "exact_match_rate_pct",    # % of prompts with identical token ids
         "tolerance",                                                   # near_tie_tol, nats
         "max_logprob_diff",                                            # max over prompts, matched positions only
         "near_ties", "failures",                                       # divergences labelled near-tie / not
         "divergences": [compare_prompt(...) for diverging prompts, failures first, then by position],
         "prompts": [compare_prompt(...) for every prompt]}

    Raises:
        ValueError: the two lists do not hold the same prompts.
    """
    by_index = {row["index"]: row for row in candidate}
    if sorted(by_index) != sorted(row["index"] for row in baseline):
        raise ValueError("baseline and candidate parity results cover different prompts; re-run both arms")
    per_prompt = []
    for base in sorted(baseline, key=lambda row: row["index"]):
        cand = by_index[base["index"]]
        if base.get("prompt") != cand.get("prompt"):
            raise ValueError(f"prompt {base['index']} differs between the arms; re-run both arms")
        per_prompt.append(compare_prompt(base, cand, near_tie_tol))
    total = len(per_prompt)
    matches = sum(1 for row in per_prompt if row["match"])
    diverging = [row for row in per_prompt if not row["match"]]
    diverging.sort(key=lambda row: (bool(row["near_tie"]), row["position"] or 0, row["prompt_index"]))
    diffs = [row["max_logprob_diff"] for row in per_prompt if row["max_logprob_diff"] is not None]
    return {
        "prompts_total": total, "exact_matches": matches,
        "exact_match_rate_pct": 100.0 * matches / total if total else None,
        "tolerance": near_tie_tol,
        "max_logprob_diff": max(diffs) if diffs else None,
        "near_ties": sum(1 for row in diverging if row["near_tie"]),
        "failures": sum(1 for row in diverging if not row["near_tie"]),
        "divergences": diverging,
        "prompts": per_prompt,
    }


# ------------------------------------------------------------------------------------------------- run-dir files
def arm_path(run_dir: Path, arm: str) -> Path:
    """``<run_dir>/parity/<arm>.json``."""
    return RunDir(run_dir).file(f"{schema.PARITY_DIR}/{arm}.json")


def save_arm(run_dir: Path, arm: str, rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any] | None = None
             ) -> Path:
    """Write one arm's :func:`collect` result (and the request ``settings``) atomically; returns the path."""
    path = arm_path(run_dir, arm)
    records.atomic_write_json(path, {"arm": arm, "settings": dict(settings or {}), "results": list(rows)})
    return path


def load_arm(run_dir: Path, arm: str) -> list[dict[str, Any]] | None:
    """One arm's saved rows, or None when the file is absent.

    Raises:
        records.RunDirError: the file exists but is not valid JSON of that shape.
    """
    path = arm_path(run_dir, arm)
    if not path.is_file():
        return None
    try:
        return list(json.loads(path.read_text(encoding="utf-8"))["results"])
    except (ValueError, KeyError, TypeError) as error:
        raise records.RunDirError(f"{path}: unreadable parity results ({error}); re-run the parity check") from error


def save_comparison(run_dir: Path, result: Mapping[str, Any]) -> Path:
    """Write :func:`compare`'s result to ``<run_dir>/parity.json`` atomically; returns the path."""
    return RunDir(run_dir).write_json(schema.PARITY, dict(result))


def load_comparison(run_dir: Path) -> dict[str, Any] | None:
    """``parity.json`` of ``run_dir`` (None when absent).

    Raises:
        records.RunDirError: the file exists but is not valid JSON.
    """
    return RunDir(run_dir).read_json(schema.PARITY, "re-run the parity check")


def run_arm(run_dir: Path, arm: str, base_url: str, served_model_name: str, spec: ParitySpec,
            headers: Mapping[str, str] | None = None, timeout_s: float = 300.0,
            concurrency: int | None = None) -> Path:
    """:func:`collect` the prompts of ``spec`` (:func:`prompts_of`) from one arm's running server and :func:`save_arm`
    them (the runner's one call per arm, before the sweep). Returns the written path.

    Raises:
        requests.RequestException, ValueError: as :func:`collect`.
    """
    rows = collect(base_url, served_model_name, prompts_of(spec), spec.max_tokens, headers, timeout_s, concurrency,
                   spec.ignore_eos)
    return save_arm(run_dir, arm, rows, {"prompts": spec.prompts, "n": spec.n, "long_n": spec.long_n,
                                         "long_distractors": list(spec.long_distractors),
                                         "max_tokens": spec.max_tokens, "temperature": 0.0,
                                         "ignore_eos": spec.ignore_eos, "logprobs": 2,
                                         "concurrency": concurrency or spec.total})


def compare_run_dir(run_dir: Path, arms: tuple[str, str] = ("baseline", "candidate"),
                    near_tie_tol: float = DEFAULT_NEAR_TIE_TOL) -> dict[str, Any] | None:
    """Compare the two arms' saved results and write ``parity.json``; None (nothing written) when an arm's file is
    missing (that arm's server never came up)."""
    base, cand = load_arm(run_dir, arms[0]), load_arm(run_dir, arms[1])
    if base is None or cand is None:
        return None
    result = compare(base, cand, near_tie_tol)
    save_comparison(run_dir, result)
    return result
