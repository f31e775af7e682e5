"""The duration floor ``workload.min_level_s``: the pilot's sizing rule, and a run that sizes its levels by a pilot.

The runner and its level code run for real; only server start (a stub) and the benchmark client are replaced: the
fake client writes a ``vllm bench serve`` result whose duration is ``prompts × seconds per request / concurrency``,
so each level's length follows from its prompt count as on a real server."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from harness.cli import main
from harness.render import render_report
from harness.run import estimate as estimate_mod
from harness.run import pilot, plan_view
from harness.run import plan as plan_mod
from harness.run import runner as runner_mod
from harness.run import duet as duet_mod
from harness.run.scenario import ScenarioError, load_scenario
from harness.run.workload_spec import LEVEL_TIMEOUT_HEADROOM
from harness.rundir import schema
from harness.rundir.store import RunDir
from fakes.support import SCENARIO as FAULT_SCENARIO, StubServer, clean_environ, fake_env, leftovers

CPU = plan_mod.Machine(name="cpu", device="planned", cpu_count=2, gpu_count=0, has_triton=False)
SCENARIO = "tests/fixtures/recorded/record-sessions.toml"   # concurrency 1, 4: 16 and 48 prompts, timeout 300 s
BASE = {"accuracy.enabled": False, "mtp.num_speculative_tokens": 0, "workload.repeats": 2,
        "workload.rounds_per_session": 2, "workload.min_level_s": 10.0}
REQUEST_S = 0.5   # the fake server: one request takes 0.5 s; c of them run at once



def _by_concurrency(counts: dict) -> dict:
    """A pilot's counts by concurrency (these plans have one regime)."""
    return {level.concurrency: n for level, n in counts.items()}

def _plan(**overrides) -> plan_mod.Plan:
    scenario = load_scenario(SCENARIO, {**BASE, **overrides}).effective()
    return plan_mod.build_plan(scenario, CPU, plan_mod.ModelLocation("/models/tiny", "/models/tiny"))


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


class FakeClient:
    """The benchmark client: records every argv and writes a result JSON shaped like vLLM's."""

    calls: list[list[str]] = []
    request_s = REQUEST_S

    def __init__(self, env, log_path):
        self.import_s = 0.0

    def run(self, argv, log_path, timeout_s, on_tick=None):
        FakeClient.calls.append(list(argv))
        n, c = int(_flag(argv, "--num-prompts")), int(_flag(argv, "--max-concurrency"))
        duration = n * self.request_s / c
        result = {"duration": duration, "completed": n, "failed": 0, "output_throughput": 32 * n / duration,
                  "total_token_throughput": 96 * n / duration, "request_throughput": n / duration,
                  "max_concurrent_requests": c, "input_lens": [64] * n, "output_lens": [32] * n,
                  "ttfts": [0.05] * n, "latencies": [self.request_s] * n, "errors": [""] * n,
                  "start_times": [i * self.request_s / c for i in range(n)]}
        path = Path(_flag(argv, "--result-dir")) / _flag(argv, "--result-filename")
        path.write_text(json.dumps(result), encoding="utf-8")
        return {"ok": True, "error": None, "wall_s": duration, "cpu_s": 0.1}

    def close(self):
        pass


@pytest.fixture
def fake_client(monkeypatch):
    FakeClient.calls = []
    FakeClient.request_s = REQUEST_S
    monkeypatch.setattr(duet_mod, "LoadClient", FakeClient)
    return FakeClient


def _runner(run_dir, monkeypatch, plan, options=None, resume=None):
    run = runner_mod.Runner(plan, run_dir, options or runner_mod.RunOptions(), resume_manifest=resume)
    pilot_on_disk = []

    def start(arm, block):
        run._new_session(arm.name, 1.0, StubServer.base_url)
        return StubServer()

    def connect(arm, url):
        run._new_session(arm.name, 0.0, url)
        return StubServer()

    measure = run._run_level

    def level(*args):   # the real level, after checking the pilot is on disk before it
        pilot_on_disk.append(RunDir(run_dir).manifest().pilot is not None)
        measure(*args)

    monkeypatch.setattr(run, "_start_server", start)
    monkeypatch.setattr(run, "_connect_remote", connect)
    monkeypatch.setattr(run, "_parity", lambda *_: None)
    monkeypatch.setattr(run, "_run_level", level)
    return run, pilot_on_disk


def _pilot_calls() -> list[list[str]]:
    return [argv for argv in FakeClient.calls if _flag(argv, "--result-filename").startswith("pilot-")]


