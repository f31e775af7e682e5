"""dsa_route.engine_bind: which processes an in-process (uni executor) CPU engine binding touches, and that it binds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dsa_route.engine_bind import cores_to_bind, parse_id_list

UNI = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "0"}


@pytest.mark.parametrize("env, process, expected", [
    (UNI, "EngineCore", (0,)),
    (UNI, "EngineCore_DP0", (0,)),
    ({**UNI, "VLLM_CPU_OMP_THREADS_BIND": "1-2,4"}, "EngineCore", (1, 2, 4)),
    (UNI, "MainProcess", None),                                        # the API server: not the engine
    ({**UNI, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, "EngineCore", None),  # mp: vLLM binds its worker itself
    ({"VLLM_CPU_OMP_THREADS_BIND": "0"}, "EngineCore", None),           # the default is mp
    ({**UNI, "VLLM_CPU_OMP_THREADS_BIND": "auto"}, "EngineCore", None),
    ({**UNI, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}, "EngineCore", None),
    ({**UNI, "VLLM_CPU_OMP_THREADS_BIND": "0|1"}, "EngineCore", None),  # one list per rank: vLLM's
    ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, "EngineCore", None),      # unset: auto
])
def test_cores_to_bind(env, process, expected):
    assert cores_to_bind(env, process) == expected


def test_cores_to_bind_rejects_a_malformed_list():
    with pytest.raises(ValueError, match="not an id list"):
        cores_to_bind({**UNI, "VLLM_CPU_OMP_THREADS_BIND": "zero"}, "EngineCore")
    assert parse_id_list("0-2,5") == (0, 1, 2, 5)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two usable cores")
def test_apply_binds_every_thread_and_torch_threads_in_a_child_process():
    core = max(os.sched_getaffinity(0))
    script = """
import json, os, threading, torch
from dsa_route.engine_bind import apply, cores_to_bind
early = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True); early.start()
bound = cores_to_bind(os.environ, "EngineCore")
apply(os.environ, bound, torch.set_num_threads)
late = []
t = threading.Thread(target=lambda: late.append(sorted(os.sched_getaffinity(0)))); t.start(); t.join()
tasks = {int(x): sorted(os.sched_getaffinity(int(x))) for x in os.listdir("/proc/self/task")}
print(json.dumps({"bound": bound, "tasks": list(tasks.values()), "late": late[0], "threads": torch.get_num_threads(),
                  "omp": os.environ["OMP_NUM_THREADS"]}))
"""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND=str(core))
    out = json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                    check=True).stdout.splitlines()[-1])
    assert out["bound"] == [core] and out["late"] == [core] and out["omp"] == "1" and out["threads"] == 1
    assert all(affinity == [core] for affinity in out["tasks"]) and len(out["tasks"]) >= 2
