"""The per-arm checks beside the load sweep: output parity (once per arm, before its sweep) and GSM8K through lm-eval
(on a running server after its block-0 or last level), and the run-level files they end in. Called by
:class:`harness.run.runner.Runner`; each function returns the seconds it spent, for the manifest's timing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import requests
from rich.console import Console
from rich.markup import escape

from harness.run import accuracy, parity, scoring
from harness.run.scenario import AccuracySpec, ParitySpec
from harness.rundir import schema

__all__ = ["collect_parity", "collect_scoring", "run_gsm8k", "finish", "SCORING_LABELS"]

SCORING_LABELS = ("baseline", "baseline-one", "baseline-2", "candidate")
"""The scorings a gated run collects (:mod:`harness.judge.divergence`): the reference (baseline, first session, all
prompts at once), its second batch composition (first session, one at a time), the baseline's second session, and
the candidate's first. The parity A/A collections have the same labels (``parity/<label>.json``)."""


def collect_parity(run_dir: Path, arm: str, server, spec: ParitySpec, console: Console) -> float:
    """Greedy outputs of the parity prompts on ``server`` (already collected on a resumed run: nothing). A failure is
    printed and left for the report to show. Returns the seconds spent."""
    if parity.load_arm(run_dir, arm) is not None:
        return 0.0
    started = time.monotonic()
    try:
        parity.run_arm(run_dir, arm, server.base_url, server.served_model_name, spec, server.headers)
    except (requests.RequestException, ValueError) as error:
        console.print(f"[yellow]{arm}: parity prompts failed ({escape(str(error))}); the report will say so[/]")
    return time.monotonic() - started


def _labels_due(arm: str, session: int) -> list[str]:
    """The scoring labels ``arm``'s ``session`` (1-based) provides."""
    if arm == "baseline":
        return {1: ["baseline", "baseline-one"], 2: ["baseline-2"]}.get(session, [])
    return ["candidate"] if arm == "candidate" else []


def collect_scoring(run_dir: Path, arm: str, session: int, server, spec: ParitySpec, console: Console) -> float:
    """The scorings and A/A parity collections this server session provides (:data:`SCORING_LABELS`), once the
    baseline's parity outputs (the forced sequences) exist; a label already on disk is skipped (resume, a candidate
    restarted). A failure is printed and left for the gate (the cells go INVALID). Returns the seconds spent."""
    base = parity.load_arm(run_dir, "baseline")
    todo = [label for label in _labels_due(arm, session) if scoring.load(run_dir, label) is None]
    if base is None or not todo:
        return 0.0
    started = time.monotonic()
    try:
        sequences = scoring.sequences_of(base)
        prompts = parity.prompts_of(spec)
        for label in todo:
            one = label.endswith("-one")
            if label != "candidate" and label != "baseline":
                rows = parity.collect(server.base_url, server.served_model_name, prompts, spec.max_tokens,
                                      server.headers, concurrency=1 if one else None, ignore_eos=spec.ignore_eos)
                parity.save_arm(run_dir, label, rows, {"concurrency": 1 if one else spec.total})
            rows = scoring.score(server.base_url, server.served_model_name, sequences, concurrency=1 if one else None,
                                 headers=server.headers)
            scoring.save(run_dir, label, rows, {"top_k": scoring.DEFAULT_TOP_K, "concurrency": 1 if one else len(rows),
                                                "arm": arm, "session": session})
    except (requests.RequestException, ValueError) as error:
        console.print(f"[yellow]{arm}: scoring failed ({escape(str(error))}); the correctness cells will say so[/]")
    return time.monotonic() - started


def run_gsm8k(run_dir: Path, arm: str, server, spec: AccuracySpec, data: accuracy.GsmData | None,
              console: Console) -> tuple[float, str | None]:
    """lm-eval GSM8K on the arm's running ``server`` (off, no data, or done on a resumed run: nothing). Returns
    (seconds spent, the failure's message or None)."""
    if not spec.enabled or data is None or data.source == "skip":
        return 0.0, None
    if (run_dir / schema.ACCURACY_DIR / arm / schema.ACCURACY_ARM).is_file():
        return 0.0, None
    console.print(f"[bold]{arm}[/]: GSM8K through lm-eval ({spec.num_fewshot}-shot, limit {spec.limit})")
    started = time.monotonic()
    try:
        endpoint = accuracy.Endpoint(server.base_url, server.served_model_name, os.environ.get("VLLM_API_KEY"),
                                     server.alive)
        result = accuracy.run_gsm8k(run_dir, arm, endpoint, data, accuracy.GsmSettings.of(spec))
        scores = ", ".join(f"{name} {100 * v['accuracy']:.1f} %" for name, v in result.filters.items()
                           if v.get("accuracy") is not None)
        console.print(f"{arm}: GSM8K {result.n} questions: {scores}")
        failure = None
    except accuracy.AccuracyError as error:
        failure = str(error)
        console.print(f"[red]{arm}: GSM8K failed: {escape(failure)}[/]")
    return time.monotonic() - started, failure


def finish(run_dir: Path, spec: AccuracySpec, data: accuracy.GsmData | None, failures: dict[str, str]) -> None:
    """``parity.json`` and ``accuracy/summary.json`` from what each arm stored (GSM8K off or without data: the
    reason it was skipped)."""
    parity.compare_run_dir(run_dir)
    if not spec.enabled:
        accuracy.record_skipped(run_dir, "GSM8K is off in this scenario (accuracy.enabled = false / --no-gsm8k)")
    elif data is None or data.source == "skip":
        accuracy.record_skipped(run_dir, data.reason if data else "no GSM8K data source")
    else:
        accuracy.summarize(run_dir, failures=failures)
