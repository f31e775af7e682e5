"""The DSA attention layer: MLA projections + lightning indexer + top-k + sparse MLA, against a ``LayerCache``.

Shape legend: B batch rows, S new tokens, T cached tokens of a row, D hidden, Q q_lora_rank, H heads,
N qk_nope_head_dim, R qk_rope_head_dim, L kv_lora_rank, V v_head_dim, K index_topk.

Per layer (DeepSeek-V3.2-Exp ``inference/model.py::MLA``; vLLM ``DeepseekV2MLAAttention`` + ``MLAAttention``):
    q_latent = q_a_layernorm(q_a_proj(x))                      [B,S,Q]  (also the indexer's query input)
    q        = q_b_proj(q_latent) → q_nope [B,S,H,N], q_pe [B,S,H,R] (RoPE)
    kv       = kv_a_proj_with_mqa(x) → c_kv = kv_a_layernorm(.) [B,S,L], k_pe [B,S,R] (RoPE)
    cache   ← [c_kv | k_pe] at slot = position; indexer keys likewise (quantized on insertion)
    indices  = top-k of the indexer logits (or the previous full layer's, for a "shared" layer)
    o        = sparse MLA over the selected cache rows; o_proj
Everything is written to the cache first and read back (prefill and decode alike), so a quantized cache form affects
prefill and decode identically, as in vLLM where sparse prefill also reads the cache.

An fp8 query (``QueryForm.fp8_query``: the backend consumes the absorbed query quantized with the static per-tensor
``q_scale``) is applied in the dense baseline too, which then runs in the absorbed form (``dense_mqa``), so that
"sparse == dense while every key fits (T <= index_topk)" holds for every cache format x query format. The
non-absorbed (MHA) form has no absorbed query to quantize and refuses that combination.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .config import DsaConfig
from .fp8 import dequantize_fp8_tensor, quantize_fp8_tensor
from .indexer import Indexer, indexer_logits
from .injections import CORRECT, Defect
from .kv_cache import LayerCache, QueryForm
from .layers import RMSNorm
from .rope import apply_rope
from .sparse_mla import absorb_query, dense_mla, dense_mqa, sparse_mla, sparse_mla_mha, split_kv_b, unabsorb_output


@dataclass
class AttentionInputs:
    """Per-forward inputs every attention layer needs besides its hidden states.

    ``positions [B,S]`` long; ``cos/sin [B,S,R/2]`` fp32 (one shared table); ``form`` and ``q_scale`` from the cache;
    ``dense``: attend to every causal key instead of the selected ones (the comparison baseline).
    """

    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    form: QueryForm
    q_scale: float
    dense: bool


class DsaAttention(nn.Module):
    """MLA with DSA. HF names: ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``, ``kv_a_proj_with_mqa``,
    ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``, ``indexer.*`` (absent on "shared" top-k layers, as vLLM builds them).

    ``mla_form``: ``"absorbed"`` (MQA over the latent cache, the FlashMLA contract; default) or ``"mha"`` (expand keys
    and values per head). ``last_topk``: the ``[B,S,K]`` int32 indices of the latest sparse forward (a debugging aid).
    ``defect``: the calibration defect its indexer keys, selection and softmax scale go through (:mod:`.injections`;
    the identity by default).
    """

    defect: Defect = CORRECT

    def __init__(self, config: DsaConfig, layer_idx: int):
        super().__init__()
        D, Q, H = config.hidden_size, config.q_lora_rank, config.num_attention_heads
        N, R, L, V = config.qk_nope_head_dim, config.qk_rope_head_dim, config.kv_lora_rank, config.v_head_dim
        self.n_heads, self.nope_dim, self.rope_dim, self.kv_lora_rank, self.v_dim = H, N, R, L, V
        self.index_topk = config.index_topk
        self.rope_interleave = config.rope_interleave
        self.softmax_scale = config.softmax_scale
        self.mla_form = "absorbed"
        self.q_a_proj = nn.Linear(D, Q, bias=False)
        self.q_a_layernorm = RMSNorm(Q, config.rms_norm_eps)
        self.q_b_proj = nn.Linear(Q, H * (N + R), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(D, L + R, bias=False)
        self.kv_a_layernorm = RMSNorm(L, config.rms_norm_eps)
        self.kv_b_proj = nn.Linear(L, H * (N + V), bias=False)
        self.o_proj = nn.Linear(H * V, D, bias=False)
        self.indexer = Indexer(config) if config.indexer_type(layer_idx) == "full" else None
        self.last_topk: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, inp: AttentionInputs, cache: LayerCache,
                shared_topk: torch.Tensor | None = None,
                skip_topk: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x [B,S,D]`` (normed hidden) → ``(out [B,S,D], topk [B,S,K] int32 or None when dense)``.

        ``shared_topk``: the previous full layer's indices, required on a "shared" layer in sparse mode.
        ``skip_topk``: a full layer uses ``shared_topk`` instead of its own selection (its indexer keys are still
        cached): vLLM's ``skip_topk``, which the MTP proposer sets on draft steps >= 1 under GLM's
        ``index_share_for_mtp_iteration``.
        Raises ValueError when a shared layer gets no indices, or for ``mla_form="mha"`` with an fp8 query form.
        """
        B, S, _ = x.shape
        H, N, R, L, V = self.n_heads, self.nope_dim, self.rope_dim, self.kv_lora_rank, self.v_dim
        cos, sin = inp.cos, inp.sin
        q_latent = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_latent).view(B, S, H, N + R)
        q_nope, q_pe = q[..., :N], q[..., N:]
        q_pe = apply_rope(q_pe, cos[:, :, None], sin[:, :, None], interleaved=self.rope_interleave)
        kv = self.kv_a_proj_with_mqa(x)
        c_kv = self.kv_a_layernorm(kv[..., :L])
        k_pe = apply_rope(kv[..., L:], cos, sin, interleaved=self.rope_interleave)
        assert q_nope.shape == (B, S, H, N) and q_pe.shape == (B, S, H, R) and c_kv.shape == (B, S, L)
        assert k_pe.shape == (B, S, R) and inp.positions.shape == (B, S)
        idx_proj = self.indexer(x, q_latent, cos, sin) if self.indexer is not None else None
        if (self.indexer is None or skip_topk) and shared_topk is None and not inp.dense:
            raise ValueError("a shared top-k layer (or skip_topk) needs the indices to reuse")
        if self.mla_form == "mha" and inp.form.fp8_query:
            raise ValueError("mla_form: 'mha' cannot consume an fp8 query (backend_supports_quant_query with an fp8 "
                             "cache); use mla_form='absorbed'")
        w_uk, w_uv = split_kv_b(self.kv_b_proj.weight, H, N, V)

        outs, topks = [], []
        for b in range(B):  # rows are independent sequences; everything below works on flat [S, ...] tensors
            pos = inp.positions[b]
            length, key_end = int(pos.max()) + 1, pos + 1  # keys at slot == position: causal = slot <= own position
            cache.write(b, pos, c_kv[b], k_pe[b])
            if idx_proj is not None:
                cache.write_index_keys(b, pos, idx_proj.k[b])
            kv_rows = cache.read(b, length, inp.form)  # [T, L+R]
            if inp.dense and not inp.form.fp8_query:
                outs.append(dense_mla(q_nope[b], q_pe[b], kv_rows, key_end, w_uk, w_uv, self.softmax_scale))
                continue
            if inp.dense:
                q_lat = self._latent_query(q_nope[b], q_pe[b], w_uk, inp)
                outs.append(unabsorb_output(dense_mqa(q_lat, kv_rows, key_end, self.softmax_scale, L), w_uv))
                continue
            if idx_proj is not None and not skip_topk:
                keys, end = self.defect.index_keys(cache.read_index_keys(b, length), key_end, None,
                                                   torch.tensor([length - 1]))
                indices = self.defect.select(indexer_logits(idx_proj.q[b], keys, idx_proj.weights[b], end),
                                             self.index_topk)
            else:
                indices = shared_topk[b]
            topks.append(indices)
            if self.mla_form == "mha":
                outs.append(sparse_mla_mha(q_nope[b], q_pe[b], kv_rows, indices, w_uk, w_uv,
                                           self.defect.softmax_scale(self.softmax_scale)))
                continue
            q_lat = self._latent_query(q_nope[b], q_pe[b], w_uk, inp)  # [S,H,L+R]
            o_lat = sparse_mla(q_lat, kv_rows, indices, self.defect.softmax_scale(self.softmax_scale), L)  # [S,H,L]
            outs.append(unabsorb_output(o_lat, w_uv))
        o = torch.stack(outs)
        assert o.shape == (B, S, H, V)
        o = o.reshape(B, S, H * V)
        topk = torch.stack(topks) if topks else None
        self.last_topk = topk
        return self.o_proj(o), topk

    @staticmethod
    def _latent_query(q_nope: torch.Tensor, q_pe: torch.Tensor, w_uk: torch.Tensor,
                      inp: AttentionInputs) -> torch.Tensor:
        """The absorbed query ``[S,H,L+R]`` as the backend consumes it: fake-quantized to fp8 with the static
        per-tensor ``q_scale`` when ``inp.form.fp8_query`` (vLLM ``_q_scale``), else as computed."""
        q_lat = absorb_query(q_nope, q_pe, w_uk)
        if not inp.form.fp8_query:
            return q_lat
        return dequantize_fp8_tensor(quantize_fp8_tensor(q_lat, inp.q_scale), inp.q_scale).to(q_lat.dtype)
