"""Level carryover probe (issue #27): does a level read differently right after the same arm's previous level?

Both arms of the CPU default (`cpu-tiny-dsa`) are made A/A copies of the baseline (the compiled arm, ``aa_overrides``)
and stay up for the whole probe, in one server session each; one level (random 64 in / 32 out, concurrency
``--concurrency``, ``--prompts`` prompts) is sent ``--levels`` times to an arm drawn by a seeded coin — or, with
``--paired``, to both arms of each round in a random order. The unit is the level. Per level it records output
throughput, the server's TPOT, engine steps/s, tokens per step, each process's CPU time per output token, its start
and end (Unix s) and the host's 1-minute load. ``--profile`` records each level's EngineCore with ``py-spy`` into
``OUT/prof-<step>.txt`` (``scripts/profile_levels.py`` reads them).

Analysis (``--analyse ROWS.json ...`` recomputes it from recorded rows): OLS of log y on
``arm + after_own + step`` (first level left out: it has no predecessor), ``after_own`` = the previous level was
the same arm's; its 95 % t interval is the carryover. With ``--paired``: the sd over rounds of the candidate − baseline
log ratio, the per-level paired sd the gate's cells see (issue #27's target ≤ 0.02).

    PYTHONPATH=. .venv/bin/python scripts/carryover_probe.py --out /tmp/probe --levels 60 --paired --pin other
    PYTHONPATH=. .venv/bin/python scripts/carryover_probe.py --out /tmp/mp --levels 40 --paired \
        --env VLLM_ENABLE_V1_MULTIPROCESSING=1      # vLLM's mp executor (the default's before 2026-12-05 night)
    PYTHONPATH=. .venv/bin/python scripts/carryover_probe.py --out /tmp/same --levels 40 --paired --concurrency 1 \
        --pin samecore                      # or --serve-arg=--num-gpu-blocks-override=64 (a 64-block KV pool)
    PYTHONPATH=. .venv/bin/python scripts/carryover_probe.py --out /tmp/prof1 --levels 40 --paired --concurrency 1 \
        --profile                           # or --pin mainthread, --prompts 4 --levels 160, --env VLLM_GC_DEBUG=1
    PYTHONPATH=. .venv/bin/python scripts/carryover_probe.py --analyse results/carryover/*.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

METRICS = ("tput", "tpot", "steps_per_s", "tps", "worker_ms_tok")
CORES = {"baseline": 0, "candidate": 1}
PY_SPY = Path(sys.executable).with_name("py-spy")
CPU_COLUMNS = {"Worker": "worker_ms_tok", "EngineCore": "core_ms_tok", "api": "api_ms_tok"}   # ms per output token


def _cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of a server's API process, EngineCore and Worker (by process name)."""
    import psutil

    out = {"Worker": 0.0, "EngineCore": 0.0, "api": 0.0}
    root = psutil.Process(pid)
    for proc in [root] + root.children(recursive=True):
        try:
            name, times = proc.name(), proc.cpu_times()
        except psutil.Error:
            continue
        key = ("Worker" if "Worker" in name else "EngineCore" if "EngineCore" in name
               else "api" if proc.pid == pid or name in ("vllm", "taskset") else None)
        if key:
            out[key] += times.user + times.system
    return out


def _pin_engine(pid: int, core: int) -> None:
    """Bind every thread of the server's EngineCore process (and its children) to ``core``."""
    import psutil

    for proc in psutil.Process(pid).children(recursive=True):
        if "EngineCore" in proc.name() or "Worker" in proc.name():
            for thread in proc.threads():
                os.sched_setaffinity(thread.id, {core})


def _engine_pid(pid: int) -> int:
    """The pid of the server's EngineCore process."""
    import psutil

    return next(p.pid for p in psutil.Process(pid).children(recursive=True) if "EngineCore" in p.name())


def _pin_main_thread(pid: int, core: int) -> None:
    """The EngineCore's main thread (the model's steps) alone on ``core``; its other threads (ZMQ I/O, the input and
    output socket threads) on the other core."""
    import psutil

    engine = psutil.Process(_engine_pid(pid))
    for thread in engine.threads():
        os.sched_setaffinity(thread.id, {core if thread.id == engine.pid else 1 - core})


