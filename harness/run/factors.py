"""Factorial attribution: which knob of the change gives the effect (``[attribution]`` in a scenario). Pure.

Each factor is one knob of the routing decision (:data:`dsa_route.knobs.KNOBS`), or a server flag / environment /
calibration injection, at two levels (off = the baseline's value, on = the candidate's). The arms are a two-level
factorial design over the factors (:func:`design_rows`):

- ``k ≤ 3`` (or ``design = "full"`` with k = 4): the full 2^k design, every combination once per session block.
- ``k = 4`` (default ``design = "half"``): the 2^(4−1) fraction with generator D = ABC (defining relation I = ABCD),
  resolution IV: main effects are aliased only with three-factor interactions (A = BCD, …), two-factor interactions
  in pairs (AB = CD, AC = BD, AD = BC); :func:`aliases` names them. Source: Box, Hunter & Hunter, *Statistics for
  Experimenters*, 2nd ed. (2005), ch. 6 (fractional factorials, the 2^(4−1)_IV with I = ABCD); Montgomery, *Design
  and Analysis of Experiments*, §8.2 (the one-half fraction of the 2^k, generator D = ABC).
- ``k > 4`` is refused: 2^(5−1) = 16 arms per block is beyond what one machine's block holds here.

An arm is a :class:`~harness.run.arm_spec.ArmSpec` on the baseline route with the "on" factors' knobs moved
(:func:`generated_arms`), so its command comes from the one routing decision (``dsa_route.routing.decide(...,
knobs=...)``). Injected interactions (``[[attribution.interactions]]``, calibration only) add an extra injection to
the arms where all their factors are on. Step delays of one arm add up into one ``step-delay:<sum>``.

Errors are :class:`ValueError` with one line (the scenario loader names the file and key; exit code 2).
"""

from __future__ import annotations

import re
from typing import Literal, Sequence

from pydantic import Field, field_validator, model_validator

from dsa_route.inject import parse_injection
from dsa_route.knobs import KNOBS, check_knobs, knob_refusals
from harness.judge.factorial import LETTERS, MAX_FACTORS, aliases, arm_name, design_rows, effect_terms
from harness.run.arm_spec import ArmSpec
from harness.run.spec_base import Frozen

__all__ = ["FactorSpec", "InteractionSpec", "AttributionSpec", "MAX_FACTORS", "design_rows", "aliases",
           "arm_name", "generated_arms", "effect_terms", "LETTERS"]

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,23}$")


class FactorSpec(Frozen):
    """One factor: ``name`` (lower-case identifier) and what its "on" level changes — a routing ``knob`` (``low`` /
    ``high`` default to the baseline / candidate value), an ``inject`` (calibration), and/or server ``env`` and
    ``extra_args``. The "off" level is the baseline arm's."""

    name: str
    description: str = ""
    knob: str | None = None
    low: str | None = None
    high: str | None = None
    inject: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"factor name {value!r} is not a lower-case identifier (a-z, 0-9, _; ≤ 24 characters)")
        return value

    @field_validator("inject")
    @classmethod
    def _known_injection(cls, value: str | None) -> str | None:
        parsed = parse_injection(value)
        return None if parsed is None else parsed.spec

    @model_validator(mode="after")
    def _one_change(self) -> "FactorSpec":
        if self.knob is None and self.inject is None and not self.env and not self.extra_args:
            raise ValueError(f"factor {self.name} changes nothing: give it a knob ({', '.join(KNOBS)}), an inject, "
                             "env or extra_args")
        if self.knob is None and (self.low or self.high):
            raise ValueError(f"factor {self.name}: low/high are the two values of a knob; set knob too")
        if self.knob is not None:
            check_knobs({self.knob: self.low or ""}) if self.knob not in KNOBS else None
            check_knobs({self.knob: self.low_value()})
            check_knobs({self.knob: self.high_value()})
            if self.low_value() == self.high_value():
                raise ValueError(f"factor {self.name}: low and high are both {self.low_value()!r}")
        return self

    def low_value(self) -> str:
        """The knob's value at "off" (the baseline's unless ``low``)."""
        return self.low or KNOBS[self.knob][0]

    def high_value(self) -> str:
        """The knob's value at "on" (the candidate's unless ``high``)."""
        return self.high or KNOBS[self.knob][1]

    def describe(self, on: bool) -> str:
        """``"compilation_mode=NONE"``, ``"step-delay:8"``, … at that level (``"off"`` for an off non-knob factor)."""
        if self.knob is not None:
            return f"{self.knob}={self.high_value() if on else self.low_value()}"
        if not on:
            return "off"
        parts = [self.inject or "", *(f"{k}={v}" for k, v in self.env.items()), " ".join(self.extra_args)]
        return " ".join(p for p in parts if p)


