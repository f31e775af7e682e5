"""Per-arm vLLM builds: how an arm's declared ``vllm`` is invoked, what is recorded, and what is refused."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.run import builds
from harness.run.plan import ArmPlan
from harness.run.builds import mismatch as _build_mismatch
from harness.rundir.store import RunDir

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
ARM = ArmPlan(name="candidate", route="candidate", description="", decision={}, unavailable=(), intended={},
              server_args=("--seed", "0"), server_env={}, model_path="m", served_model_name="m", tokenizer="t")


def _second_venv(root: Path) -> Path:
    """A ``python -m venv`` whose site-packages reach this environment's through a .pth file; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python*/site-packages"))
    here = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "vllm").is_dir())
    (site / "first-venv.pth").write_text(here + "\n")
    return root / "bin" / "python"


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
    python = _second_venv(tmp_path / "v2")
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
    build = {"version": "0.32.0+cpu", "python": "/v/bin/python"}
    assert _build_mismatch(build, {"vllm_version": "0.32.0"}) == []
    assert "is 0.33.1, the server log says 0.32.0" in _build_mismatch({**build, "version": "0.33.1"},
                                                                      {"vllm_version": "0.32.0"})[0]
    assert _build_mismatch(None, {"vllm_version": "0.32.0"}) == []


@pytest.mark.slow
def test_compare_runs_each_arm_on_its_own_virtualenv_and_records_both_builds(tmp_path, monkeypatch):
    """Real vllm serve servers on CPU: the baseline from this environment, the candidate from a second venv."""
    python = _second_venv(tmp_path / "v2")
    text = (SCENARIOS / "cpu-tiny.toml").read_text().replace(
        'route = "candidate"', f'route = "candidate"\nvllm = "{python}"')
    (tmp_path / "s.toml").write_text(text)
    out = tmp_path / "results"
    code = main(["compare", "--scenario", str(tmp_path / "s.toml"), "--out", str(out), "--no-gsm8k",
                 "--concurrency", "1", "--repeats", "1"])
    assert code == 0
    run_dir = next(out.iterdir())
    manifest = RunDir(run_dir).manifest()
    base, cand = manifest.arm("baseline"), manifest.arm("candidate")
    assert base.build.declared is None and base.build.python != str(python) and base.build.version
    assert cand.build.declared == str(python) and cand.build.python == str(python)
    assert cand.server_command[:3] == (str(python), "-m", "vllm.entrypoints.cli.main")
    assert base.attestation.valid and cand.attestation.valid
    for arm in (base, cand):
        startup = arm.sessions[0].startup
        assert startup.ready_s > 0 and startup.kv_cache_tokens > 0 and startup.peak_rss_gib > 0
    assert base.sessions[0].startup.compile_s > 0 and cand.sessions[0].startup.compile_s is None
    html = (run_dir / "report.html").read_text()
    assert '<section id="startup">' in html and "KV-cache capacity" in html and "recompiles at every" in html
    print(json.dumps({arm.name: arm.sessions[0].startup.model_dump() for arm in (base, cand)}))
