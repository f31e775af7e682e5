"""The paged CPU indexer cache follows ``DsaConfig.indexer_fp8``: 132-byte FP8 rows when on (vLLM's form), keys in the
model dtype when off."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("fp8", [True, False])
def test_indexer_cache_stores_the_configured_key_form(fp8):
    from vllm.config import VllmConfig, set_current_vllm_config

    from dsa_route.dsa.kv_cache import pack_indexer_keys, unpack_indexer_keys
    from dsa_route.vllm_cpu.attention import DsaIndexerCache

    with set_current_vllm_config(VllmConfig()):
        cache = DsaIndexerCache(f"model.layers.0.self_attn.indexer.k_cache.{fp8}", 128, fp8, torch.float32)
    assert (cache.width, cache.dtype) == ((132, torch.uint8) if fp8 else (128, torch.float32))
    bs = 4
    cache.bind_kv_cache(torch.zeros(3, 1, bs, cache.width, dtype=cache.dtype))
    k = torch.randn(4, 128, generator=torch.Generator().manual_seed(0))
    cache.write_keys(torch.tensor([0, 1, 5, 6, -1]), torch.cat((k, torch.randn(1, 128))))  # -1: padding, skipped
    got = cache.gather_keys(torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([7], dtype=torch.int32))
    assert got.shape == (7, 128)
    want = unpack_indexer_keys(pack_indexer_keys(k), 128) if fp8 else k
    assert torch.equal(got[[0, 1, 5, 6]], want)
    assert torch.equal(got[[2, 3, 4]], torch.zeros(3, 128))


def test_each_query_is_scored_against_its_own_requests_keys_only():
    """``request_logits`` (one indexer call per request) gives, at column j, the flat ``[n, T]`` matrix's score of
    flat key ``key_start + j``, -inf past the query's visible end: the same selection as before at Σ_r S_r·L_r cost
    (scripts/bench_request_logits.py). Requests of 300, 5, 180 and 64 keys, MTP's 2 queries on three of them."""
    from dsa_route.dsa.indexer import indexer_logits
    from dsa_route.vllm_cpu.attention import request_logits

    g = torch.Generator().manual_seed(0)
    lengths, queries = [300, 5, 180, 64], [2, 1, 2, 2]
    starts, ends, offset = [], [], 0
    for length, count in zip(lengths, queries):
        for j in range(count):                       # the last query of a request sees all its keys
            starts.append(offset)
            ends.append(offset + length - (count - 1 - j))
        offset += length
    key_start, key_end = torch.tensor(starts), torch.tensor(ends)
    keys = torch.randn(offset, 64, generator=g).to(torch.bfloat16)
    q = torch.randn(len(starts), 16, 64, generator=g).to(torch.bfloat16)
    weights = torch.rand(len(starts), 16, generator=g)
    flat = indexer_logits(q, keys, weights, key_end, key_start)
    mine = request_logits(q, keys, weights, key_start, key_end)
    assert mine.shape == (len(starts), 300)
    for s, (start, end) in enumerate(zip(starts, ends)):
        torch.testing.assert_close(mine[s, :end - start], flat[s, start:end], rtol=1e-6, atol=1e-6)
        assert torch.isneginf(mine[s, end - start:]).all()
