"""FP8 e4m3 quantization as DSA uses it: per-block scales rounded up to a power of two (the "ue8m0" scale format).

Shape legend: N leading dims (any), D quantized dim, D/block scales.

Formula (DeepSeek-V3.2-Exp ``inference/kernel.py::act_quant_kernel`` with ``round_scale``; vLLM
``deepseek_v32/common/kernels.py::_fp8_ue8m0_quantize`` and ``indexer_k_quant_and_cache``):
    amax  = max(|x_block|, 1e-4)
    scale = 2^ceil(log2(amax / 448))         (448 = largest finite e4m3fn value)
    q     = e4m3(clamp(x / scale, -448, 448))
Dequantization is ``q · scale``. Because ``scale >= amax/448`` every value fits, and a power-of-two scale makes the
division exact, so the only error is e4m3's 3-bit mantissa rounding (relative error <= 2^-4 of the block amax).

Non-finite inputs stay non-finite: a block holding ±inf gets an infinite scale, so the whole block dequantizes to NaN
(``x / inf`` and ``inf / inf``, what vLLM's ``_fp8_ue8m0_quantize`` computes: ``vllm/models/deepseek_v32/common/
kernels.py`` l.62-70, ``exp2(ceil(log2(inf))) = inf``); a NaN gets a NaN scale likewise (a GPU ``fmaxf`` reduction may
skip NaN instead; the oracle prefers to surface it). ±inf is never saturated to 448: an oracle must surface overflow,
not hide it.
"""

from __future__ import annotations

import torch

FP8_E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4


def quant_block_size(dim: int) -> int:
    """Block length for a ``dim``-wide vector: ``min(128, dim)`` (vLLM ``Indexer.quant_block_size`` is 128 and the
    real ``index_head_dim`` is 128; smaller test geometries use one block)."""
    return min(128, dim)


def pow2_ceil(x: torch.Tensor) -> torch.Tensor:
    """Smallest power of two ``>= x`` for positive fp32 ``x``, computed exactly with ``frexp`` (``x = m · 2^e``,
    ``m ∈ [0.5, 1)``; an exact power of two has ``m == 0.5``). Same result as the kernels' ``fast_round_scale`` and
    ``exp2(ceil(log2(x)))``; like the latter, ``inf`` and NaN pass through (``frexp`` alone would give 1.0)."""
    x = x.float()
    mantissa, exponent = torch.frexp(x)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    return torch.where(torch.isfinite(x), torch.ldexp(torch.ones_like(mantissa), exponent), x)


def _to_e4m3(y: torch.Tensor) -> torch.Tensor:
    """Saturate finite ``y`` to ±448 and cast to e4m3fn; ±inf and NaN become NaN (e4m3fn has no inf)."""
    finite = torch.isfinite(y)
    return torch.where(finite, y.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX), float("nan")).to(torch.float8_e4m3fn)


def quantize_fp8_blocks(x: torch.Tensor, block: int, *, pow2_scale: bool = True, min_scale: float = 0.0,
                        amax_floor: float = AMAX_FLOOR) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [N..., D]`` in blocks of ``block`` along the last dim.

    Returns ``(values float8_e4m3fn [N..., D], scales float32 [N..., D/block])``. ``pow2_scale=False`` keeps the exact
    ``amax/448`` scale (the non-ue8m0 variant); ``amax_floor`` floors the amax (1e-4 in the indexer kernels) and
    ``min_scale`` the scale before rounding (vLLM's fp8_ds_mla writers floor the scale instead of the amax).
    Raises ValueError when ``block`` does not divide ``D``.
    """
    d = x.shape[-1]
    if d % block:
        raise ValueError(f"quantize_fp8_blocks: block {block} does not divide dim {d}")
    xb = x.float().reshape(*x.shape[:-1], d // block, block)
    amax = xb.abs().amax(dim=-1, keepdim=True).clamp_min(amax_floor)
    scale = (amax / FP8_E4M3_MAX).clamp_min(min_scale)
    if pow2_scale:
        scale = pow2_ceil(scale)
    values = _to_e4m3(xb / scale)
    return values.reshape(x.shape), scale.squeeze(-1)


def dequantize_fp8_blocks(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of ``quantize_fp8_blocks``: ``values [N..., D]`` e4m3, ``scales [N..., D/block]`` → fp32
    ``[N..., D]``."""
    d, nb = values.shape[-1], scales.shape[-1]
    vb = values.float().reshape(*values.shape[:-1], nb, d // nb)
    return (vb * scales.float()[..., None]).reshape(values.shape)


def quantize_fp8_tensor(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Per-tensor static FP8 (vLLM ``kv_cache_dtype="fp8"``: one ``_k_scale``, 1.0 unless calibrated):
    ``e4m3(clamp(x / scale))``. Returns float8_e4m3fn of ``x``'s shape. Finite overflow saturates to ±448 as in
    vLLM's ``scaled_convert``; ±inf and NaN become NaN (vLLM's SATFINITE conversion would turn ±inf into ±448: the
    oracle surfaces it instead)."""
    return _to_e4m3(x.float() / scale)


def dequantize_fp8_tensor(values: torch.Tensor, scale: float) -> torch.Tensor:
    """Inverse of ``quantize_fp8_tensor``: fp32 ``values · scale``."""
    return values.float() * scale
