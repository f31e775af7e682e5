"""The embedded CPU default's wiring (cpu-tiny-dsa): the trained arithmetic checkpoint as its model, its GSM8K-format
task data generated at run time, its parity prompts taken from the task; the known-answer twin cpu-tiny-dsa-repeat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsa_route.tiny.arith import CHECKPOINT_DIR, LONG_CHECKPOINT_DIR
from dsa_route.tiny.arith.task import generate, prompt_text
from harness.run import parity
from harness.run.gsm8k_data import AccuracyError, check_data_dir, resolve_data_dir
from harness.run.models import locate
from harness.run.scenario import ParitySpec, ScenarioError, load_scenario


def test_the_default_serves_the_committed_long_context_fine_tune():
    scenario = load_scenario("cpu-tiny-dsa")
    location = locate(scenario)
    assert location.path == str(LONG_CHECKPOINT_DIR) and location.tokenizer == str(LONG_CHECKPOINT_DIR)
    config = json.loads((LONG_CHECKPOINT_DIR / "config.json").read_text())
    assert config == json.loads((CHECKPOINT_DIR / "config.json").read_text())     # a fine-tune: the same shapes
    assert (LONG_CHECKPOINT_DIR / "tokenizer.json").read_bytes() == (CHECKPOINT_DIR / "tokenizer.json").read_bytes()
    train = json.loads((LONG_CHECKPOINT_DIR / "train.json").read_text())
    assert train["args"]["init"] == "dsa_route/tiny/arith/checkpoint" and train["progress"] == 1.0
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
    """Every test prompt plus lm-eval's 256 new tokens, and every parity prompt plus its ``max_tokens``, fits
    max_model_len on the checkpoint's tokenizer."""
    from tokenizers import Tokenizer

    from harness.run.accuracy import MAX_GEN_TOKS

    scenario = load_scenario("cpu-tiny-dsa")
    tokenizer = Tokenizer.from_file(str(CHECKPOINT_DIR / "tokenizer.json"))

    def longest(prompts):
        return max(len(tokenizer.encode(text).ids) for text in prompts)

    tests = longest(prompt_text(p.question) for p in generate(scenario.accuracy.limit, 1))
    assert _index_topk() < tests and tests + MAX_GEN_TOKS <= scenario.model.max_model_len
    assert longest(parity.prompts_of(scenario.parity)) + scenario.parity.max_tokens <= scenario.model.max_model_len


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

    spec = ParitySpec(prompts="tiny-arith", n=4, max_tokens=8, ignore_eos=False)
    prompts = parity.prompts_of(spec)
    assert prompts == [prompt_text(p.question) for p in generate(4, parity.PARITY_TASK_SEED)]
    assert not set(prompts) & {prompt_text(p.question) for p in generate(128, 1)}   # not the test split
    fake = _FakeVllm()
    try:
        parity.run_arm(tmp_path, "baseline", fake.base_url, "tiny", spec)
    finally:
        fake.close()
    assert sorted(body["prompt"] for body in fake.bodies) == sorted(prompts)
    assert all(body["ignore_eos"] is False for body in fake.bodies)
    stored = json.loads(parity.arm_path(tmp_path, "baseline").read_text())
    assert stored["settings"]["prompts"] == "tiny-arith" and stored["settings"]["ignore_eos"] is False


def test_long_parity_prompts_follow_the_short_ones_several_times_index_topk_long():
    """``[parity] long_n``: long problems of the same task (issue #23 item 4), after the ``n`` short ones; the
    default's long prompts are ≥ 4 × index_topk and, with their answer budget, fit max_model_len and one prefill."""
    from tokenizers import Tokenizer

    scenario = load_scenario("cpu-tiny-dsa")
    spec = scenario.parity
    assert spec.long_n > 0
    prompts = parity.prompts_of(spec)
    assert len(prompts) == spec.total and prompts[:spec.n] == parity.task_prompts(spec.n)
    tokenizer = Tokenizer.from_file(str(CHECKPOINT_DIR / "tokenizer.json"))
    long_lengths = [len(tokenizer.encode(text).ids) for text in prompts[spec.n:]]
    assert min(long_lengths) >= 4 * _index_topk()
    assert max(long_lengths) + spec.max_tokens <= min(scenario.model.max_model_len, scenario.serve.max_num_batched_tokens)
    with pytest.raises(ValueError, match="parity.long_n needs prompts"):
        ParitySpec(prompts="generic", long_n=4)


def test_parity_prompts_past_max_model_len_are_refused_before_anything_starts(tmp_path, capsys):
    """The fresh-clone review of 2026-12-05: ``long_distractors = [200, 300]`` made 1,268–1,867-token prompts against
    max_model_len 512; the plan said nothing, the run started both servers and its correctness cells went INVALID."""
    from harness.cli import main

    scenario = load_scenario("cpu-tiny-dsa")
    assert parity.length_error(scenario.parity, str(LONG_CHECKPOINT_DIR), scenario.model.max_model_len) is None
    path = tmp_path / "huge.toml"
    path.write_text(f'include = "{Path(__file__).resolve().parents[1] / "scenarios" / "cpu-tiny-dsa.toml"}"\n'
                    'name = "huge"\n\n[parity]\nprompts = "tiny-arith"\nn = 4\nlong_n = 4\n'
                    'long_distractors = [200, 300]\nmax_tokens = 96\nignore_eos = false\n')
    assert main(["compare", "--scenario", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "exceeds model.max_model_len 512" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
