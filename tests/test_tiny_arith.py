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


def _dense_masked_kl(attn, x, cos, sin, visible):
    """The sparse stage's indexer KL sum and selection in the masked dense form (every key's logit with autograd,
    ``log_softmax`` over ``[B,S,T]`` masked to the selection): what :func:`batched.attention_train` computed before
    it took the gradient on the selected keys only."""
    B, S, _ = x.shape
    H, N, R, L, V = attn.n_heads, attn.nope_dim, attn.rope_dim, attn.kv_lora_rank, attn.v_dim
    q_latent = attn.q_a_layernorm(attn.q_a_proj(x))
    q = attn.q_b_proj(q_latent).view(B, S, H, N + R)
    q_pe = batched.apply_rope(q[..., N:], cos[:, :, None], sin[:, :, None], interleaved=attn.rope_interleave)
    kv = attn.kv_a_proj_with_mqa(x)
    c_kv = attn.kv_a_layernorm(kv[..., :L])
    k_pe = batched.apply_rope(kv[..., L:], cos, sin, interleaved=attn.rope_interleave)
    w_uk, _ = batched.split_kv_b(attn.kv_b_proj.weight, H, N, V)
    k_nope = torch.einsum("btl,hnl->bhtn", c_kv, w_uk)
    scores = (torch.einsum("bshn,bhtn->bhst", q[..., :N], k_nope) + torch.einsum("bshr,btr->bhst", q_pe, k_pe)
              ) * attn.softmax_scale
    index_logits = batched.indexer_scores(attn, x.detach(), q_latent.detach(), cos, sin)  # [B,S,T], autograd
    keys = batched.select_topk(index_logits, visible, attn.index_topk)
    probs = torch.softmax(scores.masked_fill(~keys[:, None], float("-inf")), dim=-1)
    rows = visible.any(-1)
    probs = torch.where(rows[:, None, :, None], probs, torch.zeros_like(probs))
    target = probs.detach().sum(1)
    target = target / target.sum(-1, keepdim=True).clamp_min(1e-30)
    logq = torch.log_softmax(index_logits.masked_fill(~keys, float("-inf")), dim=-1)
    return batched._kl_sum(target, logq, rows.float()), keys


def test_selected_key_gradient_equals_the_masked_dense_form(tok):
    """The sparse stage takes the indexer logits' gradient at the selected keys only: the same KL and the same
    indexer gradients as the masked dense ``[B,S,T]`` form, on a batch with padded rows and queries that see fewer
    than ``index_topk`` keys."""
    torch.manual_seed(0)
    config = arith_config(vocab_size_of(tok)).replace(indexer_fp8=False)
    model = DsaForCausalLM(config).init_random(3)
    attn = model.decoder_layers[0].self_attn
    ids, lengths, _ = train.encode_batch(tok, task.generate(3, 11), 0.1)
    assert int(lengths.min()) < int(lengths.max()) and int(lengths.max()) > config.index_topk
    B, S = ids.shape
    positions = torch.arange(S).expand(B, S)
    cos, sin = model.rope.cos_sin(positions)
    real = positions < lengths[:, None]
    visible = torch.tril(torch.ones(S, S, dtype=torch.bool))[None] & real[:, None, :] & real[:, :, None]
    x = model.decoder_layers[0].input_layernorm(model.model.embed_tokens(ids)).detach()
    params = list(attn.indexer.parameters())

    want, want_keys = _dense_masked_kl(attn, x, cos, sin, visible)
    want_grads = torch.autograd.grad(want, params)
    _, got, rows = batched.attention_train(attn, x, cos, sin, visible, sparse=True)
    got_grads = torch.autograd.grad(got, params)
    assert float(rows) == int(lengths.sum())
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    for g, w in zip(got_grads, want_grads):
        assert float(w.abs().max()) > 0
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)
    idx, valid = batched.topk_keys(batched.indexer_scores(attn, x, attn.q_a_layernorm(attn.q_a_proj(x)), cos, sin),
                                   visible, config.index_topk)
    assert torch.equal(torch.zeros_like(visible).scatter_(-1, idx, valid), want_keys)
    assert not bool(valid[0, :config.index_topk - 1].all())  # early queries see fewer keys than index_topk


