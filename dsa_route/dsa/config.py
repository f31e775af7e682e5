"""DsaConfig: the hyper-parameters of a DeepSeek Sparse Attention model, read from an HF ``config.json``.

Two checkpoint families are supported (both are "DSA" models: MLA attention + a lightning indexer + top-k):
  - ``deepseek_v32``  (DeepSeek-V3.2 / V3.2-Exp): YaRN ``rope_scaling``, half-split (NeoX) indexer RoPE.
  - ``glm_moe_dsa``   (GLM-5.x): plain ``rope_parameters``, interleaved indexer RoPE (``indexer_rope_interleave``),
                       optional shared top-k layers (``indexer_types`` / ``index_topk_freq`` / ``index_topk_pattern``).

Field names follow the HF configs (transformers ``DeepseekV32Config`` / ``GlmMoeDsaConfig``) so the vLLM loader and this
reference read the same file the same way. Two extra fields choose the indexer's numerics (they are not in config.json):
  - ``indexer_fp8``: FP8 e4m3 + ue8m0 block scales on q and k, as the official kernel and vLLM do;
  - ``numerics``: whose indexer numerics to reproduce, a named choice because the two differ:
      ``"vllm"`` (default): no rotation before quantizing (``vllm/models/deepseek_v32/attention.py``:
          ``DeepseekV32Indexer`` l.50-120 and ``fused_q`` at l.433 quantize the rope'd q / k as they are);
      ``"official"``: the DeepSeek-V3.2-Exp demo rotates q and k by a Hadamard matrix before FP8
          (``inference/model.py::Indexer.forward``, ``rotate_activation``); the rotation is orthogonal, so without FP8
          it changes nothing, with FP8 it changes the quantization error and so some top-k selections.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

MODEL_TYPES = ("deepseek_v32", "glm_moe_dsa")
IndexerType = Literal["full", "shared"]
Numerics = Literal["vllm", "official"]
NUMERICS = ("vllm", "official")


@dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling (DeepSeek-V3 ``rope_scaling: {type: yarn, ...}``).

    Source: YaRN (Peng et al., arXiv:2309.00071); constants and defaults as in DeepSeek-V3.2-Exp
    ``inference/model.py::precompute_freqs_cis`` and vLLM ``DeepseekScalingRotaryEmbedding``.
    """

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


