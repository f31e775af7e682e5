"""The workload of a scenario (``[workload]`` and its ``[[workload.regimes]]``): which levels a run measures, how many
prompts each sends, how many session blocks and rounds, in which order, within which budget. Validated into frozen
pydantic models like the rest of the scenario (:mod:`harness.run.scenario` holds them in :class:`Scenario`); errors
are :class:`ValueError` with one line, which the scenario loader turns into ``ScenarioError`` naming the file and key.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from harness.run.spec_base import Frozen as _Frozen, one_of as _one_of
from harness.rundir.levels import PREFIX_DATASET
from harness.rundir.schema import DATASETS, Level, Regime

__all__ = ["LEVEL_TIMEOUT_HEADROOM", "RegimeSpec", "WorkloadSpec"]


LEVEL_TIMEOUT_HEADROOM = 2.0
"""A level sized by the duration floor is planned to take at most ``level_timeout_s / LEVEL_TIMEOUT_HEADROOM``, so it
survives running twice as slow as in its pilot (this VM's A/A rounds of one level differed by up to 1.5×: 439 vs
300 tok/s) before the timeout ends it."""


class RegimeSpec(_Frozen):
    """One more regime of the sweep (``[[workload.regimes]]``, issue #26): requests of ``input_len`` in and
    ``output_len`` out (tokens) from ``dataset`` at each of ``concurrency`` (None = the workload's own list), in the
    same run, session blocks and verdict as the workload's own regime. ``min_prompts`` and
    ``prompts_per_concurrency`` (None = the workload's) size its levels as the workload's do. ``data_dir`` (real
    text only; relative to the repository): the GSM8K-format folder its prompts are cut from (None:
    ``../shared/data/gsm8k``; :mod:`harness.run.text_prompts`). ``prefix_len`` and ``num_prefixes`` (prefix reuse,
    ``dataset = "prefix_repetition"`` only, and ``prefix_len`` required there): each of ``num_prefixes`` random
    prefixes of ``prefix_len`` tokens opens an equal share of the level's prompts, followed by ``input_len −
    prefix_len`` tokens of the prompt's own (vLLM's ``--prefix-repetition-*`` flags). vLLM's prefix cache hits whole
    KV blocks only (16 tokens on CUDA by default, 128 on vLLM CPU: ``vllm/platforms/cpu.py``), and with MTP / EAGLE it
    recomputes the last matched block (``v1/core/single_type_kv_cache_manager.py`` ``drop_eagle_block``): a prefix
    serves ``floor(prefix_len / block) − 1`` blocks from the cache with MTP on, one more without."""

    input_len: int = Field(gt=0)
    output_len: int = Field(gt=1)
    dataset: Annotated[str, AfterValidator(_one_of("workload.regimes.dataset", DATASETS))] = "random"
    concurrency: tuple[int, ...] | None = None
    min_prompts: int | None = Field(default=None, gt=0)
    prompts_per_concurrency: int | None = Field(default=None, gt=0)
    data_dir: str | None = None
    prefix_len: int | None = Field(default=None, gt=0)
    num_prefixes: int = Field(default=1, gt=0)

    @field_validator("concurrency")
    @classmethod
    def _positive_levels(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        return None if value is None else _concurrency_levels(value)

    @model_validator(mode="after")
    def _data_for_text(self) -> "RegimeSpec":
        if self.data_dir is not None and self.dataset == "random":
            raise ValueError("data_dir is for a real-text regime (dataset = \"gsm8k\"); the random dataset needs "
                             "none: drop it")
        return self

    @model_validator(mode="after")
    def _prefix_fits(self) -> "RegimeSpec":
        if self.dataset != PREFIX_DATASET:
            if self.prefix_len is not None or self.num_prefixes != 1:
                raise ValueError(f"prefix_len and num_prefixes are for a prefix-reuse regime: set dataset = "
                                 f"\"{PREFIX_DATASET}\" or drop them")
            return self
        if self.prefix_len is None or self.prefix_len >= self.input_len:
            raise ValueError(f"a {PREFIX_DATASET} regime needs prefix_len, the tokens its prompts share, between 1 "
                             f"and input_len − 1 = {self.input_len - 1} (got {self.prefix_len}), e.g. prefix_len = "
                             f"{self.input_len * 3 // 4}")
        return self


def _concurrency_levels(value: tuple[int, ...]) -> tuple[int, ...]:
    """A concurrency list sorted and without repeats.

    Raises:
        ValueError: an empty list or a level below 1.
    """
    if not value:
        raise ValueError("needs at least one concurrency level, e.g. [1, 2, 4]")
    bad = [level for level in value if level < 1]
    if bad:
        raise ValueError(f"concurrency levels must be ≥ 1, got {bad}")
    return tuple(sorted(set(value)))


class WorkloadSpec(_Frozen):
    """The load sweep: levels of vLLM's random dataset at fixed lengths, ``--ignore-eos``, temperature 0.

    A level (:class:`harness.rundir.schema.Level`) is a regime — ``dataset``, ``input_len``, ``output_len`` — at a
    concurrency: the workload's own regime at each of ``concurrency``, then each of ``regimes`` (more lengths in the
    same run, e.g. the long-context levels where DSA's indexer drops keys) at each of its concurrencies
    (:meth:`levels`). Prompts per level = ``max(min_prompts, prompts_per_concurrency × concurrency)``, with a regime's
    own counts where it sets them. ``repeats`` session blocks,
    each a fresh server session per arm where :meth:`Scenario.fresh_session_per_block` (else concurrent servers keep
    one session each), each block measuring ``rounds_per_session`` rounds over all levels: ``repeats ×
    rounds_per_session`` rounds in all. ``level_order = "shuffled"`` runs each
    round's levels in an order drawn from ``seed`` and the round (many short rounds in randomised order: Abedi &
    Brecht 2017, "Conducting repeatable experiments in highly variable cloud computing environments", ICPE).
    ``block_order``: which arm each sequential session block starts with — "random" (a seeded coin per block,
    :func:`harness.judge.planning.baseline_first`: valid whatever the host's load did) or "abba" (alternating).
    ``min_level_s`` (seconds, 0 = off): a floor on each level's measured duration — a pilot before the first
    measured level sets the prompt count per concurrency, the same for both arms and every round
    (:mod:`harness.run.pilot`); a longer window averages out per-request noise.
    ``budget_s`` (seconds, None = none): the run's wall-clock budget for its measurements when ``--budget`` is not
    given — no session block starts that would end past it (:class:`harness.run.stopping.BlockBudget`).
    """

    concurrency: tuple[int, ...]
    input_len: int = Field(gt=0)
    output_len: int = Field(gt=1)
    dataset: Annotated[str, AfterValidator(_one_of("workload.dataset", DATASETS))] = "random"
    regimes: tuple[RegimeSpec, ...] = ()
    prompts_per_concurrency: int = Field(default=8, gt=0)
    min_prompts: int = Field(default=16, gt=0)
    warmups: int = Field(default=2, ge=0)
    seed: int = 0
    repeats: int = Field(default=1, ge=1)
    rounds_per_session: int = Field(default=1, ge=1)
    level_order: Literal["sorted", "shuffled"] = "sorted"
    block_order: Literal["random", "abba"] = "random"
    level_timeout_s: float = Field(default=1800.0, gt=0)
    min_level_s: float = 0.0
    budget_s: float | None = Field(default=None, gt=0)

    @field_validator("min_level_s")
    @classmethod
    def _floor_not_negative(cls, value: float) -> float:
        if not value >= 0:
            raise ValueError(f"must be ≥ 0 seconds (0 = off, e.g. 10 for at least 10 s of measured load per level), "
                             f"got {value}")
        return value

    @model_validator(mode="after")
    def _floor_fits_timeout(self) -> "WorkloadSpec":
        if self.min_level_s * LEVEL_TIMEOUT_HEADROOM > self.level_timeout_s:
            raise ValueError(f"min_level_s = {self.min_level_s:g} s leaves less than {LEVEL_TIMEOUT_HEADROOM:g}× "
                             f"headroom under level_timeout_s = {self.level_timeout_s:g} s; raise "
                             f"workload.level_timeout_s to ≥ {self.min_level_s * LEVEL_TIMEOUT_HEADROOM:g} or lower "
                             f"min_level_s")
        return self

    @field_validator("concurrency")
    @classmethod
    def _positive_levels(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return _concurrency_levels(value)

    @model_validator(mode="after")
    def _regimes_differ(self) -> "WorkloadSpec":
        regimes = [Regime(self.dataset, self.input_len, self.output_len)] + [
            Regime(r.dataset, r.input_len, r.output_len) for r in self.regimes]
        twice = sorted({str(r) for r in regimes if regimes.count(r) > 1})
        if twice:
            raise ValueError(f"regime {twice[0]} is given twice (the workload's own lengths or a repeated "
                             f"[[workload.regimes]] entry); merge their concurrency lists into one")
        return self

    @model_validator(mode="after")
    def _own_regime_plain(self) -> "WorkloadSpec":
        if self.dataset == PREFIX_DATASET:
            raise ValueError(f"workload.dataset = \"{PREFIX_DATASET}\" needs a prefix_len: declare the prefix-reuse "
                             f"levels as a [[workload.regimes]] entry with dataset = \"{PREFIX_DATASET}\" and "
                             f"prefix_len")
        return self

    def levels(self) -> tuple[Level, ...]:
        """Every level of the sweep: the workload's regime at each of its concurrencies, then each regime's."""
        own = Regime(self.dataset, self.input_len, self.output_len)
        return tuple([own.at(c) for c in self.concurrency] + [
            Regime(r.dataset, r.input_len, r.output_len).at(c)
            for r in self.regimes for c in (r.concurrency or self.concurrency)])

    def regime_spec(self, level: Level) -> RegimeSpec | None:
        """The ``[[workload.regimes]]`` entry ``level`` belongs to; None for the workload's own regime."""
        return next((r for r in self.regimes if Regime(r.dataset, r.input_len, r.output_len) == level.regime), None)

    def prompt_rule(self, regime: Regime) -> tuple[int, int]:
        """``(min_prompts, prompts_per_concurrency)`` of ``regime``'s levels: its own where it sets them."""
        spec = self.regime_spec(regime.at(1))
        least = spec.min_prompts if spec is not None and spec.min_prompts is not None else self.min_prompts
        per = (spec.prompts_per_concurrency if spec is not None and spec.prompts_per_concurrency is not None
               else self.prompts_per_concurrency)
        return least, per

    def num_prompts(self, level: Level) -> int:
        """Requests sent at ``level`` (warmups excluded): ``max(min_prompts, prompts_per_concurrency × c)``, in whole
        prefix groups (:meth:`whole_prefix_groups`)."""
        least, per = self.prompt_rule(level.regime)
        return self.whole_prefix_groups(level, max(least, per * level.concurrency))

    def whole_prefix_groups(self, level: Level, count: int) -> int:
        """``count`` rounded up to a multiple of the level's ``num_prefixes`` for a prefix-reuse level (vLLM sends
        ``num_prefixes × (num_prompts // num_prefixes)`` of them: ``PrefixRepetitionRandomDataset.sample``), so
        every prefix opens as many prompts and the level sends exactly ``count``; ``count`` itself otherwise."""
        spec = self.regime_spec(level)
        groups = spec.num_prefixes if spec is not None and spec.dataset == PREFIX_DATASET else 1
        return -(-count // groups) * groups

    def longest_request(self) -> int:
        """The most tokens one request of the sweep needs (input + output), over every regime."""
        return max(level.input_len + level.output_len for level in self.levels())
