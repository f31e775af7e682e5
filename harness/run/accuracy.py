"""GSM8K through lm-eval on each arm's running server, per-question results, and the paired comparison of the arms.

Flow (the runner calls these; see each function):

1. Before any server starts: :func:`harness.run.gsm8k_data.resolve_data_dir` (explicit ``--gsm8k-data`` → the scenario's
   ``accuracy.data_dir`` → ``<repo>/../shared/data/gsm8k`` when it exists → the Hugging Face hub when reachable →
   skip, with the reason). An explicitly given directory that is wrong is an :class:`AccuracyError` (exit 2).
2. After each arm's load sweep, on the same server: :func:`run_gsm8k` runs ``python -m lm_eval`` with the
   ``local-completions`` model (``tokenizer_backend=None``: prompts go as text, the server tokenizes), the upstream
   ``gsm8k`` task (5-shot, ``exact_match`` with the ``strict-match`` and ``flexible-extract`` filters, greedy,
   stop strings ``Question:``, ``</s>``, ``<|im_end|>``, 256 new tokens at most), fixed seeds, ``--log_samples``.
   Offline, the task is lm-eval's own ``gsm8k.yaml`` included by a generated task file that points
   ``dataset_path: json`` at the local ``train.jsonl``/``test.jsonl`` (``accuracy/tasks/gsm8k_local.yaml``).
3. After both arms: :func:`summarize` pairs the arms per question and writes ``accuracy/summary.json``.

Run-dir files::

    accuracy.csv                       one row per arm × question × filter: ACCURACY_COLUMNS
    accuracy/tasks/gsm8k_local.yaml    the generated task (offline data only)
    accuracy/<arm>/<model>/results_*.json, samples_<task>_*.jsonl   lm-eval's own output, untouched
    accuracy/<arm>/arm.json            this module's summary of the arm (ArmResult as JSON)
    accuracy/summary.json              per-arm accuracy ± stderr, paired McNemar per filter, or why GSM8K was skipped
    logs/<arm>-lm-eval.log             lm-eval's stdout+stderr

Statistics (per filter): accuracy ``p = mean(correct)``; stderr ``sqrt(Σ(x − p)² / (n − 1)) / sqrt(n)``, lm-eval's
``mean_stderr`` (``lm_eval/api/metrics.py``); paired difference ``candidate − baseline`` in points; exact McNemar
(:func:`harness.judge.paired_accuracy.mcnemar_exact`): ``b`` = right in baseline only, ``c`` = right in candidate only,
``p = min(1, 2·P(X ≤ min(b, c)))``, ``X ~ Binomial(b + c, ½)``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from harness.run import procs

from harness.rundir import schema
from harness.rundir import store as records
from harness.rundir.schema import ACCURACY_ARM, ACCURACY_COLUMNS, ACCURACY_DIR
from harness.rundir.store import RunDir
from harness.run.gsm8k_data import (DEFAULT_DATA_DIR, LOCAL_TASK, AccuracyError, GsmData, check_data_dir,
                                    resolve_data_dir, write_task_yaml)

FILTERS: tuple[str, ...] = ("strict-match", "flexible-extract")
"""The two filters of lm-eval's ``gsm8k`` task (``tasks/gsm8k/gsm8k.yaml``)."""

HUB_TASK = "gsm8k"
MAX_GEN_TOKS = 256
REQUEST_TIMEOUT_S = 600       # lm-eval's per-request timeout
FEWSHOT_SEED = 1234
"""lm-eval's default seeds (``--seed 0,1234,1234,1234``: python, numpy, torch, few-shot sampler) and its default
request seed; fixed so both arms get the same few-shot examples for each question."""

REFERENCE = ("94.768 % (GSM8K 5-shot exact_match, flexible-extract, GLM-5.2 NVFP4; upstream figure the GPU "
             "scenario is measured against)")


@dataclass(frozen=True)
class Endpoint:
    """The arm's running server as lm-eval sees it: base URL, served model name, ``api_key`` (its ``VLLM_API_KEY``,
    sent by lm-eval as ``OPENAI_API_KEY``) and ``alive()`` (polled; False stops the run)."""

    base_url: str
    served_model_name: str
    api_key: str | None = None
    alive: Callable[[], bool] | None = None


