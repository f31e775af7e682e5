"""harness.rundir: the typed schema and the store every reader and writer goes through; version-1 directories."""

import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.gate import run_gate
from harness.judge.policy import Status
from harness.rundir import schema
from harness.rundir.schema import LevelKey, Manifest
from harness.rundir.store import RunDir, RunDirError, SchemaError

V1 = Path(__file__).parent / "fixtures" / "run_dir"          # a directory written by dsa-bench before schema 2


@pytest.fixture
def v1_dir(tmp_path):
    run_dir = tmp_path / "v1"
    shutil.copytree(V1, run_dir)
    return run_dir


def test_level_key_is_built_and_parsed_in_one_place():
    key = LevelKey(8, 2)
    assert str(key) == "c8-r2" and key.raw_name("candidate") == "candidate-c8-r2.json"
    assert LevelKey.parse("c8-r2") == key
    for text in ("c8", "8-r2", "c-1-r0", "c8-r2x", ""):
        assert LevelKey.parse(text) is None


def test_version_1_is_read_through_the_upgrade(v1_dir):
    store = RunDir(v1_dir)
    assert json.loads((v1_dir / schema.MANIFEST).read_text())["schema_version"] == 1
    manifest = store.manifest()
    assert manifest.schema_version == 2 and [arm.name for arm in manifest.arms] == ["baseline", "candidate"]
    assert manifest.arm("candidate").route == "candidate" and manifest.arm("nope") is None
    levels, requests = store.levels(), store.requests()
    assert "repeat" not in levels.columns and list(levels.columns[:4]) == ["arm", "session", "round", "concurrency"]
    assert len(requests) == 128 and set(requests["round"]) == {0}
    # sequential servers restart per ABBA block, one block a round: the session of a v1 row is its round
    assert manifest.scenario_value("serve", "concurrent_servers") is False
    assert (levels["session"] == levels["round"]).all() and manifest.arm("baseline").sessions[0].index == 0


def test_other_versions_are_refused_in_one_line(v1_dir, capsys):
    data = json.loads((v1_dir / schema.MANIFEST).read_text())
    (v1_dir / schema.MANIFEST).write_text(json.dumps({**data, "schema_version": 7}))
    with pytest.raises(RunDirError, match="schema_version 7 is not one this dsa-bench reads"):
        RunDir(v1_dir).manifest()
    for command in ("report", "gate"):
        assert main([command, str(v1_dir)]) == 2
        err = capsys.readouterr().err
        assert "schema_version 7" in err and len(err.strip().splitlines()) == 1


def test_a_manifest_that_breaks_the_schema_is_the_gates_invalid_naming_the_file(v1_dir):
    data = json.loads((v1_dir / schema.MANIFEST).read_text())
    data["status"] = "half-done"
    (v1_dir / schema.MANIFEST).write_text(json.dumps(data))
    with pytest.raises(SchemaError, match="manifest.json: status"):
        RunDir(v1_dir).manifest()
    result = run_gate(v1_dir)
    assert result.status == Status.INVALID and result.exit_code == 4 and "manifest.json: status" in result.reason
    assert (v1_dir / schema.VERDICT).is_file()


def test_write_manifest_validates_and_round_trips(tmp_path):
    store = RunDir(tmp_path)
    with pytest.raises(SchemaError, match="refusing to write: run_id"):
        store.write_manifest({"schema_version": 2})
    manifest = Manifest(run_id="r1", arms=({"name": "a", "route": "baseline",
                                             "levels": {"c1-r0": {"status": "done", "session": 0}}},))
    store.write_manifest(manifest)
    assert store.manifest() == manifest and store.version == 2
    assert manifest.arm("a").level_items() == [(LevelKey(1, 0), manifest.arm("a").levels["c1-r0"])]


def test_rows_are_validated_on_write(tmp_path):
    store = RunDir(tmp_path)
    with pytest.raises(ValueError, match="LevelRow: completed"):
        store.append_levels([{"arm": "a", "round": 0, "concurrency": 1, "completed": "many", "failed": 0}])
    assert not (tmp_path / schema.LEVELS).exists()


def test_keep_levels_rewrites_a_version_1_directory_with_the_current_columns(v1_dir):
    store = RunDir(v1_dir)
    store.keep_levels({("baseline", LevelKey(1, 0))})
    header = (v1_dir / schema.LEVELS).read_text().splitlines()[0].split(",")
    assert tuple(header) == schema.LEVEL_COLUMNS
    assert len(store.requests()) == 8 and set(store.levels()["concurrency"]) == {1}
