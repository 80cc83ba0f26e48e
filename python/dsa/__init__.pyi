# Type stubs of the dsa package. Arrays are anything that speaks DLPack (torch tensors on CPU or
# CUDA, numpy arrays on the CPU); uint16 stands for bf16 bit patterns wherever bf16 is expected.
from typing import (Any, Dict, List, Literal, NamedTuple, Optional, Sequence, Tuple, Union,
                    overload)

Array = Any  # a DLPack array: torch.Tensor or numpy.ndarray
Layout = Literal["bf16", "fp8"]
# What a store was given for one pool's rows: float32 [rows, 128] index keys, or the pair
# (c float32 [rows, 512], k_rope float32 [rows, 64]) of a latent pool.
RowValues = Union[Array, Tuple[Array, Array]]

__version__: str
PAGE_SIZE: int
PAD_SLOT: int

def cuda_built() -> bool: ...
def cuda_available() -> bool: ...
def store_index_k(
    pool: Array,
    slots: Array,
    k: Array,
    n_real: Union[int, Array],
    *,
    layout: Layout = "bf16",
    ue8m0: bool = False,
    errors: Optional[Array] = None,
    guard: Literal["contract", "incident"] = "contract",
    stream: Optional[int] = None,
) -> Array: ...
def store_latent_kv(
    pool: Array,
    slots: Array,
    latent: Array,
    k_rope: Array,
    n_real: Union[int, Array],
    *,
    layout: Layout = "bf16",
    ue8m0: bool = False,
    errors: Optional[Array] = None,
    stream: Optional[int] = None,
) -> Array: ...

class _BoundWriter:  # what both bound writers have (not a runtime base class)
    @property
    def pool(self) -> Array: ...
    @property
    def errors(self) -> Array: ...
    @property
    def layout(self) -> Layout: ...

class IndexKWriter(_BoundWriter):
    def __init__(
        self,
        pool: Array,
        *,
        layout: Layout = "bf16",
        ue8m0: bool = False,
        errors: Optional[Array] = None,
        guard: Literal["contract", "incident"] = "contract",
        stream: Optional[int] = None,
    ) -> None: ...
    def __call__(self, slots: Array, k: Array, n_real: Union[int, Array]) -> Array: ...

class LatentKVWriter(_BoundWriter):
    def __init__(
        self,
        pool: Array,
        *,
        layout: Layout = "bf16",
        ue8m0: bool = False,
        errors: Optional[Array] = None,
        stream: Optional[int] = None,
    ) -> None: ...
    def __call__(
        self, slots: Array, latent: Array, k_rope: Array, n_real: Union[int, Array]
    ) -> Array: ...

def indexer_logits(
    q: Array,
    w: Array,
    page_table: Array,
    seq_lens: Array,
    pool: Array,
    logits: Array,
    *,
    layout: Layout = "bf16",
    stream: Optional[int] = None,
) -> Array: ...
def topk(
    logits: Array,
    seq_lens: Array,
    k: int,
    out_positions: Array,
    *,
    out_slots: Optional[Array] = None,
    page_table: Optional[Array] = None,
    stream: Optional[int] = None,
) -> Array: ...
def sparse_mla(
    q: Array,
    indices: Array,
    pool: Array,
    out: Array,
    scale: float,
    *,
    lse: Optional[Array] = None,
    layout: Layout = "bf16",
    stream: Optional[int] = None,
) -> Array: ...

class Finding(NamedTuple):
    layer: int
    pool: str
    slot: int
    owner: int
    step: int
    detected_step: int

class SlotAuditor:
    step: int
    def __init__(
        self,
        pools: Sequence[Union[Array, Sequence[Array]]],
        page_size: int = 64,
        *,
        ue8m0: bool = False,
    ) -> None: ...
    def record(
        self,
        slots: Any,
        owners: Any,
        *,
        values: Optional[Union[RowValues, Sequence[RowValues]]] = None,
        step: Optional[int] = None,
        stream: Optional[int] = None,
    ) -> None: ...
    def release(self, slots: Any = None, *, owner: Optional[int] = None) -> None: ...
    def flush(self, *, stream: Optional[int] = None) -> None: ...
    @overload
    def verify(
        self,
        what: Union[Literal["all", "sample"], Any, None] = None,
        *,
        sample: Optional[int] = None,
        seed: int = 0,
        step: Optional[int] = None,
        wait: Literal[True] = True,
        stream: Optional[int] = None,
    ) -> List[Finding]: ...
    @overload
    def verify(
        self,
        what: Optional[Literal["all", "sample"]] = None,
        *,
        sample: Optional[int] = None,
        seed: int = 0,
        step: Optional[int] = None,
        wait: Literal[False],
        stream: Optional[int] = None,
    ) -> None: ...
    def poll(self, *, stream: Optional[int] = None) -> List[Finding]: ...
    def findings(self, *, stream: Optional[int] = None) -> List[Finding]: ...
    @property
    def async_counts(self) -> Dict[str, int]: ...
    @property
    def last_verify_us(self) -> Dict[str, float]: ...
    @property
    def watched(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def audited(self) -> int: ...
