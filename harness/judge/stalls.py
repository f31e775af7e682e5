"""Stalled rounds and the within-session location of rounds (the ``[gate] estimator`` rule, fixed before the data).

A *round* is one ``levels.csv`` row (arm, level, round). It is flagged as stalled (:func:`find_stalls`) when

- its host CPU steal share (``host_steal_fraction``, stolen / all ``/proc/stat`` ticks over the level) exceeds the
  policy's ``max_steal_fraction``, or
- its log output throughput is far outside the robust spread of the rounds of the same arm and level in the run:
  the modified z-score ``M = 0.6745 (x − median(x)) / MAD(x)`` (``x`` the log throughputs of those rounds, MAD the
  median absolute deviation; 0.6745 = Φ⁻¹(0.75) makes MAD estimate σ under normality) exceeds
  :data:`MODIFIED_Z_LIMIT` = 3.5 in absolute value (Iglewicz & Hoaglin 1993, *How to Detect and Handle Outliers*,
  ASQC Basic References in Quality Control 16, §3.2: "modified Z-scores with an absolute value of greater than 3.5 be
  labeled as potential outliers"). Only with at least :data:`MIN_ROUNDS_FOR_Z` rounds (a MAD of fewer is no spread
  estimate), a MAD above zero (copied values), and sessions of several rounds: with one round per session the
  rounds of an arm are its sessions, whose offsets are the noise the paired test accounts for, not stalls (flagging
  them would drop whole session pairs; the rule's error rates were measured on 4-round sessions only).

A flagged round is *excluded* only on exogenous evidence (:func:`find_stalls`): steal above the limit, a host-load
outlier, or the paired arm's round of the same block also slow. Its own slowness alone never excludes it: a stall
the candidate causes is part of what it costs, and the estimand is the ratio of the arms' mean figures.

What happens to an excludable round is the estimator's (:data:`ESTIMATORS`), chosen in advance in the policy; the
judge never re-runs a round (the run is over when it judges; a re-run is the runner's business):

- ``"mean"``: every valid round, equal weight — the session's figure is the mean of its rounds' figures (a request
  metric pools its rounds' requests). Flagged rounds are reported and kept; a round above the steal limit makes its
  level INVALID (:mod:`harness.judge.validity`).
- ``"exclude-stalls"`` (the default): the same mean over the session's rounds that are not excluded; a round above the
  steal limit is excluded instead of invalidating its level.
- ``"median"``: the median round(s) of the session's rounds left, ranked by the metric's round figure (the middle one,
  or the middle two averaged / their requests pooled): a breakdown point of 50 % within the session — it estimates
  a typical round, not the mean, so it hides a candidate's intermittent stalls (on simulated candidate stalls, 25 % of
  rounds × 0.65: PASS 69 %, issue #24); kept as an option and a diagnostic, not the default.

The verdict lists every flagged round, why, and whether it was excluded. The error rates of each estimator are
measured by :mod:`harness.study.session_simulation` on recorded sessions.

Pure: frames in, records out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from harness.rundir.schema import Level

__all__ = ["ESTIMATORS", "Estimator", "MODIFIED_Z_LIMIT", "MIN_ROUNDS_FOR_Z", "Stall", "modified_z", "find_stalls",
           "excludes", "location_rounds", "describe"]

Estimator = Literal["mean", "exclude-stalls", "median"]
ESTIMATORS: tuple[str, ...] = ("mean", "exclude-stalls", "median")
MODIFIED_Z_LIMIT = 3.5
"""Iglewicz & Hoaglin (1993) §3.2's cut-off for the modified z-score."""
MIN_ROUNDS_FOR_Z = 5
"""Fewest rounds of one arm and level whose MAD is taken as their spread (with 4 or fewer, two equal rounds give a MAD
near zero and any third round reads as an outlier)."""
STALL_COLUMN = "output_throughput"
MAX_SHOWN = 8
"""Flagged rounds named in the verdict's note (all of them are in ``verdict.json``)."""


@dataclass(frozen=True)
class Stall:
    """One flagged round: ``arm``, ``level``, ``round`` (levels.csv keys), ``session`` (None if not recorded),
    ``reason`` (one line), ``excluded`` (whether the policy's estimator left it out of the cells)."""

    arm: str
    level: Level
    round: int
    session: int | None
    reason: str
    excluded: bool

    @property
    def key(self) -> tuple[str, Level, int]:
        return self.arm, self.level, self.round

    def to_dict(self) -> dict:
        return {"arm": self.arm, "level": str(self.level), "concurrency": self.level.concurrency,
                "round": self.round, "session": self.session, "reason": self.reason, "excluded": self.excluded}


