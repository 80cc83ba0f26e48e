"""indexer_logits, topk and sparse_mla on numpy arrays against numpy references."""

import numpy as np
from conftest import bf16_bits, bf16_value

import dsa


def test_indexer_logits_bf16(rng):
    pool = np.zeros((4, 64, 128), np.uint16)
    keys = rng.standard_normal((100, 128)).astype(np.float32)
    page_table = np.array([[2, 1, 0], [3, 0, 0]], np.int32)
    slots = np.array([2 * 64 + t for t in range(64)] + [64 + t for t in range(36)], np.int64)
    dsa.store_index_k(pool, slots, keys, 100)
    q = rng.standard_normal((2, 4, 128)).astype(np.float32)
    w = rng.standard_normal((2, 4)).astype(np.float32)
    seq = np.array([100, 0], np.int32)
    logits = np.full((2, 128), 7.0, np.float32)
    dsa.indexer_logits(q, w, page_table, seq, pool, logits)
    k_bf16 = bf16_value(bf16_bits(keys)).astype(np.float64)
    q_bf16 = bf16_value(bf16_bits(q)).astype(np.float64)
    ref = (np.maximum(q_bf16[0] @ k_bf16.T, 0) * w[0][:, None]).sum(axis=0)
    np.testing.assert_allclose(logits[0, :100], ref, rtol=1e-4, atol=1e-4)
    assert np.all(logits[0, 100:] == 7.0) and np.all(logits[1] == 7.0), "t >= seq_len untouched"


def test_indexer_logits_w_scale_is_one_float32_multiply(rng):
    pool = np.zeros((3, 64, 128), np.uint16)
    keys = rng.standard_normal((70, 128)).astype(np.float32)
    slots = np.array([64 + t for t in range(64)] + [128 + t for t in range(6)], np.int64)
    dsa.store_index_k(pool, slots, keys, 70)
    page_table = np.array([[1, 2]], np.int32)
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    w = rng.standard_normal((1, 8)).astype(np.float32)
    seq = np.array([70], np.int32)
    scale = np.float32(1.0 / np.sqrt(8 * 128))
    scaled = np.zeros((1, 70), np.float32)
    dsa.indexer_logits(q, w, page_table, seq, pool, scaled, w_scale=float(scale))
    prescaled = np.zeros((1, 70), np.float32)
    dsa.indexer_logits(q, (scale * w).astype(np.float32), page_table, seq, pool, prescaled)
    assert scaled.tobytes() == prescaled.tobytes()
    plain = np.zeros((1, 70), np.float32)
    dsa.indexer_logits(q, w, page_table, seq, pool, plain)
    assert np.count_nonzero(plain != scaled) > 35
    try:
        dsa.indexer_logits(q, w, page_table, seq, pool, plain, w_scale=float("nan"))
    except ValueError as e:
        assert "w_scale" in str(e)
    else:
        raise AssertionError("a NaN w_scale was accepted")


def test_topk_ties_and_padding(rng):
    logits = rng.standard_normal((3, 40)).astype(np.float32)
    logits[0, [3, 9, 20]] = 5.0  # a three-way tie at the top
    seq = np.array([40, 0, 5], np.int32)
    out = np.full((3, 2), 99, np.int32)
    dsa.topk(logits, seq, 2, out)
    assert list(out[0]) == [3, 9]  # ties go to the lower position; ascending order
    assert list(out[1]) == [-1, -1]
    assert list(out[2]) == sorted(np.argsort(-logits[2, :5], kind="stable")[:2])
    slots = np.zeros((3, 2), np.int64)
    table = np.array([[5, 0], [0, 0], [7, 0]], np.int32)
    dsa.topk(logits, seq, 2, out, out_slots=slots, page_table=table)
    assert list(slots[0]) == [5 * 64 + 3, 5 * 64 + 9] and list(slots[1]) == [-1, -1]


def test_sparse_mla_bf16(rng):
    pool = np.zeros((4, 64, 576), np.uint16)
    c = rng.standard_normal((5, 512)).astype(np.float32)
    rope = rng.standard_normal((5, 64)).astype(np.float32)
    slots = np.array([64, 65, 130, 131, 200], np.int64)
    dsa.store_latent_kv(pool, slots, c, rope, 5)
    heads = 16
    q = rng.standard_normal((2, heads, 576)).astype(np.float32)
    indices = np.array([[64, 130, -1, 200], [-1, -1, -1, -1]], np.int64)
    out = np.full((2, heads, 512), 3.0, np.float32)
    lse = np.zeros((2, heads), np.float32)
    scale = 576**-0.5
    dsa.sparse_mla(q, indices, pool, out, scale, lse=lse)
    kv = bf16_value(pool.reshape(-1, 576)[[64, 130, 200]]).astype(np.float64)
    qb = bf16_value(bf16_bits(q[0])).astype(np.float64)
    s = scale * (qb @ kv.T)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out[0], p @ kv[:, :512], rtol=2e-4, atol=2e-4)
    assert np.all(out[1] == 0.0) and np.all(np.isneginf(lse[1]))
