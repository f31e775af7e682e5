"""What Ray placement costs: server start and throughput of Ray-placed servers vs local ones, in one run.

    PYTHONPATH=$PWD .venv/bin/python scripts/ray_overhead.py [--scenario S] [--repeats 3] [--concurrency 4]
        [--num-prompts 16] [--out DIR]

One arm's server (the scenario's baseline) is started ``--repeats`` times locally (a child process, as
``backend = "local"``) and as many times in a Ray actor on a Ray head this script starts (``backend = "ray"``, the
load client in an actor on the same node), in ABBA order (local, ray, ray, local, …) so drift hits both alike. Each
session measures seconds to ready (spawn → first successful completion) and one level's output throughput with
vLLM's own client. Printed: per-session values, the medians, and the ray/local ratios of the medians with the
range over repeats of the per-pair ratios. The default scenario is the smallest real one: the tiny DeepSeek-V3 with
dummy weights (the fault tests' model, served by the real vLLM CPU build).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.rundir.schema import LevelKey  # noqa: E402
from harness.run import procs, ray_backend  # noqa: E402
from harness.run.load import LoadClient, parse_bench_result  # noqa: E402
from harness.run.machine import detect  # noqa: E402
from harness.run.models import locate  # noqa: E402
from harness.run.placement import Slot  # noqa: E402
from harness.run.plan import build_plan  # noqa: E402
from harness.run.scenario import load_scenario  # noqa: E402
from harness.run.server import VllmServer, free_port  # noqa: E402

DEFAULT_SCENARIO = REPO / "tests" / "fixtures" / "scenarios" / "fault-tiny.toml"


def _session(kind: str, arm, plan, backend, local_client, env, folder: Path, concurrency: int) -> dict:
    log = folder / f"{kind}-server.log"
    if kind == "ray":
        server = backend.server(arm, Slot(backend="ray"), env, log, None)
    else:
        port = free_port()
        server = VllmServer(arm.server_argv(port), env, port, arm.served_model_name, log)
    try:
        ready_s = server.start(600)
        client = server.load_client or local_client
        raw = folder / "raw"
        raw.mkdir(exist_ok=True)
        key = LevelKey(plan.scenario.workload.levels()[0].regime.at(concurrency), 0)
        argv = plan.bench_argv(arm, key, server.base_url, raw)
        reply = client.run(argv, folder / f"{kind}-bench.log", 600)
        if not reply["ok"]:
            raise RuntimeError(f"{kind}: benchmark failed: {reply['error']}")
        result = json.loads((raw / key.raw_name(arm.name)).read_text())
        level, _ = parse_bench_result(result, arm.name, key.level, 0)
        return {"kind": kind, "ready_s": ready_s, "output_throughput": level["output_throughput"]}
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=str(DEFAULT_SCENARIO))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    scenario = load_scenario(args.scenario, {"workload.min_prompts": args.num_prompts,
                                             "workload.prompts_per_concurrency": 1}).effective()
    plan = build_plan(scenario, detect(), locate(scenario))
    arm = plan.arms[0]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FAKE_VLLM_")}, **arm.server_env}
    folder = Path(args.out or tempfile.mkdtemp(prefix="ray-overhead-"))
    folder.mkdir(parents=True, exist_ok=True)
    procs.cleanup_on_exit()
    backend = ray_backend.RayBackend("local", dict(os.environ))
    local_client = LoadClient(dict(os.environ), folder / "local-client.log")
    rows = []
    try:
        for repeat in range(args.repeats):
            for kind in (("local", "ray") if repeat % 2 == 0 else ("ray", "local")):
                row = {"repeat": repeat, **_session(kind, arm, plan, backend, local_client, env, folder,
                                                       args.concurrency)}
                rows.append(row)
                print(f"repeat {repeat} {kind:5s}: ready {row['ready_s']:.1f} s, "
                      f"{row['output_throughput']:.1f} output tok/s", flush=True)
    finally:
        local_client.close()
        backend.close()
    print(f"\n{scenario.name}, c={args.concurrency}, {args.num_prompts} prompts, {args.repeats} repeats; {folder}")
    for metric in ("ready_s", "output_throughput"):
        local = [r[metric] for r in rows if r["kind"] == "local"]
        ray = [r[metric] for r in rows if r["kind"] == "ray"]
        pairs = [b / a for a, b in zip(local, ray)]
        print(f"{metric}: local median {statistics.median(local):.2f}, ray median {statistics.median(ray):.2f}, "
              f"ray/local {statistics.median(ray) / statistics.median(local):.3f} "
              f"(per-repeat ratios {min(pairs):.3f}–{max(pairs):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
