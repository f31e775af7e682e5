"""vLLM model classes for DSA architectures on CPU, built from dsa_route's reference modules (see package docs).

Registered by :mod:`dsa_route.plugin` (CPU platform) as:
    DeepseekV32ForCausalLM → :class:`DsaCpuForCausalLM`
    GlmMoeDsaForCausalLM   → :class:`DsaCpuGlmMoeDsaForCausalLM`
    DeepseekV32MTPModel    → :class:`DsaCpuMTPModel`      (the MTP draft; vLLM names every DSA draft so)

Shape legend: N tokens of the step, D hidden, V vocab.

Both classes *are* :class:`dsa_route.dsa.DsaForCausalLM` (subclasses), so the parameter names are the HF checkpoint
names and ``load_weights`` is a name-for-name copy. The target keeps only the decoder layers and the draft only its
MTP layer(s) (the others become ``nn.Identity`` placeholders so layer indices and names stay those of the checkpoint).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

import torch
from torch import nn

from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig

from dsa_route.dsa import DsaConfig, DsaForCausalLM
from dsa_route.dsa.moe import MoE
from dsa_route.dsa.injections import install
from dsa_route.inject import Injection, injection_from_env

from .attention import attach_caches, kv_cache_dtype_for, register_layer
from .ops import dsa_attention, dsa_moe

# vLLM loads deepseek_v32 configs as transformers' DeepseekV3Config (model_type "deepseek_v3" inside the engine) and
# renames a DSA draft's model_type to "deepseek_mtp" (config/speculative.py); the DSA fields are intact in both.
_DSA_FAMILIES = ("deepseek_v32", "glm_moe_dsa")
APPLIED_PREFIX = "dsa_route.vllm_cpu: applied"


def dsa_config_from_vllm(hf_config) -> DsaConfig:
    """``DsaConfig`` from vLLM's HF config object (the target's, or the MTP draft's whose ``model_type`` vLLM rewrote
    to ``deepseek_mtp``; the DSA fields are unchanged there). Raises ValueError naming a missing field."""
    d = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    if d.get("index_topk") is None:
        raise ValueError("index_topk: not a DSA config (no lightning indexer)")
    if d.get("model_type") not in _DSA_FAMILIES:
        d["model_type"] = "glm_moe_dsa" if "glm" in type(hf_config).__name__.lower() else "deepseek_v32"
    if d.get("rope_scaling") is None and d.get("rope_parameters"):
        params = dict(d["rope_parameters"])
        if params.get("rope_type", params.get("type")) in ("deepseek_yarn", "yarn"):
            d["rope_scaling"] = {**params, "type": "yarn"}
    for key in ("n_predict", "architectures"):
        d.pop(key, None)
    return DsaConfig.from_hf_config(d)


class _DsaCpuBase(DsaForCausalLM):
    """Shared construction and weight loading."""

    # vLLM's loader: skip its "packed modules" mapping (we fuse nothing).
    packed_modules_mapping: dict[str, list[str]] = {}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", keep: str):
        hf_config = vllm_config.model_config.hf_config
        if vllm_config.speculative_config is not None and keep == "mtp":
            hf_config = vllm_config.speculative_config.draft_model_config.hf_config
        config = dsa_config_from_vllm(hf_config)
        super().__init__(config, dtype=vllm_config.model_config.dtype, device="cpu")
        n = config.num_hidden_layers
        used = range(n) if keep == "decoder" else range(n, n + config.num_nextn_predict_layers)
        for i in range(len(self.model.layers)):
            if i not in used:
                self.model.layers[i] = nn.Identity()
        cache_dtype = kv_cache_dtype_for(vllm_config)
        topk_source = None
        for i in used:
            layer = self.model.layers[i]
            attach_caches(layer.self_attn, f"model.layers.{i}.self_attn", cache_dtype)
            register_layer(f"model.layers.{i}.self_attn", layer.self_attn)
            if isinstance(layer.mlp, MoE):
                register_layer(f"model.layers.{i}.mlp", layer.mlp)
            if layer.self_attn.indexer is not None:
                topk_source = layer.self_attn
            elif keep == "decoder":  # a shared top-k layer (GLM): reads the previous full layer's indices
                object.__setattr__(layer.self_attn, "topk_source", topk_source)  # a reference, not a submodule
        self.used_layers = tuple(used)
        self.injection = apply_injection(self, injection_from_env(os.environ), keep)


    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def _block(self, i: int, h: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        """The reference ``DecoderLayer.forward`` of layer ``i`` with the paged attention (and the MoE) as opaque ops
        (:mod:`.ops`): ``h [N, D]`` → ``[N, D]``."""
        layer = self.model.layers[i]
        h = h + dsa_attention(layer.input_layernorm(h), positions, cos, sin, f"model.layers.{i}.self_attn")
        x = layer.post_attention_layernorm(h)
        return h + (dsa_moe(x, f"model.layers.{i}.mlp") if isinstance(layer.mlp, MoE) else layer.mlp(x))

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into the parameters of the same name; returns the names loaded. Tensors of layers
        this class does not keep (MTP layers in the target, decoder layers in the draft) are skipped; block-FP8
        weights are dequantized like ``DsaForCausalLM.load_safetensors`` does."""
        from dsa_route.dsa.model import _dequantize_block_fp8

        params = dict(self.named_parameters())
        pending: dict[str, torch.Tensor] = {}
        loaded: set[str] = set()
        for name, tensor in weights:
            pending[name] = tensor
        for name, tensor in pending.items():
            if name.endswith("weight_scale_inv") or name not in params:
                continue
            if tensor.dtype == torch.float8_e4m3fn:
                tensor = _dequantize_block_fp8(tensor, pending.get(name + "_scale_inv"), name)
            if params[name].shape != tensor.shape:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape "
                                 f"{tuple(params[name].shape)}")
            params[name].copy_(tensor.to(params[name].dtype))
            loaded.add(name)
        if self.config.tie_word_embeddings and "lm_head.weight" not in loaded and "lm_head.weight" in params:
            self.lm_head.weight.copy_(self.model.embed_tokens.weight)
            loaded.add("lm_head.weight")
        return loaded


