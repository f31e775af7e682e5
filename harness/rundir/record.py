"""The base of every run-directory record (:mod:`harness.rundir.schema`, :mod:`harness.rundir.cluster`)."""

from pydantic import BaseModel, ConfigDict

__all__ = ["Record"]


class Record(BaseModel):
    """Frozen, and tolerant of keys a newer writer added (they are dropped on read)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
