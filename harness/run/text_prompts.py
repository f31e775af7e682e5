"""Real-text prompts for the ``gsm8k`` dataset of a level (issue #26 item 2): GSM8K's problems — question and worked
answer, read at run time from the data directory (``../shared/data/gsm8k/test.jsonl``, MIT; never copied into the
repository) — cut to the level's ``input_len`` tokens with the arm's own tokenizer, written as the JSONL file
``vllm bench serve --dataset-name custom`` reads (``{"prompt": …}`` per line; ``vllm/benchmarks/datasets/datasets.py``
``CustomDataset``). Prompts then carry real token statistics, so the lightning indexer scores real text instead of
random ids (vLLM PR #57206: its top-k cost differs by ≈ 10× between random and shifted logits).

A prompt is consecutive problems joined by a blank line until it holds ``input_len`` tokens, cut there and decoded;
prompt ``i`` starts at problem ``i`` (cycling), so prompts differ. Re-tokenising the decoded text can move its
length by a token or two (vLLM reports the measured ``input_lens``). Written once per run directory
(``datasets/<regime>.jsonl``, kept by ``--resume``), the same file for both arms; each round's ``--seed`` shuffles
the order in which the client sends them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from harness.run.gsm8k_data import DEFAULT_DATA_DIR, AccuracyError, check_data_dir
from harness.run.scenario import REPO_ROOT, Scenario
from harness.rundir.store import atomic_write_text
from harness.rundir.levels import DATASETS_DIR, TEXT_DATASETS, Regime, dataset_path

__all__ = ["DATASETS_DIR", "TEXT_DATASETS", "check_text_data", "dataset_path", "gsm8k_texts", "text_data_dir",
           "text_prompts", "write_dataset"]

def text_data_dir(scenario: Scenario, regime: Regime) -> Path:
    """Where a real-text regime's text comes from: its ``[[workload.regimes]]`` entry's ``data_dir`` (relative to the
    repository, as GSM8K's own data dir is read), else the default ``../shared/data/gsm8k``
    (:data:`~harness.run.gsm8k_data.DEFAULT_DATA_DIR`)."""
    spec = scenario.workload.regime_spec(regime.at(1))
    if spec is None or spec.data_dir is None:
        return DEFAULT_DATA_DIR
    path = Path(spec.data_dir).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def check_text_data(scenario: Scenario) -> None:
    """Refuse a scenario whose real-text levels have no text to cut (before anything starts).

    Raises:
        AccuracyError: a ``gsm8k`` regime whose data directory is missing or malformed (one line naming it and the
            key that sets it).
    """
    for regime in {level.regime for level in scenario.workload.levels() if level.dataset in TEXT_DATASETS}:
        folder = text_data_dir(scenario, regime)
        try:
            check_data_dir(folder)
        except AccuracyError as error:
            raise AccuracyError(f"{regime.label()} levels need GSM8K-format text and {folder} has none "
                                f"({str(error).split(';')[0]}); set data_dir in that [[workload.regimes]] entry to "
                                f"a folder with train.jsonl and test.jsonl") from None


def gsm8k_texts(data_dir: str | Path) -> list[str]:
    """GSM8K's test problems as text, each its question, a newline and its worked answer.

    Raises:
        AccuracyError: the directory or its files are missing or malformed (one line; :func:`check_data_dir`).
    """
    folder = check_data_dir(data_dir)
    lines = (folder / "test.jsonl").read_text(encoding="utf-8").splitlines()
    return [f"{row['question']}\n{row['answer']}" for row in map(json.loads, filter(str.strip, lines))]


def text_prompts(texts: Sequence[str], tokenizer: Any, input_len: int, count: int) -> list[str]:
    """``count`` prompts of ``input_len`` tokens (by ``tokenizer``, a Hugging Face tokenizer) from ``texts``.

    Raises:
        ValueError: no texts, or ``input_len`` / ``count`` below 1.
    """
    if not texts or input_len < 1 or count < 1:
        raise ValueError(f"text prompts need texts, input_len ≥ 1 and count ≥ 1 (got {len(texts)}, {input_len}, "
                         f"{count})")
    encoded = [tokenizer(text + "\n\n", add_special_tokens=False)["input_ids"] for text in texts]
    prompts = []
    for start in range(count):
        ids: list[int] = []
        k = start
        while len(ids) < input_len:
            ids += encoded[k % len(encoded)]
            k += 1
        prompts.append(tokenizer.decode(ids[:input_len]))
    return prompts


def write_dataset(path: Path, prompts: Sequence[str]) -> Path:
    """Write ``prompts`` as ``vllm bench serve``'s custom JSONL (one ``{"prompt": …}`` per line), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts))
    return path
