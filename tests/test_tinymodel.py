"""Fast tests of dsa_route.tiny.v3: config geometry, tokenizer, cache behaviour. No vLLM server is started here."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from dsa_route.tiny import v3 as tinymodel
from dsa_route.tiny.v3 import TINY_MODELS, TinyModelSpec, ensure_tiny_model

# 5-shot GSM8K prompts measured with this tokenizer reach ~2.9k tokens; lm-eval then generates up to 256.
GSM8K_5SHOT_WORST_TOKENS = 2905 + 256


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return ensure_tiny_model(cache_dir=tmp_path_factory.mktemp("cache"))


def _config(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


def test_config_geometry(model_dir):
    c = _config(model_dir)
    assert c["architectures"] == ["DeepseekV3ForCausalLM"] and c["model_type"] == "deepseek_v3"
    # The CPU MLA backend supports only a 576-wide latent cache (kv_lora_rank + qk_rope_head_dim).
    assert (c["kv_lora_rank"], c["qk_rope_head_dim"]) == (512, 64)
    # Dense and MoE layers, DeepSeek-V3 routing.
    assert 1 <= c["first_k_dense_replace"] < c["num_hidden_layers"]
    assert c["topk_method"] == "noaux_tc" and c["scoring_func"] == "sigmoid"
    assert c["n_routed_experts"] % c["n_group"] == 0 and c["topk_group"] <= c["n_group"]
    assert c["num_experts_per_tok"] <= c["topk_group"] * c["n_routed_experts"] // c["n_group"]
    assert c["num_nextn_predict_layers"] == 1
    assert c["num_key_value_heads"] == c["num_attention_heads"]
    # The real position limit lives in the file (the MTP draft ignores --hf-overrides).
    assert c["max_position_embeddings"] >= GSM8K_5SHOT_WORST_TOKENS
    assert "quantization_config" not in c


def test_config_loads_in_transformers(model_dir):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    assert type(cfg).__name__ == "DeepseekV3Config"
    assert (cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.num_nextn_predict_layers) == (512, 64, 1)


def test_tokenizer_round_trip(model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    c = _config(model_dir)
    assert tok.get_vocab_size() == c["vocab_size"] == TINY_MODELS["tiny-deepseek-v3"].vocab_size
    assert tok.token_to_id(tinymodel.BOS_TOKEN) == c["bos_token_id"] == 0
    assert tok.token_to_id(tinymodel.EOS_TOKEN) == c["eos_token_id"] == 1
    for text in (
        "Question: Natalia sold clips to 48 of her friends in April.\nAnswer: 48 / 2 = <<48/2=24>>24\n#### 72",
        "  leading spaces, tabs\tand ünïcödé 日本語 🙂 {braces} [x] $5.00",
        "",
    ):
        ids = tok.encode(text).ids
        assert ids[0] == c["bos_token_id"]  # BOS prepended, like DeepSeek-V3's tokenizer
        assert max(ids) < c["vocab_size"]
        assert tok.decode(ids, skip_special_tokens=True) == text
    # The merges learned something: typical English/arithmetic text is well under one token per byte.
    text = "How many apples did James have altogether, and what did they cost in dollars?"
    assert len(tok.encode(text).ids) < len(text.encode()) / 2


def test_autotokenizer_loads(model_dir):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert (tok.bos_token, tok.bos_token_id, tok.eos_token, tok.eos_token_id) == ("<|bos|>", 0, "<|eos|>", 1)
    assert len(tok) == _config(model_dir)["vocab_size"]
    ids = tok("2 + 3 = 5")["input_ids"]
    assert ids[0] == 0 and tok.decode(ids, skip_special_tokens=True) == "2 + 3 = 5"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|bos|>User: hi\nAssistant:"


def test_generation_config_matches_special_ids(model_dir):
    gen = json.loads((model_dir / "generation_config.json").read_text())
    c = _config(model_dir)
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (c["bos_token_id"], c["eos_token_id"])


def test_idempotent_cache(tmp_path):
    first = ensure_tiny_model(cache_dir=tmp_path)
    stamps = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    second = ensure_tiny_model(cache_dir=tmp_path)
    assert second == first
    assert {p.name: p.stat().st_mtime_ns for p in second.iterdir()} == stamps
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary directories left behind
    assert first.name.startswith("tiny-deepseek-v3-")


def test_regenerates_when_a_parameter_changes(tmp_path):
    base = ensure_tiny_model(cache_dir=tmp_path)
    spec = replace(TINY_MODELS["tiny-deepseek-v3"], max_position_embeddings=8192)
    changed = ensure_tiny_model(cache_dir=tmp_path, spec=spec)
    assert changed != base and changed.parent == base.parent
    assert _config(changed)["max_position_embeddings"] == 8192
    assert _config(base)["max_position_embeddings"] == 4096


def test_generator_version_is_part_of_the_key(monkeypatch):
    spec = TinyModelSpec()
    key = spec.cache_key()
    monkeypatch.setattr(tinymodel, "GENERATOR_VERSION", tinymodel.GENERATOR_VERSION + 1)
    assert spec.cache_key() != key


def test_output_is_deterministic(tmp_path):
    a = ensure_tiny_model(cache_dir=tmp_path / "a")
    b = ensure_tiny_model(cache_dir=tmp_path / "b")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_default_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "env-cache"))
    assert tinymodel.default_cache_dir() == tmp_path / "env-cache"
    assert ensure_tiny_model().parent == tmp_path / "env-cache"
    monkeypatch.delenv("DSA_BENCH_CACHE")
    assert tinymodel.default_cache_dir() == Path.home() / ".cache" / "dsa-bench"


def test_incomplete_directory_is_rebuilt(tmp_path):
    final = tmp_path / f"tiny-deepseek-v3-{TinyModelSpec().cache_key()}"
    final.mkdir()
    (final / "config.json").write_text("{truncated")  # a crash of an older, non-atomic writer
    assert ensure_tiny_model(cache_dir=tmp_path) == final
    assert _config(final)["model_type"] == "deepseek_v3"


def test_concurrent_callers_get_one_complete_directory(tmp_path):
    results: list[Path] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            results.append(ensure_tiny_model(cache_dir=tmp_path))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert (results[0] / tinymodel.MANIFEST_FILE).is_file()
    assert [p.name for p in tmp_path.iterdir()] == [results[0].name]


def test_unknown_name_and_bad_geometry_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown tiny model 'nope'.*tiny-deepseek-v3"):
        ensure_tiny_model("nope", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="576"):
        ensure_tiny_model(cache_dir=tmp_path, spec=TinyModelSpec(kv_lora_rank=256))
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ensure_tiny_model(cache_dir=tmp_path, spec=TinyModelSpec(num_experts_per_tok=6))
    assert not any(tmp_path.iterdir())


def test_dummy_preset_writes_no_weights(model_dir):
    assert not list(model_dir.glob("*.safetensors"))


def test_repeat_last_checkpoint_repeats_the_last_token(tmp_path):
    np = pytest.importorskip("numpy")
    from safetensors.numpy import load_file

    d = ensure_tiny_model("tiny-deepseek-v3-repeat", cache_dir=tmp_path)
    spec = TINY_MODELS["tiny-deepseek-v3-repeat"]
    t = load_file(str(d / "model.safetensors"))
    assert t.keys() == tinymodel.repeat_last_weights(spec).keys()
    mtp = f"model.layers.{spec.num_hidden_layers}."
    assert {mtp + k for k in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.head.weight")} <= t.keys()
    # Every layer adds exactly zero to the residual stream.
    assert all(not t[k].any() for k in t if k.endswith(("o_proj.weight", "down_proj.weight")))
    # Target: rmsnorm(embed[x]) . lm_head[t] is largest at t = x, by a wide margin.
    e = t["model.embed_tokens.weight"]
    h = e / np.sqrt((e * e).mean(-1, keepdims=True) + 1e-6)
    logits = h @ t["lm_head.weight"].T
    assert (logits.argmax(-1) == np.arange(spec.vocab_size)).all()
    second = np.sort(logits, axis=-1)[:, -2]
    assert (logits.max(-1) > 2 * second).all()
    # MTP: eh_proj keeps the token-embedding half of [enorm(embed(next)), hnorm(hidden)], its head is the embedding.
    x = np.concatenate([e[:3], np.ones((3, spec.hidden_size), np.float32)], axis=1)
    assert np.array_equal(x @ t[mtp + "eh_proj.weight"].T, e[:3])
    assert np.array_equal(t[mtp + "shared_head.head.weight"], e)


def test_bad_weights_kind_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="weights must be one of"):
        ensure_tiny_model(cache_dir=tmp_path, spec=TinyModelSpec(weights="random"))
