"""dsa.cpp for Python engines: the guarded cache writers, the DSA kernels and the slot auditor,
on arrays the caller owns.

Arrays cross zero-copy: a torch tensor (CPU or CUDA) is read through its attributes (data_ptr,
dtype, shape, stride, device: cheaper than a DLPack export), numpy arrays and anything else by
DLPack. With ``n_real`` and ``errors`` given as device scalars, a store costs one extension call
and one kernel launch of host time. Nothing is
ever copied or converted behind your back: an array of the wrong dtype, shape, strides or device
is refused with a TypeError or ValueError that names the argument and what it needs. numpy has no
bfloat16, so wherever bf16 is expected a uint16 array is accepted and read as bf16 bit patterns.

CUDA work runs on the caller's stream: ``stream=None`` means torch's current stream of the pool's
device (when torch is imported; looked up on every call, so ``torch.cuda.stream(...)`` and graph
capture are followed), else the legacy default stream; pass an integer
``cudaStream_t`` handle to choose another. dsa inserts no cross-stream synchronization: the arrays
must be ready on that stream, as for any op issued on it. Every store op enqueues one kernel and
allocates nothing when ``n_real`` and ``errors`` are given as device arrays, so it can be captured
in ``torch.cuda.graph``.

Layouts (page 0 of every pool is reserved; all pools use 64-token pages):

- index-K bf16: bfloat16 (or uint16) ``[pages, 64, 128]`` or ``[pages * 64, 128]``
- index-K fp8:  uint8 ``[pages, 8448]``: 64 x 128 e4m3 bytes, then 64 float32 scales per page
- latent bf16:  bfloat16 (or uint16) ``[pages, 64, 576]`` or ``[pages * 64, 576]``
- latent fp8:   uint8 ``[pages, 64, 656]`` or ``[pages * 64, 656]``: 512 e4m3, 4 float32 scales,
  64 bf16 rope values per token
"""

from __future__ import annotations

import sys as _sys
from typing import Any, List, NamedTuple, Optional, Sequence

from . import _dsa

__version__: str = _dsa.__version__
__all__ = [
    "__version__",
    "store_index_k",
    "store_latent_kv",
    "IndexKWriter",
    "LatentKVWriter",
    "indexer_logits",
    "topk",
    "sparse_mla",
    "SlotAuditor",
    "Finding",
    "PAGE_SIZE",
    "PAD_SLOT",
    "cuda_built",
    "cuda_available",
]

PAGE_SIZE = 64  #: tokens per page, every pool
PAD_SLOT = -1  #: the padding sentinel of a slot map

cuda_built = _dsa.cuda_built
cuda_available = _dsa.cuda_available

_STORE_RULES = """
    The store contract (the same four rules as every dsa.cpp writer). The op processes
    ``len(slots)`` rows, never the value tensor's row count, and writes row r only when all hold:

    1. ``r < n_real`` -- a stale tail of a padded batch is never written;
    2. ``slots[r] >= 0`` -- the padding sentinel -1 is skipped;
    3. ``slots[r]`` is not in page 0 (``slots[r] >= 64``) -- the reserved page stays zero;
    4. ``slots[r] < capacity`` (``pages * 64``).

    Rows failing rules 1-3 are skipped silently. A violation of rule 4, or a negative slot other
    than -1, is skipped and adds 1 to the device error counter ``errors`` (never silent: check it
    after the step, e.g. ``int(errors)``).
"""