@dataclass(frozen=True)
class GsmSettings:
    """How lm-eval runs GSM8K: few-shot count, question ``limit`` (None: the full test set), requests in flight,
    wall-clock limit (s), few-shot and request ``seed``, and how often the server is polled (s)."""

    num_fewshot: int = 5
    limit: int | None = None
    num_concurrent: int = 8
    timeout_s: float = 3600.0
    seed: int = FEWSHOT_SEED
    poll_s: float = 1.0

    @classmethod
    def of(cls, spec: Any) -> GsmSettings:
        """The settings of a scenario's ``[accuracy]`` table."""
        return cls(num_fewshot=spec.num_fewshot, limit=spec.limit, num_concurrent=spec.num_concurrent,
                   timeout_s=spec.timeout_s)


# ------------------------------------------------------------------------------------------------ running lm-eval
def gsm8k_command(base_url: str, served_model_name: str, output_dir: Path, settings: GsmSettings = GsmSettings(), *,
                  task: str = HUB_TASK, include_path: Path | None = None) -> list[str]:
    """The ``python -m lm_eval`` argv of one arm's GSM8K run.

    ``local-completions`` against ``<base_url>/v1/completions`` with ``tokenizer_backend=None`` (text prompts, no
    client tokenizer), ``num_concurrent`` requests in flight, :data:`MAX_GEN_TOKS` new tokens at most, request
    ``seed``; the task's own greedy settings (temperature 0) and stop strings; ``--seed 0,<seed>,<seed>,<seed>`` fixes
    the few-shot sampler; ``--log_samples`` writes per-question results under ``output_dir``.
    """
    num_concurrent, seed, num_fewshot, limit = settings.num_concurrent, settings.seed, settings.num_fewshot, settings.limit
    max_gen_toks, request_timeout_s, python = MAX_GEN_TOKS, REQUEST_TIMEOUT_S, sys.executable
    model_args = ",".join([
        f"model={served_model_name}", f"base_url={base_url}/v1/completions", "tokenizer_backend=None",
        "tokenized_requests=False", f"num_concurrent={num_concurrent}", "max_retries=3",
        f"max_gen_toks={max_gen_toks}", f"seed={seed}", f"timeout={int(request_timeout_s)}",
    ])
    argv = [python, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args,
            "--tasks", task, "--num_fewshot", str(num_fewshot), "--batch_size", "1",
            "--seed", f"0,{seed},{seed},{seed}", "--log_samples", "--output_path", str(output_dir)]
    if include_path is not None:
        argv += ["--include_path", str(include_path)]
    if limit is not None:
        argv += ["--limit", str(int(limit))]
    return argv


@dataclass
class ArmResult:
    """One arm's GSM8K run. ``filters`` maps filter → ``{"accuracy", "stderr", "n"}`` (fractions, from
    ``accuracy.csv`` rows) and lm-eval's own ``{"lm_eval_accuracy", "lm_eval_stderr"}``."""

    arm: str
    status: str                                   # "done" | "failed: <reason>"
    task: str
    source: str                                   # "local" | "hub"
    num_fewshot: int
    limit: int | None
    n: int = 0
    wall_s: float | None = None
    filters: dict[str, dict[str, Any]] = field(default_factory=dict)
    results_json: str | None = None               # relative to the run dir
    samples_jsonl: str | None = None
    log: str | None = None
    command: list[str] = field(default_factory=list)
    data: str | None = None                       # what ran: GsmData.reason (task, seeds, directory)


