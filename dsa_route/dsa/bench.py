"""Decode-step attention time of DSA vs dense MLA at DeepSeek-V3.2's real geometry, over growing contexts.

    python -m dsa_route.dsa.bench                      # contexts 1k..16k, index_topk 2048, 128 heads / 64 index heads
    python -m dsa_route.dsa.bench --quick              # contexts 1k..4k, fewer repeats
    python -m dsa_route.dsa.bench --contexts 8192 --repeats 21 --batch 1

Shape legend: B sequences, T context tokens, H attention heads, Hi index heads, D hidden, Q q_lora_rank,
L kv_lora_rank, R rope dims, I index_head_dim, K index_topk.

Defaults are DeepSeek-V3.2's published dimensions (``scenarios/models/deepseek-v3.2/config.json``): H=128, Hi=64,
D=7168, Q=1536, L=512, R=64, I=128, and a decode batch of B=8 sequences. What is timed is one decode step of one layer
minus everything both arms do alike: the MLA projections (``wq_a``, ``wq_b``, ``wkv_a``, the ``W_UK``/``W_UV``
absorption, ``wo``) and the latent-cache write are the same work in both arms, so they are left out of both (with them
the ideal ratio at T=8192 would be 2.4, not 3.1: they are ≈ 187 M MACs per token). The two arms:
  dense : absorbed MQA over all T cached latents                                        (``sparse_mla.dense_mqa``)
  sparse: what only DSA does, timed part by part as well:
          proj+wr    the indexer projections (``Indexer``: ``wq_b``, ``wk`` + LayerNorm, ``weights_proj``, RoPE, FP8
                     of q) for the B new tokens and the FP8 indexer-cache write of their keys,
          indexer    per sequence the indexer logits over T keys (``indexer_logits``),
          topk       top-K of them (``topk_indices``),
          sp_mla     absorbed MQA over the K selected rows (``sparse_mla``).
Caches, queries and attention are in ``dtype`` for both arms, by default bf16 — the model's activation dtype (the
checkpoint's ``torch_dtype``), what a served DSA layer computes in; ``--dtype float32`` runs both arms in fp32 (the
reference's own accuracy setting), where this machine's fp32 GEMMs are relatively faster on dense attention's large
operands than on the sparse arm's many small ones (measured: 2.7× at T=8192 in fp32, 3.1–3.3× in bf16). The indexer's weights and the activations they multiply are in ``weight_dtype``, by default bf16, the
checkpoint's ``torch_dtype``: at small B these projections are bound by reading their weights (``wq_b`` alone is
Q·Hi·I = 12.6 M parameters per layer: 25 MB in bf16, 50 MB in fp32, 12.6 MB as the FP8 checkpoint stores it), which
the B new tokens share; ``--batch 1`` shows the unamortized case, ``--weight-dtype float32`` what fp32 weights cost.

The arms (alternating which goes first) and the sparse arm's parts are interleaved within each repeat, so background
load hits them alike. The table gives medians over repeats; ``dense/sparse`` is the median of the per-repeat ratios,
with their interquartile range and min-max. Under each measured row, ``ideal``: each part's multiply-accumulates
(``part_macs``) at the dense arm's measured time per MAC, and ``ideal_ratio``, dense MACs over the sparse arm's MACs —
what the sparse arm would reach if each of its parts ran as fast per MAC as dense attention. Not a test: it prints
numbers.
"""

from __future__ import annotations

import argparse
import os
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
    batch: int = 8
    repeats: int = 15
    warmup: int = 2
    device: str = "cpu"
    dtype: torch.dtype = torch.bfloat16
    weight_dtype: torch.dtype = torch.bfloat16
    seed: int = 0


@dataclass(frozen=True)
class BenchRow:
    """Medians over repeats (ms per step, all B sequences), the per-repeat dense/sparse ratios and the
    multiply-accumulate counts per decode token (``part_macs``)."""

    context: int
    dense_ms: float
    sparse_ms: float
    parts_ms: dict[str, float]
    ratios: tuple[float, ...]
    macs: dict[str, int]

    @property
    def dense_over_sparse(self) -> float:
        return statistics.median(self.ratios)

    @property
    def ideal(self) -> float:
        """Dense MACs / sparse MACs (the sparse arm's parts, exactly what it times)."""
        return _mac_ratio(self.macs)

    def ideal_parts_ms(self) -> dict[str, float]:
        """Each sparse part's MACs at the dense arm's measured ms per MAC: what it would cost at dense's speed."""
        return {part: self.dense_ms * self.macs[part] / self.macs["dense"] for part in PARTS}


def part_macs(settings: BenchSettings, T: int) -> dict[str, int]:
    """Multiply-accumulates for one decode token at context T, per timed part (K = min(index_topk, T)):
    dense        ``H·T·(L+R) + H·T·L``              scores, then values, over all T latents
    projections  ``Q·Hi·I + D·I + D·Hi``            the indexer's wq_b, wk, weights_proj (top-k and the FP8 cache
                                                   write are elementwise: 0)
    indexer      ``Hi·T·I + Hi·T``                  logits over T keys, then the head weighting
    topk         0
    sparse_mla   ``H·K·(L+R) + H·K·L``              scores, then values, over the K selected latents."""
    H, Hi, D, Q = settings.heads, settings.index_heads, settings.hidden_size, settings.q_lora_rank
    K = min(settings.index_topk, T)
    return {"dense": H * T * (2 * L + R), "projections": Q * Hi * I + D * I + D * Hi, "indexer": Hi * T * (I + 1),
            "topk": 0, "sparse_mla": H * K * (2 * L + R)}


def ideal_ratio(settings: BenchSettings, T: int) -> float:
    """Dense MACs / sparse MACs at context T (``part_macs``): the ratio if every part ran at one speed per MAC."""
    return _mac_ratio(part_macs(settings, T))