def excludes(estimator: str) -> bool:
    """Whether ``estimator`` leaves flagged rounds out (every estimator but ``"mean"``)."""
    return estimator != "mean"


def modified_z(values: np.ndarray) -> np.ndarray:
    """``0.6745 (x − median) / MAD`` per value ``(n,)``; zeros when the MAD is 0 (no spread to judge by)."""
    x = np.asarray(values, dtype=float)
    median = np.median(x)
    mad = np.median(np.abs(x - median))
    if not mad > 0:
        return np.zeros_like(x)
    return 0.6745 * (x - median) / mad


def find_stalls(levels, *, max_steal_fraction: float, estimator: str,
                rounds: dict[tuple[str, Level], set[int]] | None = None) -> list[Stall]:
    """The flagged rounds of ``levels`` (a levels.csv frame), in (arm, level, round) order.

    A flagged round is excluded (under an estimator that excludes) only on *exogenous* evidence — something other
    than its own slowness says the host, not the arm, caused it (:func:`_exogenous`); a round flagged by its
    modified z-score alone is reported and kept, so a candidate whose own rounds stall (a graph recapture, a compile
    on the hot path) carries them into its mean (issue #24: the arm's own-rounds rule removed exactly those rounds and
    PASSed a candidate 8.8 % slower in 69 % of runs).

    ``rounds``: ``{(arm, level): {round}}`` — only these rounds are judged and form the spread (the gate passes
    the rounds that passed validity); None: every row."""
    if not len(levels):
        return []
    rows = levels.drop_duplicates(["arm", "level", "round"], keep="last")
    rows = rows[[Level.parse(v) is not None for v in rows["level"]]]
    if rounds is not None:
        keep = [rounds.get((str(a), Level.parse(v)), set()) for a, v in zip(rows["arm"], rows["level"])]
        rows = rows[[int(r) in k for r, k in zip(rows["round"], keep)]]
    rows = rows.assign(_slot=_slots(rows))
    z_of: dict[tuple[str, Level, int], float] = {}
    steal_reason: dict[tuple[str, Level, int], str] = {}
    for (arm, level), frame in rows.groupby(["arm", "level"], sort=True):
        arm, level = str(arm), Level.parse(level)
        if "host_steal_fraction" in frame.columns:
            for r, share in zip(frame["round"], frame["host_steal_fraction"].astype(float)):
                if math.isfinite(share) and share > max_steal_fraction:
                    steal_reason[(arm, level, int(r))] = (f"host CPU steal time was {100 * share:.1f} % "
                                                          f"(> {100 * max_steal_fraction:g} %)")
        if STALL_COLUMN in frame.columns:
            value = frame[STALL_COLUMN].astype(float)
            ok = np.isfinite(value) & (value > 0)
            if ok.sum() >= MIN_ROUNDS_FOR_Z and _several_rounds_per_session(frame):
                z = modified_z(np.log(value[ok].to_numpy()))
                z_of.update({(arm, level, int(r)): float(score) for r, score in zip(frame.loc[ok, "round"], z)})
    loaded = _load_outliers(rows)
    slot_of = {(str(a), Level.parse(v), int(r)): slot for a, v, r, slot in
               zip(rows["arm"], rows["level"], rows["round"], rows["_slot"])}
    by_slot = {(a, c, slot): r for (a, c, r), slot in slot_of.items()}
    arms = sorted(set(rows["arm"].astype(str)))
    sessions = {(str(a), Level.parse(v), int(r)): s for a, v, r, s in
                zip(rows["arm"], rows["level"], rows["round"], rows["session"])} if "session" in rows else {}
    out = []
    for key in sorted(set(steal_reason) | {k for k, z in z_of.items() if abs(z) > MODIFIED_Z_LIMIT}):
        arm, level, r = key
        reasons = [steal_reason[key]] if key in steal_reason else []
        if abs(z_of.get(key, 0.0)) > MODIFIED_Z_LIMIT:
            reasons.append(f"log {STALL_COLUMN} modified z-score {z_of[key]:+.1f} (|z| > {MODIFIED_Z_LIMIT:g} over "
                           f"the arm's rounds at {level.label()})")
        evidence = _exogenous(key, steal_reason, loaded, z_of, slot_of, by_slot, arms)
        if evidence and key not in steal_reason:
            reasons.append(evidence)
        elif not evidence:
            reasons.append("no exogenous evidence (steal, host load, the paired arm's same round): kept")
        session = sessions.get(key)
        session = None if session is None or not math.isfinite(float(session)) else int(session)
        out.append(Stall(arm, level, r, session, "; ".join(reasons), excludes(estimator) and bool(evidence)))
    return out


