"""Output parity: fixed prompts, parsing vLLM's completion answer, the comparison (first divergence, |Δ logprob| at
matched positions, near-tie labelling) and the run-dir files."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.run import parity
from harness.run.scenario import ParitySpec


def _row(index, ids, logprobs=None, tops=None, prompt=None):
    """A collect() row: ``tops[i]`` is the position's top-2 as [[id, logprob], [id, logprob]]."""
    logprobs = logprobs or [-0.1] * len(ids)
    tops = tops or [[[t, lp], [t + 1, lp - 3.0]] for t, lp in zip(ids, logprobs)]
    return {"index": index, "prompt": prompt or f"prompt {index}", "token_ids": list(ids), "logprobs": list(logprobs),
            "top": tops}


# ----------------------------------------------------------------------------------------------- prompts and parsing
def test_fixed_prompts_are_deterministic_and_distinct():
    prompts = parity.fixed_prompts(16, seed=0)
    assert prompts == parity.fixed_prompts(16, seed=0) and len(prompts) == 16
    assert len(set(prompts)) == 16 and all(p.strip() for p in prompts)
    assert parity.fixed_prompts(16, seed=1) != prompts
    assert parity.fixed_prompts(4) == prompts[:4]


def test_parse_choice_reads_token_ids_and_top_logprobs():
    # The shape of vLLM 0.32's /v1/completions choice with logprobs=2, return_token_ids, return_tokens_as_token_ids.
    choice = {"index": 0, "text": "??", "token_ids": [32, 32],
              "logprobs": {"tokens": ["token_id:32", "token_id:32"], "token_logprobs": [-8.2e-05, -8.2e-05],
                           "text_offset": [0, 1],
                           "top_logprobs": [{"token_id:437": -13.2, "token_id:32": -8.2e-05},
                                            {"token_id:32": -8.2e-05, "token_id:437": -13.2}]}}
    parsed = parity.parse_choice(choice)
    assert parsed["token_ids"] == [32, 32] and parsed["logprobs"] == [-8.2e-05, -8.2e-05]
    assert parsed["top"][0] == [[32, -8.2e-05], [437, -13.2]]       # sorted best first
    with pytest.raises(ValueError, match="return_token_ids"):
        parity.parse_choice({"text": "x", "logprobs": None})


# ----------------------------------------------------------------------------------------------- comparison
def test_identical_outputs_match_exactly():
    rows = [_row(i, [5, 6, 7]) for i in range(3)]
    result = parity.compare(rows, [dict(r) for r in rows])
    assert result["exact_match_rate_pct"] == 100.0 and result["divergences"] == []
    assert result["max_logprob_diff"] == 0.0 and result["failures"] == 0


def test_clear_divergence_is_a_failure_with_position_and_margin():
    base = [_row(0, [5, 6, 7, 8], logprobs=[-0.1, -0.2, -0.1, -0.1])]
    cand = [_row(0, [5, 6, 9, 9], logprobs=[-0.15, -0.2, -0.1, -0.1])]
    result = parity.compare(base, cand)
    (div,) = result["divergences"]
    assert div["position"] == 2 and div["matched_tokens"] == 2 and not div["near_tie"]
    assert div["token_baseline"] == 7 and div["token_candidate"] == 9
    assert div["margin"] == pytest.approx(3.0)                     # top-1 − top-2 at the divergence
    assert div["max_logprob_diff"] == pytest.approx(0.05)           # matched positions 0 and 1 only
    assert result["failures"] == 1 and result["exact_match_rate_pct"] == 0.0


def test_divergence_at_a_near_tie_is_labelled_not_failed():
    # Position 1: both arms hold tokens 6 and 9 as their top two, 0.01 nats apart, and pick differently.
    tie_b = [[6, -0.690], [9, -0.700]]
    tie_c = [[9, -0.692], [6, -0.698]]
    base = [_row(0, [5, 6, 6], tops=[[[5, -0.1], [1, -4.0]], tie_b, [[6, -0.1], [2, -5.0]]],
                 logprobs=[-0.1, -0.69, -0.1])]
    cand = [_row(0, [5, 9, 9], tops=[[[5, -0.1], [1, -4.0]], tie_c, [[9, -0.1], [2, -5.0]]],
                 logprobs=[-0.1, -0.692, -0.1])]
    clear = [_row(1, [1, 2])]
    result = parity.compare(base + clear, cand + [_row(1, [1, 3])], near_tie_tol=0.05)
    assert result["near_ties"] == 1 and result["failures"] == 1
    first, second = result["divergences"]
    assert first["prompt_index"] == 1 and not first["near_tie"]     # real divergences are listed first
    assert second["prompt_index"] == 0 and second["near_tie"] and second["position"] == 1
    assert second["margin"] == pytest.approx(0.01)
    # With a tighter tolerance the same divergence is a failure.
    assert parity.compare(base, cand, near_tie_tol=0.001)["failures"] == 1


