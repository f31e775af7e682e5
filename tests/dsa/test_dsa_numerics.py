"""The reference as an oracle: sparse == dense while every key fits, in every cache x query form; non-finite values are
surfaced, never hidden; top-k keeps its deterministic tie rule; fp8_ds_mla's scale rule is a named choice (the
indexer ``numerics`` choice is tested with the Hadamard in test_dsa_kernels.py)."""

from __future__ import annotations

import pytest
import torch

from dsa_route.dsa import DsaConfig, DsaForCausalLM, RopeTable, query_form, topk_indices
from dsa_route.dsa.attention import AttentionInputs, DsaAttention
from dsa_route.dsa.fp8 import dequantize_fp8_blocks, dequantize_fp8_tensor, quantize_fp8_blocks, quantize_fp8_tensor
from dsa_route.dsa.kv_cache import (KV_CACHE_DTYPES, DsaCache, pack_fp8_ds_mla, pack_indexer_keys, unpack_fp8_ds_mla,
                                    unpack_indexer_keys)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tokens(rows: int, n: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, n), generator=_gen(seed))


# ---- sparse == dense at T <= index_topk ----------------------------------------------------------------------------
FORMS = [(dtype, supports) for dtype in KV_CACHE_DTYPES for supports in (False, True)]


@torch.no_grad()
def _attention_outputs(model_type: str, kv_cache_dtype: str, supports_quant_query: bool, mla_form: str = "absorbed",
                       T: int = 44) -> dict[bool, torch.Tensor]:
    """One DSA attention layer (layer 0) over T tokens (prefill T-4, then 4 decode steps), sparse and dense, each with
    a fresh cache of the given form: ``{dense: out [1, T, D]}``. The layer alone, so a rounding difference is not
    amplified by later layers re-quantizing their caches."""
    cfg = DsaConfig.tiny(model_type)
    torch.manual_seed(0)
    attn = DsaAttention(cfg, 0)
    attn.mla_form = mla_form
    x = torch.randn(1, T, cfg.hidden_size, generator=_gen(7))
    rope = RopeTable.for_config(cfg)
    outs = {}
    for dense in (False, True):
        cache = DsaCache(cfg, 1, T, kv_cache_dtype=kv_cache_dtype, backend_supports_quant_query=supports_quant_query)
        parts = []
        for a, b in ((0, T - 4),) + tuple((i, i + 1) for i in range(T - 4, T)):
            pos = torch.arange(a, b)[None]
            cos, sin = rope.cos_sin(pos)
            inp = AttentionInputs(pos, cos, sin, cache.form, cache.q_scale, dense)
            parts.append(attn(x[:, a:b], inp, cache.layers[0])[0])
        outs[dense] = torch.cat(parts, dim=1)
    return outs


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("kv_cache_dtype, supports_quant_query", FORMS)
def test_sparse_attention_equals_dense_while_topk_covers_the_context(model_type, kv_cache_dtype,
                                                                      supports_quant_query):
    outs = _attention_outputs(model_type, kv_cache_dtype, supports_quant_query)  # 44 keys < index_topk 64
    torch.testing.assert_close(outs[False], outs[True], atol=1e-5, rtol=1e-5)
    if query_form(kv_cache_dtype, supports_quant_query).fp8_query:  # MHA has no absorbed query to quantize: refused
        with pytest.raises(ValueError, match="mla_form"):
            _attention_outputs(model_type, kv_cache_dtype, supports_quant_query, "mha")
    else:
        mha = _attention_outputs(model_type, kv_cache_dtype, supports_quant_query, "mha")
        torch.testing.assert_close(mha[False], outs[True], atol=1e-5, rtol=1e-5)


def test_fp8_query_really_changes_the_result():
    """Precondition of the invariant above: the fp8 query is applied (dense with and without it differ)."""
    plain = _attention_outputs("deepseek_v32", "fp8_ds_mla", False)[True]
    quant = _attention_outputs("deepseek_v32", "fp8_ds_mla", True)[True]
    assert float((plain - quant).norm() / plain.norm()) > 1e-3


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("kv_cache_dtype, supports_quant_query", FORMS)
def test_whole_model_sparse_tracks_dense_in_every_form(model_type, kv_cache_dtype, supports_quant_query):
    """The whole (dense-MLP) model: only rounding differences, which a quantized cache can amplify to its own step
    in later layers (an MoE model may then route a token differently, hence the dense MLPs), no systematic gap."""
    cfg = DsaConfig.tiny(model_type, mlp_layer_types=("dense",) * 3)
    sparse = DsaForCausalLM.random(cfg, seed=0)
    dense = DsaForCausalLM(cfg, dense_attention=True)
    dense.load_state_dict(sparse.state_dict())
    ids = _tokens(1, 44, cfg.vocab_size, seed=2)
    got, want = (m(ids, None, m.new_cache(1, 44, kv_cache_dtype=kv_cache_dtype,
                                          backend_supports_quant_query=supports_quant_query)) for m in (sparse, dense))
    assert float((got - want).norm() / want.norm()) < (1e-5 if kv_cache_dtype == "auto" else 2e-3)


