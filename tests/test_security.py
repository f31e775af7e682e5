"""Security, and servers started by other tooling.

- No ``shell=True`` (nor ``os.system``/``os.popen``) anywhere in ``harness/`` and ``dsa_route/`` (AST scan).
- ``--base-url-baseline/--base-url-candidate`` against two fake servers the test starts: dsa-bench starts and stops
  nothing, attests what ``/v1/models``, ``/version`` and ``/metrics`` expose and says what it could not check.
  The same run covers the per-level timeout and the default failure policy (stop that arm, go on).
- The servers serve a model named ``<script>alert(1)</script>``, generate that text and fail a request with it as the
  HTTP reason; the scenario's model id is that string too: ``report.html`` shows all of it escaped, never as markup.
- The servers require ``VLLM_API_KEY`` (given by environment only): the run works and the key is in no file of the
  run directory and in no console output. (tests/test_faults.py checks the same for servers dsa-bench starts.)
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from fakes.support import REPO, SCENARIO, XSS, FakeServer, clean_environ, fake_env, fake_pids, leftovers
from harness.run import procs
from harness.rundir import schema
from harness.cli import main

SECRET = "sk-dsa-security-test-fedcba9876543210"
LEVEL_TIMEOUT_S = 12


# ----------------------------------------------------------------------------------------------- no shell
def _shell_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg == "shell" and not (isinstance(value, ast.Constant) and value.value is False):
                found.append(f"{path}:{node.lineno}: shell={ast.unparse(keyword.value)}")
        name = ast.unparse(node.func)
        if name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput", "system", "popen"):
            found.append(f"{path}:{node.lineno}: {name}(...)")
    return found


def test_no_shell_anywhere_in_harness_and_dsa_route():
    files = [p for folder in ("harness", "dsa_route") for p in (REPO / folder).rglob("*.py")]
    assert len(files) > 10
    assert [hit for path in files for hit in _shell_calls(path)] == []
    # and the plain grep: `shell=True` as a keyword argument (after "(" or ","), wherever it is
    pattern = re.compile(r"[(,]\s*shell\s*=\s*True")
    assert [str(p) for p in files if pattern.search(p.read_text(encoding="utf-8"))] == []


def test_the_shell_scan_would_catch_one(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os, subprocess\nsubprocess.run('ls', shell=True)\nsubprocess.run(['ls'], shell=flag)\n"
                   "subprocess.run(['ls'], shell=False)\nos.system('ls')\n")
    assert [hit.split(": ", 1)[1] for hit in _shell_calls(bad)] == ["shell=True", "shell=flag", "os.system(...)"]


# ----------------------------------------------------------------------------------------------- remote run
@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """Two fake servers started here, then ``dsa-bench compare --base-url-baseline … --base-url-candidate …``.

    Sequential schedule: baseline c1, c2 (one request of c1 fails with HTTP reason ``<script>…``), then candidate c1,
    whose server hangs on every streaming request (per-level timeout), so candidate c2 is skipped (default policy).
    """
    from dsa_route.tiny.v3 import ensure_tiny_model

    tmp_path = tmp_path_factory.mktemp("remote")
    tokenizer = ensure_tiny_model("tiny-deepseek-v3")
    scenario = tmp_path / "scenario.toml"
    text = SCENARIO.read_text(encoding="utf-8")
    text = text.replace('id = "generated:tiny-deepseek-v3"', f'id = "evil/{XSS}"\ntokenizer = "{tokenizer}"')
    text = text.replace("level_timeout_s = 120", f"level_timeout_s = {LEVEL_TIMEOUT_S}")
    scenario.write_text(text, encoding="utf-8")

    servers_env = {**clean_environ(), **fake_env(tmp_path / "servers", model=XSS, text=XSS), "VLLM_API_KEY": SECRET}
    harness_env = fake_env(tmp_path / "harness")   # a fake `vllm` the harness would use if it started anything
    baseline = FakeServer(tmp_path, {**servers_env, "FAKE_VLLM_FAIL_REASON": XSS}, name="baseline")
    candidate = FakeServer(tmp_path, {**servers_env, "FAKE_VLLM_MODE": "stall_after", "FAKE_VLLM_N": "0"},
                           name="candidate")
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key in list(os.environ):
                if key.startswith("FAKE_VLLM_") or key in ("VLLM_API_KEY", "OPENAI_API_KEY"):
                    mp.delenv(key)
            for key, value in harness_env.items():
                mp.setenv(key, value)
            mp.setenv("VLLM_API_KEY", SECRET)
            mp.setenv("COLUMNS", "400")
            mp.setattr(procs, "cleanup_on_exit", lambda: None)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(["compare", "--scenario", str(scenario), "--out", str(tmp_path / "results"),
                             "--base-url-baseline", baseline.url, "--base-url-candidate", candidate.url])
            live = procs.live_children()
        alive_after = {"baseline": baseline.alive(), "candidate": candidate.alive()}
        (run_dir,) = list((tmp_path / "results").iterdir())
        yield {"code": code, "out": out.getvalue(), "err": err.getvalue(), "run_dir": run_dir, "live": live,
               "alive_after": alive_after, "servers_env": servers_env, "harness_env": harness_env,
               "urls": {"baseline": baseline.url, "candidate": candidate.url}}
    finally:
        baseline.stop()
        candidate.stop()


def _manifest(run_dir: Path) -> dict:
    """manifest.json with its arms list keyed by arm name, each arm's levels keyed ``c<concurrency>-r<round>`` (these
    runs have one regime)."""
    data = json.loads((run_dir / schema.MANIFEST).read_text(encoding="utf-8"))
    return {**data, "arms": {arm["name"]: {**arm, "levels": _by_concurrency(arm["levels"])} for arm in data["arms"]}}


def _by_concurrency(levels: dict) -> dict:
    keys = {key: schema.LevelKey.parse(key) for key in levels}
    return {f"c{keys[key].concurrency}-r{keys[key].round}": level for key, level in levels.items()}


@pytest.mark.slow
def test_base_urls_benchmark_running_servers_and_start_or_stop_nothing(remote):
    run_dir, err = remote["run_dir"], remote["err"]
    manifest = _manifest(run_dir)
    assert manifest["arms"]["baseline"]["levels"]["c1-r0"]["status"] == "done", err[-3000:]
    assert manifest["arms"]["baseline"]["levels"]["c2-r0"]["status"] == "done"
    for arm in ("baseline", "candidate"):
        entry = manifest["arms"][arm]
        assert f"{arm}: using the running server at {remote['urls'][arm]} (dsa-bench starts nothing)" in err
        assert entry["base_url"] == remote["urls"][arm] and entry["server_command"] is None
        assert entry["observed"]["served_models"] == [XSS] and entry["observed"]["server_version"] == "0.32.0+fake"
        attestation = entry["attestation"]
        assert attestation["valid"] is None and attestation["not_checked"]
        assert "cannot be checked from there" in attestation["note"]
    # the bench client asked for the model the server serves (from /v1/models), not the scenario's
    assert f"served_model_name='{XSS}'" in (run_dir / schema.LOGS_DIR / "baseline-bench.log").read_text()
    # started nothing, stopped nothing
    assert fake_pids(Path(remote["harness_env"]["FAKE_VLLM_PIDDIR"])) == {}
    assert not list((run_dir / schema.LOGS_DIR).glob("*-server.log"))
    assert remote["alive_after"] == {"baseline": True, "candidate": True}
    assert remote["live"] == [] and leftovers(remote["harness_env"]) == []


@pytest.mark.slow
def test_per_level_timeout_names_itself_and_stops_only_that_arm(remote):
    levels = _manifest(remote["run_dir"])["arms"]["candidate"]["levels"]
    timeout = (f"per-level timeout: no result after {LEVEL_TIMEOUT_S} s (raise workload.level_timeout_s if the level "
               f"is just slow)")
    assert levels["c1-r0"]["status"] == f"failed: {timeout}"
    assert f"candidate c=1 r=0 failed: {timeout}" in remote["err"]
    assert levels["c2-r0"]["status"] == "skipped: an earlier level failed (use --continue-on-error to go on)"
    assert remote["code"] == 1
    frame = pd.read_csv(remote["run_dir"] / schema.LEVELS)
    assert sorted(zip(frame["arm"], frame["concurrency"])) == [("baseline", 1), ("baseline", 2)]
    assert json.loads((remote["run_dir"] / "verdict.json").read_text())["overall"] == "INVALID"


# ----------------------------------------------------------------------------------------------- escaping
@pytest.mark.slow
def test_report_escapes_model_name_generated_text_and_server_errors(remote):
    run_dir = remote["run_dir"]
    (path,) = (run_dir / "raw").glob("baseline-*-c1-r0.json")
    raw = json.loads(path.read_text(encoding="utf-8"))
    generated = [text for text in raw["generated_texts"] if text]
    assert generated and XSS in generated[0]                    # the server's text reached the stored results
    assert any(XSS in (error or "") for error in raw["errors"])  # and so did its error (HTTP reason phrase)
    requests = pd.read_csv(run_dir / schema.REQUESTS, keep_default_na=False)
    assert (requests["error"] == XSS).sum() == 1

    # strings from the server (served model, error), the scenario (model id) and generated text (parity section)
    from harness.render import render_report

    html = render_report(run_dir).read_text(encoding="utf-8")
    _assert_escaped(html, at_least=3)
    html = render_report(run_dir, sections={"parity": {
        "exact_match_rate_pct": 0.0, "prompts_total": 1, "tolerance": 0.05,
        "divergences": [{"prompt_index": 0, "prompt": generated[0], "position": 0, "max_logprob_diff": 0.1,
                         "margin": 0.0, "near_tie": True}]}}).read_text(encoding="utf-8")
    _assert_escaped(html, at_least=4)


def _assert_escaped(html: str, at_least: int) -> None:
    assert XSS not in html and "<script" not in html.lower()
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= at_least


# ----------------------------------------------------------------------------------------------- API key
@pytest.mark.slow
def test_api_key_from_the_environment_is_never_written_remote_servers(remote):
    """The servers answer 401 without the key, so the done levels prove it was sent; no file holds it."""
    assert _manifest(remote["run_dir"])["arms"]["baseline"]["levels"]["c2-r0"]["status"] == "done"
    files = [p for p in remote["run_dir"].rglob("*") if p.is_file()]
    assert len(files) > 5
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in remote["out"] and SECRET not in remote["err"]


def test_fake_server_requires_the_key(tmp_path):
    """The premise of the API-key tests: without the bearer token the fake answers 401 on /v1/*."""
    import requests

    tagged = fake_env(tmp_path)
    env = {**clean_environ(), **tagged, "VLLM_API_KEY": SECRET}
    server = FakeServer(tmp_path, env)
    try:
        body = {"model": "tiny-deepseek-v3", "prompt": "Hi", "max_tokens": 2}
        assert requests.post(f"{server.url}/v1/completions", json=body, timeout=10).status_code == 401
        ok = requests.post(f"{server.url}/v1/completions", json=body, timeout=10,
                           headers={"Authorization": f"Bearer {SECRET}"})
        assert ok.status_code == 200 and ok.json()["choices"]
    finally:
        server.stop()
    assert fake_pids(tmp_path / "pids") and leftovers(tagged) == []
