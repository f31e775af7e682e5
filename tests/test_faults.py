"""Runs that survive faults — a clear message, intact finished data, no stray process, resume.

One test (or a group sharing one run) per fault case of the issue, numbered as there. Servers are the fake ``vllm``
(``tests/fakes/fake_vllm.py`` through ``DSA_BENCH_VLLM``), which fails on cue; the benchmark client is vLLM's real
one (``vllm bench serve`` in ``harness.run.loadgen``). After every run the test checks what the user sees (exit code,
message), what is on disk (manifest statuses, ``levels.csv`` rows, ``report``/``gate`` on the partial directory: gate
INVALID, never PASS) and that nothing is left running: ``procs.live_children()`` for in-process runs, and for every
run the fake servers' pid files plus any process carrying the test's environment tag (:mod:`fakes.support`).
Runs that start the benchmark client (~10–30 s to import vLLM) are marked slow.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from fakes.support import (DSA_BENCH, REPO, SCENARIO, FakeServer, clean_environ, fake_env, fake_pids, leftovers,
                           scenario_copy, spawn_sigint_ignored, wait_for)
from harness.run import procs, runner, server_sessions
from harness.rundir import schema
from harness.rundir import store as records
from harness.run import server as server_mod
from harness.cli import main

SECRET = "sk-dsa-fault-test-0123456789abcdef"


# ----------------------------------------------------------------------------------------------- helpers
def _isolate(mp: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Point this process at the fake (servers inherit os.environ) and keep the CLI from installing process-wide
    signal/atexit handlers in the pytest process; wide console lines so messages are not wrapped."""
    for key in list(os.environ):
        if key.startswith("FAKE_VLLM_") or key in ("VLLM_API_KEY", "OPENAI_API_KEY"):
            mp.delenv(key)
    for key, value in env.items():
        mp.setenv(key, value)
    mp.setenv("COLUMNS", "400")
    mp.setattr(procs, "cleanup_on_exit", lambda: None)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Fake servers for an in-process run; afterwards nothing the test started may still run."""
    env = fake_env(tmp_path)
    _isolate(monkeypatch, env)
    yield env
    assert procs.live_children() == []
    assert leftovers(env) == []


def _cli(*argv) -> tuple[int, str, str]:
    """``dsa-bench ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as stop:   # argparse refuses a flag's value itself
            code = stop.code
    return code, out.getvalue(), err.getvalue()


def _one_line_error(err: str) -> str:
    assert re.match(r"dsa-bench [a-z]+: error: ", err) and err.count("\n") == 1, err
    return err


