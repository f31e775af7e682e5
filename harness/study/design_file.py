"""The design-study file (``scenarios/design-study/cpu.toml``): named run designs, each a set of dotted scenario
overrides on one scenario, read and checked before anything starts.

File: ``scenario`` (the scenario every design modifies), ``control_base`` (the design ``control = true`` designs
build on), and ``[designs.<name>]`` tables with ``description``, ``overrides`` (dotted keys → values, as
:func:`harness.run.scenario.load_scenario` applies them), ``base`` (a design whose overrides come first), ``control``
and ``preload`` (shared-library names to ``LD_PRELOAD`` into both arms' servers: the first one :func:`find_library`
finds). Every error is one line (:class:`DesignFileError`) naming the file, the design and the fix.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.run.scenario import REPO_ROOT, ScenarioError, load_scenario

__all__ = ["DEFAULT_FILE", "Design", "DesignFile", "DesignFileError", "read_designs", "find_library", "resolve"]

DEFAULT_FILE = REPO_ROOT / "scenarios" / "design-study" / "cpu.toml"
FILE_KEYS = {"scenario", "control_base", "calibrate", "designs"}
DESIGN_KEYS = {"description", "overrides", "base", "control", "preload"}


class DesignFileError(ValueError):
    """A design file or design name is invalid; ``str(error)`` is the one-line message (the CLI exits 2)."""


@dataclass(frozen=True)
class Design:
    """One design: ``overrides`` already merged with its base's; ``preload`` the libraries to look for; ``skipped``
    why it cannot run here (a library not found), else None."""

    name: str
    description: str
    overrides: dict[str, Any] = field(default_factory=dict)
    preload: tuple[str, ...] = ()
    skipped: str | None = None
    base: str | None = None     # the design whose overrides this one builds on (a control's before)


@dataclass(frozen=True)
class DesignFile:
    """The file's scenario, its control base and its raw design tables."""

    path: Path
    scenario: str
    control_base: str | None
    tables: dict[str, dict[str, Any]]
    calibrate: tuple[str, ...] = ()   # the designs a machine's first, short study runs (design_study calibrate)


def read_designs(path: Path = DEFAULT_FILE) -> DesignFile:
    """Parse and check the file's shape (keys, types, bases). Raises DesignFileError."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise DesignFileError(f"{path}: cannot read the design file ({error.strerror or error})") from None
    except tomllib.TOMLDecodeError as error:
        raise DesignFileError(f"{path}: malformed TOML ({error}); fix the syntax at that line") from None
    unknown = sorted(set(data) - FILE_KEYS)
    if unknown:
        raise DesignFileError(f"{path}: unknown key {unknown[0]!r}; use {', '.join(sorted(FILE_KEYS))}")
    tables = data.get("designs")
    if not isinstance(tables, dict) or not tables or not isinstance(data.get("scenario"), str):
        raise DesignFileError(f"{path}: needs scenario = \"NAME\" and at least one [designs.NAME] table")
    for name, table in tables.items():
        _check_table(path, name, table, tables)
    base = data.get("control_base")
    if base is not None and base not in tables:
        raise DesignFileError(f"{path}: control_base {base!r} is not a design; use one of {', '.join(tables)}")
    calibrate = data.get("calibrate", [])
    if not isinstance(calibrate, list) or any(name not in tables for name in calibrate):
        raise DesignFileError(f"{path}: calibrate must list designs of the file, e.g. calibrate = "
                              f"[\"{next(iter(tables))}\"]; got {calibrate!r}")
    return DesignFile(Path(path), data["scenario"], base, tables, tuple(calibrate))


def _check_table(path: Path, name: str, table: Any, tables: dict[str, Any]) -> None:
    where = f"{path}: [designs.{name}]"
    if not isinstance(table, dict):
        raise DesignFileError(f"{where} is not a table; write it as [designs.{name}] with description and overrides")
    unknown = sorted(set(table) - DESIGN_KEYS)
    if unknown:
        raise DesignFileError(f"{where}: unknown key {unknown[0]!r}; use {', '.join(sorted(DESIGN_KEYS))}")
    if not isinstance(table.get("overrides", {}), dict):
        raise DesignFileError(f"{where}: overrides must be a table of dotted scenario keys, e.g. "
                              "{ \"workload.warmups\" = 8 }")
    preload = table.get("preload", [])
    if not isinstance(preload, list) or not all(isinstance(item, str) for item in preload):
        raise DesignFileError(f"{where}: preload must be a list of library file names, e.g. [\"libtcmalloc.so.4\"]")
    if table.get("base") is not None and table["base"] not in tables:
        raise DesignFileError(f"{where}: base {table['base']!r} is not a design; use one of {', '.join(tables)}")


def find_library(names: tuple[str, ...] | list[str]) -> str | None:
    """The path of the first of ``names`` that ``ldconfig -p`` lists, else the first found under this interpreter's
    ``<prefix>/lib`` tree (a virtualenv's bundled libraries), else None."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    known = {}
    for line in listing.splitlines():
        if "=>" in line:
            library, _, target = line.partition("=>")
            known.setdefault(library.split()[0], target.strip())
    for name in names:
        if name in known:
            return known[name]
    for name in names:
        found = sorted(Path(sys.prefix, "lib").rglob(name))
        if found:
            return str(found[0])
    return None


def _base(designs: DesignFile, name: str, control_base: str | None) -> str | None:
    table = designs.tables[name]
    base = table.get("base") or (control_base if table.get("control") else None)
    return base if base != name else None


def _merged(designs: DesignFile, name: str, control_base: str | None, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    if name in seen:
        raise DesignFileError(f"{designs.path}: designs {' → '.join(seen + (name,))} form a cycle of bases; "
                              "break it")
    base = _base(designs, name, control_base)
    inherited = _merged(designs, base, control_base, seen + (name,)) if base else {}
    return {**inherited, **designs.tables[name].get("overrides", {})}


def resolve(designs: DesignFile, names: list[str], control_base: str | None = None) -> list[Design]:
    """The named designs with their bases merged, preloads resolved and every design's scenario validated
    (unknown keys, bad values), nothing started. ``control_base`` replaces the file's. Raises DesignFileError."""
    unknown = [name for name in names if name not in designs.tables]
    if unknown:
        raise DesignFileError(f"unknown design {unknown[0]!r}; use one of {', '.join(designs.tables)} "
                              f"({designs.path})")
    base = control_base or designs.control_base
    if base is not None and base not in designs.tables:
        raise DesignFileError(f"--control-base {base!r} is not a design; use one of {', '.join(designs.tables)}")
    out = []
    for name in names:
        table = designs.tables[name]
        overrides, preload, skipped = _merged(designs, name, base), tuple(table.get("preload", ())), None
        if preload:
            library = find_library(preload)
            if library is None:
                skipped = (f"none of {', '.join(preload)} found (ldconfig -p, {sys.prefix}/lib); installing it is "
                           "host configuration")
            else:
                overrides["serve.env.LD_PRELOAD"] = library
        try:
            load_scenario(designs.scenario, overrides)
        except ScenarioError as error:
            raise DesignFileError(f"design {name!r}: {error}") from None
        out.append(Design(name, str(table.get("description", "")), overrides, preload, skipped,
                          _base(designs, name, base)))
    return out
