"""The CUDA path on torch tensors: the same bytes as the CPU reference, capture in torch.cuda.graph
with n_real as a device scalar, the caller's stream, and the auditor's kernel. Skips without torch
or a GPU (the GPU suite runs it: scripts/gpu-python.sh)."""

import numpy as np
import pytest

import dsa

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or not dsa.cuda_built():
    pytest.skip("needs torch with a CUDA device and dsa built with CUDA", allow_module_level=True)

DEV = torch.device("cuda")


def as_np(t):
    return t.detach().cpu().view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 \
        else t.detach().cpu().numpy()


@pytest.mark.parametrize("layout,ue8m0", [("bf16", False), ("fp8", False), ("fp8", True)])
def test_index_k_same_bytes_as_cpu(layout, ue8m0):
    g = torch.Generator().manual_seed(3)
    rows = 300
    k = torch.randn(rows, 128, generator=g) * torch.logspace(-3, 2, rows).unsqueeze(1)
    slots = torch.randperm(64 * 63, generator=g)[:rows].to(torch.int64) + 64
    slots[::17] = -1
    slots[5] = 3  # page 0
    slots[7] = 64 * 64 + 1  # past capacity: an error
    if layout == "bf16":
        cpu_pool = torch.zeros(64, 64, 128, dtype=torch.bfloat16)
    else:
        cpu_pool = torch.zeros(64, 8448, dtype=torch.uint8)
    gpu_pool = cpu_pool.to(DEV)
    e_cpu = dsa.store_index_k(cpu_pool, slots, k, 290, layout=layout, ue8m0=ue8m0)
    e_gpu = dsa.store_index_k(gpu_pool, slots.to(DEV), k.to(DEV), 290, layout=layout, ue8m0=ue8m0)
    torch.cuda.synchronize()
    assert int(e_cpu) == int(e_gpu) == 1
    assert np.array_equal(as_np(cpu_pool), as_np(gpu_pool))


def test_latent_same_bytes_as_cpu():
    g = torch.Generator().manual_seed(4)
    for layout, dtype, width in (("bf16", torch.bfloat16, 576), ("fp8", torch.uint8, 656)):
        latent, rope = torch.randn(100, 512, generator=g), torch.randn(100, 64, generator=g)
        slots = torch.arange(64, 164, dtype=torch.int64)
        cpu_pool = torch.zeros(4, 64, width, dtype=dtype)
        gpu_pool = cpu_pool.to(DEV)
        dsa.store_latent_kv(cpu_pool, slots, latent, rope, 100, layout=layout)
        dsa.store_latent_kv(gpu_pool, slots.to(DEV), latent.to(DEV), rope.to(DEV), 100,
                            layout=layout)
        torch.cuda.synchronize()
        assert np.array_equal(as_np(cpu_pool), as_np(gpu_pool)), layout


def test_captured_store_reads_n_real_at_replay():
    pool = torch.zeros(8, 64, 128, dtype=torch.bfloat16, device=DEV)
    loc = torch.arange(64, 72, dtype=torch.int64, device=DEV)
    k = torch.ones(8, 128, device=DEV)
    n_real = torch.full((1,), 8, dtype=torch.int32, device=DEV)
    errors = torch.zeros(1, dtype=torch.int32, device=DEV)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dsa.store_index_k(pool, loc, k, n_real, errors=errors)
    torch.cuda.synchronize()
    assert not pool.any(), "capture runs nothing"
    n_real.fill_(3)
    loc.copy_(torch.arange(128, 136, device=DEV))
    graph.replay()
    torch.cuda.synchronize()
    written = pool.view(-1, 128).any(dim=1).nonzero().flatten().tolist()
    assert written == [128, 129, 130], "rows >= n_real of the replay are skipped"
    loc[0] = 64 * 8 + 5
    graph.replay()
    torch.cuda.synchronize()
    assert int(errors) == 1


def test_runs_on_the_callers_stream():
    pool = torch.zeros(4, 64, 128, dtype=torch.bfloat16, device=DEV)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        k = torch.full((1, 128), 2.0, device=DEV)
        dsa.store_index_k(pool, torch.tensor([64], device=DEV), k, 1)  # torch's current: side
    side.synchronize()
    assert float(pool[1, 0, 0]) == 2.0
    k2 = torch.full((1, 128), 4.0, device=DEV)
    dsa.store_index_k(pool, torch.tensor([65], device=DEV), k2, 1, stream=side.cuda_stream)
    side.synchronize()
    assert float(pool[1, 1, 0]) == 4.0


