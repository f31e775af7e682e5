"""Reading schema version 1 (dsa-bench before the typed run directory): arms as a map keyed by name, ``repeat``
instead of ``round``, no sessions. :class:`harness.rundir.store.RunDir` applies these on read."""

from __future__ import annotations

from typing import Any, Mapping

from harness.metrics import finite_float
from harness.rundir.v2 import v2_level_key, v2_regime


def _v1_session(scenario: Mapping[str, Any], round_: int) -> int:
    """The server session a version-1 level ran in: concurrent servers stay up for the run (session 0), sequential
    servers restart per ABBA block, one block per round."""
    serve = scenario.get("serve") if isinstance(scenario.get("serve"), Mapping) else {}
    return 0 if serve.get("concurrent_servers", False) else int(round_)


def upgrade_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version-1 ``manifest.json`` (arms as a map keyed by name, no sessions) as version-2 data."""
    scenario = data.get("scenario") if isinstance(data.get("scenario"), Mapping) else {}
    if not isinstance(data.get("arms"), Mapping):          # left as it is: the schema names what is wrong
        return {**data, "schema_version": 2}
    arms: list[Any] = []
    for name, arm in data["arms"].items():
        if not isinstance(arm, Mapping) or not isinstance(arm.get("levels", {}), Mapping):
            arms.append(arm)
            continue
        levels = {}
        for key, level in (arm.get("levels") or {}).items():
            parsed = v2_level_key(key, v2_regime(scenario))   # version 1 keys levels as version 2 does
            level = dict(level) if isinstance(level, Mapping) else {"status": str(level)}
            if parsed is not None and level.get("status") == "done":
                level.setdefault("session", _v1_session(scenario, parsed.round))
            levels[key] = level
        sessions = sorted({level["session"] for level in levels.values() if level.get("session") is not None})
        arms.append({**arm, "name": name, "levels": levels,
                     "sessions": [{"index": index, "base_url": arm.get("base_url")} for index in sessions]})
    return {**data, "schema_version": 2, "arms": arms}


def upgrade_v1_frame(frame, scenario: Mapping[str, Any]):
    """A version-1 ``levels.csv``/``requests.csv`` frame with ``repeat`` renamed ``round`` and ``session`` added."""
    if "repeat" in frame.columns and "round" not in frame.columns:
        frame = frame.rename(columns={"repeat": "round"})
    if "session" not in frame.columns and "round" in frame.columns:
        frame["session"] = [None if finite_float(r) is None else _v1_session(scenario, int(float(r)))
                            for r in frame["round"]]
    return frame