def test_length_buckets_keep_the_whole_batch_loss_and_gradient(tok):
    """``train.batch_loss`` over length buckets is the unsplit batch's loss, and so its gradient."""
    model = DsaForCausalLM(arith_config(vocab_size_of(tok))).init_random(4)
    ids, lengths, weights = train.encode_batch(tok, task.generate(6, 13, min_distractors=0, max_distractors=30), 0.1)
    buckets = train.length_buckets(lengths, 3 * int(lengths.max()))
    assert len(buckets) > 1 and sorted(torch.cat(buckets).tolist()) == list(range(6))
    assert all(len(b) * int(lengths[b].max()) <= 3 * int(lengths.max()) for b in buckets)
    results = []
    for max_tokens in (0, 3 * int(lengths.max())):
        for sparse in (False, True):
            model.zero_grad()
            loss, parts = train.batch_loss(model, ids, lengths, weights, sparse=sparse, mtp_weight=0.3,
                                           max_tokens=max_tokens)
            loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    for (loss_a, grads_a), (loss_b, grads_b) in zip(results[:2], results[2:]):
        torch.testing.assert_close(loss_b, loss_a, atol=1e-5, rtol=1e-5)
        for a, b in zip(grads_a, grads_b):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-3)
    full = batched.forward_train(model, ids, lengths, sparse=True)
    lm, mtp = batched.lm_losses(full, ids, weights)
    torch.testing.assert_close(results[1][0], lm + 0.3 * mtp + full.indexer_kl, atol=1e-5, rtol=1e-5)


def test_length_buckets_split_by_padded_tokens():
    lengths = torch.tensor([5, 50, 20, 49, 6])
    assert [b.tolist() for b in train.length_buckets(lengths, 100)] == [[1, 3], [2, 4, 0]]
    assert [b.tolist() for b in train.length_buckets(lengths, 10)] == [[1], [3], [2], [4], [0]]
    assert [b.tolist() for b in train.length_buckets(lengths, 0)] == [[0, 1, 2, 3, 4]]


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


def test_fine_tune_from_a_checkpoint_on_long_problems(tmp_path):
    """``--init`` starts from a checkpoint's weights (not ``--seed``'s), ``--distractors`` lengthens the problems,
    ``--precision fp32`` and ``--micro-tokens`` train them; the record keeps all four. A missing or foreign
    checkpoint is one line and exit 2."""
    base = tmp_path / "base"
    args = ["--batch", "4", "--no-progress", "--warmup-steps", "1"]
    train.main(["--steps", "1", "--work", str(tmp_path / "w0"), "--out", str(base), "--seed", "5", *args])
    out = tmp_path / "long"
    assert train.main(["--steps", "2", "--work", str(tmp_path / "w1"), "--out", str(out), "--init", str(base),
                       "--lr", "1e-9", "--distractors", "30", "34", "--precision", "fp32", "--micro-tokens", "600",
                       *args]) == 0
    record = json.loads((out / "train.json").read_text())
    assert record["args"]["init"] == str(base) and record["args"]["distractors"] == [30, 34]
    assert record["args"]["precision"] == "fp32" and record["args"]["micro_tokens"] == 600
    tuned, start = DsaForCausalLM.from_pretrained(out), DsaForCausalLM.from_pretrained(base)
    fresh = DsaForCausalLM(start.config).init_random(0)
    name = "model.layers.0.self_attn.q_a_proj.weight"
    torch.testing.assert_close(tuned.state_dict()[name], start.state_dict()[name], atol=1e-2, rtol=0)
    assert not torch.allclose(tuned.state_dict()[name].float(), fresh.state_dict()[name].float(), atol=1e-2)
    assert train.main(["--steps", "1", "--work", str(tmp_path / "w2"), "--out", str(tmp_path / "x"),
                       "--init", str(tmp_path / "missing"), *args]) == 2
    other = tmp_path / "other"
    DsaForCausalLM(arith_config(vocab_size_of(train.build_tokenizer()), hidden_size=64)).save_pretrained(other)
    assert train.main(["--steps", "1", "--work", str(tmp_path / "w3"), "--out", str(tmp_path / "y"),
                       "--init", str(other), *args]) == 2


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


def test_scoring_rows_are_the_served_scoring_format():
    """``--scorings-out`` rows: per problem the forced tokens' log p and, per position, the top-k ``[id, log p]``
    descending — what ``harness.judge.confidence`` reads from a served scoring."""
    rows = [torch.log_softmax(torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 1.0]]), dim=-1)]
    out = sensitivity.scoring_rows(rows, [[2, 0]], top_k=3)
    assert out[0]["index"] == 0 and out[0]["logprobs"] == pytest.approx([float(rows[0][0, 2]), float(rows[0][1, 0])])
    assert [pair[0] for pair in out[0]["top"][0]] == [1, 3, 2] and len(out[0]["top"][1]) == 3
    assert out[0]["top"][1][0] == [0, pytest.approx(float(rows[0][1, 0]))]


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
