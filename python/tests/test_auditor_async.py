"""SlotAuditor's asynchronous sampled verify (verify(wait=False), poll, findings) on numpy pools:
the device draws its sample by the host's stratified rule, finds a clobbered slot with its owner and
steps, finds nothing on intact pools, and hands findings back through poll. The CPU backend runs
the same op as the GPU one, at once. Also record() of int64 arrays without Python ints."""

import numpy as np
import pytest

import dsa
from test_auditor import fill, pools, thousand_watched


def strata(n, count):
    """[lo, hi) of each of `count` equal runs of [0, n), the first n % count one wider."""
    width, wider = divmod(n, count)
    out, lo = [], 0
    for i in range(count):
        hi = lo + width + (1 if i < wider else 0)
        out.append((lo, hi))
        lo = hi
    return out


@pytest.mark.parametrize("count", [1, 7, 50, 333, 999])
def test_the_device_draw_is_the_host_rule(rng, count):
    _, auditor = thousand_watched(rng)
    impl = auditor._impl
    for seed, step in [(0, 0), (3, 1), (2**64 - 1, 12345), (42, 2**40)]:
        device = impl.sample_positions(count, seed, step, True, None)
        assert device == impl.sample_positions(count, seed, step, False, None)
        assert device == impl.sample_positions(count, seed, step, True, None), "deterministic"
        assert len(set(device)) == count, "distinct"
        for pos, (lo, hi) in zip(device, strata(1000, count)):
            assert lo <= pos < hi, "one draw in each stratum"
    if count >= 7:
        assert impl.sample_positions(count, 3, 1, True, None) != impl.sample_positions(
            count, 3, 2, True, None), "another step, another sample"
        assert impl.sample_positions(count, 3, 1, True, None) != impl.sample_positions(
            count, 4, 1, True, None), "another seed, another sample"


def test_a_sample_as_large_as_the_set_takes_every_slot(rng):
    _, auditor = thousand_watched(rng)
    positions = auditor._impl.sample_positions(1200, 9, 9, True, None)
    assert positions == list(range(1000)) + [-1] * 200


def test_the_synchronous_sample_checks_the_rule_s_positions(rng):
    p, auditor = thousand_watched(rng)  # slots 64.. recorded in order: position i is slot 64 + i
    p[0][1].reshape(-1, 128)[64:1064, 0] ^= 1  # every slot changed: a sample finds what it checks
    positions = auditor._impl.sample_positions(50, 3, 7, False, None)
    found = auditor.verify("sample", sample=50, seed=3, step=7)
    assert sorted(f.slot for f in found) == [64 + pos for pos in positions]


def test_poll_before_any_verify_and_on_intact_pools(rng):
    _, auditor = thousand_watched(rng)
    assert auditor.poll() == [] and auditor.findings() == []
    for _ in range(20):
        assert auditor.verify(sample=64, wait=False) is None
    assert auditor.poll() == []
    assert auditor.async_counts == {"verifies": 20, "mismatches": 0}
    assert auditor.verify(wait=False) is None  # "all", asynchronously
    assert auditor.findings() == [] and auditor.async_counts["verifies"] == 21


def test_a_clobbered_slot_is_found_with_its_owner_and_steps(rng):
    p = pools(layers=2, pages=20)
    auditor = dsa.SlotAuditor(p)
    slots = np.arange(64, 64 + 1000, dtype=np.int64)
    fill(p, slots, rng)
    auditor.record(slots[:500], 7, step=3)
    auditor.record(slots[500:], np.full(500, 9, np.int64), step=4)
    # the sample the device draws at step 10 with seed 5: clobber one of its slots in layer 1
    positions = auditor._impl.sample_positions(100, 5, 10, False, None)
    victim = int(slots[positions[60]])
    p[1][1].reshape(-1, 128)[victim, 0] ^= 1
    assert auditor.poll() == []
    auditor.verify(sample=100, seed=5, step=10, wait=False)  # sets the device step to 10
    assert auditor.poll() == [dsa.Finding(layer=1, pool="index_k", slot=victim, owner=9, step=4,
                                          detected_step=10)]
    assert auditor.poll() == [], "a snapshot is read once"
    # the device counter moved on: steps 11, 12, ... draw other samples, "all" finds it at once
    auditor.verify(wait=False)
    auditor.verify(wait=False)
    assert [(f.slot, f.detected_step) for f in auditor.findings()] == [(victim, 11), (victim, 12)]
    assert auditor.async_counts == {"verifies": 3, "mismatches": 3}
    # the synchronous verify agrees
    assert [(f.layer, f.pool, f.slot, f.owner) for f in auditor.verify()] == [
        (1, "index_k", victim, 9)]


