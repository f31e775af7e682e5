"""DsaForCausalLM end to end on the tiny configs: equivalences with dense MLA, caches, selection, loading."""

from __future__ import annotations

import json

import pytest
import torch

from dsa_route.dsa import DsaConfig, DsaForCausalLM
from dsa_route.dsa.moe import MoE, MoEGate


def _tokens(rows: int, n: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, n), generator=torch.Generator().manual_seed(seed))


def test_matches_dense_mla_when_topk_covers_context(tiny_pair):
    sparse, dense = tiny_pair
    K, V = sparse.config.index_topk, sparse.config.vocab_size
    ids = _tokens(2, K, V)
    torch.testing.assert_close(sparse(ids[:, :40]), dense(ids[:, :40]), atol=1e-5, rtol=1e-5)  # prefill
    cs, cd = sparse.new_cache(2, K), dense.new_cache(2, K)
    sparse(ids[:, :40], None, cs)
    dense(ids[:, :40], None, cd)
    for i in range(40, K):  # decode up to exactly index_topk tokens of context
        torch.testing.assert_close(sparse(ids[:, i:i + 1], None, cs), dense(ids[:, i:i + 1], None, cd),
                                   atol=1e-5, rtol=1e-5)


def test_decode_and_chunked_prefill_equal_one_shot_prefill(tiny_pair):
    model = tiny_pair[0]  # sparse, with the context well past index_topk
    ids = _tokens(2, 90, model.config.vocab_size, seed=2)
    full = model(ids)
    cache = model.new_cache(2, 90)
    decoded = [model(ids[:, :70], None, cache)] + [model(ids[:, i:i + 1], None, cache) for i in range(70, 90)]
    torch.testing.assert_close(torch.cat(decoded, 1), full, atol=1e-5, rtol=1e-5)
    cache = model.new_cache(2, 90)
    chunks = [model(ids[:, a:b], None, cache) for a, b in ((0, 25), (25, 64), (64, 90))]
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=1e-5, rtol=1e-5)
    # explicit positions continuing a prefix give the same as positions=None
    cache = model.new_cache(2, 90)
    model(ids[:, :50], torch.arange(50).expand(2, 50), cache)
    tail = model(ids[:, 50:], torch.arange(50, 90).expand(2, 40), cache)
    torch.testing.assert_close(tail, full[:, 50:], atol=1e-5, rtol=1e-5)


