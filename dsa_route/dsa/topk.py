"""Top-k selection of the keys each query attends to.

Shape legend: S queries, T keys, K = index_topk.

Contract (vLLM ``topk_indices_buffer [num_tokens, index_topk]`` int32, consumed by FlashMLA sparse; DeepSeek-V3.2-Exp
``Indexer.forward``: ``topk(min(index_topk, end_pos))``):
  - row s holds ``min(K, valid_s)`` distinct indices of keys it may see (``valid_s`` = number of non ``-inf`` logits),
    followed by ``-1`` padding up to width K;
  - the selection is a *set*: order is not part of the contract (kernels treat it as a set; this implementation returns
    descending score order);
  - ties are broken deterministically: among equal scores the lower key index wins (stable sort), so the same logits
    always give the same set on every device.
"""

from __future__ import annotations

import torch


def topk_indices(logits: torch.Tensor, topk: int) -> torch.Tensor:
    """Select up to ``topk`` keys per row of ``logits [S, T]`` (fp32, ``-inf`` = not visible).

    Returns ``int32 [S, topk]``: key indices into the T axis, ``-1`` where a row has fewer than ``topk`` visible keys.
    Raises ValueError when ``topk <= 0``. NaN logits are treated as not visible.
    """
    if topk <= 0:
        raise ValueError(f"topk_indices: topk must be > 0, got {topk}")
    S, T = logits.shape
    scores = logits.float().masked_fill(torch.isnan(logits), float("-inf"))
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :topk]  # ties: lower index first
    chosen = torch.gather(scores, 1, order)
    out = torch.where(chosen > float("-inf"), order, torch.full_like(order, -1)).to(torch.int32)
    if out.shape[1] < topk:  # fewer keys than topk in total: pad to the fixed width
        out = torch.cat((out, out.new_full((S, topk - out.shape[1]), -1)), dim=1)
    return out
