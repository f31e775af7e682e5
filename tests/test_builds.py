"""Per-arm vLLM builds: how an arm's declared ``vllm`` is invoked, what is recorded, and what is refused."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from harness.cli import main
from harness.run import builds
from harness.run.plan import ArmPlan
from harness.run.builds import mismatch as _build_mismatch
from harness.rundir.schema import BuildRecord, Observation
from harness.rundir.store import RunDir
from real_runs import second_venv

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
ARM = ArmPlan(name="candidate", route="candidate", description="", decision={}, unavailable=(), intended={},
              server_args=("--seed", "0"), server_env={}, model_path="m", served_model_name="m", tokenizer="t")


def test_a_declared_python_runs_vllms_cli_module_and_an_executable_runs_itself():
    python = dataclasses.replace(ARM, vllm="/opt/v/bin/python3")
    assert python.server_argv(8000)[:5] == ["/opt/v/bin/python3", "-m", "vllm.entrypoints.cli.main", "serve", "m"]
    assert dataclasses.replace(ARM, vllm="/opt/v/bin/vllm").server_argv(8000)[:2] == ["/opt/v/bin/vllm", "serve"]


def test_python_of_reads_the_shebang(tmp_path):
    script = tmp_path / "vllm"
    script.write_text("#!/opt/other/bin/python3.11\nprint()\n")
    assert builds.python_of(str(script)) == "/opt/other/bin/python3.11"
    assert builds.python_of("/x/bin/python") == "/x/bin/python"


def test_two_venvs_are_recorded_with_their_own_interpreter(tmp_path):
    python = second_venv(tmp_path / "v2")
    here, there = builds.record(ARM), builds.record(dataclasses.replace(ARM, vllm=str(python)))
    assert here["error"] is None and there["error"] is None
    assert there["python"] == str(python) and there["declared"] == str(python) and here["declared"] is None
    assert here["version"] and re.fullmatch(r"[0-9a-f]{64}", here["record_sha256"])
    assert there["version"] == here["version"] and there["plugin"] is True


def test_a_missing_declared_build_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_CACHE", str(tmp_path / "cache"))
    text = (SCENARIOS / "cpu-tiny.toml").read_text().replace(
        'route = "candidate"', 'route = "candidate"\nvllm = "/nonexistent/bin/vllm"')
    (tmp_path / "s.toml").write_text(text)
    code = main(["compare", "--scenario", str(tmp_path / "s.toml"), "--out", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert code == 2 and "arm candidate: vllm = '/nonexistent/bin/vllm' is not an executable file" in err
    assert not (tmp_path / "results").exists()


def test_the_declared_version_must_be_what_the_server_log_says():
    build, seen = BuildRecord(version="0.32.0+cpu", python="/v/bin/python"), Observation(vllm_version="0.32.0")
    assert _build_mismatch(build, seen) == []
    assert "is 0.33.1, the server log says 0.32.0" in _build_mismatch(build.model_copy(update={"version": "0.33.1"}),
                                                                      seen)[0]
    assert _build_mismatch(None, seen) == []


@pytest.mark.slow
def test_compare_runs_each_arm_on_its_own_virtualenv_and_records_both_builds(e2e_run):
    """Real vllm serve servers on CPU (tests/conftest.py's ``e2e_run``): the baseline from this environment, the
    candidate from a second venv."""
    assert e2e_run.proc.returncode == 0, e2e_run.proc.stderr[-4000:]
    manifest = RunDir(e2e_run.run_dir).manifest()
    base, cand = manifest.arm("baseline"), manifest.arm("candidate")
    python = cand.build.declared
    assert base.build.declared is None and base.build.python != python and base.build.version
    assert python and python.endswith("candidate-venv/bin/python") and cand.build.python == python
    assert cand.server_command[:3] == (python, "-m", "vllm.entrypoints.cli.main")
    assert base.attestation.valid and cand.attestation.valid
    for arm in (base, cand):
        startup = arm.sessions[0].startup
        assert startup.ready_s > 0 and startup.kv_cache_tokens > 0 and startup.peak_rss_gib > 0
    assert base.sessions[0].startup.compile_s > 0 and cand.sessions[0].startup.compile_s is None
    html = (e2e_run.run_dir / "report.html").read_text()
    assert '<section id="startup">' in html and "KV-cache capacity" in html and "recompiles at every" in html
    print(json.dumps({arm.name: arm.sessions[0].startup.model_dump() for arm in (base, cand)}))
