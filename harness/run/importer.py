"""``dsa-bench import``: a run directory from ``vllm bench serve --save-result --save-detailed`` JSON files made by
other tooling, so ``dsa-bench gate`` and ``dsa-bench report`` can judge them.

The index CSV lists one JSON per row: ``arm`` (``baseline`` | ``candidate``), ``session`` (the server session the
level was measured in: the unit of replication; the same number in both arms pairs them), ``concurrency``, ``path``
(relative to the CSV's folder) and, optional, ``round`` (a pass over the levels inside the session; default 0),
``input_len`` / ``output_len`` (the level's tokens per request) and ``dataset`` (default ``random``): a level is that
regime at the concurrency (:class:`harness.rundir.schema.Level`). Without the length columns the whole index is one
regime, its lengths the median input and the largest output length over every request of every file (a random
dataset's prompts re-tokenise to ±1 token, so a per-file figure would split one regime in two). Lengths the index
states must agree with what each file recorded (:func:`check_lengths`), or the import is refused.
Every file is parsed by the runner's own parser (:func:`harness.run.load.parse_bench_result`) and copied to
``raw/``. The run directory's round numbers are global (one per (session, round) pair of the index, in sorted
order, the same in both arms), since a level of an arm is keyed by (level, round).

No server was watched, so the execution path is not attested: the manifest says so (``imported_from``, each arm's
``attestation.note``), and the gate calls every cell INVALID unless the policy says ``require_attestation = false``.
Bad input raises :class:`ImportInputError` before anything is written.
"""

from __future__ import annotations

import csv
import math
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from harness.run import spec_decode
from harness.run.load import parse_bench_result, read_bench_json
from harness.run.start import now
from harness.rundir import schema
from harness.rundir.schema import DATASETS, Level, LevelKey
from harness.rundir.store import RunDir

__all__ = ["ImportInputError", "IndexEntry", "NOT_ATTESTED", "STATED_LENGTHS", "check_lengths", "import_run",
           "length_tolerance", "read_index"]

REQUIRED_COLUMNS = ("arm", "session", "concurrency", "path")
ROLES = ("baseline", "candidate")
NOT_ATTESTED = ("not available: imported from vllm bench serve JSON (dsa-bench import); no server log was read, so "
                "the model runner, compilation mode and CUDA-graph mode are unknown")


class ImportInputError(ValueError):
    """Bad ``dsa-bench import`` input; ``str(error)`` is one line naming the fix (exit code 2)."""


@dataclass(frozen=True)
class IndexEntry:
    """One row of the index CSV (``line``: its line number in the file ``index_csv``, for messages; ``path``
    resolved)."""

    arm: str
    session: int
    concurrency: int
    round: int
    path: Path
    line: int
    index_csv: Path | None = None
    input_len: int | None = None
    output_len: int | None = None
    dataset: str = "random"

    def level(self, lengths: tuple[int, int]) -> Level:
        """This entry's level: its regime's lengths from the index, else ``lengths`` (input, output tokens)."""
        return Level(self.dataset, self.input_len or lengths[0], self.output_len or lengths[1], self.concurrency)


def _index_lengths(results: list[Mapping[str, Any]]) -> tuple[int, int]:
    """(median input, largest output) tokens per request over every request of ``results`` (bench JSON objects)."""
    def counts(name: str) -> list[int]:
        return [int(n) for data in results for n in (data.get(name) if isinstance(data.get(name), list) else [])
                if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0]

    inputs, outputs = counts("input_lens"), counts("output_lens")
    return int(statistics.median(inputs)) if inputs else 0, max(outputs, default=0)


STATED_LENGTHS = {"input_len": ("random_input_len",), "output_len": ("random_output_len", "custom_output_len")}
"""Keys a bench JSON may carry that state a level's asked lengths (vLLM's own result has none; tooling records
them with ``vllm bench serve --metadata random_input_len=1024``, as older result files did): index column → keys."""


def length_tolerance(declared: int) -> int:
    """How far (tokens) a file's measured length may sit from the index's ``declared`` one and still be that regime:
    max(4 tokens, 1 % of ``declared``, rounded up).

    Why: vLLM's random dataset decodes its token ids to text and re-encodes it
    (``benchmarks/datasets/datasets.py`` ``gen_prompt_decode_to_target_len``), which can end a few tokens off the
    target when its retries run out (the committed compare run: 64–66 for 64), and a real-text prompt's tokenizer
    may add a BOS token: a drift of a few tokens whatever the length, so 4 absolute. The 1 % keeps a long
    prompt's drift (a few tokens in 32768) far inside it, while a contradiction — a different regime, 64 vs 128,
    1024 vs 4096 — is off by ≥ 2×, far outside it."""
    return max(4, math.ceil(0.01 * declared))


