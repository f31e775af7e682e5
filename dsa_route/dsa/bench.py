"""Decode-step attention time of DSA (indexer + top-k + sparse MLA) vs dense MLA, over growing contexts.

    python -m dsa_route.dsa.bench            # contexts 1k..16k, index_topk 2048, CPU (CUDA when present)
    python -m dsa_route.dsa.bench --quick    # contexts 1k..4k, fewer repeats
    python -m dsa_route.dsa.bench --threads 0 --heads 128 --index-heads 64   # all cores, full DeepSeek-V3.2 heads

Shape legend: B sequences, T context tokens, H attention heads, Hi index heads, L kv_lora_rank, R rope dims,
I index_head_dim, K index_topk.

What one decode step of one layer costs once the projections are done (they are the same in both arms), with the real
DeepSeek-V3.2 head geometry (L=512, R=64, I=128) but few heads:
  dense : absorbed MQA over all T cached latents                        (``sparse_mla.dense_mqa``)
  sparse: indexer logits over T keys + top-K + absorbed MQA over K rows  (``indexer_logits``, ``topk_indices``,
          ``sparse_mla``)
Timings are the best of N interleaved repeats, in milliseconds per step (all B sequences). Not a test: it prints
numbers.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .indexer import indexer_logits
from .sparse_mla import dense_mqa, sparse_mla
from .topk import topk_indices

L, R, I = 512, 64, 128  # DeepSeek-V3.2 / GLM-5 latent, rope and index head geometry


@dataclass(frozen=True)
class BenchSettings:
    contexts: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)
    index_topk: int = 2048
    heads: int = 16
    index_heads: int = 16
    batch: int = 1
    repeats: int = 15
    warmup: int = 2
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    seed: int = 0


@dataclass(frozen=True)
class BenchRow:
    context: int
    dense_ms: float
    sparse_ms: float
    indexer_ms: float
    topk_ms: float
    sparse_mla_ms: float

    @property
    def dense_over_sparse(self) -> float:
        return self.dense_ms / self.sparse_ms


def _timed(fns: dict[str, Callable[[], object]], settings: BenchSettings) -> dict[str, float]:
    """Best-of-``repeats`` wall time of each ``fn()`` in ms (CUDA synchronised). The arms are interleaved within each
    repeat so background load hits them alike, and the minimum is reported: on a shared CPU it is the most stable
    estimate of the intrinsic cost (``timeit``'s advice)."""
    sync = torch.cuda.synchronize if settings.device.startswith("cuda") else (lambda: None)
    for fn in fns.values():
        for _ in range(settings.warmup):
            fn()
    sync()
    best = {name: float("inf") for name in fns}
    for _ in range(settings.repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync()
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
    return best


@torch.no_grad()
def bench_context(settings: BenchSettings, T: int) -> BenchRow:
    """Time one decode step (one new token per sequence, position T-1) for a context of T tokens."""
    g = torch.Generator().manual_seed(settings.seed)
    B, H, Hi, dev, dt = settings.batch, settings.heads, settings.index_heads, settings.device, settings.dtype
    q = torch.randn(B, 1, H, L + R, generator=g).to(dev, dt)
    kv = torch.randn(B, T, L + R, generator=g).to(dev, dt)
    index_q = torch.randn(B, 1, Hi, I, generator=g).to(dev, dt)
    index_k = torch.randn(B, T, I, generator=g).to(dev, dt)
    weights = (torch.randn(B, 1, Hi, generator=g) * (Hi * I) ** -0.5).to(dev)
    key_end = torch.full((1,), T, device=dev)
    scale = (128 + R) ** -0.5

    def dense():
        return [dense_mqa(q[b], kv[b], key_end, scale, L) for b in range(B)]

    def indexer():
        return [indexer_logits(index_q[b], index_k[b], weights[b], key_end) for b in range(B)]

    logits = indexer()

    def topk():
        return [topk_indices(lg, settings.index_topk) for lg in logits]

    indices = topk()

    def attend():
        return [sparse_mla(q[b], kv[b], indices[b], scale, L) for b in range(B)]

    def sparse():
        return [sparse_mla(q[b], kv[b], topk_indices(indexer_logits(index_q[b], index_k[b], weights[b], key_end),
                                                     settings.index_topk), scale, L) for b in range(B)]

    ms = _timed({"dense": dense, "sparse": sparse, "indexer": indexer, "topk": topk, "attend": attend}, settings)
    return BenchRow(context=T, dense_ms=ms["dense"], sparse_ms=ms["sparse"], indexer_ms=ms["indexer"],
                    topk_ms=ms["topk"], sparse_mla_ms=ms["attend"])


def run_bench(settings: BenchSettings) -> list[BenchRow]:
    """One ``BenchRow`` per context length."""
    return [bench_context(settings, T) for T in settings.contexts]


def format_table(settings: BenchSettings, rows: list[BenchRow]) -> str:
    head = (f"DSA decode step, one layer: device={settings.device} dtype={str(settings.dtype).removeprefix('torch.')} "
            f"threads={torch.get_num_threads()} batch={settings.batch} heads={settings.heads} "
            f"index_heads={settings.index_heads} index_topk={settings.index_topk} "
            f"(kv_lora_rank {L}, rope {R}, index_head_dim {I}); best of {settings.repeats}, ms per step")
    lines = [head, f"{'context':>8} {'dense_ms':>9} {'sparse_ms':>9} {'indexer':>8} {'topk':>7} {'sp_mla':>7} "
                   f"{'dense/sparse':>12}"]
    for r in rows:
        lines.append(f"{r.context:>8} {r.dense_ms:>9.3f} {r.sparse_ms:>9.3f} {r.indexer_ms:>8.3f} {r.topk_ms:>7.3f} "
                     f"{r.sparse_mla_ms:>7.3f} {r.dense_over_sparse:>12.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="contexts 1k..4k, 5 repeats")
    parser.add_argument("--contexts", type=lambda s: tuple(int(x) for x in s.split(",")), default=None)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--index-heads", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="default: float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads on CPU (default 1: on a shared box contended threads swamp the "
                             "difference being measured; 0 keeps torch's default)")
    args = parser.parse_args(argv)
    if args.threads and not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    contexts = args.contexts or ((1024, 2048, 4096) if args.quick else (1024, 2048, 4096, 8192, 16384))
    settings = BenchSettings(contexts=contexts, index_topk=args.topk, heads=args.heads, index_heads=args.index_heads,
                             batch=args.batch, repeats=args.repeats or (5 if args.quick else 15), device=args.device,
                             dtype=dtype)
    rows = run_bench(settings)
    print(format_table(settings, rows))
    return rows


if __name__ == "__main__":
    main()
