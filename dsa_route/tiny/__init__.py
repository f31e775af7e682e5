"""Tiny models the project builds itself for CPU runs and tests: seeded known-answer checkpoints of DeepSeek-V3
(``v3``) and DeepSeek-V3.2 DSA (``v32``), and a DSA model trained in-repo on a checkable arithmetic task (``arith``)."""

from __future__ import annotations


from pathlib import Path


ARITH_PRESET = "tiny-deepseek-v32-arith"
"""The trained arithmetic checkpoint (:data:`dsa_route.tiny.arith.CHECKPOINT_DIR`, committed in the package):
``generated:tiny-deepseek-v32-arith`` in a scenario."""

ARITH_LONG_PRESET = "tiny-deepseek-v32-arith-long"
"""Its fine-tune on problems of 4–44 distractor sentences (:data:`dsa_route.tiny.arith.LONG_CHECKPOINT_DIR`,
committed; prompts up to ≈ 9 × ``index_topk``): ``generated:tiny-deepseek-v32-arith-long``, the CPU default's model."""


def ensure_model(name: str) -> Path:
    """The directory of the tiny preset ``name``: :data:`ARITH_PRESET` or :data:`ARITH_LONG_PRESET` (committed
    trained checkpoints, nothing generated), else the cached directory of a generated preset (made on first use): a DeepSeek-V3.2 preset of
    :data:`v32.TINY_DSA_MODELS` (with the tiny DeepSeek-V3 tokenizer) or a DeepSeek-V3 preset of :mod:`v3`.

    Raises:
        ValueError: no preset is called ``name``.
    """
    from dsa_route.tiny.v3 import ensure_tiny_model
    from dsa_route.tiny.v32 import TINY_DSA_MODELS, ensure_tiny_dsa_model

    if name in (ARITH_PRESET, ARITH_LONG_PRESET):
        from dsa_route.tiny.arith import CHECKPOINT_DIR, LONG_CHECKPOINT_DIR

        return CHECKPOINT_DIR if name == ARITH_PRESET else LONG_CHECKPOINT_DIR
    if name in TINY_DSA_MODELS:
        return ensure_tiny_dsa_model(name, tokenizer_dir=ensure_tiny_model("tiny-deepseek-v3"))
    return ensure_tiny_model(name)