# ------------------------------------------------------------------------------------------------- sizing rule
@pytest.mark.parametrize("n, c, duration_s, expected", [
    (16, 1, 8.0, (20, False)),        # ⌈16 · 10 / 8⌉ = 20
    (48, 4, 6.0, (80, False)),        # ⌈48 · 10 / 6⌉ = 80, a multiple of 4
    (16, 3, 3.0, (54, False)),        # ⌈53.3⌉ = 54, already a multiple of 3
    (16, 4, 7.0, (24, False)),        # ⌈22.9⌉ = 23 → 24, the next multiple of 4
    (16, 4, 12.0, (16, False)),       # the floor is met: the scenario's count stays
    (16, 4, 2.0, (40, True)),         # 80 wanted; 40 × 0.125 s = 5 s is all that fits under 10 s / 2
    (64, 4, 8.0, (64, True)),         # 80 wanted, 40 fit: below the scenario's 64, which stays (never fewer)
])
def test_size_level_rounds_up_to_whole_waves_and_caps_at_the_timeout(n, c, duration_s, expected):
    timeout = 10.0 if expected[1] else 300.0
    assert tuple(pilot.size_level(n, c, duration_s, 10.0, timeout)) == expected


@given(n=st.integers(1, 500), c=st.integers(1, 64), duration_s=st.floats(0.01, 100.0),
       floor=st.floats(0.1, 60.0), timeout=st.floats(1.0, 3600.0))
def test_size_level_never_shrinks_and_meets_the_floor_or_the_cap(n, c, duration_s, floor, timeout):
    count, capped = pilot.size_level(n, c, duration_s, floor, timeout)
    planned = duration_s * count / n
    assert count >= n
    assert count == n or count % c == 0
    if capped:
        assert count == n or planned <= timeout / LEVEL_TIMEOUT_HEADROOM * (1 + 1e-9)
        assert planned < floor
    else:
        assert planned >= floor * (1 - 1e-9) or count == n and duration_s >= floor * (1 - 1e-9)


def test_size_level_refuses_a_zero_duration():
    with pytest.raises(ValueError, match="positive"):
        pilot.size_level(16, 1, 0.0, 10.0, 300.0)


# ------------------------------------------------------------------------------------------------- scenario, plan
@pytest.mark.parametrize("value, message", [(-1.0, "must be ≥ 0 seconds"), (200.0, "raise workload.level_timeout_s")])
def test_a_negative_or_oversized_floor_is_a_scenario_error(value, message):
    with pytest.raises(ScenarioError, match=message):
        _plan(**{"workload.min_level_s": value})


def test_the_cli_flag_sets_the_floor_and_a_negative_one_exits_2(capsys):
    assert main(["plan", "--scenario", "cpu-tiny-dsa", "--min-level-s", "-5"]) == 2
    assert "min_level_s" in capsys.readouterr().err
    assert main(["plan", "--scenario", "cpu-tiny-dsa", "--min-level-s", "12"]) == 0
    out = capsys.readouterr().out
    assert "≥ 12 s per level, counts set by a pilot" in out and "pilot " in out.split("estimate:")[1]


def test_the_estimate_counts_the_floor_and_the_pilot():
    off, on = (estimate_mod.estimate(_plan(**{"workload.min_level_s": s})) for s in (0.0, 60.0))
    levels = len(_plan().levels()) * 2
    assert "pilot" not in off.parts and on.parts["pilot"][0] > 0
    assert on.parts["load levels"][0] >= levels * 60.0 > off.parts["load levels"][0]
    assert "counts set by a pilot" in plan_view.compact(_plan(), on)


# ------------------------------------------------------------------------------------------------- the run
@pytest.mark.parametrize("remote", [False, True])
def test_one_pilot_on_the_first_arm_sizes_every_level_of_both_arms(tmp_path, monkeypatch, fake_client, remote):
    plan = _plan()
    options = runner_mod.RunOptions(base_urls={"baseline": "http://b:1", "candidate": "http://c:1"} if remote else None)
    run, pilot_on_disk = _runner(tmp_path / "run", monkeypatch, plan, options)
    manifest = run.run()
    first_arm = runner_mod.schedule(plan)[0][0]
    pilots = _pilot_calls()
    assert sorted(int(_flag(argv, "--max-concurrency")) for argv in pilots) == [1, 4]   # once per concurrency
    assert {_flag(argv, "--result-filename").split("-")[1] for argv in pilots} == {first_arm}
    assert {int(_flag(argv, "--seed")) for argv in pilots} == {plan.rounds()}   # no measured round's prompts
    measured = [argv for argv in FakeClient.calls if argv not in pilots]
    counts = {(_flag(a, "--result-filename").split("-")[0], int(_flag(a, "--max-concurrency")),
               int(_flag(a, "--num-prompts"))) for a in measured}
    assert counts == {(arm, c, n) for arm in ("baseline", "candidate") for c, n in ((1, 20), (4, 80))}
    assert len(measured) == 2 * 2 * plan.rounds() and all(pilot_on_disk) and manifest.status == "done"

    stored = RunDir(tmp_path / "run")
    record = stored.manifest().pilot
    assert record.arm == first_arm and record.min_level_s == 10.0 and _by_concurrency(record.counts()) == {1: 20, 4: 80}
    assert [(lv.pilot_prompts, lv.duration_s) for lv in record.levels] == [(16, 8.0), (48, 6.0)]
    assert all((tmp_path / "run" / lv.raw).is_file() for lv in record.levels)
    levels, requests = stored.levels(numeric=True), stored.requests(numeric=True)
    assert len(levels) == 2 * 2 * plan.rounds()                       # measured levels only, no pilot rows
    assert sorted(requests.groupby(["arm", "round", "concurrency"]).size().unique()) == [20, 80]
    assert all(_flag(arm.bench_command, "--num-prompts") == "20" for arm in stored.manifest().arms)
    assert "pilot_s" in stored.manifest().timing
    render_report(tmp_path / "run")
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert "counts set by a pilot on " + first_arm in page and "c=4: 80 (pilot: 48 in 6.00 s)" in page


