"""The one reader and writer of run directories: :class:`RunDir` (schema: :mod:`harness.rundir.schema`).

Every write is atomic (temp file in the same directory + ``os.replace``), so a crash never leaves a half-written
file. Every read is typed: ``manifest.json`` as a :class:`~harness.rundir.schema.Manifest`, the CSVs as pandas frames
with the schema's columns. A version-1 run directory (dsa-bench before the typed schema) is read through
:func:`upgrade_v1` (arms map → list, ``repeat`` → ``round``, sessions inferred from how servers were scheduled), a
version-2 one (levels keyed by concurrency alone) through :func:`upgrade_v2` (each level the scenario's one regime at
its concurrency); any other version is refused with one line naming it.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ValidationError

from harness.rundir import schema
from harness.metrics import finite_float
from harness.rundir.files import first_error, one_line, json_text, rows_to_csv
from harness.rundir.v1 import upgrade_v1, upgrade_v1_frame
from harness.rundir.v2 import upgrade_v2, upgrade_v2_frame
from harness.rundir.schema import (ACCURACY_COLUMNS, LEVEL_COLUMNS, REQUEST_COLUMNS, AccuracyRow, Level, LevelKey,
                                   LevelRow, Manifest, RequestRow)


class RunDirError(Exception):
    """A run directory is missing, empty or holds unreadable files; the message names the file and the fix."""


class SchemaError(RunDirError):
    """A file parses but does not follow the schema (a wrong type, a missing field); the message names the file."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory, then ``os.replace``).

    Raises:
        OSError: the directory is not writable (the caller turns it into a one-line error).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def probe_writable(folder: Path) -> None:
    """Prove ``folder`` takes an atomic write: write and remove ``folder/.write-test``.

    Raises:
        OSError: it does not (the caller turns it into a one-line error naming the fix).
    """
    atomic_write_text(folder / ".write-test", "ok")
    (folder / ".write-test").unlink()


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON atomically (see :func:`atomic_write_text`)."""
    atomic_write_text(path, json_text(data))


# ----------------------------------------------------------------------------------------------------- RunDir

_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _write_lock_for(path: Path) -> threading.Lock:
    """One lock per run directory in this process, shared by every :class:`RunDir` of it: a duet's two arms, or the
    two arms' GSM8K threads, each build their own ``RunDir`` of the same directory and write its files at once."""
    key = path.resolve()
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


