"""Small building blocks shared by the decoder: RMSNorm and the SwiGLU MLP.

Shape legend: D hidden, F intermediate; leading dims are arbitrary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``x · rsqrt(mean(x²) + eps) · weight``, computed in fp32 and cast back to ``x.dtype``
    (DeepSeek-V3.2-Exp ``inference/model.py::RMSNorm``). Parameter: ``weight [D]``."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


class MLP(nn.Module):
    """SwiGLU feed-forward ``down(silu(gate(x)) · up(x))``; the product is formed in fp32
    (DeepSeek-V3.2-Exp ``MLP``/``Expert``). HF names: ``gate_proj``, ``up_proj``, ``down_proj``."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj((F.silu(self.gate_proj(x).float()) * self.up_proj(x).float()).to(x.dtype))