def _measured_lengths(data: Mapping[str, Any]) -> dict[str, int | None]:
    """What a bench JSON measured, per index column (tokens; None where it has no figure): ``input_len`` = the
    median of ``input_lens`` (every request's prompt, as the server tokenised it; robust to a few drifted prompts
    and to ``--random-range-ratio``'s symmetric spread), ``output_len`` = the largest ``output_lens`` of a request
    without an error (the server's completion tokens; with ``--ignore-eos`` every request reaches ``max_tokens``,
    and none can pass it)."""
    def listed(key: str) -> list[Any]:
        return data[key] if isinstance(data.get(key), list) else []

    inputs = [n for n in listed("input_lens") if isinstance(n, (int, float)) and n > 0]
    errors = listed("errors") or [""] * len(listed("output_lens"))
    outputs = [n for n, error in zip(listed("output_lens"), errors)
               if not error and isinstance(n, (int, float)) and n > 0]
    return {"input_len": int(statistics.median(inputs)) if inputs else None,
            "output_len": int(max(outputs)) if outputs else None}


def _stated_length(data: Mapping[str, Any], column: str) -> tuple[str, int] | None:
    """(key, tokens) of the first :data:`STATED_LENGTHS` key for ``column`` a bench JSON holds as a whole number (a
    ``--metadata`` value is text), else None."""
    for key in STATED_LENGTHS[column]:
        try:
            return key, int(str(data[key]).strip())
        except (KeyError, ValueError):
            continue
    return None


def check_lengths(entry: IndexEntry, data: Mapping[str, Any]) -> None:
    """Refuse an index row whose ``input_len`` / ``output_len`` contradicts the bench JSON ``data`` it points at: a
    length the file states (:data:`STATED_LENGTHS`) must be equal; a measured one (:func:`_measured_lengths`) within
    :func:`length_tolerance`. A column the row leaves empty, or a figure the file lacks, is not checked.

    Raises:
        ImportInputError: one line naming the index line, the file, both figures and the fix.
    """
    measured = _measured_lengths(data)
    for column, declared in (("input_len", entry.input_len), ("output_len", entry.output_len)):
        if declared is None:
            continue
        stated = _stated_length(data, column)
        if stated is not None and stated[1] != declared:
            found, value = f"it states {stated[0]} = {stated[1]}", stated[1]
        elif stated is None and measured[column] is not None and \
                abs(measured[column] - declared) > length_tolerance(declared):
            value = measured[column]
            found = f"its requests measured {value} tokens (tolerance ±{length_tolerance(declared)})"
        else:
            continue
        raise ImportInputError(f"{entry.index_csv or 'index'}:{entry.line}: {column} {declared} contradicts "
                               f"{entry.path}: {found}; set {column} to {value} or fix the path")