def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _require_array(x: Any, name: str) -> None:
    if not (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")):
        raise TypeError(
            f"argument '{name}' must be an array that speaks DLPack (a torch tensor, or a numpy "
            f"array on the CPU), got {type(x).__name__}"
        )


def _int32_scalar(value: int, like: Any, name: str):
    """A one-element int32 array holding value, on like's device (torch.full is capturable)."""
    if _is_torch(like):
        import torch

        return torch.full((1,), value, dtype=torch.int32, device=like.device)
    numpy = _sys.modules.get("numpy")
    if numpy is not None and isinstance(like, numpy.ndarray):
        return numpy.full(1, value, dtype=numpy.int32)
    raise TypeError(
        f"argument '{name}' as a Python int needs 'pool' to be a torch tensor or a numpy array; "
        f"pass a one-element int32 array on the pool's device instead"
    )


def _n_real(n_real: Any, pool: Any):
    if isinstance(n_real, bool):
        raise TypeError("argument 'n_real' must be an int or a one-element int32 array, got bool")
    if isinstance(n_real, int):
        if not 0 <= n_real < 2**31:
            raise ValueError(f"argument 'n_real' must be in [0, 2^31), got {n_real}")
        return _int32_scalar(n_real, pool, "n_real")
    return n_real


def _errors(errors: Any, pool: Any):
    return _int32_scalar(0, pool, "errors") if errors is None else errors


def store_index_k(
    pool: Any,
    slots: Any,
    k: Any,
    n_real: Any,
    *,
    layout: str = "bf16",
    ue8m0: bool = False,
    errors: Any = None,
    guard: str = "contract",
    stream: Optional[int] = None,
) -> Any:
    """Stores index-K rows into a paged index-K pool through dsa's guarded writer.

    The one-line fix for the incident's ``pool.view(-1, 128)[loc.long()] = k``.

    Args:
        pool: the layer's index-K pool: bfloat16/uint16 ``[pages, 64, 128]`` or
            ``[pages * 64, 128]`` for ``layout="bf16"``; uint8 ``[pages, 8448]`` for
            ``layout="fp8"``. C-contiguous, 16-byte aligned. uint16 is read as bf16 bit patterns.
        slots: int64 ``[rows]`` contiguous, the slot map (``page * 64 + offset``; -1 = padding).
        k: float32 or bfloat16 ``[>= rows, 128]`` (a numpy uint16 array is read as bf16 bit
            patterns), unit inner stride, any row stride >= 128. bf16 keys go to a bf16 pool bit
            for bit, and an fp8 pool quantizes their exact float32 widening (the bytes of
            ``k.float()``, without the conversion's extra kernel).
        n_real: the count of real rows: a Python int (baked into a captured graph), or a
            one-element int32 array on the pool's device, read by the kernel (what a captured
            graph needs: rewrite it before each replay).
        layout: ``"bf16"`` or ``"fp8"`` (e4m3 values, scale = max(amax, 1e-4) / 448 per token,
            saturated to +-448, round to nearest even -- the layout DeepGEMM's paged MQA logits
            read).
        ue8m0: fp8 only: round each scale up to a power of two.
        errors: a one-element int32 array on the pool's device that the op adds its rule-4 and
            bad-slot count to; a new zeroed one when None.
        guard: ``"contract"`` (always, in production). ``"incident"`` reproduces the unguarded
            framework scatter of the incident for tests (bf16 only): it ignores rules 1-3 and a
            negative slot wraps from the end of the pool.
        stream: CUDA stream handle (int); default torch's current stream.

    Returns:
        ``errors``, the device error counter.
    """
    # The fast path (device scalars given) goes straight to the extension, which reads torch
    # tensors by their attributes, checks everything and finds torch's current stream itself.
    if errors is None or isinstance(n_real, int):
        _require_array(pool, "pool")
        errors = _errors(errors, pool)
        n_real = _n_real(n_real, pool)
    _dsa.store_index_k(pool, slots, k, n_real, errors, layout, bool(ue8m0), guard,
                       None if stream is None else int(stream))
    return errors


store_index_k.__doc__ += _STORE_RULES


def store_latent_kv(
    pool: Any,
    slots: Any,
    latent: Any,
    k_rope: Any,
    n_real: Any,
    *,
    layout: str = "bf16",
    ue8m0: bool = False,
    errors: Any = None,
    stream: Optional[int] = None,
) -> Any:
    """Stores MLA latent rows (c ‖ k_rope) into a paged latent pool through dsa's guarded writer.

    Args:
        pool: the layer's latent pool: bfloat16/uint16 ``[pages, 64, 576]`` or
            ``[pages * 64, 576]`` (``layout="bf16"``); uint8 ``[pages, 64, 656]`` or
            ``[pages * 64, 656]`` (``layout="fp8"``, FlashMLA's sparse layout: 512 e4m3, 4 float32
            tile scales, 64 bf16 rope values per token).
        slots: int64 ``[rows]``, the slot map (-1 = padding).
        latent: float32 ``[>= rows, 512]`` (the normed c), unit inner stride.
        k_rope: float32 ``[>= rows, 64]`` (the roped key), unit inner stride.
        n_real, ue8m0, errors, stream: as for :func:`store_index_k`.

    Returns:
        ``errors``, the device error counter.
    """
    if errors is None or isinstance(n_real, int):
        _require_array(pool, "pool")
        errors = _errors(errors, pool)
        n_real = _n_real(n_real, pool)
    _dsa.store_latent_kv(pool, slots, latent, k_rope, n_real, errors, layout, bool(ue8m0),
                         None if stream is None else int(stream))
    return errors


store_latent_kv.__doc__ += _STORE_RULES


IndexKWriter = _dsa.IndexKWriter
IndexKWriter.__module__ = __name__
IndexKWriter.__doc__ = """One layer's index-K pool bound to dsa's guarded writer: what an engine holds per layer.

    ``writer = dsa.IndexKWriter(pool, layout="bf16", ue8m0=False, errors=None, guard="contract",
    stream=None)``, then each step ``writer(slots, k, n_real)``: the same store, rules and bytes as
    :func:`store_index_k`, for less host time. The pool's dtype, shape, layout and alignment, the
    error counter and the stream are checked once, here; a call reads and checks only ``slots``,
    ``k`` and ``n_real`` and goes straight to the extension (no Python in between). The writer
    keeps a reference to ``pool``, so the pool lives as long as the writer; don't replace the
    pool's storage (``resize_``, ``set_``) while it is bound.

    Args:
        pool, layout, ue8m0, guard: as for :func:`store_index_k`.
        errors: the device error counter every call adds to (a one-element int32 array on the
            pool's device); a new zeroed one when None. Read it as ``writer.errors``.
        stream: CUDA stream handle (int) for every call; None: torch's current stream, looked up
            on each call (so ``torch.cuda.stream(...)`` and graph capture are followed).

    Call ``writer(slots, k, n_real)``:
        slots: int64 ``[rows]``, the slot map (-1 = padding).
        k: float32 or bfloat16 (numpy: uint16 bf16 bit patterns) ``[>= rows, 128]``.
        n_real: a Python int (baked into a captured graph; no device scalar is made: the writer
            processes ``min(rows, n_real)`` rows), or a one-element int32 array on the pool's
            device that the kernel reads (what a captured graph needs).
        Returns ``writer.errors``.
    """ + _STORE_RULES

LatentKVWriter = _dsa.LatentKVWriter
LatentKVWriter.__module__ = __name__
LatentKVWriter.__doc__ = """One layer's latent pool bound to dsa's guarded writer: what an engine holds per layer.

    ``writer = dsa.LatentKVWriter(pool, layout="bf16", ue8m0=False, errors=None, stream=None)``,
    then each step ``writer(slots, latent, k_rope, n_real)``: the same store, rules and bytes as
    :func:`store_latent_kv`, with the pool, the error counter and the stream checked once (see
    :class:`IndexKWriter`; ``latent`` float32 ``[>= rows, 512]``, ``k_rope`` float32
    ``[>= rows, 64]``). Returns ``writer.errors``.
    """ + _STORE_RULES


def indexer_logits(
    q: Any,
    w: Any,
    page_table: Any,
    seq_lens: Any,
    pool: Any,
    logits: Any,
    *,
    layout: str = "bf16",
    w_scale: float = 1.0,
    stream: Optional[int] = None,
) -> Any:
    """The lightning indexer: ``logits[r, t] = sum_h w[r, h] * relu(q[r, h] . k[t])``.

    Only ``t < seq_lens[r]`` is written; token t of row r is the slot
    ``page_table[r, t // 64] * 64 + t % 64`` of ``pool``. For an fp8 pool q is quantized per
    (row, head) and the token's scale applied, as dsa.cpp's decode does.

    Args:
        q: float32 ``[rows, heads, 128]`` (heads <= 64 on CUDA), heads packed.
        w: float32 ``[rows, heads]`` head weights; each is multiplied by ``w_scale`` once, in
            float32, so the raw ``weights_proj`` output with ``w_scale = heads**-0.5 *
            128**-0.5`` gives the bits of passing it pre-scaled.
        page_table: int32 ``[rows, max_pages]`` page ids.
        seq_lens: int32 ``[rows]``; each <= ``logits.shape[1]`` and <= ``max_pages * 64``
            (checked on the CPU; the caller's promise on CUDA).
        pool: the index-K pool (see :func:`store_index_k`).
        logits: float32 ``[rows, L]`` output.

    Returns:
        ``logits``.
    """
    _dsa.indexer_logits(q, w, page_table, seq_lens, pool, logits, layout, float(w_scale),
                        None if stream is None else int(stream))
    return logits


def topk(
    logits: Any,
    seq_lens: Any,
    k: int,
    out_positions: Any,
    *,
    out_slots: Any = None,
    page_table: Any = None,
    stream: Optional[int] = None,
) -> Any:
    """The positions of the k largest ``logits[r, t]`` with ``t < seq_lens[r]``.

    Ties go to the lower t; when ``seq_lens[r] <= k`` every t is taken. Output is in ascending
    position order, -1 filled; a padded row (seq_len 0) is all -1.

    Args:
        logits: float32 ``[rows, L]``.
        seq_lens: int32 ``[rows]``.
        k: how many to select.
        out_positions: int32 ``[rows, k]`` output.
        out_slots: optional int64 ``[rows, k]`` output: the positions mapped through
            ``page_table`` (int32 ``[rows, max_pages]``) to physical slots.

    Returns:
        ``out_positions``.
    """
    _dsa.topk(logits, seq_lens, int(k), out_positions, out_slots, page_table,
              None if stream is None else int(stream))
    return out_positions


def sparse_mla(
    q: Any,
    indices: Any,
    pool: Any,
    out: Any,
    scale: float,
    *,
    lse: Any = None,
    layout: str = "bf16",
    stream: Optional[int] = None,
) -> Any:
    """Absorbed sparse MLA decode attention over the selected slots.

    For each row r and head h: ``s_j = scale * (q_lat . c_j + q_rope . k_rope_j)`` over the valid
    slots j of ``indices[r]`` (a slot < 0 or >= capacity is unused), ``p = softmax(s)``,
    ``out[r, h] = sum_j p_j * c_j``. A row with no valid slot gets exactly 0 (lse = -inf).

    Args:
        q: float32 ``[rows, heads, 576]``: q_lat (512) ‖ q_rope (64), heads packed.
        indices: int64 ``[rows, topk]`` physical slots.
        pool: the latent pool (see :func:`store_latent_kv`).
        out: float32 ``[rows, heads, 512]`` output.
        scale: the softmax scale (> 0).
        lse: optional float32 ``[rows, heads]`` output, the log-sum-exp of the scores.

    Returns:
        ``out``.
    """
    _dsa.sparse_mla(q, indices, pool, out, float(scale), lse, layout,
                    None if stream is None else int(stream))
    return out


class Finding(NamedTuple):
    """A watched slot whose bytes changed behind its owner's back."""

    layer: int  #: the layer (index into the auditor's ``pools``)
    pool: str  #: "index_k" or "latent"
    slot: int  #: the physical slot (page * 64 + offset)
    owner: int  #: the owner recorded with the slot (a request id)
    step: int  #: the step at which the owner wrote it
    detected_step: int  #: the step of the verify that found it


class SlotAuditor:
    """The slot-integrity auditor on the caller's pools.

    After the engine's own store of a step, ``record(slots, owners, values=...)`` remembers each
    written slot's owner, the step and the digest the slot must hold in every pool: the digest of
    what the real row meant to write (its store inputs, encoded by dsa's writers' own codec), or,
    without ``values``, the digest of the bytes the pool holds now. ``verify()`` recomputes the
    digests of watched slots -- all of them, a seeded sample, or the slots a step reads -- with
    dsa's ``audit_slots`` op (a GPU kernel on CUDA pools: the pool is never copied to the host) and
    returns a :class:`Finding` for every slot whose bytes differ. ``release(slots)`` stops watching
    slots whose owner freed them.

    The always-on audit: ``verify(sample=256, wait=False)`` after each decode step enqueues one
    kernel on the stream and returns None at once: the sample is drawn on the device from ``seed``
    and a device step counter (one slot from each of 256 equal runs of the watched set, by the same
    rule as the synchronous sample), every pool is checked in that one launch, and mismatches are
    counted into a small device record. Nothing waits for the device; ``poll()`` (non-blocking)
    or ``findings()`` (blocking) hands back what completed verifies found. The call can be
    captured in a torch CUDA graph: every replay advances the device counter and draws a new
    sample. Attach it as::

        auditor = dsa.SlotAuditor([(latent[l], index_k[l]) for l in range(layers)])
        ...  # after each step's store of the real rows:
        auditor.record(loc[:n_real], req_ids, values=...)  # int64 tensors, read on the host
        auditor.verify(sample=256, wait=False)              # or inside the captured step
        for f in auditor.poll():                            # findings of earlier steps
            log.error("slot %d of request %d clobbered (layer %d %s)",
                      f.slot, f.owner, f.layer, f.pool)

    Args:
        pools: one entry per layer: a pool array, or a tuple of that layer's pools (e.g.
            ``(latent, index_k)``). Each pool's layout is told by its dtype and shape (see the
            module doc); all on one device, all with the same number of pages.
        page_size: tokens per page; dsa's layouts use 64 and only 64 is accepted.
        ue8m0: the fp8 pools are written with ``ue8m0=True`` (scales rounded up to powers of two).
            It decides the digest of a row's ``values``; pool read-backs do not depend on it.
    """

    def __init__(self, pools: Sequence[Any], page_size: int = PAGE_SIZE, *, ue8m0: bool = False):
        if page_size != PAGE_SIZE:
            raise ValueError(
                f"argument 'page_size' must be {PAGE_SIZE} (dsa's pools use 64-token pages), "
                f"got {page_size}"
            )
        if not isinstance(pools, (list, tuple)):
            pools = [pools]
        flat = []
        for layer, entry in enumerate(pools):
            for pool in entry if isinstance(entry, (list, tuple)) else (entry,):
                flat.append((layer, pool))
        self._pools = flat
        self._ref = flat[0][1] if flat else None
        self._impl = _dsa.PoolAuditor(flat, bool(ue8m0))
        self.step = 0  #: the auditor's step counter: advanced by every record() without a step

    def _values_per_pool(self, values: Any) -> Any:
        """values as a list of one entry per pool; a single pool's entry may come bare."""
        if len(self._pools) == 1 and not isinstance(values, list):
            bare_array = hasattr(values, "__dlpack__")
            bare_pair = (isinstance(values, tuple) and len(values) == 2
                         and all(hasattr(v, "__dlpack__") for v in values))
            if bare_array or bare_pair:
                return [values]
        return values

    def record(self, slots: Any, owners: Any, *, values: Any = None, step: Optional[int] = None,
               stream: Optional[int] = None) -> None:
        """Remembers the slots a step's real rows wrote, with their owners (request ids >= 0).

        Args:
            slots: the slots the real rows wrote (``page * 64 + offset``). Padding (-1) and
                page-0 slots are skipped (their rows too); a slot past the pools raises
                ValueError.
            owners: one owner per slot, or one for all.
            values: what the engine's store was given for these rows, one entry per pool in the
                order the auditor was built with (for a single pool the entry itself may be
                passed): a float32 ``[len(slots), 128]`` array for an index-K pool, a pair
                ``(c, k_rope)`` of float32 ``[len(slots), 512]`` and ``[len(slots), 64]`` arrays
                for a latent pool; unit inner stride, any row stride, on the pools' device. The
                expected digest of each slot is then computed from the row's values with the
                writers' own encoder (bf16 rounding, or fp8 quantization with its scale rounding:
                see ``ue8m0``), on the pools' device, so a slot that another row clobbered in the
                same step (a stale padded row with the same slot, written after the real one) is
                found by the next ``verify``. A bf16 row must be converted by the caller
                (``k.float()``): dsa never converts silently.

                Without ``values`` the expected digest is read back from the pool after the
                store, so such a same-step clobber becomes the recorded truth and is never found;
                clobbers in later steps are found either way.
            step: the step to record (default: the auditor's counter, advanced by one).
            stream: CUDA stream handle (int); default torch's current stream.

        ``slots`` and ``owners`` are read on the host: int64 (or int32) arrays -- numpy, torch CPU
        tensors in place, a CUDA tensor copied down once -- or Python ints and lists; an array of
        a million slots is never turned into Python ints. Synchronizes the stream once (the new
        digests come back), then uploads the changed part of the device mirror that sampled
        verifies read.
        """
        if values is not None:
            values = self._values_per_pool(values)
        at = self.step + 1 if step is None else int(step)
        self._impl.record(slots, owners, values, at, None if stream is None else int(stream))
        if step is None:  # a refused record does not advance the counter
            self.step = at

    def release(self, slots: Any = None, *, owner: Optional[int] = None) -> None:
        """Stops watching ``slots``, or every slot of ``owner`` (the request freed its pages).

        The device mirror catches up at the next ``record``, ``verify`` or ``flush``: call
        ``flush()`` before replaying a graph that captured ``verify(wait=False)`` when no
        ``record`` followed the release.
        """
        if owner is not None:
            self._impl.release_owner(int(owner))
        if slots is not None:
            self._impl.release(slots)

    def flush(self, *, stream: Optional[int] = None) -> None:
        """Uploads what changed in the device mirror of the watched slots (allocating it, once, at
        the pools' capacity). ``record`` does this itself; needed before capturing
        ``verify(wait=False)`` the first time, and after a ``release`` that no ``record`` followed.
        """
        self._impl.flush(None if stream is None else int(stream))

    def verify(self, what: Any = None, *, sample: Optional[int] = None, seed: int = 0,
               step: Optional[int] = None, wait: bool = True,
               stream: Optional[int] = None) -> Optional[List[Finding]]:
        """Recomputes digests of watched slots and returns every mismatch.

        Args:
            what: ``"all"`` (every watched slot), ``"sample"`` (``sample`` distinct slots drawn
                with ``seed`` and the step, one from each of ``sample`` equal runs of the watched
                set, so every sample spreads over all of it: an always-on audit), or the slots to
                check (e.g. the slots a step's top-k reads; an int64 array or ints); unwatched
                slots among them are ignored. Default: ``"sample"`` when ``sample`` is given,
                else ``"all"``.
            sample: slots per sample (default 256).
            seed: the sample's seed.
            step: the step reported as detected, and the sample's draw. Default: the auditor's
                step counter; with ``wait=False``, the device's step counter (advanced by every
                launch, so each replay of a captured verify draws anew); a given step sets it.
            wait: False for the asynchronous verify (``"sample"`` or ``"all"`` only): uploads
                what changed in the device mirror (usually nothing: ``record`` did), enqueues one
                kernel for all pools and returns None without waiting. Collect its findings with
                :meth:`poll` or :meth:`findings`. Capturable in ``torch.cuda.graph`` (call
                :meth:`flush` before capturing if the mirror is stale).
        """
        s = None if stream is None else int(stream)
        if what is None:
            what = "sample" if sample is not None else "all"
        elif isinstance(what, str) and what not in ("all", "sample"):
            raise ValueError(f"argument 'what' must be \"all\", \"sample\" or slots, got {what!r}")
        count = 256 if sample is None else int(sample)
        if not wait:
            if not isinstance(what, str):
                raise ValueError("wait=False verifies \"sample\" or \"all\", not listed slots")
            self._impl.verify_async(-1 if what == "all" else count, int(seed) & 0xFFFFFFFFFFFFFFFF,
                                    -1 if step is None else int(step), s)
            return None
        step = self.step if step is None else int(step)
        if not isinstance(what, str):
            raw = self._impl.verify_slots(what, step, s)
        elif what == "all":
            raw = self._impl.verify_all(step, s)
        else:
            raw = self._impl.verify_sample(count, int(seed) & (2**64 - 1), step, s)
        return [Finding(*f) for f in raw]

    def poll(self, *, stream: Optional[int] = None) -> List[Finding]:
        """Findings of asynchronous verifies, without waiting for the device.

        Returns what the last snapshot of the device record held, once the stream has passed it,
        then enqueues the next snapshot (a copy into pinned memory and a fence): called once per
        step, each call returns what the verifies up to the previous call found (on the CPU,
        where ops finish at once, up to this call). Each finding's ``detected_step`` is the
        device step of the verify that found it; ``owner`` and ``step`` are the slot's as recorded
        now. At most 32 findings per snapshot are listed; :attr:`async_counts` counts them all.
        Not under graph capture.
        """
        s = None if stream is None else int(stream)
        return [Finding(*f) for f in self._impl.poll(False, s)]

    def findings(self, *, stream: Optional[int] = None) -> List[Finding]:
        """As :meth:`poll`, but waits for every asynchronous verify enqueued so far."""
        return [Finding(*f) for f in self._impl.poll(True, None if stream is None else int(stream))]

    @property
    def async_counts(self) -> dict:
        """Asynchronous verifies read back by poll/findings so far, and the mismatching
        (pool, slot) checks they counted (all of them, listed or not)."""
        verifies, mismatches = self._impl.async_counts
        return {"verifies": verifies, "mismatches": mismatches}

    @property
    def last_verify_us(self) -> dict:
        """The host time of the last verify by phase (µs): pick, stage, launch, wait (the device's
        work and the round trip), findings, total. For profiles."""
        return dict(self._impl.last_verify_us())

    @property
    def watched(self) -> int:
        """How many slots are watched."""
        return self._impl.watched

    @property
    def capacity(self) -> int:
        """Slots per pool (pages * 64)."""
        return self._impl.capacity

    @property
    def audited(self) -> int:
        """Slot checks run so far by synchronous verifies (each verified slot counts once per
        verify); asynchronous ones are counted by :attr:`async_counts`."""
        return self._impl.audited

    def __repr__(self) -> str:
        return f"SlotAuditor({'; '.join(self._impl.describe_pools())}; watching {self.watched})"


