"""Teacher-forced scoring: both arms score exactly the same token sequences, so their distributions can be compared
token by token without sampling or timing noise.

The sequences (:func:`sequences_of`) are the parity prompts followed by the **baseline's** greedy continuation
(``parity/baseline.json``: ``prompt_token_ids`` + ``token_ids``). Each is sent as a token-id prompt to
``/v1/completions`` with ``prompt_logprobs`` = ``top_k`` and ``max_tokens`` 1 (:func:`request_body`): vLLM 0.32 then
returns, per prompt position, the logprob of the token actually there plus the ``top_k`` most likely tokens
(``entrypoints/openai/completion/protocol.py:98`` ``CompletionRequest.prompt_logprobs``, passed to
``SamplingParams.prompt_logprobs`` at :397; the answer's ``CompletionResponseChoice.prompt_logprobs`` at :668, a list
of ``{token_id: Logprob(logprob, rank, decoded_token)}`` with ``None`` at position 0; filled in
``completion/serving.py:587``). ``top_k`` is capped by the server's ``--max-logprobs`` (vLLM default 20,
``config/model.py:282``). Only the continuation's positions are kept: what the model predicts after the prompt.

:func:`harness.judge.token_compare.compare_scores` compares two scorings of the same sequences, per position:

- ``abs_dlogp``: ``|log p_A(t) − log p_B(t)|`` of the forced token ``t`` (nats);
- ``kl_lb``: a lower bound of ``KL(p_A ‖ p_B)`` from the top-k alone: both distributions coarse-grained onto the
  tokens in both top-k lists plus one "every other token" bucket. Coarse-graining never increases KL (the log-sum
  inequality; Cover & Thomas, *Elements of Information Theory*, 2nd ed., Thm 2.7.1 / the data-processing inequality
  §2.8), so this is ≤ the full-vocabulary KL, and exact when the top-k covers all the mass;
- ``flip``: the arms' arg-max tokens differ.

Run-dir files: ``scoring/<label>.json`` per scoring (:func:`save`), ``scoring.json`` the judged comparison
(:mod:`harness.judge.divergence`).
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from harness.rundir import store as records
from harness.rundir.store import RunDir

SCORING_DIR = "scoring"
DEFAULT_TOP_K = 20
"""vLLM's default ``max_logprobs`` (``config/model.py:282``): the most a server started without the flag returns."""


def sequences_of(baseline_rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The forced sequences from the baseline's parity rows: ``[{"index", "prompt_ids", "forced_ids"}]``.

    Raises:
        ValueError: a row has no ``prompt_token_ids`` (parity recorded by an older dsa-bench: re-run it).
    """
    out = []
    for row in baseline_rows:
        if not row.get("prompt_token_ids"):
            raise ValueError(f"parity prompt {row.get('index')} has no prompt_token_ids: re-run the parity check")
        out.append({"index": int(row["index"]), "prompt_ids": [int(t) for t in row["prompt_token_ids"]],
                    "forced_ids": [int(t) for t in row["token_ids"]]})
    return out


def request_body(served_model_name: str, token_ids: Sequence[int], top_k: int = DEFAULT_TOP_K) -> dict[str, Any]:
    """The ``/v1/completions`` body that scores ``token_ids`` (a token-id prompt; one greedy token generated)."""
    return {"model": served_model_name, "prompt": list(token_ids), "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": top_k, "return_token_ids": True}


def parse_scores(choice: Mapping[str, Any], sequence: Mapping[str, Any]) -> dict[str, Any]:
    """One answer → ``{"index", "logprobs", "top"}`` over the continuation's positions: the forced token's logprob and
    the top entries ``[[id, logprob], ...]`` (descending) at each.

    Raises:
        ValueError: no ``prompt_logprobs``, or the server scored other tokens than those sent.
    """
    entries = choice.get("prompt_logprobs")
    prompt_ids, forced = sequence["prompt_ids"], sequence["forced_ids"]
    if not entries or len(entries) != len(prompt_ids) + len(forced):
        raise ValueError("answer has no prompt_logprobs for every token sent; the server must honour prompt_logprobs")
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and list(echoed) != list(prompt_ids) + list(forced):
        raise ValueError(f"sequence {sequence['index']}: the server scored other tokens than those sent")
    logprobs, top = [], []
    for offset, token in enumerate(forced):
        entry = {int(k): float(v["logprob"]) for k, v in (entries[len(prompt_ids) + offset] or {}).items()}
        logprobs.append(entry.get(token, float("nan")))
        top.append([[tid, lp] for tid, lp in sorted(entry.items(), key=lambda kv: -kv[1])])
    return {"index": sequence["index"], "logprobs": logprobs, "top": top}


def score(base_url: str, served_model_name: str, sequences: Sequence[Mapping[str, Any]], *,
          top_k: int = DEFAULT_TOP_K, concurrency: int | None = None, headers: Mapping[str, str] | None = None,
          timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """Score every sequence on one server, at most ``concurrency`` in flight (None: all at once: the batch
    composition is part of what an A/A at two concurrencies measures). Returns :func:`parse_scores` rows in order.

    Raises:
        requests.RequestException: a request failed or timed out.
        ValueError: as :func:`parse_scores`.
    """
    import requests

    def one(sequence: Mapping[str, Any]) -> dict[str, Any]:
        body = request_body(served_model_name, [*sequence["prompt_ids"], *sequence["forced_ids"]], top_k)
        response = requests.post(f"{base_url}/v1/completions", json=body, headers=dict(headers or {}),
                                 timeout=timeout_s)
        response.raise_for_status()
        return parse_scores(response.json()["choices"][0], sequence)

    if not sequences:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(len(sequences), concurrency or len(sequences)))) as pool:
        return list(pool.map(one, sequences))


# ------------------------------------------------------------------------------------------------- run-dir files
def save(run_dir: Path, label: str, rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]) -> Path:
    """Write one scoring (``scoring/<label>.json``: the rows and how they were requested) atomically."""
    path = RunDir(run_dir).file(f"{SCORING_DIR}/{label}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    records.atomic_write_json(path, {"label": label, "settings": dict(settings), "results": list(rows)})
    return path


def load(run_dir: Path, label: str) -> list[dict[str, Any]] | None:
    """One saved scoring's rows (None when absent).

    Raises:
        records.RunDirError: the file exists but is unreadable.
    """
    path = RunDir(run_dir).file(f"{SCORING_DIR}/{label}.json")
    if not path.is_file():
        return None
    try:
        return list(json.loads(path.read_text(encoding="utf-8"))["results"])
    except (ValueError, KeyError, TypeError) as error:
        raise records.RunDirError(f"{path}: unreadable scoring ({error}); re-run the scoring") from error
