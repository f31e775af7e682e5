"""Dummy weights: GSM8K accuracy and MTP acceptance are not applicable, so the gate never uses them."""

import pytest

from harness.run.scenario import load_scenario

GATED_ON_REAL_WEIGHTS = {"gsm8k_accuracy", "acceptance_length"}


@pytest.mark.parametrize("name", ["glm-5.2-nvfp4-tp4", "deepseek-v3.2-fp8-tp8"])
def test_a_dummy_weights_scenario_never_gates_on_gsm8k_or_acceptance(name):
    dummy = load_scenario(name).effective()
    assert dummy.model.load_format == "dummy" and dummy.accuracy.enabled and dummy.mtp.num_speculative_tokens
    assert not GATED_ON_REAL_WEIGHTS & set(dummy.gate.primary)
    assert {"output_throughput", "mean_tpot_ms"} <= set(dummy.gate.primary)
    real = load_scenario(name, {"model.load_format": "auto"}).effective()
    assert GATED_ON_REAL_WEIGHTS <= set(real.gate.primary)


def test_plan_says_why(capsys):
    from harness.cli import main

    assert main(["plan", "--scenario", "glm-5.2-nvfp4-tp4"]) == 0
    assert "Dummy weights" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["glm-5.2-nvfp4-tp4", "deepseek-v3.2-fp8-tp8"])
def test_the_headline_runs_dense_and_sparse_levels_in_one_run_that_fit_the_model(name):
    """Issue #26: the short levels (input + output < index_topk: the indexer keeps every key) and long ones (≥ 8 ×
    index_topk: it drops most) are levels of one run, each long one within max_model_len ≤ the model's positions."""
    import json

    from harness.run.scenario import resolve_path

    scenario = load_scenario(name)
    config = json.loads((resolve_path(scenario.model.hf_config_path) / "config.json").read_text())
    levels = scenario.workload.levels()
    dense = [level for level in levels if level.input_len + level.output_len < config["index_topk"]]
    sparse = [level for level in levels if level.input_len >= 8 * config["index_topk"]]
    assert dense and sparse and {level.concurrency for level in sparse} < {level.concurrency for level in dense}
    assert scenario.workload.longest_request() <= scenario.model.max_model_len <= config["max_position_embeddings"]
