"""The lightning indexer: a cheap scorer that picks which cached tokens each query attends to.

Shape legend: B batch rows, S query tokens, T key tokens, D hidden, Q q_lora_rank, H index heads, I index_head_dim,
R rope dims (the first R of I are rotated).

Maths (DeepSeek-V3.2-Exp tech report §2.1, eq. 1; ``inference/model.py::Indexer``; vLLM ``deepseek_v2.Indexer``):
    q[s,h]   = wq_b(q_latent[s])[h]                       q_latent = q_a_layernorm(q_a_proj(x)), shared with MLA
    k[t]     = LayerNorm(wk(x[t]))                        one key head, LayerNorm eps 1e-6 with bias
    q, k     : RoPE on dims [:R] (half-split for DeepSeek-V3.2, interleaved for GLM-5), then optionally Hadamard-rotated
               (both or neither: H is orthogonal so Hq·Hk = q·k) and FP8-quantized in ue8m0 blocks
    w[s,h]   = weights_proj(x[s])[h] · H^-0.5 · I^-0.5    kept in fp32
    logits[s,t] = Σ_h w[s,h] · ReLU(q[s,h] · k[t])        masked to -inf outside the causal range of s
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import DsaConfig
from .fp8 import quant_block_size
from .injections import CORRECT, Defect


@functools.lru_cache(maxsize=8)
def _hadamard_cpu(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)  # Sylvester construction
    return h * n**-0.5


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Normalized Walsh-Hadamard rotation of the last dim (a power of two): ``x @ H · n^-0.5``, the same transform as
    ``fast_hadamard_transform.hadamard_transform(x, scale=n**-0.5)`` used by DeepSeek-V3.2-Exp ``rotate_activation``.
    Returns ``x.dtype`` (computed in fp32). Raises ValueError when the dim is not a power of two."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"hadamard: dim {n} is not a power of two")
    return (x.float() @ _hadamard_cpu(n).to(x.device)).to(x.dtype)


@dataclass
class IndexerProjection:
    """What one indexer computes for S new tokens: ``q [B,S,H,I]`` fp32 (rotated, rope'd, quantized if configured),
    ``k [B,S,I]`` in the model dtype (rope'd/rotated, not yet quantized: quantization happens on cache insertion, as in
    vLLM), ``weights [B,S,H]`` fp32 with the H^-0.5·I^-0.5 scales folded in."""

    q: torch.Tensor
    k: torch.Tensor
    weights: torch.Tensor


class Indexer(nn.Module):
    """Lightning-indexer projections. Parameter names match HF checkpoints: ``wq_b``, ``wk``, ``k_norm``,
    ``weights_proj`` (vLLM fuses ``wk``+``weights_proj`` into ``wk_weights_proj`` at load time). ``defect``: the
    calibration defect its RoPE and FP8 query go through (:mod:`.injections`; the identity by default)."""

    defect: Defect = CORRECT

    def __init__(self, config: DsaConfig):
        super().__init__()
        self.n_heads = config.index_n_heads
        self.head_dim = config.index_head_dim
        self.rope_dim = config.qk_rope_head_dim
        self.interleaved_rope = config.indexer_rope_interleave
        self.use_hadamard = config.indexer_hadamard
        self.use_fp8 = config.indexer_fp8
        self.wq_b = nn.Linear(config.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(config.hidden_size, self.n_heads, bias=False)

    def forward(self, x: torch.Tensor, q_latent: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> IndexerProjection:
        """``x [B,S,D]`` (normed hidden), ``q_latent [B,S,Q]``, ``cos/sin [B,S,R/2]`` (the shared RoPE table)."""
        B, S, _ = x.shape
        H, I, R = self.n_heads, self.head_dim, self.rope_dim
        q = self.wq_b(q_latent).view(B, S, H, I)
        q = torch.cat((self.defect.indexer_rope(q[..., :R], cos[:, :, None], sin[:, :, None], self.interleaved_rope,
                                                key=False), q[..., R:]), dim=-1)
        # LayerNorm in fp32 with fp32 affine, cast back (DeepSeek-V3.2-Exp ``LayerNorm``; vLLM dtype=float32)
        k = F.layer_norm(self.wk(x).float(), (I,), self.k_norm.weight.float(), self.k_norm.bias.float(), 1e-6)
        k = k.to(x.dtype)
        k = torch.cat((self.defect.indexer_rope(k[..., :R], cos, sin, self.interleaved_rope, key=True), k[..., R:]),
                      dim=-1)
        if self.use_hadamard:
            q, k = hadamard(q), hadamard(k)
        q = self.defect.fp8_query(q, quant_block_size(I)) if self.use_fp8 else q.float()
        weights = F.linear(x.float(), self.weights_proj.weight.float()) * (H**-0.5 * I**-0.5)
        assert q.shape == (B, S, H, I) and k.shape == (B, S, I) and weights.shape == (B, S, H)
        return IndexerProjection(q=q, k=k, weights=weights)


def indexer_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, key_end: torch.Tensor,
                   key_start: torch.Tensor | None = None) -> torch.Tensor:
    """Index scores of S queries against T keys of one sequence (or one flat key array).

    Args:
        q: ``[S, H, I]`` query heads (already rope'd / rotated / quantized as configured); any float dtype.
        k: ``[T, I]`` keys as read back from the indexer cache.
        weights: ``[S, H]`` fp32 head weights with H^-0.5·I^-0.5 folded in.
        key_end: ``[S]`` int, exclusive end of the keys query s may see. With keys stored at slot == position this is
            ``position + 1``: prefill with a prefix, single-token decode and multi-token MTP verify (draft j sees keys
            up to its own position) are the same rule.
        key_start: ``[S]`` int, inclusive start (default 0), for flat multi-sequence key arrays (vLLM's
            ``cu_seqlen_ks``/``cu_seqlen_ke`` contract of ``fp8_mqa_logits``).

    Returns:
        ``[S, T]`` fp32: ``Σ_h w[s,h]·ReLU(q[s,h]·k[t])`` inside ``[key_start, key_end)``, ``-inf`` outside.
    """
    S, H, I = q.shape
    T = k.shape[0]
    assert k.shape == (T, I) and weights.shape == (S, H) and key_end.shape == (S,)
    # keys as the long GEMM dimension: [T, I] @ [I, S·H] (one pass over the keys for all queries and heads)
    scores = torch.matmul(k.float(), q.float().reshape(S * H, I).T).relu_().view(T, S, H)
    logits = torch.einsum("tsh,sh->st", scores, weights.float())
    t = torch.arange(T, device=q.device)
    visible = t[None, :] < key_end[:, None]
    if key_start is not None:
        visible &= t[None, :] >= key_start[:, None]
    return logits.masked_fill(~visible, float("-inf"))
