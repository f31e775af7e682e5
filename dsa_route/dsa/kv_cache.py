"""KV-cache forms of a DSA layer, their byte layouts, and the caches the reference model decodes against.

Shape legend: B batch rows, N cache slots per row (slot == token position), T tokens, L kv_lora_rank, R rope dims,
I index_head_dim, nb = I / quant block.

Latent (MLA) cache, one row per token ``[c_kv (L) | k_pe (R)]``; byte sizes at the real geometry L=512, R=64:
  - ``auto``       model dtype (bf16 → 1152 B/token; fp32 models keep fp32 here so the reference stays exact)
  - ``bfloat16``   1152 B/token
  - ``fp8`` / ``fp8_e4m3``  per-tensor static fp8: 576 B/token of e4m3 + one float scale per layer (vLLM ``_k_scale``,
                   1.0 unless calibrated); read through a dtype *view* of the bytes (``fp8_kv_needs_view``)
  - ``fp8_ds_mla`` 656 B/token: 512 e4m3 latent values in 4 tiles of 128, then 4 float32 tile scales (powers of two, or
                   vLLM's CUDA writer's raw amax/448: ``pack_fp8_ds_mla``),
                   then 64 bf16 rope values (vLLM ``flashmla_sparse.py`` layout note; FlashMLA "FP8 with scale" format).
Indexer key cache, one row per token: I e4m3 values then nb float32 ue8m0 scales (132 B at I=128), as vLLM's
``DeepseekV32IndexerCache`` (``head_dim + head_dim // 128 * 4``). In vLLM's paged blocks the values of all tokens of a
block come first and all scales after (``indexer_k_quant_and_cache``); ``indexer_rows_to_paged_block`` converts.

Query form (dsa_route routing, upstream PR #52861 ``DeepseekV32`` attention change):
  ``fp8_query         = kv cache quantized and backend supports a quantized query``
  ``fp8_kv_needs_view = kv cache quantized and kv_cache_dtype != "fp8_ds_mla"``
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import DsaConfig
from .fp8 import (dequantize_fp8_blocks, dequantize_fp8_tensor, quant_block_size, quantize_fp8_blocks,
                  quantize_fp8_tensor)

KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_ds_mla")
DS_MLA_TILE = 128


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """vLLM ``is_quantized_kv_cache``: every fp8 form."""
    return kv_cache_dtype.startswith("fp8")


@dataclass(frozen=True)
class QueryForm:
    """How attention consumes a cache form: quantize the absorbed query to fp8 (``fp8_query``), and read the cache bytes
    through an fp8 dtype view (``fp8_kv_needs_view``) rather than unpacking the fp8_ds_mla record."""

    fp8_query: bool
    fp8_kv_needs_view: bool


def query_form(kv_cache_dtype: str, backend_supports_quant_query: bool) -> QueryForm:
    """The routing change's query-form selection (see module docstring). Raises ValueError for unknown dtypes."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype: expected one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    quantized = is_quantized_kv_cache(kv_cache_dtype)
    return QueryForm(fp8_query=quantized and backend_supports_quant_query,
                     fp8_kv_needs_view=quantized and kv_cache_dtype != "fp8_ds_mla")


