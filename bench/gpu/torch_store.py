#!/usr/bin/env python3
"""Torch baselines of the cache stores: what a user would write without dsa.cpp's writers.

  bf16: pool.view(-1, D).index_put_((loc,), x.to(bfloat16))      (the framework scatter)
  fp8:  amax, scale = max(amax, 1e-4) / 448, x / scale, .to(float8_e4m3fn), then scatter the
        values and the scales into the same page layout as dsa.cpp (DESIGN §3).

Same sizes, same row names and the same rotation over > 3x L2 as dsa_gpu_bench's store benches;
timed with CUDA events (warm-up, median of 7 repeats), twice: eager Python calls (at small sizes
this mostly measures torch's per-op launch overhead), and the same calls captured once in a
torch.cuda.graph and replayed (what a graph-captured decode step pays). Writes JSON rows
{name, us, us_eager, us_graph}; `us`, the row compared with dsa.cpp, is the graphed time, since
dsa_gpu_bench times its small stores graph-launched too.
"""
import argparse
import json

import torch

PAGE = 64
ROTATE_BYTES = 192 * 1024 * 1024
TOKENS = [1, 8, 64, 256, 1 << 20]
FP8_MAX = 448.0


def time_us(fn, iters):
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(7):
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / iters)
    return sorted(samples)[len(samples) // 2]


def time_graph_us(fn, calls):
    """fn called `calls` times inside one CUDA graph; per-call time of replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture, as torch.cuda.graph asks
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return time_us(graph.replay, 5) / calls


def page_shuffled_slots(total, gen):
    pages = (total + PAGE - 1) // PAGE
    order = torch.randperm(pages, generator=gen) + 1  # page 0 is reserved
    t = torch.arange(total)
    return (order[t // PAGE] * PAGE + t % PAGE).cuda()


def quantize(x, groups):
    """x [n, groups*128] f32 -> (e4m3 bytes [n, groups*128], scales [n, groups])."""
    g = x.view(x.shape[0], groups, 128)
    scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-4) / FP8_MAX
    q = (g / scale).to(torch.float8_e4m3fn).view(torch.uint8).view(x.shape[0], groups * 128)
    return q, scale.view(x.shape[0], groups)


def bench(layout, dtype, tokens, gen):
    width = 128 if layout == "index_k" else 576
    if layout == "index_k":
        pool_bytes = 256 if dtype == "bf16" else 132
    else:
        pool_bytes = 1152 if dtype == "bf16" else 656
    per_token = width * 4 + 8 + pool_bytes
    sets = int(ROTATE_BYTES / (per_token * tokens)) + 1
    total = sets * tokens
    pages = (total + PAGE - 1) // PAGE + 1
    slots = page_shuffled_slots(total, gen)
    x = torch.randn(total, width, device="cuda", dtype=torch.float32)
    if dtype == "bf16":
        pool = torch.zeros(pages * PAGE * width, device="cuda", dtype=torch.bfloat16)
    elif layout == "index_k":
        pool = torch.zeros(pages, PAGE * 132, device="cuda", dtype=torch.uint8)
        values = pool[:, : PAGE * 128].view(pages, PAGE, 128)
        scales = pool[:, PAGE * 128:].view(torch.float32)  # [pages, 64]
    else:
        pool = torch.zeros(pages * PAGE, 656, device="cuda", dtype=torch.uint8)
    call = [0]

    def run():
        s = call[0] % sets
        call[0] += 1
        loc = slots[s * tokens:(s + 1) * tokens]
        xs = x[s * tokens:(s + 1) * tokens]
        if dtype == "bf16":
            pool.view(-1, width).index_put_((loc,), xs.to(torch.bfloat16))
        elif layout == "index_k":
            q, scale = quantize(xs, 1)
            page, off = loc // PAGE, loc % PAGE
            values.index_put_((page, off), q)
            scales.index_put_((page, off), scale[:, 0])
        else:
            q, scale = quantize(xs[:, :512].contiguous(), 4)
            rope = xs[:, 512:].to(torch.bfloat16).contiguous().view(torch.uint8)
            row = torch.cat([q, scale.contiguous().view(torch.uint8), rope], dim=1)
            pool.index_put_((loc,), row)

    calls = 10 if tokens > 256 else 200
    us_eager = time_us(run, calls)
    us_graph = time_graph_us(run, calls)
    name = f"store_{'index_k' if layout == 'index_k' else 'latent_kv'}/{dtype}/tokens={tokens}"
    print(f"  {name:44s} eager {us_eager:10.2f} us   graph {us_graph:10.2f} us", flush=True)
    del pool, x, slots
    torch.cuda.empty_cache()
    return {"name": name, "us": us_graph, "us_eager": us_eager, "us_graph": us_graph}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_store.py: no CUDA device")
    gen = torch.Generator().manual_seed(2024)
    rows = []
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    for layout in ("index_k", "latent"):
        for dtype in ("bf16", "fp8"):
            for tokens in TOKENS:
                rows.append(bench(layout, dtype, tokens, gen))
    with open(args.json, "w") as f:
        json.dump({"source": "torch", "torch": torch.__version__, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