class RunDir:
    """A run directory ``results/<run-id>/``: typed, atomic reads and writes of every file in it."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._raw_manifest: dict[str, Any] | None = None
        self._write_lock = _write_lock_for(self.path)   # read-modify-write of a file: one writer at a time

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def file(self, name: str) -> Path:
        """The path of ``name`` (a schema file name, or a relative path) inside the run directory."""
        return self.path / name

    def raw_path(self, arm: str, key: LevelKey) -> Path:
        """``raw/<arm>-c<c>-r<r>.json``."""
        return self.path / schema.RAW_DIR / key.raw_name(arm)

    def log_path(self, name: str) -> Path:
        """``logs/<name>``."""
        return self.path / schema.LOGS_DIR / name

    # ------------------------------------------------------------------------------------------- manifest
    def _manifest_data(self) -> dict[str, Any]:
        if not self.path.is_dir():
            raise RunDirError(f"{self.path}: no such run directory; pass a directory written by `dsa-bench compare`")
        path = self.file(schema.MANIFEST)
        if not path.is_file():
            raise RunDirError(f"{path}: missing; {self.path} is not a dsa-bench run directory (run `dsa-bench "
                              f"compare`)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise RunDirError(f"{path}: not valid JSON ({one_line(error)}); the run directory's record is "
                              f"corrupted and cannot be resumed: run `dsa-bench compare` again") from error
        if not isinstance(data, dict):
            raise RunDirError(f"{path}: not a JSON object; the file is corrupted")
        return data

    @property
    def version(self) -> int | None:
        """``schema_version`` of the manifest on disk (read once)."""
        return self._raw().get("schema_version")

    def _disk_version(self) -> int | None:
        """The manifest's version, or None when there is no readable manifest (CSVs are then read as current)."""
        try:
            return self.version
        except RunDirError:
            return None

    def _raw(self) -> dict[str, Any]:
        if self._raw_manifest is None:
            self._raw_manifest = self._manifest_data()
        return self._raw_manifest

    def manifest(self) -> Manifest:
        """``manifest.json`` as a :class:`Manifest` (versions 1 and 2 upgraded).

        Raises:
            RunDirError: no directory, no manifest, not JSON, or a schema version this code cannot read.
            SchemaError: the manifest is JSON but breaks the schema (names the field).
        """
        self._raw_manifest = None
        data = self._raw()
        version = data.get("schema_version")
        if version not in schema.READABLE_VERSIONS:
            raise RunDirError(f"{self.file(schema.MANIFEST)}: schema_version {version!r} is not one this dsa-bench "
                              f"reads ({', '.join(map(str, schema.READABLE_VERSIONS))}); use the dsa-bench that wrote "
                              f"it")
        if version == 1:
            data = upgrade_v1(data)
        if version in (1, 2):
            data = upgrade_v2(data)
        try:
            return Manifest.model_validate(data)
        except ValidationError as error:
            raise SchemaError(f"{self.file(schema.MANIFEST)}: {first_error(error)}; the file is corrupted") from None

    def write_manifest(self, manifest: Manifest | Mapping[str, Any]) -> Manifest:
        """Validate ``manifest`` and write it (version 3); returns the typed manifest.

        Raises:
            SchemaError: ``manifest`` breaks the schema (a bug in the writer).
        """
        try:
            typed = manifest if isinstance(manifest, Manifest) else Manifest.model_validate(manifest)
        except ValidationError as error:
            raise SchemaError(f"{self.file(schema.MANIFEST)}: refusing to write: {first_error(error)}") from None
        with self._write_lock:
            atomic_write_json(self.file(schema.MANIFEST), typed)
        self._raw_manifest = None
        return typed

    # ------------------------------------------------------------------------------------------- tables
    def _table(self, name: str, columns: tuple[str, ...], required: tuple[str, ...], numeric: bool):
        import pandas as pd

        path = self.file(name)
        if not path.exists():
            return pd.DataFrame(columns=list(columns))
        try:
            frame = pd.read_csv(path, keep_default_na=True, dtype={"error": object, "acceptance_per_pos": object})
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
            raise RunDirError(f"{path}: unreadable CSV ({one_line(error)}); re-run the affected levels with "
                              f"--resume") from error
        if self._disk_version() == 1:
            frame = upgrade_v1_frame(frame, self._raw().get("scenario") or {})
        if self._disk_version() in (1, 2):
            frame = upgrade_v2_frame(frame, self._raw().get("scenario") or {})
        missing = [column for column in required if column not in frame.columns]
        if missing:
            raise RunDirError(f"{path}: missing columns {missing}; the file is corrupted or from another tool")
        for column in columns:
            if column not in frame.columns:
                frame[column] = float("nan")
        frame = frame[list(columns) + [c for c in frame.columns if c not in columns]]
        if numeric:
            _numeric(frame, path, keys=tuple(c for c in ("round", "concurrency", "completed", "failed")
                                             if c in required))
            _levels_parse(frame, path)
        return frame

    def levels(self, *, required: Iterable[str] = (), numeric: bool = False):
        """``levels.csv`` as a DataFrame with :data:`LEVEL_COLUMNS` (absent optional columns empty; an empty frame
        when the file does not exist yet). ``numeric``: every column but ``arm``/``acceptance_per_pos`` as numbers.

        Raises:
            RunDirError: the file exists but is unreadable, lacks a required column, or (``numeric``) holds text in
                a number column or an empty key cell.
        """
        need = schema.REQUIRED_LEVEL_COLUMNS + tuple(c for c in required if c not in schema.REQUIRED_LEVEL_COLUMNS)
        return self._table(schema.LEVELS, LEVEL_COLUMNS, need, numeric)

    def requests(self, *, numeric: bool = False):
        """``requests.csv`` as a DataFrame with :data:`REQUEST_COLUMNS` (see :meth:`levels`)."""
        return self._table(schema.REQUESTS, REQUEST_COLUMNS, schema.REQUIRED_REQUEST_COLUMNS, numeric)

    def accuracy(self):
        """``accuracy.csv`` as a DataFrame (``question_id`` text, ``correct`` int), or None when absent.

        Raises:
            RunDirError: unreadable, a required column missing, or a ``correct`` cell that is not 0/1.
        """
        import pandas as pd

        path = self.file(schema.ACCURACY)
        if not path.exists():
            return None
        try:
            frame = pd.read_csv(path, dtype={"question_id": str, "extracted": object, "target": object},
                                keep_default_na=True)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
            raise RunDirError(f"{path}: unreadable CSV ({one_line(error)}); re-run GSM8K for both arms") from error
        missing = [c for c in schema.REQUIRED_ACCURACY_COLUMNS if c not in frame.columns]
        if missing:
            raise RunDirError(f"{path}: missing columns {missing}; the file is corrupted or from another tool")
        return frame

    def accuracy_rows(self) -> list[dict[str, Any]]:
        """``accuracy.csv`` rows as dicts (``question_id`` and ``correct`` as int); empty when the file is absent.

        Raises:
            RunDirError: a required column missing, or a non-integer id/flag.
        """
        path = self.file(schema.ACCURACY)
        if not path.is_file():
            return []
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in schema.REQUIRED_ACCURACY_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise RunDirError(f"{path}: missing columns {missing}; the file is corrupted")
            try:
                return [{**row, "question_id": int(row["question_id"]), "correct": int(row["correct"])}
                        for row in reader]
            except (ValueError, TypeError) as error:
                raise RunDirError(f"{path}: {error}; the file is corrupted") from None

    def append_levels(self, rows: Iterable[LevelRow | Mapping[str, Any]]) -> None:
        """Append rows to ``levels.csv`` (validated as :class:`LevelRow`)."""
        self._append(schema.LEVELS, [_row(LevelRow, row) for row in rows], LEVEL_COLUMNS)

    def append_requests(self, rows: Iterable[RequestRow | Mapping[str, Any]]) -> None:
        """Append rows to ``requests.csv`` (validated as :class:`RequestRow`)."""
        self._append(schema.REQUESTS, [_row(RequestRow, row) for row in rows], REQUEST_COLUMNS)

    def replace_accuracy_rows(self, arm: str, rows: Iterable[AccuracyRow | Mapping[str, Any]]) -> None:
        """``accuracy.csv`` with ``arm``'s earlier rows replaced by ``rows`` (the arms' GSM8K threads may finish at
        once: the read and the write hold the directory's write lock)."""
        fresh = [_row(AccuracyRow, row) for row in rows]
        with self._write_lock:
            kept = [row for row in self.accuracy_rows() if row["arm"] != arm]
            atomic_write_text(self.file(schema.ACCURACY), rows_to_csv([*kept, *fresh], ACCURACY_COLUMNS))

    def keep_levels(self, done: set[tuple[str, LevelKey]]) -> None:
        """Cut ``levels.csv`` and ``requests.csv`` back to the rows of the ``done`` (arm, level) pairs, rewriting
        them with the current columns (a resumed version-1 or -2 directory becomes version 3)."""
        for name, frame, columns in ((schema.LEVELS, self.levels, LEVEL_COLUMNS),
                                     (schema.REQUESTS, self.requests, REQUEST_COLUMNS)):
            if not self.file(name).exists():
                continue
            table = frame()
            keep = [(arm, LevelKey(Level.parse(level), int(r))) in done
                    for arm, level, r in zip(table["arm"], table["level"], table["round"])]
            atomic_write_text(self.file(name), table[keep][list(columns)].to_csv(index=False))

    def _append(self, name: str, rows: list[Mapping[str, Any]], columns: tuple[str, ...]) -> None:
        fresh = rows_to_csv(rows, columns)
        with self._write_lock:   # read-append-replace: two writers at once would lose one's rows
            path = self.file(name)
            existing = path.read_text(encoding="utf-8") if path.exists() else ""
            if existing:
                fresh = fresh.split("\n", 1)[1]
            atomic_write_text(path, existing + fresh)

    # ------------------------------------------------------------------------------------------- JSON documents
    def read_json(self, name: str, fix: str = "re-run that step with --resume") -> Any:
        """The JSON of ``name`` (relative path), or None when absent.

        Raises:
            RunDirError: the file exists but is not valid JSON (names the file and ``fix``).
        """
        path = self.file(name)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise RunDirError(f"{path}: not valid JSON ({one_line(error)}); {fix}") from error

    def read_document(self, name: str, model: type[BaseModel], fix: str) -> Any:
        """``name`` validated as ``model`` (None when absent).

        Raises:
            RunDirError: not JSON. SchemaError: JSON that breaks ``model``'s schema.
        """
        data = self.read_json(name, fix)
        if data is None:
            return None
        try:
            return model.model_validate(data)
        except ValidationError as error:
            raise SchemaError(f"{self.file(name)}: {first_error(error)}; {fix}") from None

    def write_json(self, name: str, data: Any) -> Path:
        """Write ``data`` (a model or plain data) as JSON to ``name``; returns the path."""
        path = self.file(name)
        atomic_write_json(path, data)
        return path

    def write_text(self, name: str, text: str) -> Path:
        """Write ``text`` to ``name`` atomically; returns the path."""
        path = self.file(name)
        atomic_write_text(path, text)
        return path

    def accuracy_summary(self) -> schema.AccuracySummary | None:
        """``accuracy/summary.json`` typed (None when absent)."""
        return self.read_document(schema.ACCURACY_SUMMARY, schema.AccuracySummary, "re-run GSM8K with --resume")

    def parity_summary(self) -> schema.ParitySummary | None:
        """``parity.json`` typed (None when absent)."""
        return self.read_document(schema.PARITY, schema.ParitySummary, "re-run the parity check")

    def listing(self) -> list[tuple[str, int]]:
        """``(relative path, bytes)`` of the files under ``raw/`` and ``logs/``."""
        found = []
        for sub in (schema.RAW_DIR, schema.LOGS_DIR):
            folder = self.path / sub
            if folder.is_dir():
                found.extend((f"{sub}/{p.name}", p.stat().st_size) for p in sorted(folder.iterdir()) if p.is_file())
        return found