# ---- non-finite values -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_fp8_blocks_keep_non_finite_values_non_finite(bad):
    x = torch.randn(3, 256, generator=_gen(0))
    x[1, 5] = bad  # row 1, first block of 128
    values, scales = quantize_fp8_blocks(x, 128)
    back = dequantize_fp8_blocks(values, scales)
    assert not torch.isfinite(back[1, 5])
    assert not torch.isfinite(back[1, :128]).any()  # the kernels' x / inf, inf / inf: the whole block is poisoned
    assert torch.isfinite(back[1, 128:]).all() and torch.isfinite(back[[0, 2]]).all()  # other blocks untouched
    torch.testing.assert_close(back[1, 128:], dequantize_fp8_blocks(*quantize_fp8_blocks(x[1:2, 128:], 128))[0])
    assert not torch.isfinite(unpack_indexer_keys(pack_indexer_keys(x[:, :128]), 128)[1]).all()
    latent = torch.randn(2, 512, generator=_gen(1))
    latent[0, 300] = bad
    lat, _ = unpack_fp8_ds_mla(pack_fp8_ds_mla(latent, torch.randn(2, 64)))
    assert not torch.isfinite(lat[0, 256:384]).any() and torch.isfinite(lat[0, :256]).all()
    assert torch.isfinite(lat[1]).all()


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_per_tensor_fp8_surfaces_non_finite_values(bad):
    x = torch.tensor([1.0, bad, 1000.0, -1000.0])
    back = dequantize_fp8_tensor(quantize_fp8_tensor(x, 1.0), 1.0)
    assert back[0] == 1.0 and not torch.isfinite(back[1])
    assert back[2:].tolist() == [448.0, -448.0]  # finite overflow saturates, as vLLM's conversion does


# ---- top-k ------------------------------------------------------------------------------------------------------------
def _stable_sort_topk(logits: torch.Tensor, k: int) -> list[list[int]]:
    """The contract written the slow way: a stable descending sort (NaN first, ties lower index first), the first k
    that are not -inf, in ascending key order, -1 padded."""
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]
    rows = []
    for s, row in enumerate(order.tolist()):
        keep = sorted(t for t in row if logits[s, t] != float("-inf"))
        rows.append(keep + [-1] * (k - len(keep)))
    return rows


@pytest.mark.parametrize("k", [1, 5, 16, 40, 64])
def test_topk_equals_the_stable_sort_under_heavy_ties(k):
    S, T = 24, 48
    logits = torch.randint(0, 4, (S, T), generator=_gen(k)).float()  # four distinct values: ties everywhere
    logits[torch.rand(S, T, generator=_gen(k + 1)) < 0.2] = float("-inf")
    logits[0] = 0.0  # one row entirely tied
    logits[1] = float("-inf")  # one row with nothing visible
    logits[2, 7] = logits[2, 30] = float("nan")
    got = topk_indices(logits, k)
    assert got.dtype == torch.int32 and got.shape == (S, k)
    assert got.tolist() == _stable_sort_topk(logits, k)
    assert got[0].tolist() == list(range(min(k, T))) + [-1] * (k - min(k, T))  # lower index wins


@pytest.mark.parametrize("k", [1, 5, 16, 47])
def test_topk_equals_the_stable_sort_when_every_row_is_full(k):
    """No invisible key in any row: the ascending order comes from the selection mask, not from a sort."""
    S, T = 24, 48
    logits = torch.randint(0, 4, (S, T), generator=_gen(k + 2)).float()
    logits[0] = 1.0
    logits[2, 7] = logits[2, 30] = float("nan")
    logits[3, : k + 1] = float("nan")  # more NaNs than k: NaN is the boundary value
    got = topk_indices(logits, k)
    assert got.tolist() == _stable_sort_topk(logits, k)
    assert got[0].tolist() == list(range(k)) and got[3].tolist() == list(range(k))


def test_topk_ranks_nan_highest_like_torch_topk():
    logits = torch.tensor([[0.5, float("nan"), 3.0, float("-inf"), 2.0]])
    assert topk_indices(logits, 1).tolist() == [[1]] == torch.topk(logits, 1).indices.tolist()
    assert topk_indices(logits, 2).tolist() == [[1, 2]]
    assert topk_indices(logits, 5).tolist() == [[0, 1, 2, 4, -1]]  # NaN is visible; -inf is not


# ---- fp8_ds_mla scale rules ---------------------------------------------------------------------------------------
def test_fp8_ds_mla_raw_scale_rule_is_vllms_cuda_writer():
    latent = torch.randn(5, 512, generator=_gen(4)) * torch.tensor([1e-3, 0.5, 3.0, 70.0]).repeat_interleave(128)
    rope = torch.randn(5, 64, generator=_gen(5))
    raw = pack_fp8_ds_mla(latent, rope, "raw")
    scales = raw[:, 512:528].contiguous().view(torch.float32)
    torch.testing.assert_close(scales, latent.view(5, 4, 128).abs().amax(-1) / 448, atol=0, rtol=0)
    pow2 = pack_fp8_ds_mla(latent, rope)[:, 512:528].contiguous().view(torch.float32)
    assert torch.equal(pow2, torch.exp2(torch.ceil(torch.log2(torch.clamp_min(scales, 1e-4)))))
    lat, _ = unpack_fp8_ds_mla(raw)
    err = (lat - latent).view(5, 4, 128).abs().amax(-1) / latent.view(5, 4, 128).abs().amax(-1)
    assert err.max() <= 2**-4
    with pytest.raises(ValueError, match="scale_rule"):
        pack_fp8_ds_mla(latent, rope, "e8m0")
    cache = DsaForCausalLM.random(DsaConfig.tiny(), seed=0).new_cache(1, 4, kv_cache_dtype="fp8_ds_mla",
                                                                       ds_mla_scale_rule="raw")
    assert cache.layers[0].ds_mla_scale_rule == "raw"
