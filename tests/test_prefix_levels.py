"""Prefix-reuse levels (issue #26 item 3): a ``prefix_repetition`` regime goes to vLLM's own prefix-repetition dataset
with its shared prefix, each level sends whole prefix groups, and each arm's prefix-cache hit rate is read from its
``/metrics`` over the measured window, pooled per level into ``verdict.json`` and ``summary.md``."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from harness.judge.prefix_cache import prefix_cache
from harness.run import plan as plan_mod
from harness.run import server_metrics
from harness.run.models import locate
from harness.run.scenario import ScenarioError, load_scenario

PREFIX_REGIME = {"input_len": 128, "output_len": 16, "dataset": "prefix_repetition", "prefix_len": 96,
                 "num_prefixes": 3, "concurrency": [4], "min_prompts": 16}


def _plan(regime=PREFIX_REGIME):
    scenario = load_scenario("cpu-tiny-dsa", {"workload.regimes": [regime]})
    return plan_mod.build_plan(scenario, plan_mod.Machine("cpu", "planned", 2, 0, False), locate(scenario))


def test_a_prefix_level_sends_whole_groups_to_vllms_prefix_repetition_dataset(tmp_path):
    plan = _plan()
    (key,) = [key for key in plan.levels() if key.level.dataset == "prefix_repetition" and key.round == 0]
    assert str(key.level) == "prefix_repetition-i128-o16-c4"
    assert plan.num_prompts(key.level) == 18          # min_prompts 16 rounded up to 3 groups of 6
    argv = plan.bench_argv(plan.arms[0], key, "http://127.0.0.1:1", tmp_path / "raw")
    parser = argparse.ArgumentParser()
    from vllm.benchmarks.serve import add_cli_args

    add_cli_args(parser)
    args, unknown = parser.parse_known_args(argv[3:])
    assert not unknown and args.dataset_name == "prefix_repetition" and args.ignore_eos
    assert (args.prefix_repetition_prefix_len, args.prefix_repetition_suffix_len, args.prefix_repetition_num_prefixes,
            args.prefix_repetition_output_len, args.num_prompts) == (96, 32, 3, 16, 18)


def test_vllms_dataset_builds_exactly_the_levels_prompts_from_those_flags():
    """The flags above, read by vLLM's own ``PrefixRepetitionRandomDataset`` with the default's tokenizer: 18 prompts
    of ≈ 128 tokens (vLLM re-encodes each part to its length, a few tokens over at worst: its own warning), in 3
    groups of 6 that share their first 96 tokens."""
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets.datasets import PrefixRepetitionRandomDataset

    tokenizer = AutoTokenizer.from_pretrained(locate(load_scenario("cpu-tiny-dsa")).tokenizer)
    requests = PrefixRepetitionRandomDataset(random_seed=0).sample(
        tokenizer, num_requests=18, prefix_len=96, suffix_len=32, num_prefixes=3, output_len=16)
    tokens = [tokenizer.encode(r.prompt, add_special_tokens=False) for r in requests]
    assert len(requests) == 18 and all(128 <= r.prompt_len <= 132 for r in requests)
    prefixes = pd.Series([tuple(t[:90]) for t in tokens]).value_counts()
    assert sorted(prefixes) == [6, 6, 6]


@pytest.mark.parametrize("regime, message", [
    ({"input_len": 128, "output_len": 16, "dataset": "prefix_repetition"}, "needs prefix_len"),
    ({"input_len": 128, "output_len": 16, "dataset": "prefix_repetition", "prefix_len": 128}, "needs prefix_len"),
    ({"input_len": 128, "output_len": 16, "prefix_len": 64}, "prefix_len and num_prefixes are for a prefix-reuse"),
])
def test_a_bad_prefix_regime_is_refused_in_one_line(regime, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario("cpu-tiny-dsa", {"workload.regimes": [regime]})


def test_the_workloads_own_regime_cannot_be_a_prefix_one():
    with pytest.raises(ScenarioError, match="declare the prefix-reuse levels as a \\[\\[workload.regimes\\]\\] entry"):
        load_scenario("cpu-tiny-dsa", {"workload.dataset": "prefix_repetition"})


def _metrics(queries: float, hits: float) -> str:
    registry = CollectorRegistry()
    for name, value in (("vllm:prefix_cache_queries", queries), ("vllm:prefix_cache_hits", hits)):
        counter = Counter(name, name, ["engine"], registry=registry)
        counter.labels("0").inc(value)
    return generate_latest(registry).decode()


def test_the_hit_rate_is_delta_hits_over_delta_queries_of_the_window():
    fields = server_metrics.window(_metrics(500, 100), _metrics(2500, 1300), duration_s=1.0)
    assert (fields["prefix_cache_queries"], fields["prefix_cache_hits"]) == (2000, 1200)
    assert fields["prefix_cache_hit_rate"] == pytest.approx(0.6)
    idle = server_metrics.window(_metrics(500, 100), _metrics(500, 100), duration_s=1.0)
    assert idle["prefix_cache_queries"] == 0 and idle["prefix_cache_hit_rate"] is None


def test_each_arms_rate_pools_its_rounds_tokens_and_summary_names_the_levels_that_hit():
    from harness.render.summary import _prefix_cache_lines

    level = "prefix_repetition-i128-o16-c4"
    levels = pd.DataFrame([
        {"level": level, "arm": "baseline", "prefix_cache_hits": 300, "prefix_cache_queries": 400},
        {"level": level, "arm": "baseline", "prefix_cache_hits": 100, "prefix_cache_queries": 600},
        {"level": level, "arm": "candidate", "prefix_cache_hits": 0, "prefix_cache_queries": 1000},
        {"level": "random-i64-o32-c4", "arm": "baseline", "prefix_cache_hits": 0, "prefix_cache_queries": 900},
        {"level": "random-i64-o32-c4", "arm": "candidate", "prefix_cache_hits": None, "prefix_cache_queries": None},
    ])
    rows = prefix_cache(levels)
    assert [(r.level, r.arm, r.hits, r.queries, r.rate) for r in rows] == [
        (level, "baseline", 400, 1000, 0.4), (level, "candidate", 0, 1000, 0.0),
        ("random-i64-o32-c4", "baseline", 0, 900, 0.0)]
    (line, _) = _prefix_cache_lines([r.to_dict() for r in rows])
    assert "baseline 40.0 % (400/1000 tokens), candidate 0.0 % (0/1000 tokens)" in line
    assert "64→32" not in line   # a level where no arm hit the cache is left out
