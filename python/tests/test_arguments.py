"""Bad arguments are refused with TypeError/ValueError naming the argument; nothing is copied."""

import numpy as np
import pytest

import dsa


def ok_args():
    pool = np.zeros((4, 64, 128), dtype=np.uint16)
    slots = np.array([64, 65], dtype=np.int64)
    k = np.ones((2, 128), dtype=np.float32)
    return pool, slots, k


@pytest.mark.parametrize(
    "change, exc, pattern",
    [
        (lambda a: a.update(pool=[1, 2]), TypeError, "'pool' must be an array that speaks DLPack"),
        (lambda a: a.update(pool=a["pool"].astype(np.float32)), TypeError, "'pool' must be bfloat16 or uint16"),
        (lambda a: a.update(pool=np.zeros((4, 64, 64), np.uint16)), ValueError, "'pool' needs dim 2 = 128"),
        (lambda a: a.update(pool=np.zeros((8, 64, 128), np.uint16)[::2]), ValueError, "'pool' must be C-contiguous"),
        (lambda a: a.update(pool=np.zeros((1, 64, 128), np.uint16)), ValueError, "page 0 \\(reserved\\)"),
        (lambda a: a.update(pool=np.zeros((100, 128), np.uint16)), ValueError, "whole number of 64-token pages"),
        (lambda a: a.update(slots=a["slots"].astype(np.int32)), TypeError, "'slots' must be int64"),
        (lambda a: a.update(slots=np.zeros((2, 1), np.int64)), ValueError, "'slots' must have 1 dimensions"),
        (lambda a: a.update(k=a["k"].astype(np.float64)), TypeError, "'k' must be float32"),
        (lambda a: a.update(k=np.ones((2, 64), np.float32)), ValueError, "'k' needs a last dim of 128"),
        (lambda a: a.update(k=np.ones((1, 128), np.float32)), ValueError, "'k' needs at least 2 rows"),
        (lambda a: a.update(k=np.ones((128, 2), np.float32).T), ValueError, "'k' needs a last dim of 128|'k' needs packed rows"),
        (lambda a: a.update(n_real=np.array([2], np.int64)), TypeError, "'n_real' must be int32"),
        (lambda a: a.update(n_real=np.array([2, 2], np.int32)), ValueError, "'n_real' must hold exactly one int32"),
        (lambda a: a.update(n_real=True), TypeError, "'n_real'"),
        (lambda a: a.update(n_real=-1), ValueError, "'n_real' must be in"),
        (lambda a: a.update(layout="fp16"), ValueError, "'layout' must be \"bf16\" or \"fp8\""),
        (lambda a: a.update(guard="off"), ValueError, "'guard' must be"),
    ],
)
def test_store_index_k_refuses(change, exc, pattern):
    pool, slots, k = ok_args()
    args = dict(pool=pool, slots=slots, k=k, n_real=2)
    change(args)
    kw = {key: args.pop(key) for key in ("layout", "guard") if key in args}
    with pytest.raises(exc, match=pattern):
        dsa.store_index_k(args["pool"], args["slots"], args["k"], args["n_real"], **kw)


def test_misaligned_pool_is_refused():
    raw = np.zeros(4 * 64 * 128 + 8, dtype=np.uint16)
    pool = raw[1 : 1 + 4 * 64 * 128].reshape(4, 64, 128)  # 2 bytes off a 16-byte boundary
    with pytest.raises(ValueError, match="16-byte boundary"):
        dsa.store_index_k(pool, np.array([64], np.int64), np.ones((1, 128), np.float32), 1)


def test_fp8_pool_needs_its_page_bytes():
    with pytest.raises(ValueError, match="needs dim 1 = 8448"):
        dsa.store_index_k(np.zeros((4, 8192), np.uint8), np.array([64], np.int64),
                          np.ones((1, 128), np.float32), 1, layout="fp8")


def test_readonly_pool_is_refused():
    pool, slots, k = ok_args()
    pool.setflags(write=False)
    with pytest.raises((BufferError, TypeError, ValueError)):
        dsa.store_index_k(pool, slots, k, 2)


def test_help_states_the_four_rules():
    doc = dsa.store_index_k.__doc__
    for rule in ("r < n_real", "padding sentinel -1", "page 0", "< capacity"):
        assert rule in doc
    assert "uint16" in doc and "bf16 bit patterns" in doc
    assert dsa.__version__.count(".") == 2
