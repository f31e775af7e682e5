"""The DSA building blocks against hand computations: RoPE layouts, Hadamard, indexer logits, top-k, sparse MLA,
and the cache byte layouts."""

from __future__ import annotations

import math

import pytest
import torch

from dsa_route.dsa import (DsaConfig, Indexer, RopeTable, YarnScaling, apply_rope, hadamard, indexer_bytes_per_token,
                           indexer_logits, latent_bytes_per_token, pack_fp8_ds_mla, pack_fp8_per_tensor,
                           pack_indexer_keys, query_form, rope_inv_freq, sparse_mla, sparse_mla_mha, topk_indices,
                           unpack_fp8_ds_mla, unpack_fp8_per_tensor, unpack_indexer_keys)
from dsa_route.dsa.kv_cache import LayerCache, indexer_rows_to_paged_block
from dsa_route.dsa.sparse_mla import absorb_query, dense_mla, split_kv_b, unabsorb_output


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- RoPE ------------------------------------------------------------------------------------------------------------
def test_apply_rope_hand_computed():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    table = RopeTable(4, 100.0, None)  # inv_freq = [1, 0.1]
    cos, sin = table.cos_sin(torch.tensor([3]))
    a, b = 3.0, 0.3
    half = [1 * math.cos(a) - 3 * math.sin(a), 2 * math.cos(b) - 4 * math.sin(b),
            3 * math.cos(a) + 1 * math.sin(a), 4 * math.cos(b) + 2 * math.sin(b)]  # pairs (x0,x2), (x1,x3)
    inter = [1 * math.cos(a) - 2 * math.sin(a), 2 * math.cos(a) + 1 * math.sin(a),
             3 * math.cos(b) - 4 * math.sin(b), 4 * math.cos(b) + 3 * math.sin(b)]  # pairs (x0,x1), (x2,x3)
    torch.testing.assert_close(apply_rope(x, cos, sin, interleaved=False), torch.tensor([half]))
    torch.testing.assert_close(apply_rope(x, cos, sin, interleaved=True), torch.tensor([inter]))