def _smooth_model(model_type: str) -> DsaForCausalLM:
    """Tiny model with dense MLPs (MoE routing is discontinuous by design and would hide the attention's behaviour) and
    softened attention logits (at random init one key can carry most of the attention mass; trained models are not
    that peaky)."""
    cfg = DsaConfig.tiny(model_type, mlp_layer_types=("dense",) * 3)
    model = DsaForCausalLM.random(cfg, seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_b_proj.weight.mul_(0.1)
    return model


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_no_cliff_at_topk_boundary(model_type):
    sparse = _smooth_model(model_type)
    dense = DsaForCausalLM(sparse.config, dense_attention=True)
    dense.load_state_dict(sparse.state_dict())
    K = sparse.config.index_topk
    ids = _tokens(1, K + 5, sparse.config.vocab_size, seed=3)
    rel = {}
    for T in range(K - 1, K + 6):
        a, b = sparse(ids[:, :T])[0, -1], dense(ids[:, :T])[0, -1]
        rel[T] = float((a - b).norm() / b.norm())
    assert rel[K - 1] < 1e-5 and rel[K] < 1e-5  # identical while every key fits
    assert 0 < rel[K + 1] < 0.05  # one key dropped per layer: a small change, not a jump
    assert all(rel[T] < 0.1 for T in rel)  # and it grows gradually as more keys are left out
    assert all(abs(rel[T + 1] - rel[T]) < 0.05 for T in range(K - 1, K + 5))


def test_tiny_run_exercises_dense_moe_group_routing_and_sparse_selection():
    cfg = DsaConfig.tiny()
    model = DsaForCausalLM.random(cfg, seed=1)
    assert {type(layer.mlp).__name__ for layer in model.decoder_layers} == {"MLP", "MoE"}
    calls = []
    hooks = [m.register_forward_hook(lambda mod, args, out: calls.append((mod, args[0], out[1])))
             for m in model.modules() if isinstance(m, MoEGate)]
    T = 100
    model(_tokens(2, T, cfg.vocab_size, seed=4))
    for h in hooks:
        h.remove()
    per_group = cfg.n_routed_experts // cfg.n_group
    limited = False
    for gate, x, ids in calls:
        groups = ids // per_group
        assert all(len(set(row.tolist())) <= cfg.topk_group for row in groups)  # group-limited
        scores = torch.sigmoid(x.float() @ gate.weight.float().T) + gate.e_score_correction_bias
        free = scores.topk(cfg.num_experts_per_tok, dim=-1).indices // per_group  # what routing without groups picks
        limited |= any(len(set(row.tolist())) > cfg.topk_group for row in free)
    assert calls and limited  # the group limit actually changed some tokens' experts
    topk = model.decoder_layers[0].self_attn.last_topk  # [2, T, 64]
    assert topk.shape == (2, T, cfg.index_topk)
    for row in topk:
        for pos in range(T):
            sel = row[pos][row[pos] >= 0]
            assert sel.numel() == min(cfg.index_topk, pos + 1) and int(sel.max()) <= pos
            assert sel.unique().numel() == sel.numel()
    assert (topk[:, cfg.index_topk:] >= 0).all()  # past index_topk every row is full: really sparse


def test_shared_topk_layer_reuses_previous_selection():
    cfg = DsaConfig.tiny("glm_moe_dsa")
    model = DsaForCausalLM.random(cfg, seed=2)
    assert model.decoder_layers[2].self_attn.indexer is None and model.mtp_layers[0].self_attn.indexer is not None
    model(_tokens(1, 80, cfg.vocab_size))
    assert torch.equal(model.decoder_layers[2].self_attn.last_topk, model.decoder_layers[1].self_attn.last_topk)
    assert not torch.equal(model.decoder_layers[1].self_attn.last_topk, model.decoder_layers[0].self_attn.last_topk)


@pytest.fixture(scope="module")
def tiny_model():
    torch.set_num_threads(1)
    return DsaForCausalLM.random(DsaConfig.tiny(), seed=0)


@pytest.mark.parametrize("kv_cache_dtype, supports_quant_query", [
    ("bfloat16", False), ("fp8", False), ("fp8", True), ("fp8_ds_mla", False), ("fp8_ds_mla", True)])
def test_cache_forms_run_and_track_the_exact_cache(kv_cache_dtype, supports_quant_query):
    model = _smooth_model("deepseek_v32")
    ids = _tokens(1, 80, model.config.vocab_size, seed=5)
    ref = model(ids, None, model.new_cache(1, 80))
    cache = model.new_cache(1, 80, kv_cache_dtype=kv_cache_dtype, backend_supports_quant_query=supports_quant_query)
    assert cache.form.fp8_query == supports_quant_query
    assert cache.form.fp8_kv_needs_view == (kv_cache_dtype == "fp8")
    got = model(ids, None, cache)
    rel = float((got - ref).norm() / ref.norm())
    assert 0 < rel < 0.1


def test_cache_byte_geometry(tiny_model):
    cache = tiny_model.new_cache(2, 16, kv_cache_dtype="fp8_ds_mla")
    assert cache.layers[0].latent.shape == (2, 16, 656) and cache.layers[0].latent.dtype == torch.uint8
    assert cache.layers[0].index_keys.shape == (2, 16, 132)
    bf16 = tiny_model.new_cache(2, 16, kv_cache_dtype="bfloat16").layers[0].latent
    assert bf16.shape[-1] * bf16.element_size() == 1152
    assert len(cache.layers) == 4 and len(tiny_model.new_cache(1, 4, with_mtp=False).layers) == 3


def test_bf16_model_runs_and_tracks_fp32(tiny_model):
    bf16 = DsaForCausalLM(tiny_model.config, dtype=torch.bfloat16)
    bf16.load_state_dict(tiny_model.state_dict())
    assert bf16.model.layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32
    ids = _tokens(1, 40, tiny_model.config.vocab_size, seed=6)
    got, ref = bf16(ids), tiny_model(ids)
    assert torch.isfinite(got).all() and float((got - ref).norm() / ref.norm()) < 0.15
    assert bf16.generate(ids[:, :8], 4).shape == (1, 4)


def test_greedy_generate_matches_argmax_of_full_forward(tiny_model):
    ids = _tokens(2, 60, tiny_model.config.vocab_size, seed=7)
    new = tiny_model.generate(ids, 12)
    seq = torch.cat((ids, new), 1)
    torch.testing.assert_close(tiny_model(seq)[:, 59:-1].argmax(-1), new, atol=0, rtol=0)


def test_hf_names_save_load_and_config_round_trip(tmp_path):
    cfg = DsaConfig.tiny("glm_moe_dsa")
    model = DsaForCausalLM.random(cfg, seed=3)
    names = set(model.state_dict())
    n = cfg.num_hidden_layers
    for expected in ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                     "model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                     "model.layers.0.self_attn.indexer.wq_b.weight", "model.layers.0.self_attn.indexer.wk.weight",
                     "model.layers.0.self_attn.indexer.k_norm.weight", "model.layers.0.self_attn.indexer.k_norm.bias",
                     "model.layers.0.self_attn.indexer.weights_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                     "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
                     "model.layers.1.mlp.experts.7.down_proj.weight",
                     "model.layers.1.mlp.shared_experts.up_proj.weight",
                     f"model.layers.{n}.eh_proj.weight", f"model.layers.{n}.enorm.weight",
                     f"model.layers.{n}.hnorm.weight",
                     f"model.layers.{n}.shared_head.head.weight", f"model.layers.{n}.shared_head.norm.weight",
                     f"model.layers.{n}.embed_tokens.weight", f"model.layers.{n}.self_attn.indexer.wq_b.weight",
                     f"model.layers.{n}.mlp.experts.0.up_proj.weight"]:
        assert expected in names, expected
    assert not any(k.startswith("model.layers.2.self_attn.indexer.") for k in names)  # shared layer: no indexer

    model.save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["GlmMoeDsaForCausalLM"] and hf["index_topk_pattern"] == "FFS"
    assert DsaConfig.from_hf_config(hf) == cfg
    loaded = DsaForCausalLM.from_pretrained(tmp_path)
    ids = _tokens(1, 70, cfg.vocab_size)
    torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)
    ds = DsaConfig.tiny()
    assert DsaConfig.from_hf_config(ds.to_hf_config()) == ds


