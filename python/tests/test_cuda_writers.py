"""The bound writers and bf16 keys on CUDA torch tensors: the same bytes as the CPU reference and
the functional store, capture in torch.cuda.graph with n_real as a device scalar, the caller's
stream, and a pool the writer keeps alive. Skips without torch or a GPU (the GPU suite runs it:
scripts/gpu-python.sh)."""

import gc

import numpy as np
import pytest

import dsa

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or not dsa.cuda_built():
    pytest.skip("needs torch with a CUDA device and dsa built with CUDA", allow_module_level=True)

DEV = torch.device("cuda")


def as_np(t):
    if t.dtype == torch.bfloat16:
        return t.detach().cpu().view(torch.int16).numpy().view(np.uint16)
    return t.detach().cpu().numpy()


def slot_map(rows, seed):
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(64 * 63, generator=g)[:rows].to(torch.int64) + 64
    slots[::17] = -1
    slots[5] = 3  # page 0
    slots[7] = 64 * 64 + 1  # past capacity: an error
    return slots


@pytest.mark.parametrize("layout,ue8m0", [("bf16", False), ("fp8", False), ("fp8", True)])
def test_writer_bf16_keys_same_bytes_as_cpu(layout, ue8m0):
    g = torch.Generator().manual_seed(5)
    rows = 300
    k = (torch.randn(rows, 128, generator=g) * torch.logspace(-3, 2, rows).unsqueeze(1))
    k16 = k.to(torch.bfloat16)
    slots = slot_map(rows, 6)
    if layout == "bf16":
        cpu_pool = torch.zeros(64, 64, 128, dtype=torch.bfloat16)
    else:
        cpu_pool = torch.zeros(64, 8448, dtype=torch.uint8)
    # the CPU reference on the exact f32 widening of the bf16 keys
    e_cpu = dsa.store_index_k(cpu_pool, slots, k16.float(), 290, layout=layout, ue8m0=ue8m0)
    for n_real in (290, torch.full((1,), 290, dtype=torch.int32, device=DEV)):
        gpu_pool = torch.zeros_like(cpu_pool, device=DEV)
        writer = dsa.IndexKWriter(gpu_pool, layout=layout, ue8m0=ue8m0)
        writer(slots.to(DEV), k16.to(DEV), n_real)
        functional = torch.zeros_like(cpu_pool, device=DEV)
        e_fn = dsa.store_index_k(functional, slots.to(DEV), k16.to(DEV), n_real, layout=layout,
                                 ue8m0=ue8m0)
        torch.cuda.synchronize()
        assert int(e_cpu) == int(writer.errors) == int(e_fn) == 1
        assert np.array_equal(as_np(cpu_pool), as_np(gpu_pool))
        assert np.array_equal(as_np(cpu_pool), as_np(functional))


def test_latent_writer_same_bytes_as_cpu():
    g = torch.Generator().manual_seed(8)
    for layout, dtype, width in (("bf16", torch.bfloat16, 576), ("fp8", torch.uint8, 656)):
        latent, rope = torch.randn(100, 512, generator=g), torch.randn(100, 64, generator=g)
        slots = torch.arange(64, 164, dtype=torch.int64)
        slots[3] = -1
        cpu_pool = torch.zeros(4, 64, width, dtype=dtype)
        dsa.store_latent_kv(cpu_pool, slots, latent, rope, 90, layout=layout)
        gpu_pool = torch.zeros_like(cpu_pool, device=DEV)
        writer = dsa.LatentKVWriter(gpu_pool, layout=layout)
        writer(slots.to(DEV), latent.to(DEV), rope.to(DEV), 90)
        torch.cuda.synchronize()
        assert int(writer.errors) == 0
        assert np.array_equal(as_np(cpu_pool), as_np(gpu_pool))


def test_captured_writer_reads_n_real_at_replay():
    pool = torch.zeros(8, 64, 128, dtype=torch.bfloat16, device=DEV)
    writer = dsa.IndexKWriter(pool)  # made before capture: its scalars are filled now
    loc = torch.arange(64, 72, dtype=torch.int64, device=DEV)
    k16 = torch.ones(8, 128, dtype=torch.bfloat16, device=DEV)
    n_real = torch.full((1,), 8, dtype=torch.int32, device=DEV)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        writer(loc, k16, n_real)
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
    assert int(writer.errors) == 1


def test_writer_made_inside_capture_is_refused():
    pool = torch.zeros(4, 64, 128, dtype=torch.bfloat16, device=DEV)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="outside CUDA graph capture"):
        with torch.cuda.graph(graph):
            dsa.IndexKWriter(pool)


def test_writer_follows_the_current_stream_or_its_own():
    pool = torch.zeros(4, 64, 128, dtype=torch.bfloat16, device=DEV)
    writer = dsa.IndexKWriter(pool)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        k = torch.full((1, 128), 2.0, dtype=torch.bfloat16, device=DEV)
        writer(torch.tensor([64], device=DEV), k, 1)  # torch's current stream: side
    side.synchronize()
    assert float(pool[1, 0, 0]) == 2.0
    pinned = dsa.IndexKWriter(pool, stream=side.cuda_stream, errors=writer.errors)
    k2 = torch.full((1, 128), 4.0, dtype=torch.bfloat16, device=DEV)
    side.wait_stream(torch.cuda.current_stream())
    pinned(torch.tensor([65], device=DEV), k2, 1)
    side.synchronize()
    assert float(pool[1, 1, 0]) == 4.0


def test_writer_keeps_the_pool_alive():
    pool = torch.zeros(4, 64, 128, dtype=torch.bfloat16, device=DEV)
    writer = dsa.IndexKWriter(pool)
    del pool
    gc.collect()
    torch.cuda.empty_cache()  # a freed pool's memory would go back to the device here
    k16 = torch.full((2, 128), 3.0, dtype=torch.bfloat16, device=DEV)
    writer(torch.tensor([64, 65], device=DEV), k16, 2)
    torch.cuda.synchronize()
    assert torch.equal(writer.pool.view(-1, 128)[64:66], k16)


def test_writer_device_mismatch_is_refused():
    writer = dsa.IndexKWriter(torch.zeros(4, 64, 128, dtype=torch.bfloat16, device=DEV))
    with pytest.raises(ValueError, match="'slots' must be on cuda:0 like 'pool'"):
        writer(torch.tensor([64]), torch.ones(1, 128, device=DEV), 1)
    with pytest.raises(ValueError, match="'k' must be on cuda:0"):
        writer(torch.tensor([64], device=DEV), torch.ones(1, 128, dtype=torch.bfloat16), 1)
    with pytest.raises(ValueError, match="'errors' must be on cuda:0"):
        dsa.IndexKWriter(torch.zeros(4, 64, 128, dtype=torch.bfloat16, device=DEV),
                         errors=torch.zeros(1, dtype=torch.int32))
