"""One arm of a scenario (``[arms.X]``, or an attribution's generated arm): its route, per-knob overrides,
arm-only flags, environment, vLLM build and calibration injection."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from dsa_route.inject import Injection, parse_injection
from dsa_route.knobs import check_knobs
from harness.run.spec_base import Frozen as _Frozen

__all__ = ["ArmSpec"]


class ArmSpec(_Frozen):
    """One side of the comparison: which routing path it pins, plus arm-only extra args and env."""

    route: Literal["baseline", "candidate", "auto"]   # auto: what the installed vLLM itself does
    description: str = ""
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    vllm: str | None = None   # this arm's vLLM build: a virtualenv's bin/vllm or bin/python (None: this environment's)
    inject: str | None = None  # a calibration injection (dsa_route.inject: topk-random, indexer-rope-flip, step-delay:<ms>)
    knobs: dict[str, str] = Field(default_factory=dict)   # per-knob overrides of the route (dsa_route.knobs)
    packages_differ: bool = False   # this arm's installed packages are meant to differ from the other arm's (e.g.
    # its env sets PYTHONPATH to another kernel package); an arm with its own `vllm` declares that already

    @field_validator("inject")
    @classmethod
    def _known_injection(cls, value: str | None) -> str | None:
        parsed = parse_injection(value)  # ValueError names the allowed values
        return None if parsed is None else parsed.spec

    def injection(self) -> Injection | None:
        """The parsed :attr:`inject` (None when off)."""
        return parse_injection(self.inject)

    @field_validator("knobs")
    @classmethod
    def _known_knobs(cls, value: dict[str, str]) -> dict[str, str]:
        return check_knobs(value)   # KnobError (a ValueError) names the allowed knobs and values

    @field_validator("vllm")
    @classmethod
    def _expand(cls, value: str | None) -> str | None:
        return None if value is None else str(Path(value).expanduser())
