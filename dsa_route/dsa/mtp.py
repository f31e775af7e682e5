"""Multi-token prediction (MTP): the draft layer, greedy speculative decoding with it, and vLLM's acceptance metric.

Shape legend: B batch rows, S tokens, D hidden, V vocab, k drafted tokens per round.

MTP layer (DeepSeek-V3 tech report arXiv:2412.19437 §2.2; vLLM ``deepseek_mtp.DeepSeekMultiTokenPredictorLayer``):
    e  = embed_tokens(t_{i+1}), zeroed where position == 0 (vLLM masks position 0)
    h  = eh_proj( cat(enorm(e), hnorm(h_i)) )          h_i: main model's final-normed hidden at position i
    h  = decoder block (own attention + indexer + MoE), at position i
    logits = shared_head.head(shared_head.norm(h));  the next draft step recycles shared_head.norm(h)
Weights live at ``model.layers.{num_hidden_layers + j}.*`` in HF checkpoints: the block's own names plus ``enorm``,
``hnorm``, ``eh_proj``, ``shared_head.{norm,head}`` and ``embed_tokens``. With ``num_speculative_tokens`` > number of
MTP layers the layers are reused cyclically (step j uses layer ``j % num_nextn_predict_layers``, as vLLM).

GLM's ``index_share_for_mtp_iteration`` (``DsaConfig.index_share_for_mtp_iteration``): draft step 0 runs the MTP
layer's indexer, steps >= 1 reuse step 0's top-k of each row's last token instead of selecting their own (vLLM
``v1/spec_decode/llm_base_proposer.py``: ``set_skip_topk(False)`` before step 0, then ``set_skip_topk(True)`` and
``compact_topk_indices(token_indices_to_sample)``). Drafts never change the emitted tokens (greedy verification), only
the acceptance statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from .attention import AttentionInputs
from .block import DecoderLayer
from .config import DsaConfig
from .injections import CORRECT, Defect
from .kv_cache import LayerCache
from .layers import RMSNorm

if TYPE_CHECKING:
    from .model import DsaForCausalLM


class SharedHead(nn.Module):
    """``norm`` (RMSNorm) + ``head`` (the LM head copy stored with each MTP layer)."""

    def __init__(self, config: DsaConfig):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


class MTPLayer(DecoderLayer):
    """A decoder block plus the MTP input fusion and its own head; see module docstring for the maths. ``defect``: the
    calibration defect the recycled hidden goes through (:mod:`.injections`; the identity by default)."""

    defect: Defect = CORRECT

    def __init__(self, config: DsaConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.enorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hnorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.shared_head = SharedHead(config)

    def predict(self, input_ids: torch.Tensor, prev_hidden: torch.Tensor, inp: AttentionInputs,
                cache: LayerCache, reuse_topk: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids [B,S]`` (the tokens one position ahead), ``prev_hidden [B,S,D]`` →
        ``(logits fp32 [B,S,V], recycled hidden [B,S,D] = shared_head.norm(h))``. ``reuse_topk [B,S,K]``: indices to
        attend to instead of this layer's own selection (``index_share_for_mtp_iteration``)."""
        e = self.embed_tokens(input_ids)
        e = torch.where(inp.positions[..., None] == 0, torch.zeros_like(e), e)
        h = self.eh_proj(torch.cat((self.enorm(e), self.hnorm(prev_hidden)), dim=-1))
        h, _ = self.forward(h, inp, cache, reuse_topk, skip_topk=reuse_topk is not None)
        normed = self.shared_head.norm(h)
        return self.shared_head.head(normed).float(), self.defect.recycled_hidden(h, normed)