def _slots(rows) -> list[tuple[int, int]]:
    """Each row's place in its arm's run: ``(session, position of the round within the session)`` — the same slot of
    the other arm is the round it is paired with (session ``j`` of both arms form block ``j``); ``(round, 0)`` when
    sessions are not recorded (version-1 rows: round ``r`` of both arms form a block)."""
    if "session" not in rows.columns or rows["session"].isna().all():
        return [(int(r), 0) for r in rows["round"]]
    rank = rows.groupby(["arm", "level", "session"])["round"].rank(method="first").astype(int) - 1
    return [(int(s), int(k)) for s, k in zip(rows["session"], rank)]


def _load_outliers(rows) -> dict[tuple[str, Level, int], str]:
    """Rounds whose 1-minute host load average (``load_avg_1m``) is a high outlier (modified z > the limit) among the
    rounds of both arms at the level: another job's load, since the benchmark's own is the same for every round of a
    level (Iglewicz & Hoaglin's rule, as for throughput)."""
    out = {}
    if "load_avg_1m" not in rows.columns:
        return out
    for text, frame in rows.groupby("level"):
        level = Level.parse(text)
        load = frame["load_avg_1m"].astype(float)
        ok = np.isfinite(load)
        if ok.sum() < MIN_ROUNDS_FOR_Z:
            continue
        z = modified_z(load[ok].to_numpy())
        for a, r, score, value in zip(frame.loc[ok, "arm"], frame.loc[ok, "round"], z, load[ok]):
            if score > MODIFIED_Z_LIMIT:
                out[(str(a), level, int(r))] = (f"host load average {value:.1f} (modified z {score:+.1f} over "
                                                f"both arms' rounds at {level.label()})")
    return out


def _exogenous(key, steal_reason, loaded, z_of, slot_of, by_slot, arms) -> str:
    """Why a flagged round may be excluded, or "" when nothing but its own slowness flags it: steal above the limit,
    a host-load outlier, or the paired arm's round in the same slot also slow beyond the limit (a host-wide stall
    that hit the block, not the arm)."""
    if key in steal_reason:
        return steal_reason[key]
    if key in loaded:
        return loaded[key]
    arm, level, _ = key
    for other in arms:
        if other == arm:
            continue
        paired = by_slot.get((other, level, slot_of[key]))
        z = z_of.get((other, level, paired)) if paired is not None else None
        if z is not None and z_of[key] < 0 and z < -MODIFIED_Z_LIMIT:
            return f"the paired {other} round r{paired} of the same block is slow too (z {z:+.1f})"
    return ""


def _several_rounds_per_session(frame) -> bool:
    """Whether some session of ``frame`` (one arm and level) holds more than one round (True when sessions are not
    recorded: version-1 rows, every round its own unit)."""
    if "session" not in frame.columns or frame["session"].isna().all():
        return True
    return bool(frame.groupby("session")["round"].nunique().max() > 1)


def location_rounds(figures: Sequence[float], estimator: str) -> list[int]:
    """Indices of the rounds of one session (``figures[i]``: round ``i``'s figure of the metric, flagged rounds
    already removed) that make its location: all of them, or for ``"median"`` the middle one (odd count) or two."""
    if estimator != "median" or len(figures) <= 2:
        return list(range(len(figures)))
    order = np.argsort(np.asarray(figures, dtype=float), kind="stable")
    mid = len(order) // 2
    return sorted(int(i) for i in (order[mid - 1: mid + 1] if len(order) % 2 == 0 else order[mid: mid + 1]))


def describe(stalls: Sequence[Stall], estimator: str) -> str | None:
    """One note for the verdict: every flagged round and why, and what the estimator did with them; None if none."""
    if not stalls:
        return None
    dropped = sum(s.excluded for s in stalls)
    fate = (f"{dropped} excluded from the cells on exogenous evidence, {len(stalls) - dropped} kept"
            if excludes(estimator)
            else "kept (estimator = \"mean\" weighs every valid round; steal above the limit makes the level INVALID)")
    shown = [f"{s.arm} {s.level.label()} r{s.round}" + ("" if s.session is None else f" (session {s.session})")
             + f": {s.reason}" for s in stalls[:MAX_SHOWN]]
    more = f"; … and {len(stalls) - MAX_SHOWN} more (verdict.json: stalls)" if len(stalls) > MAX_SHOWN else ""
    return (f"{len(stalls)} stalled round(s) flagged (steal above the limit, or a modified z-score beyond "
            f"±{MODIFIED_Z_LIMIT:g}; Iglewicz & Hoaglin 1993), {fate} [estimator = \"{estimator}\"]: "
            + "; ".join(shown) + more)
