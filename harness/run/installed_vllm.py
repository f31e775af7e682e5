"""Questions to the installed vLLM that the pure plan must not ask itself: what ``route="auto"`` means there."""

from __future__ import annotations

from dsa_route import vllm_defaults
from harness.run.plan import Machine


def auto_choice(architecture: str, machine: Machine, env: dict[str, str], draft_type: str | None) -> dict | None:
    """``dsa_route.vllm_defaults.vllm_choice`` for one architecture on ``machine`` with the arm's ``env`` (the
    argument of ``routing.decide(..., vllm_choice=...)``); None when vLLM is not installed, its internals changed
    (another release) or it cannot simulate the platform — ``decide`` then uses its vLLM 0.32 snapshot."""
    try:
        return vllm_defaults.vllm_choice([architecture], machine.name, env=env, speculative_model_type=draft_type,
                                         has_triton=machine.has_triton)
    except (ImportError, vllm_defaults.VllmInternalsChanged, ValueError):
        return None