def run_gsm8k(run_dir: Path, arm: str, endpoint: Endpoint, data: GsmData, settings: GsmSettings = GsmSettings(),
              env: Mapping[str, str] | None = None) -> ArmResult:
    """Run lm-eval's GSM8K for one arm against its running server; store its output and rows; return the result.

    Spawns :func:`gsm8k_command` through :func:`harness.run.procs.spawn` (own process group, log
    ``logs/<arm>-lm-eval.log``, environment ``env`` or this process's), waits at most ``settings.timeout_s``
    (``accuracy.timeout_s``) and polls ``endpoint.alive()`` every ``settings.poll_s``. On success: the arm's rows
    replace any earlier rows of ``arm`` in ``accuracy.csv`` and ``accuracy/<arm>/arm.json`` is written.

    Raises:
        AccuracyError: ``data.source`` is "skip"; lm-eval exited non-zero, wrote no results, ran past the timeout
            (it is then stopped: SIGTERM, grace, SIGKILL), or the server died under it. The message is one line and
            names the log.
    """
    run_dir = Path(run_dir)
    if data.source == "skip":
        raise AccuracyError(data.reason)
    out_dir = run_dir / ACCURACY_DIR / arm
    include_path = None
    task = HUB_TASK
    if data.source == "local":
        assert data.path is not None
        include_path = run_dir / ACCURACY_DIR / "tasks"
        write_task_yaml(include_path, data.path)
        task = LOCAL_TASK
    argv = gsm8k_command(endpoint.base_url, endpoint.served_model_name, out_dir, settings, task=task,
                         include_path=include_path)
    log_path = RunDir(run_dir).log_path(f"{arm}-lm-eval.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result = ArmResult(arm=arm, status="running", task=task, source=data.source, num_fewshot=settings.num_fewshot,
                       limit=settings.limit, log=str(log_path.relative_to(run_dir)), command=argv, data=data.reason)
    started = time.monotonic()
    code = _run_lm_eval(argv, _child_env(env, data, endpoint.api_key), log_path, arm, endpoint, settings)
    result.wall_s = round(time.monotonic() - started, 2)
    if code != 0:
        raise AccuracyError(f"GSM8K on {arm}: lm-eval exited with code {code}; last line: "
                            f"{_last_line(log_path)} (log {log_path})")
    results_path, samples_path = find_outputs(out_dir, task)
    if results_path is None or samples_path is None:
        raise AccuracyError(f"GSM8K on {arm}: lm-eval wrote no results/samples under {out_dir} (log {log_path})")
    rows = parse_samples(samples_path, arm)
    lm_eval_scores = parse_results(results_path, task)
    result.results_json = str(results_path.relative_to(run_dir))
    result.samples_jsonl = str(samples_path.relative_to(run_dir))
    result.n = len({row["question_id"] for row in rows})
    result.filters = {name: {**arm_accuracy(rows, name), **lm_eval_scores.get(name, {})}
                      for name in sorted({row["filter"] for row in rows})}
    result.status = "done"
    _replace_arm_rows(run_dir, arm, rows)
    records.atomic_write_json(out_dir / ACCURACY_ARM, asdict(result))
    return result


def _child_env(env: Mapping[str, str] | None, data: GsmData, api_key: str | None) -> dict[str, str]:
    """lm-eval's environment: offline with local data (never wait on an unreachable hub), the server's key as
    ``OPENAI_API_KEY`` (the variable ``local-completions`` sends as a bearer token)."""
    child_env = dict(os.environ if env is None else env)
    child_env["TOKENIZERS_PARALLELISM"] = "false"
    if data.source == "local":
        child_env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if api_key:
        child_env["OPENAI_API_KEY"] = api_key
    return child_env


def _run_lm_eval(argv: list[str], env: dict[str, str], log_path: Path, arm: str, endpoint: Endpoint,
                 settings: GsmSettings) -> int:
    """Spawn lm-eval, wait for it (stopping it on timeout or a dead server), return its exit code.

    Raises:
        AccuracyError: it cannot start, ran past ``settings.timeout_s``, or the server died.
    """
    started = time.monotonic()
    try:
        proc = procs.spawn(argv, env, log_path)
    except OSError as error:
        raise AccuracyError(f"cannot start lm-eval ({error.strerror or error}); run scripts/setup.sh") from None
    try:
        while proc.poll() is None:
            if time.monotonic() - started > settings.timeout_s:
                raise AccuracyError(f"GSM8K on {arm} timeout: lm-eval still running after accuracy.timeout_s = "
                                    f"{settings.timeout_s:.0f} s and was stopped; raise accuracy.timeout_s or lower "
                                    f"--gsm8k-limit (log {log_path})")
            if endpoint.alive is not None and not endpoint.alive():
                raise AccuracyError(f"GSM8K on {arm}: the server died during the lm-eval run (log {log_path})")
            time.sleep(settings.poll_s)
    finally:
        procs.stop(proc, grace_s=10.0)
    return proc.returncode


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"


