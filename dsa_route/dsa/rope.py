"""Rotary position embedding: the (YaRN) frequency table and the two pair layouts.

Shape legend: S tokens, H heads, R rotary dims (even), R/2 frequencies.

MLA and the lightning indexer share one frequency table (vLLM builds both with the same ``rope_parameters``). They
differ only in how the R dims are paired:
  - interleaved (GPT-J, ``is_neox_style=False``): pairs (x0, x1), (x2, x3), ...  -- MLA in both families, and the GLM-5
    indexer (``indexer_rope_interleave: true``). DeepSeek's ``apply_rotary_emb(x, freqs_cis, interleaved=True)``.
  - half-split (NeoX, ``is_neox_style=True``): pairs (x_i, x_{i+R/2}) -- the DeepSeek-V3.2 indexer
    (``apply_rotary_emb(..., interleaved=False)`` in DeepSeek-V3.2-Exp ``inference/model.py``).
Outputs keep the input layout (no de-interleaving), as vLLM's kernels write them to the caches.
"""

from __future__ import annotations

import math

import torch

from .config import DsaConfig, YarnScaling, yarn_get_mscale


def rope_inv_freq(dim: int, theta: float, yarn: YarnScaling | None) -> torch.Tensor:
    """Inverse frequencies ``[dim/2]`` fp32, YaRN-blended when ``yarn`` is given.

    Formula: ``theta^(-2i/dim)``; YaRN interpolates ``freq/factor`` and ``freq`` with a linear ramp between the
    correction dims of ``beta_fast`` and ``beta_slow`` rotations at ``original_max_position_embeddings``.
    Source: DeepSeek-V3.2-Exp ``precompute_freqs_cis``; vLLM ``DeepseekScalingRotaryEmbedding._compute_inv_freq``
    (identical maths). Note: the official code only applies YaRN when ``max_seq_len > original_seq_len``; vLLM and HF always apply it when
    configured, and so does this function.
    """
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if yarn is None:
        return freqs

    def correction_dim(num_rotations: float) -> float:
        rotations_at_len = yarn.original_max_position_embeddings / (num_rotations * 2 * math.pi)
        return dim * math.log(rotations_at_len) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(yarn.beta_fast)), 0)
    high = min(math.ceil(correction_dim(yarn.beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # prevent a zero-width ramp (same guard as the references)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    smooth = 1 - ramp  # 1 → keep the original frequency (high-frequency dims), 0 → interpolate
    return freqs / yarn.factor * (1 - smooth) + freqs * smooth


class RopeTable:
    """cos/sin lookup for one rotary geometry. ``cos_sin(positions [...]) -> (cos, sin)`` each ``[..., R/2]`` fp32.

    cos/sin carry vLLM's YaRN magnitude ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` (1.0 for every
    released DeepSeek config, where mscale == mscale_all_dim).
    """

    def __init__(self, dim: int, theta: float, yarn: YarnScaling | None):
        self.dim = dim
        self.inv_freq = rope_inv_freq(dim, theta, yarn)
        self.magnitude = 1.0
        if yarn is not None:
            self.magnitude = (yarn_get_mscale(yarn.factor, yarn.mscale)
                              / yarn_get_mscale(yarn.factor, yarn.mscale_all_dim))

    @classmethod
    def for_config(cls, config: DsaConfig) -> "RopeTable":
        return cls(config.qk_rope_head_dim, config.rope_theta, config.rope_scaling)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.to(torch.float32)[..., None] * self.inv_freq.to(positions.device)
        return angles.cos() * self.magnitude, angles.sin() * self.magnitude


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool) -> torch.Tensor:
    """Rotate the last dim of ``x [..., R]`` by angles whose ``cos/sin [..., R/2]`` broadcast against ``x[..., :R/2]``.

    Computed in fp32, returned in ``x.dtype``. ``interleaved`` selects the pair layout (see module docstring).
    Raises ValueError when R does not match ``2 · cos.shape[-1]``.
    """
    half = x.shape[-1] // 2
    if x.shape[-1] != 2 * cos.shape[-1]:
        raise ValueError(f"apply_rope: x has {x.shape[-1]} dims but cos has {cos.shape[-1]} frequencies")
    xf = x.float()
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = xf[..., :half], xf[..., half:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)
