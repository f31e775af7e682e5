"""Per-knob overrides of a routing decision: one knob of PR #52861 moved on its own (factorial attribution).

PR #52861 moves five knobs at once; :func:`dsa_route.routing.decide` pins all of them by ``route``. An attribution
arm (``harness.run.factors``) starts from the baseline route and moves some knobs to the candidate's value. This
module says which knobs there are (:data:`KNOBS`, each with its baseline and candidate value), applies a set of them
to a decision (:func:`apply_knobs`), says which combinations the installed vLLM refuses or silently rewrites
(:func:`knob_refusals`), and carries them to the server's plugin in one environment variable (:data:`ENV_KNOBS`,
:func:`knobs_to_env` / :func:`knobs_from_env`). Pure like the decision: no torch, no vLLM, never ``os.environ``.

Knobs and values (baseline → candidate):

- ``implementation``: ``generic`` (vllm.model_executor.models.deepseek_v2 and its DeepSeekMTP draft) → ``platform``
  (the platform's DSA implementation: vllm.models.deepseek_v32 on CUDA; dsa_route.vllm_cpu on CPU for both values).
- ``model_runner``: ``v1`` → ``v2`` (``VLLM_USE_V2_MODEL_RUNNER``).
- ``breakable_cudagraph``: ``off`` → ``on`` (``VLLM_USE_BREAKABLE_CUDAGRAPH``).
- ``compilation_mode``: ``VLLM_COMPILE`` → ``NONE`` (``--compilation-config mode``).
- ``mtp_draft_eager``: ``on`` → ``off`` (the DSA MTP draft forced eager before the PR).

Sources for the refusals (vLLM 0.32, ``vllm/config/vllm.py``): ``_validate_v2_model_runner`` raises "Model Runner V2
requires Triton." (line 3190); ``_maybe_enable_breakable_cudagraph`` sets ``CompilationMode.NONE`` whenever breakable
CUDA graphs are on (lines 837–839), so ``breakable_cudagraph=on`` with ``compilation_mode=VLLM_COMPILE`` would run
as the NONE arm. Breakable graphs do *not* need MRV2 in 0.32: MRV1's ``gpu_model_runner.py`` wraps the model in
``BreakableCUDAGraphWrapper`` too (line 5192), so that combination is allowed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Mapping

from dsa_route.route_constants import (
    CPU_IMPLEMENTATION,
    CUDA_IMPLEMENTATION,
    DSA_MTP_ARCHITECTURE,
    ENV_BREAKABLE,
    ENV_MRV2,
    GENERIC_IMPLEMENTATION,
    GENERIC_MTP_ARCHITECTURE,
)

if TYPE_CHECKING:  # routing imports this module; the type only
    from dsa_route.routing import RouteDecision

ENV_KNOBS = "DSA_ROUTE_KNOBS"
"""The server environment variable carrying the knobs: ``knob=value`` pairs joined by commas, sorted by knob."""

# knob → (baseline value, candidate value). The order is the PR's own list of what it moves.
KNOBS: dict[str, tuple[str, str]] = {
    "implementation": ("generic", "platform"),
    "model_runner": ("v1", "v2"),
    "breakable_cudagraph": ("off", "on"),
    "compilation_mode": ("VLLM_COMPILE", "NONE"),
    "mtp_draft_eager": ("on", "off"),
}


class KnobError(ValueError):
    """An unknown knob or value; ``str(error)`` is one line naming the allowed ones."""


def check_knobs(knobs: Mapping[str, str]) -> dict[str, str]:
    """``knobs`` validated (each knob in :data:`KNOBS`, each value one of its two), as a plain dict.

    Raises:
        KnobError: an unknown knob or value (the message names the allowed ones).
    """
    out = {}
    for knob, value in knobs.items():
        if knob not in KNOBS:
            raise KnobError(f"unknown knob {knob!r}; knobs: {', '.join(KNOBS)}")
        if str(value) not in KNOBS[knob]:
            raise KnobError(f"knob {knob} = {value!r}; allowed: {' or '.join(KNOBS[knob])}")
        out[knob] = str(value)
    return out


def knob_refusals(knobs: Mapping[str, str], platform: str, has_triton: bool) -> list[str]:
    """Why vLLM 0.32 would refuse (or silently rewrite) this set of knob values on ``platform``; empty when it runs
    as asked. Each entry is one sentence with its source line in the installed vLLM."""
    refusals = []
    if knobs.get("model_runner") == "v2" and not has_triton:
        refusals.append(f"model_runner=v2 on {platform} without Triton: vLLM refuses to start (\"Model Runner V2 "
                        "requires Triton.\", vllm/config/vllm.py _validate_v2_model_runner)")
    if knobs.get("breakable_cudagraph") == "on" and knobs.get("compilation_mode") == "VLLM_COMPILE":
        refusals.append("breakable_cudagraph=on with compilation_mode=VLLM_COMPILE: vLLM sets CompilationMode.NONE "
                        "whenever breakable CUDA graphs are on (vllm/config/vllm.py _maybe_enable_breakable_cudagraph),"
                        " so this arm would run as the NONE arm")
    return refusals


def decision_refusals(decision: "RouteDecision", knobs: Mapping[str, str], platform: str,
                      has_triton: bool) -> list[str]:
    """:func:`knob_refusals` of an arm's ``knobs`` together with what they leave the decision with: a knob meets the
    route's own values too — ``compilation_mode=VLLM_COMPILE`` on the candidate route, whose breakable graphs vLLM
    answers with ``NONE``, is refused like the two knobs given together. The model runner is the knobs' only (on a
    platform without Triton the translation, :mod:`dsa_route.serve_path`, already runs the route's MRV2 as V1).
    Empty without knobs."""
    if not knobs:
        return []
    values = {"breakable_cudagraph": "on" if decision.breakable_cudagraph else "off",
              "compilation_mode": decision.compilation_mode, **knobs}
    return knob_refusals(values, platform, has_triton)


def knobs_to_env(knobs: Mapping[str, str]) -> str:
    """``{"compilation_mode": "NONE"}`` → ``"compilation_mode=NONE"`` (sorted; empty string for no knobs)."""
    return ",".join(f"{k}={v}" for k, v in sorted(knobs.items()))


def knobs_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The knobs in :data:`ENV_KNOBS` of ``environ`` (unset or blank: none).

    Raises:
        KnobError: a malformed pair, an unknown knob or value.
    """
    text = (environ.get(ENV_KNOBS) or "").strip()
    if not text:
        return {}
    pairs = {}
    for part in text.split(","):
        knob, sep, value = part.partition("=")
        if not sep:
            raise KnobError(f"{ENV_KNOBS}={text!r}: {part!r} is not knob=value")
        pairs[knob.strip()] = value.strip()
    return check_knobs(pairs)