def test_resume_reuses_the_recorded_counts_without_a_new_pilot(tmp_path, monkeypatch, fake_client):
    plan = _plan()
    run, _ = _runner(tmp_path / "run", monkeypatch, plan)
    run.run()
    stored = RunDir(tmp_path / "run").manifest().model_dump(mode="json")
    last = stored["arms"][1]["levels"]
    for key in list(last)[-2:]:
        last[key]["status"] = "failed: interrupted during this level"
    FakeClient.calls, FakeClient.request_s = [], 2.0   # a new pilot would now choose other counts
    resumed, _ = _runner(tmp_path / "run", monkeypatch, plan, resume=schema.Manifest.model_validate(stored))
    manifest = resumed.run()
    assert _pilot_calls() == [] and len(FakeClient.calls) == 2 and manifest.status == "done"
    assert {int(_flag(argv, "--num-prompts")) for argv in FakeClient.calls} <= {20, 80}
    assert len(RunDir(tmp_path / "run").levels()) == 2 * 2 * plan.rounds()


def test_without_a_floor_no_pilot_runs_and_the_report_shows_the_scenarios_counts(tmp_path, monkeypatch, fake_client):
    run, _ = _runner(tmp_path / "run", monkeypatch, _plan(**{"workload.min_level_s": 0.0}))
    manifest = run.run()
    assert _pilot_calls() == [] and manifest.pilot is None
    assert {int(_flag(argv, "--num-prompts")) for argv in FakeClient.calls} == {16, 48}
    render_report(tmp_path / "run")
    assert "c=1: 16, c=4: 48 (the scenario&#39;s counts)" in (tmp_path / "run" / "report.html").read_text()


def test_a_capped_floor_is_noted_in_the_manifest(tmp_path, monkeypatch, fake_client):
    # 7 s per request, a floor of 150 s under a 300 s timeout (half of it the most a level may plan): c=1 needs
    # ⌈16 · 150 / 112⌉ = 22 prompts, 21 fit; c=4 needs 88 (a multiple of 4 above 85.7), 84 fit.
    FakeClient.request_s = 7.0
    run, _ = _runner(tmp_path / "run", monkeypatch, _plan(**{"workload.min_level_s": 150.0,
                                                            "workload.repeats": 1, "workload.rounds_per_session": 1}))
    manifest = run.run()
    record = manifest.pilot
    assert _by_concurrency(record.counts()) == {1: 21, 4: 84} and all(level.capped for level in record.levels)
    assert pilot.CAPPED_NOTE in manifest.notes and "capped by workload.level_timeout_s" in record.describe()


# ------------------------------------------------------------------------------------------------- real client
@pytest.mark.slow
def test_compare_with_a_floor_against_fake_servers_and_vllms_own_bench_client(tmp_path, monkeypatch):
    """``dsa-bench compare --min-level-s 1`` end to end: fake servers (tests/fakes/fake_vllm.py), vLLM's real
    ``vllm bench serve`` in the loadgen child, so the pilot's argv and result JSON are vLLM's own."""
    from harness.run import procs

    env = fake_env(tmp_path, delay_s="0.01")   # 8 output tokens per request: ≈ 0.1 s a request
    for key in set(os.environ) - set(clean_environ()):
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(procs, "cleanup_on_exit", lambda: None)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["compare", "--scenario", str(FAULT_SCENARIO), "--out", str(tmp_path / "results"),
                     "--min-level-s", "1"])
    (run_dir,) = list((tmp_path / "results").iterdir())
    assert code == 0, err.getvalue()[-3000:]
    stored = RunDir(run_dir)
    record = stored.manifest().pilot
    assert record is not None and record.arm == "baseline" and record.min_level_s == 1.0   # abba: baseline first
    for level in record.levels:
        assert level.pilot_prompts == 2 and 0 < level.duration_s < 1.0 and level.error is None
        assert level.num_prompts > 2 and level.num_prompts % level.concurrency == 0
        assert json.loads((run_dir / level.raw).read_text())["completed"] == 2
    requests = stored.requests(numeric=True)
    sent = requests.groupby(["arm", "concurrency"]).size().to_dict()
    assert sent == {(arm, c): n for arm in ("baseline", "candidate")
                    for c, n in _by_concurrency(record.counts()).items()}
    levels = stored.levels(numeric=True)
    assert len(levels) == 4 and (levels["duration_s"] > 0.5).all()   # ≈ the floor, not the pilot's ≈ 0.2 s
    assert "counts set by a pilot" in err.getvalue()
    assert procs.live_children() == [] and leftovers(env) == []
