"""The report's correctness section: the token-divergence and parity cells against their A/A envelope, from
``verdict.json``'s ``correctness`` list (:class:`harness.rundir.documents.CorrectnessCellDoc`), with the per-token
``|Δ log p|`` CDF of the A/B beside the A/A (the quantiles the gate stored)."""

from __future__ import annotations

from typing import Any, Mapping

from harness.render.plots import Plot, new_figure, png_data_uri

LINEAR_BELOW = 1e-4
"""Nats: the symlog axis is linear below this (an A/A that is bit-exact sits at 0)."""


def divergence_plot(cdf: Mapping[str, list[float]]) -> Plot | None:
    """Empirical CDF of the per-token ``|Δ log p|``: A/B (reference vs candidate) and A/A (reference vs its second
    session and its other batch), from the 0–100 % quantiles; None without data."""
    quantiles = cdf.get("quantiles") or []
    if not quantiles or not (cdf.get("ab") or cdf.get("aa")):
        return None
    figure, axes = new_figure()
    for key, label, color in (("ab", "A/B: baseline vs candidate", "#c0392b"), ("aa", "A/A envelope", "#2c7fb8")):
        if cdf.get(key):
            axes.step(cdf[key], quantiles, where="post", label=label, color=color)
    axes.set_xscale("symlog", linthresh=LINEAR_BELOW)
    axes.set_xlabel("|Δ log p| of the forced token (nats, symlog)")
    axes.set_ylabel("share of positions")
    axes.legend(loc="lower right")
    return Plot("divergence-cdf", "Per-token divergence, A/B against A/A",
                "CDF of per-token |Δ log p|, A/B and A/A",
                "Both arms score the baseline's greedy continuation of every parity prompt (teacher forcing, "
                "prompt_logprobs); the further right the A/B curve sits from the A/A, the more the candidate moves "
                "the model's distribution.", png_data_uri(figure))


def correctness_section(verdict: Any) -> list[dict[str, Any]] | None:
    """The correctness cells of a verdict section (``sections.verdict``), each with its CDF plot; None when the
    verdict has none (the run predates them, dummy weights, or ``[parity] gated = false``)."""
    cells = verdict.get("correctness") if isinstance(verdict, Mapping) else None
    if not cells:
        return None
    return [{**cell, "plot": divergence_plot(cell.get("cdf") or {})} for cell in cells]


def tie_band(verdict: Any) -> str:
    """The divergence cell's tie band as the report states it: ``"0.002 nats/token"`` from the verdict's policy
    (``policy_fields.token_tolerance``), or ``"the policy's token_tolerance"`` when the verdict predates the field."""
    fields = verdict.get("policy_fields") if isinstance(verdict, Mapping) else None
    value = fields.get("token_tolerance") if isinstance(fields, Mapping) else None
    return f"{value:g} nats/token" if isinstance(value, (int, float)) else "the policy's token_tolerance"