def find_outputs(out_dir: Path, task: str) -> tuple[Path | None, Path | None]:
    """The newest ``results_*.json`` and ``samples_<task>_*.jsonl`` lm-eval wrote under ``out_dir``
    (``<out_dir>/<sanitized model name>/``, ``lm_eval/loggers/evaluation_tracker.py``)."""
    def newest(pattern: str) -> Path | None:
        found = sorted(Path(out_dir).glob(pattern), key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None

    return newest("**/results_*.json"), newest(f"**/samples_{task}_*.jsonl")


def parse_results(path: Path, task: str) -> dict[str, dict[str, float | None]]:
    """lm-eval's aggregated scores: ``{filter: {"lm_eval_accuracy", "lm_eval_stderr"}}`` from
    ``results[task]["exact_match,<filter>"]`` and ``"exact_match_stderr,<filter>"`` (stderr None when "N/A")."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    scores = data.get("results", {}).get(task, {})
    found: dict[str, dict[str, float | None]] = {}
    for key, value in scores.items():
        metric, _, filter_name = key.partition(",")
        if metric == "exact_match":
            found.setdefault(filter_name, {})["lm_eval_accuracy"] = records.finite_float(value)
        elif metric == "exact_match_stderr":
            found.setdefault(filter_name, {})["lm_eval_stderr"] = records.finite_float(value)
    return found


def parse_samples(path: Path, arm: str) -> list[dict[str, Any]]:
    """lm-eval's ``--log_samples`` jsonl (one line per question × filter) → ``accuracy.csv`` rows.

    Each line has ``doc_id``, ``filter``, ``exact_match`` (0.0/1.0), ``filtered_resps`` (``[answer]``), ``target``
    and ``prompt_hash`` (``lm_eval/evaluator.py``). Rows are sorted by filter, then question.

    Raises:
        AccuracyError: a line is not JSON or lacks one of those fields.
    """
    rows = []
    with Path(path).open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
                extracted = sample["filtered_resps"]
                while isinstance(extracted, list):
                    extracted = extracted[0] if extracted else ""
                rows.append({
                    "arm": arm, "question_id": int(sample["doc_id"]), "filter": str(sample["filter"]),
                    "correct": int(float(sample["exact_match"]) >= 0.5), "extracted": str(extracted),
                    "target": _final_answer(str(sample.get("target", ""))), "prompt_hash": sample.get("prompt_hash"),
                })
            except (ValueError, KeyError, TypeError) as error:
                raise AccuracyError(f"{path}:{lineno}: not an lm-eval sample line ({error!r})") from None
    rows.sort(key=lambda row: (row["filter"], row["question_id"]))
    return rows


def _final_answer(target: str) -> str:
    """GSM8K's reference answer: the text after the last ``####``."""
    return target.rsplit("####", 1)[-1].strip()


def arm_accuracy(rows: Sequence[Mapping[str, Any]], filter_name: str) -> dict[str, Any]:
    """``{"accuracy", "stderr", "n"}`` of one filter's rows: mean of ``correct`` and lm-eval's ``mean_stderr``
    (sample standard deviation, ``n − 1``, over ``sqrt(n)``; None for n < 2)."""
    values = [int(row["correct"]) for row in rows if row["filter"] == filter_name]
    n = len(values)
    if not n:
        return {"accuracy": None, "stderr": None, "n": 0}
    mean = sum(values) / n
    stderr = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n) if n > 1 else None
    return {"accuracy": mean, "stderr": stderr, "n": n}


def _replace_arm_rows(run_dir: Path, arm: str, rows: Sequence[Mapping[str, Any]]) -> None:
    RunDir(run_dir).replace_accuracy_rows(arm, rows)


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """``accuracy.csv`` rows (``question_id`` and ``correct`` as int); empty when the file is absent.

    Raises:
        records.RunDirError: the file lacks a column or holds a non-integer id/flag.
    """
    return RunDir(run_dir).accuracy_rows()


