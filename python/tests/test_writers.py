"""The bound writers (dsa.IndexKWriter, dsa.LatentKVWriter) and bf16 index keys, on numpy arrays:
the same bytes and error counts as the functional stores and the CPU reference, the four rules
with n_real as an int or a device scalar, argument errors that name the argument, and a writer
that outlives the caller's own reference to its pool."""

import gc
import weakref

import numpy as np
import pytest
from conftest import bf16_bits, bf16_value

import dsa

PAGES = 6
CAP = PAGES * 64


def index_pool(layout="bf16"):
    if layout == "bf16":
        return np.zeros((PAGES, 64, 128), np.uint16)
    return np.zeros((PAGES, 8448), np.uint8)


def slot_map(rng, rows):
    """Distinct live slots, with a pad, a page-0 slot, one past capacity and a bad negative."""
    slots = rng.permutation(np.arange(64, CAP, dtype=np.int64))[:rows]
    slots[1], slots[2], slots[3], slots[4] = -1, 5, CAP + 3, -9
    return slots


@pytest.mark.parametrize("layout,ue8m0", [("bf16", False), ("fp8", False), ("fp8", True)])
@pytest.mark.parametrize("n_real", [12, 9, 0])
def test_index_k_writer_same_bytes_as_store(rng, layout, ue8m0, n_real):
    slots = slot_map(rng, 12)
    k = (rng.standard_normal((12, 128)) * 30).astype(np.float32)
    want = index_pool(layout)
    want_errors = dsa.store_index_k(want, slots, k, n_real, layout=layout, ue8m0=ue8m0)
    for n in (n_real, np.array([n_real], np.int32)):  # a Python int, and a device scalar
        got = index_pool(layout)
        writer = dsa.IndexKWriter(got, layout=layout, ue8m0=ue8m0)
        errors = writer(slots, k, n)
        assert errors is writer.errors
        assert int(errors[0]) == int(want_errors[0])
        np.testing.assert_array_equal(got, want)
    # rows 3 (past capacity) and 4 (-9) are the errors, when real
    assert int(want_errors[0]) == (n_real > 3) + (n_real > 4)
    if n_real and layout == "bf16":
        assert want.reshape(-1, 128)[slots[0]].any()


def test_index_k_writer_rules_and_counter(rng):
    pool = index_pool()
    k = rng.standard_normal((7, 128)).astype(np.float32) + 3.0  # no zero bf16 values
    # rows: 0 ok | 1 pad | 2 page 0 | 3 past capacity (error) | 4 -5 (error) | 5, 6 stale tail
    slots = np.array([70, -1, 5, CAP, -5, 80, 81], dtype=np.int64)
    writer = dsa.IndexKWriter(pool)
    assert writer.layout == "bf16" and writer.pool is pool
    writer(slots, k, 5)
    assert int(writer.errors[0]) == 2
    flat = pool.reshape(-1, 128)
    np.testing.assert_array_equal(flat[70], bf16_bits(k[0]))
    assert not flat[:64].any(), "page 0 must stay zero"
    assert not flat[80].any() and not flat[81].any(), "rows >= n_real must not be written"
    assert np.count_nonzero(flat.any(axis=1)) == 1
    writer(slots, k, np.array([7], np.int32))
    assert int(writer.errors[0]) == 4, "the counter accumulates"
    np.testing.assert_array_equal(flat[81], bf16_bits(k[6]))


def test_writer_takes_the_callers_error_counter(rng):
    errors = np.array([5], np.int32)
    writer = dsa.IndexKWriter(index_pool(), errors=errors)
    assert writer.errors is errors
    writer(np.array([CAP], np.int64), np.ones((1, 128), np.float32), 1)
    assert int(errors[0]) == 6


def test_writer_incident_mode(rng):
    pool = index_pool()
    k = rng.standard_normal((3, 128)).astype(np.float32) + 3.0
    writer = dsa.IndexKWriter(pool, guard="incident")
    writer(np.array([5, -1, 90], np.int64), k, 1)  # an int n_real: the stale row still written
    flat = pool.reshape(-1, 128)
    np.testing.assert_array_equal(flat[5], bf16_bits(k[0]))  # page 0 written
    np.testing.assert_array_equal(flat[CAP - 1], bf16_bits(k[1]))  # -1 wrapped
    np.testing.assert_array_equal(flat[90], bf16_bits(k[2]))  # stale row written
    with pytest.raises(ValueError, match="fp8"):
        dsa.IndexKWriter(index_pool("fp8"), layout="fp8", guard="incident")


@pytest.mark.parametrize("layout", ["bf16", "fp8"])
def test_latent_writer_same_bytes_as_store(rng, layout):
    width, dtype = (576, np.uint16) if layout == "bf16" else (656, np.uint8)
    slots = slot_map(rng, 10)
    latent = rng.standard_normal((10, 512)).astype(np.float32)
    rope = rng.standard_normal((10, 64)).astype(np.float32)
    want = np.zeros((PAGES, 64, width), dtype)
    want_errors = dsa.store_latent_kv(want, slots, latent, rope, 8, layout=layout)
    got = np.zeros((PAGES * 64, width), dtype)
    writer = dsa.LatentKVWriter(got, layout=layout)
    writer(slots, latent, rope, 8)
    assert int(writer.errors[0]) == int(want_errors[0]) == 2
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    assert want.any()


