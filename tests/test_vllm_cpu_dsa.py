"""Fast tests of dsa_route's vLLM-CPU DSA pieces: the tiny DSA generator, config translation, the flat key layout,
the routing decision on CPU and the plugin line. The end-to-end server parity tests are in
tests/test_vllm_cpu_dsa_serve.py (slow)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from dsa_route.routing import decide
from dsa_route.tiny.v32 import TINY_DSA_MODELS, TinyDsaSpec, ensure_tiny_dsa_model

ROOT = Path(__file__).resolve().parents[1]
CPU_IMPL = "dsa_route.vllm_cpu.model"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from dsa_route.tiny.v3 import ensure_tiny_model

    return ensure_tiny_model("tiny-deepseek-v3", tmp_path_factory.mktemp("cache"))


@pytest.mark.parametrize("name", sorted(TINY_DSA_MODELS))
def test_tiny_dsa_model_dir_loads_in_the_reference(name, tokenizer_dir, tmp_path):
    path = ensure_tiny_dsa_model(name, tmp_path, tokenizer_dir=tokenizer_dir)
    assert ensure_tiny_dsa_model(name, tmp_path, tokenizer_dir=tokenizer_dir) == path  # cached
    hf = json.loads((path / "config.json").read_text())
    assert (hf["kv_lora_rank"], hf["qk_rope_head_dim"], hf["index_topk"], hf["num_nextn_predict_layers"]) == (
        512, 64, 32, 1)
    assert hf["first_k_dense_replace"] == 1 and hf["n_routed_experts"] == 8 and hf["torch_dtype"] == "bfloat16"
    assert hf["architectures"] == [{"deepseek_v32": "DeepseekV32ForCausalLM",
                                    "glm_moe_dsa": "GlmMoeDsaForCausalLM"}[TINY_DSA_MODELS[name].model_type]]
    assert hf["indexer_rope_interleave"] == (name == "tiny-glm-moe-dsa")
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "model.safetensors"):
        assert (path / f).is_file(), f
    from dsa_route.dsa import DsaForCausalLM

    model = DsaForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    assert model.config.index_topk == 32 and len(model.mtp_layers) == 1
    torch.manual_seed(0)
    out = model.generate(torch.randint(0, 514, (1, 40)), 2)  # 40 > index_topk: sparse from the first step
    assert out.shape == (1, 2)


def test_repeat_last_checkpoint_is_a_known_answer_with_live_blocks(tokenizer_dir, tmp_path):
    """The cpu-tiny-dsa model: greedy tokens repeat the last token in bf16 and fp32, every MTP draft is accepted, and
    the blocks (attention, MLP, MoE) still move the logits."""
    from dsa_route.dsa import DsaForCausalLM
    from dsa_route.tiny.v32 import repeat_last_

    path = ensure_tiny_dsa_model("tiny-deepseek-v32-repeat", tmp_path, tokenizer_dir=tokenizer_dir)
    prompt = torch.randint(0, 514, (1, 40), generator=torch.Generator().manual_seed(1))
    for dtype in (torch.bfloat16, torch.float32):
        model = DsaForCausalLM.from_pretrained(path, dtype=dtype)
        assert model.generate(prompt, 8)[0].tolist() == [int(prompt[0, -1])] * 8
    tokens, stats = model.generate_mtp(prompt, 8, 1)
    assert tokens[0].tolist() == [int(prompt[0, -1])] * 8
    assert stats.num_drafts > 0 and stats.num_accepted_tokens == stats.num_draft_tokens
    spec = TINY_DSA_MODELS["tiny-deepseek-v32-repeat"]
    silent = repeat_last_(DsaForCausalLM(spec.dsa_config(), dtype=torch.float32).init_random(spec.seed), spec.seed,
                          block_scale=0.0)
    moved = (model(prompt)[0, -1] - silent(prompt)[0, -1]).abs().max()
    assert moved > 0.5, "the blocks must still contribute to the logits"


def test_tiny_dsa_rejects_a_tokenizer_of_another_size(tokenizer_dir, tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        ensure_tiny_dsa_model("x", tmp_path, tokenizer_dir=tokenizer_dir, spec=TinyDsaSpec(vocab_size=600))
    with pytest.raises(ValueError, match="unknown tiny DSA model"):
        ensure_tiny_dsa_model("nope", tmp_path, tokenizer_dir=tokenizer_dir)
    with pytest.raises(FileNotFoundError):
        ensure_tiny_dsa_model("tiny-deepseek-v32", tmp_path, tokenizer_dir=tmp_path)


def test_config_translation_accepts_vllms_renamed_model_types():
    from dsa_route.vllm_cpu.model import dsa_config_from_vllm

    class PretrainedConfig:  # what dsa_config_from_vllm uses of transformers' config objects: to_dict()
        def __init__(self, **fields):
            self.fields = fields

        def to_dict(self):
            return dict(self.fields)

    for name, spec in TINY_DSA_MODELS.items():
        expected = spec.dsa_config()
        hf = spec.hf_config()
        for model_type in (hf["model_type"], "deepseek_v3", "deepseek_mtp"):
            cfg = PretrainedConfig(**{**hf, "model_type": model_type})
            got = dsa_config_from_vllm(cfg)
            assert got.replace(model_type=expected.model_type) == expected, (name, model_type)
    with pytest.raises(ValueError, match="index_topk"):
        dsa_config_from_vllm(PretrainedConfig(model_type="deepseek_v3", hidden_size=8))


def test_step_keys_flat_ranges_cover_prefix_decode_and_verify():
    from dsa_route.vllm_cpu.attention import DsaCpuMetadata, step_keys

    # request 0: 3 new tokens after a cached prefix of 5 (positions 5..7); request 1: one decode token at position 9;
    # request 2: a 2-token MTP verify at positions 3, 4.
    meta = DsaCpuMetadata(num_actual_tokens=6, num_reqs=3, query_start_loc=torch.tensor([0, 3, 4, 6]),
                          seq_lens=torch.tensor([8, 10, 5]), block_table=torch.zeros(3, 1, dtype=torch.int32),
                          slot_mapping=torch.arange(6))
    keys = step_keys(meta, torch.tensor([5, 6, 7, 9, 3, 4, 0]))  # the 7th position is padding
    assert keys.rows == 23
    assert keys.key_start.tolist() == [0, 0, 0, 8, 18, 18]
    assert keys.key_end.tolist() == [6, 7, 8, 18, 22, 23]
    with pytest.raises(ValueError, match="past its request"):
        step_keys(meta, torch.tensor([5, 6, 8, 9, 3, 4]))


def test_flat_slots_follow_each_requests_block_table():
    from dsa_route.vllm_cpu.attention import flat_slots

    # block size 4; request 0 has 6 keys in blocks 7, 2; request 1 has 3 keys in block 5; request 2 none yet.
    table = torch.tensor([[7, 2], [5, 0], [0, 0]], dtype=torch.int32)
    slots = flat_slots(table, torch.tensor([6, 3, 0], dtype=torch.int32), 4)
    assert slots.tolist() == [28, 29, 30, 31, 8, 9, 20, 21, 22] and slots.dtype == torch.int64


def test_flat_indexer_and_sparse_mla_equal_per_request():
    """The flat multi-request layout used on vLLM batches gives each request exactly its own per-request result."""
    from dsa_route.dsa import indexer_logits, sparse_mla, topk_indices

    g = torch.Generator().manual_seed(0)
    H, I, C, L, K = 2, 16, 24, 16, 4
    lens, news = [7, 3], [2, 1]
    keys = [torch.randn(n, I, generator=g) for n in lens]
    kv = [torch.randn(n, C, generator=g) for n in lens]
    qs = [torch.randn(m, H, I, generator=g) for m in news]
    ws = [torch.rand(m, H, generator=g) for m in news]
    ql = [torch.randn(m, H, C, generator=g) for m in news]
    pos = [torch.arange(n - m, n) for n, m in zip(lens, news)]
    per = []
    for r in range(2):
        idx = topk_indices(indexer_logits(qs[r], keys[r], ws[r], pos[r] + 1), K)
        per.append((idx, sparse_mla(ql[r], kv[r], idx, 0.3, L)))
    start = torch.tensor([0, 0, 7])
    flat_idx = topk_indices(indexer_logits(torch.cat(qs), torch.cat(keys), torch.cat(ws),
                                           start + torch.cat(pos) + 1, start), K)
    flat_out = sparse_mla(torch.cat(ql), torch.cat(kv), flat_idx, 0.3, L)
    assert torch.equal(flat_idx[:2], per[0][0])
    assert torch.equal(flat_idx[2:], torch.where(per[1][0] >= 0, per[1][0] + 7, per[1][0]))
    torch.testing.assert_close(flat_out, torch.cat([per[0][1], per[1][1]]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("route", ["auto", "baseline", "candidate"])
@pytest.mark.parametrize("arch,cls", [("DeepseekV32ForCausalLM", "DsaCpuForCausalLM"),
                                      ("GlmMoeDsaForCausalLM", "DsaCpuGlmMoeDsaForCausalLM")])
def test_cpu_decision_routes_dsa_to_dsa_route(route, arch, cls):
    model_type = {"DeepseekV32ForCausalLM": "deepseek_v32", "GlmMoeDsaForCausalLM": "glm_moe_dsa"}[arch]
    d = decide([arch], "cpu", speculative_model_type=model_type, route=route)
    assert d.implementation[arch] == f"{CPU_IMPL}:{cls}"
    assert d.implementation["DeepseekV32MTPModel"] == f"{CPU_IMPL}:DsaCpuMTPModel"
    assert any("Sparse Attention is not supported on CPU" in r and "dsa_route.vllm_cpu" in r for r in d.reasons)
    # other platforms are untouched
    assert not any(v.startswith("dsa_route") for v in decide([arch], "xpu", route=route).implementation.values())


def test_registered_targets_exist_and_are_vllm_models():
    import importlib

    from vllm.model_executor.models.interfaces_base import is_text_generation_model

    d = decide(["DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"], "cpu", speculative_model_type="deepseek_v32")
    for arch, target in d.implementation.items():
        module, cls = target.split(":")
        model_cls = getattr(importlib.import_module(module), cls)
        assert is_text_generation_model(model_cls), arch


def test_plugin_line_names_the_cpu_implementation_and_keeps_prefix_caching(tmp_path):
    from dsa_route.plugin import Probe, apply

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["DeepseekV32ForCausalLM"],
                                                   "model_type": "deepseek_v32"}))
    calls = []
    probe = Probe("cpu", None, False, {"DeepseekV32ForCausalLM": "vllm.models.deepseek_v32:DeepseekV32ForCausalLM"},
                  lambda a, t: calls.append((a, t)), lambda m: True)
    environ: dict[str, str] = {}
    line, level = apply(environ, ["vllm", "serve", str(model)], lambda: probe)
    assert level == logging.INFO
    assert f'impl={{"DeepseekV32ForCausalLM":"{CPU_IMPL}:DsaCpuForCausalLM"}}' in line
    assert dict(calls)["DeepseekV32ForCausalLM"] == f"{CPU_IMPL}:DsaCpuForCausalLM"
    assert environ["VLLM_MLA_DISABLE"] == "1"
    # an explicit value wins; non-DSA models never get it
    environ = {"VLLM_MLA_DISABLE": "0"}
    apply(environ, ["vllm", "serve", str(model)], lambda: probe)
    assert environ["VLLM_MLA_DISABLE"] == "0"
    (model / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"],
                                                   "model_type": "deepseek_v3"}))
    environ = {}
    apply(environ, ["vllm", "serve", str(model)], lambda: probe)
    assert "VLLM_MLA_DISABLE" not in environ
