"""Where the host time of one eager dsa.store_index_k call goes, from torch, on one GPU: before
(torch tensors exported by DLPack, the current stream looked up through torch.cuda.current_stream)
and after (tensors read by their attributes, the stream through torch's C entry point), in one run.

Each row times one piece on its own, per call: perf_counter over many calls, the GPU queue drained
once at the end (the store's kernel is about 1.5 us, so the host is the bottleneck). "before" runs
the same build with the attribute path switched off (_dsa.set_torch_attributes(False)) and the
stream passed the way the old wrapper found it, so the two columns differ only in those pieces.

    PYTHONPATH=build-gpu/python python3 bench/gpu/py_call_profile.py --markdown out.md
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dsa
from dsa import _dsa

DEV = torch.device("cuda")


def host_us(fn, calls=2000, repeats=5):
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(runs)


def both(fn_before, fn_after):
    """(before, after) host µs: the DLPack path, then the attribute path."""
    _dsa.set_torch_attributes(False)
    try:
        before = host_us(fn_before)
    finally:
        _dsa.set_torch_attributes(True)
    return before, host_us(fn_after)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", help="write the table here too")
    args = ap.parse_args()

    n = 8
    pool = torch.zeros(1025, 64, 128, dtype=torch.bfloat16, device=DEV)
    slots = torch.arange(64, 64 + n, device=DEV)
    k32 = torch.randn(n, 128, device=DEV)
    k16 = k32.to(torch.bfloat16)
    n_real = torch.full((1,), n, dtype=torch.int32, device=DEV)
    errors = torch.zeros(1, dtype=torch.int32, device=DEV)
    flat = pool.view(-1, 128)
    stream = int(torch.cuda.current_stream().cuda_stream)
    five = (pool, slots, k32, n_real, errors)

    def torch_line():
        flat[slots] = k16

    def dsa_after():
        dsa.store_index_k(pool, slots, k32, n_real, errors=errors)

    def dsa_before():  # what the old wrapper did: the public stream lookup, then DLPack x5
        dsa.store_index_k(pool, slots, k32, n_real, errors=errors,
                          stream=torch.cuda.current_stream(pool.device.index).cuda_stream)

    writer = dsa.IndexKWriter(pool, errors=errors)

    def writer_bf16k():  # the bound writer an engine holds per layer, on the engine's bf16 k
        writer(slots, k16, n_real)

    def ext_direct():
        _dsa.store_index_k(pool, slots, k32, n_real, errors, "bf16", False, "contract", stream)

    torch_us = host_us(torch_line)
    rows = [
        ("whole call: dsa.store_index_k(pool, slots, k32, n_real, errors=errors)",
         both(dsa_before, dsa_after)),
        ("the extension alone, stream given (_dsa.store_index_k)", both(ext_direct, ext_direct)),
        ("bound writer, bf16 k: writer(slots, k16, n_real) (after only)",
         (float("nan"), host_us(writer_bf16k))),
        ("whole call, bf16 k: dsa.store_index_k(pool, slots, k16, n_real, errors=errors)",
         (float("nan"), host_us(lambda: dsa.store_index_k(pool, slots, k16, n_real,
                                                          errors=errors)))),
        ("reading the 5 arrays (_dsa.read_arrays(pool, slots, k, n_real, errors))",
         both(lambda: _dsa.read_arrays(*five), lambda: _dsa.read_arrays(*five))),
        ("reading 1 array (_dsa.read_arrays(pool))",
         both(lambda: _dsa.read_arrays(pool), lambda: _dsa.read_arrays(pool))),
        ("an extension call reading nothing (_dsa.read_arrays())",
         both(_dsa.read_arrays, _dsa.read_arrays)),
        ("stream lookup: torch.cuda.current_stream(0).cuda_stream / _dsa.default_stream(pool)",
         (host_us(lambda: torch.cuda.current_stream(0).cuda_stream),
          host_us(lambda: _dsa.default_stream(pool)))),
        ("one DLPack export: pool.__dlpack__(stream=-1)",
         (host_us(lambda: pool.__dlpack__(stream=-1)), float("nan"))),
    ]
    whole_before, whole_after = rows[0][1]
    ext_after = rows[1][1][1]
    writer_after = rows[2][1][1]
    read5_after = rows[4][1][1]
    call0 = rows[6][1][1]
    derived = [
        ("Python wrapper (whole call - extension alone)", whole_after - ext_after),
        ("backend + launch + checks (extension alone - reading 5 arrays)", ext_after - read5_after),
        ("per array read by attributes ((5 arrays - nothing) / 5)", (read5_after - call0) / 5),
    ]
    torch.cuda.synchronize()
    assert int(errors) == 0
    lines = [f"## Host time of one eager store, torch {torch.__version__} on "
             f"{torch.cuda.get_device_name()} (8 tokens, bf16 pool)", "",
             f"torch line `flat[slots] = k16` (index_put_): **{torch_us:.2f} µs**; dsa before "
             f"{whole_before:.2f} µs, after **{whole_after:.2f} µs** "
             f"({'faster' if whole_after < torch_us else 'SLOWER'} than the torch line); the bound "
             f"writer on bf16 k **{writer_after:.2f} µs** "
             f"({'faster' if writer_after < torch_us else 'SLOWER'} than the torch line).", "",
             "| piece | before µs (DLPack) | after µs (attributes) |", "|---|---|---|"]
    lines += [f"| {name} | {b:.2f} | {a:.2f} |" for name, (b, a) in rows]
    lines += ["", "| derived, after | µs |", "|---|---|"]
    lines += [f"| {name} | {us:.2f} |" for name, us in derived]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