def test_writer_keeps_the_pool_alive(rng):
    pool = index_pool()
    ref = weakref.ref(pool)
    writer = dsa.IndexKWriter(pool)
    del pool
    gc.collect()
    assert ref() is not None, "the writer must hold the pool"
    k = rng.standard_normal((2, 128)).astype(np.float32)
    writer(np.array([64, 65], np.int64), k, 2)
    np.testing.assert_array_equal(writer.pool.reshape(-1, 128)[64:66], bf16_bits(k))
    del writer
    gc.collect()
    assert ref() is None, "and let it go with the writer"


def test_writer_argument_errors(rng):
    pool = index_pool()
    with pytest.raises(ValueError, match="'pool' needs dim 2 = 128"):
        dsa.IndexKWriter(np.zeros((PAGES, 64, 64), np.uint16))
    with pytest.raises(TypeError, match="'pool' must be uint8 for an fp8 pool"):
        dsa.IndexKWriter(pool, layout="fp8")
    with pytest.raises(ValueError, match="'layout' must be"):
        dsa.IndexKWriter(pool, layout="fp4")
    with pytest.raises(TypeError, match="'errors' must be int32"):
        dsa.IndexKWriter(pool, errors=np.zeros(1, np.int64))
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        dsa.IndexKWriter(pool, "fp8")  # layout is keyword-only
    writer = dsa.IndexKWriter(pool)
    slots = np.array([64, 65], np.int64)
    k = np.ones((2, 128), np.float32)
    with pytest.raises(ValueError, match="'k' needs a last dim of 128"):
        writer(slots, np.ones((2, 64), np.float32), 2)
    with pytest.raises(ValueError, match="'k' needs at least 2 rows"):
        writer(slots, k[:1], 2)
    with pytest.raises(TypeError, match="'k' must be float32 or bfloat16 or uint16"):
        writer(slots, k.astype(np.float64), 2)
    with pytest.raises(TypeError, match="'slots' must be int64"):
        writer(slots.astype(np.int32), k, 2)
    with pytest.raises(ValueError, match=r"'n_real' must be in \[0, 2\^31\), got -1"):
        writer(slots, k, -1)
    with pytest.raises(ValueError, match=r"'n_real' must be in \[0, 2\^31\), got 2147483648"):
        writer(slots, k, 2**31)
    with pytest.raises(TypeError, match="'n_real' must be an int .* got bool"):
        writer(slots, k, True)
    with pytest.raises(TypeError, match="'n_real' must be int32"):
        writer(slots, k, np.array([2], np.int64))
    with pytest.raises(ValueError, match="'latent' needs a last dim of 512"):
        dsa.LatentKVWriter(np.zeros((PAGES, 64, 576), np.uint16))(
            slots, k, np.ones((2, 64), np.float32), 2)
    assert not pool.any(), "a refused call writes nothing"


@pytest.mark.parametrize("layout,ue8m0", [("bf16", False), ("fp8", False), ("fp8", True)])
def test_bf16_keys_are_the_bytes_of_their_f32_widening(rng, layout, ue8m0):
    """uint16 keys are bf16 bits: fp8 quantizes their exact widening, bf16 keeps them as given."""
    slots = slot_map(rng, 12)
    bits = bf16_bits((rng.standard_normal((12, 130)) * 40).astype(np.float32))
    k16 = bits[:, :128]  # a row stride of 130: strided keys
    wide = bf16_value(k16)
    want, got, bound = index_pool(layout), index_pool(layout), index_pool(layout)
    e_want = dsa.store_index_k(want, slots, wide, 10, layout=layout, ue8m0=ue8m0)
    e_got = dsa.store_index_k(got, slots, k16, 10, layout=layout, ue8m0=ue8m0)
    e_bound = dsa.IndexKWriter(bound, layout=layout, ue8m0=ue8m0)(slots, k16, 10)
    assert int(e_want[0]) == int(e_got[0]) == int(e_bound[0]) == 2
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(bound, want)
    assert want.any()


def test_bf16_pool_keeps_bf16_key_bits_as_given(rng):
    """NaN payloads, infinities and subnormals go to a bf16 pool unchanged."""
    k16 = rng.integers(0, 1 << 16, size=(3, 128), dtype=np.uint16)
    k16[0, :4] = [0x7FC1, 0xFF81, 0x7F80, 0x0001]
    pool = index_pool()
    dsa.IndexKWriter(pool)(np.array([64, -1, 70], np.int64), k16, 3)
    flat = pool.reshape(-1, 128)
    np.testing.assert_array_equal(flat[64], k16[0])
    np.testing.assert_array_equal(flat[70], k16[2])
    assert np.count_nonzero(flat.any(axis=1)) == 2
