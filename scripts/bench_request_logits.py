"""Index scores of a decode batch: the flat ``[n, T]`` matrix against one call per request (issue #23's long parity
prompts made the first quadratic in the batch). Prints milliseconds per call of each, one thread, on this machine.

    PYTHONPATH=. .venv/bin/python scripts/bench_request_logits.py [--requests 64] [--keys 300]

Shapes are the default's indexer (16 heads × 64, bf16 keys) with MTP verification (2 queries per request).
"""

from __future__ import annotations

import argparse
import time

import torch

from dsa_route.dsa.indexer import indexer_logits
from dsa_route.vllm_cpu.attention import request_logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--keys", type=int, default=300, help="keys per request")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    heads, dim, R, L = 16, 64, args.requests, args.keys
    keys = torch.randn(R * L, dim).to(torch.bfloat16)                  # [T, I]
    key_start = torch.arange(R).repeat_interleave(2) * L               # [n]: 2 queries per request
    key_end = key_start + L - 1 + torch.tensor([0, 1] * R)
    q = torch.randn(2 * R, heads, dim).to(torch.bfloat16)              # [n, H, I]
    weights = torch.rand(2 * R, heads)                                 # [n, H]
    for name, call in (("flat [n, T]", lambda: indexer_logits(q, keys, weights, key_end, key_start)),
                       ("per request", lambda: request_logits(q, keys, weights, key_start, key_end))):
        call()
        started = time.perf_counter()
        for _ in range(args.repeats):
            call()
        print(f"{name}: {(time.perf_counter() - started) / args.repeats * 1000:.1f} ms per call "
              f"({R} requests × {L} keys, {2 * R} queries)")


if __name__ == "__main__":
    main()
