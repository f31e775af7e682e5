"""Multi-head latent attention over a selected subset of cached tokens (sparse MLA), in its two algebraic forms.

Shape legend: S queries, T cached tokens, K selected per query (index_topk), H heads, L kv_lora_rank, R rope dims,
N qk_nope_head_dim, V v_head_dim.

The cache holds one latent row per token: ``[c_kv (L) | k_pe (R)]`` (DeepSeek-V2 paper arXiv:2405.04434 §2.1.2;
vLLM MLA cache "576" layout at L=512, R=64). ``kv_b_proj.weight [H·(N+V), L]`` splits per head into ``W_UK [H,N,L]``
and ``W_UV [H,V,L]``.

  absorbed (MQA) form — what FlashMLA's sparse kernels compute
  (``flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v)``):
      q_lat = [q_nope · W_UK  (L) | q_pe (R)]          one shared "KV head" of width L+R
      p     = softmax(q_lat · kv[idx] · scale)          over the selected rows only
      o_lat = p · c_kv[idx]  (L)          then  o = o_lat · W_UVᵀ  (V)   and the caller applies o_proj
  non-absorbed (MHA) form — DeepSeek-V3.2-Exp ``MLA.forward`` prefill branch:
      k = [W_UK · c_kv | k_pe], v = W_UV · c_kv per head, ordinary softmax attention over the same rows.
Both are the same function of the inputs (matrix associativity); tests check they agree.

softmax scale: ``qk_head_dim^-0.5 · mscale²`` (``DsaConfig.softmax_scale``).
"""

from __future__ import annotations

import torch


def split_kv_b(kv_b_weight: torch.Tensor, n_heads: int, nope_dim: int, v_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``kv_b_proj.weight [H·(N+V), L]`` → ``(W_UK [H,N,L], W_UV [H,V,L])`` (vLLM ``MLACommonImpl`` W_UK/W_UV split)."""
    w = kv_b_weight.view(n_heads, nope_dim + v_dim, kv_b_weight.shape[-1])
    return w[:, :nope_dim], w[:, nope_dim:]


def absorb_query(q_nope: torch.Tensor, q_pe: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """``q_nope [S,H,N]``, ``q_pe [S,H,R]``, ``W_UK [H,N,L]`` → absorbed query ``[S,H,L+R]`` (fp32 accumulate,
    q dtype)."""
    q_lat = torch.einsum("shn,hnl->shl", q_nope.float(), w_uk.float())
    return torch.cat((q_lat, q_pe.float()), dim=-1).to(q_nope.dtype)


def unabsorb_output(o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """``o_lat [S,H,L]`` · ``W_UV [H,V,L]``ᵀ → ``[S,H,V]`` (fp32 accumulate, o_lat dtype)."""
    return torch.einsum("shl,hvl->shv", o_lat.float(), w_uv.float()).to(o_lat.dtype)


def gather_selected(kv: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``kv [T, C]`` named by ``indices [S, K]`` → ``(rows fp32 [S,K',C], valid bool [S,K'])``.

    Columns that are ``-1`` in every row are dropped first (K' <= K; they select nothing). Only slots named by a
    non-negative index are read; other ``-1`` entries become zero rows without touching the cache (a poisoned,
    never-selected slot cannot leak into the result). Raises IndexError for an index ``>= T``.
    """
    keep = (indices >= 0).any(dim=0)
    if not bool(keep.all()):
        indices = indices[:, keep]
    S, K = indices.shape
    valid = indices >= 0
    if bool(valid.all()):  # the common case past index_topk tokens: one plain gather
        return kv.index_select(0, indices.reshape(-1).long()).view(S, K, -1).float(), valid
    rows = torch.zeros(S, K, kv.shape[-1], dtype=torch.float32, device=kv.device)
    rows[valid] = kv[indices[valid].long()].float()
    return rows, valid


def sparse_mla(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, softmax_scale: float, kv_lora_rank: int,
               *, return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Absorbed sparse MLA (the FlashMLA sparse contract).

    Args:
        q: ``[S, H, L+R]`` absorbed queries (``absorb_query``).
        kv: ``[T, L+R]`` latent cache rows of this sequence (or a flat multi-sequence array), dequantized.
        indices: ``[S, K]`` int rows into ``kv``; ``-1`` = unused.
        softmax_scale: multiplies ``q·k`` before the softmax.
        kv_lora_rank: L; the first L columns of ``kv`` are also the values.
        return_lse: also return the log-sum-exp ``[S, H]`` fp32 (natural log; ``-inf`` for empty rows).

    Returns:
        ``o_lat [S, H, L]`` in ``q.dtype`` (fp32 softmax and accumulation). A row whose indices are all ``-1`` yields
        zeros (FlashMLA convention).
    """
    S, H, C = q.shape
    assert kv.shape[-1] == C and indices.shape[0] == S, (q.shape, kv.shape, indices.shape)
    rows, valid = gather_selected(kv, indices)  # [S,K,C], [S,K]
    scores = torch.matmul(q.float() * softmax_scale, rows.transpose(1, 2))  # [S,H,K]
    out, lse = _softmax_values(scores, valid[:, None, :], rows[..., :kv_lora_rank], return_lse)
    out = out.to(q.dtype)
    assert out.shape == (S, H, kv_lora_rank)
    return (out, lse) if return_lse else out


def _softmax_values(scores: torch.Tensor, visible: torch.Tensor, values: torch.Tensor,
                    return_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``softmax(scores) · values`` over the key axis: ``scores [S,H,K]`` fp32, ``visible`` broadcastable to it,
    ``values [S,K,L]`` → ``(out fp32 [S,H,L], lse [S,H] or None)``. A row with no visible key gives zeros and
    ``lse = -inf``. When every key is visible (decode past index_topk) no mask is materialised."""
    if bool(visible.all()) and not return_lse:
        return torch.matmul(torch.softmax(scores, dim=-1), values), None
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [S,H]
    probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])  # masked → exp(-inf) = 0
    return torch.matmul(probs, values), lse


