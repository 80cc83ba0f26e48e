"""The attribute path for torch tensors, tested without torch: a stand-in `torch` module whose Tensor
holds a numpy array and answers what dsa reads of a tensor (data_ptr, dtype, shape, stride, the
device flags, requires_grad, is_neg) and DLPack, counting every DLPack export. A plain tensor must
be read by its attributes (no export), give the same view and the same bytes as the numpy path,
keep every check and message, and fall back to DLPack for anything outside the plain set."""

import gc
import sys
import types
import weakref

import numpy as np
import pytest
from conftest import bf16_bits

import dsa
from dsa import _dsa


class Dtype:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name}"


NAMES = ["float32", "bfloat16", "uint16", "uint8", "int32", "int64", "float16"]
NUMPY = {"float32": np.float32, "bfloat16": np.uint16, "uint16": np.uint16, "uint8": np.uint8,
         "int32": np.int32, "int64": np.int64, "float16": np.float16}


def make_torch(raw_stream=True):
    torch = types.ModuleType("torch")
    for name in NAMES:
        setattr(torch, name, Dtype(name))
    by_numpy = {np.dtype(NUMPY[n]): getattr(torch, n) for n in NAMES if n != "bfloat16"}

    class Tensor:
        exports = 0  # DLPack exports of every tensor, for the tests to count

        def __init__(self, array, dtype=None, requires_grad=False, neg=False, device=-1):
            self.a = array
            self.dtype = dtype if dtype is not None else by_numpy[array.dtype]
            self.requires_grad = requires_grad
            self._neg = neg
            self._device = device
            self.is_cuda = device >= 0
            self.is_cpu = device < 0
            self.device = "cpu" if device < 0 else f"cuda:{device}"

        @property
        def shape(self):
            return tuple(self.a.shape)

        def stride(self):
            return tuple(s // self.a.itemsize for s in self.a.strides)

        def data_ptr(self):
            return self.a.ctypes.data

        def is_neg(self):
            return self._neg

        def get_device(self):
            return self._device

        def __dlpack__(self, stream=None):
            Tensor.exports += 1
            if self.requires_grad:
                raise RuntimeError("Can't export tensors that require gradient")
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

        # what dsa's wrapper uses on a torch tensor (n_real as an int, the auditor's host reads)
        def detach(self):
            return self

        def to(self, device):
            return self

        def reshape(self, *shape):
            return Tensor(self.a.reshape(*shape), self.dtype)

        def tolist(self):
            return self.a.tolist()

    Tensor.__module__ = "torch"
    torch.Tensor = Tensor
    torch.nn = types.SimpleNamespace(Parameter=type("Parameter", (Tensor,), {}))

    def full(shape, value, dtype, device):
        return Tensor(np.full(shape, value, NUMPY[dtype.name]), dtype)

    torch.full = full
    torch.current = {0: 0x5000, 1: 0x5100}  # device -> the "current stream" handle
    if raw_stream:
        torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda d: torch.current[d])
    torch.cuda = types.SimpleNamespace(current_stream=lambda d: types.SimpleNamespace(
        cuda_stream=torch.current[d] + 1))
    return torch


@pytest.fixture
def torch(monkeypatch):
    fake = make_torch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def bf16(torch, array):
    return torch.Tensor(array, torch.bfloat16)


def test_a_plain_tensor_is_read_by_its_attributes(torch):
    base = np.zeros((6, 64, 128), np.uint16)
    t = bf16(torch, base[1:5])
    info = _dsa.array_info(t, "pool")
    assert info["path"] == "torch"
    assert info["dtype"] == "bfloat16"
    assert info["shape"] == (4, 64, 128) and info["strides"] == (64 * 128, 128, 1)
    assert info["data"] == base[1:].ctypes.data and info["device"] == "cpu"
    assert torch.Tensor.exports == 0
    k = torch.Tensor(np.zeros((8, 256), np.float32)[:, :128])
    assert _dsa.array_info(k)["strides"] == (256, 1)
    param = torch.nn.Parameter(np.zeros(4, np.int64))
    assert _dsa.array_info(param)["path"] == "torch"
    # numpy, and a tensor subclass other than Parameter, cross by DLPack
    assert _dsa.array_info(base)["path"] == "dlpack"
    sub = type("Sub", (torch.Tensor,), {})(np.zeros(4, np.int64))
    assert _dsa.array_info(sub)["path"] == "dlpack" and torch.Tensor.exports == 1


