"""SlotAuditor.record(values=...): the expected digest of a slot comes from what its real row meant
to write (the writers' own encoder over the store's inputs), not from the pool read back after the
store, so a padded row that clobbers a real row's slot in the same step is found."""

import numpy as np
import pytest
from conftest import bf16_bits

import dsa


def layer_pools(layout="bf16", pages=4):
    if layout == "bf16":
        return np.zeros((pages, 64, 576), np.uint16), np.zeros((pages, 64, 128), np.uint16)
    return np.zeros((pages, 64, 656), np.uint8), np.zeros((pages, 8448), np.uint8)


def test_same_step_clobber_is_found_only_from_values(rng):
    latent, index_k = layer_pools()
    # A bucket of 8 with 3 real rows; the padded rows keep stale slots, and row 5's stale slot is
    # 65, which real row 1 writes in this very step.
    slots = np.array([64, 65, 130, 70, 71, 65, 72, 73], np.int64)
    k = rng.standard_normal((8, 128)).astype(np.float32)
    c = rng.standard_normal((8, 512)).astype(np.float32)
    rope = rng.standard_normal((8, 64)).astype(np.float32)
    dsa.store_latent_kv(latent, slots, c, rope, 3)
    dsa.store_index_k(index_k, slots, k, 3, guard="incident")  # every row; the later row wins
    flat = index_k.reshape(-1, 128)
    np.testing.assert_array_equal(flat[65], bf16_bits(k[5]))  # the clobber happened
    owners = [11, 12, 13]

    blind = dsa.SlotAuditor([(latent, index_k)])
    blind.record(slots[:3], owners)
    assert blind.verify("all") == [], "read back after the store, the clobber is the truth"

    auditor = dsa.SlotAuditor([(latent, index_k)])
    auditor.record(slots[:3], owners, values=[(c[:3], rope[:3]), k[:3]])
    assert auditor.watched == 3
    assert auditor.verify("all") == [
        dsa.Finding(layer=0, pool="index_k", slot=65, owner=12, step=1, detected_step=1)
    ]
    flat[65] = bf16_bits(k[1])  # the real row's bytes back: nothing left to find
    assert auditor.verify("all") == []


def test_padding_and_page_zero_rows_are_skipped_with_their_values(rng):
    _, index_k = layer_pools()
    slots = np.array([64, -1, 5, 66], np.int64)
    k = rng.standard_normal((4, 128)).astype(np.float32)
    dsa.store_index_k(index_k, slots, k, 4)
    k[1:3] = np.nan  # the skipped rows' values are never compared
    auditor = dsa.SlotAuditor([index_k])
    auditor.record(slots, [1, 2, 3, 4], values=k)  # one pool: its entry may come bare
    assert auditor.watched == 2 and auditor.verify() == []
    index_k.reshape(-1, 128)[66, 0] ^= 1
    assert [(f.slot, f.owner) for f in auditor.verify()] == [(66, 4)]


@pytest.mark.parametrize("layout,ue8m0", [("bf16", False), ("fp8", False), ("fp8", True)])
def test_clean_guarded_step_with_values_has_no_findings(layout, ue8m0, rng):
    latent, index_k = layer_pools(layout)
    # A bucket of 6 with 4 real rows: padding and page 0 among them, a stale tail after.
    slots = np.array([64, -1, 130, 200, 71, 72], np.int64)
    k_wide = rng.standard_normal((6, 256)).astype(np.float32) * 3  # row stride 256
    k = k_wide[:, :128]
    c = rng.standard_normal((6, 512)).astype(np.float32)
    rope = rng.standard_normal((6, 64)).astype(np.float32)
    dsa.store_latent_kv(latent, slots, c, rope, 4, layout=layout, ue8m0=ue8m0)
    dsa.store_index_k(index_k, slots, k, 4, layout=layout, ue8m0=ue8m0)
    values = [(c[:4], rope[:4]), k[:4]]

    auditor = dsa.SlotAuditor([(latent, index_k)], ue8m0=ue8m0)
    auditor.record(slots[:4], [1, 2, 3, 4], values=values)
    assert auditor.watched == 3 and auditor.verify("all") == []
    assert auditor.verify([64, 130, 200]) == []

    other = dsa.SlotAuditor([(latent, index_k)], ue8m0=ue8m0)  # values the rows did not write
    other.record(slots[:4], [1, 2, 3, 4], values=[(c[:4] + 1, rope[:4]), k[:4] * 2])
    assert sorted((f.pool, f.slot) for f in other.verify()) == sorted(
        (p, s) for p in ("index_k", "latent") for s in (64, 130, 200))
    if layout == "fp8":  # the scale rounding is part of what the writer writes
        mismatched = dsa.SlotAuditor([(latent, index_k)], ue8m0=not ue8m0)
        mismatched.record(slots[:4], [1, 2, 3, 4], values=values)
        assert len(mismatched.verify()) == 6


