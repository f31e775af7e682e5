"""GSM8K through lm-eval: data preflight, the lm-eval command, a real lm-eval run against a fake completions server
(both arms), per-question rows, the paired McNemar summary, timeouts; and (slow) lm-eval against real CPU vLLM."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.run import accuracy, procs

from harness.rundir import store as records
from harness.run.accuracy import AccuracyError, GsmData

MINI = Path(__file__).parent / "fixtures" / "gsm8k_mini"
MINI_TEST = [json.loads(line) for line in (MINI / "test.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------------------------- fake server
class FakeCompletions:
    """A tiny OpenAI ``/v1/completions`` server on 127.0.0.1: answers each GSM8K prompt from ``answers`` (keyed by
    the last question in the prompt), records every request body, and can hang (``delay_s``) to test timeouts."""

    def __init__(self, answers: dict[str, str], delay_s: float = 0.0):
        self.answers = answers
        self.delay_s = delay_s
        self.bodies: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):  # noqa: N802 — http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                if fake.delay_s:
                    time.sleep(fake.delay_s)
                prompt = body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]
                question = prompt.rsplit("Question:", 1)[-1].split("\nAnswer:", 1)[0].strip()
                text = fake.answers.get(question, " I am not sure.")
                payload = json.dumps({
                    "id": "cmpl-fake", "object": "text_completion", "model": body["model"],
                    "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
                    "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split()),
                              "total_tokens": 0},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeCompletions":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _answers(right: set[int], flexible_only: set[int] = frozenset()) -> dict[str, str]:
    """Canned completions: questions in ``right`` answered in GSM8K form (``#### n``), those in ``flexible_only``
    with the right number but no ``####`` line (strict-match misses it), the rest with a wrong number."""
    answers = {}
    for index, record in enumerate(MINI_TEST):
        number = record["answer"].rsplit("####", 1)[-1].strip()
        if index in right:
            answers[record["question"]] = f" We compute it step by step.\n#### {number}"
        elif index in flexible_only:
            answers[record["question"]] = f" The result is {number}"
        else:
            answers[record["question"]] = " The result is 1 and 5.\n#### 5"
    return answers


# ----------------------------------------------------------------------------------------------- data preflight
def test_check_data_dir_accepts_gsm8k_format():
    assert accuracy.check_data_dir(MINI) == MINI.resolve()


@pytest.mark.parametrize("mutate, message", [
    (lambda d: (d / "test.jsonl").unlink(), "missing test.jsonl"),
    (lambda d: (d / "train.jsonl").write_text(""), "train.jsonl: empty"),
    (lambda d: (d / "test.jsonl").write_text('{"question": "q", "answer": "a\\n#### 1"}\nnot json\n'),
     "test.jsonl:2: not JSON"),
    (lambda d: (d / "test.jsonl").write_text('{"question": "q"}\n'), "test.jsonl:1: not a GSM8K record"),
    (lambda d: (d / "test.jsonl").write_text('{"question": "q", "answer": "4"}\n'), "lacks the final '#### <number>'"),
])
def test_check_data_dir_rejects_broken_dirs_in_one_line(tmp_path, mutate, message):
    data = tmp_path / "gsm8k"
    data.mkdir()
    for name in ("train.jsonl", "test.jsonl"):
        (data / name).write_text((MINI / name).read_text())
    mutate(data)
    with pytest.raises(AccuracyError, match=message) as error:
        accuracy.check_data_dir(data)
    assert "\n" not in str(error.value)


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(AccuracyError, match="no such GSM8K data directory"):
        accuracy.check_data_dir(tmp_path / "nope")


def test_resolve_data_dir_order(tmp_path):
    never = lambda: pytest.fail("the hub must not be probed when local data exists")  # noqa: E731
    assert accuracy.resolve_data_dir(str(MINI), None, hub_check=never).path == MINI.resolve()
    assert accuracy.resolve_data_dir(None, str(MINI), hub_check=never).source == "local"
    found = accuracy.resolve_data_dir(None, None, default_dir=MINI, hub_check=never)
    assert (found.path, found.source) == (MINI.resolve(), "local")
    missing = tmp_path / "absent"
    assert accuracy.resolve_data_dir(None, None, default_dir=missing, hub_check=lambda: True).source == "hub"
    skipped = accuracy.resolve_data_dir(None, None, default_dir=missing, hub_check=lambda: False)
    assert skipped.source == "skip" and skipped.path is None
    assert "not reachable" in skipped.reason and str(missing) in skipped.reason
    with pytest.raises(AccuracyError):            # an explicit dir that is wrong never falls back
        accuracy.resolve_data_dir(str(missing), None, hub_check=lambda: True)
    with pytest.raises(AccuracyError):
        accuracy.resolve_data_dir(None, str(missing), hub_check=lambda: True)


def test_the_shared_data_dir_is_the_default():
    from harness.run.scenario import REPO_ROOT

    assert accuracy.DEFAULT_DATA_DIR == Path(REPO_ROOT).parent / "shared" / "data" / "gsm8k"


# ----------------------------------------------------------------------------------------------- command and task
def test_gsm8k_command_uses_local_completions_without_tokenizer(tmp_path):
    settings = accuracy.GsmSettings(num_fewshot=5, limit=10, num_concurrent=4)
    argv = accuracy.gsm8k_command("http://127.0.0.1:9", "tiny", tmp_path / "out", settings, task="gsm8k_local",
                                  include_path=tmp_path / "tasks")
    assert argv[1:4] == ["-m", "lm_eval", "run"]
    model_args = argv[argv.index("--model_args") + 1]
    assert argv[argv.index("--model") + 1] == "local-completions"
    for part in ("model=tiny", "base_url=http://127.0.0.1:9/v1/completions", "tokenizer_backend=None",
                 "num_concurrent=4", "max_gen_toks=256", "seed=1234"):
        assert part in model_args.split(",")
    assert "--log_samples" in argv and argv[argv.index("--limit") + 1] == "10"
    assert argv[argv.index("--include_path") + 1] == str(tmp_path / "tasks")
    assert argv[argv.index("--seed") + 1] == "0,1234,1234,1234"
    assert "--limit" not in accuracy.gsm8k_command("u", "m", tmp_path, accuracy.GsmSettings(limit=None))


def test_task_yaml_includes_upstream_gsm8k_and_points_at_local_files(tmp_path):
    import yaml

    path = accuracy.write_task_yaml(tmp_path / "tasks", MINI)
    task = yaml.safe_load(path.read_text())
    assert task["task"] == "gsm8k_local" and task["dataset_path"] == "json" and task["dataset_name"] is None
    assert Path(task["include"]).name == "gsm8k.yaml" and Path(task["include"]).is_file()
    assert task["dataset_kwargs"]["data_files"] == {"train": str(MINI / "train.jsonl"),
                                                   "test": str(MINI / "test.jsonl")}


# ----------------------------------------------------------------------------------------------- lm-eval, fake server
BASELINE_RIGHT, BASELINE_FLEX = {0, 1, 2, 3}, {4}          # strict 4/6, flexible 5/6
CANDIDATE_RIGHT, CANDIDATE_FLEX = {0, 1, 5}, {4}           # strict 3/6, flexible 4/6


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    """Both arms through real lm-eval (in parallel) against two fake servers; then summarize."""
    run_dir = tmp_path_factory.mktemp("run")
    data = GsmData(MINI.resolve(), "local", "test fixture")
    with FakeCompletions(_answers(BASELINE_RIGHT, BASELINE_FLEX)) as base, \
            FakeCompletions(_answers(CANDIDATE_RIGHT, CANDIDATE_FLEX)) as cand:
        with ThreadPoolExecutor(2) as pool:
            settings = accuracy.GsmSettings(num_fewshot=3, limit=None, num_concurrent=2, timeout_s=240, poll_s=0.2)
            futures = {arm: pool.submit(accuracy.run_gsm8k, run_dir, arm, accuracy.Endpoint(server.base_url, "tiny"),
                                        data, settings)
                       for arm, server in (("baseline", base), ("candidate", cand))}
            results = {arm: future.result() for arm, future in futures.items()}
        bodies = base.bodies + cand.bodies
    return run_dir, results, bodies, accuracy.summarize(run_dir)


def test_lm_eval_sends_greedy_requests_with_stop_strings_and_seed(fake_run):
    _, _, bodies, _ = fake_run
    assert len(bodies) == 2 * len(MINI_TEST)
    for body in bodies:
        assert body["temperature"] == 0 and body["max_tokens"] == 256 and body["seed"] == 1234
        assert "Question:" in body["stop"] and body["model"] == "tiny"
        assert body["prompt"].count("Question:") == 3 + 1   # 3-shot context + the question itself
        assert body["prompt"].endswith("\nAnswer:")


def test_arm_results_and_lm_eval_outputs_are_kept(fake_run):
    run_dir, results, _, _ = fake_run
    for arm, result in results.items():
        assert result.status == "done" and result.n == len(MINI_TEST) and result.task == "gsm8k_local"
        assert (run_dir / result.results_json).is_file() and (run_dir / result.samples_jsonl).is_file()
        assert (run_dir / "accuracy" / arm / "arm.json").is_file()
        assert (run_dir / "logs" / f"{arm}-lm-eval.log").stat().st_size > 0
    base = results["baseline"].filters
    assert base["strict-match"]["accuracy"] == pytest.approx(4 / 6)
    assert base["flexible-extract"]["accuracy"] == pytest.approx(5 / 6)
    for name in ("strict-match", "flexible-extract"):   # our figures are lm-eval's own
        assert base[name]["accuracy"] == pytest.approx(base[name]["lm_eval_accuracy"])
        assert base[name]["stderr"] == pytest.approx(base[name]["lm_eval_stderr"])
    assert procs.live_children() == []


def test_accuracy_csv_has_one_row_per_arm_question_filter(fake_run):
    run_dir, _, _, _ = fake_run
    rows = accuracy.read_rows(run_dir)
    assert len(rows) == 2 * len(MINI_TEST) * 2
    header = (run_dir / "accuracy.csv").read_text().splitlines()[0].split(",")
    assert tuple(header) == accuracy.ACCURACY_COLUMNS
    strict_base = {r["question_id"]: r for r in rows if r["arm"] == "baseline" and r["filter"] == "strict-match"}
    assert {q for q, r in strict_base.items() if r["correct"]} == BASELINE_RIGHT
    assert strict_base[0]["extracted"] == "23" and strict_base[0]["target"] == "23"
    flex_base = {r["question_id"]: r for r in rows if r["arm"] == "baseline" and r["filter"] == "flexible-extract"}
    assert flex_base[4]["correct"] == 1 and strict_base[4]["correct"] == 0


def test_summary_pairs_the_arms_with_exact_mcnemar(fake_run):
    _, _, _, summary = fake_run
    assert summary["status"] == "done"
    strict = next(p for p in summary["paired"] if p["filter"] == "strict-match")
    # baseline right only: {2, 3}; candidate right only: {5}
    assert (strict["baseline_only"], strict["candidate_only"]) == (2, 1)
    assert strict["difference_pts"] == pytest.approx(100 * (3 / 6 - 4 / 6))
    assert strict["p_value"] == pytest.approx(1.0)          # 2·P(X ≤ 1), X ~ Bin(3, ½) = 2·0.5 → 1
    assert strict["prompt_mismatches"] == 0                   # same few-shot context for both arms
    assert "ci95_pts" not in strict                          # the one interval is the verdict's (gsm8k_section)


def test_the_report_shows_the_verdicts_gsm8k_interval_only():
    from harness.render.sections import gsm8k_section
    from harness.rundir.schema import AccuracySummary

    summary = {"status": "done", "arms": {}, "paired": [
        {"filter": "strict-match", "difference_pts": -1.0}, {"filter": "flexible-extract", "difference_pts": -0.5}]}
    verdict = {"policy_fields": {"gsm8k_filter": "flexible-extract"}, "cells": [
        {"metric": "output_throughput", "ci_low_pts": 9.0},
        {"metric": "gsm8k_accuracy", "ci_low_pts": -2.5, "ci_high_pts": 1.5, "ci_level": 0.975}]}
    summary = AccuracySummary.model_validate(summary)
    strict, flexible = gsm8k_section(summary, False, verdict)["paired"]
    assert (flexible["ci_low_pts"], flexible["ci_high_pts"], flexible["ci_level"]) == (-2.5, 1.5, 0.975)
    assert strict["ci_low_pts"] is None and strict["ci_high_pts"] is None
    assert all(row["ci_low_pts"] is None for row in gsm8k_section(summary, False)["paired"])


def test_timeout_stops_lm_eval_and_names_the_limit(tmp_path):
    data = GsmData(MINI.resolve(), "local", "test fixture")
    with FakeCompletions({}, delay_s=30) as slow:
        started = time.monotonic()
        with pytest.raises(AccuracyError, match=r"timeout.*accuracy\.timeout_s = 3 s"):
            accuracy.run_gsm8k(tmp_path, "baseline", accuracy.Endpoint(slow.base_url, "tiny"), data,
                               accuracy.GsmSettings(limit=1, timeout_s=3, poll_s=0.2))
        assert time.monotonic() - started < 20
    assert procs.live_children() == []


def test_a_dead_server_stops_the_run(tmp_path):
    data = GsmData(MINI.resolve(), "local", "test fixture")
    with pytest.raises(AccuracyError, match="server died"):
        accuracy.run_gsm8k(tmp_path, "candidate", accuracy.Endpoint("http://127.0.0.1:9", "tiny", alive=lambda: False),
                           data, accuracy.GsmSettings(poll_s=0.1))
    assert procs.live_children() == []


def test_skip_is_refused_and_recorded(tmp_path):
    with pytest.raises(AccuracyError, match="no local data"):
        accuracy.run_gsm8k(tmp_path, "baseline", accuracy.Endpoint("u", "m"),
                           GsmData(None, "skip", "GSM8K not run: no local data"))
    summary = accuracy.record_skipped(tmp_path, "GSM8K not run: no local data")
    assert accuracy.load_summary(tmp_path) == summary and summary["status"] == "skipped"


# ----------------------------------------------------------------------------------------------- pure parts
def test_parse_samples_rejects_foreign_lines(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text('{"doc_id": 0}\n')
    with pytest.raises(AccuracyError, match="samples.jsonl:1"):
        accuracy.parse_samples(path, "baseline")


def test_summary_of_a_failed_arm_says_why(tmp_path):
    rows = [{"arm": "baseline", "question_id": q, "filter": f, "correct": 1, "extracted": "1", "target": "1",
             "prompt_hash": "h"} for q in range(3) for f in accuracy.FILTERS]
    records.atomic_write_text(tmp_path / "accuracy.csv", records.rows_to_csv(rows, accuracy.ACCURACY_COLUMNS))
    records.atomic_write_json(tmp_path / "accuracy" / "baseline" / "arm.json", {"arm": "baseline", "status": "done"})
    summary = accuracy.summarize(tmp_path, failures={"candidate": "GSM8K on candidate timeout: …"})
    assert summary["status"] == "partial" and summary["paired"] == []
    assert "candidate: failed: GSM8K on candidate timeout" in summary["reason"]


def test_paired_counts_discordant_pairs():
    rows = []
    outcomes = {"baseline": [1, 1, 1, 1, 1, 1, 1, 0, 0, 0], "candidate": [1, 1, 1, 0, 0, 0, 0, 0, 0, 1]}
    for arm, values in outcomes.items():
        rows += [{"arm": arm, "question_id": q, "filter": "strict-match", "correct": v, "prompt_hash": str(q)}
                 for q, v in enumerate(values)]
    result = accuracy.paired(rows, "strict-match")
    assert (result["baseline_only"], result["candidate_only"], result["both"], result["neither"]) == (4, 1, 3, 2)
    # exact two-sided: 2 · P(X ≤ 1), X ~ Bin(5, ½) = 2 · 6/32
    assert result["p_value"] == pytest.approx(12 / 32)
    assert accuracy.paired(rows, "flexible-extract") is None


# ----------------------------------------------------------------------------------------------- slow: real vLLM
@pytest.mark.slow
@pytest.mark.heavy
def test_lm_eval_against_real_cpu_vllm(tmp_path):
    """lm-eval GSM8K (limit 2, 5-shot, the shared data) against a real cpu-tiny server with MTP: the run completes,
    every question has both filters, prompts fit, and the spec-decode counters move during the run. The same server
    (one start, not two) gives tests/test_spec_decode.py's dummy-weights known answer: a greedy burst afterwards
    accepts almost no draft."""
    from harness.run import spec_decode
    from test_spec_decode import cpu_tiny_server, greedy_burst

    data = accuracy.resolve_data_dir(None, None, hub_check=lambda: False)
    if data.source != "local":
        pytest.skip(data.reason)
    with cpu_tiny_server(tmp_path, weights="dummy") as server:
        before = spec_decode.snapshot(server.base_url, server.headers)
        endpoint = accuracy.Endpoint(server.base_url, server.served_model_name, alive=server.alive)
        result = accuracy.run_gsm8k(tmp_path, "baseline", endpoint, data,
                                    accuracy.GsmSettings(num_fewshot=5, limit=2, num_concurrent=2, timeout_s=900))
        moved = spec_decode.window(before, spec_decode.snapshot(server.base_url, server.headers))
        before = spec_decode.snapshot(server.base_url, server.headers)
        greedy_burst(server)
        burst = spec_decode.window(before, spec_decode.snapshot(server.base_url, server.headers))
    assert burst["spec_drafts"] > 100
    assert burst["acceptance_rate"] < 0.05 and burst["acceptance_length"] < 1.05
    assert result.status == "done" and result.n == 2
    assert {row["filter"] for row in accuracy.read_rows(tmp_path)} == set(accuracy.FILTERS)
    assert moved["spec_drafts"] > 0
    assert "Error" not in (tmp_path / result.log).read_text().split("Requesting API")[-1]


# ----------------------------------------------------------------------------------------------- report
def _fixture_run_dir(tmp_path: Path, platform: str = "any") -> Path:
    import shutil

    run_dir = tmp_path / "report-run"
    shutil.copytree(Path(__file__).parent / "fixtures" / "run_dir", run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["scenario"]["platform"] = platform
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


def test_report_shows_gsm8k_per_arm_and_the_paired_test(fake_run, tmp_path):
    import shutil

    from harness.render.html import render_html
    from harness.render.view import build_context

    source, _, _, _ = fake_run
    for platform, reference in (("any", False), ("cuda", True)):
        run_dir = _fixture_run_dir(tmp_path / platform, platform)
        shutil.copy(source / "accuracy.csv", run_dir / "accuracy.csv")
        shutil.copytree(source / "accuracy", run_dir / "accuracy")
        context = build_context(run_dir)
        section = context["sections"]["gsm8k"]
        strict = next(r for r in section["arms"] if r["arm"] == "baseline" and r["filter"] == "strict-match")
        assert strict["accuracy_pct"] == pytest.approx(100 * 4 / 6) and strict["n"] == 6
        html = render_html(context)
        assert 'id="gsm8k-arms"' in html and 'id="gsm8k-paired"' in html
        assert ("94.768 %" in html) is reference
        assert "3-shot" in section["setup"]


def test_report_says_why_gsm8k_was_skipped(tmp_path):
    from harness.render.html import render_html
    from harness.render.view import build_context

    run_dir = _fixture_run_dir(tmp_path)
    accuracy.record_skipped(run_dir, "GSM8K not run: no local data and the hub is not reachable")
    html = render_html(build_context(run_dir))
    assert "Not measured in this run: GSM8K not run: no local data and the hub is not reachable" in html
