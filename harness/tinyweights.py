"""A known-acceptance checkpoint for a generated tiny DeepSeek-V3 model: the model and its MTP layer both repeat the
last token, so greedy MTP drafts are accepted 100 % on real vLLM (dummy weights give ≈ 0 %).

:func:`write_repeat_weights` reads any DeepSeek-V3-family ``config.json`` (``model_dir``, e.g. the directory
:func:`harness.tinymodel.ensure_tiny_model` made) and writes a servable copy into ``out_dir``: ``model.safetensors``
plus the config and tokenizer files. :func:`ensure_repeat_model` does that once per config in the dsa-bench cache.
Serve the result *without* ``--load-format dummy`` (``--load-format safetensors``).

Construction (HF checkpoint names, as vLLM's ``deepseek_v2.py`` and ``deepseek_mtp.py`` loaders read them; the MTP
layer is ``model.layers.<num_hidden_layers>``). Shape legend: ``H`` hidden size, ``V`` vocabulary, ``E`` routed experts.

- Every projection inside every decoder block (attention ``q_a/q_b/kv_a/kv_b/o_proj``, dense MLP, routed and shared
  experts, router gate) is zero and every norm weight is one. Each block adds exactly 0 to the residual stream
  (attention output ``o_proj · …`` = 0, MLP output ``down_proj · …`` = 0), so the last hidden state at a position is
  the embedding ``e_x`` of that position's token ``x``.
- Embedding rows ``e_t`` (``[V, H]``) are Gaussian vectors rescaled to unit norm; ``lm_head = embed``. The logit of
  token ``t`` is ``rmsnorm(e_x) · e_t = √H · cos(e_x, e_t)``, which is ``√H`` for ``t = x`` and ≈ N(0, 1) otherwise
  (independent random directions in H dimensions): with H = 256 the greedy margin is ≈ 16 − 3.5 ≈ 12 nats, far above
  bfloat16 rounding (relative 2⁻⁸), so greedy decoding repeats the last token.
- MTP layer (``DeepSeekMultiTokenPredictorLayer.forward``: ``eh_proj(cat[enorm(embed(next_token)),
  hnorm(hidden)])`` → ``mtp_block`` → ``shared_head``): ``eh_proj = [I_H | 0]`` keeps only the next token's normalised
  embedding, the block is zero like the others, ``shared_head.head = embed``: the draft for the token after ``x`` is
  ``x`` again — exactly what the target will sample, so every greedy draft is accepted.

Pure numpy (float32 tensors; vLLM casts to the config's ``torch_dtype`` on load); the only I/O is the output directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

WEIGHTS_FILE = "model.safetensors"
MARKER = "dsa-bench-repeat-weights.json"
# Files copied next to the weights (whatever of them the source directory has).
COPIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja", "special_tokens_map.json")
GENERATOR_VERSION = 1


def _is_moe_layer(config: Mapping[str, Any], layer: int) -> bool:
    """vLLM's rule (``deepseek_v2.py``, ``DeepseekV2DecoderLayer``): MoE when routed experts exist, the layer is past
    ``first_k_dense_replace`` and ``layer % moe_layer_freq == 0``."""
    return (bool(config.get("n_routed_experts"))
            and layer >= int(config.get("first_k_dense_replace", 0))
            and layer % int(config.get("moe_layer_freq", 1)) == 0)


def repeat_weights(config: Mapping[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """The checkpoint tensors (HF name → float32 array) for ``config`` (a DeepSeek-V3 ``config.json`` as a dict).

    See the module docstring for the construction.

    Raises:
        ValueError: the config lacks a key this construction needs (the message names it).
    """
    try:
        h, v = int(config["hidden_size"]), int(config["vocab_size"])
        layers, mtp_layers = int(config["num_hidden_layers"]), int(config.get("num_nextn_predict_layers", 0))
        heads = int(config["num_attention_heads"])
        nope, rope, vd = int(config["qk_nope_head_dim"]), int(config["qk_rope_head_dim"]), int(config["v_head_dim"])
        kv_rank, q_rank = int(config["kv_lora_rank"]), config.get("q_lora_rank")
    except KeyError as error:
        raise ValueError(f"config.json lacks {error.args[0]!r}; not a DeepSeek-V3-family config") from None
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((v, h)).astype(np.float32)          # [V, H]
    embed /= np.linalg.norm(embed, axis=1, keepdims=True)           # unit rows: logit(t | x) = √H cos(e_x, e_t)

    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": embed, "model.norm.weight": ones(h)}
    if not config.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = embed.copy()
    for layer in range(layers + mtp_layers):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = ones(h)
        tensors[p + "post_attention_layernorm.weight"] = ones(h)
        a = p + "self_attn."
        if q_rank:
            tensors[a + "q_a_proj.weight"] = zeros(int(q_rank), h)
            tensors[a + "q_a_layernorm.weight"] = ones(int(q_rank))
            tensors[a + "q_b_proj.weight"] = zeros(heads * (nope + rope), int(q_rank))
        else:
            tensors[a + "q_proj.weight"] = zeros(heads * (nope + rope), h)
        tensors[a + "kv_a_proj_with_mqa.weight"] = zeros(kv_rank + rope, h)
        tensors[a + "kv_a_layernorm.weight"] = ones(kv_rank)
        tensors[a + "kv_b_proj.weight"] = zeros(heads * (nope + vd), kv_rank)
        tensors[a + "o_proj.weight"] = zeros(h, heads * vd)
        if _is_moe_layer(config, layer):
            experts = int(config["n_routed_experts"])
            width = int(config["moe_intermediate_size"])
            tensors[p + "mlp.gate.weight"] = zeros(experts, h)      # [E, H]
            if config.get("topk_method") == "noaux_tc":
                tensors[p + "mlp.gate.e_score_correction_bias"] = zeros(experts)
            mlps = [(p + f"mlp.experts.{e}.", width) for e in range(experts)]
            if config.get("n_shared_experts"):
                mlps.append((p + "mlp.shared_experts.", width * int(config["n_shared_experts"])))
        else:
            mlps = [(p + "mlp.", int(config["intermediate_size"]))]
        for prefix, width in mlps:
            tensors[prefix + "gate_proj.weight"] = zeros(width, h)
            tensors[prefix + "up_proj.weight"] = zeros(width, h)
            tensors[prefix + "down_proj.weight"] = zeros(h, width)
        if layer >= layers:                                           # an MTP layer
            tensors[p + "embed_tokens.weight"] = embed.copy()
            tensors[p + "enorm.weight"] = ones(h)
            tensors[p + "hnorm.weight"] = ones(h)
            tensors[p + "eh_proj.weight"] = np.concatenate([np.eye(h, dtype=np.float32), zeros(h, h)], axis=1)
            tensors[p + "shared_head.norm.weight"] = ones(h)
            tensors[p + "shared_head.head.weight"] = embed.copy()
    return tensors


def write_repeat_weights(model_dir: Path, out_dir: Path, seed: int = 0) -> Path:
    """Write a servable copy of ``model_dir`` with the repeat-the-last-token checkpoint into ``out_dir``.

    ``out_dir`` gets ``model.safetensors`` (≈ 30 MB for cpu-tiny's geometry), the config and tokenizer files of
    ``model_dir`` (copied), and a marker file naming the source. Returns ``out_dir``.

    Raises:
        ValueError: ``model_dir`` has no readable ``config.json`` or it lacks a needed key.
    """
    from safetensors.numpy import save_file

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    config = _read_config(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in COPIED_FILES:
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, out_dir / name)
    save_file(repeat_weights(config, seed), str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    (out_dir / MARKER).write_text(json.dumps({"source": str(model_dir), "seed": seed,
                                              "generator_version": GENERATOR_VERSION}, indent=2) + "\n")
    return out_dir


def _read_config(model_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{model_dir / 'config.json'}: unreadable ({error}); pass a model directory") from None


def ensure_repeat_model(model_dir: Path, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """The repeat-weights copy of ``model_dir`` in the cache (``<cache>/<name>-repeat-<hash>``), written on first use.

    The hash covers ``config.json``, the seed and :data:`GENERATOR_VERSION`; the directory is built under a temporary
    name and renamed into place, so a concurrent caller never sees a half-written model. ``cache_dir`` defaults to
    :func:`harness.tinymodel.default_cache_dir`.
    """
    from harness.tinymodel import default_cache_dir

    model_dir = Path(model_dir)
    config_text = (model_dir / "config.json").read_text(encoding="utf-8")
    key = hashlib.sha256(f"{GENERATOR_VERSION}|{seed}|{config_text}".encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"{model_dir.name}-repeat-{key}"
    if (final / MARKER).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        write_repeat_weights(model_dir, tmp, seed)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MARKER).is_file():   # not a concurrent winner: a stale partial directory or a real error
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
