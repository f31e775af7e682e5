"""One decoder block: pre-norm DSA attention and a pre-norm dense MLP or MoE, each with a residual.

Shape legend: B batch rows, S tokens, D hidden, K index_topk.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import AttentionInputs, DsaAttention
from .config import DsaConfig
from .kv_cache import LayerCache
from .layers import MLP, RMSNorm
from .moe import MoE


class DecoderLayer(nn.Module):
    """HF names: ``self_attn``, ``mlp`` (``MLP`` for the first dense layers, ``MoE`` after), ``input_layernorm``,
    ``post_attention_layernorm`` (vLLM ``DeepseekV2DecoderLayer``)."""

    def __init__(self, config: DsaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = DsaAttention(config, layer_idx)
        self.mlp = MoE(config) if config.is_moe_layer(layer_idx) else MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, inp: AttentionInputs, cache: LayerCache,
                shared_topk: torch.Tensor | None = None,
                skip_topk: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``h [B,S,D]`` → ``(h [B,S,D], topk [B,S,K] or None)``; the topk feeds later "shared" layers
        (``shared_topk``/``skip_topk``: see ``DsaAttention.forward``)."""
        attn, topk = self.self_attn(self.input_layernorm(h), inp, cache, shared_topk, skip_topk)
        h = h + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, topk
