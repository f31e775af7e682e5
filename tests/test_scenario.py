"""Scenario files: the shipped ones validate; bad ones fail with one line naming file, key and fix."""

from pathlib import Path

import pytest

from harness.run.scenario import SCENARIOS_DIR, ScenarioError, load_scenario

SHIPPED = sorted(p.stem for p in SCENARIOS_DIR.glob("*.toml"))


def test_three_scenarios_are_shipped():
    assert {"cpu-tiny", "glm-5.2-nvfp4-tp4", "deepseek-v3.2-fp8-tp8"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenarios_validate(name):
    scenario = load_scenario(name)
    assert scenario.name == name
    assert scenario.arm_names()[0] == "baseline"
    assert {arm.route for arm in scenario.arms.values()} == {"baseline", "candidate"}


def test_gpu_scenarios_match_the_upstream_runs():
    glm = load_scenario("glm-5.2-nvfp4-tp4")
    assert (glm.model.architecture, glm.serve.tensor_parallel_size, glm.serve.quantization) == \
        ("GlmMoeDsaForCausalLM", 4, "nvfp4")
    assert glm.workload.concurrency == tuple(2 ** i for i in range(11)) and glm.mtp.num_speculative_tokens == 3
    ds = load_scenario("deepseek-v3.2-fp8-tp8")
    assert (ds.model.architecture, ds.serve.tensor_parallel_size, ds.mtp.num_speculative_tokens) == \
        ("DeepseekV32ForCausalLM", 8, 1)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


BASE = (Path(SCENARIOS_DIR) / "cpu-tiny.toml").read_text()


@pytest.mark.parametrize("old,new,key,hint", [
    ("concurrency = [1, 2, 4, 8]", "concurrency = [0, 2]", "workload.concurrency", "≥ 1"),
    ("input_len = 64", "input_len = -5", "workload.input_len", "greater than 0"),
    ('load_format = "safetensors"', 'load_format = "safetensors"\nfoo = 1', "model.foo", "Extra inputs"),
    ('architecture = "DeepseekV3ForCausalLM"', 'architecture = "LlamaForCausalLM"', "model.architecture",
     "use one of"),
    ("[serve]", '[serve]\nquantization = "int3"', "serve.quantization", "use one of"),
    ('route = "candidate"', 'route = "baseline"', "(top level)", "allow_identical_arms"),
    ("[arms.candidate]", "[arms.other]", "(top level)", "exactly two arms"),
    ("input_len = 64", "input_len = 999999", "(top level)", "exceeds model.max_model_len 4096"),
    ("max_num_batched_tokens = 4096", "max_num_batched_tokens = 2048", "(top level)",
     "max_model_len 4096 > serve.max_num_batched_tokens 2048"),
])
def test_bad_values_name_file_key_and_fix(tmp_path, old, new, key, hint):
    assert old in BASE
    path = _write(tmp_path, BASE.replace(old, new, 1))
    with pytest.raises(ScenarioError) as info:
        load_scenario(str(path))
    message = str(info.value)
    assert str(path) in message and f"'{key}'" in message and hint in message
    assert "\n" not in message


def test_malformed_toml_names_the_file(tmp_path):
    path = _write(tmp_path, "name = 'x'\n[model\n")
    with pytest.raises(ScenarioError, match="malformed TOML"):
        load_scenario(str(path))


def test_unknown_scenario_lists_shipped_ones():
    with pytest.raises(ScenarioError, match="cpu-tiny"):
        load_scenario("no-such-scenario")


def test_overrides_apply_by_dotted_key():
    scenario = load_scenario("cpu-tiny", {"serve.tensor_parallel_size": 4, "workload.concurrency": [8, 1],
                                          "mtp.num_speculative_tokens": 0})
    assert scenario.serve.tensor_parallel_size == 4
    assert scenario.workload.concurrency == (1, 8)
    assert scenario.mtp.num_speculative_tokens == 0


def test_prompts_per_level_has_a_floor():
    work = load_scenario("cpu-tiny").workload
    assert work.num_prompts(1) == max(work.min_prompts, work.prompts_per_concurrency)
    assert work.num_prompts(64) == 64 * work.prompts_per_concurrency


def test_a_variant_includes_its_base_and_states_only_what_differs(tmp_path):
    """``include`` (lm-eval's task-YAML key): the base's tables merge key by key under the variant's values."""
    base = load_scenario("glm-5.2-nvfp4-tp4")
    (tmp_path / "variant.toml").write_text('include = "glm-5.2-nvfp4-tp4"\nname = "variant"\n\n'
                                           '[workload]\ninput_len = 2048\n', encoding="utf-8")
    variant = load_scenario(str(tmp_path / "variant.toml"))
    assert (variant.name, variant.workload.input_len) == ("variant", 2048)
    assert variant.workload.concurrency == base.workload.concurrency and variant.serve == base.serve
    long = load_scenario("glm-5.2-nvfp4-tp4-long")
    assert long.workload.input_len == 32768 and long.mtp == base.mtp and long.arms == base.arms


def test_an_include_cycle_is_one_line(tmp_path):
    (tmp_path / "a.toml").write_text('include = "b.toml"\n', encoding="utf-8")
    (tmp_path / "b.toml").write_text('include = "a.toml"\n', encoding="utf-8")
    with pytest.raises(ScenarioError, match="include cycle"):
        load_scenario(str(tmp_path / "a.toml"))