@pytest.mark.parametrize("layout", ["bf16", "fp8"])
def test_store_index_k_same_bytes_without_an_export(torch, rng, layout):
    k = rng.standard_normal((5, 128)).astype(np.float32)
    slots = np.array([64, 300, -1, 70, 5000], np.int64)
    shape, dtype = ((8, 64, 128), np.uint16) if layout == "bf16" else ((8, 8448), np.uint8)
    ref = np.zeros(shape, dtype)
    ref_errors = dsa.store_index_k(ref, slots, k, np.array([5], np.int32), layout=layout)
    pool = np.zeros(shape, dtype)
    pool_t = bf16(torch, pool) if layout == "bf16" else torch.Tensor(pool)
    errors = torch.Tensor(np.zeros(1, np.int32))
    out = dsa.store_index_k(pool_t, torch.Tensor(slots), torch.Tensor(k),
                            torch.Tensor(np.array([5], np.int32)), layout=layout, errors=errors)
    assert out is errors and torch.Tensor.exports == 0
    np.testing.assert_array_equal(pool, ref)
    assert errors.a[0] == ref_errors[0] == 1  # slot 5000 is past the 512 slots
    assert np.count_nonzero(pool) > 0
    # n_real as an int and no counter: the wrapper makes both with torch.full, still no export
    pool[:] = 0
    errors = dsa.store_index_k(pool_t, torch.Tensor(slots), torch.Tensor(k), 5, layout=layout)
    assert isinstance(errors, torch.Tensor) and errors.a[0] == 1
    np.testing.assert_array_equal(pool, ref)
    assert torch.Tensor.exports == 0


def test_store_latent_kv_same_bytes_and_row_strides(torch, rng):
    latent = rng.standard_normal((3, 600)).astype(np.float32)[:, :512]  # row stride 600
    rope = rng.standard_normal((3, 64)).astype(np.float32)
    slots = np.array([64, 129, 200], np.int64)
    ref = np.zeros((4, 64, 576), np.uint16)
    dsa.store_latent_kv(ref, slots, np.ascontiguousarray(latent), rope, 3)
    pool = np.zeros((4, 64, 576), np.uint16)
    dsa.store_latent_kv(bf16(torch, pool), torch.Tensor(slots), torch.Tensor(latent),
                        torch.Tensor(rope), torch.Tensor(np.array([3], np.int32)),
                        errors=torch.Tensor(np.zeros(1, np.int32)))
    np.testing.assert_array_equal(pool, ref)
    np.testing.assert_array_equal(pool.reshape(-1, 576)[129, :512], bf16_bits(latent[1]))
    assert torch.Tensor.exports == 0


def test_every_check_and_message_holds_on_the_attribute_path(torch, rng):
    def args(**over):
        a = dict(pool=bf16(torch, np.zeros((4, 64, 128), np.uint16)),
                 slots=torch.Tensor(np.array([64, 65], np.int64)),
                 k=torch.Tensor(rng.standard_normal((2, 128)).astype(np.float32)),
                 n_real=torch.Tensor(np.array([2], np.int32)),
                 errors=torch.Tensor(np.zeros(1, np.int32)))
        a.update(over)
        return a

    cases = [
        (dict(pool=torch.Tensor(np.zeros((4, 64, 128), np.float32))), TypeError,
         r"'pool' must be bfloat16 or uint16 .*got float32 \[4, 64, 128\] on cpu"),
        (dict(pool=bf16(torch, np.zeros((8, 64, 128), np.uint16)[::2])), ValueError,
         "'pool' must be C-contiguous"),
        (dict(pool=bf16(torch, np.zeros((4, 64, 64), np.uint16))), ValueError,
         "'pool' needs dim 2 = 128"),
        (dict(slots=torch.Tensor(np.array([64, 0, 65, 0], np.int64)[::2])), ValueError,
         "'slots' must be C-contiguous"),
        (dict(slots=torch.Tensor(np.array([64, 65], np.int32))), TypeError, "'slots' must be int64"),
        (dict(k=torch.Tensor(np.zeros((2, 128), np.float32).T.copy().T)), ValueError,
         "'k' needs packed rows"),
        (dict(k=torch.Tensor(np.zeros((1, 128), np.float32))), ValueError,
         "'k' needs at least 2 rows"),
        (dict(n_real=torch.Tensor(np.array([2, 2], np.int32))), ValueError,
         "'n_real' must hold exactly one int32"),
        (dict(errors=torch.Tensor(np.zeros(1, np.int64))), TypeError, "'errors' must be int32"),
        (dict(k=torch.Tensor(np.zeros((2, 128), np.float16))), TypeError,
         r"'k' must be float32 .*got float16"),
        (dict(k=[1.0]), TypeError, "'k' must be an array that speaks DLPack"),
    ]
    for over, error, message in cases:
        a = args(**over)
        with pytest.raises(error, match=message):
            dsa.store_index_k(a["pool"], a["slots"], a["k"], a["n_real"], errors=a["errors"])
    assert torch.Tensor.exports == 1, "only the float16 k crossed by DLPack"


