"""What an engine pays for dsa from torch, on one GPU, in one run:

- the guarded index-K store vs the incident's torch line ``pool.view(-1, 128)[loc] = k``
  (index_put_, bf16 k: what engines hold) at decode sizes (1-256 tokens) and at 1M tokens, eagerly
  and inside a torch CUDA graph, four ways: dsa.store_index_k with float32 k (the old way: an engine
  pays an extra k.float() kernel, not timed here), dsa.store_index_k with the bf16 k itself, the
  bound writer dsa.IndexKWriter with bf16 k (what an engine holds per layer), and that writer on an
  fp8 pool;
- SlotAuditor.verify of all live slots of a 1M-token pool (index-K + latent, bf16), and of an
  always-on sample of 256 slots: its host time by phase, and its cost as a share of a decode step
  (the V3.2-dims decode steps of bench/results/2026-12-03-h200-decode.md, one layer, context 4096,
  graph replay, --gemm fast: one layer's audit against one layer's step, the harshest comparison).

Every bf16 variant writes the same bf16 bytes (checked: the pools are compared after each size).
Eager times include each call's host work (Python, argument reads, launch), as an engine pays it;
graph times are per store with 20 stores captured in one graph. Napkin math: the bf16 store from
bf16 k moves 2 B/value read + 2 B written + 8 B of slot per token (from f32 k: 4 B read).

    PYTHONPATH=build-gpu/python python3 bench/gpu/py_store_bench.py --json out.json --markdown out.md
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import dsa

DEV = torch.device("cuda")
SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1 << 20]
POOL_TOKENS = 1 << 20
PER_GRAPH = 20
# ms per decode step, V3.2 dims, one layer, context 4096, graph, --gemm fast, on the H200
# (bench/results/2026-12-03-h200-decode.md): the denominators of the audit's share.
DECODE_STEP_MS = {"B=1": 0.911, "B=64": 1.026, "B=256": 2.663}


def cuda_time_us(fn, iters):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def graph_time_us(fn, iters):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(PER_GRAPH):
            fn()
    return cuda_time_us(graph.replay, iters) / PER_GRAPH


# (key, label) of the timed stores; ratios are torch / variant (> 1: dsa is faster).
VARIANTS = [
    ("torch_index_put", "torch index_put_ (bf16 k)"),
    ("dsa_f32k", "dsa.store_index_k (f32 k)"),
    ("dsa_bf16k", "dsa.store_index_k (bf16 k)"),
    ("writer_bf16k", "IndexKWriter (bf16 k)"),
    ("writer_fp8_bf16k", "IndexKWriter fp8 pool (bf16 k)"),
]


def store_rows(pool_bf16, pool_fp8):
    rows = []
    writer = dsa.IndexKWriter(pool_bf16)
    writer_fp8 = dsa.IndexKWriter(pool_fp8, layout="fp8", errors=writer.errors)
    flat = pool_bf16.view(-1, 128)
    for n in SIZES:
        g = torch.Generator(device=DEV).manual_seed(n)
        slots = torch.randperm(POOL_TOKENS, device=DEV, generator=g)[:n] + 64  # distinct, live
        k32 = torch.randn(n, 128, device=DEV)
        k16 = k32.to(torch.bfloat16)
        n_real = torch.full((1,), n, dtype=torch.int32, device=DEV)
        errors = writer.errors

        def torch_line():
            flat[slots] = k16

        def dsa_f32k():
            dsa.store_index_k(pool_bf16, slots, k32, n_real, errors=errors)

        def dsa_bf16k():
            dsa.store_index_k(pool_bf16, slots, k16, n_real, errors=errors)

        def writer_bf16k():
            writer(slots, k16, n_real)

        def writer_fp8_bf16k():
            writer_fp8(slots, k16, n_real)

        fns = {"torch_index_put": torch_line, "dsa_f32k": dsa_f32k, "dsa_bf16k": dsa_bf16k,
               "writer_bf16k": writer_bf16k, "writer_fp8_bf16k": writer_fp8_bf16k}
        iters = 200 if n <= 256 else 20
        row = {"tokens": n}
        for name, _ in VARIANTS:
            row[f"{name}_eager_us"] = cuda_time_us(fns[name], iters)
            row[f"{name}_graph_us"] = graph_time_us(fns[name], max(iters // 10, 5))
        # the same bytes: each bf16 variant rewrites the slots with k16, and the torch line's
        # rows must read back identically
        flat[slots] = 0
        writer(slots, k16, n)
        assert torch.equal(flat[slots], k16), "the writer and the torch line disagree"
        torch.cuda.synchronize()
        assert int(errors) == 0, "a store raised the error counter"
        for name, _ in VARIANTS[1:]:
            for mode in ("eager", "graph"):
                row[f"{name}_{mode}_vs_torch"] = (row[f"torch_index_put_{mode}_us"]
                                                  / row[f"{name}_{mode}_us"])
        moved = n * (128 * 2 + 128 * 2 + 8)
        row["writer_bf16k_graph_GBps"] = moved / row["writer_bf16k_graph_us"] / 1e3
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def audit_rows():
    pages = POOL_TOKENS // 64 + 1
    index_k = torch.zeros(pages, 64, 128, dtype=torch.bfloat16, device=DEV)
    latent = torch.zeros(pages, 64, 576, dtype=torch.bfloat16, device=DEV)
    slots = torch.arange(64, 64 + POOL_TOKENS, device=DEV)
    n = torch.full((1,), POOL_TOKENS, dtype=torch.int32, device=DEV)
    dsa.store_index_k(index_k, slots, torch.randn(POOL_TOKENS, 128, device=DEV), n)
    dsa.store_latent_kv(latent, slots, torch.randn(POOL_TOKENS, 512, device=DEV),
                        torch.randn(POOL_TOKENS, 64, device=DEV), n)
    auditor = dsa.SlotAuditor([(latent, index_k)])
    t0 = time.perf_counter()
    auditor.record(slots, torch.arange(POOL_TOKENS) // 4096)
    record_s = time.perf_counter() - t0
    out = {"watched_slots": auditor.watched, "record_1M_ms": record_s * 1e3}
    assert auditor.verify("all") == []  # first call uploads the expected digests once
    for what, kw, reps in (("all", {}, 10), ("sample", {"sample": 256}, 200)):
        torch.cuda.synchronize()
        phases = {}
        t0 = time.perf_counter()
        for i in range(reps):
            found = auditor.verify(what, **kw, seed=i)
            for name, us in auditor.last_verify_us.items():
                phases[name] = phases.get(name, 0.0) + us / reps
        out[f"verify_{what}_us"] = (time.perf_counter() - t0) * 1e6 / reps
        out[f"verify_{what}_phases_us"] = phases
        assert found == []
    # the sample's device time alone (CUDA events around the verify, which waits for it)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(200):
        auditor.verify("sample", sample=256, seed=i)
    end.record()
    end.synchronize()
    out["verify_sample_device_us"] = start.elapsed_time(end) * 1000.0 / 200
    out["verify_sample_share_of_step"] = {
        step: out["verify_sample_us"] / (ms * 1000.0) for step, ms in DECODE_STEP_MS.items()}
    index_k.view(-1, 128)[12345 + 64] = 0
    (f,) = auditor.verify("all")
    out["clobber_found"] = [f.layer, f.pool, f.slot, f.owner]
    # the bytes verify reads: every watched slot of both pools (1152 + 256 B per token)
    out["verify_all_GBps"] = POOL_TOKENS * (1152 + 256) / out["verify_all_us"] / 1e3
    print(json.dumps(out), flush=True)
    return out


def markdown(stores, audit, device):
    head = " | ".join(f"{label} eager / graph µs" for _, label in VARIANTS)
    ratios = " | ".join(f"{label}: eager / graph" for _, label in VARIANTS[1:])
    lines = [f"## dsa from torch on {device} (torch {torch.__version__})", "",
             "Times per store; ratios = torch µs / dsa µs (> 1: the guarded store is faster).", "",
             f"| tokens | {head} |", "|---|" + "---|" * len(VARIANTS),]
    for r in stores:
        cells = " | ".join(f"{r[f'{k}_eager_us']:.1f} / {r[f'{k}_graph_us']:.1f}"
                           for k, _ in VARIANTS)
        lines.append(f"| {r['tokens']} | {cells} |")
    lines += ["", f"| tokens | {ratios} |", "|---|" + "---|" * (len(VARIANTS) - 1)]
    for r in stores:
        cells = " | ".join(f"{r[f'{k}_eager_vs_torch']:.2f}x / {r[f'{k}_graph_vs_torch']:.2f}x"
                           for k, _ in VARIANTS[1:])
        lines.append(f"| {r['tokens']} | {cells} |")
    lines.append("")
    for key, label in VARIANTS[1:]:
        slower = [r["tokens"] for r in stores
                  if r[f"{key}_eager_vs_torch"] <= 1.0 or r[f"{key}_graph_vs_torch"] <= 1.0]
        lines.append(f"- {label} faster than the torch line at every size, eager and graph: "
                     + ("yes" if not slower else f"NO (tokens {slower})"))
    phases = " + ".join(f"{k} {v:.1f}" for k, v in audit["verify_sample_phases_us"].items()
                        if k != "total")
    shares = ", ".join(f"{100 * v:.2f}% of the {k} step ({ms:.3f} ms)"
                       for (k, v), ms in zip(audit["verify_sample_share_of_step"].items(),
                                             DECODE_STEP_MS.values()))
    lines += ["", f"SlotAuditor on a 1M-token layer (index-K + latent bf16, "
              f"{audit['watched_slots']} live slots): verify all {audit['verify_all_us']:.0f} µs "
              f"({audit['verify_all_GBps']:.0f} GB/s), record of 1M slots "
              f"{audit['record_1M_ms']:.0f} ms; a planted clobber found as {audit['clobber_found']}.",
              "",
              f"Sampled verify (256 slots, both pools): **{audit['verify_sample_us']:.1f} µs** per "
              f"call from Python ({audit['verify_sample_device_us']:.1f} µs by CUDA events); in the "
              f"extension: {phases} µs (wait = the device's work and the round trip).",
              "",
              f"As a share of a decode step (V3.2 dims, one layer, context 4096, graph, --gemm fast, "
              f"bench/results/2026-12-03-h200-decode.md): {shares}. Goal: < 2%."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    pages = POOL_TOKENS // 64 + 1 + 64
    pool_bf16 = torch.zeros(pages, 64, 128, dtype=torch.bfloat16, device=DEV)
    pool_fp8 = torch.zeros(pages, 64 * 132, dtype=torch.uint8, device=DEV)
    stores = store_rows(pool_bf16, pool_fp8)
    del pool_bf16, pool_fp8
    torch.cuda.empty_cache()
    audit = audit_rows()
    device = torch.cuda.get_device_name()
    md = markdown(stores, audit, device)
    print(md, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "stores": stores,
                       "audit": audit}, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
