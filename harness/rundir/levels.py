"""The level key (issue #26): a level is a :class:`Regime` — dataset, input and output length — at a concurrency
(:class:`Level`), measured once per round (:class:`LevelKey`). The only place their text forms are built or parsed.
Pure; re-exported by :mod:`harness.rundir.schema`."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["DATASETS", "DATASETS_DIR", "Level", "LevelKey", "PREFIX_DATASET", "Regime", "TEXT_DATASETS", "dataset_path",
           "level_regimes", "table_regime", "workload_levels"]


PREFIX_DATASET = "prefix_repetition"
DATASETS = ("random", "gsm8k", PREFIX_DATASET)
"""The load datasets a level may use: ``random`` = ``vllm bench serve --dataset-name random`` (token ids drawn
uniformly, ``--ignore-eos``: every request is exactly ``input_len`` in / ``output_len`` out); ``gsm8k`` = real text,
GSM8K's problems cut to ``input_len`` tokens, sent through ``--dataset-name custom``
(:mod:`harness.run.text_prompts`); ``prefix_repetition`` = vLLM's prefix-reuse dataset (random ids; each of the
regime's ``num_prefixes`` prefixes of ``prefix_len`` tokens is shared by an equal share of the level's prompts, each
prompt ``input_len`` tokens in all: ``vllm/benchmarks/datasets/datasets.py`` ``PrefixRepetitionRandomDataset``), where
each arm's prefix-cache hit rate is read from its ``/metrics`` (:mod:`harness.run.server_metrics`)."""


TEXT_DATASETS = ("gsm8k",)
"""The level datasets that are real text, written into the run directory (:func:`dataset_path`); the rest are
vLLM's own (``random``)."""
DATASETS_DIR = "datasets"


def dataset_path(run_dir: Path, regime: Regime) -> Path:
    """Where the prompts of a real-text ``regime`` live in a run directory: ``<run_dir>/datasets/<regime>.jsonl``."""
    return run_dir / DATASETS_DIR / f"{regime}.jsonl"


class Regime(NamedTuple):
    """What each request of a level is: ``dataset`` (one of :data:`DATASETS`), ``input_len`` and ``output_len``
    (tokens). ``str(regime)`` is its id ``<dataset>-i<input_len>-o<output_len>``. The gate pools a metric's levels
    within one regime, never across two (:mod:`harness.judge.verdict`)."""

    dataset: str
    input_len: int
    output_len: int

    def __str__(self) -> str:
        return f"{self.dataset}-i{self.input_len}-o{self.output_len}"

    def label(self) -> str:
        """``"1024→512 random"``: input → output tokens and the dataset, for tables and plots."""
        return f"{self.input_len}→{self.output_len} {self.dataset}"

    def at(self, concurrency: int) -> Level:
        """This regime's level at ``concurrency``."""
        return Level(self.dataset, self.input_len, self.output_len, concurrency)

    @staticmethod
    def parse(text: Any) -> Regime | None:
        """``"random-i64-o32"`` → ``Regime("random", 64, 32)``; None for any other text."""
        level = Level.parse(f"{text}-c1")
        return level.regime if level is not None else None


class Level(NamedTuple):
    """One point of the load grid (issue #26): a :class:`Regime` at ``concurrency`` (closed-loop clients).
    ``str(level)`` is its id ``<regime>-c<concurrency>``, the ``level`` column of ``levels.csv``/``requests.csv``;
    :meth:`parse` reads one back. The fields run regime first, so sorting groups each regime's levels by
    concurrency."""

    dataset: str
    input_len: int
    output_len: int
    concurrency: int

    def __str__(self) -> str:
        return f"{self.regime}-c{self.concurrency}"

    @property
    def regime(self) -> Regime:
        return Regime(self.dataset, self.input_len, self.output_len)

    def label(self, *, regime: bool = True) -> str:
        """``"c=4 · 1024→512 random"``, or ``"c=4"`` with ``regime=False`` (a run of one regime)."""
        return f"c={self.concurrency} · {self.regime.label()}" if regime else f"c={self.concurrency}"

    @staticmethod
    def parse(text: Any) -> Level | None:
        """``"random-i64-o32-c4"`` → ``Level("random", 64, 32, 4)``; None for any other text."""
        match = _LEVEL.match(str(text))
        return Level(match.group(1), *map(int, match.group(2, 3, 4))) if match else None


class LevelKey(NamedTuple):
    """One measured level of one round: ``str(key)`` is its manifest key ``<level>-r<round>``; :meth:`parse` reads
    one back (the only place the format is built or parsed; schema 2's ``c<concurrency>-r<round>`` is mapped by
    :func:`harness.rundir.v2.upgrade_v2`)."""

    level: Level
    round: int

    @property
    def concurrency(self) -> int:
        return self.level.concurrency

    def __str__(self) -> str:
        return f"{self.level}-r{self.round}"

    def raw_name(self, arm: str) -> str:
        """The level's ``raw/`` file name for ``arm``."""
        return f"{arm}-{self}.json"

    @staticmethod
    def parse(text: Any) -> LevelKey | None:
        """``"random-i64-o32-c4-r1"`` → ``LevelKey(Level("random", 64, 32, 4), 1)``; None for any other text."""
        head, _, round_ = str(text).rpartition("-r")
        level = Level.parse(head)
        return LevelKey(level, int(round_)) if level is not None and round_.isdigit() else None


_LEVEL = re.compile(r"^([a-z][a-z0-9_]*)-i(\d+)-o(\d+)-c(\d+)$")


def level_regimes(levels: Any) -> list[Regime]:
    """The distinct regimes of ``levels`` (:class:`Level` values), in sorted order."""
    return sorted({level.regime for level in levels})


def workload_levels(workload: Any) -> set[Level]:
    """The levels a resolved scenario's ``workload`` table (JSON data, as ``manifest.json`` holds it) plans: its own
    regime at each of ``concurrency``, and each ``regimes`` entry's at its concurrencies (the workload's where it has
    none). Whatever is not a positive whole number (a hand-edited or foreign manifest) is left out, never guessed."""
    if not isinstance(workload, dict):
        return set()
    own = table_regime(workload)
    own_levels = _whole_numbers(workload.get("concurrency"))
    found = {own.at(c) for c in own_levels} if own is not None else set()
    for entry in workload.get("regimes") or () if isinstance(workload.get("regimes"), list) else ():
        regime = table_regime(entry)
        if regime is not None:
            levels = _whole_numbers(entry.get("concurrency")) if entry.get("concurrency") is not None else own_levels
            found |= {regime.at(c) for c in levels}
    return found


def _whole_numbers(value: Any) -> list[int]:
    items = value if isinstance(value, list) else []
    return [int(v) for v in items if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 1 and v == int(v)]


def table_regime(table: Any) -> Regime | None:
    """The regime a scenario table (``workload``, or one ``regimes`` entry, as JSON data) states: its ``dataset``
    (default ``random``) and both lengths as positive whole numbers; None where it does not."""
    if not isinstance(table, dict):
        return None
    lengths = _whole_numbers([table.get("input_len"), table.get("output_len")])
    dataset = table.get("dataset", "random")
    if len(lengths) != 2 or dataset not in DATASETS:
        return None
    return Regime(dataset, *lengths)