def _profiler(pid: int, path: Path) -> subprocess.Popen:
    """``py-spy record`` of the server's EngineCore (collapsed stacks, 250 Hz, not pausing it) into ``path``, running
    until SIGINT; started ≈ 1 s before the level it profiles."""
    proc = subprocess.Popen([str(PY_SPY), "record", "--pid", str(_engine_pid(pid)), "--format", "raw", "--rate", "250",
                             "--nonblocking", "-o", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    return proc


def probe(args: argparse.Namespace) -> list[dict]:
    """Run the probe (module docstring); returns and writes ``OUT/rows.json``."""
    from harness.compare import CompareRequest, aa_overrides, build_plan
    from harness.run import host_load, server_metrics
    from harness.run.load import LoadClient, parse_bench_result, read_bench_json
    from harness.run.placement import slot_for
    from harness.run.scenario import load_scenario
    from harness.run.server import VllmServer, free_port
    from harness.rundir.schema import LevelKey

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = load_scenario("cpu-tiny-dsa").arms["baseline"]
    overrides = {**aa_overrides(base, None), "workload.concurrency": [args.concurrency], "workload.regimes": [],
                 "workload.min_prompts": args.prompts}
    plan, _ = build_plan(CompareRequest(scenario="cpu-tiny-dsa", overrides=overrides), to_run=True)
    level = next(iter(plan.scenario.workload.levels()))
    slots = plan.scenario.cluster.slots([arm.name for arm in plan.arms])
    extra = dict(item.split("=", 1) for item in args.env)
    if args.pin == "samecore":   # both engines on core 0 (the plugin binds them); API servers and client on core 1
        os.sched_setaffinity(0, {1})
        extra["VLLM_CPU_OMP_THREADS_BIND"] = "0"
    servers, clients, rows = {}, {}, []
    try:
        for arm in plan.arms:
            port = free_port()
            argv = arm.server_argv(port) + args.serve_arg
            if args.pin in ("other", "own"):   # other: the API server (and its engine) on the other arm's core; own: its own
                argv = ["taskset", "-c", str(CORES[arm.name] if args.pin == "own" else 1 - CORES[arm.name])] + argv
            env = {**os.environ, **arm.server_env, **slot_for(0, arm.name, slots, False).env(), **extra}
            server = VllmServer(argv, env, port, arm.served_model_name, out / f"{arm.name}.log")
            print(arm.name, "ready in", round(server.start(600), 1), "s", flush=True)
            if args.pin == "engine":   # every thread of the EngineCore on the arm's own core (uni executor)
                _pin_engine(server.proc.pid, CORES[arm.name])
            if args.pin == "mainthread":
                _pin_main_thread(server.proc.pid, CORES[arm.name])
            servers[arm.name] = (arm, server)
        for name in (servers if args.two_clients else ["one"]):
            clients[name] = LoadClient(dict(os.environ), out / f"client-{name}.log")
            clients[name].start()
        rng, previous, pair = random.Random(args.seed), None, []
        for step in range(args.levels):
            if args.paired and step % 2 == 0:
                pair = rng.sample(list(CORES), 2)
            name = pair[step % 2] if args.paired else rng.choice(list(CORES))
            arm, server = servers[name]
            key = LevelKey(level, step // 2 if args.paired else step)
            profiler = _profiler(server.proc.pid, out / f"prof-{step}.txt") if args.profile else None
            before, started = _cpu_seconds(server.proc.pid), time.time()
            result = clients[name if args.two_clients else "one"].run(
                plan.bench_argv(arm, key, server.base_url, out, arm.served_model_name), out / f"bench-{name}.log", 600)
            after = _cpu_seconds(server.proc.pid)
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(30)
            bench = read_bench_json(out / key.raw_name(name))
            row, _ = parse_bench_result(bench, name, level, step, 0)
            columns, _ = server_metrics.level_columns(bench)
            tokens = bench["total_output_tokens"]
            rows.append({"step": step, "round": key.round, "arm": name, "after_own": previous == name,
                         "tput": row["output_throughput"], "tpot": columns.get("server_mean_tpot_ms"),
                         "steps_per_s": columns.get("engine_steps_per_s"), "tps": columns.get("tokens_per_step"),
                         "wall": result.get("wall_s"), "start": started, "end": time.time(),
                         "load": host_load.read_load_1m(),
                         **{CPU_COLUMNS[k]: 1000 * (after[k] - before[k]) / tokens for k in before}})
            print(json.dumps(rows[-1]), flush=True)
            previous = name
        (out / "rows.json").write_text(json.dumps(rows))
    finally:
        for client in clients.values():
            client.close()
        for _, server in servers.values():
            server.stop()
    return rows


def analyse(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per metric of :data:`METRICS` present: the ``after_own`` OLS coefficient of log y and its 95 % interval, the
    residual sd, and (rows with ``round`` pairs) the paired per-round sd of the candidate − baseline log ratio."""
    out = {}
    fitted = rows[1:]
    for metric in [m for m in METRICS if all(r.get(m) for r in rows)]:
        y = np.log([r[metric] for r in fitted])
        x = np.array([[1.0, r["arm"] == "candidate", r["after_own"], r["step"]] for r in fitted], dtype=float)
        beta, *_ = np.linalg.lstsq(x, y, rcond=None)
        resid = y - x @ beta
        dof = len(y) - x.shape[1]
        se = math.sqrt((resid @ resid / dof) * np.linalg.inv(x.T @ x)[2, 2])
        half = stats.t.ppf(0.975, dof) * se
        entry = {"after_own": beta[2], "low": beta[2] - half, "high": beta[2] + half,
                 "resid_sd": math.sqrt(resid @ resid / dof), "levels": len(y)}
        pairs: dict[int, dict[str, float]] = {}
        for r in rows:
            pairs.setdefault(r.get("round", r["step"]), {})[r["arm"]] = r[metric]
        ratios = [math.log(p["candidate"] / p["baseline"]) for p in pairs.values() if len(p) == 2]
        if len(ratios) > 2 and "round" in rows[0]:
            entry["paired_sd"], entry["pairs"] = float(np.std(ratios, ddof=1)), len(ratios)
        out[metric] = {k: round(float(v), 4) for k, v in entry.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="where the probe writes its levels and rows.json")
    ap.add_argument("--levels", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--paired", action="store_true", help="both arms every round, in a random order")
    ap.add_argument("--pin", choices=("none", "other", "own", "engine", "samecore", "mainthread"), default="none",
                    help="taskset each server: on the other arm's core, on its own, or not at all; engine: bind "
                         "each EngineCore's threads to the arm's core once it is up; samecore: both engines on "
                         "core 0, the API servers and the client on core 1; mainthread: the EngineCore's main "
                         "thread alone on the arm's core, its other threads on the other core")
    ap.add_argument("--profile", action="store_true", help="py-spy each level's EngineCore into OUT/prof-<step>.txt")
    ap.add_argument("--two-clients", action="store_true", help="one load-client process per arm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for both servers")
    ap.add_argument("--serve-arg", action="append", default=[], help="an extra `vllm serve` argument for both servers")
    ap.add_argument("--analyse", nargs="+", metavar="ROWS", help="analyse recorded rows.json files instead")
    args = ap.parse_args()
    if args.analyse:
        for path in args.analyse:
            print(path, json.dumps(analyse(json.loads(Path(path).read_text()))))
        return
    if not args.out:
        sys.exit("carryover_probe: give --out DIR (or --analyse ROWS.json)")
    if args.profile and not PY_SPY.exists():
        sys.exit(f"carryover_probe: --profile needs py-spy at {PY_SPY}: "
                 f"{Path(sys.executable).parent}/pip install py-spy")
    print(json.dumps(analyse(probe(args))))


if __name__ == "__main__":
    main()
