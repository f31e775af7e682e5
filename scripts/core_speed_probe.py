"""How steady is this machine's core speed without vLLM? (issue #27: the noise floor under the gate's cells)

The CPU default's per-level paired sd of log output throughput stays at 0.034–0.05 whatever the harness controls
(results/carryover/README.md), and the engine's own CPU time per output token varies with it (r = 0.87 in
``q64-quiet.json``): the worker computes slower in some levels, it is not kept waiting. This probe asks whether a
fixed computation shows the same spread with no vLLM, no HTTP and no client: two worker processes, one pinned to
core 0 and one to core 1 (``os.sched_setaffinity``), each with one torch thread, as the default pins its two engines.
Each round runs a fixed amount of work (``--matmuls`` float32 products of a ``--size``² matrix with ``--size`` ×
``--batch`` columns, ≈ 1.8 s) on one worker, then the same on the other, in a seeded random order — the default's paired rounds, with only one side busy
at a time. A second pairing (``same-core``) runs both windows of a round on core 0: what a round-to-round change in
speed alone gives, with no core difference. ``--spin-other`` busy-polls ``sched_yield`` on the other core while a
window computes, as vLLM's EngineCore does beside its worker: what the other vCPU's activity costs the computing one.

Per window it records wall seconds and the worker's CPU seconds (``time.thread_time``). The paired statistic is
``log(wall_a / wall_b)`` per round; its sd is the floor a level's paired throughput ratio cannot go below on this
machine (if the work is the engine's kind: one thread, small matrices in cache).

    PYTHONPATH=. .venv/bin/python scripts/core_speed_probe.py --rounds 40 --out results/carryover/core-speed.json
    PYTHONPATH=. .venv/bin/python scripts/core_speed_probe.py --rounds 40 --spin-other \
        --out results/carryover/core-speed-spin.json
    PYTHONPATH=. .venv/bin/python scripts/core_speed_probe.py --rounds 40 --size 1024 --batch 4 --matmuls 1400 \
        --out results/carryover/core-speed-l3.json
    PYTHONPATH=. .venv/bin/python scripts/core_speed_probe.py --analyse results/carryover/core-speed.json

``--fresh-processes N`` asks instead what a fresh process costs: N processes started one after the other, each
pinned to core 1, time the same fixed work (3 windows, their median); the sd of their log times is the per-process
speed offset a fresh server session draws. ``--no-aslr`` starts each under ``setarch -R`` (the kernel's address
space layout randomisation off for it): if the offsets shrink, they are the code and data layout each process draws
(Mytkowicz et al. 2009, "Producing wrong data without doing anything obviously wrong!", ASPLOS; Curtsinger & Berger
2013, "STABILIZER", ASPLOS).

    PYTHONPATH=. .venv/bin/python scripts/core_speed_probe.py --fresh-processes 10 --size 32 --batch 1 \
        --matmuls 300000 --out results/carryover/process-offsets-aslr.json          # and again with --no-aslr
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import statistics
import time
from pathlib import Path


def _pinned_operands(core: int, size: int, batch: int, warmups: int):
    """Pin this process to ``core`` with one torch thread; a ``size × size`` and a ``size × batch`` float32 matrix,
    their product taken ``warmups`` times first (caches, allocator)."""
    import torch

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    a, b = torch.randn(size, size), torch.randn(size, batch)
    for _ in range(warmups):
        a @ b
    return a, b


def _worker(core: int, size: int, batch: int, matmuls: int, jobs, results) -> None:
    """One pinned process: for each job, ``matmuls`` products of a ``size × size`` float32 matrix with a
    ``size × batch`` one; puts ``(wall_s, cpu_s)``."""
    a, b = _pinned_operands(core, size, batch, 20)
    while jobs.get() is not None:
        start_wall, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(matmuls):
            a @ b
        results.put((time.perf_counter() - start_wall, time.thread_time() - start_cpu))


def _spinner(core: int, spin) -> None:
    """Busy-polls ``sched_yield`` on ``core`` while ``spin`` is set (what vLLM's EngineCore does on the core beside
    its worker: ``SpinCondition.wait``, vllm/distributed/device_communicators/shm_broadcast.py); idles otherwise."""
    os.sched_setaffinity(0, {core})
    while True:
        spin.wait()
        while spin.is_set():
            os.sched_yield()


def probe(args: argparse.Namespace) -> dict:
    """Run both pairings (module docstring); returns ``{"args", "pairings": {name: [round rows]}}``."""
    ctx = mp.get_context("spawn")
    cores = {"core0": 0, "core1": 1, "core0-again": 0}
    queues = {name: (ctx.Queue(), ctx.Queue()) for name in cores}
    workers = [ctx.Process(target=_worker, args=(core, args.size, args.batch or args.size, args.matmuls, *queues[name]), daemon=True)
               for name, core in cores.items()]
    spin = {core: ctx.Event() for core in (0, 1)}
    if args.spin_other:
        workers += [ctx.Process(target=_spinner, args=(core, spin[core]), daemon=True) for core in spin]
    for worker in workers:
        worker.start()
    rng = random.Random(args.seed)
    pairings = {"core0-vs-core1": ("core0", "core1"), "same-core": ("core0", "core0-again")}
    rows: dict[str, list[dict]] = {name: [] for name in pairings}
    try:
        for round_ in range(args.rounds):
            for pairing, sides in pairings.items():
                row = {"round": round_, "t": time.time(), "load": os.getloadavg()[0]}
                for name in rng.sample(sides, 2):
                    jobs, results = queues[name]
                    other = spin[1 - cores[name]]
                    if args.spin_other:
                        other.set()
                    jobs.put(True)
                    row[name] = dict(zip(("wall_s", "cpu_s"), results.get(timeout=600)))
                    other.clear()
                rows[pairing].append(row)
                a, b = sides
                print(pairing, round_, f"{math.log(row[a]['wall_s'] / row[b]['wall_s']):+.4f}", flush=True)
    finally:
        for jobs, _ in queues.values():
            jobs.put(None)
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.terminate()
    return {"args": {k: v for k, v in vars(args).items() if k != "analyse"}, "pairings": rows}


def _one_process(size: int, batch: int, matmuls: int) -> float:
    """This process, pinned to core 1 with one torch thread: the median wall seconds of 3 windows of the fixed work."""
    a, b = _pinned_operands(1, size, batch, 20000)
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(matmuls):
            a @ b
        walls.append(time.perf_counter() - start)
    return statistics.median(walls)


def process_offsets(args: argparse.Namespace) -> dict:
    """``--fresh-processes`` (module docstring): each process's median window seconds and their spread."""
    import subprocess
    import sys

    argv = [sys.executable, __file__, "--one-process", "--size", str(args.size), "--batch", str(args.batch or args.size),
            "--matmuls", str(args.matmuls)]
    walls = [float(subprocess.run((["setarch", "-R"] if args.no_aslr else []) + argv, check=True,
                                  capture_output=True, text=True).stdout) for _ in range(args.fresh_processes)]
    logs = [math.log(w) for w in walls]
    return {"args": {k: v for k, v in vars(args).items() if k != "analyse"}, "walls_s": walls,
            "analysis": {"processes": len(walls), "sd_log_wall": round(statistics.stdev(logs), 4),
                         "range_log_wall": round(max(logs) - min(logs), 4)}}


