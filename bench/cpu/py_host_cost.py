"""The host time of dsa's Python entry points on the CPU build, per call: reading arrays (through
the stand-in torch module of python/tests/test_torch_path.py, whose tensors wrap numpy, and numpy
by DLPack), a whole dsa.store_index_k and a bound dsa.IndexKWriter call on numpy arrays (float32
and bf16 keys, n_real as a device scalar and as an int), and the sampled SlotAuditor.verify on a
CPU pool of a decode engine's size, with the auditor's own phase clock (pick, stage, ...).

Each figure is the median over --repeats runs of --calls calls (perf_counter), so a shared machine's
noise moves it little. No GPU, no torch needed:

    PYTHONPATH=build-cpu/python /usr/bin/python3 bench/cpu/py_host_cost.py --markdown out.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests"))
from test_torch_path import make_torch  # noqa: E402  (the tests' stand-in torch module)

import dsa  # noqa: E402
from dsa import _dsa  # noqa: E402


def per_call_us(fn, calls, repeats):
    fn()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--pages", type=int, default=16385, help="auditor pool pages (64 tokens)")
    ap.add_argument("--markdown", help="append the table here too")
    args = ap.parse_args()
    calls, repeats = args.calls, args.repeats

    n = 8
    rng = np.random.default_rng(1)
    pool = np.zeros((1025, 64, 128), np.uint16)
    slots = np.arange(64, 64 + n, dtype=np.int64)
    k = rng.standard_normal((n, 128)).astype(np.float32)
    n_real = np.full(1, n, np.int32)
    errors = np.zeros(1, np.int32)
    five = (pool, slots, k, n_real, errors)

    torch = make_torch()
    sys.modules["torch"] = torch
    tfive = (torch.Tensor(pool, torch.bfloat16), torch.Tensor(slots), torch.Tensor(k),
             torch.Tensor(n_real), torch.Tensor(errors))
    rows = []
    try:
        assert _dsa.array_info(tfive[0])["path"] == "torch"
        nothing = per_call_us(lambda: _dsa.read_arrays(), calls, repeats)
        rows.append(("an extension call reading nothing: _dsa.read_arrays()", nothing))
        rows.append(("5 stand-in torch tensors: _dsa.read_arrays(*five)",
                     per_call_us(lambda: _dsa.read_arrays(*tfive), calls, repeats)))
        rows.append(("dsa.store_index_k, 5 stand-in torch tensors (CPU backend)",
                     per_call_us(lambda: dsa.store_index_k(*tfive[:4], errors=tfive[4]), calls,
                                 repeats)))
        twriter = dsa.IndexKWriter(tfive[0], errors=tfive[4])
        rows.append(("IndexKWriter(pool)(slots, k, n_real), 3 stand-in torch tensors",
                     per_call_us(lambda: twriter(*tfive[1:4]), calls, repeats)))
    finally:
        del sys.modules["torch"]
    rows.append(("5 numpy arrays by DLPack: _dsa.read_arrays(*five)",
                 per_call_us(lambda: _dsa.read_arrays(*five), calls, repeats)))
    rows.append(("1 numpy array by DLPack: _dsa.read_arrays(pool)",
                 per_call_us(lambda: _dsa.read_arrays(pool), calls, repeats)))
    rows.append(("dsa.store_index_k, numpy, 8 tokens, device scalars given",
                 per_call_us(lambda: dsa.store_index_k(pool, slots, k, n_real, errors=errors),
                             calls, repeats)))
    rows.append(("_dsa.store_index_k, numpy, 8 tokens (the extension alone)",
                 per_call_us(lambda: _dsa.store_index_k(pool, slots, k, n_real, errors, "bf16",
                                                        False, "contract", None), calls, repeats)))
    k16 = (k.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits (truncated: any bits do)
    rows.append(("dsa.store_index_k, numpy, 8 tokens, bf16 k (uint16)",
                 per_call_us(lambda: dsa.store_index_k(pool, slots, k16, n_real, errors=errors),
                             calls, repeats)))
    writer = dsa.IndexKWriter(pool, errors=errors)
    rows.append(("IndexKWriter(pool)(slots, k, n_real), numpy, 8 tokens, n_real device scalar",
                 per_call_us(lambda: writer(slots, k, n_real), calls, repeats)))
    rows.append(("IndexKWriter(pool)(slots, k, 8), numpy, n_real a Python int",
                 per_call_us(lambda: writer(slots, k, n), calls, repeats)))
    rows.append(("IndexKWriter(pool)(slots, k16, n_real), numpy, bf16 k (uint16)",
                 per_call_us(lambda: writer(slots, k16, n_real), calls, repeats)))
    rows.append(("dsa.store_index_k, numpy, 8 tokens, n_real a Python int (errors given)",
                 per_call_us(lambda: dsa.store_index_k(pool, slots, k, n, errors=errors),
                             calls, repeats)))
    assert int(errors[0]) == 0

    # The sampled verify on a decode-sized pair of pools: every slot past page 0 watched.
    pages = args.pages
    index_k = np.zeros((pages, 64, 128), np.uint16)
    latent = np.zeros((pages, 64, 576), np.uint16)
    auditor = dsa.SlotAuditor([(latent, index_k)])
    live = np.arange(64, pages * 64, dtype=np.int64)
    t0 = time.perf_counter()
    auditor.record(live, 1)
    record_s = time.perf_counter() - t0
    vcalls = max(calls // 20, 200)
    phases = {}
    step = iter(range(1, 1 << 62))

    def verify():  # a new step each call, as a decode loop does: a fresh draw every time
        assert auditor.verify("sample", sample=256, step=next(step)) == []
        for name, us in auditor.last_verify_us.items():
            phases.setdefault(name, []).append(us)

    verify_us = per_call_us(verify, vcalls, repeats)
    rows.append((f"SlotAuditor.verify(sample=256), {len(live)} watched, 2 pools", verify_us))
    for name in ("pick", "stage", "launch", "wait", "findings"):
        rows.append((f"  of it, phase {name} (median of {len(phases[name])} verifies)",
                     statistics.median(phases[name])))

    lines = [f"calls {calls} (verify {vcalls}) x {repeats} repeats, medians; "
             f"record of {len(live)} slots {record_s * 1e3:.0f} ms", "",
             "| per call | µs |", "|---|---|"]
    lines += [f"| {name} | {us:.2f} |" for name, us in rows]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
