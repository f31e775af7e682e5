"""The embedded CPU default's wiring (cpu-tiny-dsa): the trained arithmetic checkpoint as its model, its GSM8K-format
task data generated at run time, its parity prompts taken from the task; the known-answer twin cpu-tiny-dsa-repeat."""

from __future__ import annotations

import json

import pytest

from dsa_route.tiny.arith import CHECKPOINT_DIR
from dsa_route.tiny.arith.task import generate, prompt_text
from harness.run import parity
from harness.run.gsm8k_data import AccuracyError, check_data_dir, resolve_data_dir
from harness.run.models import locate
from harness.run.scenario import ScenarioError, load_scenario


def test_the_default_serves_the_committed_arith_checkpoint():
    scenario = load_scenario("cpu-tiny-dsa")
    location = locate(scenario)
    assert location.path == str(CHECKPOINT_DIR) and location.tokenizer == str(CHECKPOINT_DIR)
    config = json.loads((CHECKPOINT_DIR / "config.json").read_text())
    assert config["architectures"] == [scenario.model.architecture]
    assert scenario.model.max_model_len <= config["max_position_embeddings"]
    assert scenario.accuracy.task == "tiny-arith" and scenario.accuracy.num_fewshot == 0
    assert scenario.accuracy.limit >= 128 and scenario.parity.prompts == "tiny-arith"


def test_the_repeat_last_twin_keeps_the_known_answer_preset():
    scenario = load_scenario("cpu-tiny-dsa-repeat")
    assert scenario.model.id == "generated:tiny-deepseek-v32-repeat" and scenario.accuracy.task == "gsm8k"
    assert scenario.parity.prompts == "generic" and scenario.parity.ignore_eos


def _index_topk() -> int:
    return json.loads((CHECKPOINT_DIR / "config.json").read_text())["index_topk"]


def test_task_prompts_fit_the_default_max_model_len():
    """Every test and parity prompt, plus lm-eval's 256 new tokens, fits max_model_len on the checkpoint's tokenizer."""
    from tokenizers import Tokenizer

    from harness.run.accuracy import MAX_GEN_TOKS

    scenario = load_scenario("cpu-tiny-dsa")
    tokenizer = Tokenizer.from_file(str(CHECKPOINT_DIR / "tokenizer.json"))
    prompts = [prompt_text(p.question) for p in generate(scenario.accuracy.limit, 1)]
    prompts += parity.prompts_of("tiny-arith", scenario.parity.n)
    longest = max(len(tokenizer.encode(text).ids) for text in prompts)
    assert _index_topk() < longest
    assert longest + max(MAX_GEN_TOKS, scenario.parity.max_tokens) <= scenario.model.max_model_len


def test_tiny_arith_data_dir_is_generated_seeded_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path))
    data = resolve_data_dir(None, None, task="tiny-arith", limit=8, default_dir=tmp_path / "none",
                            hub_check=lambda: pytest.fail("a generated task never asks the hub"))
    assert data.source == "local" and data.path.parent == tmp_path and "tiny-arith" in data.reason
    assert check_data_dir(data.path) == data.path
    test = [json.loads(line) for line in (data.path / "test.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (data.path / "train.jsonl").read_text().splitlines()]
    assert [row["question"] for row in test] == [p.question for p in generate(8, 1)]
    assert not {row["question"] for row in test} & {row["question"] for row in train}
    assert all(row["answer"].rsplit("\n", 1)[-1].startswith("#### ") for row in test)
    assert resolve_data_dir(None, None, task="tiny-arith", limit=8).path == data.path
    assert resolve_data_dir(None, None, task="tiny-arith", limit=16).path != data.path


def test_an_explicit_data_dir_wins_and_tiny_arith_needs_a_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path))
    generated = resolve_data_dir(None, None, task="tiny-arith", limit=4)
    explicit = resolve_data_dir(str(generated.path), None, task="tiny-arith", limit=99)
    assert explicit.reason.startswith("--gsm8k-data")
    with pytest.raises(AccuracyError, match="accuracy.limit"):
        resolve_data_dir(None, None, task="tiny-arith", limit=None)


@pytest.mark.parametrize("overrides, needle", [
    ({"accuracy.data_dir": "x"}, "generates its own data"),
    ({"accuracy.task": "gsm9k"}, "unknown accuracy.task"),
    ({"parity.prompts": "nope"}, "unknown parity.prompts"),
])
def test_bad_task_settings_are_one_line_errors(overrides, needle):
    with pytest.raises(ScenarioError, match=needle):
        load_scenario("cpu-tiny-dsa", overrides)


def test_tiny_arith_without_a_limit_is_refused():
    from harness.run.scenario import AccuracySpec

    with pytest.raises(ValueError, match="needs accuracy.limit"):
        AccuracySpec(enabled=True, task="tiny-arith")


def test_parity_prompts_come_from_the_task_and_stop_at_eos(tmp_path):
    from test_parity import _FakeVllm

    prompts = parity.prompts_of("tiny-arith", 4)
    assert prompts == [prompt_text(p.question) for p in generate(4, parity.PARITY_TASK_SEED)]
    assert not set(prompts) & {prompt_text(p.question) for p in generate(128, 1)}   # not the test split
    fake = _FakeVllm()
    try:
        parity.run_arm(tmp_path, "baseline", fake.base_url, "tiny", n=4, max_tokens=8, prompts="tiny-arith",
                       ignore_eos=False)
    finally:
        fake.close()
    assert sorted(body["prompt"] for body in fake.bodies) == sorted(prompts)
    assert all(body["ignore_eos"] is False for body in fake.bodies)
    stored = json.loads(parity.arm_path(tmp_path, "baseline").read_text())
    assert stored["settings"]["prompts"] == "tiny-arith" and stored["settings"]["ignore_eos"] is False