def test_yarn_inv_freq_hand_computed():
    dim, theta, factor, orig = 64, 10000.0, 40.0, 4096
    got = rope_inv_freq(dim, theta, YarnScaling(factor=factor, original_max_position_embeddings=orig))

    def corr(rot):  # DeepSeek-V3.2-Exp find_correction_dim
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), dim - 1)
    for i in range(dim // 2):
        f = theta ** (-2 * i / dim)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        assert got[i].item() == pytest.approx(f / factor * ramp + f * (1 - ramp), rel=1e-6)
    assert got[0].item() == pytest.approx(1.0) and got[-1].item() == pytest.approx(theta ** (-62 / 64) / factor)


def _hand_rotate(v: list[float], pos: int, theta: float, interleaved: bool) -> list[float]:
    R = len(v)
    out = list(v)
    for i in range(R // 2):
        ang = pos * theta ** (-2 * i / R)
        j, k = (2 * i, 2 * i + 1) if interleaved else (i, i + R // 2)
        out[j] = v[j] * math.cos(ang) - v[k] * math.sin(ang)
        out[k] = v[k] * math.cos(ang) + v[j] * math.sin(ang)
    return out


@pytest.mark.parametrize("model_type, interleaved", [("deepseek_v32", False), ("glm_moe_dsa", True)])
def test_indexer_rope_layout_per_family(model_type, interleaved):
    cfg = DsaConfig.tiny(model_type, indexer_fp8=False, rope_scaling=None)
    assert cfg.indexer_rope_interleave is interleaved
    torch.manual_seed(0)
    idx = Indexer(cfg)
    positions = torch.tensor([[5, 17]])
    x, q_latent = torch.randn(1, 2, cfg.hidden_size), torch.randn(1, 2, cfg.q_lora_rank)
    cos, sin = RopeTable.for_config(cfg).cos_sin(positions)
    proj = idx(x, q_latent, cos, sin)
    R = cfg.qk_rope_head_dim
    k_raw = torch.nn.functional.layer_norm(idx.wk(x), (cfg.index_head_dim,), idx.k_norm.weight, idx.k_norm.bias, 1e-6)
    q_raw = idx.wq_b(q_latent).view(1, 2, cfg.index_n_heads, cfg.index_head_dim)
    for s, pos in enumerate([5, 17]):
        for got, raw in ((proj.k[0, s], k_raw[0, s]), (proj.q[0, s, 1], q_raw[0, s, 1])):
            want = _hand_rotate(raw[:R].tolist(), pos, cfg.rope_theta, interleaved) + raw[R:].tolist()
            other = _hand_rotate(raw[:R].tolist(), pos, cfg.rope_theta, not interleaved) + raw[R:].tolist()
            torch.testing.assert_close(got, torch.tensor(want), atol=1e-5, rtol=1e-5)
            assert (got - torch.tensor(other)).abs().max() > 1e-2  # the other layout is really different


# ---- Hadamard --------------------------------------------------------------------------------------------------------
def _indexer_logits_for(cfg: DsaConfig, state: dict | None = None, S: int = 12):
    torch.manual_seed(0)
    idx = Indexer(cfg)
    if state is not None:
        idx.load_state_dict(state)
    x = torch.randn(1, S, cfg.hidden_size, generator=_gen(1))
    q_latent = torch.randn(1, S, cfg.q_lora_rank, generator=_gen(2))
    positions = torch.arange(S)[None]
    cos, sin = RopeTable.for_config(cfg).cos_sin(positions)
    p = idx(x, q_latent, cos, sin)
    return idx, p, indexer_logits(p.q[0], p.k[0], p.weights[0], positions[0] + 1)


def test_hadamard_on_both_sides_leaves_logits_unchanged():
    plain_cfg = DsaConfig.tiny(indexer_fp8=False)
    idx, plain, logits = _indexer_logits_for(plain_cfg)
    _, rotated, logits_h = _indexer_logits_for(plain_cfg.replace(numerics="official"), idx.state_dict())
    assert (rotated.k - plain.k).abs().max() > 0.1 and (rotated.q - plain.q).abs().max() > 0.1  # it did rotate
    finite = torch.isfinite(logits)
    assert torch.equal(finite, torch.isfinite(logits_h))
    torch.testing.assert_close(logits_h[finite], logits[finite], atol=1e-5, rtol=1e-5)
    # one side only (the bug to guard against): the scores change substantially
    one_sided = indexer_logits(hadamard(plain.q[0]), plain.k[0], plain.weights[0], torch.arange(12) + 1)
    rel = (one_sided[finite] - logits[finite]).norm() / logits[finite].norm()
    assert rel > 0.1
    h = hadamard(torch.eye(128))
    torch.testing.assert_close(h @ h.T, torch.eye(128), atol=1e-6, rtol=0)


def test_numerics_vllm_and_official_differ_only_through_fp8():
    vllm = DsaConfig.tiny()
    assert vllm.numerics == "vllm" and not vllm.indexer_hadamard
    official = vllm.replace(numerics="official")
    assert official.indexer_hadamard
    idx, _, lv = _indexer_logits_for(vllm, S=48)
    lo = _indexer_logits_for(official, idx.state_dict(), S=48)[2]
    exact = _indexer_logits_for(vllm.replace(indexer_fp8=False), idx.state_dict(), S=48)[2]
    finite = torch.isfinite(exact)
    for got in (lv, lo):  # both quantize: close to the unquantized scores, not equal to them
        rel = float((got[finite] - exact[finite]).norm() / exact[finite].norm())
        assert 0 < rel < 0.1
    assert not torch.equal(lv, lo)  # the rotation changes the fp8 error
    lo_exact = _indexer_logits_for(official.replace(indexer_fp8=False), idx.state_dict(), S=48)[2]
    torch.testing.assert_close(lo_exact[finite], exact[finite], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="numerics"):
        vllm.replace(numerics="sglang")


# ---- indexer logits and top-k ----------------------------------------------------------------------------------------
def test_indexer_logits_formula_and_masks():
    S, T, H, I = 4, 6, 3, 8
    q, k = torch.randn(S, H, I, generator=_gen(0)), torch.randn(T, I, generator=_gen(1))
    w = torch.randn(S, H, generator=_gen(2))
    key_end, key_start = torch.tensor([1, 3, 6, 5]), torch.tensor([0, 1, 2, 0])
    got = indexer_logits(q, k, w, key_end, key_start)
    for s in range(S):
        for t in range(T):
            if key_start[s] <= t < key_end[s]:
                want = sum(w[s, h].item() * max((q[s, h] @ k[t]).item(), 0.0) for h in range(H))
                assert got[s, t].item() == pytest.approx(want, rel=1e-5, abs=1e-5)
            else:
                assert got[s, t].item() == float("-inf")


def test_topk_padding_ties_and_set():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0],
                           [0.5, float("-inf"), float("-inf"), float("-inf"), float("-inf")],
                           [float("-inf")] * 5])
    got = topk_indices(logits, 2)
    assert got.dtype == torch.int32 and got.shape == (3, 2)
    assert got[0].tolist() == [1, 2]  # three-way tie at 3.0: the lower indices win
    assert got[1].tolist() == [0, -1] and got[2].tolist() == [-1, -1]
    assert topk_indices(logits, 8).shape == (3, 8)  # fixed width even when T < topk
    # random rows: the selected set is exactly the brute-force top-min(k, valid) set
    S, T, K = 16, 40, 10
    scores = torch.randn(S, T, generator=_gen(3))
    key_end = torch.randint(1, T + 1, (S,), generator=_gen(4))
    scores = scores.masked_fill(torch.arange(T)[None] >= key_end[:, None], float("-inf"))
    sel = topk_indices(scores, K)
    for s in range(S):
        valid = int(key_end[s])
        brute = sorted(range(valid), key=lambda t: (-scores[s, t].item(), t))[: min(K, valid)]
        row = sel[s].tolist()
        assert set(row[: min(K, valid)]) == set(brute) and row[min(K, valid):] == [-1] * (K - min(K, valid))


