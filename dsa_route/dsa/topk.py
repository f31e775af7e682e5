"""Top-k selection of the keys each query attends to.

Shape legend: S queries, T keys, K = index_topk.

Contract (vLLM ``topk_indices_buffer [num_tokens, index_topk]`` int32, consumed by FlashMLA sparse; DeepSeek-V3.2-Exp
``Indexer.forward``: ``topk(min(index_topk, end_pos))``):
  - row s holds ``min(K, valid_s)`` distinct indices of keys it may see (``valid_s`` = number of non ``-inf`` logits),
    in ascending key order, followed by ``-1`` padding up to width K (kernels treat a row as a set; ascending order
    makes the output a pure function of the set);
  - ties are broken deterministically: among equal scores the lower key index wins, so the same logits always give
    the same set on every device (the set a stable descending sort would take);
  - NaN ranks highest, as in ``torch.topk`` / ``torch.sort``: a NaN logit is selected, never silently dropped, so a
    poisoned indexer key or query surfaces downstream instead of being hidden.

Implementation: an unsorted ``torch.topk`` (a partial selection, much cheaper than a full stable sort of T scores), then
a tie fix-up: only rows whose k-th score also occurs outside the selection (ties straddling the boundary) are
re-selected with a stable sort; finally the K selected indices in ascending order, read off a ``[S, T]`` selection mask
(a sort only for rows padded with invisible keys). ``python -m dsa_route.dsa.bench`` prints its cost.
"""

from __future__ import annotations

import torch


def topk_indices(logits: torch.Tensor, topk: int) -> torch.Tensor:
    """Select up to ``topk`` keys per row of ``logits [S, T]`` (fp32, ``-inf`` = not visible; see module contract).

    Returns ``int32 [S, topk]``: ascending key indices into the T axis, ``-1`` padding where a row has fewer than
    ``topk`` visible keys. Raises ValueError when ``topk <= 0``.
    """
    if topk <= 0:
        raise ValueError(f"topk_indices: topk must be > 0, got {topk}")
    S, T = logits.shape
    scores = logits.float()
    k = min(topk, T)
    values, order = torch.topk(scores, k, dim=-1, sorted=False)  # the k highest, NaN first, in no particular order
    boundary = values.amin(dim=-1, keepdim=True)  # [S,1] the k-th score; NaN in a row that selected a NaN
    if bool(torch.isnan(boundary).any()):  # NaN selected: the k-th score is the last of the sorted top-k
        values, order = torch.topk(scores, k, dim=-1)
        boundary = values[:, -1:]
    if bool(torch.isnan(boundary).any()):  # k or more NaNs: compare NaN-aware (NaN ranks as one value)
        in_row = torch.isnan(scores).sum(-1) + (scores == boundary).sum(-1)
        in_top = torch.isnan(values).sum(-1) + (values == boundary).sum(-1)
    else:
        in_row, in_top = (scores == boundary).sum(-1), (values == boundary).sum(-1)
    straddles = (in_row > in_top) & (boundary[:, 0] != float("-inf"))  # tied -inf entries are padding anyway
    if bool(straddles.any()):  # lower index wins among the boundary ties: a stable sort of just those rows
        rows = straddles.nonzero()[:, 0]
        order[rows] = torch.sort(scores[rows], dim=-1, descending=True, stable=True).indices[:, :k]
        values = torch.gather(scores, 1, order)
    if bool((boundary == float("-inf")).any()):  # invisible entries sort last, then become -1
        order = torch.sort(torch.where(values == float("-inf"), T, order), dim=-1).values
        out = torch.where(order == T, -1, order).to(torch.int32)
    else:  # every row holds k distinct visible keys: ascending order from a mask, cheaper than a sort
        selected = torch.zeros(S, T, dtype=torch.bool, device=logits.device).scatter_(1, order, True)
        out = selected.nonzero()[:, 1].view(S, k).to(torch.int32)
    if k < topk:  # fewer keys than topk in total: pad to the fixed width
        out = torch.cat((out, out.new_full((S, topk - k), -1)), dim=1)
    return out
