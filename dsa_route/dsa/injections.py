"""The tensor side of the calibration defects (:data:`dsa_route.inject.DEFECTS`): one implementation, called at the
same points by the reference model (:mod:`dsa_route.dsa.attention`, ``indexer``, ``mtp``) and by the vLLM CPU classes
(:mod:`dsa_route.vllm_cpu`), which run the same modules over vLLM's pages.

A :class:`Defect` hangs on every :class:`~dsa_route.dsa.attention.DsaAttention`, :class:`~dsa_route.dsa.indexer.Indexer`
and :class:`~dsa_route.dsa.mtp.MTPLayer` of a model (class default :data:`CORRECT`, the identity); :func:`install`
switches one catalogue entry on for a whole model (and back, with ``None``).

Shape legend: S queries, T keys, K = index_topk, H index heads, R rope dims, R requests' newest rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from dsa_route.inject import DEFECTS, TOPK_RANDOM_SEED, DefectSpec

from .fp8 import dequantize_fp8_blocks, pow2_ceil, quantize_fp8_blocks
from .rope import apply_rope
from .topk import topk_indices


@dataclass
class Defect:
    """A :class:`dsa_route.inject.DefectSpec` made executable; ``generator`` seeds the ``random`` selection (one per
    model, as one served model process has one)."""

    spec: DefectSpec
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(TOPK_RANDOM_SEED))

    # ---- indexer ----------------------------------------------------------------------------------------------------
    def indexer_rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                     *, key: bool) -> torch.Tensor:
        """RoPE of the indexer's query ``[B,S,H,R]`` (``key=False``) or key ``[B,S,R]``: the layout flipped on the last
        ``rope_flip_q_heads`` share of query heads, and on the key when ``rope_flip_k``."""
        if key:
            return apply_rope(x, cos, sin, interleaved=interleaved != self.spec.rope_flip_k)
        flip = round(self.spec.rope_flip_q_heads * x.shape[-2])
        keep = x.shape[-2] - flip
        parts = [apply_rope(x[..., :keep, :], cos, sin, interleaved=interleaved)] if keep else []
        if flip:
            parts.append(apply_rope(x[..., keep:, :], cos, sin, interleaved=not interleaved))
        return torch.cat(parts, dim=-2)

    def fp8_query(self, q: torch.Tensor, block: int) -> torch.Tensor:
        """The indexer query as the FP8 kernel multiplies it, fp32: ``dequantize(quantize(q))`` with the ue8m0 scale
        rounded up (correct) or, under ``fp8_scale_floor``, down (values past 448 × scale saturate)."""
        values, scales = quantize_fp8_blocks(q, block)
        if self.spec.fp8_scale_floor:
            exact = quantize_fp8_blocks(q, block, pow2_scale=False)[1]
            scales = torch.where(pow2_ceil(exact) == exact, scales, scales / 2)  # 2^floor(log2(amax/448))
            values = _requantize(q, scales, block)
        return dequantize_fp8_blocks(values, scales)

    def index_keys(self, keys: torch.Tensor, key_end: torch.Tensor, key_start: torch.Tensor | None,
                   newest_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What :func:`dsa_route.dsa.indexer.indexer_logits` scores: ``(keys [T, I], key_end [S])`` as read from the
        cache, with ``stale_newest_key`` (rows ``newest_rows [R]`` read as zeros) and ``visibility_shift`` (each
        query's exclusive key end moved, kept past its first key) applied."""
        if self.spec.stale_newest_key:
            keys = keys.clone()
            keys[newest_rows.long()] = 0
        if self.spec.visibility_shift:
            first = torch.zeros_like(key_end) if key_start is None else key_start
            key_end = torch.maximum(key_end + self.spec.visibility_shift, first + 1)
        return keys, key_end

    # ---- selection --------------------------------------------------------------------------------------------------
    def select(self, logits: torch.Tensor, topk: int) -> torch.Tensor:
        """``logits [S, T]`` → ``int32 [S, topk]`` row sets (``-1`` = unused): the catalogue's selection rule on
        ``topk // topk_divisor`` keys, padded to width ``topk``."""
        rule, k = self.spec.selection, topk // self.spec.topk_divisor
        if rule == "random":
            noise = torch.rand(logits.shape, generator=self.generator, dtype=torch.float32).to(logits.device)
            out = topk_indices(noise.masked_fill(logits == float("-inf"), float("-inf")), k)
        elif rule == "tie-last":  # on the reversed key axis the lower-index tie rule picks the higher index
            flipped = topk_indices(logits.flip(-1), k)
            out = _pad_last(torch.where(flipped >= 0, logits.shape[-1] - 1 - flipped, -1))
        else:
            out = topk_indices(logits, k)
            if rule == "lost-boundary":
                out = _drop_lowest(logits, out, k)
            elif rule == "bin-overflow":
                out = _bin_overflow(logits, k)
            elif rule == "pad-zero":
                out = out.clamp_min(0)
            elif rule == "descending":
                score = torch.where(out >= 0, logits.gather(1, out.clamp_min(0).long()), float("-inf"))
                out = out.gather(1, score.argsort(dim=-1, descending=True, stable=True))
        if out.shape[1] < topk:
            out = torch.cat((out, out.new_full((out.shape[0], topk - out.shape[1]), -1)), dim=1)
        return out.to(torch.int32)

    def softmax_scale(self, scale: float) -> float:
        """The sparse MLA softmax scale actually used."""
        return scale * self.spec.softmax_factor

    # ---- MTP ----------------------------------------------------------------------------------------------------------
    def recycled_hidden(self, h: torch.Tensor, normed: torch.Tensor) -> torch.Tensor:
        """What the MTP draft hands to its next step: ``shared_head.norm(h)`` (``normed``), or ``h`` when
        ``mtp_unnormed``."""
        return h if self.spec.mtp_unnormed else normed


