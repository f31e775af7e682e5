"""Local placement with concurrent servers (the duet design): each arm's engine on its own CPU core, the cores
exchanged per block — a swapped block starts new server sessions — and recorded per session. Fake servers
(tests/fakes/fake_vllm.py), vLLM's real benchmark client (slow: it imports vLLM)."""

from __future__ import annotations

import contextlib
import io
import json

import pandas as pd
import pytest

from fakes.support import fake_env, leftovers, scenario_copy
from harness.cli import main
from harness.run import procs
from harness.rundir import schema

pytestmark = pytest.mark.slow


def test_concurrent_servers_swap_cores_per_block_in_new_sessions(tmp_path, monkeypatch):
    env = fake_env(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(procs, "cleanup_on_exit", lambda: None)
    scenario = scenario_copy(tmp_path, concurrent_servers="concurrent_servers = true")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["compare", "--scenario", str(scenario), "--out", str(tmp_path / "results"), "--concurrency", "1",
                     "--num-prompts", "2", "--repeats", "2", "--place-baseline", "cores=0",
                     "--place-candidate", "cores=1", "--swap-nodes"])
    assert code == 0, err.getvalue()[-3000:]
    (run_dir,) = (tmp_path / "results").iterdir()
    manifest = json.loads((run_dir / schema.MANIFEST).read_text())
    cores = {(arm["name"], session["placement"]["block"]): session["placement"]["cpu_cores"]
             for arm in manifest["arms"] for session in arm["sessions"]}
    assert cores == {("baseline", 0): [0], ("candidate", 0): [1], ("baseline", 1): [1], ("candidate", 1): [0]}
    assert [row["cpu_cores"] for row in manifest["cluster"]["assignments"]] == [[0], [1], [1], [0]]
    assert manifest["cluster"]["backend"] == "local" and manifest["cluster"]["nodes"] == []
    levels = pd.read_csv(run_dir / schema.LEVELS)
    assert sorted(zip(levels["arm"], levels["round"], levels["session"])) == [
        ("baseline", 0, 0), ("baseline", 1, 1), ("candidate", 0, 0), ("candidate", 1, 1)]
    assert procs.live_children() == [] and leftovers(env) == []
