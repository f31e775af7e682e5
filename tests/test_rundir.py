"""harness.rundir: the typed schema and the store every reader and writer goes through; version-1 directories."""

import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.gate import run_gate
from harness.judge.policy import Status
from harness.rundir import schema
from harness.rundir.schema import Level, LevelKey, Manifest, Regime
from harness.rundir.store import RunDir, RunDirError, SchemaError

V1 = Path(__file__).parent / "fixtures" / "run_dir"          # a directory written by dsa-bench before schema 2
COMPARE_RUN = Path(__file__).parent / "fixtures" / "compare_run"   # written by dsa-bench compare at schema 2


@pytest.fixture
def v1_dir(tmp_path):
    run_dir = tmp_path / "v1"
    shutil.copytree(V1, run_dir)
    return run_dir


LEVEL = Level("random", 64, 32, 8)


def test_level_key_is_built_and_parsed_in_one_place():
    key = LevelKey(LEVEL, 2)
    assert str(key) == "random-i64-o32-c8-r2" and key.raw_name("candidate") == "candidate-random-i64-o32-c8-r2.json"
    assert LevelKey.parse("random-i64-o32-c8-r2") == key and key.concurrency == 8
    assert Level.parse(str(LEVEL)) == LEVEL and LEVEL.regime == Regime("random", 64, 32)
    assert Regime.parse(str(LEVEL.regime)) == LEVEL.regime and LEVEL.regime.at(8) == LEVEL
    assert LEVEL.label() == "c=8 · 64→32 random" and LEVEL.label(regime=False) == "c=8"
    for text in ("c8-r2", "random-i64-o32-c8", "random-i64-c8-r2", "Random-i64-o32-c8-r2", "random-i64-o32-c8-r2x",
                 ""):
        assert LevelKey.parse(text) is None
    # a regime sorts before its own longer prompts, and within a regime by concurrency
    assert sorted([Level("random", 1024, 512, 1), LEVEL, Level("random", 64, 32, 1)]) == [
        Level("random", 64, 32, 1), LEVEL, Level("random", 1024, 512, 1)]


def test_version_2_levels_map_to_the_scenarios_one_regime(tmp_path):
    """Schema 2 keyed levels by concurrency alone: its keys, schedule, pilot and CSV rows read as the scenario's
    regime at each concurrency; a resumed directory is rewritten with the level column."""
    shutil.copytree(COMPARE_RUN, tmp_path / "v2")
    store = RunDir(tmp_path / "v2")
    raw = json.loads(store.file(schema.MANIFEST).read_text())
    assert raw["schema_version"] == 2 and "c1-r0" in raw["arms"][0]["levels"]
    work = raw["scenario"]["workload"]
    regime = Regime("random", work["input_len"], work["output_len"])
    manifest = store.manifest()
    assert manifest.schema_version == 3
    assert {key.level for arm in manifest.arms for key, _ in arm.level_items()} == {
        regime.at(c) for c in work["concurrency"]}
    assert {level for _, level, _ in manifest.schedule} == {str(regime.at(c)) for c in work["concurrency"]}
    levels = store.levels(numeric=True)
    assert list(levels["level"]) == [str(regime.at(int(c))) for c in levels["concurrency"]]
    store.keep_levels({(arm.name, key) for arm in manifest.arms for key, _ in arm.level_items()})
    assert "level" in (store.file(schema.LEVELS)).read_text().splitlines()[0].split(",")


def test_a_level_column_that_disagrees_with_its_concurrency_is_refused(tmp_path):
    shutil.copytree(COMPARE_RUN, tmp_path / "v2")
    store = RunDir(tmp_path / "v2")
    manifest = store.manifest()
    store.keep_levels({(arm.name, key) for arm in manifest.arms for key, _ in arm.level_items()})
    store.write_manifest(manifest)                                    # now schema 3: the CSVs are read as they are
    path = store.file(schema.LEVELS)
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace("-c1,", "-c7,", 1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunDirError, match="is not a level id of concurrency"):
        RunDir(tmp_path / "v2").levels(numeric=True)


def test_version_1_is_read_through_the_upgrade(v1_dir):
    store = RunDir(v1_dir)
    assert json.loads((v1_dir / schema.MANIFEST).read_text())["schema_version"] == 1
    manifest = store.manifest()
    assert manifest.schema_version == 3 and [arm.name for arm in manifest.arms] == ["baseline", "candidate"]
    assert manifest.arm("candidate").route == "candidate" and manifest.arm("nope") is None
    levels, requests = store.levels(), store.requests()
    assert "repeat" not in levels.columns
    assert list(levels.columns[:5]) == ["arm", "session", "round", "level", "concurrency"]
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
        store.write_manifest({"schema_version": 3})
    key = LevelKey(LEVEL, 0)
    manifest = Manifest(run_id="r1", arms=({"name": "a", "route": "baseline",
                                             "levels": {str(key): {"status": "done", "session": 0}}},))
    store.write_manifest(manifest)
    assert store.manifest() == manifest and store.version == 3
    assert manifest.arm("a").level_items() == [(key, manifest.arm("a").levels[str(key)])]


def test_rows_are_validated_on_write(tmp_path):
    store = RunDir(tmp_path)
    with pytest.raises(ValueError, match="LevelRow: completed"):
        store.append_levels([{"arm": "a", "round": 0, "level": str(LEVEL), "concurrency": 8, "completed": "many",
                              "failed": 0}])
    assert not (tmp_path / schema.LEVELS).exists()


def test_keep_levels_rewrites_a_version_1_directory_with_the_current_columns(v1_dir):
    store = RunDir(v1_dir)
    store.keep_levels({("baseline", LevelKey(Level("random", 128, 32, 1), 0))})
    header = (v1_dir / schema.LEVELS).read_text().splitlines()[0].split(",")
    assert tuple(header) == schema.LEVEL_COLUMNS
    assert len(store.requests()) == 8 and set(store.levels()["concurrency"]) == {1}
