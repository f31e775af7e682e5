"""The known-acceptance checkpoint: tensor names and shapes for vLLM's DeepSeek loaders, the maths that makes the
model and its MTP layer repeat the last token, and the cached, atomic output directory. (The real-vLLM proof, 100 %
acceptance, is the slow test in tests/test_spec_decode.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness import tinymodel, tinyweights

SPEC = tinymodel.TinyModelSpec()
CONFIG = tinymodel.model_config(SPEC)


@pytest.fixture(scope="module")
def tensors():
    return tinyweights.repeat_weights(CONFIG)


def _rmsnorm(x, eps=1e-6):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def test_names_cover_every_layer_and_the_mtp_layer(tensors):
    layers, h = CONFIG["num_hidden_layers"], CONFIG["hidden_size"]
    mtp = f"model.layers.{layers}."                       # the MTP layer sits at index num_hidden_layers
    for name in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "embed_tokens.weight",
                 "shared_head.head.weight", "shared_head.norm.weight", "self_attn.kv_b_proj.weight",
                 "mlp.gate.e_score_correction_bias", "mlp.experts.7.down_proj.weight",
                 "mlp.shared_experts.up_proj.weight"):
        assert mtp + name in tensors
    assert "model.layers.0.mlp.gate_proj.weight" in tensors          # dense first layer (first_k_dense_replace 1)
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in tensors
    assert f"model.layers.{layers + 1}.input_layernorm.weight" not in tensors
    assert tensors["lm_head.weight"].shape == (CONFIG["vocab_size"], h)
    assert tensors[mtp + "eh_proj.weight"].shape == (h, 2 * h)
    assert tensors["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].shape == (
        CONFIG["kv_lora_rank"] + CONFIG["qk_rope_head_dim"], h)


def test_same_checkpoint_as_the_tinymodel_preset_if_it_has_one(tensors):
    """harness.tinymodel's ``tiny-deepseek-v3-repeat`` preset builds the same construction from the spec; this module
    builds it from any config.json. Both must agree tensor for tensor."""
    if not hasattr(tinymodel, "repeat_last_weights"):
        pytest.skip("harness.tinymodel has no repeat-last preset")
    theirs = tinymodel.repeat_last_weights(SPEC)
    assert set(tensors) == set(theirs)
    assert all(np.array_equal(tensors[name], theirs[name]) for name in tensors)


def test_every_block_adds_zero_to_the_residual(tensors):
    outputs = [name for name in tensors if name.endswith(("o_proj.weight", "down_proj.weight"))]
    assert len(outputs) > CONFIG["num_hidden_layers"]
    assert all(not tensors[name].any() for name in outputs)


def test_greedy_head_repeats_the_token_with_a_wide_margin(tensors):
    embed, head = tensors["model.embed_tokens.weight"], tensors["lm_head.weight"]
    logits = _rmsnorm(embed) @ head.T                    # [V, V]: row x = logits after input token x
    assert (logits.argmax(axis=1) == np.arange(len(embed))).all()
    top2 = np.sort(logits, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 5.0          # nats; bf16 rounding is ~0.06 at |logit| 16


def test_mtp_layer_drafts_the_token_it_was_given(tensors):
    layers, h = CONFIG["num_hidden_layers"], CONFIG["hidden_size"]
    p = f"model.layers.{layers}."
    rng = np.random.default_rng(1)
    token = 123
    previous_hidden = rng.standard_normal(h).astype(np.float32)    # whatever the target's hidden state was
    x = np.concatenate([_rmsnorm(tensors[p + "embed_tokens.weight"][token]), _rmsnorm(previous_hidden)])
    hidden = tensors[p + "eh_proj.weight"] @ x                     # the block adds 0 (checked above)
    logits = tensors[p + "shared_head.head.weight"] @ _rmsnorm(hidden)
    assert logits.argmax() == token


def test_config_without_q_lora_and_with_tied_embeddings():
    config = {**CONFIG, "q_lora_rank": None, "tie_word_embeddings": True}
    tensors = tinyweights.repeat_weights(config)
    assert "model.layers.0.self_attn.q_proj.weight" in tensors and "lm_head.weight" not in tensors
    with pytest.raises(ValueError, match="kv_lora_rank"):
        tinyweights.repeat_weights({k: v for k, v in CONFIG.items() if k != "kv_lora_rank"})


def test_ensure_repeat_model_writes_once_into_the_cache(tmp_path):
    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(CONFIG))
    (model_dir / "tokenizer.json").write_text("{}")
    out = tinyweights.ensure_repeat_model(model_dir, cache_dir=tmp_path / "cache")
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / "config.json").read_text()) == CONFIG
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert tinyweights.ensure_repeat_model(model_dir, cache_dir=tmp_path / "cache") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [out.name]        # no temporary leftovers

    from safetensors.numpy import load_file

    loaded = load_file(str(out / "model.safetensors"))
    assert np.array_equal(loaded["lm_head.weight"], loaded["model.embed_tokens.weight"])
    with pytest.raises(ValueError, match="config.json"):
        tinyweights.write_repeat_weights(tmp_path / "nothing", tmp_path / "x")
