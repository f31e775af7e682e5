"""Decode-step attention time of DSA vs dense MLA at DeepSeek-V3.2's real geometry, over growing contexts.

    python -m dsa_route.dsa.bench                      # contexts 1k..16k, index_topk 2048, 128 heads / 64 index heads
    python -m dsa_route.dsa.bench --quick              # contexts 1k..4k, fewer repeats
    python -m dsa_route.dsa.bench --contexts 8192 --repeats 21

Shape legend: B sequences, T context tokens, H attention heads, Hi index heads, D hidden, Q q_lora_rank,
L kv_lora_rank, R rope dims, I index_head_dim, K index_topk.

Defaults are DeepSeek-V3.2's published dimensions (``scenarios/models/deepseek-v3.2/config.json``): H=128, Hi=64,
D=7168, Q=1536, L=512, R=64, I=128. One decode step of one layer, B sequences, everything both arms do alike left out
(the MLA projections, the latent-cache write); every cache is held dequantized in the bench dtype, for both arms:
  dense : absorbed MQA over all T cached latents                                        (``sparse_mla.dense_mqa``)
  sparse: what only DSA does: the indexer projections (``Indexer``: ``wq_b``, ``wk`` + LayerNorm, ``weights_proj``,
          RoPE, FP8 of q) for the B new tokens, the FP8 indexer-cache write of their keys, then per sequence the
          indexer logits over T keys (``indexer_logits``), top-K (``topk_indices``) and absorbed MQA over the K selected
          rows (``sparse_mla``).
The arms and the sparse arm's parts are interleaved within each repeat (background load hits them alike); the table
gives medians over repeats, ``dense/sparse`` is the median of the per-repeat ratios with its min-max spread, and
``ideal`` the ratio of multiply-accumulate counts (``ideal_ratio``) — what the sparse arm would reach if every part ran
at the dense arm's speed per MAC. At batch 1 the indexer projections are bound by reading their weights (``wq_b``
alone is Q·Hi·I = 12.6 M parameters, 50 MB in fp32, per layer and step), which a batch of B new tokens shares:
``--batch`` shows that amortization. Not a test: it prints numbers.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .config import DsaConfig
from .indexer import Indexer, indexer_logits
from .kv_cache import pack_indexer_keys, unpack_indexer_keys
from .rope import RopeTable
from .sparse_mla import dense_mqa, sparse_mla
from .topk import topk_indices

L, R, I = 512, 64, 128  # DeepSeek-V3.2 / GLM-5 latent, rope and index head geometry
PARTS = ("projections", "indexer", "topk", "sparse_mla")


@dataclass(frozen=True)
class BenchSettings:
    contexts: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)
    index_topk: int = 2048
    heads: int = 128
    index_heads: int = 64
    hidden_size: int = 7168
    q_lora_rank: int = 1536
    batch: int = 1
    repeats: int = 15
    warmup: int = 2
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    seed: int = 0


@dataclass(frozen=True)
class BenchRow:
    """Medians over repeats (ms per step, all B sequences) and the per-repeat dense/sparse ratios."""

    context: int
    dense_ms: float
    sparse_ms: float
    parts_ms: dict[str, float]
    ratios: tuple[float, ...]
    ideal: float

    @property
    def dense_over_sparse(self) -> float:
        return statistics.median(self.ratios)


def ideal_ratio(settings: BenchSettings, T: int) -> float:
    """Dense MACs / sparse MACs for one decode token at context T:
    dense  ``H·T·(L+R) + H·T·L``                         (scores, then values)
    sparse ``H·K·(L+R) + H·K·L + Hi·T·I + Hi·T + Q·Hi·I + D·I + D·Hi``  (attention over K = min(index_topk, T) rows,
           indexer logits and head weighting over T keys, indexer projections)."""
    H, Hi, D, Q = settings.heads, settings.index_heads, settings.hidden_size, settings.q_lora_rank
    K = min(settings.index_topk, T)
    dense = H * T * (2 * L + R)
    sparse = H * K * (2 * L + R) + Hi * T * (I + 1) + Q * Hi * I + D * I + D * Hi
    return dense / sparse


def _timed(fns: dict[str, Callable[[], object]], settings: BenchSettings) -> dict[str, list[float]]:
    """Wall time of each ``fn()`` in ms per repeat (CUDA synchronised), the fns interleaved within each repeat."""
    sync = torch.cuda.synchronize if settings.device.startswith("cuda") else (lambda: None)
    for fn in fns.values():
        for _ in range(settings.warmup):
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(settings.repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return times


@torch.no_grad()
def bench_context(settings: BenchSettings, T: int) -> BenchRow:
    """Time one decode step (one new token per sequence, at position T-1) for a context of T tokens."""
    g = torch.Generator().manual_seed(settings.seed)
    B, H, dev, dt = settings.batch, settings.heads, settings.device, settings.dtype
    config = DsaConfig.tiny(hidden_size=settings.hidden_size, q_lora_rank=settings.q_lora_rank,
                            index_n_heads=settings.index_heads, index_head_dim=I, qk_rope_head_dim=R)
    indexer = Indexer(config).to(dev, dt)
    for linear in (indexer.wq_b, indexer.wk, indexer.weights_proj):
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=g) * linear.weight.shape[-1] ** -0.5)
    x = torch.randn(B, 1, settings.hidden_size, generator=g).to(dev, dt)  # normed hidden of the new tokens
    q_latent = torch.randn(B, 1, settings.q_lora_rank, generator=g).to(dev, dt)
    cos, sin = (t.to(dev) for t in RopeTable.for_config(config).cos_sin(torch.full((B, 1), T - 1)))
    q = torch.randn(B, 1, H, L + R, generator=g).to(dev, dt)  # absorbed MLA queries
    kv = torch.randn(B, T, L + R, generator=g).to(dev, dt)  # latent cache
    index_k = torch.randn(B, T, I, generator=g).to(dev, dt)  # indexer cache (FP8 values, held dequantized)
    key_end = torch.full((1,), T, device=dev)
    scale = (128 + R) ** -0.5
    proj = indexer(x, q_latent, cos, sin)

    def dense():
        return [dense_mqa(q[b], kv[b], key_end, scale, L) for b in range(B)]

    def projections():  # the indexer projections and the FP8 write of the new keys into the indexer cache
        p = indexer(x, q_latent, cos, sin)
        index_k[:, T - 1] = unpack_indexer_keys(pack_indexer_keys(p.k[:, 0]), I).to(dt)
        return p

    def logits_of(b: int) -> torch.Tensor:
        return indexer_logits(proj.q[b], index_k[b], proj.weights[b], key_end)

    logits = [logits_of(b) for b in range(B)]
    indices = [topk_indices(lg, settings.index_topk) for lg in logits]

    def sparse():
        p = projections()
        return [sparse_mla(q[b], kv[b], topk_indices(indexer_logits(p.q[b], index_k[b], p.weights[b], key_end),
                                                     settings.index_topk), scale, L) for b in range(B)]

    ms = _timed({"dense": dense, "sparse": sparse, "projections": projections,
                 "indexer": lambda: [logits_of(b) for b in range(B)],
                 "topk": lambda: [topk_indices(lg, settings.index_topk) for lg in logits],
                 "sparse_mla": lambda: [sparse_mla(q[b], kv[b], indices[b], scale, L) for b in range(B)]}, settings)
    return BenchRow(context=T, dense_ms=statistics.median(ms["dense"]), sparse_ms=statistics.median(ms["sparse"]),
                    parts_ms={name: statistics.median(ms[name]) for name in PARTS},
                    ratios=tuple(d / s for d, s in zip(ms["dense"], ms["sparse"])), ideal=ideal_ratio(settings, T))


def run_bench(settings: BenchSettings) -> list[BenchRow]:
    """One ``BenchRow`` per context length."""
    return [bench_context(settings, T) for T in settings.contexts]


def format_table(settings: BenchSettings, rows: list[BenchRow]) -> str:
    head = (f"DSA decode step, one layer: device={settings.device} dtype={str(settings.dtype).removeprefix('torch.')} "
            f"threads={torch.get_num_threads()} batch={settings.batch} heads={settings.heads} "
            f"index_heads={settings.index_heads} hidden={settings.hidden_size} q_lora_rank={settings.q_lora_rank} "
            f"index_topk={settings.index_topk} (kv_lora_rank {L}, rope {R}, index_head_dim {I}); "
            f"median of {settings.repeats} interleaved repeats, ms per step")
    lines = [head, f"{'context':>8} {'dense_ms':>9} {'sparse_ms':>9} {'proj+wr':>8} {'indexer':>8} {'topk':>7} "
                   f"{'sp_mla':>7} {'dense/sparse':>12} {'[min, max]':>13} {'ideal':>6}"]
    for r in rows:
        p = r.parts_ms
        lines.append(f"{r.context:>8} {r.dense_ms:>9.3f} {r.sparse_ms:>9.3f} {p['projections']:>8.3f} "
                     f"{p['indexer']:>8.3f} {p['topk']:>7.3f} {p['sparse_mla']:>7.3f} {r.dense_over_sparse:>12.2f} "
                     f"{f'[{min(r.ratios):.2f}, {max(r.ratios):.2f}]':>13} {r.ideal:>6.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[BenchRow]:
    defaults = BenchSettings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="contexts 1k..4k, 5 repeats")
    parser.add_argument("--contexts", type=lambda s: tuple(int(x) for x in s.split(",")), default=None)
    parser.add_argument("--topk", type=int, default=defaults.index_topk)
    parser.add_argument("--heads", type=int, default=defaults.heads)
    parser.add_argument("--index-heads", type=int, default=defaults.index_heads)
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    parser.add_argument("--q-lora-rank", type=int, default=defaults.q_lora_rank)
    parser.add_argument("--batch", type=int, default=defaults.batch)
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
    contexts = args.contexts or ((1024, 2048, 4096) if args.quick else defaults.contexts)
    settings = BenchSettings(contexts=contexts, index_topk=args.topk, heads=args.heads, index_heads=args.index_heads,
                             hidden_size=args.hidden_size, q_lora_rank=args.q_lora_rank, batch=args.batch,
                             repeats=args.repeats or (5 if args.quick else defaults.repeats), device=args.device,
                             dtype=dtype)
    rows = run_bench(settings)
    print(format_table(settings, rows))
    return rows


if __name__ == "__main__":
    main()