# ---- sparse MLA ------------------------------------------------------------------------------------------------------
def _mla_case(seed: int = 0):
    S, T, H, N, R, L, V, K = 6, 30, 4, 16, 64, 512, 16, 8
    g = _gen(seed)
    q_nope, q_pe = torch.randn(S, H, N, generator=g), torch.randn(S, H, R, generator=g)
    kv = torch.randn(T, L + R, generator=g)
    w_uk, w_uv = split_kv_b(torch.randn(H * (N + V), L, generator=g) * L**-0.5, H, N, V)
    indices = torch.full((S, K), -1, dtype=torch.int32)
    for s in range(S):  # random subsets avoiding slot 0; fewer than K for early rows, none for the last row
        valid = min(K, 3 * s + 1) if s < S - 1 else 0
        indices[s, :valid] = (torch.randperm(T - 1, generator=g)[:valid] + 1).to(torch.int32)
    return q_nope, q_pe, kv, w_uk, w_uv, indices


def test_absorbed_and_non_absorbed_sparse_mla_agree():
    q_nope, q_pe, kv, w_uk, w_uv, indices = _mla_case()
    scale = 0.1
    absorbed = unabsorb_output(sparse_mla(absorb_query(q_nope, q_pe, w_uk), kv, indices, scale, 512), w_uv)
    mha = sparse_mla_mha(q_nope, q_pe, kv, indices, w_uk, w_uv, scale)
    torch.testing.assert_close(absorbed, mha, atol=1e-4, rtol=1e-4)
    assert absorbed.abs().max() > 0.1
    assert torch.equal(absorbed[-1], torch.zeros_like(absorbed[-1]))  # a row with no index attends to nothing
    # selecting every causal key reproduces dense attention
    T = kv.shape[0]
    all_idx = torch.arange(T, dtype=torch.int32).expand(6, T).clone()
    key_end = torch.tensor([5, 9, 13, 20, 27, 30])
    all_idx[torch.arange(T)[None] >= key_end[:, None]] = -1
    dense = dense_mla(q_nope, q_pe, kv, key_end, w_uk, w_uv, scale)
    got = sparse_mla_mha(q_nope, q_pe, kv, all_idx, w_uk, w_uv, scale)
    torch.testing.assert_close(got, dense, atol=1e-4, rtol=1e-4)


def test_padding_never_reads_a_cache_slot():
    q_nope, q_pe, kv, w_uk, w_uv, indices = _mla_case(1)
    q = absorb_query(q_nope, q_pe, w_uk)
    clean = sparse_mla(q, kv, indices, 0.1, 512)
    used = torch.zeros(kv.shape[0], dtype=torch.bool)
    used[indices[indices >= 0].long()] = True
    assert not used[0]  # slot 0 (where a clamped -1 would read) is among the poisoned ones
    poisoned = kv.clone()
    poisoned[~used] = float("nan")
    out = sparse_mla(q, poisoned, indices, 0.1, 512)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, clean, atol=0, rtol=0)
    mha = sparse_mla_mha(q_nope, q_pe, poisoned, indices, w_uk, w_uv, 0.1)
    assert torch.isfinite(mha).all()


# ---- cache layouts ---------------------------------------------------------------------------------------------------
def _is_pow2(x: torch.Tensor) -> bool:
    return bool(torch.all(torch.log2(x) == torch.round(torch.log2(x))))


