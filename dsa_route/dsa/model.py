"""DsaForCausalLM: the whole DeepSeek-V3.2 / GLM-5 model, HF checkpoint names, caches, greedy and MTP generation.

Shape legend: B batch rows, S tokens, D hidden, V vocab.

Module tree (state_dict keys == HF checkpoint names, so vLLM and this reference load the same safetensors):
    model.embed_tokens                     Embedding [V, D]
    model.layers.{0..n-1}                  DecoderLayer (self_attn.{..., indexer.*}, mlp.*, *_layernorm)
    model.layers.{n..n+m-1}                MTPLayer (the same, plus enorm, hnorm, eh_proj, shared_head.*, embed_tokens)
    model.norm                             RMSNorm
    lm_head                                Linear [V, D]
with n = num_hidden_layers, m = num_nextn_predict_layers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .attention import AttentionInputs
from .block import DecoderLayer
from .config import DsaConfig
from .kv_cache import DsaCache
from .layers import RMSNorm
from .mtp import MTPLayer, SpecDecodeStats, speculative_generate
from .rope import RopeTable

_FP32_PARAMS = ("e_score_correction_bias",)  # stored in fp32 in checkpoints; kept fp32 whatever the model dtype


class DsaModel(nn.Module):
    """The ``model.`` prefix of HF checkpoints."""

    def __init__(self, config: DsaConfig):
        super().__init__()
        n = config.num_hidden_layers
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(config, i) for i in range(n)]
                                    + [MTPLayer(config, n + j) for j in range(config.num_nextn_predict_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@dataclass
class LoadReport:
    """What ``load_safetensors`` did: tensors loaded, checkpoint names it ignored (with the reason)."""

    loaded: list[str] = field(default_factory=list)
    ignored: dict[str, str] = field(default_factory=dict)


class DsaForCausalLM(nn.Module):
    """DeepSeek Sparse Attention causal LM (reference implementation, CPU or CUDA, fp32 or bf16).

    Args:
        config: the model's ``DsaConfig``.
        dense_attention: attend to every causal key (dense MLA) instead of the indexer's top-k; also settable later via
            the ``dense_attention`` attribute. The indexer still fills its cache, so the switch can flip mid-sequence.
        mla_form: ``"absorbed"`` (default) or ``"mha"`` form of sparse MLA.
        dtype / device: parameter dtype and device. Weights are uninitialised: call ``init_random`` or
            ``load_safetensors`` (or build with ``random`` / ``from_pretrained``).
    """

    def __init__(self, config: DsaConfig, *, dense_attention: bool = False, mla_form: str = "absorbed",
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        super().__init__()
        if mla_form not in ("absorbed", "mha"):
            raise ValueError(f"mla_form: expected 'absorbed' or 'mha', got {mla_form!r}")
        self.config = config
        self.dense_attention = dense_attention
        self.model = DsaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope = RopeTable.for_config(config)
        for layer in self.model.layers:
            layer.self_attn.mla_form = mla_form
        self.to(device=device, dtype=dtype)
        for name, p in self.named_parameters():
            if name.endswith(_FP32_PARAMS):
                p.data = p.data.float()

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    # ---- construction ------------------------------------------------------------------------------------------------
    @classmethod
    def random(cls, config: DsaConfig, seed: int = 0, **kwargs) -> "DsaForCausalLM":
        """A model with ``init_random(seed)`` weights; ``kwargs`` go to the constructor."""
        model = cls(config, **kwargs)
        model.init_random(seed)
        return model

    @torch.no_grad()
    def init_random(self, seed: int = 0) -> "DsaForCausalLM":
        """Seeded random weights, identical on every device and dtype (drawn on CPU in fp32, in parameter order).

        Linear weights ~ N(0, 1/fan_in) (activations keep unit scale, so attention and routing matter); embeddings
        ~ N(0, 1); norm weights 1, LayerNorm bias 0; router bias ~ U(0, 0.1). Each MTP layer's ``embed_tokens`` and
        ``shared_head.head`` copy the main embedding and LM head (the DeepSeek-V3 paper shares them).
        """
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("e_score_correction_bias"):
                value = torch.rand(p.shape, generator=gen) * 0.1
            elif name.endswith("k_norm.bias"):
                value = torch.zeros(p.shape)
            elif p.ndim == 1:  # RMSNorm / LayerNorm weights
                value = torch.ones(p.shape)
            elif "embed_tokens" in name:
                value = torch.randn(p.shape, generator=gen)
            else:
                value = torch.randn(p.shape, generator=gen) * p.shape[1] ** -0.5
            p.copy_(value)
        for layer in self.mtp_layers:
            layer.embed_tokens.weight.copy_(self.model.embed_tokens.weight)
            layer.shared_head.head.weight.copy_(self.lm_head.weight)
        if self.config.tie_word_embeddings:
            self.lm_head.weight.copy_(self.model.embed_tokens.weight)
        return self

    @classmethod
    def from_pretrained(cls, path: str | Path, config: DsaConfig | None = None, **kwargs) -> "DsaForCausalLM":
        """Load ``config.json`` (unless ``config`` is given) and every ``*.safetensors`` file of directory ``path``."""
        path = Path(path)
        if config is None:
            config = DsaConfig.from_hf_config(json.loads((path / "config.json").read_text()))
        model = cls(config, **kwargs)
        model.load_safetensors(sorted(path.glob("*.safetensors")))
        return model

    @torch.no_grad()
    def load_safetensors(self, files: str | Path | list[str | Path]) -> LoadReport:
        """Load HF-named tensors from safetensors ``files``.

        Handled at this edge: ``rotary_emb.inv_freq`` (ignored), indexer weights of "shared" top-k layers (ignored, as
        vLLM does), MTP layers beyond ``num_nextn_predict_layers`` (ignored), FP8 block-quantized weights with
        ``weight_scale_inv`` (dequantized). Raises ValueError listing parameters the files do not provide (a tied
        ``lm_head`` may be absent) or tensors whose shape does not match.
        """
        from safetensors import safe_open

        if isinstance(files, (str, Path)):
            files = [files]
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    tensors[name] = fh.get_tensor(name)
        report = LoadReport()
        params = dict(self.named_parameters())
        for name in list(tensors):
            if name.endswith("weight_scale_inv"):
                continue  # consumed with its fp8 weight below
            t = tensors[name]
            if t.dtype == torch.float8_e4m3fn:
                t = _dequantize_block_fp8(t, tensors.get(name + "_scale_inv"), name)
            if name not in params:
                report.ignored[name] = ("no indexer on a shared top-k layer" if ".indexer." in name
                                        else "not a parameter of this model")
                continue
            if params[name].shape != t.shape:
                raise ValueError(f"{name}: checkpoint shape {tuple(t.shape)} != model shape "
                                 f"{tuple(params[name].shape)}")
            params[name].copy_(t.to(params[name].dtype))
            report.loaded.append(name)
        missing = sorted(set(params) - set(report.loaded))
        if self.config.tie_word_embeddings and "lm_head.weight" in missing:
            self.lm_head.weight.copy_(self.model.embed_tokens.weight)
            missing.remove("lm_head.weight")
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} parameters, e.g. {missing[:5]}")
        return report

    def save_safetensors(self, file: str | Path) -> None:
        """Write every parameter under its HF name (contiguous copies) to one safetensors ``file``."""
        from safetensors.torch import save_file

        save_file({n: p.detach().contiguous() for n, p in self.named_parameters()}, str(file))

    def save_pretrained(self, path: str | Path) -> None:
        """Write ``config.json`` (``DsaConfig.to_hf_config``, with ``torch_dtype``) and ``model.safetensors`` into
        directory ``path``: a checkpoint both ``from_pretrained`` and vLLM can load."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        hf = self.config.to_hf_config()
        hf["torch_dtype"] = str(self.dtype).removeprefix("torch.")
        (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        self.save_safetensors(path / "model.safetensors")

    # ---- forward -----------------------------------------------------------------------------------------------------
    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        return list(self.model.layers)[: self.config.num_hidden_layers]

    @property
    def mtp_layers(self) -> list[MTPLayer]:
        return list(self.model.layers)[self.config.num_hidden_layers:]

    def new_cache(self, batch_size: int, max_len: int, **kwargs) -> DsaCache:
        """A ``DsaCache`` on this model's device and dtype; ``kwargs`` as ``DsaCache`` (``kv_cache_dtype``, ...)."""
        return DsaCache(self.config, batch_size, max_len, dtype=self.dtype, device=self.device, **kwargs)

    def _inputs(self, input_ids: torch.Tensor, positions: torch.Tensor | None,
                cache: DsaCache | None) -> tuple[AttentionInputs, DsaCache]:
        B, S = input_ids.shape
        if cache is None:
            fresh = torch.arange(S, device=input_ids.device).expand(B, S)
            if positions is not None and not torch.equal(positions.to(fresh.device), fresh):
                raise ValueError("positions: without a cache they must be 0..S-1 (pass a cache to continue a sequence)")
            cache = self.new_cache(B, S, with_mtp=False)
        if positions is None:
            positions = cache.lengths[:, None] + torch.arange(S, device=input_ids.device)
        if positions.shape != (B, S):
            raise ValueError(f"positions: expected shape {(B, S)}, got {tuple(positions.shape)}")
        positions = positions.to(device=input_ids.device, dtype=torch.long)
        cos, sin = self.rope.cos_sin(positions)
        cache.lengths = torch.maximum(cache.lengths, positions.max(dim=1).values + 1)
        return AttentionInputs(positions, cos, sin, cache.form, cache.q_scale, self.dense_attention), cache

    @torch.no_grad()
    def forward_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                       cache: DsaCache | None = None) -> torch.Tensor:
        """``input_ids [B,S]`` → final-normed hidden states ``[B,S,D]`` (what vLLM hands to the MTP drafter)."""
        inp, cache = self._inputs(input_ids, positions, cache)
        h = self.model.embed_tokens(input_ids)
        shared_topk = None
        for i, layer in enumerate(self.decoder_layers):
            h, topk = layer(h, inp, cache.layers[i], shared_topk)
            if topk is not None:
                shared_topk = topk  # a "shared" layer reuses the most recent full layer's selection
        return self.model.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B,S,D]`` → fp32 logits ``[B,S,V]`` (LM head in the model dtype, then upcast)."""
        return self.lm_head(hidden).float()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                cache: DsaCache | None = None) -> torch.Tensor:
        """Logits ``fp32 [B,S,V]`` for ``input_ids [B,S]`` at ``positions [B,S]``.

        Without a cache, positions must be ``0..S-1`` (a fresh prefill). With a cache, new keys are written at slot ==
        position and each token attends causally to slots ``<= its position`` (prefill with a prefix, decode, chunked
        prefill and multi-token verify are all this one rule); ``positions=None`` continues after ``cache.lengths``.
        Raises ValueError on bad positions (shape, or outside the cache).
        """
        return self.compute_logits(self.forward_hidden(input_ids, positions, cache))

    @torch.no_grad()
    def mtp_predict(self, step: int, input_ids: torch.Tensor, positions: torch.Tensor, prev_hidden: torch.Tensor,
                    cache: DsaCache, reuse_topk: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run MTP layer ``step % num_nextn_predict_layers`` (see ``mtp.MTPLayer.predict``, also for ``reuse_topk``)
        against its cache. Returns ``(logits fp32 [B,S,V], recycled hidden [B,S,D])``."""
        j = step % self.config.num_nextn_predict_layers
        if len(cache.layers) <= self.config.num_hidden_layers + j:
            raise ValueError("cache: allocate it with with_mtp=True to run the MTP layers")
        inp, cache = self._inputs(input_ids, positions, cache)
        return self.mtp_layers[j].predict(input_ids, prev_hidden, inp, cache.layers[self.config.num_hidden_layers + j],
                                          reuse_topk)

    # ---- generation --------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *, kv_cache_dtype: str = "auto") -> torch.Tensor:
        """Greedy decoding: one prefill of ``input_ids [B,S]`` then ``max_new_tokens - 1`` single-token decode steps
        against a fresh cache. Returns the new tokens ``long [B, max_new_tokens]``."""
        B, S = input_ids.shape
        cache = self.new_cache(B, S + max_new_tokens, kv_cache_dtype=kv_cache_dtype, with_mtp=False)
        token = self.forward(input_ids, None, cache)[:, -1].argmax(dim=-1)
        out = [token]
        for _ in range(max_new_tokens - 1):
            token = self.forward(token[:, None], None, cache)[:, -1].argmax(dim=-1)
            out.append(token)
        return torch.stack(out, dim=1)

    def generate_mtp(self, input_ids: torch.Tensor, max_new_tokens: int, num_speculative_tokens: int = 1,
                     **kwargs) -> tuple[torch.Tensor, SpecDecodeStats]:
        """Greedy speculative decoding with the MTP layer(s); see ``mtp.speculative_generate``."""
        return speculative_generate(self, input_ids, max_new_tokens, num_speculative_tokens, **kwargs)


def _dequantize_block_fp8(weight: torch.Tensor, scale_inv: torch.Tensor | None, name: str) -> torch.Tensor:
    """DeepSeek FP8 checkpoints: ``weight e4m3 [O, I]`` with ``weight_scale_inv fp32 [ceil(O/128), ceil(I/128)]``
    (DeepSeek-V3 ``inference/fp8_cast_bf16.py`` / ``weight_dequant``). Raises ValueError without the scale."""
    if scale_inv is None:
        raise ValueError(f"{name}: fp8 weight without weight_scale_inv")
    O, I = weight.shape
    s = scale_inv.float().repeat_interleave(128, 0)[:O].repeat_interleave(128, 1)[:, :I]
    return weight.float() * s
