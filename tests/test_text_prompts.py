"""Real-text levels (issue #26 item 2): GSM8K's problems cut to a level's input length with the arm's tokenizer, sent
through ``vllm bench serve --dataset-name custom``."""

import json

import pytest
from transformers import AutoTokenizer

from harness.cli import main
from harness.run import text_prompts
from harness.run.scenario import load_scenario
from harness.rundir.schema import Regime

TOKENIZER = "dsa_route/tiny/arith/checkpoint"     # the default's own tokenizer (tokenizer.json, committed)
PROBLEM = {"question": "Ann has {n} apples and buys {m} more. How many apples does she have now?",
           "answer": "She has {n} + {m} = <<{n}+{m}={s}>>{s} apples.\n#### {s}"}


@pytest.fixture
def gsm8k_dir(tmp_path):
    """A GSM8K-format data directory (train.jsonl, test.jsonl) of 20 made-up problems."""
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    rows = [{key: value.format(n=n, m=n + 3, s=2 * n + 3) for key, value in PROBLEM.items()} for n in range(20)]
    for name in ("train.jsonl", "test.jsonl"):
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return folder


def test_prompts_hold_the_levels_tokens_and_differ(gsm8k_dir):
    tokenizer = AutoTokenizer.from_pretrained(str(text_prompts.REPO_ROOT / TOKENIZER))
    texts = text_prompts.gsm8k_texts(gsm8k_dir)
    assert len(texts) == 20 and texts[0].startswith("Ann has 0 apples") and "#### 3" in texts[0]
    prompts = text_prompts.text_prompts(texts, tokenizer, 96, 25)           # more prompts than problems: cycling
    assert len(set(prompts)) == 20 and prompts[0] == prompts[20]
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    assert all(abs(n - 96) <= 2 for n in lengths), lengths                 # re-tokenising moves it a token at most
    with pytest.raises(ValueError):
        text_prompts.text_prompts([], tokenizer, 96, 1)


def test_the_dataset_file_is_what_vllms_custom_dataset_reads_and_the_bench_command_points_at_it(tmp_path, gsm8k_dir):
    path = text_prompts.write_dataset(tmp_path / "run" / "datasets" / "x.jsonl", ["a b", "c"])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"prompt": "a b"}, {"prompt": "c"}]
    from harness.run import plan as plan_mod
    from harness.run.models import locate

    scenario = load_scenario("cpu-tiny-dsa", {"workload.regimes": [{"input_len": 128, "output_len": 32,
                                                                    "dataset": "gsm8k", "concurrency": [2]}]})
    plan = plan_mod.build_plan(scenario, plan_mod.Machine("cpu", "planned", 2, 0, False), locate(scenario))
    (key,) = [key for key in plan.levels() if key.level.dataset == "gsm8k" and key.round == 0]
    argv = plan.bench_argv(plan.arms[0], key, "http://127.0.0.1:1", tmp_path / "run" / "raw")
    expected = text_prompts.dataset_path(tmp_path / "run", Regime("gsm8k", 128, 32))
    assert argv[argv.index("--dataset-name") + 1] == "custom" and argv[argv.index("--dataset-path") + 1] == str(
        expected)
    assert argv[argv.index("--custom-output-len") + 1] == "32" and "--skip-chat-template" in argv
    assert "--ignore-eos" in argv and "--random-input-len" not in argv


def test_real_text_levels_without_text_are_refused_before_anything_starts(tmp_path, capsys):
    scenario = tmp_path / "text.toml"
    scenario.write_text('include = "cpu-tiny-dsa"\nname = "text"\n\n[[workload.regimes]]\ninput_len = 128\n'
                        f'output_len = 32\ndataset = "gsm8k"\nconcurrency = [2]\ndata_dir = "{tmp_path / "nowhere"}"\n',
                        encoding="utf-8")
    assert main(["compare", "--scenario", str(scenario), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "128→32 gsm8k levels need GSM8K-format text" in err and "set data_dir in that [[workload.regimes]]" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
