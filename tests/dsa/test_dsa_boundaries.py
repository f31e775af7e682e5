"""Package boundaries of dsa_route.dsa, and a smoke run of its benchmark."""

from __future__ import annotations

import ast
from pathlib import Path

import dsa_route.dsa as dsa
from dsa_route.dsa.bench import BenchSettings, format_table, run_bench

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
    settings = BenchSettings(contexts=(128, 256), index_topk=128, heads=2, index_heads=2, repeats=1, warmup=0)
    rows = run_bench(settings)
    assert [r.context for r in rows] == [128, 256] and all(r.dense_ms > 0 and r.sparse_ms > 0 for r in rows)
    assert "dense/sparse" in format_table(settings, rows)