def test_device_mismatch_is_refused():
    pool = torch.zeros(4, 64, 128, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="'slots' must be on cuda:0 like 'pool'"):
        dsa.store_index_k(pool, torch.tensor([64]), torch.ones(1, 128, device=DEV), 1)
    with pytest.raises(ValueError, match="'k' must be on cuda:0"):
        dsa.store_index_k(pool, torch.tensor([64], device=DEV), torch.ones(1, 128), 1)


def test_auditor_kernel_finds_the_clobber():
    pools = [(torch.zeros(16, 64, 576, dtype=torch.bfloat16, device=DEV),
              torch.zeros(16, 64, 128, dtype=torch.bfloat16, device=DEV)) for _ in range(2)]
    auditor = dsa.SlotAuditor(pools)
    slots = torch.arange(64, 64 + 900, device=DEV)
    for latent, index_k in pools:
        dsa.store_latent_kv(latent, slots, torch.randn(900, 512, device=DEV),
                            torch.randn(900, 64, device=DEV), 900)
        dsa.store_index_k(index_k, slots, torch.randn(900, 128, device=DEV), 900)
    auditor.record(slots, torch.arange(900) // 100)
    assert auditor.verify() == []
    pools[1][1].view(-1, 128)[500] = 0  # the incident: another row's bytes land in slot 500
    (f,) = auditor.verify()
    assert (f.layer, f.pool, f.slot, f.owner) == (1, "index_k", 500, 4)
    assert [x.slot for x in auditor.verify([500, 501])] == [500]


def two_layer_auditor(n=3000):
    pools = [(torch.zeros(n // 64 + 2, 64, 576, dtype=torch.bfloat16, device=DEV),
              torch.zeros(n // 64 + 2, 64, 128, dtype=torch.bfloat16, device=DEV))
             for _ in range(2)]
    slots = torch.arange(64, 64 + n, device=DEV)
    for latent, index_k in pools:
        dsa.store_latent_kv(latent, slots, torch.randn(n, 512, device=DEV),
                            torch.randn(n, 64, device=DEV), n)
        dsa.store_index_k(index_k, slots, torch.randn(n, 128, device=DEV), n)
    auditor = dsa.SlotAuditor(pools)
    auditor.record(slots, torch.arange(n, device=DEV) // 100)  # a CUDA int64 tensor
    return pools, auditor


def test_async_sample_kernel_draws_the_host_rule_and_finds_the_clobber():
    pools, auditor = two_layer_auditor()
    for count, seed, step in [(1, 0, 0), (256, 7, 3), (2999, 2**64 - 1, 2**40), (5000, 1, 1)]:
        assert auditor._impl.sample_positions(count, seed, step, True, None) == \
            auditor._impl.sample_positions(count, seed, step, False, None)
    for _ in range(10):
        auditor.verify(sample=256, wait=False)
    assert auditor.findings() == [] and auditor.async_counts["verifies"] == 10
    victim = 64 + auditor._impl.sample_positions(256, 5, 20, False, None)[100]
    pools[1][0].view(-1, 576)[victim] = 0
    auditor.verify(sample=256, seed=5, step=20, wait=False)
    assert auditor.findings() == [dsa.Finding(1, "latent", victim, (victim - 64) // 100, 1, 20)]


def test_async_verify_captured_in_a_graph_draws_anew_on_every_replay():
    pools, auditor = two_layer_auditor()
    pools[0][1].view(-1, 128)[64:64 + 3000:2] = 0  # every other slot clobbered
    auditor.flush()
    auditor.verify(sample=16, seed=1, step=100, wait=False)  # the device step: 100, then 101
    assert len(auditor.findings()) > 0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        auditor.verify(sample=16, seed=1, wait=False)
    graph.replay()  # capture ran nothing: step 101
    graph.replay()
    found = auditor.findings()
    assert {f.detected_step for f in found} == {101, 102}
    by_step = {s: {f.slot for f in found if f.detected_step == s} for s in (101, 102)}
    for s in (101, 102):  # each replay checked the sample of its own step
        drawn = {64 + p for p in auditor._impl.sample_positions(16, 1, s, False, None)}
        assert by_step[s] == {x for x in drawn if (x - 64) % 2 == 0}
    assert auditor.async_counts["verifies"] == 3


def test_auditor_values_find_the_same_step_clobber():
    latent = torch.zeros(8, 64, 576, dtype=torch.bfloat16, device=DEV)
    index_k = torch.zeros(8, 64, 128, dtype=torch.bfloat16, device=DEV)
    slots = torch.tensor([64, 65, 130], device=DEV)
    k, c, rope = (torch.randn(3, w, device=DEV) for w in (128, 512, 64))
    dsa.store_latent_kv(latent, slots, c, rope, 3)
    dsa.store_index_k(index_k, slots, k, 3)
    # A stale padded row of the same step, stored after the real ones (in order, not a race).
    index_k.view(-1, 128)[65] = torch.randn(128, device=DEV).to(torch.bfloat16)
    blind = dsa.SlotAuditor([(latent, index_k)])
    blind.record(slots, [11, 12, 13])
    assert blind.verify() == []
    auditor = dsa.SlotAuditor([(latent, index_k)])
    auditor.record(slots, torch.tensor([11, 12, 13]), values=[(c, rope), k])
    (f,) = auditor.verify()
    assert (f.layer, f.pool, f.slot, f.owner) == (0, "index_k", 65, 12)


@pytest.mark.parametrize("layout,ue8m0", [("bf16", False), ("fp8", False), ("fp8", True)])
def test_auditor_values_clean_step_matches_the_writers(layout, ue8m0):
    g = torch.Generator(device=DEV).manual_seed(6)
    rows, real = 200, 150
    if layout == "bf16":
        latent = torch.zeros(8, 64, 576, dtype=torch.bfloat16, device=DEV)
        index_k = torch.zeros(8, 64, 128, dtype=torch.bfloat16, device=DEV)
    else:
        latent = torch.zeros(8, 64, 656, dtype=torch.uint8, device=DEV)
        index_k = torch.zeros(8, 8448, dtype=torch.uint8, device=DEV)
    slots = torch.arange(64, 64 + rows, device=DEV)
    slots[::7] = -1
    k = torch.randn(rows, 128, device=DEV, generator=g) * 5
    c = torch.randn(rows, 512, device=DEV, generator=g)
    rope = torch.randn(rows, 64, device=DEV, generator=g)
    dsa.store_latent_kv(latent, slots, c, rope, real, layout=layout, ue8m0=ue8m0)
    dsa.store_index_k(index_k, slots, k, real, layout=layout, ue8m0=ue8m0)
    auditor = dsa.SlotAuditor([(latent, index_k)], ue8m0=ue8m0)
    auditor.record(slots[:real], 3, values=[(c[:real], rope[:real]), k[:real]])
    assert auditor.watched == real - len(range(0, real, 7))
    assert auditor.verify() == []
    cpu = dsa.SlotAuditor([(latent.cpu(), index_k.cpu())], ue8m0=ue8m0)  # the CPU's encoder agrees
    cpu.record(slots[:real].cpu(), 3, values=[(c[:real].cpu(), rope[:real].cpu()), k[:real].cpu()])
    assert cpu.verify() == []
    other = dsa.SlotAuditor([(latent, index_k)], ue8m0=ue8m0)
    other.record(slots[:real], 3, values=[(c[:real], rope[:real]), k[:real] * 2])
    assert {f.pool for f in other.verify()} == {"index_k"}


def test_auditor_values_on_another_device_or_dtype_are_refused():
    index_k = torch.zeros(4, 64, 128, dtype=torch.bfloat16, device=DEV)
    auditor = dsa.SlotAuditor([index_k])
    with pytest.raises(ValueError, match="'values\\[0\\]' must be on cuda:0 like 'pools'"):
        auditor.record([64], [1], values=torch.zeros(1, 128))
    with pytest.raises(TypeError, match="'values\\[0\\]' must be float32.*bfloat16"):
        auditor.record([64], [1], values=torch.zeros(1, 128, dtype=torch.bfloat16, device=DEV))
    assert auditor.watched == 0


def test_kernels_match_cpu():
    g = torch.Generator().manual_seed(5)
    pool = torch.zeros(8, 64, 128, dtype=torch.bfloat16)
    dsa.store_index_k(pool, torch.arange(64, 512), torch.randn(448, 128, generator=g), 448)
    q, w = torch.randn(4, 64, 128, generator=g), torch.randn(4, 64, generator=g)
    table = torch.tensor([[1, 2, 3, 4, 5, 6, 7]] * 4, dtype=torch.int32)
    seq = torch.tensor([448, 1, 0, 200], dtype=torch.int32)
    cpu = torch.zeros(4, 448)
    gpu = torch.zeros(4, 448, device=DEV)
    dsa.indexer_logits(q, w, table, seq, pool, cpu)
    dsa.indexer_logits(q.to(DEV), w.to(DEV), table.to(DEV), seq.to(DEV), pool.to(DEV), gpu)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-3, atol=1e-2)
    pos_cpu = torch.zeros(4, 16, dtype=torch.int32)
    pos_gpu = torch.zeros(4, 16, dtype=torch.int32, device=DEV)
    dsa.topk(cpu, seq, 16, pos_cpu)
    dsa.topk(cpu.to(DEV), seq.to(DEV), 16, pos_gpu)
    assert torch.equal(pos_gpu.cpu(), pos_cpu)
