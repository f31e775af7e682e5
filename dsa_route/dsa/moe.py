"""DeepSeek-V3 mixture of experts: sigmoid router with a load-balancing bias, group-limited top-k, shared expert.

Shape legend: T tokens, D hidden, E routed experts, G expert groups, k experts per token.

Routing ("noaux_tc", DeepSeek-V3 tech report arXiv:2412.19437 §2.1.2; DeepSeek-V3.2-Exp ``Gate.forward``; vLLM
``fused_moe/router/grouped_topk_router.py::grouped_topk``):
    s        = sigmoid(x · W_gateᵀ)                      fp32 (softmax if scoring_func == "softmax")
    b        = s + e_score_correction_bias               used only to *choose* experts
    group g  score = sum of the top-2 b in g;  keep the best ``topk_group`` groups, mask the rest
    ids      = top-k of b among kept groups
    weights  = s[ids] (unbiased), / Σ if norm_topk_prob, · routed_scaling_factor
    y        = Σ_j weights_j · expert_{ids_j}(x) + shared_experts(x)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import DsaConfig
from .layers import MLP


class MoEGate(nn.Module):
    """Router. HF names: ``weight [E, D]``, ``e_score_correction_bias [E]`` (fp32 in checkpoints)."""

    def __init__(self, config: DsaConfig):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.scoring_func = config.scoring_func
        self.norm_topk_prob = config.norm_topk_prob
        self.routed_scaling_factor = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(config.n_routed_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [T, D]`` → ``(weights fp32 [T, k], expert ids long [T, k])``."""
        T = x.shape[0]
        logits = F.linear(x.float(), self.weight.float())  # router in fp32 (vLLM GLM: moe_router_dtype float32)
        scores = logits.sigmoid() if self.scoring_func == "sigmoid" else logits.softmax(dim=-1)
        biased = scores + self.e_score_correction_bias.float()
        if self.n_group > 1:
            grouped = biased.view(T, self.n_group, -1)
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
            keep = group_scores.topk(self.topk_group, dim=-1).indices  # [T, topk_group]
            group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
            biased = grouped.masked_fill(~group_mask[..., None], float("-inf")).view(T, -1)
        ids = biased.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.routed_scaling_factor, ids


class MoE(nn.Module):
    """Routed experts + shared expert. HF names: ``gate``, ``experts.{i}.{gate,up,down}_proj``, ``shared_experts``."""

    def __init__(self, config: DsaConfig):
        super().__init__()
        self.gate = MoEGate(config)
        self.experts = nn.ModuleList(MLP(config.hidden_size, config.moe_intermediate_size)
                                     for _ in range(config.n_routed_experts))
        self.shared_experts = (MLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)
                               if config.n_shared_experts else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., D]`` → ``[..., D]``; routed outputs are accumulated in fp32."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, ids = self.gate(x)
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in ids.unique().tolist():
            token, slot = (ids == e).nonzero(as_tuple=True)
            y.index_add_(0, token, self.experts[e](x[token]).float() * weights[token, slot, None])
        if self.shared_experts is not None:
            y = y + self.shared_experts(x).float()
        return y.to(x.dtype).view(shape)
