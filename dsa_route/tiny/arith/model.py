"""The arithmetic model's geometry and its HF-format checkpoint directory.

A tiny ``DeepseekV32ForCausalLM`` (DSA: MLA + lightning indexer + top-k, YaRN-free RoPE, dense + MoE, MTP 1):

    hidden 128, 3 decoder layers (2 dense MLP 384, then MoE: 4 routed experts of 128, top-2, 1 shared expert),
    4 heads, q_lora_rank 64, kv_lora_rank 64 + rope 32 (latent rows 96 wide), nope 32, v 32,
    lightning indexer 16 heads × 64 (rope on the first 32 dims, half-split as DeepSeek-V3.2), index_topk 32,
    1 MTP layer (MoE, its own full indexer), vocab = the task tokenizer's (~507), untied embeddings.

≈ 1.7 M parameters, 3.3 MB of bf16 safetensors. The MLA latent is smaller than the released models' 512 + 64 (the
serving path is geometry-generic; the tiny generated presets keep the real widths for the cache-layout tests), so that
training fits a CPU budget.

Checkpoint directory (what ``vllm serve``, ``DsaForCausalLM.from_pretrained`` and ``AutoTokenizer`` read)::

    config.json, model.safetensors (bf16), generation_config.json, tokenizer.json, tokenizer_config.json,
    train.json (command, seed, arguments, steps, wall time, final losses), loss.jsonl (the loss curve)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dsa_route.dsa import DsaConfig, DsaForCausalLM

from . import CHECKPOINT_DIR
from .tokenizer import BOS_ID, EOS_ID, save_tokenizer

__all__ = ["CHECKPOINT_DIR", "arith_config", "export_checkpoint"]


def arith_config(vocab_size: int, **overrides) -> DsaConfig:
    """The model's :class:`DsaConfig` for a tokenizer of ``vocab_size`` tokens; ``overrides`` replace HF fields."""
    hf = dict(model_type="deepseek_v32", vocab_size=vocab_size, hidden_size=128, intermediate_size=384,
              moe_intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, q_lora_rank=64,
              kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, index_n_heads=16,
              index_head_dim=64, index_topk=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
              n_group=1, topk_group=1, routed_scaling_factor=1.0, first_k_dense_replace=2,
              num_nextn_predict_layers=1, max_position_embeddings=1024, rope_theta=10000.0)
    hf.update(overrides)
    return DsaConfig.from_hf_config(hf)


def export_checkpoint(model: DsaForCausalLM, tokenizer, out: str | Path, *, dtype: torch.dtype = torch.bfloat16,
                      record: dict | None = None) -> Path:
    """Write the checkpoint directory (module docstring) for ``model`` (any dtype; written in ``dtype``) into ``out``
    and return it. ``record`` becomes ``train.json``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    copy = DsaForCausalLM(model.config, dtype=dtype)
    copy.load_state_dict(model.state_dict())  # casts; fp32-only parameters (router bias) stay fp32
    copy.save_pretrained(out)
    save_tokenizer(tokenizer, out, model_max_length=model.config.max_position_embeddings)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID},
                                                           indent=2) + "\n")
    if record is not None:
        (out / "train.json").write_text(json.dumps(record, indent=2) + "\n")
    return out
