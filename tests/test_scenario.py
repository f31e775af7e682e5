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
    first = "baseline" if scenario.attribution is None else "f" + "0" * len(scenario.attribution.factors)
    assert scenario.arm_names()[0] == first   # an attribution's all-off arm is the baseline's path
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
    (regime,) = {level.regime for level in work.levels()}
    assert work.num_prompts(regime.at(1)) == max(work.min_prompts, work.prompts_per_concurrency)
    assert work.num_prompts(regime.at(64)) == 64 * work.prompts_per_concurrency


def test_regimes_add_levels_with_their_own_lengths_concurrencies_and_counts():
    """Issue #26: ``[[workload.regimes]]`` levels join the workload's own in one grid; a regime without a
    concurrency list takes the workload's; one given twice, or too long for the model, is refused in one line."""
    scenario = load_scenario("cpu-tiny-dsa", {"workload.regimes": [
        {"input_len": 256, "output_len": 32, "concurrency": [4], "min_prompts": 20},
        {"input_len": 128, "output_len": 16}]})
    levels = scenario.workload.levels()
    assert [str(level) for level in levels if level.input_len != 64] == [
        "random-i256-o32-c4", "random-i128-o16-c1", "random-i128-o16-c2", "random-i128-o16-c4",
        "random-i128-o16-c8"]
    assert scenario.workload.num_prompts(levels[4]) == 20 and scenario.workload.longest_request() == 288
    with pytest.raises(ScenarioError, match="regime random-i64-o32 is given twice"):
        load_scenario("cpu-tiny-dsa", {"workload.regimes": [{"input_len": 64, "output_len": 32}]})
    with pytest.raises(ScenarioError, match="longest level's input_len \\+ output_len = 1032 exceeds"):
        load_scenario("cpu-tiny-dsa", {"workload.regimes": [{"input_len": 1000, "output_len": 32}]})
    with pytest.raises(ScenarioError, match="dataset"):
        load_scenario("cpu-tiny-dsa", {"workload.regimes": [{"input_len": 100, "output_len": 32,
                                                             "dataset": "sharegpt"}]})


def test_a_variant_includes_its_base_and_states_only_what_differs(tmp_path):
    """``include`` (lm-eval's task-YAML key): the base's tables merge key by key under the variant's values."""
    base = load_scenario("glm-5.2-nvfp4-tp4")
    (tmp_path / "variant.toml").write_text('include = "glm-5.2-nvfp4-tp4"\nname = "variant"\n\n'
                                           '[workload]\ninput_len = 2048\n', encoding="utf-8")
    variant = load_scenario(str(tmp_path / "variant.toml"))
    assert (variant.name, variant.workload.input_len) == ("variant", 2048)
    assert variant.workload.concurrency == base.workload.concurrency and variant.serve == base.serve


def test_an_include_cycle_is_one_line(tmp_path):
    (tmp_path / "a.toml").write_text('include = "b.toml"\n', encoding="utf-8")
    (tmp_path / "b.toml").write_text('include = "a.toml"\n', encoding="utf-8")
    with pytest.raises(ScenarioError, match="include cycle"):
        load_scenario(str(tmp_path / "a.toml"))


@pytest.mark.parametrize("regime, message", [
    ('input_len = 600\noutput_len = 32', "the longest level's input_len + output_len = 632 exceeds model.max_model_len"),
    ('input_len = "long"\noutput_len = 32', "workload.regimes.0.input_len"),
    ('input_len = 64\noutput_len = 32\nconcurrency = [0]', "concurrency levels must be ≥ 1"),
    ('input_len = 64\noutput_len = 16\ndata_dir = "x"', "data_dir is for a real-text regime"),
])
def test_a_bad_regime_is_one_line_and_exit_2_before_anything_starts(tmp_path, capsys, regime, message):
    from harness.cli import main

    path = _planned_in_one_line(tmp_path, capsys, f"[[workload.regimes]]\n{regime}", message)
    assert main(["compare", "--scenario", str(path), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("slo, message", [('ttft_ms = "fast"', "slo.ttft_ms"), ("tpot_ms = -5", "slo.tpot_ms"),
                                          ("itl_ms = 5", "slo.itl_ms")])
def test_an_slo_that_is_not_a_positive_number_of_ms_is_one_line_and_exit_2(tmp_path, capsys, slo, message):
    _planned_in_one_line(tmp_path, capsys, f"[slo]\n{slo}", message)


def _planned_in_one_line(tmp_path, capsys, table: str, message: str):
    """A variant of the default with ``table`` appended: ``dsa-bench plan`` refuses it in one line naming ``message``
    (exit 2); returns the variant's path."""
    from harness.cli import main

    path = tmp_path / "bad.toml"
    path.write_text(f'include = "cpu-tiny-dsa"\nname = "bad"\n\n{table}\n', encoding="utf-8")
    assert main(["plan", "--scenario", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    return path


def test_slos_reach_vllms_bench_client_as_goodput_pairs():
    scenario = load_scenario("cpu-tiny-dsa", {"slo.e2el_ms": 2000})
    assert scenario.slo.goodput_args() == ["--goodput", "ttft:500", "tpot:25", "e2el:2000"]
    assert load_scenario("cpu-tiny-dsa", {"slo.ttft_ms": None, "slo.tpot_ms": None}).slo.goodput_args() == []
