"""Shared fixtures for the dsa_route.dsa reference tests: one intra-op thread (the tiny shapes run ~10x faster than with
contended threads on a busy 2-core box) and cached tiny models."""

from __future__ import annotations

import pytest
import torch

from dsa_route.dsa import DsaConfig, DsaForCausalLM


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", params=["deepseek_v32", "glm_moe_dsa"])
def tiny_pair(request):
    """(sparse model, dense model) with the same seeded weights, for both checkpoint families."""
    torch.set_num_threads(1)
    config = DsaConfig.tiny(request.param)
    sparse = DsaForCausalLM.random(config, seed=0)
    dense = DsaForCausalLM(config, dense_attention=True)
    dense.load_state_dict(sparse.state_dict())
    return sparse, dense

