"""MTP acceptance: counter parsing, window maths, vLLM bench's own window, and (slow) the known answers on real CPU
vLLM — ≈ 0 % with dummy weights (asserted on tests/test_accuracy.py's server), exactly 100 % with the
repeat-the-last-token checkpoint."""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from harness.rundir import store as records

from harness.run import spec_decode

# What vLLM 0.32's /metrics serves with --speculative-config '{"method":"mtp","num_speculative_tokens":2}'
# (captured from a cpu-tiny server, trimmed; the _created gauges are part of the real output).
METRICS_TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-deepseek-v3"} {drafts}
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny-deepseek-v3"} 1.7960802629698315e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny-deepseek-v3"} {draft_tokens}
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny-deepseek-v3"} {accepted}
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-deepseek-v3",position="0"} {pos0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-deepseek-v3",position="1"} {pos1}
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-deepseek-v3"} 0.0
"""
NO_MTP_TEXT = "# HELP vllm:num_requests_running" + METRICS_TEXT.split("# HELP vllm:num_requests_running")[1]


def _text(drafts, draft_tokens, accepted, pos0, pos1) -> str:
    values = dict(drafts=drafts, draft_tokens=draft_tokens, accepted=accepted, pos0=pos0, pos1=pos1)
    text = METRICS_TEXT
    for key, value in values.items():
        text = text.replace("{" + key + "}", f"{float(value)}")
    return text


class FakeMetrics:
    """Serves a sequence of /metrics bodies (the last one repeats), counting reads."""

    def __init__(self, bodies: list[str]):
        self.bodies, self.reads = bodies, 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                body = fake.bodies[min(fake.reads, len(fake.bodies) - 1)].encode()
                fake.reads += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ----------------------------------------------------------------------------------------------- parsing and maths
def test_snapshot_reads_vllm_counters_and_waits_until_they_settle():
    fake = FakeMetrics([_text(10, 20, 5, 4, 1), _text(12, 24, 6, 5, 1), _text(12, 24, 6, 5, 1)])
    try:
        snap = spec_decode.snapshot(fake.base_url, settle_s=0.01)
    finally:
        fake.close()
    assert fake.reads == 3          # read, changed, read again: stable
    assert snap == {"enabled": True, "drafts": 12.0, "draft_tokens": 24.0, "accepted_tokens": 6.0,
                    "accepted_per_pos": {0: 5.0, 1: 1.0}}


def test_snapshot_without_mtp_is_disabled():
    fake = FakeMetrics([NO_MTP_TEXT])
    try:
        snap = spec_decode.snapshot(fake.base_url, settle_s=0)
    finally:
        fake.close()
    assert snap["enabled"] is False and snap["drafts"] is None
    assert spec_decode.window(snap, snap) == {key: None for key in (
        "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "acceptance_rate", "acceptance_length",
        "acceptance_per_pos")}


def _snap(drafts, draft_tokens, accepted, per_pos):
    return {"enabled": True, "drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
            "accepted_per_pos": dict(enumerate(per_pos))}


def test_window_maths_k2():
    # 100 drafts of k = 2 tokens: 80 accepted at position 0, 50 at position 1 → 130 accepted of 200.
    before = _snap(1000, 2000, 900, [600, 300])
    after = _snap(1100, 2200, 1030, [680, 350])
    result = spec_decode.window(before, after)
    assert result["spec_drafts"] == 100 and result["spec_draft_tokens"] == 200 and result["spec_accepted_tokens"] == 130
    assert result["acceptance_rate"] == pytest.approx(130 / 200)          # accepted / draft tokens
    assert result["acceptance_length"] == pytest.approx(1 + 130 / 100)    # 1 + accepted / drafts
    assert result["acceptance_per_pos"] == pytest.approx([0.8, 0.5])      # per position / drafts
    assert sum(result["acceptance_per_pos"]) == pytest.approx(result["acceptance_length"] - 1)


def test_window_without_drafts_has_zero_counts_and_no_ratios():
    snap = _snap(50, 50, 10, [10])
    result = spec_decode.window(snap, snap)
    assert (result["spec_drafts"], result["spec_draft_tokens"], result["spec_accepted_tokens"]) == (0, 0, 0)
    assert result["acceptance_rate"] is None and result["acceptance_length"] is None
    assert result["acceptance_per_pos"] is None


def test_a_restarted_server_is_refused():
    with pytest.raises(ValueError, match="restarted"):
        spec_decode.window(_snap(50, 50, 10, [10]), _snap(5, 5, 1, [1]))


def test_vllm_bench_window_excludes_warmups():
    # Real result fields of `vllm bench serve` (vLLM 0.32) on the repeat checkpoint, 8 prompts × 32 tokens with
    # 2 warmups: bench's own window 128 drafts; /metrics around the whole call read 160 (warmups + ready check).
    bench = {"spec_decode_acceptance_rate": 100.0, "spec_decode_acceptance_length": 2.0,
             "spec_decode_num_drafts": 128, "spec_decode_draft_tokens": 128, "spec_decode_accepted_tokens": 128,
             "spec_decode_per_position_acceptance_rates": [1.0]}
    result = spec_decode.from_bench_result(bench, mtp_enabled=True)
    assert result == {"spec_drafts": 128, "spec_draft_tokens": 128, "spec_accepted_tokens": 128,
                      "acceptance_rate": 1.0, "acceptance_length": 2.0, "acceptance_per_pos": [1.0]}
    idle = spec_decode.from_bench_result({}, mtp_enabled=True)
    assert idle["spec_drafts"] == 0 and idle["acceptance_rate"] is None
    assert spec_decode.from_bench_result(bench, mtp_enabled=False)["spec_drafts"] is None


def test_level_fields_round_trip_through_csv_cells():
    window = spec_decode.window(_snap(0, 0, 0, [0, 0]), _snap(100, 200, 130, [80, 50]))
    cells = spec_decode.level_fields(window)
    assert set(cells) == set(spec_decode.LEVEL_COLUMNS)
    assert cells["acceptance_per_pos"] == "0.8;0.5" and cells["acceptance_rate"] == 0.65
    assert spec_decode.parse_per_pos(cells["acceptance_per_pos"]) == [0.8, 0.5]
    assert spec_decode.parse_per_pos(0.25) == [0.25]            # pandas reads a one-position cell as a float
    assert spec_decode.parse_per_pos(float("nan")) == [] and spec_decode.parse_per_pos("") == []
    assert spec_decode.level_fields(spec_decode.window({"enabled": False}, {"enabled": False}))["spec_drafts"] is None


# ----------------------------------------------------------------------------------------------- slow: real vLLM
WEIGHTS = {  # cpu-tiny's geometry with dummy weights (acceptance ≈ 0 %) or the repeat-last checkpoint (100 %)
    "dummy": {"model.id": "generated:tiny-deepseek-v3", "model.load_format": "dummy"},
    "repeat": {"model.id": "generated:tiny-deepseek-v3-repeat", "model.load_format": "safetensors"},
}


@contextlib.contextmanager
def cpu_tiny_server(tmp_path: Path, weights: str = "dummy", mtp: int = 1, max_model_len: int = 4096
                    ) -> Iterator:
    """A real cpu-tiny ``vllm serve`` (the candidate arm's flags: not compiled, quicker to start) with MTP ``mtp``,
    ``max_model_len`` raised for 5-shot GSM8K; ``weights`` "dummy" or "repeat" (see :data:`WEIGHTS`).
    Stopped (process group) on exit."""
    import os

    from harness.run import machine, plan as plan_mod
    from harness.run.models import locate
    from harness.run.scenario import load_scenario
    from harness.run.server import VllmServer, free_port

    scenario = load_scenario("cpu-tiny", {"model.max_model_len": max_model_len,
                                          "serve.max_num_batched_tokens": max_model_len,
                                          "mtp.num_speculative_tokens": mtp, **WEIGHTS[weights]})
    built = plan_mod.build_plan(scenario, machine.detect(), locate(scenario))
    arm = next(a for a in built.arms if a.name == "candidate")
    port = free_port()
    server = VllmServer(arm.server_argv(port), {**os.environ, **arm.server_env}, port, arm.served_model_name,
                        tmp_path / f"server-{weights}.log")
    try:
        server.start(scenario.serve.ready_timeout_s)
        yield server
    finally:
        server.stop()


def greedy_burst(server, prompts: int = 4, tokens: int = 48) -> None:
    import requests

    for index in range(prompts):
        body = {"model": server.served_model_name, "prompt": f"Tom has {index + 3} apples and buys more.",
                "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        requests.post(f"{server.base_url}/v1/completions", json=body, timeout=300).raise_for_status()


# The dummy-weights known answer (≈ 0 % acceptance) is checked on tests/test_accuracy.py's lm-eval server: one start.


@pytest.mark.slow
@pytest.mark.heavy
def test_repeat_checkpoint_accepts_every_draft_and_the_arms_agree(tmp_path):
    from harness.run import parity

    with cpu_tiny_server(tmp_path, weights="repeat") as server:
        before = spec_decode.snapshot(server.base_url, server.headers)
        greedy_burst(server)
        result = spec_decode.window(before, spec_decode.snapshot(server.base_url, server.headers))
        prompts = parity.fixed_prompts(4)
        first = parity.collect(server.base_url, server.served_model_name, prompts, 16, server.headers)
        second = parity.collect(server.base_url, server.served_model_name, prompts, 16, server.headers)
    # 4 prompts × 48 tokens: the first token comes from the prefill, then every step emits a draft and its bonus token.
    assert result["spec_drafts"] == 4 * 24
    assert result["acceptance_rate"] == 1.0 and result["acceptance_length"] == 2.0
    assert result["acceptance_per_pos"] == [1.0]
    # The checkpoint repeats the last prompt token with a margin of many nats.
    for row in first:
        assert len(set(row["token_ids"])) == 1 and len(row["token_ids"]) == 16
        assert row["top"][0][0][1] - row["top"][0][1][1] > 5.0
    compared = parity.compare(first, second)
    assert compared["exact_match_rate_pct"] == 100.0 and compared["max_logprob_diff"] == 0.0


# ----------------------------------------------------------------------------------------------- report
FIXTURE_RUN = Path(__file__).parent / "fixtures" / "run_dir"


def _run_dir_with_mtp(tmp_path: Path, k: int = 1, platform: str = "any") -> Path:
    import csv
    import json
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["scenario"]["mtp"] = {"num_speculative_tokens": k}
    manifest["scenario"]["platform"] = platform
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    with (run_dir / "levels.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        c = int(row["concurrency"])
        drafts, accepted = 100 * c, (60 if row["arm"] == "baseline" else 50) * c
        row.update(spec_decode.level_fields(spec_decode.window(
            {"enabled": True, "drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_pos": {0: 0}},
            {"enabled": True, "drafts": drafts, "draft_tokens": drafts, "accepted_tokens": accepted,
             "accepted_per_pos": {0: accepted}})))
    columns = tuple(rows[0].keys())
    (run_dir / "levels.csv").write_text(records.rows_to_csv(rows, columns))
    return run_dir


def test_report_reads_acceptance_from_levels_csv_and_plots_it(tmp_path):
    from harness.render.html import render_html
    from harness.render.view import build_context

    context = build_context(_run_dir_with_mtp(tmp_path))
    mtp = context["sections"]["mtp"]
    row = next(r for r in mtp["rows"] if r["arm"] == "baseline" and r["concurrency"] == 2)
    assert row["acceptance_rate_pct"] == pytest.approx(60.0) and row["acceptance_length"] == pytest.approx(1.6)
    assert row["per_position"] == pytest.approx([60.0]) and row["drafts"] == 200
    assert mtp["reference"] is None
    from harness.render.plots import acceptance_plot
    assert acceptance_plot(mtp["rows"], 1).uri.startswith("data:image/png;base64,")
    html = render_html(context)
    assert 'id="mtp-table"' in html and 'id="plot-acceptance"' in html and "79.1" not in html


def test_gpu_scenarios_show_the_upstream_acceptance_reference(tmp_path):
    from harness.render.html import render_html
    from harness.render.view import build_context

    html = render_html(build_context(_run_dir_with_mtp(tmp_path, platform="cuda")))
    assert "79.1 % MTP acceptance rate" in html


def test_repeats_are_pooled_by_counts_not_averaged_ratios():
    import pandas as pd

    from harness.render.sections import mtp_section
    from harness.rundir.schema import Manifest

    frame = pd.DataFrame([
        {"arm": "candidate", "level": "random-i64-o32-c4", "concurrency": 4, "spec_drafts": 100, "spec_draft_tokens": 200,
         "spec_accepted_tokens": 200, "acceptance_rate": 1.0, "acceptance_length": 3.0, "acceptance_per_pos": "1;1"},
        {"arm": "candidate", "level": "random-i64-o32-c4", "concurrency": 4, "spec_drafts": 300, "spec_draft_tokens": 600,
         "spec_accepted_tokens": 0, "acceptance_rate": 0.0, "acceptance_length": 1.0, "acceptance_per_pos": "0;0"},
    ])
    (row,) = mtp_section(frame, Manifest(run_id="r", scenario={"mtp": {"num_speculative_tokens": 2}}))["rows"]
    assert row["acceptance_rate_pct"] == pytest.approx(25.0)          # 200 / 800, not mean(100 %, 0 %)
    assert row["acceptance_length"] == pytest.approx(1.5)             # 1 + 200 / 400
    assert row["per_position"] == pytest.approx([25.0, 25.0])
    assert mtp_section(frame, Manifest(run_id="r", scenario={"mtp": {"num_speculative_tokens": 0}})).startswith("MTP is off")


def test_per_position_acceptance_cells_fail_a_loss_at_a_later_position_only():
    """acceptance_pos_<k> read from levels.csv acceptance_per_pos: a candidate that keeps position 1 and loses at
    position 2 FAILs acceptance_pos_2 and not acceptance_pos_1 (synthetic A/A performance data, tests/fixtures)."""
    import importlib.util
    from pathlib import Path

    import numpy as np

    from harness.judge.policy import GatePolicy, Status
    from harness.judge.verdict import evaluate
    from harness.rundir.schema import Manifest

    spec = importlib.util.spec_from_file_location("aa_split", Path(__file__).parent / "fixtures" / "recorded" /
                                                  "aa_split.py")
    aa_split = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(aa_split)
    manifest, levels, requests = aa_split.aa_run(8, identical=True)
    rng = np.random.default_rng(0)
    cand = levels["arm"] == "candidate"
    first = 0.8 + rng.normal(0, 0.005, len(levels))
    second = np.where(cand, 0.4, 0.6) + rng.normal(0, 0.005, len(levels))
    levels = levels.assign(spec_drafts=1000.0, spec_draft_tokens=2000.0, spec_accepted_tokens=1000.0 * (first + second),
                           acceptance_per_pos=[f"{a:.4f};{b:.4f}" for a, b in zip(first, second)])
    policy = GatePolicy(primary=("acceptance_pos_1", "acceptance_pos_2"), require_attestation=False)
    verdict = evaluate(Manifest.model_validate(manifest), levels, requests, None, policy)
    by_metric = {}
    for cell in verdict.primary:
        by_metric.setdefault(cell.metric, set()).add(cell.status)
    assert by_metric["acceptance_pos_2"] == {Status.FAIL}
    assert Status.FAIL not in by_metric["acceptance_pos_1"]
    assert not any(c.metric == "acceptance_pos_3" for c in verdict.cells)   # never drafted: not shown
