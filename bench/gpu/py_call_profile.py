"""Where the host time of one eager dsa.store_index_k call goes, from torch, on one GPU.

The eager store costs about 60 us per call from Python against 12 us for torch's index_put_ line
(bench/results/2026-12-03-h200-python.md), while the kernel itself replays in 1.3 us inside a
graph. This times, per call, each piece of the call on its own: torch's current-stream lookup,
DLPack export of one tensor (__dlpack_device__, __dlpack__), the extension called directly with a
known stream (no Python wrapper), the whole dsa.store_index_k, and the torch line. Host time:
perf_counter over many calls, the GPU queue drained once at the end (each store's kernel is about
1.5 us, so the host is the bottleneck).

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

    def torch_line():
        flat[slots] = k16

    rows = [
        ("torch line `flat[slots] = k16` (index_put_)", host_us(torch_line)),
        ("dsa.store_index_k(pool, slots, k32, n_real, errors=errors)",
         host_us(lambda: dsa.store_index_k(pool, slots, k32, n_real, errors=errors))),
        ("same, stream given (no current-stream lookup)",
         host_us(lambda: dsa.store_index_k(pool, slots, k32, n_real, errors=errors,
                                           stream=stream))),
        ("_dsa.store_index_k directly (no Python wrapper)",
         host_us(lambda: _dsa.store_index_k(pool, slots, k32, n_real, errors, "bf16", False,
                                            "contract", stream))),
        ("torch.cuda.current_stream().cuda_stream",
         host_us(lambda: torch.cuda.current_stream(0).cuda_stream)),
        ("pool.__dlpack_device__()", host_us(pool.__dlpack_device__)),
        ("pool.__dlpack__(stream=-1) (one tensor's capsule)",
         host_us(lambda: pool.__dlpack__(stream=-1))),
        ("pool.data_ptr(), .shape, .stride(), .dtype, .device (attribute reads)",
         host_us(lambda: (pool.data_ptr(), pool.shape, pool.stride(), pool.dtype, pool.device))),
    ]
    torch.cuda.synchronize()
    assert int(errors) == 0
    lines = [f"## Host time per call, torch {torch.__version__} on {torch.cuda.get_device_name()}",
             "", "| call | us |", "|---|---|"]
    lines += [f"| {name} | {us:.2f} |" for name, us in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