def latent_bytes_per_token(kv_cache_dtype: str, kv_lora_rank: int, rope_dim: int,
                           model_dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes one token occupies in the latent cache of one layer (scales of the per-tensor form excluded)."""
    if kv_cache_dtype == "auto":
        return (kv_lora_rank + rope_dim) * torch.empty(0, dtype=model_dtype).element_size()
    if kv_cache_dtype == "bfloat16":
        return (kv_lora_rank + rope_dim) * 2
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return kv_lora_rank + rope_dim
    if kv_cache_dtype == "fp8_ds_mla":
        return kv_lora_rank + 4 * (kv_lora_rank // DS_MLA_TILE) + 2 * rope_dim
    raise ValueError(f"kv_cache_dtype: expected one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")


def indexer_bytes_per_token(index_head_dim: int) -> int:
    """Bytes per token of the fp8 indexer key cache: I e4m3 values + one float32 scale per quant block (132 at
    I=128)."""
    return index_head_dim + 4 * (index_head_dim // quant_block_size(index_head_dim))


# ---- fp8_ds_mla ------------------------------------------------------------------------------------------------------
DS_MLA_SCALE_RULES = ("pow2", "raw")
FLT_MIN = torch.finfo(torch.float32).tiny


def pack_fp8_ds_mla(latent: torch.Tensor, rope: torch.Tensor, scale_rule: str = "pow2") -> torch.Tensor:
    """Pack ``latent [T, L]`` and ``rope [T, R]`` into fp8_ds_mla rows ``uint8 [T, L + 4·L/128 + 2·R]`` (656 at 512/64).

    Each 128-wide tile of the latent gets its own float32 scale, by ``scale_rule``:
      - ``"pow2"`` (default): ``2^ceil(log2(max(amax / 448, 1e-4)))``, the installed vLLM's fused DeepSeek-V3.2 writer
        (``vllm/models/deepseek_v32/common/kernels.py`` ``_fused_norm_rope_kernel``, ds_mla branch, l.362-366: the
        *scale* is floored at 1e-4, which only matters for tiles with amax < 0.0448) and FlashMLA's test quantizer
        (``tests/quant.py::quantize_k_cache``);
      - ``"raw"``: ``max(amax / 448, FLT_MIN)``, not rounded: vLLM's CUDA writer
        ``csrc/cache_kernels.cu::concat_and_cache_ds_mla_kernel`` (``tile_scale = max_abs / 448.f``).
    Rope stays bf16 (not quantized, for accuracy). Non-finite latent values make their tile NaN (``fp8`` module).
    Raises ValueError when L is not a multiple of 128, the row counts differ or the rule is unknown.
    """
    T, L = latent.shape
    if L % DS_MLA_TILE or rope.shape[0] != T:
        raise ValueError(f"pack_fp8_ds_mla: need latent [T, 128·k] and rope [T, R], got {latent.shape}, {rope.shape}")
    if scale_rule not in DS_MLA_SCALE_RULES:
        raise ValueError(f"scale_rule: expected one of {DS_MLA_SCALE_RULES}, got {scale_rule!r}")
    pow2 = scale_rule == "pow2"
    values, scales = quantize_fp8_blocks(latent, DS_MLA_TILE, pow2_scale=pow2, amax_floor=0.0,
                                         min_scale=1e-4 if pow2 else FLT_MIN)  # [T,L] e4m3, [T,L/128] fp32
    packed = torch.cat((values.view(torch.uint8), scales.contiguous().view(torch.uint8),
                        rope.to(torch.bfloat16).contiguous().view(torch.uint8)), dim=-1)
    assert packed.shape == (T, latent_bytes_per_token("fp8_ds_mla", L, rope.shape[1]))
    return packed


def unpack_fp8_ds_mla(packed: torch.Tensor, kv_lora_rank: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack_fp8_ds_mla``: ``uint8 [T, W]`` → ``(latent fp32 [T, L], rope bf16 [T, R])``.
    ``kv_lora_rank`` (L) fixes the split; R = (W - L - L/32) / 2. Raises ValueError on an inconsistent width."""
    L = kv_lora_rank
    n_tiles = L // DS_MLA_TILE
    rest = packed.shape[-1] - L - 4 * n_tiles
    if packed.dtype != torch.uint8 or rest <= 0 or rest % 2:
        raise ValueError(f"unpack_fp8_ds_mla: {packed.dtype} rows of width {packed.shape[-1]} do not fit L={L}")
    packed = packed.contiguous()
    values = packed[:, :L].view(torch.float8_e4m3fn)
    scales = packed[:, L:L + 4 * n_tiles].contiguous().view(torch.float32)
    rope = packed[:, L + 4 * n_tiles:].contiguous().view(torch.bfloat16)
    return dequantize_fp8_blocks(values, scales), rope


# ---- per-tensor fp8 --------------------------------------------------------------------------------------------------
def pack_fp8_per_tensor(latent: torch.Tensor, rope: torch.Tensor, scale: float) -> torch.Tensor:
    """``[c_kv | k_pe]`` as e4m3 bytes with one static scale: ``uint8 [T, L+R]`` (vLLM ``concat_and_cache_mla`` fp8)."""
    return quantize_fp8_tensor(torch.cat((latent, rope), dim=-1), scale).view(torch.uint8)


def unpack_fp8_per_tensor(packed: torch.Tensor, scale: float) -> torch.Tensor:
    """Read a per-tensor fp8 row through a dtype view (``fp8_kv_needs_view``): ``uint8 [T, L+R]`` → fp32
    ``[T, L+R]``."""
    return dequantize_fp8_tensor(packed.view(torch.float8_e4m3fn), scale)


# ---- indexer keys ----------------------------------------------------------------------------------------------------
def pack_indexer_keys(k: torch.Tensor) -> torch.Tensor:
    """Indexer keys ``[T, I]`` → ``uint8 [T, I + 4·nb]``: e4m3 values then float32 ue8m0 scales (block min(128, I))."""
    values, scales = quantize_fp8_blocks(k, quant_block_size(k.shape[-1]))
    return torch.cat((values.view(torch.uint8), scales.contiguous().view(torch.uint8)), dim=-1)


def unpack_indexer_keys(packed: torch.Tensor, index_head_dim: int) -> torch.Tensor:
    """Inverse of ``pack_indexer_keys``: ``uint8 [T, I + 4·nb]`` → fp32 ``[T, I]``. Raises ValueError on a bad width."""
    I = index_head_dim
    if packed.shape[-1] != indexer_bytes_per_token(I):
        raise ValueError(f"unpack_indexer_keys: width {packed.shape[-1]} != {indexer_bytes_per_token(I)} for I={I}")
    packed = packed.contiguous()
    values = packed[:, :I].view(torch.float8_e4m3fn)
    scales = packed[:, I:].contiguous().view(torch.float32)
    return dequantize_fp8_blocks(values, scales)


def encode_index_keys(k: torch.Tensor, fp8: bool) -> torch.Tensor:
    """What the indexer cache stores for keys ``k [T, I]``: ``pack_indexer_keys(k)`` (``uint8 [T, I + 4·nb]``) when the
    indexer is FP8 (``DsaConfig.indexer_fp8``), else ``k`` itself (the caller casts to the cache dtype)."""
    return pack_indexer_keys(k) if fp8 else k


def decode_index_keys(rows: torch.Tensor, index_head_dim: int, fp8: bool) -> torch.Tensor:
    """Inverse of ``encode_index_keys``: ``[T, width]`` cache rows → keys ``[T, I]`` (fp32 when dequantized from fp8,
    else the rows unchanged)."""
    return unpack_indexer_keys(rows, index_head_dim) if fp8 else rows


def indexer_rows_to_paged_block(rows: torch.Tensor, index_head_dim: int) -> torch.Tensor:
    """Per-token indexer rows ``uint8 [block_size, I + 4·nb]`` → vLLM's page byte layout
    ``uint8 [block_size·(I+4·nb)]``: all tokens' values first, then all tokens' scales
    (``indexer_k_quant_and_cache``, non-shuffled layout)."""
    return torch.cat((rows[:, :index_head_dim].reshape(-1), rows[:, index_head_dim:].reshape(-1)))


# ---- caches ----------------------------------------------------------------------------------------------------------
class LayerCache:
    """One attention layer's caches for B rows of up to N tokens; slot == position.

    ``latent``: ``[B, N, L+R]`` model dtype (``auto``) / bf16, or ``uint8 [B, N, bytes]`` for the fp8 forms.
    ``index_keys``: ``uint8 [B, N, I + 4·nb]`` when the indexer is FP8, else ``[B, N, I]`` model dtype; None for a layer
    that shares another layer's top-k.
    """

    def __init__(self, config: DsaConfig, batch_size: int, max_len: int, kv_cache_dtype: str, dtype: torch.dtype,
                 device: torch.device | str, has_indexer: bool, k_scale: float = 1.0,
                 ds_mla_scale_rule: str = "pow2"):
        L, R, I = config.kv_lora_rank, config.qk_rope_head_dim, config.index_head_dim
        if kv_cache_dtype == "fp8_ds_mla" and L % DS_MLA_TILE:
            raise ValueError(f"kv_cache_dtype: fp8_ds_mla needs kv_lora_rank % 128 == 0, got {L}")
        if ds_mla_scale_rule not in DS_MLA_SCALE_RULES:
            raise ValueError(f"ds_mla_scale_rule: expected one of {DS_MLA_SCALE_RULES}, got {ds_mla_scale_rule!r}")
        self.kv_cache_dtype, self.dtype, self.k_scale = kv_cache_dtype, dtype, k_scale
        self.ds_mla_scale_rule = ds_mla_scale_rule
        self.kv_lora_rank, self.index_head_dim, self.max_len = L, I, max_len
        width = latent_bytes_per_token(kv_cache_dtype, L, R, dtype)
        if kv_cache_dtype == "auto":
            self.latent = torch.zeros(batch_size, max_len, L + R, dtype=dtype, device=device)
        elif kv_cache_dtype == "bfloat16":
            self.latent = torch.zeros(batch_size, max_len, L + R, dtype=torch.bfloat16, device=device)
        else:
            self.latent = torch.zeros(batch_size, max_len, width, dtype=torch.uint8, device=device)
        self.index_fp8 = config.indexer_fp8
        self.index_keys: torch.Tensor | None = None
        if has_indexer:
            self.index_keys = (torch.zeros(batch_size, max_len, indexer_bytes_per_token(I), dtype=torch.uint8,
                                           device=device) if self.index_fp8
                               else torch.zeros(batch_size, max_len, I, dtype=dtype, device=device))

    def _check(self, positions: torch.Tensor) -> None:
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= self.max_len):
            raise ValueError(f"positions must lie in [0, {self.max_len}) for this cache, got "
                             f"[{int(positions.min())}, {int(positions.max())}]")

    def write(self, row: int, positions: torch.Tensor, latent: torch.Tensor, rope: torch.Tensor) -> None:
        """Store ``latent [S, L]`` and rope'd ``rope [S, R]`` of batch row ``row`` at slots ``positions [S]``."""
        self._check(positions)
        if self.kv_cache_dtype in ("auto", "bfloat16"):
            record = torch.cat((latent, rope), dim=-1).to(self.latent.dtype)
        elif self.kv_cache_dtype == "fp8_ds_mla":
            record = pack_fp8_ds_mla(latent, rope, self.ds_mla_scale_rule)
        else:
            record = pack_fp8_per_tensor(latent, rope, self.k_scale)
        self.latent[row, positions] = record

    def read(self, row: int, length: int, form: QueryForm) -> torch.Tensor:
        """Rows ``[0, length)`` of batch row ``row`` as ``[length, L+R]`` in the model dtype, read the way ``form`` says
        (dtype view for per-tensor fp8, record unpacking for fp8_ds_mla)."""
        raw = self.latent[row, :length]
        if self.kv_cache_dtype in ("auto", "bfloat16"):
            return raw.to(self.dtype)
        if form.fp8_kv_needs_view:
            return unpack_fp8_per_tensor(raw, self.k_scale).to(self.dtype)
        latent, rope = unpack_fp8_ds_mla(raw, self.kv_lora_rank)
        return torch.cat((latent, rope.float()), dim=-1).to(self.dtype)

    def write_index_keys(self, row: int, positions: torch.Tensor, k: torch.Tensor) -> None:
        """Store indexer keys ``k [S, I]`` (quantized on insertion when the indexer is FP8, as vLLM does)."""
        assert self.index_keys is not None, "this layer shares top-k and has no indexer cache"
        self._check(positions)
        self.index_keys[row, positions] = encode_index_keys(k, self.index_fp8).to(self.index_keys.dtype)

    def read_index_keys(self, row: int, length: int) -> torch.Tensor:
        """Indexer keys ``[length, I]`` (fp32 when dequantized from fp8, else model dtype)."""
        assert self.index_keys is not None
        return decode_index_keys(self.index_keys[row, :length], self.index_head_dim, self.index_fp8)


