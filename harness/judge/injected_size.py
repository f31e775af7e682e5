"""How large an injected step delay's effects should be, and whether each estimated effect's interval holds that size.
Pure (numpy).

What the injection does: ``step-delay:<ms>`` (:mod:`dsa_route.inject`) sleeps ``<ms>`` once per forward of the
target model — in its first attention layer's opaque op, only in forwards with attention metadata — and never in the
MTP draft's forward (:func:`dsa_route.vllm_cpu.model.apply_injection`). An engine step runs one target forward (then
the draft), so the assumption checked here is: an arm whose injected delay is ``d`` runs every engine step
``k·(d − d_ref)`` longer than its reference arm, ``k`` = ``sleeps_per_step`` = 1, and nothing else changes (the same
engine steps, tokens per step and acceptance). :func:`step_checks` measures ``k`` and the rest from the data.

An arm's reference (:func:`references`): the arm at the same levels of the factors that are not injected, with every
injected factor off ("matched"); where some arm has none (a fraction), every arm with all injected factors off
("pooled").

Expected log ratio of an arm to its reference in session block ``b`` (``Δ = k·(d − d_ref)`` in ms):

- throughput (tokens or requests per second of the bench window ``W`` of ``N`` engine steps): the window becomes
  ``W + N·Δ``, so ``ln(y / y_ref) = −ln(1 + Δ·s_ref,b)`` with ``s_ref`` the reference's ``engine_steps_per_s``
  (Δ ``vllm:iteration_tokens_total_count`` / duration, :mod:`harness.run.server_metrics`) — exact whatever idle time
  the window holds, while the step count stays;
- TPOT (``server_mean_tpot_ms``, ``mean_tpot_ms``, ``median_tpot_ms``): a request gains ``L`` tokens per engine step
  (``L`` = acceptance length, 1 without MTP), so its decode step is ``T = TPOT·L`` and ``ln(TPOT / TPOT_ref) =
  ln(1 + Δ / T_ref,b)``;
- acceptance length: 0 (a sleep changes no tensor).

The expected effect of a term is the attribution model's own coefficient on these per-arm expectations: least squares
over the design's arms with the columns of :func:`harness.judge.attribution.design_matrix` (x = level − ½ and their
products, one block), computed per block and averaged over blocks (their range is kept: how much the expectation
moves with the reference's block-to-block step time). Only terms with an injected factor are checked: in a full
design (and with pooled references) such a term's column is orthogonal to anything that depends on the other factors
alone, so the reference arms' own values drop out and the expectation is the delay's alone. A check passes when
``ci_low ≤ expected ≤ ci_high`` (the effect's own 1 − α interval, to :data:`TOLERANCE`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from harness.judge.attribution import design_matrix
from harness.judge.factorial import LETTERS, effect_terms

__all__ = ["THROUGHPUT", "TPOT", "UNCHANGED", "TOLERANCE", "SLEEPS_PER_STEP", "references", "step_ms",
           "expected_effects", "check_sizes", "step_checks", "injected_sizes"]

THROUGHPUT = ("output_throughput", "total_token_throughput", "request_throughput")
TPOT = ("server_mean_tpot_ms", "mean_tpot_ms", "median_tpot_ms")
UNCHANGED = ("acceptance_length",)
TOLERANCE = 1e-9
"""Rounding allowed at an interval's ends (a "no variation" fit's interval is its estimate, e.g. 1e-17 for 0)."""
SLEEPS_PER_STEP = 1.0
"""Sleeps per engine step: one target forward per step, the MTP draft not delayed (apply_injection)."""

ASSUMPTION = ("step-delay sleeps once per target forward (dsa_route.vllm_cpu.model.apply_injection: the target's "
              "first attention layer, not the MTP draft), so every engine step of an arm is k·(its delay − its "
              "reference's) longer, k = {k:g}, with the same steps, tokens per step and acceptance; expected log "
              "effects: throughput −ln(1 + Δ·engine_steps_per_s_ref), TPOT ln(1 + Δ/(TPOT_ref·acceptance_length_ref)), "
              "acceptance 0, per block, as the model's coefficients over the design's arms, averaged over blocks")


def references(levels: Mapping[str, Mapping[str, int]], injected: Sequence[str]) -> tuple[dict[str, list[str]], str]:
    """Arm → its reference arms, and ``"matched"`` or ``"pooled"`` (see the module docstring).

    ``levels``: arm → {factor: 0|1}. ``injected``: the factors whose "on" level is a step delay and nothing else.

    Raises:
        ValueError: no arm has every injected factor off (no step time without the injection to start from).
    """
    off = sorted(a for a, lv in levels.items() if all(lv[f] == 0 for f in injected))
    if not off:
        raise ValueError(f"no arm has every injected factor ({', '.join(injected)}) off: no reference step time")

    def others(arm: str) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((f, v) for f, v in levels[arm].items() if f not in injected))

    matched = {a: [r for r in off if others(r) == others(a)] for a in levels}
    if all(matched.values()):
        return matched, "matched"
    return {a: list(off) for a in levels}, "pooled"


def step_ms(row: Mapping[str, Any], metric: str) -> float | None:
    """The step time (ms) that ``metric`` scales with, from one observation: ``1000 / engine_steps_per_s`` for a
    throughput, else ``TPOT·acceptance_length`` (``metric``'s own TPOT where it is one and was measured, else the
    server's, else the client's mean; acceptance 1 when not measured); None when the columns are missing or not
    positive."""
    if metric in THROUGHPUT:
        rate = row.get("engine_steps_per_s")
        return 1000.0 / rate if rate and rate > 0 else None
    tpot = row.get(metric) if metric in TPOT else None
    if tpot is None:
        tpot = row.get("server_mean_tpot_ms") or row.get("mean_tpot_ms")
    tokens = row.get("acceptance_length") or 1.0
    return tpot * tokens if tpot and tpot > 0 else None


def _expected_ratio(metric: str, extra_ms: float, ref_step_ms: float) -> float:
    """Expected ln(arm / reference) of ``metric`` for ``extra_ms`` more per step than a reference step of
    ``ref_step_ms``."""
    if metric in UNCHANGED:
        return 0.0
    grown = math.log1p(extra_ms / ref_step_ms)
    return -grown if metric in THROUGHPUT else grown


def expected_effects(rows: Sequence[Mapping[str, Any]], factors: Sequence[str], design: str, metric: str,
                     delays_ms: Mapping[str, float], injected: Sequence[str], *,
                     sleeps_per_step: float = SLEEPS_PER_STEP) -> dict[tuple[int, ...], list[float]]:
    """Term → its expected effect per session block (log scale; one entry per block whose reference arms were
    measured), for ``metric`` at one level.

    ``rows``: that level's observations (``arm``, ``block``, ``levels``, the metric and step columns).
    ``delays_ms``: arm → its injected step delay (ms per target forward, 0 for none). Raises ValueError as
    :func:`references`, or for a metric with no known expectation (neither throughput, TPOT nor acceptance)."""
    if metric not in THROUGHPUT + TPOT + UNCHANGED:
        raise ValueError(f"{metric}: no expected size of a step delay is derived for it")
    levels = {r["arm"]: dict(r["levels"]) for r in rows}
    arms = sorted(levels)
    refs, _ = references(levels, injected)
    terms = effect_terms(len(factors), design)
    X = design_matrix([{"levels": levels[a], "block": 0} for a in arms], terms, factors, [0])
    out: dict[tuple[int, ...], list[float]] = {t: [] for t in terms}
    for block in sorted({r["block"] for r in rows}):
        steps = {r["arm"]: step_ms(r, metric) for r in rows if r["block"] == block}
        delta = []
        for arm in arms:   # a block without some arm's reference gives no expectation (break → no else)
            measured = [steps[r] for r in refs[arm] if steps.get(r) is not None]
            if not measured:
                break
            extra = sleeps_per_step * (delays_ms.get(arm, 0.0) - float(np.mean([delays_ms.get(r, 0.0)
                                                                                  for r in refs[arm]])))
            delta.append(_expected_ratio(metric, extra, float(np.mean(measured))))
        else:
            coef = np.linalg.lstsq(X, np.asarray(delta), rcond=None)[0]
            for i, term in enumerate(terms):
                out[term].append(float(coef[1 + i]))
    return out


def check_sizes(effects: Sequence[Mapping[str, Any]], expected: Mapping[tuple[int, ...], Sequence[float]],
                injected_idx: set[int]) -> list[dict[str, Any]]:
    """One check per effect (of one metric at one level) whose term has an injected factor: ``{"metric", "level",
    "term", "letters", "estimate", "ci_low", "ci_high", "expected", "expected_low", "expected_high", "blocks",
    "inside", "miss"}`` — ``expected`` the mean over blocks (low/high their range), ``inside`` whether the interval
    holds it (to :data:`TOLERANCE`; None when the effect or the expectation is not a number), ``miss`` how far
    outside (0 inside)."""
    out = []
    for effect in effects:
        term = tuple(LETTERS.index(c) for c in effect["letters"])
        if not set(term) & injected_idx:
            continue
        per_block = list(expected.get(term, ()))
        value = float(np.mean(per_block)) if per_block else math.nan
        low, high = float(effect["ci_low"]), float(effect["ci_high"])
        known = all(math.isfinite(x) for x in (value, low, high))
        inside = (low - TOLERANCE <= value <= high + TOLERANCE) if known else None
        miss = 0.0 if not known or inside else min(abs(value - low), abs(value - high))
        out.append({"metric": effect["metric"], "level": effect["level"], "term": effect["term"],
                    "letters": effect["letters"], "estimate": float(effect["estimate"]), "ci_low": low,
                    "ci_high": high, "expected": value, "expected_low": min(per_block, default=math.nan),
                    "expected_high": max(per_block, default=math.nan), "blocks": len(per_block), "inside": inside,
                    "miss": miss})
    return out


def step_checks(rows: Sequence[Mapping[str, Any]], delays_ms: Mapping[str, float], injected: Sequence[str], *,
                sleeps_per_step: float = SLEEPS_PER_STEP) -> list[dict[str, Any]]:
    """The assumption, measured: per delayed arm of one level and per route — ``"engine"`` (1000 /
    ``engine_steps_per_s``, what throughput scales with) and ``"request"`` (server TPOT, else the client's, ×
    acceptance length: what TPOT scales with) — the arm's step time and its reference's (ms, means over the blocks
    where both were measured), the sleeps per step the difference implies (``(step − ref) / (d − d_ref)``, 1 under
    the assumption) and the ``excess_ms`` beyond ``sleeps_per_step·(d − d_ref)``."""
    levels = {r["arm"]: dict(r["levels"]) for r in rows}
    refs, _ = references(levels, injected)
    out = []
    for arm in sorted(levels):
        extra = delays_ms.get(arm, 0.0) - float(np.mean([delays_ms.get(r, 0.0) for r in refs[arm]]))
        if extra == 0:
            continue
        for route, metric in (("engine", THROUGHPUT[0]), ("request", "server_mean_tpot_ms")):
            pairs = []
            for block in sorted({r["block"] for r in rows}):
                here = {r["arm"]: step_ms(r, metric) for r in rows if r["block"] == block}
                ref = [here[r] for r in refs[arm] if here.get(r) is not None]
                if here.get(arm) is not None and ref:
                    pairs.append((here[arm], float(np.mean(ref))))
            if not pairs:
                continue
            step, ref = (float(np.mean(x)) for x in zip(*pairs))
            out.append({"arm": arm, "level": rows[0]["level"], "route": route, "delay_ms": extra, "step_ms": step,
                        "reference_ms": ref, "blocks": len(pairs), "sleeps_per_step": (step - ref) / extra,
                        "excess_ms": step - ref - sleeps_per_step * extra})
    return out


def injected_sizes(observations: Sequence[Mapping[str, Any]], effects: Sequence[Mapping[str, Any]],
                   factors: Sequence[str], design: str, delays_ms: Mapping[str, float], injected: Sequence[str], *,
                   sleeps_per_step: float = SLEEPS_PER_STEP) -> dict[str, Any]:
    """The whole check over every level and metric of an attribution (:func:`harness.judge.attribution.analyse`'s
    ``observations`` and ``effects``): ``{"assumption", "sleeps_per_step", "reference", "checks", "steps",
    "checked", "inside", "notes"}`` — ``checks`` from :func:`check_sizes`, ``steps`` from :func:`step_checks`,
    ``checked``/``inside`` how many checks had a number and how many of them passed.

    ``delays_ms``: arm → injected step delay (ms); ``injected``: factor names whose "on" level is a step delay and
    nothing else. Raises ValueError as :func:`references`."""
    index = {f: i for i, f in enumerate(factors)}
    injected_idx = {index[f] for f in injected}
    checks: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    notes: list[str] = []
    mode = ""
    for level in sorted({o["level"] for o in observations}):
        rows = [o for o in observations if o["level"] == level]
        _, mode = references({r["arm"]: dict(r["levels"]) for r in rows}, injected)
        steps += step_checks(rows, delays_ms, injected, sleeps_per_step=sleeps_per_step)
        for metric in dict.fromkeys(e["metric"] for e in effects if e["level"] == level):
            if metric not in THROUGHPUT + TPOT + UNCHANGED:
                notes.append(f"{metric} @ {level}: no expected size of a step delay is derived for this metric")
                continue
            expected = expected_effects(rows, factors, design, metric, delays_ms, injected,
                                        sleeps_per_step=sleeps_per_step)
            checks += check_sizes([e for e in effects if e["level"] == level and e["metric"] == metric], expected,
                                  injected_idx)
    if mode == "pooled":
        notes.append("some arm has no reference at its levels of the other factors (a fraction): every arm with the "
                     "injected factors off is the reference of every arm")
    known = [c for c in checks if c["inside"] is not None]
    return {"assumption": ASSUMPTION.format(k=sleeps_per_step), "sleeps_per_step": sleeps_per_step,
            "reference": mode, "checks": checks, "steps": steps, "checked": len(known),
            "inside": sum(bool(c["inside"]) for c in known), "notes": notes}
