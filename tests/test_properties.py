"""Property-based tests (hypothesis): random and mutated scenarios, policies and run directories never end in a
traceback. Bad scenario or policy input is one line and exit code 2; a corrupt run directory is the gate's INVALID
(exit 4) naming the file, or — no manifest, not JSON, an unreadable version — one line and exit 2."""

import json
import shutil
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from harness.cli import main
from harness.gate import PolicyError, load_policy, run_gate
from harness.judge.policy import GatePolicy
from harness.rundir import schema
from harness.rundir.store import RunDir, RunDirError
from harness.run.scenario import ScenarioError, scenario_from_dict

REPO = Path(__file__).resolve().parent.parent
V1_RUN = Path(__file__).parent / "fixtures" / "run_dir"
SCENARIO = tomllib.loads((REPO / "scenarios" / "cpu-tiny.toml").read_text())
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)


def _paths(data, prefix=()):
    """Every key path of nested dicts (lists as leaves)."""
    for key, value in data.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from _paths(value, prefix + (key,))


def _mutate(data: dict, path: tuple, value) -> dict:
    copy = json.loads(json.dumps(data))
    node = copy
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return copy


_DELETE = object()
mutation = st.one_of(st.just(_DELETE), values)


def _one_line_error(err: str) -> bool:
    return err.count("\n") == 1 and "Traceback" not in err


@FAST
@given(path=st.sampled_from(list(_paths(SCENARIO))), value=mutation)
def test_mutated_scenarios_are_a_scenario_or_one_line(path, value):
    data = _mutate(SCENARIO, path, value)
    try:
        scenario_from_dict(data, "mutated.toml")
    except ScenarioError as error:
        assert "\n" not in str(error) and str(error).startswith("mutated.toml")


@FAST
@given(fields=st.dictionaries(st.sampled_from(["primary", "alpha", "levels", "margins", "n_resamples",
                                               "max_failed_fraction", "gsm8k_filter", "seed", "unknown"]),
                              values, max_size=4))
def test_random_policies_are_a_policy_or_one_line(fields):
    try:
        policy = GatePolicy.model_validate(fields)
    except ValueError as error:   # pydantic's error: load_policy turns it into PolicyError (next test)
        assert isinstance(error, ValidationError) and error.error_count() >= 1
    else:
        assert "unknown" not in fields and isinstance(policy, GatePolicy)   # extra keys are refused


@FAST
@given(text=st.text(max_size=200))
def test_random_policy_files_are_a_policy_or_one_line_exit_2(tmp_path, capsys, text):
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    try:
        load_policy(path)
    except PolicyError as error:
        assert "\n" not in str(error) and str(path) in str(error)
        assert main(["gate", str(V1_RUN), "--policy", str(path)]) == 2
        assert _one_line_error(capsys.readouterr().err)


@pytest.fixture
def run_copy(tmp_path):
    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(V1_RUN, target)
        return target
    return copy


MANIFEST = json.loads((V1_RUN / schema.MANIFEST).read_text())


@FAST
@given(path=st.sampled_from(list(_paths(MANIFEST))), value=mutation)
@example(path=("scenario", "gate"), value={"\n": None})   # found by CI: a key with a newline in a one-line error
@example(path=("scenario", "gate"), value=True)            # found by CI: a gate that is not a table in the summary
@example(path=("scenario", "workload"), value=True)
@example(path=("scenario", "workload", "rounds_per_session"), value="two")
def test_mutated_manifests_gate_without_a_traceback(run_copy, capsys, path, value):
    run_dir = run_copy("m")
    (run_dir / schema.MANIFEST).write_text(json.dumps(_mutate(MANIFEST, path, value)))
    try:
        result = run_gate(run_dir)
    except RunDirError as error:          # not a readable version / not an object: a usage error
        assert "manifest.json" in str(error) and "\n" not in str(error)
        assert main(["gate", str(run_dir)]) == 2 and _one_line_error(capsys.readouterr().err)
        return
    except PolicyError as error:          # the manifest's scenario.gate is not a valid policy
        assert "\n" not in str(error)
        return
    assert result.status.value in {"PASS", "FAIL", "INCONCLUSIVE", "INVALID"}
    if result.manifest is None:
        assert result.exit_code == 4 and "manifest.json" in result.reason


@FAST
@given(name=st.sampled_from([schema.LEVELS, schema.REQUESTS]), row=st.integers(0, 7), column=st.integers(0, 11),
       cell=st.one_of(st.text(max_size=10), st.just('"'), st.just(",,,"), st.just("nan"), st.just("-1e309")))
def test_corrupted_csv_cells_are_invalid_naming_the_file_or_a_verdict(run_copy, name, row, column, cell):
    run_dir = run_copy("c")
    lines = (run_dir / name).read_text().splitlines()
    parts = lines[1 + row].split(",")
    parts[column % len(parts)] = cell
    lines[1 + row] = ",".join(parts)
    (run_dir / name).write_text("\n".join(lines) + "\n")
    result = run_gate(run_dir)
    if result.verdict is None:
        assert result.exit_code == 4 and name in result.reason
    else:
        assert result.status.value in {"PASS", "FAIL", "INCONCLUSIVE", "INVALID"}
    try:
        RunDir(run_dir).levels(), RunDir(run_dir).requests()
    except RunDirError as error:
        assert name in str(error) and "\n" not in str(error)


@FAST
@given(data=st.binary(max_size=300))
def test_random_bytes_as_a_file_never_crash_report_or_gate(run_copy, capsys, data):
    run_dir = run_copy("b")
    (run_dir / schema.LEVELS).write_bytes(data)
    result = run_gate(run_dir)
    assert result.status.value == "INVALID" or result.verdict is not None
    code = main(["report", str(run_dir)])
    assert code in (0, 2)
    if code == 2:
        err = capsys.readouterr().err
        assert _one_line_error(err) and "levels.csv" in err


@FAST
@given(flag=st.sampled_from(["--concurrency", "--num-prompts", "--input-len", "--output-len", "--repeats", "--tp",
                             "--mtp", "--gsm8k-limit"]),
       text=st.text(max_size=12))
def test_bad_cli_values_are_one_line_exit_2(capsys, flag, text):
    import re

    from hypothesis import assume

    assume(not re.fullmatch(r"\s*\+?\d+\s*(,\s*\+?\d+\s*)*", text))     # every valid value is digits (and commas)
    try:
        code = main(["plan", flag, text])
    except SystemExit as exit_:            # argparse's usage error
        code = exit_.code
    assert code == 2
    assert _one_line_error(capsys.readouterr().err)