class DsaCache:
    """Caches of a whole model: one ``LayerCache`` per decoder layer, then one per MTP layer (``with_mtp``).

    ``lengths [B]``: one past the highest position written per row, used to default the next positions.
    ``form``: the query form (``query_form``) every attention layer applies; ``q_scale`` is the static per-tensor scale
    of an fp8 query (vLLM ``_q_scale``, 1.0 unless calibrated); ``ds_mla_scale_rule`` picks the fp8_ds_mla tile scale
    rule (``pack_fp8_ds_mla``).
    """

    def __init__(self, config: DsaConfig, batch_size: int, max_len: int, *, kv_cache_dtype: str = "auto",
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 backend_supports_quant_query: bool = False, with_mtp: bool = True,
                 k_scale: float = 1.0, q_scale: float = 1.0, ds_mla_scale_rule: str = "pow2"):
        self.form = query_form(kv_cache_dtype, backend_supports_quant_query)
        self.kv_cache_dtype, self.q_scale, self.max_len = kv_cache_dtype, q_scale, max_len
        n_layers = config.num_hidden_layers + (config.num_nextn_predict_layers if with_mtp else 0)
        self.layers = [LayerCache(config, batch_size, max_len, kv_cache_dtype, dtype, device,
                                  has_indexer=config.indexer_type(i) == "full", k_scale=k_scale,
                                  ds_mla_scale_rule=ds_mla_scale_rule)
                       for i in range(n_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
