"""The committed arithmetic DSA checkpoint: what it is (fast) and what it scores in the reference model (slow)."""

from __future__ import annotations

import json

import pytest

from dsa_route.tiny.arith import evaluate, sensitivity, task
from dsa_route.tiny.arith.model import CHECKPOINT_DIR

STRICT_FLOOR = 0.5  # the floor; served by vLLM CPU the checkpoint measured 62.5 % / 61.7 % (baseline /
# candidate, 128 problems, lm-eval strict-match)
N = 128


def test_checkpoint_files_and_record():
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "train.json", "loss.jsonl"):
        assert (CHECKPOINT_DIR / name).is_file(), name
    config = json.loads((CHECKPOINT_DIR / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV32ForCausalLM"] and config["index_n_heads"] >= 16
    assert (CHECKPOINT_DIR / "model.safetensors").stat().st_size < 8 * 2**20
    record = json.loads((CHECKPOINT_DIR / "train.json").read_text())
    assert record["command"].startswith("python -m dsa_route.tiny.arith.train") and "seed" in record
    curve = [json.loads(line) for line in (CHECKPOINT_DIR / "loss.jsonl").read_text().splitlines()]
    assert curve[-1]["lm"] < 0.2 * curve[0]["lm"] and curve[-1]["phase"] == "sparse"


@pytest.fixture(scope="module")
def loaded():
    return evaluate.load(CHECKPOINT_DIR, "bfloat16")


@pytest.mark.slow
def test_reference_accuracy_on_the_test_split(loaded):
    model, tok = loaded
    result = evaluate.evaluate(model, tok, task.generate(N, evaluate.TEST_SEED), mtp_n=32)
    assert result.accuracy["strict-match"] >= STRICT_FLOOR, result.accuracy
    assert result.mtp_acceptance_rate > 0.3  # the MTP layer was trained (an untrained draft is accepted ~never)


@pytest.mark.slow
def test_random_selection_costs_accuracy_and_parity(loaded):
    model, tok = loaded
    report = sensitivity.run(model, tok, 64, kinds=("topk-random",))
    assert report["topk-random"]["drop_points"]["strict-match"] >= 15, report
    assert report["topk-random"]["parity"] < 0.5, report
    assert sensitivity.sensitive(report["topk-random"])