class InteractionSpec(Frozen):
    """Calibration only: an extra injection in the arms where every one of ``factors`` is on (an interaction put
    there on purpose, to check the attribution finds it)."""

    factors: tuple[str, ...]
    inject: str

    @field_validator("inject")
    @classmethod
    def _known_injection(cls, value: str) -> str:
        parsed = parse_injection(value)
        if parsed is None:
            raise ValueError("an injected interaction needs inject = \"step-delay:<ms>\" (or another kind)")
        return parsed.spec


class AttributionSpec(Frozen):
    """``[attribution]``: the factors, the design, injected interactions, the metrics and α (None: the gate's)."""

    factors: tuple[FactorSpec, ...]
    design: Literal["auto", "full", "half"] = "auto"
    interactions: tuple[InteractionSpec, ...] = ()
    metrics: tuple[str, ...] = ("output_throughput", "server_mean_tpot_ms", "acceptance_length")
    alpha: float | None = None

    @model_validator(mode="after")
    def _valid_design(self) -> "AttributionSpec":
        names = [f.name for f in self.factors]
        k = len(names)
        if not 1 <= k <= MAX_FACTORS:
            raise ValueError(f"{k} factors: an attribution takes 1 to {MAX_FACTORS} (2^(4−1) = 8 arms per block at 4); "
                             "drop factors or attribute them in two runs")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"factor {twice[0]} is given twice; each factor once")
        knobs = [f.knob for f in self.factors if f.knob is not None]
        again = sorted({kn for kn in knobs if knobs.count(kn) > 1})
        if again:
            raise ValueError(f"knob {again[0]} is the knob of two factors; each knob is one factor")
        if self.design == "half" and k != 4:
            raise ValueError(f"design = \"half\" is the 2^(4−1) fraction (D = ABC) of 4 factors, not {k}; use \"full\"")
        for interaction in self.interactions:
            unknown = [n for n in interaction.factors if n not in names]
            if unknown or len(set(interaction.factors)) < 2:
                raise ValueError(f"injected interaction {list(interaction.factors)} needs two or more of the factors "
                                 f"{names}")
        for rows in [design_rows(k, self.resolved_design())]:
            for row in rows:
                knob_values = {f.knob: (f.high_value() if on else f.low_value())
                               for f, on in zip(self.factors, row) if f.knob is not None}
                refused = knob_refusals(knob_values, "any", has_triton=True)
                if refused:
                    raise ValueError(f"arm {arm_name(row)}: {refused[0]}")
        return self

    def resolved_design(self) -> str:
        """``"full"`` or ``"half"`` (``"auto"``: half at k = 4, else full)."""
        if self.design != "auto":
            return self.design
        return "half" if len(self.factors) == 4 else "full"


def _merge_injections(specs: list[str], name: str) -> str | None:
    """One arm's injections as one: step delays add up; any other kind must stand alone."""
    parsed = [parse_injection(s) for s in specs if s]
    if not parsed:
        return None
    if all(p.kind == "step-delay" for p in parsed):
        total = sum(p.params["ms"] for p in parsed)
        return parse_injection(f"step-delay:{total:g}").spec
    if len(parsed) > 1:
        raise ValueError(f"arm {name} would combine injections {[p.spec for p in parsed]}; only step-delay adds up "
                         "(one defect per arm)")
    return parsed[0].spec


def generated_arms(spec: AttributionSpec, baseline: ArmSpec) -> dict[str, tuple[tuple[int, ...], ArmSpec]]:
    """Arm name → (its 0/1 row, its :class:`ArmSpec`), in design order: ``baseline``'s route, env and flags, plus each
    factor's change at its level (knob values, injections, env, extra args) and the injected interactions.

    Raises:
        ValueError: an arm would combine two non-step-delay injections.
    """
    out = {}
    for row in design_rows(len(spec.factors), spec.resolved_design()):
        name = arm_name(row)
        knobs, env, extra, injects, said = {}, dict(baseline.env), list(baseline.extra_args), [baseline.inject], []
        for factor, on in zip(spec.factors, row):
            if factor.knob is not None:
                value = factor.high_value() if on else factor.low_value()
                if value != KNOBS[factor.knob][0] or factor.low:
                    knobs[factor.knob] = value
            if on:
                injects.append(factor.inject)
                env.update(factor.env)
                extra += list(factor.extra_args)
            said.append(f"{factor.name}: {factor.describe(bool(on))}")
        on_names = {f.name for f, on in zip(spec.factors, row) if on}
        for interaction in spec.interactions:
            if set(interaction.factors) <= on_names:
                injects.append(interaction.inject)
                said.append(f"injected interaction {'×'.join(interaction.factors)}: {interaction.inject}")
        arm = ArmSpec(route=baseline.route, description="; ".join(said), env=env, extra_args=tuple(extra),
                      vllm=baseline.vllm, knobs=knobs, inject=_merge_injections(injects, name))
        out[name] = (row, arm)
    return out
