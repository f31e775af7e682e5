"""The report's correctness section: the token-divergence, confidence, decode-divergence and parity cells against
their A/A envelope, from ``verdict.json``'s ``correctness`` list (:class:`harness.rundir.documents.CorrectnessCellDoc`),
with each divergence cell's per-token ``|Δ log p|`` CDF (the confidence cell's signed log-odds shift) of the A/B beside
the A/A (the quantiles the gate stored)."""

from __future__ import annotations

from typing import Any, Mapping

from harness.render.plots import Plot, new_figure, png_data_uri

LINEAR_BELOW = 1e-4
"""Nats: the symlog axis is linear below this (an A/A that is bit-exact sits at 0)."""


PLOTS = {
    "token_divergence": ("divergence-cdf", "|Δ log p| of the forced token", "Per-token divergence, A/B against A/A",
                         "Both arms score the baseline's greedy continuation of every parity prompt (teacher forcing, "
                         "prompt_logprobs); the further right the A/B curve sits from the A/A, the more the candidate "
                         "moves the model's distribution."),
    "confidence_loss": ("confidence-cdf", "Δ log-odds of the forced token against its top-20 competitors",
                        "Confidence in the baseline's tokens, A/B against A/A",
                        "Per forced position, how much the candidate (A/B) or the baseline's second session (A/A) "
                        "changes the log-odds of the baseline's token against the other top-20 entries; negative: "
                        "less sure of it. Rounding moves it both ways; a defect that costs information shifts the "
                        "A/B curve left."),
    "decode_divergence": ("decode-divergence-cdf", "|Δ log p| of the runner-up token, decode vs prefill",
                          "Decode against prefill, candidate against the baseline sessions",
                          "Per position of the common greedy prefix, how far a session's decode (the parity requests' "
                          "logprobs: the decode path and its caches) puts the runner-up token's log p from where its "
                          "own teacher-forced prefill puts it; A/B: the candidate, A/A: the baseline sessions. The "
                          "further right the A/B curve, the more the candidate's decode departs from its prefill."),
}
"""Per divergence cell: (figure id, what the x axis measures, title, caption)."""


def divergence_plot(name: str, cdf: Mapping[str, list[float]]) -> Plot | None:
    """Empirical CDF of the per-token statistic of divergence cell ``name`` (:data:`PLOTS`: ``|Δ log p|``, or the
    signed log-odds shift): A/B (reference vs candidate) and A/A (reference vs its second session and its other
    batch), from the 0–100 % quantiles; None without data or for a cell without a plot (parity)."""
    quantiles = cdf.get("quantiles") or []
    if name not in PLOTS or not quantiles or not (cdf.get("ab") or cdf.get("aa")):
        return None
    key, what, title, caption = PLOTS[name]
    figure, axes = new_figure()
    for side, label, color in (("ab", "A/B: baseline vs candidate", "#c0392b"), ("aa", "A/A envelope", "#2c7fb8")):
        if cdf.get(side):
            axes.step(cdf[side], quantiles, where="post", label=label, color=color)
    axes.set_xscale("symlog", linthresh=LINEAR_BELOW)
    axes.set_xlabel(f"{what} (nats, symlog)")
    axes.set_ylabel("share of positions")
    axes.legend(loc="lower right")
    return Plot(key, title, f"CDF of per-token {what}, A/B and A/A", caption, png_data_uri(figure))


def correctness_section(verdict: Any) -> list[dict[str, Any]] | None:
    """The correctness cells of a verdict section (``sections.verdict``), each with its CDF plot; None when the
    verdict has none (the run predates them, dummy weights, or ``[parity] gated = false``)."""
    cells = verdict.get("correctness") if isinstance(verdict, Mapping) else None
    if not cells:
        return None
    return [{**cell, "plot": divergence_plot(str(cell.get("name")), cell.get("cdf") or {})} for cell in cells]


def tie_band(verdict: Any, key: str = "token_tolerance", unit: str = "nats/token") -> str:
    """A divergence cell's tie band as the report states it: ``"0.002 nats/token"`` from the verdict's policy
    (``policy_fields.<key>``: ``token_tolerance``, ``confidence_tolerance``, or ``decode_tolerance`` in
    nats/position), or ``"the policy's
    <key>"`` when the verdict predates the field."""
    fields = verdict.get("policy_fields") if isinstance(verdict, Mapping) else None
    value = fields.get(key) if isinstance(fields, Mapping) else None
    return f"{value:g} {unit}" if isinstance(value, (int, float)) else f"the policy's {key}"
