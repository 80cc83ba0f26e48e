"""The guarded writers on numpy arrays: the four store rules, the error counter, the bytes of every
layout, and the incident mode."""

import numpy as np
import pytest
from conftest import bf16_bits, bf16_value, e4m3_table

import dsa

PAGES = 4
CAP = PAGES * 64


def index_pool():
    return np.zeros((PAGES, 64, 128), dtype=np.uint16)


def test_writes_bf16_bits_of_real_rows(rng):
    pool = index_pool()
    k = rng.standard_normal((3, 128)).astype(np.float32)
    slots = np.array([64, 200, 255], dtype=np.int64)
    errors = dsa.store_index_k(pool, slots, k, 3)
    assert int(errors[0]) == 0
    flat = pool.reshape(-1, 128)
    for r, s in enumerate(slots):
        np.testing.assert_array_equal(flat[s], bf16_bits(k[r]))
    assert np.count_nonzero(flat) == np.count_nonzero(bf16_bits(k))


def test_the_four_rules_and_the_error_counter(rng):
    pool = index_pool()
    k = rng.standard_normal((7, 128)).astype(np.float32) + 3.0  # no zero bf16 values
    # rows: 0 ok | 1 pad | 2 page 0 | 3 past capacity (error) | 4 -5 (error) | 5, 6 stale tail
    slots = np.array([70, -1, 5, CAP, -5, 80, 81], dtype=np.int64)
    errors = dsa.store_index_k(pool, slots, k, np.array([5], dtype=np.int32))
    assert int(errors[0]) == 2
    flat = pool.reshape(-1, 128)
    np.testing.assert_array_equal(flat[70], bf16_bits(k[0]))
    assert not flat[:64].any(), "page 0 must stay zero"
    assert not flat[80].any() and not flat[81].any(), "rows >= n_real must not be written"
    assert not flat[CAP - 1].any(), "-1 must not wrap"
    assert np.count_nonzero(flat.any(axis=1)) == 1
    dsa.store_index_k(pool, slots, k, 5, errors=errors)
    assert int(errors[0]) == 4, "the counter accumulates"


def test_incident_mode_is_the_unguarded_scatter(rng):
    pool = index_pool()
    k = rng.standard_normal((3, 128)).astype(np.float32) + 3.0
    slots = np.array([5, -1, 90], dtype=np.int64)
    dsa.store_index_k(pool, slots, k, 1, guard="incident")
    flat = pool.reshape(-1, 128)
    np.testing.assert_array_equal(flat[5], bf16_bits(k[0]))  # page 0 written
    np.testing.assert_array_equal(flat[CAP - 1], bf16_bits(k[1]))  # -1 wrapped
    np.testing.assert_array_equal(flat[90], bf16_bits(k[2]))  # stale row written
    with pytest.raises(ValueError, match="fp8"):
        dsa.store_index_k(np.zeros((PAGES, 8448), np.uint8), slots, k, 1, layout="fp8",
                          guard="incident")


def test_flat_pool_and_strided_k(rng):
    pool = np.zeros((PAGES * 64, 128), dtype=np.uint16)
    wide = rng.standard_normal((2, 256)).astype(np.float32)
    k = wide[:, :128]  # row stride 256
    dsa.store_index_k(pool, np.array([64, 65], np.int64), k, 2)
    np.testing.assert_array_equal(pool[65], bf16_bits(wide[1, :128]))


@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_index_k_layout(rng, ue8m0):
    pool = np.zeros((PAGES, 64 * 132), dtype=np.uint8)
    k = (rng.standard_normal((2, 128)) * np.array([[1.0], [1e-6]])).astype(np.float32)
    slots = np.array([64 + 3, 2 * 64 + 63], dtype=np.int64)
    dsa.store_index_k(pool, slots, k, 2, layout="fp8", ue8m0=ue8m0)
    table = e4m3_table()
    for r, s in enumerate(slots):
        page, off = divmod(int(s), 64)
        codes = pool[page, off * 128 : off * 128 + 128]
        scale = pool[page, 8192 + off * 4 : 8192 + off * 4 + 4].view(np.float32)[0]
        exact = np.float32(max(np.abs(k[r]).max(), np.float32(1e-4)) / np.float32(448.0))
        if ue8m0:
            assert scale >= exact and np.log2(scale) == np.round(np.log2(scale))
        else:
            assert scale == exact
        q = k[r].astype(np.float64) / np.float64(scale)
        decoded = table[codes]
        # round to nearest: within half a step of e4m3 at that magnitude (3 mantissa bits)
        step = np.where(np.abs(q) < 2.0**-6, 2.0**-9, 2.0 ** (np.floor(np.log2(np.abs(q) + 1e-30)) - 3))
        assert np.all(np.abs(decoded - q) <= step / 2 + 1e-12)
    assert not pool[0].any()


def test_latent_bf16_bytes(rng):
    pool = np.zeros((PAGES, 64, 576), dtype=np.uint16)
    latent = rng.standard_normal((2, 512)).astype(np.float32)
    rope = rng.standard_normal((2, 64)).astype(np.float32)
    errors = dsa.store_latent_kv(pool, np.array([100, -1], np.int64), latent, rope, 2)
    flat = pool.reshape(-1, 576)
    np.testing.assert_array_equal(flat[100, :512], bf16_bits(latent[0]))
    np.testing.assert_array_equal(flat[100, 512:], bf16_bits(rope[0]))
    assert int(errors[0]) == 0 and np.count_nonzero(flat.any(axis=1)) == 1


def test_latent_fp8_layout(rng):
    pool = np.zeros((PAGES, 64, 656), dtype=np.uint8)
    latent = rng.standard_normal((1, 512)).astype(np.float32)
    rope = rng.standard_normal((1, 64)).astype(np.float32)
    dsa.store_latent_kv(pool, np.array([64], np.int64), latent, rope, 1, layout="fp8")
    tok = pool[1, 0]
    scales = tok[512:528].view(np.float32)
    for t in range(4):
        amax = np.abs(latent[0, t * 128 : (t + 1) * 128]).max()
        assert scales[t] == np.float32(max(amax, np.float32(1e-4)) / np.float32(448.0))
    np.testing.assert_array_equal(tok[528:656].view(np.uint16), bf16_bits(rope[0]))
    decoded = e4m3_table()[tok[:512]] * np.repeat(scales.astype(np.float64), 128)
    assert np.max(np.abs(decoded - latent[0])) <= np.max(np.abs(latent[0])) / 16


def test_bf16_values_round_trip(rng):
    pool = index_pool()
    k = rng.standard_normal((1, 128)).astype(np.float32)
    dsa.store_index_k(pool, np.array([64], np.int64), k, 1)
    assert np.max(np.abs(bf16_value(pool[1, 0]) - k[0])) <= np.max(np.abs(k)) * 2.0**-8
