"""A tiny DeepseekV32ForCausalLM trained in-repo on GSM8K-format arithmetic word problems whose answers depend on
sparse attention (the lightning indexer must retrieve the right numbers from prompts longer than ``index_topk``).

Modules: ``task`` (seeded problem generator, GSM8K jsonl), ``tokenizer`` (a byte-level BPE with single-digit tokens),
``trainer_model`` (a batched, differentiable formulation of :class:`dsa_route.dsa.DsaForCausalLM`), ``train``
(the DeepSeek-V3.2 recipe scaled down), ``evaluate`` (strict / flexible GSM8K scoring in the reference model) and
``sensitivity`` (accuracy and parity with the indexer's selection broken). The committed checkpoint lives in
``checkpoint/`` (:data:`CHECKPOINT_DIR`), its long-context fine-tune in ``checkpoint-long/``
(:data:`LONG_CHECKPOINT_DIR`).
"""

from pathlib import Path

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoint"
"""The committed checkpoint (HF format; :mod:`.model` describes its files)."""

LONG_CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoint-long"
""":data:`CHECKPOINT_DIR` fine-tuned on problems with 4–44 distractor sentences (prompts of 49–304 tokens, up to
≈ 9 × ``index_topk`` 32): the same files, its ``train.json`` (command, seed, init) and ``loss.jsonl``, and
``eval.json``. The CPU default's model (issue #23: a long-context check where what the indexer selects far back
decides the answer)."""
