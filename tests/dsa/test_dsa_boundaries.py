"""Package boundaries of dsa_route.dsa, and a smoke run of its benchmark."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dsa_route.dsa as dsa
from dsa_route.dsa.bench import BenchSettings, format_table, ideal_ratio, main, run_bench

PACKAGE = Path(dsa.__file__).parent


def test_never_imports_vllm_or_harness():
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                assert name.split(".")[0] not in ("vllm", "harness"), f"{path.name} imports {name}"


def test_public_api_names():
    for name in ("DsaConfig", "DsaForCausalLM", "indexer_logits", "topk_indices", "sparse_mla", "pack_fp8_ds_mla",
                 "unpack_fp8_ds_mla"):
        assert hasattr(dsa, name), name


def test_bench_runs_and_formats():
    settings = BenchSettings(contexts=(128, 256), index_topk=128, heads=2, index_heads=2, hidden_size=256,
                             q_lora_rank=64, repeats=2, warmup=0)
    rows = run_bench(settings)
    assert [r.context for r in rows] == [128, 256] and all(r.dense_ms > 0 and r.sparse_ms > 0 for r in rows)
    assert all(len(r.ratios) == 2 and set(r.parts_ms) == {"projections", "indexer", "topk", "sparse_mla"} for r in rows)
    table = format_table(settings, rows)
    assert "dense/sparse" in table and "weights=bfloat16" in table and "load average" in table
    ideal_lines = [line for line in table.splitlines() if line.split()[:1] == ["ideal"]]
    assert [float(line.split()[-1]) for line in ideal_lines] == [round(r.ideal, 2) for r in rows]
    for r in rows:  # the ideal row: each part's MACs at the dense arm's speed, summing to dense_ms / ideal
        assert sum(r.ideal_parts_ms().values()) == pytest.approx(r.dense_ms / r.ideal)
        assert r.ideal_parts_ms()["topk"] == 0 and r.ideal == pytest.approx(ideal_ratio(settings, r.context))


def test_bench_command_prints_measured_and_ideal_rows(capsys):
    rows = main(["--contexts", "64", "--topk", "32", "--heads", "2", "--index-heads", "2", "--hidden-size", "128",
                 "--q-lora-rank", "32", "--batch", "2", "--repeats", "2", "--weight-dtype", "float32"])
    out = capsys.readouterr().out
    assert "batch=2" in out and "weights=float32" in out
    measured, ideal = out.splitlines()[2:4]
    assert measured.split()[:2] == ["64", "meas."] and float(measured.split()[8]) == round(rows[0].dense_over_sparse, 2)
    assert ideal.split()[0] == "ideal" and float(ideal.split()[-1]) == round(rows[0].ideal, 2)


def test_bench_ideal_ratio_counts_macs():
    real = BenchSettings()  # DeepSeek-V3.2: 4x fewer attention rows at 8k, plus the indexer and its projections
    assert 3.0 < ideal_ratio(real, 8192) < 3.2 and ideal_ratio(real, 16384) > 5.0
    assert ideal_ratio(real, 2048) < 1.0  # nothing skipped while T <= index_topk: the indexer is pure overhead
    H, Hi, D, Q, T, K = 128, 64, 7168, 1536, 8192, 2048  # the same count written out: 512 + 64 latent, 128 index dims
    dense, sparse = H * T * (512 + 64 + 512), H * K * (512 + 64 + 512) + Hi * T * 129 + Q * Hi * 128 + D * (128 + Hi)
    assert ideal_ratio(real, T) == pytest.approx(dense / sparse)
