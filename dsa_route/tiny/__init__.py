"""Tiny models the project builds itself for CPU runs and tests: seeded known-answer checkpoints of DeepSeek-V3
(``v3``) and DeepSeek-V3.2 DSA (``v32``), and a DSA model trained in-repo on a checkable arithmetic task (``arith``)."""

from __future__ import annotations


from pathlib import Path


def ensure_model(name: str) -> Path:
    """The cached directory of the tiny preset ``name`` (generated on first use): a DeepSeek-V3.2 preset of
    :data:`v32.TINY_DSA_MODELS` (with the tiny DeepSeek-V3 tokenizer) or a DeepSeek-V3 preset of :mod:`v3`.

    Raises:
        KeyError: no preset is called ``name``.
    """
    from dsa_route.tiny.v3 import ensure_tiny_model
    from dsa_route.tiny.v32 import TINY_DSA_MODELS, ensure_tiny_dsa_model

    if name in TINY_DSA_MODELS:
        return ensure_tiny_dsa_model(name, tokenizer_dir=ensure_tiny_model("tiny-deepseek-v3"))
    return ensure_tiny_model(name)