def _whole(text: str | None, column: str, where: str, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ImportInputError(f"{where}: {column} {text!r} is not a whole number; write e.g. 0") from None
    if value < minimum:
        raise ImportInputError(f"{where}: {column} {value} is below {minimum}; fix the index")
    return value


def read_index(index_csv: Path) -> list[IndexEntry]:
    """The index CSV's rows, checked: columns, arms, numbers, files that exist, no duplicate key, both arms present.

    Raises:
        ImportInputError: names the file, line and fix.
    """
    try:
        with index_csv.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            columns = [c.strip() for c in reader.fieldnames or []]
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ImportInputError(f"{index_csv}: cannot read the index CSV ({error}); pass a readable UTF-8 CSV") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise ImportInputError(f"{index_csv}: missing columns {missing}; the index needs arm, session, concurrency, "
                               "path (and optional round, input_len, output_len, dataset)")
    if not rows:
        raise ImportInputError(f"{index_csv}: no rows; list one bench JSON per row")
    entries, seen = [], {}
    for number, raw in enumerate(rows, start=2):
        row = {str(k).strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        where = f"{index_csv}:{number}"
        if row["arm"] not in ROLES:
            raise ImportInputError(f"{where}: arm {row['arm']!r} is unknown; use baseline or candidate")
        path = (index_csv.parent / row["path"]).resolve()
        if not row["path"] or not path.is_file():
            raise ImportInputError(f"{where}: {row['path'] or '(empty path)'} is not a file (paths are relative to "
                                   f"{index_csv.parent}); fix the path")
        if (row.get("dataset") or "random") not in DATASETS:
            raise ImportInputError(f"{where}: dataset {row['dataset']!r} is unknown; use one of {', '.join(DATASETS)}")
        entry = IndexEntry(row["arm"], _whole(row["session"], "session", where, 0),
                           _whole(row["concurrency"], "concurrency", where, 1),
                           _whole(row.get("round") or "0", "round", where, 0), path, number, index_csv,
                           *(_whole(row[c], c, where, 1) if row.get(c) else None for c in ("input_len", "output_len")),
                           row.get("dataset") or "random")
        key = (entry.arm, entry.session, entry.concurrency, entry.round, entry.input_len, entry.output_len,
               entry.dataset)
        if key in seen:
            raise ImportInputError(f"{where}: arm {entry.arm} session {entry.session} concurrency {entry.concurrency} "
                                   f"round {entry.round} is already on line {seen[key]}; give each level once")
        seen[key] = number
        entries.append(entry)
    absent = [role for role in ROLES if all(e.arm != role for e in entries)]
    if absent:
        raise ImportInputError(f"{index_csv}: no {absent[0]} rows; list both arms' bench JSON files")
    return entries


def _global_rounds(entries: list[IndexEntry]) -> dict[tuple[int, int], int]:
    """(session, round) → the run directory's round: their rank over the whole index (the same in both arms)."""
    return {pair: index for index, pair in enumerate(sorted({(e.session, e.round) for e in entries}))}


@dataclass(frozen=True)
class _Parsed:
    entry: IndexEntry
    key: LevelKey
    level: dict[str, Any]
    requests: list[dict[str, Any]]


def _read(entry: IndexEntry) -> dict[str, Any]:
    """The bench JSON of ``entry``.

    Raises:
        ImportInputError: not JSON, or not a JSON object (names the index line).
    """
    try:
        data = read_bench_json(entry.path)
        if not isinstance(data, dict):
            raise ValueError(f"{entry.path}: not a JSON object")
    except (ValueError, TypeError) as error:
        raise ImportInputError(f"{entry.index_csv or 'index'}:{entry.line}: {error}; pass `vllm bench serve "
                               f"--save-result --save-detailed` output") from None
    return data


def _parse(entries: list[IndexEntry]) -> list[_Parsed]:
    """Every entry through the runner's parser (MTP counters where the JSON has them).

    Raises:
        ImportInputError: a file is not a detailed bench result (names the file and line).
    """
    rounds = _global_rounds(entries)
    results = [_read(entry) for entry in entries]
    for entry, data in zip(entries, results):
        check_lengths(entry, data)
    lengths = _index_lengths(results)
    parsed = []
    for entry, data in zip(entries, results):
        round_ = rounds[(entry.session, entry.round)]
        key = LevelKey(entry.level(lengths), round_)
        try:
            level, requests = parse_bench_result(data, entry.arm, key.level, round_, entry.session)
        except (ValueError, TypeError) as error:
            raise ImportInputError(f"{entry.index_csv or 'index'}:{entry.line}: {error}; pass `vllm bench serve "
                                   f"--save-result --save-detailed` output") from None
        mtp_on = any(key.startswith("spec_decode_") for key in data)
        level.update(spec_decode.level_fields(spec_decode.from_bench_result(data, mtp_on)))
        if any(p.entry.arm == entry.arm and p.key == key for p in parsed):
            raise ImportInputError(f"{entry.index_csv or 'index'}:{entry.line}: arm {entry.arm} level "
                                   f"{key.level.label()} round {entry.round} of session {entry.session} is listed "
                                   f"twice; give each level once (or set input_len / output_len)")
        parsed.append(_Parsed(entry, key, level, requests))
    return parsed


def _manifest(out: Path, index_csv: Path, parsed: list[_Parsed]) -> dict[str, Any]:
    arms = []
    for role in ROLES:
        mine = [p for p in parsed if p.entry.arm == role]
        arms.append({
            "name": role, "route": role, "description": f"imported from {index_csv.name}",
            "server_command": None, "bench_command": None,
            "attestation": {"valid": None, "not_checked": ["execution path"], "note": NOT_ATTESTED},
            "sessions": [{"index": s} for s in sorted({p.entry.session for p in mine})],
            "levels": {str(p.key): {"status": "done", "session": p.entry.session,
                                    "raw": f"{schema.RAW_DIR}/{p.key.raw_name(role)}"} for p in mine},
        })
    return {
        "schema_version": schema.SCHEMA_VERSION, "run_id": out.name, "status": "done", "started_at": now(),
        "ended_at": now(), "scenario_name": "imported", "imported_from": str(index_csv.resolve()),
        "scenario": {"name": "imported", "workload": {"concurrency": sorted({p.key.concurrency for p in parsed})}},
        "notes": [f"imported by dsa-bench import from {index_csv}: measured by other tooling, execution path not "
                  "attested"],
        "schedule": [[p.entry.arm, str(p.key.level), p.key.round] for p in parsed], "arms": arms,
    }


def import_run(index_csv: Path, out: Path) -> Path:
    """Build the run directory ``out`` from the index CSV ``index_csv``; returns ``out``.

    Raises:
        ImportInputError: bad index, bad file, or ``out`` exists and is not an empty directory (nothing written).
        OSError: ``out`` could not be written (whatever was written is removed).
    """
    index_csv, out = Path(index_csv), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ImportInputError(f"--out {out} exists and is not an empty directory; pass a new directory")
    parsed = _parse(read_index(index_csv))
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        store = RunDir(out)
        for item in parsed:
            target = store.raw_path(item.entry.arm, item.key)
            target.parent.mkdir(exist_ok=True)
            shutil.copyfile(item.entry.path, target)
        store.append_levels([p.level for p in parsed])
        store.append_requests([row for p in parsed for row in p.requests])
        store.write_manifest(_manifest(out, index_csv, parsed))
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise
    return out