def analyse(record: dict) -> dict[str, dict[str, float]]:
    """Per pairing: the sd over rounds of the paired log wall ratio and of the CPU-time ratio, its lag-1
    autocorrelation, the sd of each side's own log wall time, and the windows' median length."""
    out = {}
    for pairing, rows in record["pairings"].items():
        a, b = sorted(k for k in rows[0] if k not in ("round", "t", "load"))
        wall = [math.log(r[a]["wall_s"] / r[b]["wall_s"]) for r in rows]
        cpu = [math.log(r[a]["cpu_s"] / r[b]["cpu_s"]) for r in rows]
        mean = statistics.fmean(wall)
        lag1 = (sum((x - mean) * (y - mean) for x, y in zip(wall, wall[1:]))
                / sum((x - mean) ** 2 for x in wall))
        out[pairing] = {
            "rounds": len(rows), "paired_sd_wall": statistics.stdev(wall), "paired_sd_cpu": statistics.stdev(cpu),
            "mean_log_ratio": mean, "lag1_autocorrelation": lag1,
            f"sd_log_wall_{a}": statistics.stdev(math.log(r[a]["wall_s"]) for r in rows),
            f"sd_log_wall_{b}": statistics.stdev(math.log(r[b]["wall_s"]) for r in rows),
            "window_s": statistics.median(r[a]["wall_s"] for r in rows),
            "load_median": statistics.median(r["load"] for r in rows)}
    return {p: {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()} for p, d in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--size", type=int, default=256, help="matrix side (float32; 256² × 3 ≈ 0.8 MB: in L2/L3)")
    ap.add_argument("--batch", type=int, default=0,
                    help="columns of the right-hand matrix (default: --size, square); a few columns with a large "
                         "--size make the product read its matrix from L3 every time, as a decode step reads weights")
    ap.add_argument("--matmuls", type=int, default=4000, help="products per window (≈ 2 s on this VM)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spin-other", action="store_true",
                    help="while a window computes, busy-poll sched_yield on the other core (the EngineCore's loop)")
    ap.add_argument("--fresh-processes", type=int, default=0, help="time N fresh processes instead (docstring)")
    ap.add_argument("--no-aslr", action="store_true", help="start each fresh process under setarch -R")
    ap.add_argument("--one-process", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help="write the rows and the analysis here (JSON)")
    ap.add_argument("--analyse", help="print the analysis of a recorded JSON")
    args = ap.parse_args()
    if args.one_process:
        print(_one_process(args.size, args.batch or args.size, args.matmuls))
        return
    if args.analyse:
        record = json.loads(Path(args.analyse).read_text())
        print(json.dumps(record["analysis"] if "walls_s" in record else analyse(record), indent=1))
        return
    if args.fresh_processes:
        record = process_offsets(args)
    else:
        record = probe(args)
        record["analysis"] = analyse(record)
    print(json.dumps(record["analysis"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(record))


if __name__ == "__main__":
    main()
