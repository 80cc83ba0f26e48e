"""What an engine pays for dsa from torch, on one GPU, in one run:

- the guarded index-K store vs the incident's torch line ``pool.view(-1, 128)[loc] = k``
  (index_put_, bf16 k: what engines hold) at decode sizes (1-256 tokens) and at 1M tokens, eagerly
  and inside a torch CUDA graph, four ways: dsa.store_index_k with float32 k (the old way: an engine
  pays an extra k.float() kernel, not timed here), dsa.store_index_k with the bf16 k itself, the
  bound writer dsa.IndexKWriter with bf16 k (what an engine holds per layer), and that writer on an
  fp8 pool;
- SlotAuditor on a 1M-token pool (index-K + latent, bf16): record of 1M slots, verify of all live
  slots, the synchronous sample of 256 (host time by phase) and the asynchronous one
  (verify(sample=256, wait=False): host µs per call, its kernel's GPU µs, poll); the time it adds
  to a CUDA graph standing for a decode step's attention (indexer_logits + topk + sparse_mla, V3.2
  dims, context 4096, B=1 and B=64), verify after each replay and captured inside; and the same
  audit over a whole model's pools (61 layers of 1M tokens when the GPU's memory holds them).

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
ROUNDS = 7  # interleaved timing rounds per decode size; the median is reported
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


def store_graph(fn):
    """PER_GRAPH calls of fn captured in one torch CUDA graph (after a warm-up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(PER_GRAPH):
            fn()
    return graph


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


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
        # Eager calls of 1-256 tokens take a few µs of host time each, and the machine's noise is
        # of the same order: every variant is timed in ROUNDS rounds, interleaved (the order
        # rotates each round), and the median round is kept.
        iters, replays, rounds = (500, 50, ROUNDS) if n <= 256 else (20, 5, 3)
        graphs = {name: store_graph(fns[name]) for name, _ in VARIANTS}
        eager = {name: [] for name, _ in VARIANTS}
        graph = {name: [] for name, _ in VARIANTS}
        names = [name for name, _ in VARIANTS]
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                eager[name].append(cuda_time_us(fns[name], iters))
                graph[name].append(cuda_time_us(graphs[name].replay, replays) / PER_GRAPH)
        del graphs
        row = {"tokens": n}
        for name, _ in VARIANTS:
            row[f"{name}_eager_us"] = median(eager[name])
            row[f"{name}_graph_us"] = median(graph[name])
            row[f"{name}_eager_rounds_us"] = eager[name]
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


def filled_layer_pools(layers):
    """layers x (latent, index_k) bf16 pools of POOL_TOKENS live slots, written by dsa's stores."""
    pages = POOL_TOKENS // 64 + 1
    slots = torch.arange(64, 64 + POOL_TOKENS, device=DEV)
    n = torch.full((1,), POOL_TOKENS, dtype=torch.int32, device=DEV)
    out = []
    for _ in range(layers):
        index_k = torch.empty(pages, 64, 128, dtype=torch.bfloat16, device=DEV)
        latent = torch.empty(pages, 64, 576, dtype=torch.bfloat16, device=DEV)
        index_k[0].zero_()
        latent[0].zero_()
        dsa.store_index_k(index_k, slots, torch.randn(POOL_TOKENS, 128, device=DEV), n)
        dsa.store_latent_kv(latent, slots, torch.randn(POOL_TOKENS, 512, device=DEV),
                            torch.randn(POOL_TOKENS, 64, device=DEV), n)
        out.append((latent, index_k))
    torch.cuda.synchronize()
    return out, slots


def host_us(fn, reps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(reps):
        fn(i)
    host = (time.perf_counter() - t0) * 1e6 / reps
    torch.cuda.synchronize()
    return host


def async_rows(auditor, sample=256):
    """verify(sample, wait=False): host µs per call and by phase, its kernel's GPU time (launches
    captured in a graph, timed by CUDA events), and poll()."""
    out = {}
    auditor.flush()
    phases = {}

    def call(i):
        auditor.verify(sample=sample, wait=False)
        for name, us in auditor.last_verify_us.items():
            phases[name] = phases.get(name, 0.0) + us

    reps = 500
    out["async_call_us"] = host_us(call, reps)
    out["async_phases_us"] = {k: v / reps for k, v in phases.items()
                              if k in ("pick", "launch", "total")}
    per = 50
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per):
            auditor.verify(sample=sample, wait=False)
    out["async_kernel_us"] = cuda_time_us(graph.replay, 20) / per
    out["poll_us"] = host_us(lambda i: auditor.poll(), 200)
    assert auditor.findings() == [], "an intact pool gave findings"
    out["async_verifies_collected"] = auditor.async_counts["verifies"]
    return out


def audit_rows():
    """The auditor on one layer of 1M tokens (latent + index-K, bf16): record, verify all, the
    synchronous sample and the asynchronous one; a planted clobber found both ways."""
    layer, slots = filled_layer_pools(1)
    latent, index_k = layer[0]
    auditor = dsa.SlotAuditor(layer)
    owners = torch.arange(POOL_TOKENS) // 4096
    t0 = time.perf_counter()
    auditor.record(slots, owners)  # int64 tensors: read as arrays, no Python ints
    out = {"watched_slots": auditor.watched, "record_1M_ms": (time.perf_counter() - t0) * 1e3}
    t0 = time.perf_counter()
    auditor.record(slots.tolist(), owners.tolist())  # the same from lists, for comparison
    out["record_1M_from_lists_ms"] = (time.perf_counter() - t0) * 1e3
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
    out.update(async_rows(auditor))
    index_k.view(-1, 128)[12345 + 64] = 0
    (f,) = auditor.verify("all")
    out["clobber_found"] = [f.layer, f.pool, f.slot, f.owner]
    auditor.verify(wait=False)  # "all", asynchronously
    (g,) = auditor.findings()
    out["clobber_found_async"] = [g.layer, g.pool, g.slot, g.owner]
    auditor.record([12345 + 64], [g.owner])  # the zeroed bytes become the truth: no more findings
    # the bytes verify reads: every watched slot of both pools (1152 + 256 B per token)
    out["verify_all_GBps"] = POOL_TOKENS * (1152 + 256) / out["verify_all_us"] / 1e3
    print(json.dumps(out), flush=True)
    return out, layer, auditor


def model_audit_rows(layers):
    """The always-on audit of a whole model: `layers` layers of 1M-token pools (distinct memory)."""
    pools, slots = filled_layer_pools(layers)
    auditor = dsa.SlotAuditor(pools)
    t0 = time.perf_counter()
    auditor.record(slots, 0)
    out = {"layers": layers, "record_1M_ms": (time.perf_counter() - t0) * 1e3}
    out["verify_all_us"] = host_us(lambda i: auditor.verify("all"), 3)
    out["verify_sample_us"] = host_us(lambda i: auditor.verify("sample", sample=256, seed=i), 50)
    out.update(async_rows(auditor))
    print(json.dumps(out), flush=True)
    return out


def step_graph_rows(layer, auditor, batches=(1, 64), replays=200):
    """A decode step's attention on caller tensors (V3.2 dims: indexer 64 x 128, top-2048, sparse
    MLA 128 heads x 576, context 4096) over the audited pools, captured once, replayed: bare,
    with verify(sample=256, wait=False) after each replay, and with that verify captured inside."""
    latent, index_k = layer[0]
    ctx, pages = 4096, 4096 // 64
    rows = []
    for b in batches:
        table = (torch.arange(b * pages, device=DEV, dtype=torch.int32).view(b, pages) + 1)
        seq = torch.full((b,), ctx, dtype=torch.int32, device=DEV)
        q_idx = torch.randn(b, 64, 128, device=DEV)
        w = torch.randn(b, 64, device=DEV) * 0.1
        logits = torch.empty(b, ctx, device=DEV)
        positions = torch.empty(b, 2048, dtype=torch.int32, device=DEV)
        indices = torch.empty(b, 2048, dtype=torch.int64, device=DEV)
        q = torch.randn(b, 128, 576, device=DEV)
        o = torch.empty(b, 128, 512, device=DEV)

        def step():
            dsa.indexer_logits(q_idx, w, table, seq, index_k, logits)
            dsa.topk(logits, seq, 2048, positions, out_slots=indices, page_table=table)
            dsa.sparse_mla(q, indices, latent, o, 576 ** -0.5)

        def audited_step():
            step()
            auditor.verify(sample=256, wait=False)

        graphs = {}
        for name, fn in (("bare", step), ("verify_inside", audited_step)):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            graphs[name] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[name]):
                fn()

        def replay_then_verify():
            graphs["bare"].replay()
            auditor.verify(sample=256, wait=False)

        def run(fn):  # stream time per step (CUDA events) and host time per step
            fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            for _ in range(replays):
                fn()
            end.record()
            host = (time.perf_counter() - t0) * 1e6 / replays
            end.synchronize()
            return start.elapsed_time(end) * 1000.0 / replays, host

        row = {"batch": b}
        for name, fn in (("bare", graphs["bare"].replay), ("verify_after", replay_then_verify),
                         ("verify_inside", graphs["verify_inside"].replay)):
            best = min(run(fn) for _ in range(3))
            row[f"{name}_us"], row[f"{name}_host_us"] = best
        for name in ("verify_after", "verify_inside"):
            row[f"{name}_added_us"] = row[f"{name}_us"] - row["bare_us"]
            row[f"{name}_added_pct"] = 100.0 * row[f"{name}_added_us"] / row["bare_us"]
        assert auditor.findings() == [], "an intact pool gave findings"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown(stores, audit, device, steps=(), model=None, model_note=""):
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
    if audit is None:  # --stores-only
        return "\n".join(lines) + "\n"
    phases = " + ".join(f"{k} {v:.1f}" for k, v in audit["verify_sample_phases_us"].items()
                        if k != "total")
    sample_bytes = 256 * (1152 + 256)
    lines += ["", f"SlotAuditor on a 1M-token layer (index-K + latent bf16, "
              f"{audit['watched_slots']} live slots): verify all {audit['verify_all_us']:.0f} µs "
              f"({audit['verify_all_GBps']:.0f} GB/s); record of 1M slots from int64 tensors "
              f"{audit['record_1M_ms']:.0f} ms (from Python lists "
              f"{audit['record_1M_from_lists_ms']:.0f} ms); a planted clobber found as "
              f"{audit['clobber_found']} (synchronous) and "
              f"{audit['clobber_found_async']} (asynchronous).",
              "",
              "| verify, 256 sampled slots, both pools | host µs per call | GPU µs |",
              "|---|---|---|",
              f"| synchronous `verify(sample=256)` | {audit['verify_sample_us']:.1f} ({phases}) | "
              f"(waits for it) |",
              f"| asynchronous `verify(sample=256, wait=False)` | {audit['async_call_us']:.1f} "
              f"(upload {audit['async_phases_us']['pick']:.1f}, launch "
              f"{audit['async_phases_us']['launch']:.1f}) | {audit['async_kernel_us']:.1f} "
              f"(launches in a graph, CUDA events) |",
              f"| `poll()` | {audit['poll_us']:.1f} | one copy of 792 bytes |",
              "",
              f"Napkin math: a sample reads 256 x (1152 + 256) B = {sample_bytes / 1e3:.0f} KB, "
              f"{sample_bytes / 4.8e12 * 1e6:.2f} µs at the H200's 4.8 TB/s; the kernel is one "
              f"dependent walk of a token per thread (72 16-byte loads of latent), so its time is "
              f"latency (a few µs), not bandwidth."]
    if steps:
        lines += ["", "Added to a decode step: a CUDA graph of one layer's attention on caller "
                  "tensors (dsa.indexer_logits + dsa.topk + dsa.sparse_mla, V3.2 dims, context "
                  "4096, over the audited 1M-token pools), replayed 200 times, best of 3; stream "
                  "µs per step by CUDA events.", "",
                  "| batch | step µs | + verify after each replay: µs / added µs / % | "
                  "verify captured inside: µs / added µs / % | added, as % of the full one-layer "
                  "step (2026-12-03-h200-decode.md) |", "|---|---|---|---|---|"]
        for r in steps:
            full = DECODE_STEP_MS.get(f"B={r['batch']}")
            share = (f"{100 * r['verify_after_added_us'] / (full * 1e3):.2f}% / "
                     f"{100 * r['verify_inside_added_us'] / (full * 1e3):.2f}% of {full:.3f} ms"
                     if full else "-")
            lines.append(
                f"| {r['batch']} | {r['bare_us']:.1f} | {r['verify_after_us']:.1f} / "
                f"{r['verify_after_added_us']:+.1f} / {r['verify_after_added_pct']:+.2f}% | "
                f"{r['verify_inside_us']:.1f} / {r['verify_inside_added_us']:+.1f} / "
                f"{r['verify_inside_added_pct']:+.2f}% | {share} |")
        lines += ["", "An engine audits once per step, not once per layer: against a 61-layer "
                  "step the one-layer figures above shrink 61-fold; the whole-model audit is "
                  "below. Goal: < 2% of a decode step."]
    if model:
        m = model
        step_ms = 61 * DECODE_STEP_MS["B=1"]
        lines += ["", f"Whole model: {m['layers']} layers of 1M-token pools (index-K + latent "
                  f"bf16, distinct memory, {m['layers'] * 2} pools in one auditor): record of 1M "
                  f"slots {m['record_1M_ms']:.0f} ms, verify all "
                  f"{m['verify_all_us'] / 1e3:.1f} ms, "
                  f"synchronous sample of 256 {m['verify_sample_us']:.1f} µs; asynchronous "
                  f"sample of 256 (every pool in one launch): {m['async_call_us']:.1f} µs host, "
                  f"{m['async_kernel_us']:.1f} µs GPU = "
                  f"{100 * m['async_kernel_us'] / (step_ms * 1e3):.3f}% of a {m['layers']}-layer "
                  f"B=1 step ({m['layers']} x {DECODE_STEP_MS['B=1']:.3f} ms). Napkin math: "
                  f"{256 * m['layers'] * 1408 / 1e6:.1f} MB read, "
                  f"{256 * m['layers'] * 1408 / 4.8e12 * 1e6:.1f} µs at 4.8 TB/s."]
    elif model_note:
        lines += ["", model_note]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--stores-only", action="store_true", help="time the stores, skip the auditor")
    args = ap.parse_args()
    pages = POOL_TOKENS // 64 + 1 + 64
    pool_bf16 = torch.zeros(pages, 64, 128, dtype=torch.bfloat16, device=DEV)
    pool_fp8 = torch.zeros(pages, 64 * 132, dtype=torch.uint8, device=DEV)
    stores = store_rows(pool_bf16, pool_fp8)
    del pool_bf16, pool_fp8
    torch.cuda.empty_cache()
    if args.stores_only:
        md = markdown(stores, None, torch.cuda.get_device_name())
        print(md, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "stores": stores}, f, indent=2)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(md)
        return
    audit, layer, auditor = audit_rows()
    steps = step_graph_rows(layer, auditor)
    del layer, auditor
    torch.cuda.empty_cache()
    # The whole model's pools, when the memory allows: 1.48 GB a layer, plus the auditor's digests.
    free = torch.cuda.mem_get_info()[0]
    layers = min(61, int((free - (12 << 30)) // (POOL_TOKENS * (1408 + 32))))
    model, model_note = None, ""
    if layers >= 8:
        model = model_audit_rows(layers)
    else:
        model_note = f"Whole model: skipped ({free / 2**30:.0f} GiB free)."
    device = torch.cuda.get_device_name()
    md = markdown(stores, audit, device, steps, model, model_note)
    print(md, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "stores": stores,
                       "audit": audit, "audit_step_graph": steps, "audit_model": model}, f,
                      indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
