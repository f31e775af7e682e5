"""Fast tests of the arithmetic DSA model's parts: task, tokenizer, batched training forward vs the reference model,
a short training run, lm-eval scoring, the sensitivity injections."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from dsa_route.dsa import DsaForCausalLM
from dsa_route.tiny.arith import batched, evaluate, sensitivity, task, train
from dsa_route.tiny.arith.model import arith_config
from dsa_route.tiny.arith.tokenizer import BOS_ID, EOS_ID, save_tokenizer, vocab_size_of

STEP = re.compile(r"so (\d+) ([-+*]) (\d+) = (\d+)\.$")


@pytest.fixture(scope="module")
def tok():
    return train.build_tokenizer()


def test_problems_are_seeded_and_splits_differ():
    assert task.generate(20, 0) == task.generate(20, 0)
    assert {p.question for p in task.generate(50, 0)}.isdisjoint({p.question for p in task.generate(50, 1)})


def test_worked_answers_are_arithmetic_of_the_question():
    for p in task.generate(300, 3):
        lines = p.answer.splitlines()
        start = int(re.search(r"has (\d+) ", lines[0]).group(1))
        assert lines[0] in p.question and lines[-1] == f"#### {p.target}"
        value = start
        for line in lines[1:-1]:
            a, op, b, c = STEP.search(line).groups()
            assert int(a) == value and line.split(",")[0] + "." in p.question
            value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
            assert value == int(c) and 0 <= value <= task.MAX_VALUE
        assert value == p.target


def test_gsm8k_dir_is_what_the_harness_accepts(tmp_path):
    from harness.run.gsm8k_data import check_data_dir

    out = task.write_gsm8k_dir(tmp_path / "arith", n_train=5, n_test=7)
    assert check_data_dir(out) == out.resolve()
    rows = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 7 and rows[0] == task.generate(1, 1)[0].as_gsm8k()


def test_tokenizer_digits_prefix_and_specials(tok, tmp_path):
    p = task.generate(1, 5)[0]
    prompt = tok.encode(task.prompt_text(p.question)).ids
    full = tok.encode(task.prompt_text(p.question) + task.completion_text(p.answer)).ids
    assert full[:len(prompt)] == prompt and prompt[0] == BOS_ID and prompt.count(BOS_ID) == 1
    assert [t for t in tok.encode("x 1203 y", add_special_tokens=False).tokens if t.isdigit()] == list("1203")
    assert tok.decode(full) == task.prompt_text(p.question) + task.completion_text(p.answer)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(save_tokenizer(tok, tmp_path / "tok"))
    assert hf(task.prompt_text(p.question)).input_ids == prompt and hf.eos_token_id == EOS_ID


def test_prompts_run_past_index_topk(tok):
    lengths = [len(tok.encode(task.prompt_text(p.question)).ids) for p in task.generate(200, 1)]
    assert min(lengths) > arith_config(vocab_size_of(tok)).index_topk


def _reference_logits(model, ids):
    cache = model.new_cache(1, ids.shape[1], with_mtp=True)
    hidden = model.forward_hidden(ids, None, cache)
    pos = torch.arange(ids.shape[1] - 1)[None]
    mtp, _ = model.mtp_predict(0, ids[:, 1:], pos, hidden[:, :-1], cache)
    return model.compute_logits(hidden)[0], mtp[0]


@pytest.mark.parametrize("sparse", [False, True])
def test_batched_forward_equals_reference(tok, sparse):
    torch.manual_seed(0)
    config = arith_config(vocab_size_of(tok)).replace(indexer_fp8=False)  # training has no fp8 rounding
    model = DsaForCausalLM(config, dense_attention=not sparse).init_random(1)
    ids, lengths, _ = train.encode_batch(tok, task.generate(3, 7), 0.1)
    out = batched.forward_train(model, ids, lengths, sparse=sparse)
    assert int(lengths.max()) > config.index_topk
    for b in range(3):
        n = int(lengths[b])
        ref, ref_mtp = _reference_logits(model, ids[b:b + 1, :n])
        torch.testing.assert_close(out.logits[b, :n], ref, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(out.mtp_logits[b, :n - 1], ref_mtp, atol=2e-4, rtol=1e-4)


def test_sparse_selection_matches_reference_topk():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 50, 50, generator=g)
    visible = torch.tril(torch.ones(50, 50, dtype=torch.bool))[None].expand(2, 50, 50)
    chosen = batched.select_topk(logits, visible, 16)
    from dsa_route.dsa.topk import topk_indices

    for b in range(2):
        ref = topk_indices(logits[b].masked_fill(~visible[b], float("-inf")), 16)
        for s in range(50):
            assert set(torch.nonzero(chosen[b, s]).flatten().tolist()) == set(ref[s][ref[s] >= 0].tolist())


def test_indexer_kl_is_zero_when_indexer_matches_attention():
    p = torch.tensor([[[0.2, 0.8, 0.0]]])
    assert float(batched._kl_rows(p, torch.log(p), torch.ones(1, 1))) == pytest.approx(0.0, abs=1e-6)
    q = torch.tensor([[[0.5, 0.5, 0.0]]])
    assert float(batched._kl_rows(p, torch.log(q), torch.ones(1, 1))) > 0.1


def test_training_lowers_the_loss_and_exports_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "ckpt"
    assert train.main(["--steps", "30", "--batch", "6", "--dense-frac", "0.5", "--warmup-steps", "5",
                       "--work", str(tmp_path / "work"), "--out", str(out), "--no-progress"]) == 0
    log = [json.loads(line) for line in (tmp_path / "work" / "loss.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in (log[0], log[-1])] == ["dense", "sparse"]
    uniform = math.log(arith_config(vocab_size_of(train.build_tokenizer())).vocab_size)  # the loss at init
    assert log[-1]["lm"] < min(log[0]["lm"], 0.5 * uniform) and log[-1]["mtp"] < min(log[0]["mtp"], 0.5 * uniform)
    model = DsaForCausalLM.from_pretrained(out)
    record = json.loads((out / "train.json").read_text())
    assert record["steps"] == 30 and record["command"].startswith("python -m dsa_route.tiny.arith.train")
    assert model.config.index_n_heads >= 16 and (out / "tokenizer.json").is_file()
    mtp = model.mtp_layers[0]
    assert torch.equal(mtp.shared_head.head.weight, model.lm_head.weight)


def test_resume_continues_the_step_count(tmp_path):
    args = ["--batch", "4", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--no-progress"]
    train.main(["--steps", "3", *args])
    train.main(["--steps", "5", *args])
    assert json.loads((tmp_path / "o" / "train.json").read_text())["steps"] == 5


def test_score_uses_gsm8k_filters():
    assert evaluate.score(" 3 + 4 = 7.\n#### 7", "x\n#### 7") == {"strict-match": True, "flexible-extract": True}
    assert evaluate.score(" so 3 + 4 = 7.", "x\n#### 7") == {"strict-match": False, "flexible-extract": True}
    assert evaluate.score(" #### 8", "x\n#### 7") == {"strict-match": False, "flexible-extract": False}


def test_injections_change_selection_and_restore(tok):
    model = DsaForCausalLM(arith_config(vocab_size_of(tok))).init_random(0)
    ids = evaluate.prompt_ids(tok, task.generate(1, 2)[0])
    base = model.forward(ids)
    with sensitivity.injected(model, "topk-random"):
        assert not torch.allclose(model.forward(ids), base)
    with sensitivity.injected(model, "indexer-rope-flip"):
        assert model.decoder_layers[0].self_attn.indexer.defect.spec.rope_flip_k
        assert not torch.allclose(model.forward(ids), base)
    assert model.decoder_layers[0].self_attn.indexer.defect.spec.rope_flip_k is False
    torch.testing.assert_close(model.forward(ids), base, atol=0, rtol=0)
    with pytest.raises(ValueError, match="inject"):
        with sensitivity.injected(model, "nope"):
            pass


@pytest.mark.parametrize("drop, parity, expected", [(15.0, 0.49, True), (14.9, 0.0, False), (50.0, 0.5, False)])
def test_sensitivity_criteria_are_the_issues(drop, parity, expected):
    assert sensitivity.sensitive({"drop_points": {"strict-match": drop}, "parity": parity}) is expected


def test_cli_bad_checkpoint_exits_2(tmp_path):
    assert evaluate.main(["--checkpoint", str(tmp_path)]) == 2
    assert sensitivity.main(["--checkpoint", str(tmp_path)]) == 2


def test_cli_longer_problems_run_past_the_training_lengths(capsys):
    """``--distractors``: problems with more distractor sentences than training drew (4–8) give prompts 2–3 × as
    long (the long-context probe of results/defects/README.md); a range upside down is refused."""
    assert evaluate.main(["--n", "2", "--mtp-n", "0", "--threads", "1", "--distractors", "28", "34"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["distractors"] == [28, 34] and record["prompt_tokens"]["min"] > 150
    with pytest.raises(SystemExit):
        evaluate.main(["--distractors", "9", "8"])


def test_greedy_keeps_the_decode_top_2_and_the_decode_agrees_with_its_prefill(tok):
    """The reference model's greedy decode records, per token, (greedy id, log p) then the runner-up; on the correct
    path (float32) decode and a teacher-forced prefill of the same output give the runner-up the same log p, so the
    decode-vs-prefill gap is rounding only."""
    model = DsaForCausalLM(arith_config(vocab_size_of(tok))).init_random(0)
    problems = task.generate(2, 2)
    result = evaluate.evaluate(model, tok, problems, max_new_tokens=6)
    for out, tops in zip(result.outputs, result.decode_top):
        assert [t[0][0] for t in tops] == out and all(t[0][1] >= t[1][1] and t[0][0] != t[1][0] for t in tops)
    rows = sensitivity.forced_logsoftmax(model, tok, problems, result.outputs)
    gaps = sensitivity.decode_gaps(result.decode_top, rows)
    assert all(g is None or g < 1e-4 for g in gaps)


def test_decode_gap_reads_the_runner_up_and_counts_beyond_the_correct_path():
    rows = [torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0]]).log_softmax(-1)]
    top = [[[(0, float(rows[0][0, 0])), (1, float(rows[0][0, 1]) - 0.3)],
            [(1, float(rows[0][1, 1])), (2, float(rows[0][1, 2]) + 0.1)]]]
    assert sensitivity.decode_gaps(top, rows) == [pytest.approx(0.2)]
    assert sensitivity.decode_gaps([[]], [torch.zeros(0, 3)]) == [None]
    summary = sensitivity.decode_gap_summary([0.2, 0.06, None], [0.1, 0.0, 0.0], 0.05)
    assert (summary["scored"], summary["above"], summary["max"]) == (2, 2, 0.2)
    assert sensitivity.decode_gap_summary([0.12], [0.1], 0.05)["above"] == 0