def _row(model: type[BaseModel], row: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """``row`` validated as ``model``, as a dict (ValueError names the column)."""
    if isinstance(row, model):
        return row.model_dump()
    try:
        return model.model_validate(dict(row)).model_dump()
    except ValidationError as error:
        raise ValueError(f"{model.__name__}: {first_error(error)}") from None


def _levels_parse(frame, path: Path) -> None:
    """Check the ``level`` column: every cell a level id (:class:`~harness.rundir.schema.Level`) whose concurrency is
    the row's ``concurrency``.

    Raises:
        RunDirError: an empty or malformed cell, or a level that disagrees with its row's concurrency.
    """
    for level, concurrency in zip(frame["level"], frame["concurrency"]):
        parsed = Level.parse(level)
        if parsed is None or parsed.concurrency != concurrency:
            raise RunDirError(f"{path}: level {ascii(level)} is not a level id of concurrency {concurrency} "
                              f"(<dataset>-i<input_len>-o<output_len>-c<concurrency>); the file is corrupted")


def _numeric(frame, path: Path, keys: tuple[str, ...]) -> None:
    """Coerce every column but the text ones to numbers in place; empty cells stay NaN, text fails.

    Raises:
        RunDirError: text in a number column, or an empty ``keys`` cell.
    """
    import numpy as np
    import pandas as pd

    text = ("arm", "level", "error", "acceptance_per_pos")
    column = ""
    try:
        for column in [c for c in frame.columns if c not in text]:
            frame[column] = pd.to_numeric(frame[column], errors="raise")
        frame["arm"] = frame["arm"].astype(str)
    except (ValueError, TypeError) as error:
        raise RunDirError(f"{path}: non-numeric {column} ({one_line(error)}); the file is corrupted") from error
    if keys and frame[list(keys)].isna().any().any():
        raise RunDirError(f"{path}: empty {', '.join(keys)} cells; the file is corrupted")
    if keys:
        cells = frame[list(keys)].to_numpy(dtype=float)
        if not (np.isfinite(cells).all() and (cells == np.round(cells)).all()):
            raise RunDirError(f"{path}: {', '.join(keys)} cells that are not whole numbers; the file is corrupted")


__all__ = ["RunDir", "RunDirError", "SchemaError", "atomic_write_json", "atomic_write_text", "probe_writable",
           "json_text", "rows_to_csv", "upgrade_v1", "upgrade_v1_frame"]
