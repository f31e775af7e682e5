"""A batched, differentiable forward of :class:`dsa_route.dsa.DsaForCausalLM` for training, on the model's own modules.

Shape legend: B rows (one problem each, right-padded), S tokens, T = S keys, D hidden, H heads, N qk_nope_head_dim,
R qk_rope_head_dim, L kv_lora_rank, V v_head_dim, HI index heads, I index_head_dim, K index_topk, W vocab.

The reference forward works row by row through a KV cache under ``no_grad``; this one computes the same maths for a
whole padded batch at once with autograd: the parameters are the reference modules' own (``model.model.layers[i]
.self_attn.q_a_proj`` ...), so a trained model is saved with ``save_pretrained`` and loads unchanged in
``DsaForCausalLM``, in ``dsa_route.vllm_cpu`` and by vLLM's loader. Per attention layer (``dsa.attention`` docstring):

    q_latent, q_nope, q_pe, c_kv, k_pe           as DsaAttention (the MLA projections, RoPE)
    scores[b,h,s,t] = (q_nope·W_UK c_kv[t] + q_pe·k_pe[t]) · softmax_scale        the MHA form of MLA (sparse_mla_mha)
    visible         = causal ∧ both tokens real;  sparse: visible ∧ t ∈ top-K of the indexer logits of s
    out             = softmax(scores | visible) · W_UV c_kv                       then o_proj

The indexer runs the reference ``Indexer`` projections on *detached* inputs with its FP8 fake-quantization off (the
rounding has no gradient; the reference and vLLM keep it at inference), and returns the per-query KL loss of the
DeepSeek-V3.2-Exp report §2.1 (arXiv:2512.02556 / the V3.2-Exp tech report, "Continued Pre-Training"):

    p[s,:]  = Σ_h softmax(scores)[h,s,:], L1-normalized                           the main attention's distribution
    dense warm-up:  L_I = Σ_s KL(p[s,:] ‖ softmax(I[s,:]))           over the visible keys
    sparse stage:   L_I = Σ_s KL(p[s,S_s] ‖ softmax(I[s,S_s]))       restricted to the selected set S_s = top-K(I[s,:])

``p`` is detached and the indexer's inputs are detached, so L_I trains only the indexer and the language-model loss
only the rest (§2.1: "we detach the indexer input from the computational graph for separate optimization").

Cost (this 2-core AVX2 VM, 2026-12-05): the indexer's ``[B,S,HI,T]`` ReLU scores dominate a long batch (HI = 16 heads
against H = 4 attention heads). In the sparse stage only the selected keys' logits carry a gradient (``I[s,S_s]``),
so the full ``I[s,:]`` is computed without autograd (for the choice of S_s) and the logits at S_s again with autograd
on the gathered keys (:func:`selected_index_logits`, ``[B,S,HI,K]``): the same L_I and the same gradients as the
masked dense form (``tests/test_tiny_arith.py``), a third of the indexer's work at S = 300. Sums, not means
(:class:`ForwardOut`), let a trainer split a batch into length buckets (less padding) and still take the whole batch's
mean loss.

MTP (DeepSeek-V3 tech report arXiv:2412.19437 §2.2; ``dsa.mtp.MTPLayer.predict``): at position i the MTP layer reads
``embed(t[i+1])`` (zero at position 0, as vLLM) and the main model's final-normed hidden ``h[i]`` and predicts
``t[i+2]``; its embedding and head are the main model's during training (``tie_mtp_`` copies them before saving).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dsa_route.dsa import DsaForCausalLM
from dsa_route.dsa.block import DecoderLayer
from dsa_route.dsa.rope import apply_rope
from dsa_route.dsa.sparse_mla import split_kv_b


@dataclass
class ForwardOut:
    """``logits fp32 [B,S,W]``, ``mtp_logits fp32 [B,S-1,W]`` (position i predicts token i+2; None without MTP),
    ``indexer_kl_sum`` fp32 ``[layers]`` (per attention layer, the MTP layer last, the per-query KL summed over the
    real query rows) and ``indexer_rows`` fp32 ``[layers]`` (those rows' count)."""

    logits: torch.Tensor
    mtp_logits: torch.Tensor | None
    indexer_kl_sum: torch.Tensor
    indexer_rows: torch.Tensor

    @property
    def indexer_kl(self) -> torch.Tensor:
        """fp32 scalar: the mean over layers of the mean per-query KL."""
        return (self.indexer_kl_sum / self.indexer_rows.clamp_min(1)).mean()


def indexer_projection(attn, x: torch.Tensor, q_latent: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The reference ``Indexer`` projections (:class:`dsa_route.dsa.indexer.IndexerProjection`: ``q fp32 [B,S,HI,I]``,
    ``k [B,T,I]``, ``weights fp32 [B,S,HI]``) of ``x [B,S,D]`` and ``q_latent [B,S,Q]``, FP8 rounding off."""
    indexer = attn.indexer
    use_fp8, indexer.use_fp8 = indexer.use_fp8, False
    try:
        return indexer(x, q_latent, cos, sin)
    finally:
        indexer.use_fp8 = use_fp8


def dense_index_logits(proj) -> torch.Tensor:
    """Indexer logits ``fp32 [B,S,T]`` (unmasked) of a projection: ``Σ_h w[s,h]·ReLU(q[s,h]·k[t])``."""
    scores = torch.einsum("bshi,bti->bsht", proj.q.float(), proj.k.float()).relu()
    return torch.einsum("bsht,bsh->bst", scores, proj.weights)


def selected_index_logits(proj, idx: torch.Tensor) -> torch.Tensor:
    """Indexer logits ``fp32 [B,S,K]`` at the keys ``idx long [B,S,K]`` of each query only: ``Σ_h w[s,h]·ReLU(q[s,h]·
    k[idx[s,j]])`` on the gathered keys ``[B,S,K,I]`` — entry for entry :func:`dense_index_logits` ``.gather(-1, idx)``
    with HI·K instead of HI·T products per query."""
    B = idx.shape[0]
    keys = proj.k.float()[torch.arange(B, device=idx.device)[:, None, None], idx]  # [B,S,K,I]
    scores = torch.einsum("bshi,bski->bshk", proj.q.float(), keys).relu()
    return torch.einsum("bshk,bsh->bsk", scores, proj.weights)


def indexer_scores(attn, x: torch.Tensor, q_latent: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor) -> torch.Tensor:
    """Indexer logits ``fp32 [B,S,T]`` (unmasked): ``Σ_h w[s,h]·ReLU(q[s,h]·k[t])`` from the reference ``Indexer``
    projections of ``x [B,S,D]`` and ``q_latent [B,S,Q]``, FP8 rounding off."""
    return dense_index_logits(indexer_projection(attn, x, q_latent, cos, sin))


def topk_keys(index_logits: torch.Tensor, visible: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-``k`` visible keys of each query by ``index_logits [B,S,T]``: ``(idx long [B,S,min(k,T)], valid bool
    [B,S,min(k,T)])``, ``valid`` false where a query has fewer than ``k`` visible keys (those entries index invisible
    keys). No gradient. Ties as :func:`select_topk`."""
    masked = index_logits.detach().masked_fill(~visible, float("-inf"))
    values, idx = masked.topk(min(k, masked.shape[-1]), dim=-1, sorted=False)
    return idx, values > float("-inf")


def select_topk(index_logits: torch.Tensor, visible: torch.Tensor, k: int) -> torch.Tensor:
    """``bool [B,S,T]``: the top-``k`` visible keys of each query by ``index_logits [B,S,T]`` (all visible keys when
    fewer than ``k``). Ties are broken by ``torch.topk`` here, by lower key index in ``dsa.topk`` (exact ties of fp32
    logits do not occur in trained models)."""
    idx, valid = topk_keys(index_logits, visible, k)
    return torch.zeros_like(visible).scatter_(-1, idx, valid)


def _kl_rows(p: torch.Tensor, logq: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean over ``rows [B,S]`` of ``Σ_t p·(log p − log q)``; entries with ``p == 0`` contribute 0."""
    return _kl_sum(p, logq, rows) / rows.sum().clamp_min(1)


def _kl_sum(p: torch.Tensor, logq: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Sum over ``rows [B,S]`` (0/1) of ``Σ_t p·(log p − log q)`` (``p``, ``logq [B,S,T]``); ``p == 0`` adds 0."""
    kl = torch.where(p > 0, p * (p.clamp_min(1e-30).log() - logq.clamp_min(-1e4)), torch.zeros_like(p)).sum(-1)
    return (kl * rows).sum()


def attention_train(attn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor,
                    sparse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One DSA attention layer over a padded batch: ``x [B,S,D]`` (normed hidden), ``cos/sin [B,S,R/2]``,
    ``visible bool [B,S,T]`` (causal ∧ real tokens) → ``(out [B,S,D], indexer KL summed over the real query rows fp32
    scalar, their count fp32 scalar)``. ``sparse``: attend only to the indexer's top-``index_topk``; otherwise dense
    (the warm-up)."""
    B, S, _ = x.shape
    H, N, R, L, V = attn.n_heads, attn.nope_dim, attn.rope_dim, attn.kv_lora_rank, attn.v_dim
    q_latent = attn.q_a_layernorm(attn.q_a_proj(x))
    q = attn.q_b_proj(q_latent).view(B, S, H, N + R)
    q_nope = q[..., :N]
    q_pe = apply_rope(q[..., N:], cos[:, :, None], sin[:, :, None], interleaved=attn.rope_interleave)
    kv = attn.kv_a_proj_with_mqa(x)
    c_kv = attn.kv_a_layernorm(kv[..., :L])
    k_pe = apply_rope(kv[..., L:], cos, sin, interleaved=attn.rope_interleave)
    w_uk, w_uv = split_kv_b(attn.kv_b_proj.weight, H, N, V)
    k_nope = torch.einsum("btl,hnl->bhtn", c_kv, w_uk.to(c_kv.dtype))
    v = torch.einsum("btl,hvl->bhtv", c_kv, w_uv.to(c_kv.dtype))
    scores = (torch.einsum("bshn,bhtn->bhst", q_nope, k_nope).float()
              + torch.einsum("bshr,btr->bhst", q_pe, k_pe).float()) * attn.softmax_scale  # [B,H,S,T]
    proj = indexer_projection(attn, x.detach(), q_latent.detach(), cos, sin)
    if sparse:  # the choice of S_s needs every key's logit, the gradient only the chosen ones'
        with torch.no_grad():
            idx, valid = topk_keys(dense_index_logits(proj), visible, attn.index_topk)  # [B,S,K]
        keys = torch.zeros_like(visible).scatter_(-1, idx, valid)  # [B,S,T]
        index_logits = selected_index_logits(proj, idx)  # [B,S,K]
    else:
        keys = visible
        index_logits = dense_index_logits(proj)  # [B,S,T]
    probs = torch.softmax(scores.masked_fill(~keys[:, None], float("-inf")), dim=-1)
    rows = visible.any(-1)  # [B,S] real query tokens
    probs = torch.where(rows[:, None, :, None], probs, torch.zeros_like(probs))  # padded queries: no NaN rows
    out = torch.einsum("bhst,bhtv->bshv", probs.to(v.dtype), v).reshape(B, S, H * V)
    target = probs.detach().sum(1)
    target = target / target.sum(-1, keepdim=True).clamp_min(1e-30)  # [B,S,T], zero outside `keys`
    if sparse:
        target = target.gather(-1, idx) * valid  # [B,S,K]
        logq = torch.log_softmax(index_logits.masked_fill(~valid, float("-inf")), dim=-1)
    else:
        logq = torch.log_softmax(index_logits.masked_fill(~keys, float("-inf")), dim=-1)
    rows = rows.float()
    return attn.o_proj(out), _kl_sum(target, logq, rows), rows.sum()


def layer_train(layer: DecoderLayer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor,
                sparse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``DecoderLayer.forward`` (pre-norm attention and MLP/MoE, residuals) on a padded batch → ``(h, indexer KL sum,
    rows)`` (:func:`attention_train`)."""
    attn, kl, rows = attention_train(layer.self_attn, layer.input_layernorm(h), cos, sin, visible, sparse)
    h = h + attn
    return h + layer.mlp(layer.post_attention_layernorm(h)), kl, rows


def forward_train(model: DsaForCausalLM, input_ids: torch.Tensor, lengths: torch.Tensor, *, sparse: bool,
                  with_mtp: bool = True) -> ForwardOut:
    """``input_ids long [B,S]`` (right-padded), ``lengths long [B]`` (real tokens per row) → :class:`ForwardOut`.
    Every row starts at position 0, as a served prompt does. Raises ValueError on a shared top-k layer (this model
    family's GLM variant is not trained here)."""
    cfg = model.config
    if "shared" in cfg.indexer_types:
        raise ValueError("forward_train: shared top-k layers are not supported")
    B, S = input_ids.shape
    positions = torch.arange(S, device=input_ids.device).expand(B, S)
    cos, sin = model.rope.cos_sin(positions)
    real = positions < lengths[:, None]  # [B,S]
    visible = torch.tril(torch.ones(S, S, dtype=torch.bool, device=input_ids.device))[None] & real[:, None, :]
    visible = visible & real[:, :, None]
    h = model.model.embed_tokens(input_ids)
    kls, counts = [], []
    for layer in model.decoder_layers:
        h, kl, rows = layer_train(layer, h, cos, sin, visible, sparse)
        kls.append(kl)
        counts.append(rows)
    hidden = model.model.norm(h)
    logits = model.lm_head(hidden).float()
    mtp_logits = None
    if with_mtp and model.mtp_layers:
        mtp = model.mtp_layers[0]
        e = model.model.embed_tokens(input_ids[:, 1:])  # token i+1 at position i
        e = torch.where(positions[:, :-1, None] == 0, torch.zeros_like(e), e)
        hm = mtp.eh_proj(torch.cat((mtp.enorm(e), mtp.hnorm(hidden[:, :-1])), dim=-1))
        hm, kl, rows = layer_train(mtp, hm, cos[:, :-1], sin[:, :-1], visible[:, 1:, 1:] & visible[:, :-1, :-1],
                                   sparse)
        kls.append(kl)
        counts.append(rows)
        mtp_logits = model.lm_head(mtp.shared_head.norm(hm)).float()
    return ForwardOut(logits, mtp_logits, torch.stack(kls), torch.stack(counts))


@torch.no_grad()
def tie_mtp_(model: DsaForCausalLM) -> DsaForCausalLM:
    """Copy the main embedding and LM head into each MTP layer's ``embed_tokens`` / ``shared_head.head`` (trained
    shared, stored separately in HF checkpoints)."""
    for layer in model.mtp_layers:
        layer.embed_tokens.weight.copy_(model.model.embed_tokens.weight)
        layer.shared_head.head.weight.copy_(model.lm_head.weight)
    return model


def lm_loss_sums(out: ForwardOut, input_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``fp32 [4]``: the weighted next-token cross-entropy summed, its weight, the next-next-token (MTP) one summed,
    its weight (0, 0 without MTP). ``weights [B,S]``: the weight of predicting token s (0 for padding and the first
    token). Summing these over the parts of a batch and dividing gives :func:`lm_losses` of the whole batch."""
    ce = F.cross_entropy(out.logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none")
    lm = torch.stack(((ce * weights[:, 1:]).sum(), weights[:, 1:].sum()))
    if out.mtp_logits is None:
        return torch.cat((lm, torch.zeros(2)))
    ce2 = F.cross_entropy(out.mtp_logits[:, :-1].transpose(1, 2), input_ids[:, 2:], reduction="none")
    return torch.cat((lm, torch.stack(((ce2 * weights[:, 2:]).sum(), weights[:, 2:].sum()))))


def lm_losses(out: ForwardOut, input_ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted next-token and next-next-token cross-entropies (fp32 scalars). ``weights [B,S]``: the weight of
    predicting token s (0 for padding and the first token)."""
    sums = lm_loss_sums(out, input_ids, weights)
    return sums[0] / sums[1].clamp_min(1e-9), sums[2] / sums[3].clamp_min(1e-9)