def test_every_mismatch_is_counted_the_first_32_listed(rng):
    p, auditor = thousand_watched(rng)
    p[0][0].reshape(-1, 576)[64:1064, 0] ^= 1  # every latent slot changed
    auditor.verify(sample=50, wait=False)
    found = auditor.poll()
    assert len(found) == 32 and all(f.pool == "latent" and f.owner == 5 for f in found)
    assert auditor.async_counts == {"verifies": 1, "mismatches": 50}


def test_the_mirror_follows_releases(rng):
    p = pools(layers=1, pages=4)
    auditor = dsa.SlotAuditor(p)
    fill(p, [64, 65, 66], rng)
    auditor.record([64, 65, 66], [1, 2, 3])
    auditor.verify(wait=False)
    assert auditor.findings() == []
    auditor.release([64])  # slot 66 moves into 64's place in the watched set
    assert auditor._impl.mirror_dirty
    fill(p, [64], rng)  # the freed slot is reused: no finding
    p[0][1].reshape(-1, 128)[66, 5] ^= 1
    auditor.verify(wait=False)
    assert [(f.slot, f.owner) for f in auditor.findings()] == [(66, 3)]
    assert not auditor._impl.mirror_dirty


def test_wait_false_takes_no_slot_list(rng):
    _, auditor = thousand_watched(rng)
    with pytest.raises(ValueError, match="wait=False"):
        auditor.verify([64, 65], wait=False)
    with pytest.raises(ValueError, match="sample"):
        auditor.verify(sample=-3, wait=False)


def test_verify_with_sample_given_samples(rng):
    p, auditor = thousand_watched(rng)
    p[0][1].reshape(-1, 128)[64:1064, 0] ^= 1
    assert len(auditor.verify(sample=50, seed=1)) == 50
    assert len(auditor.verify("sample", seed=1)) == 256
    assert len(auditor.verify()) == 1000


def test_record_reads_integer_arrays_in_place(rng):
    p = pools(layers=1, pages=40)
    slots = np.arange(64, 64 + 2000, dtype=np.int64)
    fill(p, slots, rng)
    auditor = dsa.SlotAuditor(p)
    auditor.record(slots[::2], np.arange(1000, dtype=np.int64) // 100)  # strided slots
    auditor.record(slots[1::2].astype(np.int32), np.int64(4).reshape(1))  # int32, one owner
    assert auditor.watched == 2000
    p[0][1].reshape(-1, 128)[[64, 65, 64 + 1998], 0] ^= 1
    assert sorted((f.slot, f.owner) for f in auditor.verify()) == [(64, 0), (65, 4),
                                                                   (64 + 1998, 9)]
    auditor.release(np.array([64, 65], np.int64))
    assert [f.slot for f in auditor.verify(np.array([64, 65, 64 + 1998]))] == [64 + 1998]
    with pytest.raises(TypeError, match="slots"):
        auditor.record(slots.astype(np.float32), 1)
    with pytest.raises(ValueError, match="owners"):
        auditor.record(slots[:3], np.array([1, 2], np.int64))
    with pytest.raises(ValueError, match="contiguous"):
        auditor.record(slots.reshape(40, 50)[:, ::2], 1)