# ------------------------------------------------------------------------------------------------ pairing
def paired(rows: Sequence[Mapping[str, Any]], filter_name: str, arms: tuple[str, str] = ("baseline", "candidate")
           ) -> dict[str, Any] | None:
    """The paired comparison of one filter over the questions both arms answered (None when none are common).

    Returns ``{"filter", "n", "baseline_accuracy", "candidate_accuracy", "difference_pts" (candidate − baseline,
    points), "both", "neither",
    "baseline_only", "candidate_only", "p_value" (exact McNemar), "prompt_mismatches" (questions whose prompt hash
    differs between the arms: their few-shot context was not the same)}``.
    """
    import numpy as np

    from harness.judge.paired_accuracy import mcnemar_exact

    by_arm = {arm: {row["question_id"]: row for row in rows if row["arm"] == arm and row["filter"] == filter_name}
              for arm in arms}
    common = sorted(set(by_arm[arms[0]]) & set(by_arm[arms[1]]))
    if not common:
        return None
    base = np.array([by_arm[arms[0]][q]["correct"] for q in common], dtype=bool)
    cand = np.array([by_arm[arms[1]][q]["correct"] for q in common], dtype=bool)
    test = mcnemar_exact(base, cand)
    hashes = [(by_arm[arms[0]][q].get("prompt_hash"), by_arm[arms[1]][q].get("prompt_hash")) for q in common]
    mismatches = sum(1 for base_hash, cand_hash in hashes if base_hash != cand_hash)
    return {
        "filter": filter_name, "n": len(common),
        "baseline_accuracy": float(base.mean()), "candidate_accuracy": float(cand.mean()),
        "difference_pts": 100.0 * (float(cand.mean()) - float(base.mean())),
        "both": test.both, "neither": test.neither, "baseline_only": test.baseline_only,
        "candidate_only": test.candidate_only, "p_value": test.p_value, "prompt_mismatches": mismatches,
    }


def summarize(run_dir: Path, arms: tuple[str, str] = ("baseline", "candidate"),
              failures: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Write ``accuracy/summary.json`` from ``accuracy.csv`` and each arm's ``arm.json``; return it.

    ``failures`` maps an arm to why its GSM8K run failed (the runner passes the :class:`AccuracyError` text).
    Shape: ``{"status": "done" | "partial" | "failed", "reason", "arms": {arm: ArmResult as dict},
    "paired": [paired(...) per filter], "formula": str}``.
    """
    run_dir = Path(run_dir)
    rows = read_rows(run_dir)
    failures = dict(failures or {})
    arm_info: dict[str, Any] = {}
    for arm in arms:
        path = run_dir / ACCURACY_DIR / arm / ACCURACY_ARM
        if arm in failures:
            arm_info[arm] = {"arm": arm, "status": f"failed: {failures[arm]}"}
        elif path.is_file():
            arm_info[arm] = json.loads(path.read_text(encoding="utf-8"))
        else:
            arm_info[arm] = {"arm": arm, "status": "not run"}
    done = [arm for arm in arms if arm_info[arm].get("status") == "done"]
    pairs = [p for p in (paired(rows, name, arms) for name in FILTERS) if p is not None] if len(done) == 2 else []
    status = "done" if len(done) == len(arms) else ("partial" if done else "failed")
    reason = "; ".join(f"{arm}: {arm_info[arm]['status']}" for arm in arms if arm not in done) or None
    summary = {"status": status, "reason": reason, "arms": arm_info, "paired": pairs,
               "formula": "exact McNemar: b = right in baseline only, c = right in candidate only, "
                          "p = min(1, 2·P(X ≤ min(b, c))), X ~ Binomial(b + c, 1/2)"}
    RunDir(run_dir).write_json(schema.ACCURACY_SUMMARY, summary)
    return summary


def record_skipped(run_dir: Path, reason: str) -> dict[str, Any]:
    """Write ``accuracy/summary.json`` saying GSM8K did not run and why (the report shows the reason)."""
    summary = {"status": "skipped", "reason": reason, "arms": {}, "paired": []}
    RunDir(run_dir).write_json(schema.ACCURACY_SUMMARY, summary)
    return summary


def load_summary(run_dir: Path) -> dict[str, Any] | None:
    """``accuracy/summary.json`` (None when absent).

    Raises:
        records.RunDirError: the file exists but is not valid JSON.
    """
    return RunDir(run_dir).read_json(schema.ACCURACY_SUMMARY, "re-run GSM8K with --resume")


__all__ = [
    "ACCURACY_COLUMNS", "AccuracyError", "ArmResult", "DEFAULT_DATA_DIR", "Endpoint", "GsmData", "GsmSettings",
    "REFERENCE", "check_data_dir", "gsm8k_command", "load_summary", "paired", "parse_samples", "read_rows", "record_skipped", "resolve_data_dir", "run_gsm8k",
    "summarize", "write_task_yaml",
]