@dataclass
class SpecDecodeStats:
    """Speculative-decoding counters with vLLM's definitions (``vllm/v1/spec_decode/metrics.py``):
    one *draft* per verification round; ``mean_acceptance_length = 1 + accepted / drafts`` (the bonus token counted)."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.num_spec_tokens

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Record one verification round (``SpecDecodingStats.observe_draft``)."""
        assert 0 <= num_accepted_tokens <= num_draft_tokens <= self.num_spec_tokens
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.accepted_per_pos[i] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """``1 + accepted / drafts`` (NaN before the first draft)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def draft_acceptance_rate(self) -> float:
        """``accepted / drafted`` tokens, in [0, 1] (NaN before the first draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else float("nan")


@torch.no_grad()
def speculative_generate(model: "DsaForCausalLM", input_ids: torch.Tensor, max_new_tokens: int,
                         num_speculative_tokens: int = 1, *, kv_cache_dtype: str = "auto"
                         ) -> tuple[torch.Tensor, SpecDecodeStats]:
    """Greedy decoding with MTP drafts verified by the main model, one row at a time (rows may accept differently).

    Per round (vLLM's MTP proposer + rejection sampler at temperature 0): the MTP layer reads the round's tokens shifted
    by one (the last one being the token just sampled) with the main hidden states, drafts ``k`` tokens recursively, the
    main model verifies ``[sampled, d_1..d_k]`` in one multi-token forward (each draft sees keys up to its own
    position), the longest agreeing prefix is accepted and the main model's next token is the bonus.

    Args:
        input_ids: ``[B, S]`` prompts (S >= 1).
        max_new_tokens: tokens to emit per row.
        num_speculative_tokens: k >= 1 drafts per round.

    Returns:
        ``(tokens long [B, max_new_tokens], stats)``; tokens equal plain greedy decoding.
    Raises:
        ValueError: the model has no MTP layer, or k < 1.
    """
    if model.config.num_nextn_predict_layers < 1:
        raise ValueError("num_nextn_predict_layers: the model has no MTP layer to draft with")
    if num_speculative_tokens < 1:
        raise ValueError("num_speculative_tokens: must be >= 1")
    k = num_speculative_tokens
    share_indices = model.config.index_share_for_mtp_iteration
    stats = SpecDecodeStats(num_spec_tokens=k)
    device = input_ids.device
    rows = []
    for prompt in input_ids:
        S = prompt.shape[0]
        cache = model.new_cache(1, S + max_new_tokens + k + 2, kv_cache_dtype=kv_cache_dtype, with_mtp=True)
        round_tokens, round_pos = prompt, torch.arange(S, device=device)
        round_hidden = model.forward_hidden(round_tokens[None], round_pos[None], cache)
        next_token = model.compute_logits(round_hidden[:, -1:])[0, -1].argmax()
        emitted = [int(next_token)]
        while len(emitted) < max_new_tokens:
            # draft: step 0 reads the round shifted by one, later steps recycle their own normed hidden
            ids = torch.cat((round_tokens[1:], next_token[None]))
            pos, prev = round_pos, round_hidden
            drafts, reuse = [], None
            for step in range(k):
                logits, recycled = model.mtp_predict(step, ids[None], pos[None], prev, cache, reuse_topk=reuse)
                if step == 0 and share_indices:  # steps >= 1 reuse step 0's selection for the row's last token
                    reuse = model.mtp_layers[0].self_attn.last_topk[:, -1:]
                drafts.append(logits[0, -1].argmax())
                ids, pos, prev = drafts[-1][None], pos[-1:] + 1, recycled[:, -1:]
            # verify [next_token, d_1..d_k] at the next k+1 positions
            verify_ids = torch.stack([next_token, *drafts])
            verify_pos = round_pos[-1] + 1 + torch.arange(k + 1, device=device)
            hidden = model.forward_hidden(verify_ids[None], verify_pos[None], cache)
            greedy = model.compute_logits(hidden)[0].argmax(dim=-1)  # [k+1]
            accepted = 0
            while accepted < k and int(drafts[accepted]) == int(greedy[accepted]):
                accepted += 1
            stats.observe_draft(k, accepted)
            emitted += [int(t) for t in greedy[:accepted + 1]]  # accepted drafts (== greedy) + the bonus token
            round_tokens, round_pos = verify_ids[:accepted + 1], verify_pos[:accepted + 1]
            round_hidden, next_token = hidden[:, :accepted + 1], greedy[accepted]
        rows.append(torch.tensor(emitted[:max_new_tokens], dtype=torch.long, device=device))
    return torch.stack(rows), stats