def test_fp8_ds_mla_layout_and_round_trip():
    T = 9
    g = _gen(5)
    tile_mag = torch.tensor([1e-2, 1.0, 30.0, 400.0]).repeat_interleave(128)  # very different tile ranges
    latent, rope = torch.randn(T, 512, generator=g) * tile_mag, torch.randn(T, 64, generator=g)
    packed = pack_fp8_ds_mla(latent, rope)
    assert packed.dtype == torch.uint8 and packed.shape == (T, 656)
    assert latent_bytes_per_token("fp8_ds_mla", 512, 64) == 656
    scales = packed[:, 512:528].contiguous().view(torch.float32)  # 4 float32 tile scales after the 512 fp8 bytes
    assert scales.shape == (T, 4) and _is_pow2(scales)
    assert torch.equal(packed[:, 528:].contiguous().view(torch.bfloat16), rope.to(torch.bfloat16))  # bf16 rope tail
    values = packed[:, :512].view(torch.float8_e4m3fn).float().view(T, 4, 128)
    lat2, rope2 = unpack_fp8_ds_mla(packed)
    torch.testing.assert_close(lat2.view(T, 4, 128), values * scales[..., None], atol=0, rtol=0)
    err = (lat2 - latent).view(T, 4, 128).abs().amax(-1) / latent.view(T, 4, 128).abs().amax(-1)
    assert err.max() <= 2**-4
    assert torch.equal(rope2, rope.to(torch.bfloat16))


def test_indexer_cache_layout_and_round_trip():
    k = torch.randn(7, 128, generator=_gen(6)) * torch.tensor([0.01, 1, 5, 100, 0.3, 2, 9])[:, None]
    packed = pack_indexer_keys(k)
    assert packed.shape == (7, 132) == (7, indexer_bytes_per_token(128))
    scales = packed[:, 128:].contiguous().view(torch.float32)
    assert scales.shape == (7, 1) and _is_pow2(scales)
    k2 = unpack_indexer_keys(packed, 128)
    err = (k2 - k).abs().amax(-1) / k.abs().amax(-1)
    assert err.max() <= 2**-4
    page = indexer_rows_to_paged_block(packed, 128)  # vLLM page: all values, then all scales
    assert torch.equal(page[: 7 * 128].view(7, 128), packed[:, :128])
    assert torch.equal(page[7 * 128:].view(7, 4), packed[:, 128:])
    assert indexer_bytes_per_token(64) == 68


def test_per_tensor_fp8_and_bf16_sizes():
    latent, rope = torch.randn(3, 512, generator=_gen(7)), torch.randn(3, 64, generator=_gen(8))
    packed = pack_fp8_per_tensor(latent, rope, 0.5)
    assert packed.shape == (3, 576) and latent_bytes_per_token("fp8", 512, 64) == 576
    back = unpack_fp8_per_tensor(packed, 0.5)
    assert ((back - torch.cat((latent, rope), -1)).abs() <= 2**-4 * torch.cat((latent, rope), -1).abs() + 2**-9).all()
    assert latent_bytes_per_token("bfloat16", 512, 64) == 1152 == latent_bytes_per_token("auto", 512, 64)


@pytest.mark.parametrize("dtype, supports, fp8_query, needs_view", [
    ("auto", True, False, False), ("bfloat16", True, False, False), ("fp8", False, False, True),
    ("fp8", True, True, True), ("fp8_e4m3", True, True, True), ("fp8_ds_mla", False, False, False),
    ("fp8_ds_mla", True, True, False),
])
def test_query_form_selection(dtype, supports, fp8_query, needs_view):
    form = query_form(dtype, supports)
    assert (form.fp8_query, form.fp8_kv_needs_view) == (fp8_query, needs_view)


def test_query_form_unknown_dtype():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        query_form("int8", False)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "fp8", "fp8_ds_mla"])
def test_layer_cache_reads_back_what_it_wrote(kv_cache_dtype):
    cfg = DsaConfig.tiny()
    cache = LayerCache(cfg, 1, 8, kv_cache_dtype, torch.float32, "cpu", has_indexer=True)
    assert cache.latent.shape[-1] * cache.latent.element_size() == latent_bytes_per_token(
        kv_cache_dtype, 512, 64, torch.float32)
    assert cache.index_keys.shape[-1] == 132
    latent, rope = torch.randn(3, 512, generator=_gen(9)), torch.randn(3, 64, generator=_gen(10))
    cache.write(0, torch.tensor([4, 5, 6]), latent, rope)
    rows = cache.read(0, 7, query_form(kv_cache_dtype, False))[4:]
    want = torch.cat((latent, rope), -1)
    tol = 0 if kv_cache_dtype == "auto" else 2**-4 * want.abs().amax()
    assert (rows - want).abs().max() <= tol
    with pytest.raises(ValueError, match="positions"):
        cache.write(0, torch.tensor([8]), latent[:1], rope[:1])