def _requantize(x: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """e4m3 values of ``x [.., D]`` under given block ``scales [.., D/block]``, saturating at ±448."""
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block) / scales[..., None]
    return xb.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).reshape(x.shape)


def _drop_lowest(logits: torch.Tensor, out: torch.Tensor, k: int) -> torch.Tensor:
    """``out [S, K]`` with the lowest-scoring selected key set to ``-1`` (moved last) in every row that had to choose
    (more than ``k`` visible keys: a boundary bin exists)."""
    score = torch.where(out >= 0, logits.gather(1, out.clamp_min(0).long()), float("inf"))
    lowest = score.argmin(dim=-1, keepdim=True)
    enough = (logits != float("-inf")).sum(-1, keepdim=True) > k
    out = out.scatter(1, lowest, torch.where(enough, -1, out.gather(1, lowest)))
    return _pad_last(out)


COARSE_BIN_SHIFT = 8
"""Bits dropped from a score's order-preserving fp16 key to make its coarse bin: 256 bins of sign, exponent and the
2 leading mantissa bits, so [1.0, 1.25) is one bin — the boundary vLLM #51782 measured ("rows whose values all lie
in [1.0, 1.245) ... every element into a single coarse bin")."""


def coarse_bin(scores: torch.Tensor) -> torch.Tensor:
    """``int32`` coarse bin of each fp32 score (higher bin = higher score): the fp16 value's bits made
    order-preserving (negative: all bits flipped; positive: the sign bit set), then the top 8 bits — the stage-1
    histogram of the radix-select top-k kernels (vLLM ``persistent_topk`` / ``top_k_per_row``; AMD aiter
    ``topk_per_row_kernels.cu`` ``extractBinIdx``)."""
    bits = scores.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    key = torch.where(bits >= 0x8000, ~bits & 0xFFFF, bits | 0x8000)
    return key >> COARSE_BIN_SHIFT


def _bin_overflow(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``int32 [S, K]``: the top-k kernel whose threshold-bin stash overflows (vLLM #51782, PRs #52149 / #55314).
    Every key in a coarse bin (:func:`coarse_bin`) above the k-th score's bin is selected; of the keys in that
    threshold bin only the first ones to arrive (key order) reach refinement, as many as the selection still needs —
    the stash's smallest capacity, where the overflow's rows "drop candidates in atomic arrival order" — so tied and
    near-tied keys of the bin are chosen by position, not by score. Rows with ≤ k visible keys are unchanged."""
    visible = logits != float("-inf")
    exact = topk_indices(logits, k)                                                  # [S, K]
    kth = torch.where(exact >= 0, logits.gather(1, exact.clamp_min(0).long()), float("inf")).amin(-1, keepdim=True)
    bins, threshold = coarse_bin(logits), coarse_bin(kth)                           # [S, T], [S, 1]
    above = visible & (bins > threshold)
    in_bin = visible & (bins == threshold)
    need = k - above.sum(-1, keepdim=True)
    chosen = above | (in_bin & (in_bin.cumsum(-1) <= need))
    chosen &= (visible.sum(-1, keepdim=True) > k) | visible                        # short rows: every visible key
    order = torch.where(chosen, torch.arange(logits.shape[-1], device=logits.device), logits.shape[-1])
    picked = order.sort(dim=-1).values[:, :k]
    return torch.where(picked == logits.shape[-1], -1, picked).to(torch.int32)


def _pad_last(out: torch.Tensor) -> torch.Tensor:
    """Rows of ``out [S, K]`` ascending with their ``-1`` entries moved last (the topk contract's order)."""
    big = torch.iinfo(torch.int64).max
    ordered = torch.where(out < 0, big, out.long()).sort(dim=-1).values
    return torch.where(ordered == big, -1, ordered).to(out.dtype)


CORRECT = Defect(DefectSpec(harmful=False, cites="the correct path"))
"""The class default of every hooked module: every hook is the identity."""


def install(model: nn.Module, kind: str | None) -> Defect:
    """Switch catalogue defect ``kind`` (:data:`dsa_route.inject.DEFECTS`) on for every hooked module of ``model``
    (each class whose ``defect`` attribute is a :class:`Defect`: attention, indexer, MTP layer); ``None`` restores the
    correct path. Returns the installed :class:`Defect`. Raises ValueError for a kind not in the catalogue."""
    if kind is not None and kind not in DEFECTS:
        raise ValueError(f"inject: {kind!r} is not a catalogue defect; use one of {', '.join(DEFECTS)}")
    defect = CORRECT if kind is None else Defect(DEFECTS[kind])
    for module in model.modules():
        if isinstance(getattr(type(module), "defect", None), Defect):
            if kind is None:
                module.__dict__.pop("defect", None)
            else:
                module.__dict__["defect"] = defect
    return defect
