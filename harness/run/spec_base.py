"""The base of every scenario table's model: frozen pydantic models that refuse unknown keys, and a validator for
fixed vocabularies (:mod:`harness.run.scenario`, :mod:`harness.run.cluster_spec`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Frozen", "one_of"]


class Frozen(BaseModel):
    """A scenario table: immutable once validated, and an unknown key is an error (a typo never passes silently)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def one_of(key: str, allowed: tuple[str, ...]):
    """A pydantic after-validator accepting only ``allowed`` values, naming them in the error."""
    def check(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"unknown {key} {value!r}; use one of {', '.join(allowed)}")
        return value
    return check
