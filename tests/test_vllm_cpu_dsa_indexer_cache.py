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