def _mac_ratio(macs: dict[str, int]) -> float:
    return macs["dense"] / sum(macs[part] for part in PARTS)


def _timed(fns: dict[str, Callable[[], object]], settings: BenchSettings) -> dict[str, list[float]]:
    """Wall time of each ``fn()`` in ms per repeat (CUDA synchronised), the fns interleaved within each repeat. The
    first two (the arms) swap places every other repeat, so neither always runs on caches the other just warmed."""
    sync = torch.cuda.synchronize if settings.device.startswith("cuda") else (lambda: None)
    for fn in fns.values():
        for _ in range(settings.warmup):
            fn()
    sync()
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for repeat in range(settings.repeats):
        order = names if repeat % 2 == 0 else [names[1], names[0], *names[2:]]
        for name in order:
            t0 = time.perf_counter()
            fns[name]()
            sync()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return times


@torch.no_grad()
def bench_context(settings: BenchSettings, T: int) -> BenchRow:
    """Time one decode step (one new token per sequence, at position T-1) for a context of T tokens."""
    g = torch.Generator().manual_seed(settings.seed)
    B, H, dev, dt, wdt = settings.batch, settings.heads, settings.device, settings.dtype, settings.weight_dtype
    config = DsaConfig.tiny(hidden_size=settings.hidden_size, q_lora_rank=settings.q_lora_rank,
                            index_n_heads=settings.index_heads, index_head_dim=I, qk_rope_head_dim=R)
    indexer = Indexer(config).to(dev, wdt)  # weights and the activations they multiply in the model's dtype
    for linear in (indexer.wq_b, indexer.wk, indexer.weights_proj):
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=g) * linear.weight.shape[-1] ** -0.5)
    x = torch.randn(B, 1, settings.hidden_size, generator=g).to(dev, wdt)  # normed hidden of the new tokens
    q_latent = torch.randn(B, 1, settings.q_lora_rank, generator=g).to(dev, wdt)
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
                    ratios=tuple(d / s for d, s in zip(ms["dense"], ms["sparse"])), macs=part_macs(settings, T))


def run_bench(settings: BenchSettings) -> list[BenchRow]:
    """One ``BenchRow`` per context length."""
    return [bench_context(settings, T) for T in settings.contexts]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def format_table(settings: BenchSettings, rows: list[BenchRow]) -> str:
    """The header (settings, threads, load average), then per context the measured row and the ``ideal`` row: each part's
    MACs at the dense arm's measured speed per MAC, and the MAC-count ratio."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    head = (f"DSA decode step, one layer: device={settings.device} dtype={_name(settings.dtype)} "
            f"weights={_name(settings.weight_dtype)} threads={torch.get_num_threads()} batch={settings.batch} "
            f"heads={settings.heads} index_heads={settings.index_heads} hidden={settings.hidden_size} "
            f"q_lora_rank={settings.q_lora_rank} index_topk={settings.index_topk} (kv_lora_rank {L}, rope {R}, "
            f"index_head_dim {I}); median of {settings.repeats} interleaved repeats, ms per step (all {settings.batch} "
            f"sequences); load average {load}")
    lines = [head, f"{'context':>8} {'':>6} {'dense_ms':>9} {'sparse_ms':>9} {'proj+wr':>8} {'indexer':>8} {'topk':>7} "
                   f"{'sp_mla':>7} {'dense/sparse':>12} {'[q1, q3]':>13} {'[min, max]':>13}"]
    for r in rows:
        q1, _, q3 = statistics.quantiles(r.ratios, n=4) if len(r.ratios) > 1 else (r.ratios[0],) * 3
        p, ideal = r.parts_ms, r.ideal_parts_ms()
        lines.append(f"{r.context:>8} {'meas.':>6} {r.dense_ms:>9.3f} {r.sparse_ms:>9.3f} {p['projections']:>8.3f} "
                     f"{p['indexer']:>8.3f} {p['topk']:>7.3f} {p['sparse_mla']:>7.3f} {r.dense_over_sparse:>12.2f} "
                     f"{f'[{q1:.2f}, {q3:.2f}]':>13} {f'[{min(r.ratios):.2f}, {max(r.ratios):.2f}]':>13}")
        lines.append(f"{'':>8} {'ideal':>6} {r.dense_ms:>9.3f} {sum(ideal.values()):>9.3f} {ideal['projections']:>8.3f} "
                     f"{ideal['indexer']:>8.3f} {ideal['topk']:>7.3f} {ideal['sparse_mla']:>7.3f} {r.ideal:>12.2f}")
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
                        help="caches, queries and attention (default bfloat16, the model's activation dtype)")
    parser.add_argument("--weight-dtype", choices=("float32", "bfloat16"), default=_name(defaults.weight_dtype),
                        help="the indexer's weights and input activations (default bfloat16: the checkpoint's "
                             "torch_dtype)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads on CPU (default 1: on a shared box contended threads swamp the "
                             "difference being measured; 0 keeps torch's default)")
    args = parser.parse_args(argv)
    if args.threads and not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype or _name(defaults.dtype))
    contexts = args.contexts or ((1024, 2048, 4096) if args.quick else defaults.contexts)
    settings = BenchSettings(contexts=contexts, index_topk=args.topk, heads=args.heads, index_heads=args.index_heads,
                             hidden_size=args.hidden_size, q_lora_rank=args.q_lora_rank, batch=args.batch,
                             repeats=args.repeats or (5 if args.quick else defaults.repeats), device=args.device,
                             dtype=dtype, weight_dtype=getattr(torch, args.weight_dtype))
    rows = run_bench(settings)
    print(format_table(settings, rows))
    return rows


if __name__ == "__main__":
    main()
