"""Shared fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def supported_vllm():
    """dsa_route.vllm_defaults once the installed vLLM passed its version gate (imports vLLM; skips without it).

    A vLLM release whose internals the simulation does not read fails the test with one line,
    ``vLLM internals changed: …`` naming the installed version.
    """
    pytest.importorskip("vllm")
    from dsa_route import vllm_defaults

    try:
        vllm_defaults.require_supported()
    except vllm_defaults.VllmInternalsChanged as error:
        pytest.fail(str(error), pytrace=False)
    return vllm_defaults
