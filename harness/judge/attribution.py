"""Effects of a factorial attribution, with intervals: an OLS linear model over (arm, block) observations. Pure.

Model, per metric and level (``y`` = the natural log of output throughput or of mean TPOT, or acceptance length as
is)::

    y[arm, block] = μ_block + Σ_i β_i·x_i + Σ_{i<j} γ_ij·x_i·x_j + ε,   x_i = level_i − ½ ∈ {−½, +½}

so ``β_i`` is factor i's main effect (on minus off, averaged over the other factors; on the log scale a log ratio) and
``γ_ij`` the two-factor interaction as a difference of differences, ``(y₁₁ − y₀₁) − (y₁₀ − y₀₀)`` averaged over the
rest (Box, Hunter & Hunter 2005 ch. 5 define the interaction as half of that; this one reads directly as "how much
more A changes y when B is on"). In the 2^(4−1) fraction the interaction terms are AB, AC, AD, each standing for its
alias chain (AB + CD, …). Higher interactions are not fitted: they are the error, with the block × arm variation.

Session blocks are fixed effects (``μ_block``), not random: an attribution has few blocks (2–4 here), the block
effect (the host's state while that block's servers ran) is a nuisance to remove, and a fixed effect needs no
variance-component estimate — which few blocks could not give — while every arm appears once in every block, so the
design is orthogonal to the blocks and the effect estimates are the same either way (only the error df differ).

Intervals: ``estimate ± t_{1−α/2, df}·se`` from the OLS fit, df = observations − fitted parameters (statsmodels
``OLS(y, X).fit()`` with one indicator column per block and no intercept: ``RegressionResults.conf_int`` / ``bse`` /
``pvalues``, statsmodels.org regression docs; a replicated 2^k in blocks: Montgomery, *Design and Analysis of
Experiments*, §7.2). Multiplicity: Holm (1979) over every effect tested (terms × metrics × levels), at α — the project's
one Holm, :func:`harness.judge.stats.holm_test` and :func:`~harness.judge.stats.holm_adjust`; an effect is
*attributed* when Holm rejects it (its Holm-adjusted p ≤ α). The intervals are the marginal 1 − α ones (their Holm
counterpart is the adjusted p). The familywise rate over a run's effects, simulated on recorded sessions with no
effect: :mod:`harness.study.attribution_simulation` (``results/attribution/``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import statsmodels.api as sm

from harness.judge.factorial import LETTERS, aliases, effect_terms
from harness.judge.stats import holm_adjust, holm_test

__all__ = ["LOG_METRICS", "analyse", "fit_metric", "waterfall", "design_matrix"]

LOG_METRICS = ("output_throughput", "total_token_throughput", "request_throughput", "server_mean_tpot_ms",
               "mean_tpot_ms", "median_tpot_ms", "mean_ttft_ms", "server_mean_ttft_ms", "mean_itl_ms")
"""Metrics fitted on the log scale (ratios: a throughput or a latency); the rest (acceptance length) as is."""

FALLBACK = {"server_mean_tpot_ms": "mean_tpot_ms"}
"""Where a metric was not measured in a run (no /metrics columns), the client's counterpart, said in the notes."""


def design_matrix(rows: Sequence[dict[str, Any]], terms: list[tuple[int, ...]], factors: Sequence[str],
                  blocks: list[int]) -> np.ndarray:
    """The design matrix ``[len(rows), len(blocks) + len(terms)]``: one indicator per block, then one column per term
    (products of x_i = level − ½ over the term's factor indices). ``rows``: dicts with ``levels`` (factor → 0|1)
    and ``block``."""
    out = []
    for row in rows:
        x = [row["levels"][f] - 0.5 for f in factors]
        out.append([1.0 if row["block"] == b else 0.0 for b in blocks] + [math.prod(x[i] for i in t) for t in terms])
    return np.asarray(out, dtype=float)


