"""DsaConfig.from_hf_config on real-shaped DeepSeek-V3.2 / GLM-5 config.json dicts, and its errors."""

from __future__ import annotations

import math

import pytest

from dsa_route.dsa import DsaConfig

# DeepSeek-V3.2-Exp config.json (hf.co/deepseek-ai/DeepSeek-V3.2-Exp), the fields the model reads.
DEEPSEEK_V32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
    "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 163840,
    "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                          "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                          "type": "yarn"},
    "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048, "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
}
# GLM-5 config.json (hf.co/zai-org/GLM-5), abridged to the fields the model reads.
GLM5 = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "vocab_size": 154880, "hidden_size": 6144,
    "intermediate_size": 12288, "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64,
    "num_key_value_heads": 64, "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "first_k_dense_replace": 3, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "max_position_embeddings": 202752, "rope_interleave": True, "indexer_rope_interleave": True,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}, "index_head_dim": 128, "index_n_heads": 32,
    "index_topk": 2048, "num_nextn_predict_layers": 1,
}


def test_deepseek_v32_fields():
    c = DsaConfig.from_hf_config(DEEPSEEK_V32)
    assert (c.kv_lora_rank, c.qk_rope_head_dim, c.index_topk, c.index_n_heads) == (512, 64, 2048, 64)
    assert c.rope_scaling is not None and c.rope_scaling.factor == 40
    assert c.indexer_rope_interleave is False and c.rope_interleave is True
    assert c.indexer_types == ("full",) * 61
    assert c.mlp_layer_types[:4] == ("dense", "dense", "dense", "sparse") and c.is_moe_layer(61)
    mscale = 0.1 * 1.0 * math.log(40) + 1.0
    assert c.softmax_scale == pytest.approx(192**-0.5 * mscale**2)


def test_glm5_fields():
    c = DsaConfig.from_hf_config(GLM5)
    assert c.rope_scaling is None and c.rope_theta == 1e6
    assert c.indexer_rope_interleave is True
    assert c.softmax_scale == pytest.approx(256**-0.5)
    assert c.index_n_heads == 32 and c.v_head_dim == 256


def test_shared_topk_schedules():
    freq = DsaConfig.from_hf_config({**GLM5, "num_hidden_layers": 8, "index_topk_freq": 3,
                                     "index_skip_topk_offset": 2})
    # vLLM/transformers rule: full iff max(i - offset + 1, 0) % freq == 0
    assert freq.indexer_types == ("full", "full", "shared", "shared", "full", "shared", "shared", "full")
    pattern = DsaConfig.from_hf_config({**GLM5, "num_hidden_layers": 4, "index_topk_pattern": "FSSF"})
    assert pattern.indexer_types == ("full", "shared", "shared", "full")
    explicit = DsaConfig.from_hf_config({**GLM5, "num_hidden_layers": 3, "indexer_types": ["full", "shared", "full"]})
    assert explicit.indexer_type(1) == "shared" and explicit.indexer_type(3) == "full"  # MTP layer: always full


@pytest.mark.parametrize("field", ["index_topk", "index_head_dim", "index_n_heads", "kv_lora_rank", "q_lora_rank",
                                   "qk_rope_head_dim", "num_experts_per_tok", "vocab_size"])
def test_missing_field_names_it(field):
    hf = {k: v for k, v in DEEPSEEK_V32.items() if k != field}
    with pytest.raises(ValueError, match=field):
        DsaConfig.from_hf_config(hf)


@pytest.mark.parametrize("patch, field", [
    ({"model_type": "deepseek_v3"}, "model_type"),
    ({"n_group": 7}, "n_group"),
    ({"topk_group": 9}, "topk_group"),
    ({"num_experts_per_tok": 200}, "num_experts_per_tok"),
    ({"qk_rope_head_dim": 63}, "qk_rope_head_dim"),
    ({"index_head_dim": 32}, "index_head_dim"),
    ({"num_key_value_heads": 1}, "num_key_value_heads"),
    ({"indexer_types": ["full"] * 3}, "indexer_types"),
    ({"indexer_types": ["shared"] + ["full"] * 60}, "indexer_types"),
    ({"rope_scaling": {"type": "yarn", "original_max_position_embeddings": 4096}}, "rope_scaling.factor"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.type"),
    ({"topk_method": "greedy"}, "topk_method"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_inconsistent_field_names_it(patch, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        DsaConfig.from_hf_config({**DEEPSEEK_V32, **patch})


def test_tiny_has_real_cache_geometry():
    for model_type in ("deepseek_v32", "glm_moe_dsa"):
        c = DsaConfig.tiny(model_type)
        assert (c.kv_lora_rank, c.qk_rope_head_dim, c.index_head_dim, c.index_topk) == (512, 64, 128, 64)
        assert "dense" in c.mlp_layer_types and "sparse" in c.mlp_layer_types
        assert c.n_group > c.topk_group > 0 and c.num_nextn_predict_layers == 1
    assert DsaConfig.tiny("glm_moe_dsa").indexer_types == ("full", "full", "shared")
    with pytest.raises(ValueError, match="index_topk"):
        DsaConfig.tiny().replace(index_topk=0)


def test_transformers_rope_parameters_form():
    # transformers v5 folds rope_scaling into rope_parameters (rope_type "yarn", rope_theta inside)
    hf = {k: v for k, v in DEEPSEEK_V32.items() if k not in ("rope_scaling", "rope_theta")}
    hf["rope_parameters"] = {**DEEPSEEK_V32["rope_scaling"], "rope_type": "yarn", "rope_theta": 10000.0}
    assert DsaConfig.from_hf_config(hf) == DsaConfig.from_hf_config(DEEPSEEK_V32)


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_written_config_round_trips_through_transformers(model_type):
    transformers = pytest.importorskip("transformers")
    cls = {"deepseek_v32": "DeepseekV32Config", "glm_moe_dsa": "GlmMoeDsaConfig"}[model_type]
    cfg = DsaConfig.tiny(model_type)
    hf = getattr(transformers, cls).from_dict(cfg.to_hf_config()).to_dict()
    assert DsaConfig.from_hf_config(hf) == cfg