def test_load_handles_shared_indexer_fp8_weights_and_missing(tmp_path):
    from safetensors.torch import save_file

    cfg = DsaConfig.tiny("glm_moe_dsa")
    model = DsaForCausalLM.random(cfg, seed=4)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["model.layers.2.self_attn.indexer.wk.weight"] = torch.zeros(128, cfg.hidden_size)  # vLLM drops these too
    w = state.pop("model.layers.0.self_attn.o_proj.weight")
    scale = torch.tensor([[0.5]])  # one 128x128 block
    state["model.layers.0.self_attn.o_proj.weight"] = (w / 0.5).to(torch.float8_e4m3fn)
    state["model.layers.0.self_attn.o_proj.weight_scale_inv"] = scale
    save_file(state, str(tmp_path / "m.safetensors"))
    fresh = DsaForCausalLM(cfg)
    report = fresh.load_safetensors(tmp_path / "m.safetensors")
    assert "model.layers.2.self_attn.indexer.wk.weight" in report.ignored
    got = fresh.model.layers[0].self_attn.o_proj.weight
    assert ((got - w).abs() <= 2**-4 * w.abs() + 1e-3).all()
    del state["model.norm.weight"]
    save_file(state, str(tmp_path / "m.safetensors"))
    with pytest.raises(ValueError, match="model.norm.weight"):
        DsaForCausalLM(cfg).load_safetensors(tmp_path / "m.safetensors")


def test_positions_are_validated(tiny_model):
    ids = _tokens(1, 5, tiny_model.config.vocab_size)
    with pytest.raises(ValueError, match="positions"):
        tiny_model(ids, torch.arange(3, 8)[None])  # no cache: must start at 0
    with pytest.raises(ValueError, match="positions"):
        tiny_model(ids, torch.arange(5)[None], tiny_model.new_cache(1, 4))  # beyond the cache
    with pytest.raises(ValueError, match="positions"):
        tiny_model(ids, torch.arange(4)[None], tiny_model.new_cache(1, 8))  # wrong shape


def test_mha_form_and_moe_module_shapes(tiny_model):
    mha = DsaForCausalLM(tiny_model.config, mla_form="mha")
    mha.load_state_dict(tiny_model.state_dict())
    ids = _tokens(1, 80, tiny_model.config.vocab_size, seed=8)
    torch.testing.assert_close(mha(ids), tiny_model(ids), atol=1e-4, rtol=1e-4)
    moe = tiny_model.model.layers[1].mlp
    assert isinstance(moe, MoE) and moe(torch.randn(2, 3, 128)).shape == (2, 3, 128)
