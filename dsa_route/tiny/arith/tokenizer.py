"""The task's tokenizer: a byte-level BPE trained locally with Hugging Face ``tokenizers`` on generated problems.

- Pre-tokenization: ``Digits(individual_digits=True)`` then GPT-2's ``ByteLevel`` split, so every digit is its own
  token (numbers are spelled digit by digit, the arithmetic is learnt on digits) and any byte string encodes (256
  byte symbols are in the alphabet; vLLM's random-token benchmark prompts decode and re-encode).
- Special tokens: ``<|bos|>`` = 0 and ``<|eos|>`` = 1, the ids ``DsaConfig.to_hf_config`` writes into config.json; a
  ``TemplateProcessing`` post-processor prepends ``<|bos|>`` (as vLLM's completions endpoint tokenizes a prompt with
  ``add_special_tokens=True``), so training sequences are ``<|bos|> prompt completion <|eos|>`` and served prompts
  start the same way.
- A prompt ends in ``"Answer:"``; ``:`` and the space after it are separate pre-tokens, so the tokens of a prompt are
  a prefix of the tokens of prompt + completion (checked in the tests).

Files written by :func:`save_tokenizer`: ``tokenizer.json`` and ``tokenizer_config.json``
(``PreTrainedTokenizerFast``), what ``transformers.AutoTokenizer`` and vLLM load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

BOS, EOS = "<|bos|>", "<|eos|>"
BOS_ID, EOS_ID = 0, 1
VOCAB_SIZE = 512


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE):
    """Train the BPE on ``texts``; returns a ``tokenizers.Tokenizer`` with the layout of the module docstring.
    Its final size is at most ``vocab_size`` (fewer when the corpus has no more merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(BOS) == BOS_ID and tok.token_to_id(EOS) == EOS_ID
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, BOS_ID)])
    return tok


def save_tokenizer(tok, out: str | Path, model_max_length: int = 1024) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into directory ``out``; returns ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    added = {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                      "single_word": False} for i, t in ((BOS_ID, BOS), (EOS_ID, EOS))}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
              "add_bos_token": True, "add_eos_token": False, "clean_up_tokenization_spaces": False,
              "model_max_length": model_max_length, "added_tokens_decoder": added}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def load_tokenizer(path: str | Path):
    """``tokenizers.Tokenizer`` from ``path/tokenizer.json``."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))


def vocab_size_of(tok) -> int:
    return tok.get_vocab_size(with_added_tokens=True)