def apply_injection(model: "_DsaCpuBase", injection: Injection | None, keep: str) -> Injection | None:
    """Switch a calibration injection (:mod:`dsa_route.inject`) on in a freshly built model; returns it.

    A catalogue defect (:data:`dsa_route.inject.DEFECTS`) is installed on every kept layer
    (:func:`dsa_route.dsa.injections.install`: the reference modules' hooks, which ``paged_dsa_attention`` and the MTP
    forward call); the draft gets it too, as part of the path under test. ``step-delay``: the target's
    (``keep == "decoder"``) first layer sleeps ``delay_s`` per forward that has attention metadata (real steps, not
    vLLM's dummy runs); the MTP draft is not delayed. Writes one ``dsa_route.vllm_cpu: applied inject=<spec> ...`` line
    to stderr.
    """
    if injection is None:
        return None
    # The line harness.run.attest reads as proof that the model, not only the plugin, took the injection.
    print(f"{APPLIED_PREFIX} inject={injection.spec} model={type(model).__name__} layers={list(model.used_layers)}",
          file=sys.stderr, flush=True)
    if injection.kind != "step-delay":
        install(model, injection.kind)
    elif keep == "decoder":
        object.__setattr__(model.model.layers[model.used_layers[0]].self_attn, "step_delay_s", injection.delay_s)
    return injection


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": 0, "inputs_embeds": 0})
class DsaCpuForCausalLM(_DsaCpuBase):
    """``DeepseekV32ForCausalLM`` on vLLM CPU: embeddings → decoder layers (paged DSA attention, reference MLP/MoE) →
    final norm; ``compute_logits`` is the reference LM head (fp32 logits).

    ``support_torch_compile``: under ``CompilationMode.VLLM_COMPILE`` (the baseline arm; CPU runs it as
    ``DYNAMO_TRACE_ONCE`` + inductor) vLLM compiles ``forward`` — embeddings, RMSNorms, residual adds, the dense MLP
    and RoPE tables — around the opaque attention and MoE ops; under ``CompilationMode.NONE`` it runs eagerly. The
    MTP draft (:class:`DsaCpuMTPModel`) is not compiled."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix, keep="decoder")

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """``input_ids [N]``, ``positions [N]`` → final-normed hidden ``[N, D]`` (what vLLM samples from and hands to
        the MTP drafter)."""
        h = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        cos, sin = self.rope.cos_sin(positions)
        for i in self.used_layers:
            h = self._block(i, h, positions, cos, sin)
        return self.model.norm(h)


class DsaCpuGlmMoeDsaForCausalLM(DsaCpuForCausalLM):
    """``GlmMoeDsaForCausalLM``: the same class (GLM's interleaved indexer RoPE and shared top-k layers are config)."""


class DsaCpuMTPModel(_DsaCpuBase):
    """``DeepseekV32MTPModel`` on vLLM CPU: the MTP layer(s) of the checkpoint (``model.layers.{n..}``).

    vLLM's MTP proposer contract (``llm_base_proposer``, ``model_returns_tuple`` for DeepseekV32MTPModel):
    ``forward(input_ids, positions, hidden_states, ..., spec_step_idx)`` returns ``(h, shared_head.norm(h))`` — the
    pre-norm hidden for ``compute_logits`` and the normed hidden recycled into the next draft step — which is the
    reference ``MTPLayer.predict`` split in two.
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix, keep="mtp")

    def _mtp_index(self, spec_step_idx: int) -> int:
        return self.used_layers[spec_step_idx % len(self.used_layers)]

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, hidden_states: torch.Tensor,
                intermediate_tensors=None, inputs_embeds: torch.Tensor | None = None, spec_step_idx: int = 0,
                **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._mtp_index(spec_step_idx)
        layer = self.model.layers[i]
        e = layer.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        e = torch.where(positions[:, None] == 0, torch.zeros_like(e), e)  # vLLM and the reference mask position 0
        h = layer.eh_proj(torch.cat((layer.enorm(e), layer.hnorm(hidden_states)), dim=-1))
        cos, sin = self.rope.cos_sin(positions)
        h = self._block(i, h, positions, cos, sin)
        return h, layer.defect.recycled_hidden(h, layer.shared_head.norm(h))

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        layer = self.model.layers[self._mtp_index(spec_step_idx)]
        return layer.shared_head.head(layer.shared_head.norm(hidden_states)).float()


__all__ = ["DsaCpuForCausalLM", "DsaCpuGlmMoeDsaForCausalLM", "DsaCpuMTPModel", "dsa_config_from_vllm"]