def test_what_torch_refuses_to_export_stays_refused(torch, rng):
    k = rng.standard_normal((1, 128)).astype(np.float32)
    pool = bf16(torch, np.zeros((4, 64, 128), np.uint16))
    slots, n = torch.Tensor(np.array([64], np.int64)), torch.Tensor(np.array([1], np.int32))
    errors = torch.Tensor(np.zeros(1, np.int32))
    with pytest.raises(RuntimeError, match="require gradient"):
        dsa.store_index_k(pool, slots, torch.Tensor(k, requires_grad=True), n, errors=errors)
    assert _dsa.array_info(torch.Tensor(k, neg=True))["path"] == "dlpack"
    assert not pool.a.any()


def test_the_stream_is_torchs_current_one_looked_up_per_call(torch, monkeypatch):
    cpu = torch.Tensor(np.zeros(4, np.int64))
    assert _dsa.default_stream(cpu) == 0  # the CPU backend takes no stream
    on1 = torch.Tensor(np.zeros(4, np.int64), device=1)
    assert _dsa.array_info(on1)["device"] == "cuda:1"
    assert _dsa.default_stream(on1) == 0x5100
    torch.current[1] = 0x7700  # e.g. inside `with torch.cuda.stream(s)` or a graph capture
    assert _dsa.default_stream(on1) == 0x7700
    old = make_torch(raw_stream=False)  # a torch without the C entry point: the public spelling
    monkeypatch.setitem(sys.modules, "torch", old)
    assert _dsa.default_stream(old.Tensor(np.zeros(4, np.int64), device=0)) == 0x5001
    monkeypatch.delitem(sys.modules, "torch")
    assert _dsa.default_stream(np.zeros(4, np.int64)) == 0


def test_the_auditor_keeps_its_pools_alive_and_audits_them(torch, rng):
    latent = np.zeros((4, 64, 576), np.uint16)
    pool_t = bf16(torch, latent)
    alive = weakref.ref(pool_t)
    slots = np.array([64, 100, 150], np.int64)
    dsa.store_latent_kv(latent, slots, rng.standard_normal((3, 512)).astype(np.float32),
                        rng.standard_normal((3, 64)).astype(np.float32), 3)
    auditor = dsa.SlotAuditor([pool_t])
    del pool_t
    gc.collect()
    assert alive() is not None, "the auditor must hold its pools"
    auditor.record(torch.Tensor(slots), torch.Tensor(np.array([5], np.int64)))
    assert auditor.verify("sample", sample=2) == []
    latent.reshape(-1, 576)[100, 7] ^= 4
    assert [f.slot for f in auditor.verify([100, 150])] == [100]
    phases = auditor.last_verify_us
    assert set(phases) == {"pick", "stage", "launch", "wait", "findings", "total"}
    assert all(v >= 0 for v in phases.values())
    assert torch.Tensor.exports == 0
    del auditor
    gc.collect()
    assert alive() is None, "and let go of them with it"


def test_switched_off_every_tensor_crosses_by_dlpack_with_the_same_bytes(torch, rng):
    k = rng.standard_normal((2, 128)).astype(np.float32)
    args = (torch.Tensor(np.array([64, 65], np.int64)), torch.Tensor(k),
            torch.Tensor(np.array([2], np.int32)))
    pools = []
    for attributes in (True, False):
        _dsa.set_torch_attributes(attributes)
        try:
            pool = np.zeros((4, 64, 128), np.uint16)
            dsa.store_index_k(torch.Tensor(pool, torch.uint16), *args,
                              errors=torch.Tensor(np.zeros(1, np.int32)))
            assert _dsa.read_arrays(*args) == 3
            pools.append(pool)
        finally:
            _dsa.set_torch_attributes(True)
        assert torch.Tensor.exports == (0 if attributes else 5 + 3)
    np.testing.assert_array_equal(pools[0], pools[1])
    np.testing.assert_array_equal(pools[0].reshape(-1, 128)[65], bf16_bits(k[1]))