def test_latent_pool_alone_takes_a_bare_pair(rng):
    latent, _ = layer_pools("fp8")
    c = rng.standard_normal((2, 512)).astype(np.float32)
    rope = rng.standard_normal((2, 64)).astype(np.float32)
    dsa.store_latent_kv(latent, np.array([64, 65], np.int64), c, rope, 2, layout="fp8")
    auditor = dsa.SlotAuditor([latent])
    auditor.record([64, 65], 7, values=(c, rope))
    assert auditor.watched == 2 and auditor.verify() == []
    latent.reshape(-1, 656)[65, 600] ^= 0x10  # a rope byte
    assert [(f.pool, f.slot, f.owner) for f in auditor.verify()] == [("latent", 65, 7)]


def good_values(rows=3):
    return [(np.zeros((rows, 512), np.float32), np.zeros((rows, 64), np.float32)),
            np.zeros((rows, 128), np.float32)]


def replaced(index, value):
    v = good_values()
    v[index] = value
    return v


@pytest.mark.parametrize(
    "values, exc, pattern",
    [
        (np.zeros((3, 128), np.float32), TypeError, "'values' must be a list with one entry per pool \\(2 pools\\)"),
        (good_values()[:1], ValueError, "'values' needs one entry per pool.*2 pools, got 1"),
        (replaced(1, np.zeros((3, 128), np.float64)), TypeError, "'values\\[1\\]' must be float32.*float64"),
        (replaced(1, np.zeros((3, 128), np.uint16)), TypeError, "'values\\[1\\]' must be float32.*uint16"),
        (replaced(1, np.zeros((4, 128), np.float32)), ValueError, "'values\\[1\\]' needs 3 rows, one per slot"),
        (replaced(1, np.zeros((2, 128), np.float32)), ValueError, "'values\\[1\\]' needs at least 3 rows"),
        (replaced(1, np.zeros((3, 64), np.float32)), ValueError, "'values\\[1\\]' needs a last dim of 128"),
        (replaced(1, np.zeros((3, 256), np.float32)[:, ::2]), ValueError, "'values\\[1\\]' needs packed rows"),
        (replaced(1, [1.0] * 128), TypeError, "'values\\[1\\]' is for layer 0's index_k bf16 pool: it must be one float32"),
        (replaced(0, np.zeros((3, 576), np.float32)), TypeError, "'values\\[0\\]' is for layer 0's latent bf16 pool: it must be a pair"),
        (replaced(0, (np.zeros((3, 512), np.float32),)), TypeError, "'values\\[0\\]'.*got 1 entries"),
        (replaced(0, (np.zeros((3, 512), np.float32), np.zeros((3, 32), np.float32))), ValueError, "'values\\[0\\]\\[1\\]' needs a last dim of 64"),
        (replaced(0, ("c", np.zeros((3, 64), np.float32))), TypeError, "'values\\[0\\]\\[0\\]' must be an array that speaks DLPack"),
    ],
)
def test_bad_values_are_refused(values, exc, pattern):
    latent, index_k = layer_pools()
    auditor = dsa.SlotAuditor([(latent, index_k)])
    with pytest.raises(exc, match=pattern):
        auditor.record([64, 65, 66], [1, 1, 1], values=values)
    assert auditor.watched == 0, "a refused record remembers nothing"
    with pytest.raises(exc, match=pattern):  # refused even when every row is padding
        auditor.record([-1, -1, 5], [1, 1, 1], values=values)
    auditor.record([64, 65, 66], [1, 1, 1], values=good_values())
    assert auditor.watched == 3
