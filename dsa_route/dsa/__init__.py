"""dsa_route.dsa: a readable PyTorch reference of DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5), the numerical
oracle.

Public API (tests and tools depend on these names): ``DsaConfig``, ``DsaForCausalLM``, ``indexer_logits``,
``topk_indices``, ``sparse_mla``, ``pack_fp8_ds_mla``, ``unpack_fp8_ds_mla``; plus the cache helpers and the MTP stats.
This package never imports vLLM or the harness.
"""

from .config import DsaConfig, YarnScaling
from .indexer import Indexer, hadamard, indexer_logits
from .kv_cache import (DsaCache, LayerCache, QueryForm, indexer_bytes_per_token, latent_bytes_per_token,
                       pack_fp8_ds_mla, pack_fp8_per_tensor, pack_indexer_keys, query_form, unpack_fp8_ds_mla,
                       unpack_fp8_per_tensor, unpack_indexer_keys)
from .model import DsaForCausalLM, LoadReport
from .mtp import SpecDecodeStats, speculative_generate
from .rope import RopeTable, apply_rope, rope_inv_freq
from .sparse_mla import dense_mla, dense_mqa, sparse_mla, sparse_mla_mha
from .topk import topk_indices

__all__ = [
    "DsaConfig", "YarnScaling", "DsaForCausalLM", "LoadReport", "DsaCache", "LayerCache", "QueryForm", "query_form",
    "Indexer", "hadamard", "indexer_logits", "topk_indices", "sparse_mla", "sparse_mla_mha", "dense_mla", "dense_mqa",
    "pack_fp8_ds_mla", "unpack_fp8_ds_mla", "pack_fp8_per_tensor", "unpack_fp8_per_tensor", "pack_indexer_keys",
    "unpack_indexer_keys", "latent_bytes_per_token", "indexer_bytes_per_token", "RopeTable", "apply_rope",
    "rope_inv_freq", "SpecDecodeStats", "speculative_generate",
]
