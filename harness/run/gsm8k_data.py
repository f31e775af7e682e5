"""Where GSM8K comes from (:func:`resolve_data_dir`: an explicit ``--gsm8k-data`` → for task ``tiny-arith`` the
generated arithmetic problems (:func:`arith_data_dir`) → the scenario's ``accuracy.data_dir`` →
``<repo>/../shared/data/gsm8k`` → the Hugging Face hub → skipped, with the reason) and the generated lm-eval task that
points lm-eval's own ``gsm8k.yaml`` at local ``train.jsonl``/``test.jsonl``."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Callable, Literal, NamedTuple

from harness.rundir import store as records
from harness.run.scenario import REPO_ROOT


LOCAL_TASK = "gsm8k_local"


DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "gsm8k"


class AccuracyError(ValueError):
    """GSM8K cannot run as asked (bad data dir, lm-eval failed or timed out); ``str(error)`` is one line."""


def check_data_dir(path: str | Path) -> Path:
    """Check that ``path`` holds GSM8K's ``train.jsonl`` and ``test.jsonl`` and return it resolved.

    Every line must be a JSON object with string ``question`` and ``answer`` fields, the answer ending in
    ``#### <number>`` (GSM8K's format, as lm-eval's ``gsm8k`` task reads it).

    Raises:
        AccuracyError: the directory or a file is missing, empty or malformed (one line naming file and line).
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise AccuracyError(f"{folder}: no such GSM8K data directory; pass a folder holding train.jsonl and "
                            f"test.jsonl in GSM8K's format (e.g. --gsm8k-data ../shared/data/gsm8k)")
    for name in ("train.jsonl", "test.jsonl"):
        file = folder / name
        if not file.is_file():
            raise AccuracyError(f"{folder}: missing {name}; a GSM8K data directory needs train.jsonl and test.jsonl")
        count = 0
        try:
            with file.open(encoding="utf-8") as handle:
                for lineno, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    _check_record(line, file, lineno)
                    count += 1
        except UnicodeDecodeError as error:
            raise AccuracyError(f"{file}: not UTF-8 text ({error.reason}); expected GSM8K jsonl") from None
        if count == 0:
            raise AccuracyError(f"{file}: empty; expected one GSM8K problem per line")
    return folder.resolve()


def _check_record(line: str, file: Path, lineno: int) -> None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise AccuracyError(f"{file}:{lineno}: not JSON ({error.msg}); expected one GSM8K problem per line") from None
    if not isinstance(record, dict) or not isinstance(record.get("question"), str) \
            or not isinstance(record.get("answer"), str):
        raise AccuracyError(f"{file}:{lineno}: not a GSM8K record; need string fields 'question' and 'answer'")
    if "####" not in record["answer"]:
        raise AccuracyError(f"{file}:{lineno}: answer lacks the final '#### <number>' line of GSM8K's format")