def _implementation(decision: "RouteDecision", value: str) -> tuple[dict[str, str], str | None]:
    """(architecture → class, draft architecture) for ``implementation = value`` on the decision's platform."""
    platform = decision.platform
    if platform == "cpu":
        table = CPU_IMPLEMENTATION
    elif value == "generic" or platform != "cuda":
        table = GENERIC_IMPLEMENTATION
    else:
        table = CUDA_IMPLEMENTATION
    impl = {arch: table[arch] for arch in decision.implementation if arch in decision.architectures}
    draft = decision.mtp_architecture
    if draft is not None and (DSA_MTP_ARCHITECTURE in decision.implementation):
        impl[DSA_MTP_ARCHITECTURE] = table[DSA_MTP_ARCHITECTURE]
        draft = GENERIC_MTP_ARCHITECTURE if value == "generic" else DSA_MTP_ARCHITECTURE
    return impl, draft


def apply_knobs(decision: "RouteDecision", knobs: Mapping[str, str]) -> "RouteDecision":
    """``decision`` with each knob of ``knobs`` moved to its value, ``env`` and ``compilation_mode`` following vLLM's
    rules, one reason per knob, and ``knobs`` recorded (so :mod:`dsa_route.serve_path` passes them to the plugin).

    ``breakable_cudagraph=on`` without a ``compilation_mode`` knob gives ``NONE`` (vLLM's own rule); ``off`` gives the
    route's mode back unless breakable graphs were what made it NONE (then ``VLLM_COMPILE``).

    Raises:
        KnobError: an unknown knob or value.
    """
    knobs = check_knobs(knobs)
    if not knobs:
        return decision
    from dsa_route.routing import FrozenDict

    changes: dict = {}
    reasons = []
    if "model_runner" in knobs:
        changes["model_runner"] = knobs["model_runner"]
    if "breakable_cudagraph" in knobs:
        changes["breakable_cudagraph"] = knobs["breakable_cudagraph"] == "on"
    breakable = changes.get("breakable_cudagraph", decision.breakable_cudagraph)
    if "compilation_mode" in knobs:
        changes["compilation_mode"] = knobs["compilation_mode"]
    elif "breakable_cudagraph" in knobs:
        changes["compilation_mode"] = "NONE" if breakable else (
            "VLLM_COMPILE" if decision.breakable_cudagraph else decision.compilation_mode)
    if "mtp_draft_eager" in knobs and decision.mtp_architecture is not None:
        changes["mtp_enforce_eager"] = knobs["mtp_draft_eager"] == "on"
    if "implementation" in knobs and decision.is_dsa:
        impl, draft = _implementation(decision, knobs["implementation"])
        changes["implementation"] = FrozenDict(impl)
        changes["mtp_architecture"] = draft
    for knob, value in knobs.items():
        reasons.append(f"knob: {knob}={value} (attribution override of route={decision.route}).")
    if decision.env:
        runner = changes.get("model_runner", decision.model_runner)
        changes["env"] = FrozenDict({**decision.env, ENV_MRV2: "1" if runner == "v2" else "0",
                                     ENV_BREAKABLE: "1" if breakable else "0"})
    return replace(decision, **changes, knobs=FrozenDict(knobs), reasons=(*decision.reasons, *reasons))