def _run_dir(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def _manifest(run_dir: Path) -> dict:
    """manifest.json with its arms list keyed by arm name, each arm's levels keyed ``c<concurrency>-r<round>`` (these
    runs have one regime)."""
    data = json.loads((run_dir / schema.MANIFEST).read_text(encoding="utf-8"))
    return {**data, "arms": {arm["name"]: {**arm, "levels": _by_concurrency(arm["levels"])} for arm in data["arms"]}}


def _by_concurrency(levels: dict) -> dict:
    keys = {key: schema.LevelKey.parse(key) for key in levels}
    return {f"c{keys[key].concurrency}-r{keys[key].round}": level for key, level in levels.items()}


def _statuses(run_dir: Path) -> dict[str, dict[str, str]]:
    return {arm: {key: level["status"] for key, level in entry["levels"].items()}
            for arm, entry in _manifest(run_dir)["arms"].items()}


def _level_rows(run_dir: Path) -> set[tuple[str, int, int]]:
    if not (run_dir / schema.LEVELS).exists():
        return set()
    frame = pd.read_csv(run_dir / schema.LEVELS)
    rows = list(zip(frame["arm"], frame["concurrency"], frame["round"]))
    assert len(rows) == len(set(rows)), f"duplicate levels.csv rows: {rows}"
    return {(str(a), int(c), int(r)) for a, c, r in rows}


def _partial_dir_still_works(run_dir: Path) -> None:
    """`dsa-bench gate` says INVALID (exit 4, never PASS) and `dsa-bench report` re-renders the partial directory."""
    code, out, _ = _cli("gate", run_dir)
    assert code == 4 and "INVALID" in out
    assert json.loads((run_dir / "verdict.json").read_text())["overall"] == "INVALID"
    code, out, _ = _cli("report", run_dir)
    assert code == 0 and (run_dir / schema.REPORT).stat().st_size > 0


def _compare(tmp_path: Path, *extra) -> tuple[int, str, Path]:
    code, _, err = _cli("compare", "--scenario", SCENARIO, "--out", tmp_path / "results", *extra)
    return code, err, _run_dir(tmp_path / "results")


# ----------------------------------------------------------------------------------------------- 1. exits early
def test_case1_server_exits_before_ready(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "exit_before_ready")
    code, err, run_dir = _compare(tmp_path)
    assert code == 1
    log = run_dir / "logs" / "baseline-server.log"
    assert f"baseline: server exited with code 3 before it was ready; log {log}, last lines:\n" in err
    # the log's tail verbatim: bracketed text such as "[core.py:700]" or "[/path]" is not eaten as console markup
    assert "[core.py:700] ValueError: no config.json in [/nonexistent/" in err
    statuses = _statuses(run_dir)
    for arm in ("baseline", "candidate"):
        reason = (f"server failed to start: server exited with code 3 before it was ready; "
                  f"log {run_dir}/logs/{arm}-server.log")
        assert statuses[arm] == {"c1-r0": f"failed: {reason}", "c2-r0": f"skipped: {reason}"}
    assert _manifest(run_dir)["status"] == "failed" and _level_rows(run_dir) == set()
    assert fake_pids(tmp_path / "pids") and not leftovers(fake)   # both arms' server and engine processes are gone
    _partial_dir_still_works(run_dir)


# ----------------------------------------------------------------------------------------------- 2. first completion
def test_case2_health_ok_but_first_completion_fails(fake, tmp_path, monkeypatch):
    """Baseline: /health ok, the first completion answers 500 and the server dies (vLLM CPU with an unsupported MLA
    head size). Candidate: every completion fails but the process stays up → the server ready timeout names itself,
    and the still-running server is stopped."""
    monkeypatch.setenv("FAKE_VLLM_MODE_BASELINE", "completion_fails")
    monkeypatch.setenv("FAKE_VLLM_MODE_CANDIDATE", "completion_fails_stay")
    scenario = scenario_copy(tmp_path, ready_timeout_s="ready_timeout_s = 4")
    code, _, err = _cli("compare", "--scenario", scenario, "--out", tmp_path / "results")
    run_dir = _run_dir(tmp_path / "results")
    assert code == 1
    assert ("baseline: /health was ok but the first completion failed (completion returned HTTP 500: "
            '{"error": {"message": "EngineCore encountered an issue: head size 576 is not supported') in err
    assert "and the server exited with code 1; log " in err
    assert ("candidate: server ready timeout: not ready after 4 s (completion returned HTTP 500: " in err
            and "raise serve.ready_timeout_s if startup is just slow" in err)
    statuses = _statuses(run_dir)
    assert statuses["baseline"]["c1-r0"].startswith("failed: server failed to start: /health was ok but the first "
                                                    "completion failed (completion returned HTTP 500")
    assert statuses["candidate"]["c1-r0"].startswith("failed: server failed to start: server ready timeout: not ready "
                                                     "after 4 s")
    assert all(s.startswith("skipped: server failed to start") for s in
               (statuses["baseline"]["c2-r0"], statuses["candidate"]["c2-r0"]))
    assert not leftovers(fake)   # the candidate server was still up at the timeout: it must have been stopped
    _partial_dir_still_works(run_dir)


# ----------------------------------------------------------------------------------------------- 3 + 11: one sweep
@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One sequential sweep with ``--continue-on-error`` and 8 prompts per level (order: baseline c1, c2, then
    candidate c1, c2) whose servers require ``VLLM_API_KEY``:

    - baseline c1: its benchmark JSON is truncated on disk before the harness reads it (case 11);
    - candidate: the server dies after the client's warmup request (the fake counts streamed requests only, not the
      readiness probe or parity prompts), i.e. at the first measured request of c1; the other 7 find no server
      (case 3). (vLLM 0.32's client sends no initial test request:
      ``--ready-check-timeout-sec`` defaults to 0.)
    """
    tmp_path = tmp_path_factory.mktemp("sweep")
    env = fake_env(tmp_path, mode_candidate="die_after", n_candidate="1")
    real_read = runner.read_bench_json

    def truncating_read(path: Path):
        if path.name.startswith("baseline-") and path.name.endswith("-c1-r0.json"):
            path.write_text(path.read_text(encoding="utf-8")[:120], encoding="utf-8")
        return real_read(path)

    with pytest.MonkeyPatch.context() as mp:
        _isolate(mp, env)
        mp.setenv("VLLM_API_KEY", SECRET)
        mp.setattr(runner, "read_bench_json", truncating_read)
        code, out, err = _cli("compare", "--scenario", SCENARIO, "--out", tmp_path / "results", "--continue-on-error",
                              "--num-prompts", "8")
        live = procs.live_children()
    return {"code": code, "out": out, "err": err, "run_dir": _run_dir(tmp_path / "results"), "env": env,
            "live": live, "tmp": tmp_path}


@pytest.mark.slow
def test_case3_server_dies_mid_level(sweep):
    run_dir, err = sweep["run_dir"], sweep["err"]
    assert sweep["code"] == 1, err[-3000:]
    statuses = _statuses(run_dir)
    assert statuses["candidate"]["c1-r0"] == "failed: server died during the level", err[-3000:]
    assert statuses["candidate"]["c2-r0"] == "skipped: server died"
    assert "candidate c=1 r=0 failed: server died during the level" in err
    # the baseline's finished level is intact; nothing of the dead candidate's level was appended
    assert statuses["baseline"]["c2-r0"] == "done"
    assert _level_rows(run_dir) == {("baseline", 2, 0)}
    requests = pd.read_csv(run_dir / schema.REQUESTS)
    assert set(requests["arm"]) == {"baseline"} and len(requests) == 8
    assert _manifest(run_dir)["status"] == "failed"
    assert json.loads((run_dir / "verdict.json").read_text())["overall"] == "INVALID"   # written by compare itself
    assert (run_dir / schema.REPORT).exists()
    assert sweep["live"] == [] and leftovers(sweep["env"]) == []


@pytest.mark.slow
def test_case11_corrupted_benchmark_json_fails_that_level_and_the_sweep_goes_on(sweep):
    run_dir = sweep["run_dir"]
    status = _statuses(run_dir)["baseline"]["c1-r0"]
    (raw,) = (run_dir / "raw").glob("baseline-*-c1-r0.json")
    assert status.startswith(f"failed: {raw}: unreadable benchmark JSON (")
    assert "baseline c=1 r=0 failed: " in sweep["err"] and "unreadable benchmark JSON" in sweep["err"]
    # --continue-on-error: the next level of the same arm ran
    assert _statuses(run_dir)["baseline"]["c2-r0"] == "done"


@pytest.mark.slow
def test_case11_corrupted_levels_csv_gate_invalid_report_and_resume_name_the_file(sweep, tmp_path):
    run_dir = Path(shutil.copytree(sweep["run_dir"], tmp_path / "copy"))
    _partial_dir_still_works(run_dir)
    (run_dir / schema.LEVELS).write_text('arm,concurrency\n"unterminated\n', encoding="utf-8")
    code, out, err = _cli("gate", run_dir)
    assert code == 4 and "INVALID" in out and "levels.csv" in out
    assert err.startswith(f"dsa-bench: report.html not updated: {run_dir}/levels.csv: unreadable CSV")
    assert "levels.csv" in json.loads((run_dir / "verdict.json").read_text())["reason"]
    code, _, err = _cli("report", run_dir)
    assert code == 2 and f"{run_dir}/levels.csv: unreadable CSV" in _one_line_error(err)
    with pytest.MonkeyPatch.context() as mp:
        _isolate(mp, sweep["env"])
        code, _, err = _cli("compare", "--resume", run_dir)
    # after the progress header ("dsa-bench: fault-tiny on cpu → RUN_DIR"), one error line naming the file
    assert code == 2 and err.splitlines()[-1].startswith(
        f"dsa-bench compare: error: {run_dir}/levels.csv: unreadable CSV")
    assert procs.live_children() == []


@pytest.mark.slow
def test_api_key_from_the_environment_is_never_written_harness_started_servers(sweep):
    """The fake servers refuse requests without the key, so the measured level proves the key was used; yet no file
    of the run directory, no log and no console output contains it."""
    assert _statuses(sweep["run_dir"])["baseline"]["c2-r0"] == "done"
    for path in sweep["run_dir"].rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in sweep["out"] and SECRET not in sweep["err"]


# ----------------------------------------------------------------------------------------------- 4. port taken
class _Occupant:
    """Something else listening on a port: answers every request like a vLLM server would (200 + choices), so a
    harness that probed it would wrongly call the port's server ready."""

    def __init__(self, lookalike: bool):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                body = json.dumps({"choices": [{"text": "impostor", "index": 0}]} if lookalike else {}).encode()
                self.send_response(200 if lookalike else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_case4_port_already_taken_is_refused_before_spawning(fake, tmp_path, monkeypatch):
    occupant = _Occupant(lookalike=True)
    try:
        monkeypatch.setattr(server_sessions, "free_port", lambda: occupant.port)   # where server sessions look it up
        code, err, run_dir = _compare(tmp_path)
    finally:
        occupant.close()
    assert code == 1
    message = f"port {occupant.port} is already in use; stop what listens there or let dsa-bench pick one"
    assert f"baseline: {message}" in err and f"candidate: {message}" in err
    assert _statuses(run_dir)["baseline"]["c1-r0"] == f"failed: server failed to start: {message}"
    assert fake_pids(tmp_path / "pids") == {}   # no server was spawned
    _partial_dir_still_works(run_dir)


def test_case4_port_taken_between_the_check_and_the_bind(fake, tmp_path, monkeypatch):
    """The port was free when dsa-bench picked it, then something else bound it: vLLM exits on the bind error."""
    occupant = _Occupant(lookalike=False)
    try:
        monkeypatch.setattr(server_sessions, "free_port", lambda: occupant.port)   # where server sessions look it up
        monkeypatch.setattr(server_mod, "_port_is_free", lambda port: True)
        code, err, run_dir = _compare(tmp_path)
    finally:
        occupant.close()
    assert code == 1
    assert "baseline: server exited with code 1 before it was ready" in err
    assert f"[Errno 98] Address already in use: ('127.0.0.1', {occupant.port})" in err
    assert _statuses(run_dir)["candidate"]["c1-r0"].startswith(
        "failed: server failed to start: server exited with code 1 before it was ready")
    _partial_dir_still_works(run_dir)


# ----------------------------------------------------------------------------------------------- 5. OOM at start
def test_case5_out_of_memory_at_start_quotes_the_log(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "oom")
    code, err, run_dir = _compare(tmp_path)
    assert code == 1
    assert "baseline: server exited with code 1 before it was ready; log " in err
    assert ("(EngineCore_DP0 pid=1) ERROR [core.py:1028] torch.OutOfMemoryError: CUDA out of memory. Tried to "
            "allocate 7.00 GiB.") in err
    assert "RuntimeError: Engine core initialization failed. See root cause above." in err
    assert "torch.OutOfMemoryError" in (run_dir / "logs" / "candidate-server.log").read_text()
    assert _statuses(run_dir)["candidate"]["c1-r0"].startswith(
        "failed: server failed to start: server exited with code 1 before it was ready")
    _partial_dir_still_works(run_dir)


# ----------------------------------------------------------------------------------------------- 6. lm-eval
@pytest.mark.slow
def test_case6_lm_eval_server_disappears_mid_eval(tmp_path, monkeypatch):
    """GSM8K through real lm-eval against a fake server that answers two questions, then dies: the run stops with a
    message naming the arm and the log, lm-eval is stopped, and no accuracy rows of the arm are written.
    (The runner does not call harness.run.accuracy yet; this drives ``run_gsm8k`` as the runner will.)"""
    accuracy = pytest.importorskip("harness.run.accuracy")
    env = fake_env(tmp_path, mode="die_after", n="2", count="all")
    _isolate(monkeypatch, env)
    server = FakeServer(tmp_path, {**clean_environ(), **env})
    mini = Path(__file__).parent / "fixtures" / "gsm8k_mini"
    data = accuracy.GsmData(mini.resolve(), "local", "test fixture")
    try:
        with pytest.raises(accuracy.AccuracyError) as caught:
            accuracy.run_gsm8k(tmp_path / "run", "candidate", accuracy.Endpoint(server.url, "tiny-deepseek-v3",
                                                                                 alive=server.alive),
                               data, accuracy.GsmSettings(num_fewshot=1, num_concurrent=1, timeout_s=300, poll_s=0.2))
    finally:
        server.stop()
    message = str(caught.value)
    log = tmp_path / "run" / "logs" / "candidate-lm-eval.log"
    assert message == f"GSM8K on candidate: the server died during the lm-eval run (log {log})"
    assert "\n" not in message
    assert not (tmp_path / "run" / "accuracy.csv").exists()
    assert not (tmp_path / "run" / "accuracy" / "candidate" / "arm.json").exists()
    assert procs.live_children() == [] and leftovers(env) == []


# ----------------------------------------------------------------------------------------------- 7. SIGINT + resume
def _spawn_cli(argv, env) -> subprocess.Popen:
    return spawn_sigint_ignored([DSA_BENCH, *argv], env)


def _finish(proc: subprocess.Popen, timeout_s: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"dsa-bench did not finish in {timeout_s} s; stderr:\n{err[-3000:]}")
    return proc.returncode, out, err


def _stream_requests(env: dict[str, str], arm: str) -> int:
    path = Path(env["FAKE_VLLM_REQLOG"])
    return path.read_text().count(f"{arm} stream") if path.exists() else 0


@pytest.mark.slow
def test_case7_sigint_mid_level_then_resume_completes_the_run(tmp_path):
    env = fake_env(tmp_path)
    base = {**clean_environ(), **env, "COLUMNS": "400"}
    out = tmp_path / "results"
    # the candidate's tokens come slowly in the first run, so Ctrl-C lands inside its first level
    proc = _spawn_cli(["compare", "--scenario", SCENARIO, "--out", out],
                      {**base, "FAKE_VLLM_DELAY_S_CANDIDATE": "0.3"})
    try:
        # the warmup and the first measured request of candidate c1 have started (each takes 8 × 0.3 s)
        assert wait_for(lambda: _stream_requests(env, "candidate") >= 2 or proc.poll() is not None, 240)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        os.kill(proc.pid, signal.SIGINT)
        code, _, err = _finish(proc, 90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    run_dir = _run_dir(out)
    assert code == 130, err[-3000:]
    assert f"interrupted: finished levels are in {run_dir}" in err
    assert "dsa-bench compare --resume" in err
    assert leftovers(env) == []       # servers, engine processes, benchmark client: all gone
    manifest = _manifest(run_dir)
    assert manifest["status"] == "interrupted"
    statuses = _statuses(run_dir)
    assert statuses["baseline"] == {"c1-r0": "done", "c2-r0": "done"}
    assert statuses["candidate"] == {"c1-r0": "failed: interrupted during this level",
                                     "c2-r0": "skipped: run stopped before this level"}
    assert _level_rows(run_dir) == {("baseline", 1, 0), ("baseline", 2, 0)}
    assert json.loads((run_dir / "verdict.json").read_text())["overall"] == "INVALID"
    assert (run_dir / schema.REPORT).exists()

    code, _, err = _finish(_spawn_cli(["compare", "--resume", run_dir], base), 300)
    assert code == 0, err[-3000:]
    assert leftovers(env) == []
    manifest = _manifest(run_dir)
    assert manifest["status"] == "done" and len(manifest["resumed_at"]) == 1
    statuses = _statuses(run_dir)
    assert all(status == "done" for arm in statuses.values() for status in arm.values()), statuses
    assert manifest["arms"]["candidate"]["levels"]["c1-r0"]["previous"] == "failed: interrupted during this level"
    assert manifest["arms"]["baseline"]["levels"]["c1-r0"]["previous"] is None   # done levels were not re-run
    arms = manifest["arms"]   # the resumed arm ran in a second server session; the finished one kept its first
    assert [s["index"] for s in arms["candidate"]["sessions"]] == [0, 1] and len(arms["baseline"]["sessions"]) == 1
    assert arms["candidate"]["levels"]["c1-r0"]["session"] == 1 and arms["baseline"]["levels"]["c1-r0"]["session"] == 0
    frame = pd.read_csv(run_dir / schema.LEVELS)
    assert dict(zip(frame["arm"] + frame["concurrency"].astype(str), frame["session"])) == {
        "baseline1": 0, "baseline2": 0, "candidate1": 1, "candidate2": 1}
    assert _level_rows(run_dir) == {(arm, c, 0) for arm in ("baseline", "candidate") for c in (1, 2)}
    assert len(pd.read_csv(run_dir / schema.REQUESTS)) == 8
    assert (run_dir / schema.REPORT).exists() and (run_dir / "verdict.json").exists()


def test_case7_resume_refuses_a_changed_scenario_or_changed_versions(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "exit_before_ready")
    _, _, run_dir = _compare(tmp_path)
    started = set(fake_pids(tmp_path / "pids"))
    before = (run_dir / schema.MANIFEST).read_text()

    changed = scenario_copy(tmp_path, output_len="output_len = 9")
    code, _, err = _cli("compare", "--resume", run_dir, "--scenario", changed)
    assert code == 2 and _one_line_error(err) == (
        f"dsa-bench compare: error: cannot resume {run_dir}: the scenario changed (workload.output_len); resume with "
        f"the same scenario or start a new run\n")
    code, _, err = _cli("compare", "--resume", run_dir, "--concurrency", "1,2,4")
    assert code == 2 and "the scenario changed (workload.concurrency)" in _one_line_error(err)

    manifest = json.loads(before)
    manifest["versions"]["vllm"] = "0.0.1"
    (run_dir / schema.MANIFEST).write_text(json.dumps(manifest))
    code, _, err = _cli("compare", "--resume", run_dir)
    now = manifest["versions"]["vllm"]
    from harness.run import machine
    assert code == 2 and _one_line_error(err) == (
        f"dsa-bench compare: error: cannot resume {run_dir}: installed versions changed (vllm {now} → "
        f"{machine.versions()['vllm']}); results would not be comparable — start a new run\n")
    assert set(fake_pids(tmp_path / "pids")) == started    # nothing was started by a refused resume
    assert json.loads((run_dir / schema.MANIFEST).read_text()) == manifest


def test_sigterm_stops_the_run_and_every_child(tmp_path):
    """SIGTERM while a server starts: exit 130, the run dir says interrupted, the server's process group is gone."""
    env = fake_env(tmp_path, mode="never_ready")
    proc = _spawn_cli(["compare", "--scenario", SCENARIO, "--out", tmp_path / "results"],
                      {**clean_environ(), **env, "COLUMNS": "400"})
    try:
        assert wait_for(lambda: len(fake_pids(tmp_path / "pids")) >= 2 or proc.poll() is not None, 60)
        os.kill(proc.pid, signal.SIGTERM)
        code, _, err = _finish(proc, 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    run_dir = _run_dir(tmp_path / "results")
    assert code == 130 and f"interrupted: finished levels are in {run_dir}" in err, err[-3000:]
    assert leftovers(env) == []
    assert _manifest(run_dir)["status"] == "interrupted"
    assert set(_statuses(run_dir)["baseline"].values()) == {"skipped: run stopped before this level"}


def test_sigkill_of_dsa_bench_still_ends_its_servers(tmp_path):
    """SIGKILL (the OOM killer, a CI timeout) runs no cleanup: each local server's watchdog (harness.run.reaper)
    ends its process group once dsa-bench is gone."""
    env = fake_env(tmp_path, mode="never_ready")
    proc = _spawn_cli(["compare", "--scenario", SCENARIO, "--out", tmp_path / "results"],
                      {**clean_environ(), **env, "COLUMNS": "400"})
    try:
        assert wait_for(lambda: len(fake_pids(tmp_path / "pids")) >= 2 or proc.poll() is not None, 60)
        assert proc.poll() is None and leftovers(env), "the servers were not up when dsa-bench was killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert wait_for(lambda: leftovers(env) == [], 30), leftovers(env)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


# ----------------------------------------------------------------------------------------------- 8. bad scenario
@pytest.mark.parametrize("replace,needle", [
    ({"input_len": "input_len = [16"}, "malformed TOML"),
    ({"concurrency": "concurrency = [0, 2]"}, "key 'workload.concurrency': concurrency levels must be ≥ 1, got [0]"),
    ({"concurrency": "concurrency = []"}, "key 'workload.concurrency': needs at least one concurrency level"),
    ({"input_len": "input_len = -16"}, "key 'workload.input_len': Input should be greater than 0"),
    ({"output_len": "output_len = -8"}, "key 'workload.output_len': Input should be greater than 1"),
    ({"max_model_len": "max_model_len = 0"}, "key 'model.max_model_len': Input should be greater than 0"),
    ({"ready_timeout_s": "ready_timeout_s = -1"}, "key 'serve.ready_timeout_s': Input should be greater than 0"),
    ({"level_timeout_s": "level_timeout_s = 0"}, "key 'workload.level_timeout_s': Input should be greater than 0"),
    ({"architecture": 'architecture = "LlamaForCausalLM"'},
     "key 'model.architecture': unknown architecture 'LlamaForCausalLM'; use one of DeepseekV3ForCausalLM"),
    ({"concurrent_servers": 'concurrent_servers = false\nquantization = "int3"'},
     "key 'serve.quantization': unknown quantization 'int3'; use one of none, fp8, nvfp4"),
])
def test_case8_bad_scenario_file_is_one_line_exit_2(fake, tmp_path, replace, needle):
    scenario = scenario_copy(tmp_path, **replace)
    code, _, err = _cli("compare", "--scenario", scenario, "--out", tmp_path / "results")
    assert code == 2 and needle in _one_line_error(err) and str(scenario) in err
    assert not (tmp_path / "results").exists() and fake_pids(tmp_path / "pids") == {}


@pytest.mark.parametrize("flags,needle", [
    (["--output-len", "1"], "key 'workload.output_len': Input should be greater than 1"),
    (["--quant", "bogus"], "key 'serve.quantization': unknown quantization 'bogus'"),
    (["--kv-cache-dtype", "int2"], "key 'serve.kv_cache_dtype': unknown kv_cache_dtype 'int2'"),
])
def test_case8_out_of_range_flags_are_one_line_exit_2(fake, tmp_path, flags, needle):
    code, _, err = _cli("compare", "--scenario", SCENARIO, "--out", tmp_path / "results", *flags)
    assert code == 2 and needle in _one_line_error(err) and "(with CLI overrides)" in err
    assert not (tmp_path / "results").exists() and fake_pids(tmp_path / "pids") == {}


@pytest.mark.parametrize("flags,needle", [
    (["--input-len", "-1"], "argument --input-len: -1 is below 1"),
    (["--output-len", "-3"], "argument --output-len: -3 is below 1"),
    (["--repeats", "0"], "argument --repeats: 0 is below 1"),
    (["--max-sessions", "0"], "argument --max-sessions: 0 is below 1"),
    (["--num-prompts", "0"], "argument --num-prompts: 0 is below 1"),
    (["--gsm8k-limit", "-5"], "argument --gsm8k-limit: -5 is below 1"),
    (["--gsm8k-fewshot", "x"], "argument --gsm8k-fewshot: 'x' is not a whole number"),
    (["--concurrency", "1,0"], "argument --concurrency: '1,0' is not a comma-separated list of positive integers"),
    (["--budget", "-3m"], "argument --budget: expected one argument; a value that starts with '-' goes after '='"),
])
def test_case8_bad_counts_are_refused_under_the_flag_typed(fake, tmp_path, flags, needle):
    code, _, err = _cli("compare", "--scenario", SCENARIO, "--out", tmp_path / "results", *flags)
    assert code == 2 and needle in _one_line_error(err) and "scenario" not in err.split("(see")[0]
    assert not (tmp_path / "results").exists() and fake_pids(tmp_path / "pids") == {}


# ----------------------------------------------------------------------------------------------- 9. CUDA-only asks
def test_case9_cuda_only_flags_on_a_machine_without_cuda(fake, tmp_path):
    """tests/test_cli.py covers --tp 4 and --quant nvfp4 one by one; together both are named, nothing starts, and
    `plan` still prints the commands with the refusal as a note."""
    from harness.run import machine

    if machine.detect().name == "cuda":
        pytest.skip("this machine has CUDA")
    code, _, err = _cli("compare", "--scenario", SCENARIO, "--out", tmp_path / "results", "--tp", "4",
                        "--quant", "nvfp4")
    assert code == 2 and ("--tp 4 and --quant nvfp4 requires a CUDA machine with 4 GPU(s); this machine has none"
                          in _one_line_error(err))
    assert not (tmp_path / "results").exists() and fake_pids(tmp_path / "pids") == {}
    code, out, _ = _cli("plan", "--scenario", SCENARIO, "--tp", "4", "--quant", "nvfp4")
    assert code == 0 and "note: `dsa-bench compare` would refuse on this machine: --tp 4 and --quant nvfp4" in out


# ----------------------------------------------------------------------------------------------- 10. bad run dir
def test_case10_empty_or_broken_run_dir_for_report_gate_and_resume(tmp_path):
    """tests/test_cli.py covers a missing and an empty directory for report/gate; here: an empty manifest.json, a
    manifest that is not an object, and --resume of a missing or empty directory."""
    missing, empty = tmp_path / "missing", tmp_path / "empty"
    empty.mkdir()
    for run_dir, needle in ((missing, "no such run directory"), (empty, "manifest.json: missing")):
        code, _, err = _cli("compare", "--resume", run_dir)
        assert code == 2 and needle in _one_line_error(err)
    zero = tmp_path / "zero"
    zero.mkdir()
    (zero / schema.MANIFEST).write_text("")
    for command in ("report", "gate"):
        code, _, err = _cli(command, zero)
        assert code == 2 and f"{zero}/manifest.json: not valid JSON" in _one_line_error(err)
    (zero / schema.MANIFEST).write_text("[]")
    for command in ("report", "gate"):
        code, _, err = _cli(command, zero)
        assert code == 2 and "manifest.json: not a JSON object; the file is corrupted" in _one_line_error(err)
    assert not (zero / schema.REPORT).exists() and not (zero / "verdict.json").exists()


# ----------------------------------------------------------------------------------------------- 12. read-only
def _read_only(monkeypatch, root: Path) -> None:
    """Make every atomic write under ``root`` fail as on a read-only file system (works as root, unlike chmod)."""
    real = records.atomic_write_text

    def refuse(path: Path, text: str) -> None:
        if Path(path).resolve().is_relative_to(root.resolve()):
            raise OSError(30, "Read-only file system", str(path))
        real(path, text)

    monkeypatch.setattr(records, "atomic_write_text", refuse)


def test_case12_read_only_results_dir_before_any_server(fake, tmp_path, monkeypatch):
    """tests/test_cli.py covers an unwritable --out by permissions; here a read-only file system, and that no server
    was spawned."""
    _read_only(monkeypatch, tmp_path / "results")
    code, _, err = _cli("compare", "--scenario", SCENARIO, "--out", tmp_path / "results")
    assert code == 2 and "cannot write results to " in _one_line_error(err)
    assert "(Read-only file system); pass a writable directory with --out" in err
    assert fake_pids(tmp_path / "pids") == {}


def test_case12_resume_into_a_read_only_run_dir_before_any_server(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "exit_before_ready")
    _, _, run_dir = _compare(tmp_path)
    started = set(fake_pids(tmp_path / "pids"))
    (run_dir / schema.LEVELS).write_text(records.rows_to_csv([], schema.LEVEL_COLUMNS))
    _read_only(monkeypatch, run_dir)
    code, _, err = _cli("compare", "--resume", run_dir)
    assert code == 2 and f"cannot write to {run_dir} (Read-only file system)" in _one_line_error(err)
    assert set(fake_pids(tmp_path / "pids")) == started