class GsmData(NamedTuple):
    """Where GSM8K comes from: ``source`` "local" (``path`` set), "hub" (lm-eval downloads ``openai/gsm8k``) or
    "skip" (GSM8K does not run; ``reason`` says why, for the report)."""

    path: Path | None
    source: Literal["local", "hub", "skip"]
    reason: str


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers (False when ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` is set)."""
    if any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("HF_HUB_OFFLINE",
                                                                                 "HF_DATASETS_OFFLINE")):
        return False
    import requests

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        return requests.head(f"{endpoint}/api/datasets/openai/gsm8k", timeout=timeout_s).status_code < 500
    except requests.RequestException:
        return False


ARITH_FEWSHOT_PROBLEMS = 64
"""Problems in the generated ``train.jsonl`` (lm-eval's few-shot pool; the default scenario runs 0-shot)."""


def arith_data_dir(n_test: int, cache_dir: Path | None = None) -> GsmData:
    """The ``tiny-arith`` task's GSM8K directory: ``train.jsonl`` (:data:`ARITH_FEWSHOT_PROBLEMS` problems of the
    training stream, seed 0) and ``test.jsonl`` (the first ``n_test`` problems of the test stream, seed 1), written by
    :func:`dsa_route.tiny.arith.task.write_gsm8k_dir` into ``<cache>/tiny-arith-gsm8k-<hash>`` on first use (the
    hash covers the generator's source and the sizes, so a changed generator never reuses stale files). Returns the
    :class:`GsmData` whose ``reason`` names the task, seeds and sizes (the report and ``arm.json`` show it)."""
    from dsa_route.tiny.arith import task
    from dsa_route.tiny.cache import default_cache_dir, ensure_dir

    sizes = {"n_train": ARITH_FEWSHOT_PROBLEMS, "n_test": int(n_test), "train_seed": task.TRAIN_SEED,
             "test_seed": task.TEST_SEED}
    digest = hashlib.sha256(Path(task.__file__).read_bytes() + json.dumps(sizes, sort_keys=True).encode())
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = ensure_dir(root / f"tiny-arith-gsm8k-{digest.hexdigest()[:12]}", "test.jsonl",
                      lambda out: task.write_gsm8k_dir(out, **sizes))
    return GsmData(path, "local", f"tiny-arith: GSM8K-format arithmetic generated by dsa_route.tiny.arith.task "
                                  f"(test seed {task.TEST_SEED}: {n_test} problems; few-shot pool seed "
                                  f"{task.TRAIN_SEED}: {ARITH_FEWSHOT_PROBLEMS}) in {path}")


def resolve_data_dir(explicit: str | None, scenario_dir: str | None, *, task: str = "gsm8k",
                     limit: int | None = None, default_dir: Path = DEFAULT_DATA_DIR,
                     hub_check: Callable[[], bool] = hub_reachable) -> GsmData:
    """Decide where GSM8K comes from (call before any server starts).

    ``explicit`` (``--gsm8k-data``, relative to the working directory) wins; then, for ``task`` "tiny-arith", the
    generated problems (:func:`arith_data_dir`, ``limit`` of them); then ``scenario_dir`` (``accuracy.data_dir``,
    relative to the repository root); either directory must be a valid data directory. Without any: ``default_dir``
    (``<repo>/../shared/data/gsm8k``) when it is a valid data directory, else the hub when ``hub_check()`` is true,
    else skip.

    Raises:
        AccuracyError: an explicitly given directory (flag or scenario) is missing or malformed; task "tiny-arith"
            without a ``limit``.
    """
    if explicit:
        return GsmData(check_data_dir(Path(explicit).expanduser().resolve()), "local", f"--gsm8k-data {explicit}")
    if task == "tiny-arith":
        if limit is None:
            raise AccuracyError("task tiny-arith needs a number of test problems: set accuracy.limit or --gsm8k-limit")
        return arith_data_dir(limit)
    if scenario_dir:
        path = Path(scenario_dir).expanduser()
        path = path if path.is_absolute() else (REPO_ROOT / path)
        return GsmData(check_data_dir(path), "local", f"scenario accuracy.data_dir {scenario_dir}")
    if Path(default_dir).is_dir():
        try:
            return GsmData(check_data_dir(default_dir), "local", f"default {default_dir}")
        except AccuracyError as error:
            default_problem = str(error)
        if hub_check():
            return GsmData(None, "hub", f"{default_problem}; using the Hugging Face hub")
        return GsmData(None, "skip", f"GSM8K not run: {default_problem}, and the Hugging Face hub is not reachable")
    if hub_check():
        return GsmData(None, "hub", f"{default_dir} does not exist; lm-eval downloads openai/gsm8k from the hub")
    return GsmData(None, "skip", f"GSM8K not run: no local data ({default_dir} does not exist, no --gsm8k-data) "
                                 f"and the Hugging Face hub is not reachable")


def write_task_yaml(task_dir: Path, data_dir: Path) -> Path:
    """Write ``task_dir/gsm8k_local.yaml``: lm-eval's own ``gsm8k.yaml`` (included by absolute path) with the
    dataset pointed at ``data_dir``'s jsonl files through the ``json`` builder. Returns the file's path.

    Only ``task``, ``tag``, ``dataset_path``, ``dataset_name`` and ``dataset_kwargs`` are overridden: prompt,
    few-shot split, generation settings, filters and metric stay upstream's.
    """
    import yaml

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise AccuracyError("lm-eval is not installed in this environment; run scripts/setup.sh")
    upstream = Path(list(spec.submodule_search_locations)[0]) / "tasks" / "gsm8k" / "gsm8k.yaml"
    if not upstream.is_file():
        raise AccuracyError(f"{upstream}: lm-eval's gsm8k task is missing; reinstall lm-eval")
    task = {
        "include": str(upstream),
        "task": LOCAL_TASK,
        "tag": [],
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"train": str(Path(data_dir) / "train.jsonl"),
                                          "test": str(Path(data_dir) / "test.jsonl")}},
    }
    task_dir.mkdir(parents=True, exist_ok=True)
    path = task_dir / f"{LOCAL_TASK}.yaml"
    records.atomic_write_text(path, "# Generated by dsa-bench (harness/run/accuracy.py): upstream gsm8k on local data.\n"
                              + yaml.safe_dump(task, sort_keys=False))
    return path