@dataclass(frozen=True)
class DsaConfig:
    """Hyper-parameters of a DSA model (see module docstring). Build with ``from_hf_config`` or ``tiny()``."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    # MLA (DeepSeek-V2 paper, arXiv:2405.04434 §2.1)
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    # Lightning indexer (DeepSeek-V3.2-Exp tech report §2.1)
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    indexer_types: tuple[IndexerType, ...]
    indexer_rope_interleave: bool = False
    rope_interleave: bool = True
    # MoE (DeepSeek-V3 tech report, arXiv:2412.19437 §2.1.2)
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    mlp_layer_types: tuple[str, ...] = ()
    # RoPE
    rope_theta: float = 10000.0
    rope_scaling: YarnScaling | None = None
    max_position_embeddings: int = 4096
    # misc
    rms_norm_eps: float = 1e-6
    num_nextn_predict_layers: int = 0
    index_share_for_mtp_iteration: bool = False  # GLM-5.x: MTP draft steps >= 1 reuse step 0's top-k (mtp.py)
    tie_word_embeddings: bool = False
    # reference numerics of the indexer (not HF fields; module docstring)
    indexer_fp8: bool = True
    numerics: Numerics = "vllm"

    # ---- derived -------------------------------------------------------------------------------------------------
    @property
    def indexer_hadamard(self) -> bool:
        """Whether the indexer Hadamard-rotates q and k before FP8 (``numerics == "official"``)."""
        return self.numerics == "official"

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """MLA softmax scale ``qk_head_dim^-0.5 · mscale²`` (mscale from ``mscale_all_dim``; vLLM
        ``DeepseekV2MLAAttention.__init__``, DeepSeek-V3.2-Exp ``MLA.__init__``)."""
        scale = self.qk_head_dim**-0.5
        if self.rope_scaling is not None:
            m = yarn_get_mscale(self.rope_scaling.factor, self.rope_scaling.mscale_all_dim)
            scale = scale * m * m
        return scale

    def is_moe_layer(self, layer_idx: int) -> bool:
        """Whether decoder layer ``layer_idx`` (MTP layers included) uses the MoE block instead of the dense MLP."""
        if layer_idx >= self.num_hidden_layers:  # MTP layers are MoE whenever the model has experts
            return self.n_routed_experts > 0
        return self.mlp_layer_types[layer_idx] == "sparse"

    def indexer_type(self, layer_idx: int) -> IndexerType:
        """``"full"`` (runs its own indexer) or ``"shared"`` (reuses the previous full layer's top-k).
        MTP layers always run a full indexer (vLLM ``DeepseekV2MLAAttention``: ``is_mtp_layer``)."""
        if layer_idx >= self.num_hidden_layers:
            return "full"
        return self.indexer_types[layer_idx]

    # ---- construction --------------------------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], **overrides: Any) -> "DsaConfig":
        """Read an HF ``config.json`` dict of a ``deepseek_v32`` or ``glm_moe_dsa`` model.

        ``overrides`` replace fields after parsing (e.g. ``index_topk=64``, ``indexer_fp8=False``); they are validated
        too.

        Raises:
            ValueError: a required field is missing, a field has an unsupported value, or fields are inconsistent;
                the message names the field.
        """
        model_type = hf.get("model_type")
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type: expected one of {MODEL_TYPES}, got {model_type!r}")

        def req(name: str) -> Any:
            if hf.get(name) is None:
                raise ValueError(f"{name}: required field missing from the {model_type} config")
            return hf[name]

        hidden_act = hf.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise ValueError(f"hidden_act: only 'silu' is supported, got {hidden_act!r}")
        num_layers = int(req("num_hidden_layers"))
        n_heads = int(req("num_attention_heads"))
        if hf.get("num_key_value_heads") not in (None, n_heads):
            raise ValueError("num_key_value_heads: MLA needs num_key_value_heads == num_attention_heads")
        n_routed = int(hf.get("n_routed_experts") or 0)
        first_k_dense = int(hf.get("first_k_dense_replace", 0 if n_routed == 0 else 3))
        rope_theta, rope_scaling = _parse_rope(hf)

        fields: dict[str, Any] = dict(
            model_type=model_type,
            vocab_size=int(req("vocab_size")),
            hidden_size=int(req("hidden_size")),
            intermediate_size=int(req("intermediate_size")),
            num_hidden_layers=num_layers,
            num_attention_heads=n_heads,
            q_lora_rank=int(req("q_lora_rank")),
            kv_lora_rank=int(req("kv_lora_rank")),
            qk_nope_head_dim=int(req("qk_nope_head_dim")),
            qk_rope_head_dim=int(req("qk_rope_head_dim")),
            v_head_dim=int(req("v_head_dim")),
            index_n_heads=int(req("index_n_heads")),
            index_head_dim=int(req("index_head_dim")),
            index_topk=int(req("index_topk")),
            indexer_types=_parse_indexer_types(hf, num_layers),
            indexer_rope_interleave=bool(hf.get("indexer_rope_interleave", False)),
            rope_interleave=bool(hf.get("rope_interleave", True)),
            n_routed_experts=n_routed,
            n_shared_experts=int(hf.get("n_shared_experts") or 0),
            num_experts_per_tok=int(req("num_experts_per_tok")) if n_routed else 0,
            moe_intermediate_size=int(req("moe_intermediate_size")) if n_routed else 0,
            n_group=int(hf.get("n_group") or 1),
            topk_group=int(hf.get("topk_group") or 1),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
            norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
            scoring_func=str(hf.get("scoring_func", "sigmoid")),
            topk_method=str(hf.get("topk_method", "noaux_tc")),
            mlp_layer_types=_parse_mlp_layer_types(hf, num_layers, n_routed, first_k_dense),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            num_nextn_predict_layers=int(hf.get("num_nextn_predict_layers") or 0),
            index_share_for_mtp_iteration=bool(hf.get("index_share_for_mtp_iteration", False)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )
        fields.update(overrides)
        return cls(**fields).validated()

    def replace(self, **changes: Any) -> "DsaConfig":
        """A copy with ``changes`` applied, validated."""
        return dataclasses.replace(self, **changes).validated()

    def validated(self) -> "DsaConfig":
        """Return ``self`` after consistency checks. Raises ``ValueError`` naming the offending field."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "index_n_heads",
                     "index_head_dim", "index_topk"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type: expected one of {MODEL_TYPES}, got {self.model_type!r}")
        if self.qk_rope_head_dim <= 0 or self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim: must be a positive even number, got {self.qk_rope_head_dim}")
        if self.index_head_dim < self.qk_rope_head_dim:
            raise ValueError("index_head_dim: must be >= qk_rope_head_dim (the indexer ropes its first rope dims)")
        if self.numerics not in NUMERICS:
            raise ValueError(f"numerics: expected one of {NUMERICS}, got {self.numerics!r}")
        if self.indexer_hadamard and self.index_head_dim & (self.index_head_dim - 1):
            raise ValueError("index_head_dim: the Hadamard rotation needs a power of two")
        if len(self.indexer_types) != self.num_hidden_layers:
            raise ValueError(f"indexer_types: expected {self.num_hidden_layers} entries, got {len(self.indexer_types)}")
        if any(t not in ("full", "shared") for t in self.indexer_types):
            raise ValueError(f"indexer_types: entries must be 'full' or 'shared', got {self.indexer_types}")
        if self.indexer_types and self.indexer_types[0] != "full":
            raise ValueError("indexer_types: the first layer must be 'full' (a shared layer reuses an earlier one)")
        if len(self.mlp_layer_types) != self.num_hidden_layers:
            raise ValueError(f"mlp_layer_types: expected {self.num_hidden_layers} entries")
        if any(t not in ("dense", "sparse") for t in self.mlp_layer_types):
            raise ValueError(f"mlp_layer_types: entries must be 'dense' or 'sparse', got {self.mlp_layer_types}")
        if "sparse" in self.mlp_layer_types and self.n_routed_experts <= 0:
            raise ValueError("n_routed_experts: MoE layers need n_routed_experts > 0")
        if self.n_routed_experts:
            if self.scoring_func not in ("sigmoid", "softmax"):
                raise ValueError(f"scoring_func: expected 'sigmoid' or 'softmax', got {self.scoring_func!r}")
            if self.topk_method != "noaux_tc":
                raise ValueError(f"topk_method: only 'noaux_tc' is implemented, got {self.topk_method!r}")
            if self.n_group <= 0 or self.n_routed_experts % self.n_group:
                raise ValueError(f"n_group: must divide n_routed_experts={self.n_routed_experts}, got {self.n_group}")
            if not 1 <= self.topk_group <= self.n_group:
                raise ValueError(f"topk_group: must be in [1, n_group={self.n_group}], got {self.topk_group}")
            per_group = self.n_routed_experts // self.n_group
            if self.n_group > 1 and per_group < 2:
                raise ValueError("n_group: noaux_tc group scores sum the top-2 experts, so groups need >= 2 experts")
            if not 1 <= self.num_experts_per_tok <= self.topk_group * per_group:
                raise ValueError("num_experts_per_tok: must be in [1, topk_group * experts per group]")
            if self.moe_intermediate_size <= 0:
                raise ValueError("moe_intermediate_size: must be > 0 for a model with experts")
        if self.rope_scaling is not None and self.rope_scaling.factor <= 0:
            raise ValueError("rope_scaling.factor: must be > 0")
        if self.num_nextn_predict_layers < 0:
            raise ValueError("num_nextn_predict_layers: must be >= 0")
        return self

    def to_hf_config(self) -> dict[str, Any]:
        """An HF ``config.json`` dict for this model that ``from_hf_config`` reads back unchanged (the reference-only
        ``indexer_fp8``/``numerics`` excepted) and that vLLM's ``DeepseekV32ForCausalLM`` /
        ``GlmMoeDsaForCausalLM`` loaders accept. MLP layer kinds are written as ``first_k_dense_replace`` (what vLLM
        reads), so they must be a dense prefix; shared top-k layers are written both as ``indexer_types``
        (transformers) and ``index_topk_pattern`` (vLLM). Raises ValueError if the MLP layout is not a dense prefix."""
        n_dense = self.mlp_layer_types.count("dense")
        if self.mlp_layer_types != ("dense",) * n_dense + ("sparse",) * (self.num_hidden_layers - n_dense):
            raise ValueError("mlp_layer_types: only a dense prefix followed by MoE layers can be written for vLLM")
        arch = {"deepseek_v32": "DeepseekV32ForCausalLM", "glm_moe_dsa": "GlmMoeDsaForCausalLM"}[self.model_type]
        hf: dict[str, Any] = {
            "architectures": [arch], "model_type": self.model_type, "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads, "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank, "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim, "qk_head_dim": self.qk_head_dim,
            "head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim, "index_n_heads": self.index_n_heads, "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk, "indexer_types": list(self.indexer_types),
            "indexer_rope_interleave": self.indexer_rope_interleave, "rope_interleave": self.rope_interleave,
            "n_routed_experts": self.n_routed_experts or None, "n_shared_experts": self.n_shared_experts,
            "num_experts_per_tok": self.num_experts_per_tok, "moe_intermediate_size": self.moe_intermediate_size,
            "n_group": self.n_group, "topk_group": self.topk_group, "routed_scaling_factor": self.routed_scaling_factor,
            "norm_topk_prob": self.norm_topk_prob, "scoring_func": self.scoring_func, "topk_method": self.topk_method,
            "first_k_dense_replace": n_dense, "moe_layer_freq": 1, "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings, "rms_norm_eps": self.rms_norm_eps,
            "num_nextn_predict_layers": self.num_nextn_predict_layers, "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1,
        }
        if self.index_share_for_mtp_iteration:
            hf["index_share_for_mtp_iteration"] = True
        if "shared" in self.indexer_types:
            hf["index_topk_pattern"] = "".join("F" if t == "full" else "S" for t in self.indexer_types)
        if self.rope_scaling is None:
            hf["rope_theta"] = self.rope_theta
            hf["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}
        else:
            y = self.rope_scaling
            hf["rope_theta"] = self.rope_theta
            hf["rope_scaling"] = {"type": "yarn", "factor": y.factor, "beta_fast": y.beta_fast,
                                  "beta_slow": y.beta_slow, "mscale": y.mscale, "mscale_all_dim": y.mscale_all_dim,
                                  "original_max_position_embeddings": y.original_max_position_embeddings}
        return hf

    @classmethod
    def tiny(cls, model_type: str = "deepseek_v32", **overrides: Any) -> "DsaConfig":
        """A CPU-test preset with the real MLA cache geometry (kv_lora_rank 512, rope 64 → 656 B fp8_ds_mla rows,
        index_head_dim 128 → 132 B indexer rows), 16 index heads (with 4, exact-zero ReLU scores tie often and top-k
        ties rather than numerics decide comparisons with other implementations), ``index_topk`` 64, 3 layers
        (1 dense + 2 MoE: 16 experts in 4 groups, 2 groups selectable, 3 experts per token, so the group limit binds)
        and 1 MTP layer. ``glm_moe_dsa`` gives the GLM flavour: interleaved indexer RoPE, plain RoPE and a
        shared-top-k layer."""
        hf = {
            "model_type": model_type,
            "vocab_size": 512,
            "hidden_size": 128,
            "intermediate_size": 256,
            "moe_intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "q_lora_rank": 96,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 64,
            "v_head_dim": 32,
            "index_n_heads": 16,
            "index_head_dim": 128,
            "index_topk": 64,
            "n_routed_experts": 16,
            "n_shared_experts": 1,
            "num_experts_per_tok": 3,
            "n_group": 4,
            "topk_group": 2,
            "routed_scaling_factor": 2.5,
            "norm_topk_prob": True,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "first_k_dense_replace": 1,
            "num_nextn_predict_layers": 1,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096,
        }
        if model_type == "deepseek_v32":
            hf["rope_theta"] = 10000.0
            hf["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
        else:
            hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0}
            hf["indexer_rope_interleave"] = True
            hf["rope_interleave"] = True
            hf["indexer_types"] = ["full", "full", "shared"]
        return cls.from_hf_config(hf, **overrides)


def yarn_get_mscale(scale: float, mscale: float) -> float:
    """YaRN attention temperature ``0.1 · mscale · ln(scale) + 1`` (1 when ``scale <= 1``); vLLM
    ``deepseek_scaling_rope.yarn_get_mscale``, DeepSeek-V3.2-Exp ``MLA.__init__``."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _parse_rope(hf: dict[str, Any]) -> tuple[float, YarnScaling | None]:
    """``rope_scaling`` (legacy, DeepSeek) or ``rope_parameters`` (transformers v5, GLM) → (theta, YaRN or None)."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or None
    if scaling is None and params.get("rope_type", params.get("type", "default")) not in ("default", None):
        scaling = params
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if theta is None or float(theta) <= 0:
        raise ValueError(f"rope_theta: must be > 0, got {theta!r}")
    if scaling is None:
        return float(theta), None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return float(theta), None
    if kind not in ("yarn", "deepseek_yarn"):
        raise ValueError(f"rope_scaling.type: only 'yarn' (or 'default') is supported, got {kind!r}")
    for name in ("factor", "original_max_position_embeddings"):
        if scaling.get(name) is None:
            raise ValueError(f"rope_scaling.{name}: required for YaRN")
    if scaling.get("attention_factor") == 1.0:
        # vLLM maps attention_factor == 1.0 to 'deepseek_llama_scaling', a different formula
        raise ValueError("rope_scaling.attention_factor: 1.0 (deepseek_llama_scaling) is not supported")
    return float(theta), YarnScaling(
        factor=float(scaling["factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        beta_fast=float(scaling.get("beta_fast", 32)),
        beta_slow=float(scaling.get("beta_slow", 1)),
        mscale=float(scaling.get("mscale", 1.0)),
        mscale_all_dim=float(scaling.get("mscale_all_dim", 0.0)),
    )


def _parse_indexer_types(hf: dict[str, Any], num_layers: int) -> tuple[IndexerType, ...]:
    """Per-layer indexer mode. Precedence as in transformers ``GlmMoeDsaConfig.__post_init__``: ``indexer_types``,
    then ``index_topk_pattern`` ("F"/"S" string or list), then ``index_topk_freq`` / ``index_skip_topk_offset``
    (layer i is full iff ``max(i - offset + 1, 0) % freq == 0``; same formula in vLLM ``DeepseekV2MLAAttention``)."""
    if hf.get("indexer_types") is not None:
        return tuple(hf["indexer_types"])
    pattern = hf.get("index_topk_pattern")
    if pattern is not None:
        mapping = {"F": "full", "S": "shared"}
        try:
            types = tuple(mapping[c] if isinstance(pattern, str) else c for c in pattern)
        except KeyError as exc:
            raise ValueError(f"index_topk_pattern: characters must be 'F' or 'S', got {pattern!r}") from exc
        if len(types) != num_layers:
            raise ValueError(f"index_topk_pattern: expected {num_layers} entries, got {len(types)}")
        return types  # type: ignore[return-value]
    freq = max(int(hf.get("index_topk_freq", 1) or 1), 1)
    offset = int(hf.get("index_skip_topk_offset", 2))
    return tuple("full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers))


def _parse_mlp_layer_types(hf: dict[str, Any], num_layers: int, n_routed: int, first_k_dense: int) -> tuple[str, ...]:
    """``mlp_layer_types`` if given, else vLLM's rule: MoE iff experts exist, ``i >= first_k_dense_replace`` and
    ``i % moe_layer_freq == 0`` (``DeepseekV2DecoderLayer.__init__``)."""
    if hf.get("mlp_layer_types") is not None:
        return tuple(hf["mlp_layer_types"])
    if first_k_dense < 0 or first_k_dense > num_layers:
        raise ValueError(f"first_k_dense_replace: must be in [0, num_hidden_layers={num_layers}], got {first_k_dense}")
    freq = int(hf.get("moe_layer_freq", 1) or 1)
    return tuple("sparse" if n_routed and i >= first_k_dense and i % freq == 0 else "dense" for i in range(num_layers))
