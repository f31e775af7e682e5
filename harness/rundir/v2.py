"""Reading schema version 2 (dsa-bench before a level was a regime at a concurrency, issue #26): levels keyed by
concurrency alone — manifest keys ``c<concurrency>-r<round>``, ``schedule`` entries ``(arm, concurrency, round)``,
CSVs without a ``level`` column. Every such run measured one regime, the scenario's ``workload`` (vLLM's random
dataset at ``input_len`` / ``output_len``), so each level maps to that regime at its concurrency.
:class:`harness.rundir.store.RunDir` applies these on read."""

from __future__ import annotations

import re
from typing import Any, Mapping

from harness.metrics import finite_float
from harness.rundir.levels import LevelKey, Regime, table_regime

_V2_KEY = re.compile(r"^c(\d+)-r(\d+)$")


def v2_regime(scenario: Mapping[str, Any]) -> Regime:
    """The one regime of a schema-2 run: ``("random", workload.input_len, workload.output_len)``; where the scenario
    does not state both lengths as positive whole numbers, ``("random", 0, 0)`` (shown as such, never guessed)."""
    return table_regime(scenario.get("workload")) or Regime("random", 0, 0)


def v2_level_key(text: Any, regime: Regime) -> LevelKey | None:
    """``"c4-r1"`` → ``LevelKey(regime.at(4), 1)``; None for any other text."""
    match = _V2_KEY.match(str(text))
    return LevelKey(regime.at(int(match.group(1))), int(match.group(2))) if match else None


def upgrade_v2(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version-2 ``manifest.json`` as version-3 data: level keys, schedule entries and pilot levels on the
    scenario's regime.
    Keys that do not parse, and arms or entries that are not what the schema expects, are left as they are (the
    schema then names what is wrong)."""
    scenario = data.get("scenario") if isinstance(data.get("scenario"), Mapping) else {}
    regime = v2_regime(scenario)
    arms = data.get("arms")
    if isinstance(arms, list):
        arms = [_upgrade_arm(arm, regime) for arm in arms]
    schedule = data.get("schedule")
    if isinstance(schedule, list):
        schedule = [_upgrade_step(step, regime) for step in schedule]
    pilot = data.get("pilot")
    if isinstance(pilot, Mapping) and isinstance(pilot.get("levels"), list):
        pilot = {**pilot, "levels": [_upgrade_pilot_level(level, regime) for level in pilot["levels"]]}
    return {**data, "schema_version": 3, **({"arms": arms} if arms is not None else {}),
            **({"schedule": schedule} if schedule is not None else {}), **({"pilot": pilot} if pilot else {})}


def _upgrade_pilot_level(level: Any, regime: Regime) -> Any:
    concurrency = finite_float(level.get("concurrency")) if isinstance(level, Mapping) else None
    if concurrency is None or concurrency != int(concurrency) or "level" in level:
        return level
    return {**level, "level": str(regime.at(int(concurrency)))}


def _upgrade_arm(arm: Any, regime: Regime) -> Any:
    if not isinstance(arm, Mapping) or not isinstance(arm.get("levels"), Mapping):
        return arm
    levels = {}
    for key, record in arm["levels"].items():
        parsed = v2_level_key(key, regime)
        levels[str(parsed) if parsed is not None else key] = record
    return {**arm, "levels": levels}


def _upgrade_step(step: Any, regime: Regime) -> Any:
    if isinstance(step, (list, tuple)) and len(step) == 3 and finite_float(step[1]) is not None:
        concurrency = finite_float(step[1])
        if concurrency == int(concurrency):
            return [step[0], str(regime.at(int(concurrency))), step[2]]
    return step


def with_level_column(frame, scenario: Mapping[str, Any]):
    """``frame`` (a ``levels.csv``/``requests.csv`` frame) with a ``level`` column: itself when it has one with
    values (or no rows), else a copy mapped as schema 2 is (:func:`upgrade_v2_frame`) — for callers of the pure judge
    that build their frames in the schema-2 layout (one regime)."""
    if not len(frame) or ("level" in frame.columns and frame["level"].notna().any()):
        return frame
    return upgrade_v2_frame(frame.drop(columns=["level"], errors="ignore"), scenario)


def upgrade_v2_frame(frame, scenario: Mapping[str, Any]):
    """A version-2 ``levels.csv``/``requests.csv`` frame with the ``level`` column added (the scenario's regime at
    each row's concurrency; empty where the concurrency is not a whole number, which the reader then refuses)."""
    if "level" in frame.columns or "concurrency" not in frame.columns:
        return frame
    regime = v2_regime(scenario)
    values = [finite_float(c) for c in frame["concurrency"]]
    frame.insert(min(3, len(frame.columns)), "level",
                 [str(regime.at(int(c))) if c is not None and c == int(c) else None for c in values])
    return frame