def fit_metric(rows: Sequence[dict[str, Any]], factors: Sequence[str], design: str, metric: str,
               alpha: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Fit one metric at one level: (effects without Holm, the fit's facts ``{"n", "df", "blocks", "beta", "mu"}``).

    ``rows``: observations with ``levels`` (factor → 0/1), ``block`` and the metric's value (None rows dropped).
    Each effect: term, letters, alias, metric, scale, estimate, se, ci_low, ci_high, df, p, percent, note.

    Raises:
        ValueError: a metric value ≤ 0 on the log scale.
    """
    log = metric in LOG_METRICS
    used = [r for r in rows if r.get(metric) is not None]
    k = len(factors)
    terms = effect_terms(k, design)
    alias = aliases(k, design)
    blocks = sorted({r["block"] for r in used})
    y = np.asarray([r[metric] for r in used], dtype=float)
    if log:
        if (y <= 0).any():
            raise ValueError(f"{metric}: a value ≤ 0 cannot be fitted on the log scale")
        y = np.log(y)
    X = design_matrix(used, terms, factors, blocks)
    n, params = len(y), len(blocks) + len(terms)
    df = n - int(np.linalg.matrix_rank(X)) if n else 0
    facts: dict[str, Any] = {"n": n, "df": df, "blocks": len(blocks), "beta": {}, "mu": float("nan")}
    if n == 0 or df < 1 or np.linalg.matrix_rank(X) < params:
        note = f"not estimable: {n} observations for {params} parameters"
        return [_effect(t, factors, alias, metric, log, math.nan, math.nan, (math.nan, math.nan), max(df, 0), None,
                        note) for t in terms], facts
    fit = sm.OLS(y, X).fit()
    tail = len(blocks)
    facts["beta"] = {t: float(fit.params[tail + i]) for i, t in enumerate(terms)}
    facts["mu"] = float(np.mean(fit.params[:tail]))
    flat = fit.mse_resid <= 1e-24 * max(1.0, float(np.mean(y ** 2)))
    if flat:
        return [_effect(t, factors, alias, metric, log, float(fit.params[tail + i]), 0.0,
                        (float(fit.params[tail + i]),) * 2, df, None, "no variation: every observation fits exactly")
                for i, t in enumerate(terms)], facts
    ci = fit.conf_int(alpha)
    return [_effect(t, factors, alias, metric, log, float(fit.params[tail + i]), float(fit.bse[tail + i]),
                    (float(ci[tail + i][0]), float(ci[tail + i][1])), df, float(fit.pvalues[tail + i]), None)
            for i, t in enumerate(terms)], facts


def _effect(term: tuple[int, ...], factors: Sequence[str], alias: dict[str, str], metric: str, log: bool,
            estimate: float, se: float, ci: tuple[float, float], df: int, p: float | None,
            note: str | None) -> dict[str, Any]:
    letters = "".join(LETTERS[i] for i in term)
    return {"term": "×".join(factors[i] for i in term), "letters": letters, "alias": alias.get(letters),
            "metric": metric, "scale": "log" if log else "linear", "estimate": estimate, "se": se,
            "ci_low": ci[0], "ci_high": ci[1], "df": df, "p": p,
            "percent": 100 * (math.exp(estimate) - 1) if log and math.isfinite(estimate) else None, "note": note}


def waterfall(facts: dict[str, Any], factors: Sequence[str], design: str) -> list[dict[str, float]]:
    """Baseline (every factor off) → candidate (every factor on), one factor switched on per step in factor order:
    the fitted model's prediction (blocks averaged) before and after each step, and the change. With interactions
    the steps depend on the order; the main effects do not. Empty when the fit had no estimates."""
    beta = facts.get("beta") or {}
    if not beta:
        return []
    k = len(factors)

    def predict(levels: list[int]) -> float:
        x = [v - 0.5 for v in levels]
        return facts["mu"] + sum(b * math.prod(x[i] for i in t) for t, b in beta.items())

    steps, levels = [], [0] * k
    for i in range(k):
        before = predict(levels)
        levels[i] = 1
        after = predict(levels)
        steps.append({"factor": factors[i], "before": before, "after": after, "change": after - before})
    return steps


def analyse(observations: Sequence[dict[str, Any]], factors: Sequence[str], design: str, metrics: Sequence[str],
            alpha: float) -> dict[str, Any]:
    """Every effect of every metric at every level, Holm over all of them; the fields of
    :class:`harness.rundir.schema.AttributionDocument` that come from the data (design, factors, letters, generator,
    aliases, alpha, tests, model, blocks, observations, effects, waterfall, notes).

    ``observations``: :func:`harness.attribution.observations` rows. ``design``: ``"full"`` | ``"half"``.
    """
    notes: list[str] = []
    effects: list[dict[str, Any]] = []
    falls: dict[str, list[dict[str, float]]] = {}
    levels = sorted({o["level"] for o in observations})
    blocks = sorted({o["block"] for o in observations})
    for level in levels:
        rows = [o for o in observations if o["level"] == level]
        for metric in metrics:
            name = metric
            if all(r.get(metric) is None for r in rows) and metric in FALLBACK:
                name = FALLBACK[metric]
                notes.append(f"{metric} was not measured at {level}; the client's {name} stands in")
            if all(r.get(name) is None for r in rows):
                notes.append(f"{metric} was not measured at {level}: no effects")
                continue
            found, facts = fit_metric(rows, factors, design, name, alpha)
            effects += [{**e, "level": level} for e in found]
            falls[f"{name} @ {level}"] = waterfall(facts, factors, design)
    tested = [i for i, e in enumerate(effects) if e["p"] is not None]
    if tested:
        pvalues = [effects[i]["p"] for i in tested]
        reject, adjusted = holm_test(pvalues, alpha)[0], holm_adjust(pvalues)
        for i, flag, p in zip(tested, reject, adjusted):
            effects[i]["p_holm"] = float(p)
            effects[i]["attributed"] = bool(flag)
    k = len(factors)
    alias = aliases(k, design)
    if alias:
        notes.append("2^(4−1) fraction, generator D = ABC (I = ABCD, resolution IV): each main effect is aliased with a "
                     "three-factor interaction (" + ", ".join(f"{a}={b}" for a, b in alias.items() if len(a) == 1)
                     + "), the two-factor interactions in pairs (" + ", ".join(f"{a}={b}" for a, b in alias.items()
                                                                                if len(a) == 2) + ")")
    notes.append("the waterfall switches the factors on one at a time in factor order on the fitted model; with "
                 "interactions its steps depend on that order, the main effects do not")
    return {
        "design": design, "factors": list(factors), "letters": {f: LETTERS[i] for i, f in enumerate(factors)},
        "generator": "D = ABC" if design == "half" else None, "aliases": alias, "alpha": alpha,
        "tests": len(tested),
        "model": ("OLS per metric and level: y = block fixed effect + Σ main effects (x = level − ½) + Σ two-factor "
                  "interactions (x_i·x_j: difference of differences); y = ln(value) for throughput and TPOT, the value "
                  "for acceptance length; intervals t(df) at 1 − α; Holm over every effect tested"),
        "blocks": len(blocks), "observations": list(observations), "effects": effects, "waterfall": falls,
        "notes": notes,
    }
