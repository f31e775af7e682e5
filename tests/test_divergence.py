"""Teacher-forced scoring (harness.run.scoring) and the correctness cells (harness.judge.divergence), on made-up
rows and on the recorded A/A sessions of the default (tests/fixtures/recorded/scoring-aa)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.judge import divergence
from harness.study import divergence_simulation
from harness.judge import token_compare
from harness.run import scoring
from harness.judge.policy import GatePolicy
from harness.rundir.schema import Status


def _dist(logits):
    z = np.asarray(logits, dtype=float)
    return z - np.log(np.exp(z).sum())


def _top(logprobs, k):
    order = np.argsort(-logprobs)[:k]
    return [[int(t), float(logprobs[t])] for t in order]


def test_parse_scores_keeps_the_continuation_and_checks_the_echoed_tokens():
    sequence = {"index": 3, "prompt_ids": [5, 6], "forced_ids": [7, 8]}
    entry = lambda tok, lp: {str(tok): {"logprob": lp, "rank": 1}, "9": {"logprob": lp - 1.0, "rank": 2}}
    choice = {"prompt_logprobs": [None, entry(6, -0.5), entry(7, -0.1), entry(8, -0.2)],
              "prompt_token_ids": [5, 6, 7, 8]}
    row = scoring.parse_scores(choice, sequence)
    assert row["logprobs"] == [-0.1, -0.2] and row["top"][0][0] == [7, -0.1]
    with pytest.raises(ValueError, match="other tokens"):
        scoring.parse_scores({**choice, "prompt_token_ids": [5, 6, 7, 1]}, sequence)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        scoring.parse_scores({"prompt_logprobs": None}, sequence)


def test_top_k_kl_is_a_lower_bound_and_exact_with_the_whole_vocabulary():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p, q = _dist(rng.normal(0, 2, 30)), _dist(rng.normal(0, 2, 30))
        full = float(np.sum(np.exp(p) * (p - q)))
        bound = token_compare._coarse_kl(_top(p, 5), _top(q, 5))
        assert 0.0 <= bound <= full + 1e-9
        assert token_compare._coarse_kl(_top(p, 30), _top(q, 30)) == pytest.approx(full, abs=1e-9)


def test_sign_test_is_the_binomial_tail():
    assert divergence.sign_test(0, 0) == 1.0
    assert divergence.sign_test(5, 0) == pytest.approx(1 / 32)
    assert divergence.sign_test(6, 1) == pytest.approx(8 / 128)


def _rows(n, shift=(), length=10, seed=0, by=0.5):
    """Scoring rows of ``n`` prompts; prompts in ``shift`` get their forced logprobs moved by ``by`` nats."""
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(n):
        lps = [float(v) for v in -rng.uniform(0, 2, length)]
        delta = by if index in shift else 0.0
        rows.append({"index": index, "logprobs": [v - delta for v in lps],
                     "top": [[[index, v - delta], [999, v - 3]] for v in lps]})
    return rows


def test_divergence_cell_fails_a_shift_passes_an_identical_arm_and_is_invalid_on_an_unstable_envelope():
    ref = _rows(32)
    moved = divergence.divergence_cell(ref, _rows(32, shift=range(10)), [_rows(32)], alpha=0.05)
    assert moved.status == Status.FAIL and moved.exceed == 10 and moved.first == (0, 0)
    assert divergence.divergence_cell(ref, _rows(32, shift=range(4)), [_rows(32)], 0.05).status == Status.PASS
    assert divergence.divergence_cell(ref, _rows(32), [_rows(32)], 0.05).status == Status.PASS
    unstable = divergence.divergence_cell(ref, _rows(32, shift=range(10)), [_rows(32, shift=range(8))], 0.05)
    assert unstable.status == Status.INVALID and "unstable" in unstable.reasons[0]


def test_the_tie_band_is_the_policys_token_tolerance():
    """A quiet defect moving 12 prompts by 0.005 nats/token (the catalogue's visibility off-by-one is of that size)
    FAILs at the default band (0.002) and passes a scenario that sets ``token_tolerance = 0.01``; the harmless
    compile-off change's largest per-prompt mean (0.00096, recorded) is a tie at the default."""
    ref, quiet = _rows(32), _rows(32, shift=range(12), by=0.005)
    assert divergence.TOKEN_TOLERANCE == GatePolicy().token_tolerance
    cells = divergence.judge({"baseline": ref, "candidate": quiet, "baseline-2": _rows(32)}, {}, 0.05)
    assert cells[0].status == Status.FAIL and cells[0].exceed == 12
    loose = divergence.judge({"baseline": ref, "candidate": quiet, "baseline-2": _rows(32)}, {}, 0.05, 0.01)
    assert loose[0].status == Status.PASS and loose[0].ties == 32
    harmless = divergence.divergence_cell(ref, _rows(32, shift=range(32), by=0.00096), [_rows(32)], 0.05)
    assert harmless.status == Status.PASS and harmless.exceed == 0


def _greedy(n, diverge=(), at=3):
    return [{"index": i, "prompt": f"p{i}", "token_ids": [1, 2, 3, 4, 5][:at] + ([9] if i in diverge else [4]),
             "logprobs": [-0.1] * (at + 1), "top": [[[1, -0.1], [2, -3.0]]] * (at + 1)} for i in range(n)]


def test_parity_cell_counts_prompts_that_diverge_earlier_than_the_aa():
    cell = divergence.parity_cell(_greedy(32), _greedy(32, diverge=range(7)), [_greedy(32)], 0.05)
    assert cell.status == Status.FAIL and cell.exceed == 7 and cell.first == (0, 3)
    assert cell.ab["exact_match_rate_pct"] == pytest.approx(100 * 25 / 32)
    same = divergence.parity_cell(_greedy(32), _greedy(32, diverge=range(7)), [_greedy(32, diverge=range(7))], 0.05)
    assert same.status == Status.INVALID   # the baseline itself diverges on 7 prompts


def _decoded(n, stale=(), by=0.01, diverge=(), at=6, length=12, seed=0):
    """Parity rows of ``n`` prompts with decode-time log p: prompts in ``stale`` have theirs moved by ``by`` nats at
    every position (a decode-only defect: same tokens, other log p); prompts in ``diverge`` change token ``at``."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        lps = [float(v) for v in -rng.uniform(0, 1, length)]
        ids = [int(t) for t in rng.integers(1, 50, length)]
        if i in diverge:
            ids[at] = 99
        rows.append({"index": i, "prompt": f"p{i}", "token_ids": ids,
                     "logprobs": [v - (by if i in stale else 0.0) for v in lps], "top": []})
    return rows


def test_decode_cell_fails_a_decode_only_shift_and_compares_the_common_prefix_only():
    """A decode-only defect (``stale-index-key``: identical greedy tokens, other decode log p, nothing a prefill
    sees) on 10 of 32 prompts FAILs; an A/A with the recorded batch-composition noise (≤ 0.000014 nats per prompt)
    and the harmless compile-off size (0.00096 on every prompt) pass; positions after the first differing token do
    not count (a different continuation has other log p by right, the parity cell's business)."""
    ref = _decoded(32)
    cell = divergence.decode_cell(ref, _decoded(32, stale=range(10)), [_decoded(32, stale=range(32), by=1.4e-5)], 0.05)
    assert cell.status == Status.FAIL and (cell.exceed, cell.below, cell.ties) == (10, 0, 22) and cell.first == (0, 0)
    assert cell.ab["common_tokens"] == cell.ab["tokens"] == 32 * 12 and cell.aa["max"] == pytest.approx(1.4e-5)
    harmless = divergence.decode_cell(ref, _decoded(32, stale=range(32), by=0.00096), [_decoded(32)], 0.05)
    assert harmless.status == Status.PASS and harmless.exceed == 0
    assert divergence.decode_cell(ref, _decoded(32, stale=range(5)), [_decoded(32)], 0.05).status == Status.PASS
    after = _decoded(32, diverge=range(32))
    for row, base in zip(after, ref):
        row["logprobs"] = base["logprobs"][:6] + [v - 1.0 for v in base["logprobs"][6:]]
    moved = divergence.decode_cell(ref, after, [_decoded(32)], 0.05)
    assert moved.status == Status.PASS and moved.ab["common_tokens"] == 32 * 6 and moved.ab["max"] == 0.0
    first = divergence.decode_cell(ref, _decoded(32, diverge=range(32), at=0), [_decoded(32)], 0.05)
    assert first.status == Status.PASS and first.ties == 32       # no common prefix: a tie, not a crash


def test_decode_cell_is_left_out_for_parity_rows_without_decode_logprobs():
    """Rows of a run directory whose parity requests carried no ``logprobs`` (other tooling): the decode cell is
    absent, the parity cell judged as before; missing parity files make it INVALID like the parity cell."""
    greedy = {label: _decoded(32) for label in divergence.SCORINGS}
    assert [c.name for c in divergence.judge({}, greedy, 0.05)] == list(divergence.CELLS)
    bare = {label: [{k: v for k, v in row.items() if k != "logprobs"} for row in rows] for label, rows in greedy.items()}
    cells = divergence.judge({}, bare, 0.05)
    assert [c.name for c in cells] == ["token_divergence", "parity"] and cells[1].status == Status.PASS
    absent = divergence.judge({}, {}, 0.05)
    assert [c.status for c in absent] == [Status.INVALID] * 3 and "parity/baseline.json" in absent[1].reasons[0]


def test_recorded_decode_logprobs_are_not_bit_exact_aa_but_far_inside_the_band():
    """The recorded parity outputs' decode-time log p (tests/fixtures/recorded/scoring-aa): another batch composition
    moves them (not bit-exact, unlike the forced scorings), by ≤ 0.000014 nats per prompt; the harmless compile-off
    change by ≤ 0.00096 per prompt: both below half the tie band."""
    ref = RECORDED["baseline-1"]["parity"]["all"]
    batch, _ = divergence.decode_values(ref, RECORDED["baseline-1"]["parity"]["one"], [ref])
    assert 0.0 < max(batch.values()) < 2e-5
    harmless, _ = divergence.decode_values(ref, RECORDED["candidate-1"]["parity"]["all"], [ref])
    assert max(harmless.values()) == pytest.approx(0.00096, abs=1e-5)
    assert max(harmless.values()) < divergence.TOKEN_TOLERANCE / 2


def test_recorded_aa_false_fail_rate_is_within_alpha_and_the_recorded_pairs_are_judged_right():
    result = divergence_simulation.simulate(resamples=50)
    for cell, rate in result["aa"].items():
        assert rate["judged"] >= 400
        assert rate["false_fail_rate"] <= result["cell_alpha"], cell
        assert rate["invalid_rate"] == 0.0, cell
    assert result["ab"]["candidate-1"] == dict.fromkeys(divergence.CELLS, "PASS")   # harmless: compile off
    assert result["ab"]["candidate-rope"] == dict.fromkeys(divergence.CELLS, "FAIL")


# ------------------------------------------------------------------------------------------- in the gate and runner
import importlib.util
import json
from pathlib import Path

from harness import gate
from harness.render import render_report
from harness.run import arm_checks
from harness.run.scenario import ParitySpec

_SPEC = importlib.util.spec_from_file_location(
    "aa_split", Path(__file__).parent / "fixtures" / "recorded" / "aa_split.py")
aa_split = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(aa_split)
RECORDED = divergence_simulation.load()


def _gated_run(tmp_path, candidate: str | None, **scenario):
    """A synthetic A/A performance run whose manifest gates tokens, with the recorded scorings and greedy outputs of
    baseline-1 (reference, and its one-at-a-time batch), baseline-2 and ``candidate`` (None: no scoring files)."""
    manifest, levels, requests = aa_split.aa_run(8, identical=True)
    manifest["scenario"]["parity"] = {"gated": True}
    manifest["scenario"]["model"] = {"load_format": "safetensors"}
    manifest["scenario"].update(scenario)
    run_dir = aa_split.write_run(tmp_path / "run", manifest, levels, requests, None)
    if candidate is not None:
        sources = {"baseline": ("baseline-1", "all"), "baseline-one": ("baseline-1", "one"),
                   "baseline-2": ("baseline-2", "all"), "candidate": (candidate, "all")}
        for label, (session, batch) in sources.items():
            for folder, key in (("scoring", "scores"), ("parity", "parity")):
                (run_dir / folder).mkdir(exist_ok=True)
                (run_dir / folder / f"{label}.json").write_text(json.dumps({"results": RECORDED[session][key][batch]}))
    return run_dir


PERF = GatePolicy(primary=("output_throughput", "mean_tpot_ms"))


def test_the_gate_fails_a_harmful_candidate_and_names_the_first_divergent_prompt(tmp_path):
    result = gate.run_gate(_gated_run(tmp_path, "candidate-rope"), PERF)
    assert result.status == Status.FAIL and "first divergence: prompt" in result.reason
    document = json.loads((result.run_dir / gate.VERDICT).read_text())
    assert [c["result"] for c in document["correctness"]] == ["FAIL"] * 3
    assert "first divergent prompt" in (result.run_dir / gate.SUMMARY).read_text()
    html = render_report(result.run_dir).read_text()
    assert 'id="correctness-table"' in html and 'id="divergence-cdf"' in html and "token_divergence" in html
    assert 'id="decode-divergence-cdf"' in html and "decode_divergence" in html


def test_the_gate_keeps_a_harmless_candidate_and_goes_invalid_without_scorings(tmp_path):
    harmless = gate.run_gate(_gated_run(tmp_path / "a", "candidate-1"), PERF)
    assert harmless.status == Status.PASS and [c.status for c in harmless.correctness] == [Status.PASS] * 3
    missing = gate.run_gate(_gated_run(tmp_path / "b", None), PERF)
    assert missing.status == Status.INVALID and "scoring/baseline.json" in missing.reason
    dummy = gate.run_gate(_gated_run(tmp_path / "c", None, model={"load_format": "dummy"}), PERF)
    assert dummy.status == Status.PASS and dummy.correctness == []


class _Server:
    base_url, served_model_name, headers = "http://stub", "m", {}


def test_collect_scoring_waits_for_the_baseline_and_stores_each_sessions_labels(tmp_path, monkeypatch):
    spec = ParitySpec(n=2)
    seen = []
    monkeypatch.setattr(scoring, "score", lambda url, model, seqs, concurrency=None, headers=None:
                        seen.append(("score", concurrency)) or [{"index": s["index"]} for s in seqs])
    monkeypatch.setattr(arm_checks.parity, "collect", lambda *a, concurrency=None, **k:
                        seen.append(("parity", concurrency)) or [])
    from rich.console import Console
    console = Console(file=open("/dev/null", "w"))
    assert arm_checks.collect_scoring(tmp_path, "candidate", 1, _Server(), spec, console) == 0.0   # no baseline yet
    rows = [{"index": i, "prompt": "p", "token_ids": [1], "logprobs": [-0.1], "top": [], "prompt_token_ids": [5]}
            for i in range(2)]
    arm_checks.parity.save_arm(tmp_path, "baseline", rows)
    arm_checks.collect_scoring(tmp_path, "baseline", 1, _Server(), spec, console)
    arm_checks.collect_scoring(tmp_path, "candidate", 1, _Server(), spec, console)
    arm_checks.collect_scoring(tmp_path, "baseline", 2, _Server(), spec, console)
    arm_checks.collect_scoring(tmp_path, "baseline", 2, _Server(), spec, console)            # done: nothing again
    assert sorted(p.stem for p in (tmp_path / "scoring").glob("*.json")) == sorted(divergence.SCORINGS)
    assert seen == [("score", None), ("parity", 1), ("score", 1), ("score", None), ("parity", None), ("score", None)]


def test_the_gate_fails_a_decode_only_defect_that_teacher_forcing_cannot_see(tmp_path):
    """``stale-index-key``'s served signature: the candidate's scorings and greedy tokens are the baseline's, only
    its decode-time log p move (here by the offline median, 0.01 nats at every position: results/defects/). Only
    ``decode_divergence`` FAILs, and the summary and report show it."""
    run_dir = _gated_run(tmp_path, "baseline-1")
    rows = RECORDED["baseline-1"]["parity"]["all"]
    stale = [{**row, "logprobs": [v - 0.01 for v in row["logprobs"]]} for row in rows]
    (run_dir / "parity" / "candidate.json").write_text(json.dumps({"results": stale}))
    result = gate.run_gate(run_dir, PERF)
    assert result.status == Status.FAIL and "decode_divergence: FAIL" in result.reason
    assert {c.name: c.status for c in result.correctness} == {
        "token_divergence": Status.PASS, "decode_divergence": Status.FAIL, "parity": Status.PASS}
    assert "**decode_divergence** (vs the A/A envelope): decode-time" in (result.run_dir / gate.SUMMARY).read_text()
