"""The tensor side of the calibration injections (:mod:`dsa_route.inject`): the two DSA defects.

Shape legend: S queries, T keys.
"""

from __future__ import annotations

import torch

from .indexer import Indexer
from .topk import topk_indices


def random_topk_indices(logits: torch.Tensor, topk: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``topk-random``: ``logits [S, T]`` (``-inf`` = not visible) → ``int32 [S, topk]`` with the contract of
    :func:`dsa_route.dsa.topk.topk_indices` (ascending, distinct, ``-1`` padded), the ``min(topk, visible)`` keys of
    each row drawn uniformly without replacement from its visible keys (uniform scores, then the real top-k)."""
    noise = torch.rand(logits.shape, generator=generator, dtype=torch.float32).to(logits.device)
    return topk_indices(noise.masked_fill(logits == float("-inf"), float("-inf")), topk)


def flip_indexer_rope_(model: torch.nn.Module) -> int:
    """``indexer-rope-flip``, in place: every :class:`dsa_route.dsa.indexer.Indexer` of ``model`` switches its RoPE
    pair layout (half-split ↔ interleaved); a second call restores it. Returns the number of indexers flipped."""
    flipped = 0
    for module in model.modules():
        if isinstance(module, Indexer):
            module.interleaved_rope = not module.interleaved_rope
            flipped += 1
    return flipped
