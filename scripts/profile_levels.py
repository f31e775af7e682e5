"""Where a slow level's extra time goes (issue #27): per-level ``py-spy`` profiles of the EngineCore, fast levels
against slow levels of the same arm.

``scripts/carryover_probe.py --profile`` records each level's EngineCore with ``py-spy record --format raw``
(collapsed Python stacks, 250 Hz, ``--nonblocking``) into ``OUT/prof-<step>.txt`` beside ``OUT/rows.json``.
``--summarise OUT`` folds them into one small gzip-compressed JSON (per level: arm, server mean TPOT, samples, and per
function its leaf sample count: the samples in which that function was running Python code); the analysis reads that
summary. Per arm it splits the levels into thirds by server mean TPOT and, for the fastest and the slowest third,
compares the mean samples per function: if the slow levels' extra samples sit in one component (the scheduler, the
MTP draft, one op), the extra work is that component's; if every leaf grows by about the same factor, the whole
computation ran slower.

    PYTHONPATH=. .venv/bin/python scripts/profile_levels.py --summarise /tmp/prof1 --out SUMMARY.json.gz
    PYTHONPATH=. .venv/bin/python scripts/profile_levels.py results/carryover/pyspy-c1.json.gz
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
from pathlib import Path

import numpy as np

_LOCATION = re.compile(r" \((?P<file>[^():]+):\d+\)$")


def frame_name(frame: str) -> str:
    """``"Linear.forward (torch/nn/modules/linear.py:125)"`` → ``"Linear.forward (torch/nn/modules/linear.py)"``: a
    function, whatever line of it was running."""
    return _LOCATION.sub(lambda m: f" ({m['file']})", frame)


def fold(lines: list[str]) -> dict:
    """One level's collapsed stacks (``frame;frame;… count`` per line) → ``{"samples", "leaf"}``: all samples, and
    the samples per innermost function (:func:`frame_name`).

    Raises:
        ValueError: a line does not end in a sample count.
    """
    leaf, samples = collections.Counter(), 0
    for line in lines:
        if not line.strip():
            continue
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit():
            raise ValueError(f"not a collapsed-stack line (frame;frame;… count): {line[:80]!r}")
        samples += int(count)
        leaf[frame_name(stack.split(";")[-1])] += int(count)
    return {"samples": samples, "leaf": dict(leaf)}


def summarise(probe_dir: Path) -> list[dict]:
    """Every profiled level of a probe directory: its ``rows.json`` row's step, arm, server mean TPOT (ms) and output
    throughput (tok/s), with :func:`fold` of ``prof-<step>.txt``."""
    rows = json.loads((probe_dir / "rows.json").read_text())
    return [{"step": row["step"], "arm": row["arm"], "tpot": row["tpot"], "tput": row["tput"],
             **fold((probe_dir / f"prof-{row['step']}.txt").read_text().splitlines())}
            for row in rows if (probe_dir / f"prof-{row['step']}.txt").exists()]


def compare_thirds(levels: list[dict], top: int = 10) -> dict:
    """For one arm's levels: the fastest and slowest third by server mean TPOT, their mean samples, and the ``top``
    functions whose mean leaf count grew most from fast to slow, each with its growth factor; ``uniform`` is the
    correlation over functions of their fast and slow mean counts (1: every function grew alike)."""
    ranked = sorted(levels, key=lambda level: level["tpot"])
    third = max(1, len(ranked) // 3)
    fast, slow = ranked[:third], ranked[-third:]
    names = set().union(*(level["leaf"] for level in fast + slow))
    mean = {name: (np.mean([lv["leaf"].get(name, 0) for lv in fast]), np.mean([lv["leaf"].get(name, 0) for lv in slow]))
            for name in names}
    grown = sorted(mean.items(), key=lambda item: item[1][0] - item[1][1])[:top]
    pairs = np.array(list(mean.values()))
    return {"levels": len(levels), "fast_tpot_ms": float(np.mean([lv["tpot"] for lv in fast])),
            "slow_tpot_ms": float(np.mean([lv["tpot"] for lv in slow])),
            "fast_samples": float(np.mean([lv["samples"] for lv in fast])),
            "slow_samples": float(np.mean([lv["samples"] for lv in slow])),
            "uniform": float(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]),
            "grown": [{"function": name, "fast": round(f, 1), "slow": round(s, 1),
                       "factor": round(s / f, 2) if f else None} for name, (f, s) in grown]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", nargs="?", help="a summary (.json.gz, from --summarise) to analyse")
    parser.add_argument("--summarise", metavar="PROBE_DIR", help="fold a probe directory's prof-*.txt into --out")
    parser.add_argument("--out", help="where --summarise writes the summary (gzip-compressed JSON)")
    args = parser.parse_args()
    if args.summarise:
        if not args.out:
            parser.error("--summarise needs --out SUMMARY.json.gz")
        if not (Path(args.summarise) / "rows.json").exists():
            parser.error(f"{args.summarise} has no rows.json: pass a carryover_probe.py --profile output directory")
        Path(args.out).write_bytes(gzip.compress(json.dumps(summarise(Path(args.summarise))).encode()))
        return
    if not args.summary or not Path(args.summary).is_file():
        parser.error("pass a summary (.json.gz) written by --summarise")
    levels = json.loads(gzip.decompress(Path(args.summary).read_bytes()))
    for arm in sorted({level["arm"] for level in levels}):
        result = compare_thirds([level for level in levels if level["arm"] == arm])
        print(f"{arm}: {result['levels']} levels; server TPOT {result['fast_tpot_ms']:.2f} → "
              f"{result['slow_tpot_ms']:.2f} ms, samples {result['fast_samples']:.0f} → {result['slow_samples']:.0f} "
              f"(× {result['slow_samples'] / result['fast_samples']:.2f}); functions' fast-vs-slow correlation "
              f"{result['uniform']:.3f}")
        for row in result["grown"]:
            print(f"  {row['fast']:7.1f} → {row['slow']:7.1f}  × {row['factor']}  {row['function'][:110]}")


if __name__ == "__main__":
    main()