def sparse_mla_mha(q_nope: torch.Tensor, q_pe: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                   w_uk: torch.Tensor, w_uv: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """Non-absorbed sparse MLA: expand the selected latents into per-head keys/values, then softmax attention.

    ``q_nope [S,H,N]``, ``q_pe [S,H,R]``, ``kv [T,L+R]``, ``indices [S,K]`` (``-1`` unused), ``W_UK [H,N,L]``,
    ``W_UV [H,V,L]`` → ``[S,H,V]`` in ``q_nope.dtype``. Empty rows give zeros.
    """
    L = w_uk.shape[-1]
    rows, valid = gather_selected(kv, indices)
    k_nope = torch.einsum("skl,hnl->skhn", rows[..., :L], w_uk.float())
    v = torch.einsum("skl,hvl->skhv", rows[..., :L], w_uv.float())
    scores = (torch.einsum("shn,skhn->shk", q_nope.float(), k_nope)
              + torch.einsum("shr,skr->shk", q_pe.float(), rows[..., L:])) * softmax_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return torch.einsum("shk,skhv->shv", probs, v).to(q_nope.dtype)


def dense_mqa(q: torch.Tensor, kv: torch.Tensor, key_end: torch.Tensor, softmax_scale: float,
              kv_lora_rank: int) -> torch.Tensor:
    """Dense causal MLA in the absorbed form (the dense FlashMLA decode contract): ``q [S,H,L+R]``, ``kv [T,L+R]``,
    ``key_end [S]`` → ``o_lat [S,H,L]`` in ``q.dtype``. No gather: every key ``t < key_end[s]`` is used in place; the
    same softmax (and mask-free fast path) as ``sparse_mla``, so the two differ only in which rows they read."""
    T = kv.shape[0]
    scores = torch.matmul(q.float() * softmax_scale, kv.float().T)  # [S,H,T]
    visible = torch.arange(T, device=kv.device)[None, :] < key_end[:, None]  # [S,T]
    out, _ = _softmax_values(scores, visible[:, None, :], kv[:, :kv_lora_rank].float(), False)
    return out.to(q.dtype)


def dense_mla(q_nope: torch.Tensor, q_pe: torch.Tensor, kv: torch.Tensor, key_end: torch.Tensor,
              w_uk: torch.Tensor, w_uv: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """Dense causal MLA (every key ``t < key_end[s]``), non-absorbed: the comparison baseline, written independently of
    the index machinery. ``q_nope [S,H,N]``, ``q_pe [S,H,R]``, ``kv [T,L+R]``, ``key_end [S]`` → ``[S,H,V]``."""
    L = w_uk.shape[-1]
    T = kv.shape[0]
    latent, k_pe = kv[:, :L].float(), kv[:, L:].float()
    k_nope = torch.einsum("tl,hnl->thn", latent, w_uk.float())
    v = torch.einsum("tl,hvl->thv", latent, w_uv.float())
    scores = (torch.einsum("shn,thn->sht", q_nope.float(), k_nope)
              + torch.einsum("shr,tr->sht", q_pe.float(), k_pe)) * softmax_scale
    visible = torch.arange(T, device=kv.device)[None, :] < key_end[:, None]  # [S,T]
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("sht,thv->shv", probs, v).to(q_nope.dtype)