def test_competing_token_outside_the_top_two_is_not_a_tie():
    base = [_row(0, [5], tops=[[[5, -0.70], [7, -0.71]]], logprobs=[-0.70])]
    cand = [_row(0, [9], tops=[[[9, -0.70], [5, -0.71]]], logprobs=[-0.70])]   # baseline's 9 is not in its top 2
    (div,) = parity.compare(base, cand)["divergences"]
    assert div["near_tie"] is False


def test_length_mismatch_diverges_where_the_shorter_ends():
    result = parity.compare([_row(0, [1, 2, 3])], [_row(0, [1, 2])])
    (div,) = result["divergences"]
    assert div["position"] == 2 and div["near_tie"] is False


def test_unpaired_results_are_refused():
    with pytest.raises(ValueError, match="different prompts"):
        parity.compare([_row(0, [1])], [_row(1, [1])])
    with pytest.raises(ValueError, match="differs between the arms"):
        parity.compare([_row(0, [1], prompt="a")], [_row(0, [1], prompt="b")])


def test_nan_logprobs_are_ignored_in_the_difference():
    base = [_row(0, [1, 2], logprobs=[float("nan"), -0.5])]
    cand = [_row(0, [1, 2], logprobs=[-0.2, -0.25])]
    assert parity.compare(base, cand)["max_logprob_diff"] == pytest.approx(0.25)


# ----------------------------------------------------------------------------------------------- collect and files
class _FakeVllm:
    """Answers /v1/completions like vLLM with return_token_ids + logprobs: the prompt's length picks the token."""

    def __init__(self):
        self.bodies = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                token = len(body["prompt"]) % 50
                n = body["max_tokens"]
                choice = {"index": 0, "text": "x" * n, "finish_reason": "length", "token_ids": [token] * n,
                          "logprobs": {"tokens": [f"token_id:{token}"] * n, "token_logprobs": [-0.01] * n,
                                       "text_offset": list(range(n)),
                                       "top_logprobs": [{f"token_id:{token}": -0.01, "token_id:99": -4.6}] * n}}
                payload = json.dumps({"choices": [choice]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_collect_sends_greedy_logprob_requests_and_files_round_trip(tmp_path):
    fake = _FakeVllm()
    try:
        spec = ParitySpec(n=3, max_tokens=8)
        parity.run_arm(tmp_path, "baseline", fake.base_url, "tiny", spec)
        parity.run_arm(tmp_path, "candidate", fake.base_url, "tiny", spec)
        one_by_one = parity.collect(fake.base_url, "tiny", parity.fixed_prompts(3), 8, concurrency=1)
    finally:
        fake.close()
    body = fake.bodies[0]
    assert body["temperature"] == 0 and body["logprobs"] == 2 and body["ignore_eos"] is True
    assert body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
    assert body["max_tokens"] == 8 and body["model"] == "tiny"
    rows = parity.load_arm(tmp_path, "baseline")
    assert rows == one_by_one                                  # same rows, in prompt order, however many in flight
    assert len(rows) == 3 and rows[0]["token_ids"] == [len(rows[0]["prompt"]) % 50] * 8
    result = parity.compare_run_dir(tmp_path)
    assert result["exact_match_rate_pct"] == 100.0
    assert parity.load_comparison(tmp_path) == json.loads((tmp_path / "parity.json").read_text())
    assert not math.isnan(result["max_logprob_diff"])


def test_compare_run_dir_without_both_arms_writes_nothing(tmp_path):
    parity.save_arm(tmp_path, "baseline", [_row(0, [1])])
    assert parity.compare_run_dir(tmp_path) is None and not (tmp_path / "parity.json").exists()
    assert parity.load_comparison(tmp_path) is None


def test_report_shows_parity_from_the_run_dir(tmp_path):
    import shutil
    from pathlib import Path

    from harness.render.html import render_html
    from harness.render.view import build_context

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "fixtures" / "run_dir", run_dir)
    tie = [[6, -0.690], [9, -0.700]]
    base = [_row(0, [5, 6], tops=[[[5, -0.1], [1, -4.0]], tie], prompt="<b>tie</b>"), _row(1, [1, 2])]
    cand = [_row(0, [5, 9], tops=[[[5, -0.1], [1, -4.0]], [[9, -0.69], [6, -0.70]]], prompt="<b>tie</b>"),
            _row(1, [1, 2])]
    parity.save_arm(run_dir, "baseline", base)
    parity.save_arm(run_dir, "candidate", cand)
    parity.compare_run_dir(run_dir)
    section = build_context(run_dir)["sections"]["parity"]
    assert section["exact_match_rate_pct"] == 50.0 and section["near_ties"] == 1
    html = render_html(build_context(run_dir))
    assert 'id="parity-divergences"' in html and "near-tie" in html
    assert "<b>tie</b>" not in html and "&lt;b&gt;tie&lt;/b&gt;" in html
