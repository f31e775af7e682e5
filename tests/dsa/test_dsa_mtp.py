"""MTP drafting: a crafted MTP layer that copies the main model is always accepted; random drafts never change the
emitted tokens; acceptance follows vLLM's definition."""

from __future__ import annotations

import pytest
import torch

from dsa_route.dsa import DsaConfig, DsaForCausalLM, SpecDecodeStats


def _tokens(rows: int, n: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, n), generator=torch.Generator().manual_seed(seed))


def _successor_model(mtp_shift: int, **overrides) -> DsaForCausalLM:
    """A model whose greedy next token is ``perm(t)`` for the current token t (embedding rows of unit-RMS random
    vectors, LM head row perm(t) = embedding t, every attention/MLP output scaled down so it perturbs but never
    decides).
    Its MTP layer sees ``enorm(embed(t_{i+1}))`` through ``eh_proj = [I | 0]`` and uses the head of ``perm`` shifted by
    ``mtp_shift``; shift 0 makes it predict exactly the main model's next greedy token."""
    cfg = DsaConfig.tiny(**overrides)
    model = DsaForCausalLM.random(cfg, seed=5)
    V, D = cfg.vocab_size, cfg.hidden_size
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        head = torch.empty_like(emb)
        head[perm] = emb / emb.norm(dim=-1, keepdim=True) * D**0.5
        model.lm_head.weight.copy_(head)
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(0.02)
        mtp = model.mtp_layers[0]
        mtp.embed_tokens.weight.copy_(emb)
        mtp.eh_proj.weight.copy_(torch.cat((torch.eye(D), torch.zeros(D, D)), dim=1))
        mtp.shared_head.head.weight.copy_(torch.roll(head, mtp_shift, dims=0))
    return model, perm


@pytest.mark.parametrize("k", [1, 2])
def test_crafted_mtp_drafts_equal_main_greedy(k):
    model, perm = _successor_model(mtp_shift=0)
    prompt = _tokens(2, 60, model.config.vocab_size)  # 60 + 20 tokens: the context passes index_topk (64)
    greedy = model.generate(prompt, 20)
    # precondition: the crafted main model really follows perm (with attention and MoE still running)
    prev = torch.cat((prompt[:, -1:], greedy[:, :-1]), 1)
    assert torch.equal(greedy, perm[prev])
    tokens, stats = model.generate_mtp(prompt, 20, num_speculative_tokens=k)
    assert torch.equal(tokens, greedy)
    assert stats.num_draft_tokens == k * stats.num_drafts and stats.num_accepted_tokens == stats.num_draft_tokens
    assert stats.mean_acceptance_length == 1 + k and stats.accepted_per_pos == [stats.num_drafts] * k


def test_mismatched_mtp_is_rejected_but_tokens_unchanged():
    model, _ = _successor_model(mtp_shift=7)
    prompt = _tokens(1, 70, model.config.vocab_size, seed=2)  # past index_topk
    tokens, stats = model.generate_mtp(prompt, 10, num_speculative_tokens=2)
    assert torch.equal(tokens, model.generate(prompt, 10))
    assert stats.num_accepted_tokens == 0 and stats.mean_acceptance_length == 1.0
    assert stats.num_drafts == 9  # every round emits exactly the bonus token: 1 after prefill + 9 rounds


def test_random_mtp_keeps_greedy_tokens_and_counts_like_vllm():
    model = DsaForCausalLM.random(DsaConfig.tiny("glm_moe_dsa"), seed=7)
    prompt = _tokens(2, 70, model.config.vocab_size, seed=3)  # context past index_topk
    tokens, stats = model.generate_mtp(prompt, 8, num_speculative_tokens=2)
    assert torch.equal(tokens, model.generate(prompt, 8))
    assert stats.mean_acceptance_length == pytest.approx(1 + stats.num_accepted_tokens / stats.num_drafts)


def test_spec_decode_stats_definition():
    stats = SpecDecodeStats(num_spec_tokens=3)
    for drafted, accepted in ((3, 3), (3, 0), (3, 1), (3, 2)):
        stats.observe_draft(drafted, accepted)
    assert stats.num_drafts == 4 and stats.num_draft_tokens == 12 and stats.num_accepted_tokens == 6
    assert stats.mean_acceptance_length == 1 + 6 / 4  # vLLM: 1 + accepted / drafts (bonus token included)
    assert stats.draft_acceptance_rate == 0.5
    assert stats.accepted_per_pos == [3, 2, 1]


def test_mtp_needs_an_mtp_layer():
    model = DsaForCausalLM.random(DsaConfig.tiny(num_nextn_predict_layers=0), seed=0)
    with pytest.raises(ValueError, match="num_nextn_predict_layers"):
        model.generate_mtp(_tokens(1, 4, 512), 3)


def _mtp_topk_per_call(model: DsaForCausalLM) -> tuple[list[torch.Tensor], object]:
    """Record the MTP attention's selection after every call (draft step); returns (records, hook handle)."""
    calls = []
    attn = model.mtp_layers[0].self_attn
    handle = attn.register_forward_hook(lambda mod, args, out: calls.append(out[1].clone()))
    return calls, handle


@pytest.mark.parametrize("share", [True, False])
def test_index_share_for_mtp_iteration_reuses_step_zero_selection(share):
    """GLM's index_share_for_mtp_iteration: draft steps >= 1 attend to step 0's top-k of the row's last token (vLLM's
    proposer: set_skip_topk + compact_topk_indices); without it every step selects its own. Tokens stay greedy."""
    model, _ = _successor_model(mtp_shift=0, index_share_for_mtp_iteration=share)
    k = 3
    prompt = _tokens(1, 70, model.config.vocab_size, seed=4)  # past index_topk: selections are real subsets
    calls, handle = _mtp_topk_per_call(model)
    tokens, stats = model.generate_mtp(prompt, 12, num_speculative_tokens=k)
    handle.remove()
    assert torch.equal(tokens, model.generate(prompt, 12))
    rounds = [calls[i:i + k] for i in range(0, len(calls), k)]
    assert len(rounds) == stats.num_drafts and all(len(r) == k for r in rounds)
    reused = [torch.equal(later, r[0][:, -1:]) for r in rounds for later in r[1:]]
    assert all(reused) if share else not any(reused)


def test_index_share_for_mtp_iteration_reads_from_the_hf_config():
    hf = DsaConfig.tiny("glm_moe_dsa").to_hf_config()
    assert "index_share_for_mtp_iteration" not in hf and not DsaConfig.from_hf_config(hf).index_share_for_mtp_iteration
    cfg = DsaConfig.from_hf_config({**hf, "index_share_for_mtp_iteration": True})
    assert cfg.index_share_for_mtp_iteration and DsaConfig.from_hf_config(cfg.to_hf_config()) == cfg
