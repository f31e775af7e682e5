"""The two opaque custom ops that let vLLM's compiled path (``CompilationMode.VLLM_COMPILE``, which the CPU platform
runs as ``DYNAMO_TRACE_ONCE`` + inductor) compile the DSA model class without tracing dsa_route's eager maths.

Why opaque ops (the pattern of vLLM's own CPU sparse attention, ``vllm/models/deepseek_v4/cpu/cpu_sparse.py``
``deepseek_v4_cpu_prepare_and_attn``):

- The attention writes the paged latent and indexer caches, which are not tensor arguments (dynamo could not track
  those mutations), reads ``attn_metadata`` from the forward context, and loops over requests. On CPU the model is
  traced once, during a warm-up run whose ``attn_metadata`` is ``None``: anything metadata-dependent left in the
  traced graph would be frozen in its warm-up branch. So the whole layer — projections, indexer, top-k, sparse MLA,
  ``o_proj`` — is one op.
- The reference MoE chooses experts with ``unique().tolist()`` (data-dependent control flow; vLLM's fused MoE is an
  opaque op, ``vllm::moe_forward``, for the same reason). The dense MLP, norms, residual adds, embeddings and RoPE
  tables stay in the graph and are what inductor compiles.

Each op finds its module by layer name in ``get_forward_context().no_compile_layers`` (vLLM's
``compilation_config.static_forward_context``), where :func:`.attention.register_layer` put it. Under
``CompilationMode.NONE`` the same ops run eagerly, so both arms compute the layer with the same code.
"""

import torch
from torch import nn

from vllm.forward_context import get_forward_context
from vllm.utils.torch_utils import (LayerNameType, _encode_layer_name, _resolve_layer_name,
                                    direct_register_custom_op)

from .attention import paged_dsa_attention


def _layer(layer_name: LayerNameType) -> nn.Module:
    return get_forward_context().no_compile_layers[_resolve_layer_name(layer_name)]


def _dsa_attention(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   layer_name: LayerNameType) -> torch.Tensor:
    return paged_dsa_attention(_layer(layer_name), x, positions, cos, sin)


def _dsa_attention_fake(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        layer_name: LayerNameType) -> torch.Tensor:
    return torch.empty_like(x)  # o_proj maps back to the hidden size


def _dsa_moe(x: torch.Tensor, layer_name: LayerNameType) -> torch.Tensor:
    return _layer(layer_name)(x)


def _dsa_moe_fake(x: torch.Tensor, layer_name: LayerNameType) -> torch.Tensor:
    return torch.empty_like(x)


direct_register_custom_op(op_name="dsa_route_cpu_attention", op_func=_dsa_attention, fake_impl=_dsa_attention_fake)
direct_register_custom_op(op_name="dsa_route_cpu_moe", op_func=_dsa_moe, fake_impl=_dsa_moe_fake)


def dsa_attention(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  layer_name: str) -> torch.Tensor:
    """One DSA attention layer as an op: normed hidden ``x [N, D]`` (model dtype), ``positions [N]`` int64,
    ``cos/sin [N, P/2]`` fp32 → ``[N, D]``. See :func:`.attention.paged_dsa_attention`."""
    return torch.ops.vllm.dsa_route_cpu_attention(x, positions, cos, sin, _encode_layer_name(layer_name))


def dsa_moe(x: torch.Tensor, layer_name: str) -> torch.Tensor:
    """The reference MoE (:class:`dsa_route.dsa.moe.MoE`) registered as ``layer_name``, as an op: ``[N, D]`` →
    ``[N, D]``."""
    return torch.ops.vllm.dsa_route_cpu_moe(x, _encode_layer_name(layer_name))
