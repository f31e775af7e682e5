"""``dsa-bench import``: a run directory from `vllm bench serve --save-detailed` JSON files listed in an index CSV.

The round trip uses a real ``dsa-bench compare`` run directory with its raw JSON (``tests/fixtures/compare_run``):
imported, its throughput and latency cells equal the original's under a policy with those metrics primary and
``require_attestation = false``."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.gate import run_gate
from harness.judge.policy import GatePolicy, Status
from harness.render import render_report
from harness.rundir.store import RunDir

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"
PERF = ("output_throughput", "mean_tpot_ms", "mean_ttft_ms", "mean_e2el_ms")
NOT_ATTESTED_OK = GatePolicy(primary=PERF, min_sessions=3, require_attestation=False)
COMPARED = ("metric", "concurrency", "result", "baseline", "candidate", "ratio", "delta", "ci_low", "ci_high",
            "p_pass", "p_fail", "repeats", "reasons")


def _write_index(folder: Path, rows: list[dict], columns=("arm", "session", "concurrency", "round", "path")) -> Path:
    path = folder / "index.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _rows_of_original(folder: Path) -> list[dict]:
    """One index row per level of the original run: its session and round, its raw JSON copied under ``folder``."""
    manifest = RunDir(FIXTURE).manifest()
    shutil.copytree(FIXTURE / "raw", folder / "bench")
    rows = []
    for arm in manifest.arms:
        for key, level in arm.level_items():
            rows.append({"arm": arm.name, "session": level.session, "concurrency": key.concurrency,
                         "round": 0, "path": f"bench/{Path(level.raw).name}"})
    return rows


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    target = tmp_path_factory.mktemp("original") / "run"
    shutil.copytree(FIXTURE, target)
    return run_gate(target, NOT_ATTESTED_OK, write=False)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("import")
    index = _write_index(folder, _rows_of_original(folder))
    assert main(["import", str(index), "--out", str(folder / "run")]) == 0
    return folder / "run"


def _cells(result):
    cells = result.document["cells"] + result.document["pooled"]
    return [{key: cell[key] for key in COMPARED} for cell in cells]


def test_round_trip_gives_the_same_throughput_and_latency_cells(original, imported):
    again = run_gate(imported, NOT_ATTESTED_OK, write=False)
    assert _cells(again) == _cells(original)
    assert again.status == original.status
    tested = [c for c in original.verdict.primary if c.ci_low is not None]
    assert len(tested) >= 4                   # the fixture's sessions give real intervals, not just "no data"


def test_imported_run_is_marked_and_refused_without_the_policy_key(imported):
    manifest = RunDir(imported).manifest()
    assert manifest.imported_from and all(arm.attestation.valid is None for arm in manifest.arms)
    assert all("not available" in arm.attestation.note for arm in manifest.arms)
    strict = run_gate(imported, GatePolicy(primary=PERF, min_sessions=3), write=False)
    assert strict.status == Status.INVALID
    assert all("not attested" in c.note() and "require_attestation = false" in c.note()
               for c in strict.verdict.primary)


def test_report_works_on_an_imported_directory(imported, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(imported, copy)
    run_gate(copy, NOT_ATTESTED_OK)
    html = render_report(copy).read_text(encoding="utf-8")
    assert "Imported, not attested" in html
    assert "compares a path with itself" not in html
    assert "Imported, not attested" in (copy / "summary.md").read_text(encoding="utf-8")


def test_sessions_without_round_column_become_rounds(tmp_path):
    """No ``round`` column: round 0 within each session; the run directory numbers (session, round) pairs."""
    rows = _rows_of_original(tmp_path)
    index = _write_index(tmp_path, rows, columns=("arm", "session", "concurrency", "path"))
    assert main(["import", str(index), "--out", str(tmp_path / "run")]) == 0
    levels = RunDir(tmp_path / "run").levels()
    assert sorted(set(zip(levels["session"], levels["round"]))) == [(0, 0), (1, 1), (2, 2)]
    assert sorted((tmp_path / "run" / "raw").iterdir())[0].name == "baseline-random-i64-o16-c1-r0.json"


def test_index_lengths_make_regimes_and_without_them_the_index_is_one(tmp_path):
    """Issue #26: ``input_len`` / ``output_len`` columns key each row's regime; without them every file is the
    index's one regime, although a random dataset's prompts re-tokenise to ±1 token between files."""
    rows = _rows_of_original(tmp_path)
    for row in rows:
        row.update(input_len=64 if row["concurrency"] == 1 else 4096, output_len=16)
        if row["concurrency"] != 1:                 # the c=2 files become a long regime's: 4096–4098 in
            path = tmp_path / row["path"]
            data = json.loads(path.read_text())
            data["input_lens"] = [n - 64 + 4096 for n in data["input_lens"]]
            path.write_text(json.dumps(data))
    index = _write_index(tmp_path, rows, columns=("arm", "session", "concurrency", "round", "path", "input_len",
                                                  "output_len"))
    assert main(["import", str(index), "--out", str(tmp_path / "two")]) == 0
    levels = RunDir(tmp_path / "two").levels()
    assert set(levels["level"]) == {"random-i64-o16-c1", "random-i4096-o16-c2"}
    result = run_gate(tmp_path / "two", NOT_ATTESTED_OK, write=False)
    assert {c["regime"] for c in result.document["pooled"]} <= {"random-i64-o16", "random-i4096-o16"}
    one = _write_index(tmp_path / "again", _rows_of_original(tmp_path / "again"))
    assert main(["import", str(one), "--out", str(tmp_path / "one")]) == 0
    assert set(RunDir(tmp_path / "one").levels()["level"]) == {"random-i64-o16-c1", "random-i64-o16-c2"}


def _bad_json(folder, rows):
    (folder / "bench" / "broken.json").write_text("{not json")
    rows[0]["path"] = "bench/broken.json"


def _not_detailed(folder, rows):
    data = json.loads((folder / rows[0]["path"]).read_text())
    del data["ttfts"]
    (folder / "bench" / "short.json").write_text(json.dumps(data))
    rows[0]["path"] = "bench/short.json"


BAD_INPUTS = {
    "missing column": (lambda folder, rows: [row.pop("session") for row in rows], "missing columns ['session']"),
    "unknown arm": (lambda folder, rows: rows[0].update(arm="treatment"), "use baseline or candidate"),
    "missing file": (lambda folder, rows: rows[0].update(path="bench/nope.json"), "is not a file"),
    "duplicate": (lambda folder, rows: rows.append(dict(rows[0])), "give each level once"),
    "bad number": (lambda folder, rows: rows[0].update(concurrency="four"), "not a whole number"),
    "bad JSON": (_bad_json, "index.csv:2: "),   # the index line and the file, then why
    "not detailed": (_not_detailed, "--save-detailed"),
    "one arm only": (lambda folder, rows: rows.__setitem__(slice(None), [r for r in rows if r["arm"] == "baseline"]),
                     "no candidate rows"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, name):
    mutate, fragment = BAD_INPUTS[name]
    rows = _rows_of_original(tmp_path)
    mutate(tmp_path, rows)
    columns = [c for c in ("arm", "session", "concurrency", "round", "path") if c in rows[0]]
    index = _write_index(tmp_path, rows, columns=columns)
    out = tmp_path / "run"
    assert main(["import", str(index), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_existing_non_empty_out_is_refused(tmp_path, capsys):
    index = _write_index(tmp_path, _rows_of_original(tmp_path))
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["import", str(index), "--out", str(out)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


LENGTH_COLUMNS = ("arm", "session", "concurrency", "round", "path", "input_len", "output_len")


def _restate(folder: Path, rows: list[dict], **fields) -> None:
    """Write ``fields`` into the first row's bench JSON (a copy under ``folder``), as other tooling's
    ``--metadata KEY=VALUE`` would record them."""
    data = json.loads((folder / rows[0]["path"]).read_text())
    data.update(fields)
    (folder / "bench" / "stated.json").write_text(json.dumps(data))
    rows[0]["path"] = "bench/stated.json"


CONTRADICTIONS = {
    # the files hold 64-token prompts (64–66 after re-tokenising) and 16-token outputs (--ignore-eos)
    "input far from the prompts": (lambda folder, rows: rows[0].update(input_len=128), "input_len 128"),
    "output far from the outputs": (lambda folder, rows: rows[0].update(output_len=32), "output_len 32"),
    "a stated length": (lambda folder, rows: _restate(folder, rows, random_input_len="1024"), "random_input_len"),
}


@pytest.mark.parametrize("name", list(CONTRADICTIONS))
def test_index_lengths_that_contradict_the_bench_json_are_refused(tmp_path, capsys, name):
    """The index's input_len / output_len must be what the file measured: one line naming the index line, the
    file and the fix, exit 2, nothing written."""
    mutate, fragment = CONTRADICTIONS[name]
    rows = _rows_of_original(tmp_path)
    for row in rows:
        row.update(input_len=64, output_len=16)
    mutate(tmp_path, rows)
    index = _write_index(tmp_path, rows, columns=LENGTH_COLUMNS)
    out = tmp_path / "run"
    assert main(["import", str(index), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err and "index.csv:2" in err, err
    assert Path(rows[0]["path"]).name in err and "set " in err, err
    assert not out.exists()


def test_index_lengths_within_the_retokenising_drift_are_accepted(tmp_path):
    """A random dataset's prompts re-tokenise to a few tokens more or fewer than asked (these files: 64–66 for
    64): an index that says 62 or 68 is the same regime, not a contradiction."""
    rows = _rows_of_original(tmp_path)
    for row in rows:
        row.update(input_len=62 if row["concurrency"] == 1 else 68, output_len=16)
    index = _write_index(tmp_path, rows, columns=LENGTH_COLUMNS)
    assert main(["import", str(index), "--out", str(tmp_path / "run")]) == 0
    assert set(RunDir(tmp_path / "run").levels()["level"]) == {"random-i62-o16-c1", "random-i68-o16-c2"}
