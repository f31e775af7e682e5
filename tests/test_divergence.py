"""Teacher-forced scoring (harness.run.scoring) and the correctness cells (harness.judge.divergence), on made-up
rows and on the recorded A/A sessions of the default (tests/fixtures/recorded/scoring-aa)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.judge import correctness_cell, decode_divergence, divergence
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
    assert correctness_cell.sign_test(0, 0) == 1.0
    assert correctness_cell.sign_test(5, 0) == pytest.approx(1 / 32)
    assert correctness_cell.sign_test(6, 1) == pytest.approx(8 / 128)


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


def _session(n, gap=(), by=0.1, diverge=(), at=6, length=12, seed=0):
    """One session's (scoring rows, parity rows) of ``n`` prompts whose greedy output is the reference's (the forced
    continuation) except token ``at`` of the prompts in ``diverge``: the decode's runner-up log p equals the forced
    one, except on the prompts in ``gap``, where decode moves it by ``by`` nats (a decode-only defect)."""
    rng = np.random.default_rng(seed)
    scores, greedy = [], []
    for i in range(n):
        ids = [int(t) for t in rng.integers(1, 50, length)]
        runner = [float(v) for v in -rng.uniform(2, 8, length)]
        scores.append({"index": i, "logprobs": [-1e-4] * length,
                       "top": [[[t, -1e-4], [100 + t, r], [200, -9.0]] for t, r in zip(ids, runner)]})
        out = list(ids)
        if i in diverge:
            out[at] = 99
        moved = [r - (by if i in gap else 0.0) for r in runner]
        greedy.append({"index": i, "prompt": f"p{i}", "token_ids": out, "logprobs": [-1e-4] * length,
                       "top": [[[t, -1e-4], [100 + s, r]] for t, s, r in zip(out, ids, moved)]})
    return scores, greedy


def _labelled(candidate, **aa):
    """(scorings, greedy) keyed by the run's labels: the reference and its A/A sessions from ``_session()``
    (``aa`` overrides a label), the candidate given."""
    sessions = {label: _session(32) for label in ("baseline", "baseline-one", "baseline-2")} | aa
    sessions["candidate"] = candidate
    return {k: v[0] for k, v in sessions.items()}, {k: v[1] for k, v in sessions.items()}


def test_decode_cell_fails_a_decode_only_gap_and_compares_the_common_prefix_only():
    """A decode-only defect (``stale-index-key``: same greedy tokens, same prefill, another decode) pulling the
    runner-up by 0.1 nats on 10 of 32 prompts FAILs; an A/A session with the recorded batch-composition gap
    (0.025 per prompt) and a candidate of that size pass; positions after the first differing token do not count
    (a different continuation has other log p by right, the parity cell's business)."""
    scorings, greedy = _labelled(_session(32, gap=range(10)), **{"baseline-one": _session(32, gap=range(32), by=0.025)})
    cell = decode_divergence.decode_cell(scorings, greedy, 0.05)
    assert cell.status == Status.FAIL and (cell.exceed, cell.below, cell.ties) == (10, 0, 22) and cell.first == (0, 0)
    assert cell.ab["positions"] == cell.ab["tokens"] == 32 * 12 and cell.aa["max"] == pytest.approx(0.025)
    assert cell.aa["comparisons"] == 3
    harmless = decode_divergence.decode_cell(*_labelled(_session(32, gap=range(32), by=0.025)), 0.05)
    assert harmless.status == Status.PASS and harmless.exceed == 0
    assert decode_divergence.decode_cell(*_labelled(_session(32, gap=range(5))), 0.05).status == Status.PASS
    after = decode_divergence.decode_cell(*_labelled(_session(32, gap=range(32), diverge=range(32))), 0.05)
    assert after.status == Status.FAIL and after.ab["positions"] == 32 * 6
    late = _session(32, diverge=range(32), at=0)
    first = decode_divergence.decode_cell(*_labelled(late), 0.05)
    assert first.status == Status.PASS and first.ties == 32       # no common prefix: a tie, not a crash
    unstable = decode_divergence.decode_cell(
        *_labelled(_session(32, gap=range(10)), **{"baseline-2": _session(32, gap=range(8))}), 0.05)
    assert unstable.status == Status.INVALID


def test_decode_cell_is_left_out_for_parity_rows_without_top_logprobs():
    """Rows of a run directory whose parity requests carried no ``logprobs`` (other tooling): the decode cell is
    absent, the others judged as before; missing files make it INVALID like the others."""
    scorings, greedy = _labelled(_session(32))
    assert [c.name for c in divergence.judge(scorings, greedy, 0.05)] == list(divergence.CELLS)
    bare = {label: [{k: v for k, v in row.items() if k != "top"} for row in rows] for label, rows in greedy.items()}
    cells = divergence.judge(scorings, bare, 0.05)
    assert [c.name for c in cells] == ["token_divergence", "confidence_loss", "parity"]
    assert cells[2].status == Status.PASS
    absent = divergence.judge({}, greedy, 0.05)
    assert [c.status for c in absent[:2]] == [Status.INVALID] * 2 and "scoring/baseline.json" in absent[1].reasons[0]


def test_recorded_decode_is_not_bit_exact_aa_but_inside_the_band():
    """The recorded sessions' decode against their own prefill (tests/fixtures/recorded/scoring-aa): the runner-up
    gap is not 0 (bf16 logits round otherwise at decode, and in a batch of one), at most 0.0252 per prompt for the
    baseline and 0.0206 for the compile-off candidate: both below half the band; the forced A/A is bit-exact."""
    for session, limit in (("baseline-1", 0.0253), ("baseline-3", 0.0253), ("candidate-1", 0.0207)):
        for batch in ("all", "one"):
            ref = RECORDED["baseline-1"]["parity"]["all"]
            gaps = decode_divergence.runner_up_gaps(RECORDED[session]["parity"][batch],
                                                    RECORDED[session]["scores"][batch], ref)
            per_prompt = [np.nanmean(v) for v in gaps.values() if v]
            assert max(per_prompt) < limit <= decode_divergence.DECODE_TOLERANCE / 2 + 0.001, (session, batch)
    assert max(np.nanmean(v) for v in decode_divergence.runner_up_gaps(
        RECORDED["baseline-1"]["parity"]["one"], RECORDED["baseline-1"]["scores"]["one"],
        RECORDED["baseline-1"]["parity"]["all"]).values()) > 0.0


def test_recorded_aa_false_fail_rate_is_within_alpha_and_the_recorded_pairs_are_judged_right():
    result = divergence_simulation.simulate(resamples=50)
    for cell, rate in result["aa"].items():
        assert rate["judged"] >= 400
        assert rate["false_fail_rate"] <= result["cell_alpha"], cell
        assert rate["invalid_rate"] == 0.0, cell
    assert result["ab"]["candidate-1"] == dict.fromkeys(divergence.CELLS, "PASS")   # harmless: compile off
    # the rope defect acts in prefill and decode alike: decode agrees with prefill, the other cells FAIL it
    assert result["ab"]["candidate-rope"] == {"token_divergence": "FAIL", "confidence_loss": "FAIL",
                                              "decode_divergence": "PASS", "parity": "FAIL"}
    # the harmless compile-off change, resampled, in both directions: FAILs a scoring cell at most at the cell α
    # (0 and 20 of 24,000 runs at 2000 resamples); its log-odds shift is ±0.0019, the two directions' mirror images
    assert set(result["harmless"]) == {"token_divergence", "confidence_loss"}
    assert all(rate["false_fail_rate"] <= result["cell_alpha"] for rate in result["harmless"].values())
    assert result["harmless"]["confidence_loss"]["pairs"] == 12
    low, high = result["harmless"]["confidence_loss"]["mean_range"]
    assert low == pytest.approx(-0.0019, abs=5e-5) and high == pytest.approx(0.0019, abs=5e-5)


# ------------------------------------------------------------------------------------------------ confidence_loss
def _odds_rows(n, shift=0.0, noise=0.0, seed=0, length=12, start=6.0):
    """Scoring rows whose forced token has log-odds ``start`` (± 1) against one competitor, moved by ``shift`` nats
    on every position plus per-prompt N(0, ``noise``)."""
    rng = np.random.default_rng(seed)
    base = np.random.default_rng(99).uniform(start - 1, start + 1, (n, length))
    rows = []
    for index in range(n):
        odds = base[index] + shift + (rng.normal(0.0, noise) if noise else 0.0)
        lp, rest = -np.log1p(np.exp(-odds)), -np.log1p(np.exp(odds))   # log p, log (1 − p)
        rows.append({"index": index, "logprobs": [float(v) for v in lp],
                     "top": [[[7, float(a)], [8, float(b)]] for a, b in zip(lp, rest)]})
    return rows


def test_log_odds_is_the_forced_token_against_the_rest_of_the_top_list():
    from harness.judge import confidence

    row = {"logprobs": [math.log(0.9), math.log(0.01), float("-inf")],
           "top": [[[1, math.log(0.9)], [2, math.log(0.06)], [3, math.log(0.04)]],
                   [[1, math.log(0.6)], [2, math.log(0.3)]], [[1, math.log(0.5)]]]}
    odds = confidence.log_odds(row)
    assert odds[0] == pytest.approx(math.log(0.9) - math.log(0.1))
    assert odds[1] == pytest.approx(math.log(0.01) - math.log(0.9))        # forced token outside the list: all of it
    assert math.isnan(odds[2])
    rows = _odds_rows(4)
    assert confidence.prompt_shifts(rows, _odds_rows(4, shift=-0.25)) == pytest.approx(dict.fromkeys(range(4), -0.25))
    with pytest.raises(ValueError):
        confidence.prompt_shifts(rows, _odds_rows(3))


def test_confidence_cell_fails_a_one_sided_loss_beyond_the_band_only():
    ref, aa = _odds_rows(32), [_odds_rows(32)]
    lost = divergence.confidence_cell(ref, _odds_rows(32, shift=-0.015, noise=0.02, seed=1), aa, 0.05)
    assert lost.status == Status.FAIL and lost.p_fail <= 0.05 / 4 and lost.test.startswith("Wilcoxon")
    assert lost.exceed > lost.below and lost.first is not None and lost.ab["mean"] < -0.003
    assert "Wilcoxon signed-rank test p" in lost.describe()
    gained = divergence.confidence_cell(ref, _odds_rows(32, shift=+0.015, noise=0.02, seed=1), aa, 0.05)
    assert gained.status == Status.PASS                                      # one-sided: more sure is no loss
    within = divergence.confidence_cell(ref, _odds_rows(32, shift=-0.002), aa, 0.05)
    assert within.status == Status.PASS and within.exceed == 0              # a steady shift inside the band
    same = divergence.confidence_cell(ref, _odds_rows(32), aa, 0.05)
    assert same.status == Status.PASS and same.p_fail > 0.5 and same.below == 32
    assert divergence.confidence_cell(ref, _odds_rows(32, shift=-0.002), aa, 0.05, tolerance=0.001).status == Status.FAIL
    unstable = divergence.confidence_cell(ref, _odds_rows(32), [_odds_rows(32, shift=-0.02, noise=0.01)], 0.05)
    assert unstable.status == Status.INVALID and "unstable" in unstable.reasons[0]


def test_confidence_rule_has_its_size_at_the_band_and_power_beyond():
    """Symmetric noise centred exactly at −band (the null's boundary) FAILs at about the cell α, never more than
    its Monte-Carlo error allows; centred at 0 almost never; centred at 4 × band below, nearly always."""
    rng = np.random.default_rng(7)
    level, runs = 0.05 / len(divergence.CELLS), 1500

    def rate(centre):
        fails = 0
        for _ in range(runs):
            ab = rng.normal(centre, 0.01, 32)
            fails += divergence.confidence_status(ab, np.zeros(32), 0.05)[0] == Status.FAIL
        return fails / runs
    at_band = rate(-divergence.CONFIDENCE_TOLERANCE)
    assert at_band <= level + 3 * math.sqrt(level * (1 - level) / runs) and at_band > 0
    assert rate(0.0) < 0.002 and rate(-4 * divergence.CONFIDENCE_TOLERANCE) > 0.8


def test_the_confidence_band_is_the_policys_confidence_tolerance():
    ref, quiet = _odds_rows(32), _odds_rows(32, shift=-0.005, noise=0.002, seed=3)
    assert divergence.CONFIDENCE_TOLERANCE == GatePolicy().confidence_tolerance
    scorings = {"baseline": ref, "candidate": quiet, "baseline-2": _odds_rows(32)}
    cells = {c.name: c for c in divergence.judge(scorings, {}, 0.05)}
    assert cells["confidence_loss"].status == Status.FAIL
    loose = {c.name: c for c in divergence.judge(scorings, {}, 0.05, confidence_tolerance=0.01)}
    assert loose["confidence_loss"].status == Status.PASS


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
    assert [c["result"] for c in document["correctness"]] == ["FAIL", "FAIL", "PASS", "FAIL"]  # rope: decode = prefill
    assert "first divergent prompt" in (result.run_dir / gate.SUMMARY).read_text()
    html = render_report(result.run_dir).read_text()
    assert 'id="correctness-table"' in html and 'id="divergence-cdf"' in html and "token_divergence" in html
    assert 'id="decode-divergence-cdf"' in html and "decode_divergence" in html and ">Cell α<" in html
    assert 'id="confidence-cdf"' in html and "confidence_loss" in html and "0.003 nats/token" in html
    assert "0.05 nats/position" in html and "0.002 nats/token" in html


def test_the_gate_keeps_a_harmless_candidate_and_goes_invalid_without_scorings(tmp_path):
    harmless = gate.run_gate(_gated_run(tmp_path / "a", "candidate-1"), PERF)
    assert harmless.status == Status.PASS and [c.status for c in harmless.correctness] == [Status.PASS] * 4
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
    """``stale-index-key``'s signature: the candidate's scorings and greedy tokens are the baseline's, only its
    decode's runner-up log p move (here by 0.077 nats, the reference model's median: results/defects/). Only
    ``decode_divergence`` FAILs, and the summary shows it."""
    run_dir = _gated_run(tmp_path, "baseline-1")
    rows = RECORDED["baseline-1"]["parity"]["all"]
    stale = [{**row, "top": [[top[0], [top[1][0], top[1][1] - 0.077]] for top in row["top"]]} for row in rows]
    (run_dir / "parity" / "candidate.json").write_text(json.dumps({"results": stale}))
    result = gate.run_gate(run_dir, PERF)
    assert result.status == Status.FAIL and "decode_divergence: FAIL" in result.reason
    assert {c.name: c.status for c in result.correctness} == {
        "token_divergence": Status.PASS, "confidence_loss": Status.PASS, "decode_divergence": Status.FAIL,
        "parity": Status.PASS}
    assert "**decode_divergence** (vs the A/A envelope): decode vs own prefill, runner-up" in (result.run_dir / gate.SUMMARY).read_text()
