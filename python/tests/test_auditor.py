"""SlotAuditor on numpy pools: records after the engine's store, finds every slot changed behind
its owner's back (with layer, pool, owner, step), and forgets released slots."""

import numpy as np
import pytest

import dsa


def pools(layers=2, pages=8):
    return [(np.zeros((pages, 64, 576), np.uint16), np.zeros((pages, 64, 128), np.uint16))
            for _ in range(layers)]


def fill(layer_pools, slots, rng):
    for latent, index_k in layer_pools:
        n = len(slots)
        dsa.store_latent_kv(latent, np.array(slots, np.int64),
                            rng.standard_normal((n, 512)).astype(np.float32),
                            rng.standard_normal((n, 64)).astype(np.float32), n)
        dsa.store_index_k(index_k, np.array(slots, np.int64),
                          rng.standard_normal((n, 128)).astype(np.float32), n)


def test_finds_the_clobbered_slot_with_its_owner(rng):
    p = pools()
    auditor = dsa.SlotAuditor(p)
    fill(p, [64, 65, 130], rng)
    auditor.record([64, 65, 130], [7, 7, 9])
    assert auditor.watched == 3 and auditor.verify() == []
    p[1][1].reshape(-1, 128)[130, 3] ^= 1  # one bit of layer 1's index-K, slot 130
    found = auditor.verify("all")
    assert found == [dsa.Finding(layer=1, pool="index_k", slot=130, owner=9, step=1,
                                 detected_step=1)]
    assert auditor.verify([64, 65]) == []
    assert [f.slot for f in auditor.verify([130, 9999, -1])] == [130]


def test_latent_change_and_steps(rng):
    p = pools(layers=1)
    auditor = dsa.SlotAuditor(p)
    fill(p, [64], rng)
    auditor.record([64], [1])
    fill(p, [200], rng)
    auditor.record(np.array([200]), np.array([2]))
    assert auditor.step == 2
    p[0][0].reshape(-1, 576)[200, 511] ^= 0x8000
    (f,) = auditor.verify(step=5)
    assert (f.layer, f.pool, f.slot, f.owner, f.step, f.detected_step) == (0, "latent", 200, 2, 2, 5)


def test_rewrite_by_the_owner_is_not_a_finding(rng):
    p = pools(layers=1)
    auditor = dsa.SlotAuditor(p)
    fill(p, [64, 65], rng)
    auditor.record([64, 65], [1, 1])
    assert auditor.verify() == []
    fill(p, [65], rng)  # the owner writes it again (a new token in a recycled slot)
    assert [f.slot for f in auditor.verify()] == [65, 65]  # not recorded yet: both pools differ
    auditor.record([65], [3])
    assert auditor.verify() == []


def test_release_and_padding(rng):
    p = pools(layers=1)
    auditor = dsa.SlotAuditor(p)
    fill(p, [64, 65, 66], rng)
    auditor.record([64, 65, 66, -1, 3], [1, 1, 2, 0, 0])  # -1 and page 0 are not watched
    assert auditor.watched == 3
    auditor.release(owner=1)
    assert auditor.watched == 1
    p[0][1][1, 0:3] = 0x3F80
    assert [f.slot for f in auditor.verify()] == [66]
    auditor.release([66])
    assert auditor.watched == 0 and auditor.verify() == []


def thousand_watched(rng):
    """One layer with slots 64..1063 written and recorded for owner 5."""
    p = pools(layers=1, pages=20)
    auditor = dsa.SlotAuditor(p)
    slots = list(range(64, 64 + 1000))
    fill(p, slots, rng)
    auditor.record(slots, [5] * len(slots))
    return p, auditor


def test_sample_checks_at_most_the_sample(rng):
    p, auditor = thousand_watched(rng)
    before = auditor.audited
    assert auditor.verify("sample", sample=50, seed=3) == []
    assert 0 < auditor.audited - before <= 50
    p[0][1].reshape(-1, 128)[64:1064, 0] ^= 1  # every slot changed: any sample finds some
    found = auditor.verify("sample", sample=50, seed=3)
    assert 0 < len(found) <= 50 and all(f.owner == 5 for f in found)
    assert len(auditor.verify("all")) == 1000


def test_a_sample_is_fixed_by_seed_and_step_and_spread_over_the_slots(rng):
    p, auditor = thousand_watched(rng)
    p[0][1].reshape(-1, 128)[64:1064, 0] ^= 1  # every slot changed: a sample finds what it checks

    def sampled(seed, step):
        return {f.slot for f in auditor.verify("sample", sample=100, seed=seed, step=step)}

    first = sampled(3, 1)
    assert first == sampled(3, 1), "the same seed and step check the same slots"
    assert first != sampled(3, 2) and first != sampled(4, 1)
    assert len(first) == 100  # distinct draws, none lost
    # one draw from each run of 10 watched slots (recorded in order): each sample spans them all
    watched = sorted(first)
    assert watched[0] < 64 + 100 and watched[-1] >= 64 + 900
    seen = set().union(*(sampled(3, step) for step in range(40)))
    assert len(seen) > 900


def test_fp8_pools_are_watched(rng):
    index_k = np.zeros((4, 8448), np.uint8)
    latent = np.zeros((4, 64, 656), np.uint8)
    auditor = dsa.SlotAuditor([(latent, index_k)])
    dsa.store_index_k(index_k, np.array([70], np.int64),
                      rng.standard_normal((1, 128)).astype(np.float32), 1, layout="fp8")
    auditor.record([70], [4])
    index_k[1, 8192 + 6 * 4] ^= 1  # the scale of slot 70 (page 1, offset 6)
    assert [(f.pool, f.slot) for f in auditor.verify()] == [("index_k", 70)]


def test_bad_auditor_arguments():
    with pytest.raises(ValueError, match="page_size"):
        dsa.SlotAuditor(pools(), page_size=32)
    with pytest.raises(ValueError, match="same slots"):
        dsa.SlotAuditor([np.zeros((4, 64, 128), np.uint16), np.zeros((8, 64, 128), np.uint16)])
    with pytest.raises(ValueError, match="no dsa pool"):
        dsa.SlotAuditor([np.zeros((4, 64, 100), np.uint16)])
    auditor = dsa.SlotAuditor(pools())
    with pytest.raises(ValueError, match="outside the pools"):
        auditor.record([8 * 64], [1])
    with pytest.raises(ValueError, match="one owner per slot"):
        auditor.record([64, 65, 66], [1, 2])
    with pytest.raises(ValueError, match="'what'"):
        auditor.verify("some")
