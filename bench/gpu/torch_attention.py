#!/usr/bin/env python3
"""The torch code a user would otherwise write for the attention bench rows of dsa_gpu_bench.

Same row names, shapes and cache layouts as bench/gpu/bench_attention.cpp:
  indexer_logits/{fp8,bf16}/B=64/L=32768, B=1/L=131072  gather pages, einsum, relu, head sum
  topk/k={2048,512}/B={1,64,256}/L={32768,131072}  torch.topk
  sparse_mla/{bf16,fp8}/B={1,64,256}/H=128/topk=2048 gather, einsum, softmax, einsum

Usage: torch_attention.py OUT.json   writes [{"name": ..., "us": ...}, ...] (median per call).
"""
import json
import sys

import torch

PAGE = 64
ROTATE_BYTES = 192 * 1024 * 1024  # > 3x the H200's 60 MB L2, as the C++ benches


def median_us(fn, iters, repeats=7):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    times.sort()
    return times[len(times) // 2]


def rotation_sets(bytes_per_set):
    return max(1, int(ROTATE_BYTES / max(bytes_per_set, 1)) + 1)


def cycling(sets, body):
    state = {"i": 0}

    def fn():
        s = sets[state["i"] % len(sets)]
        state["i"] += 1
        return body(*s)

    return fn


def shuffled_pages(rows, pages_per_row, device):
    return (torch.randperm(rows * pages_per_row, device=device) + 1).view(rows, pages_per_row)


def bench_indexer(dtype, rows, length, device):
    heads, dim = 64, 128
    ppr = length // PAGE
    pages = rows * ppr + 1
    table = shuffled_pages(rows, ppr, device).long()
    q = torch.randn(rows, heads, dim, device=device)
    w = torch.randn(rows, heads, device=device) * 0.1
    if dtype == "bf16":
        cache = torch.randn(pages, PAGE, dim, device=device).to(torch.bfloat16)

        def run():
            k = cache[table].view(rows, length, dim)  # gather pages
            s = torch.einsum("bhd,btd->bht", q.to(torch.bfloat16), k).float()
            return (s.relu() * w[:, :, None]).sum(1)
    else:
        # [pages, 64 * 132] bytes: 64 x 128 e4m3, then 64 f32 scales.
        values = torch.randn(pages, PAGE * dim, device=device).to(torch.float8_e4m3fn)
        scales = torch.rand(pages, PAGE, device=device) + 0.5
        cache = torch.cat([values.view(torch.uint8), scales.view(torch.uint8)], dim=1)
        amax = q.abs().amax(-1, keepdim=True).clamp_min(1e-4)
        s_q = amax / 448.0
        q8 = (q / s_q).to(torch.float8_e4m3fn)
        w_eff = w * s_q[..., 0]

        def run():
            g = cache[table]  # [rows, ppr, 8448] bytes
            k = g[..., : PAGE * dim].contiguous().view(torch.float8_e4m3fn)
            k = k.view(rows, length, dim).to(torch.bfloat16)
            k_scale = g[..., PAGE * dim:].contiguous().view(torch.float32).view(rows, length)
            s = torch.einsum("bhd,btd->bht", q8.to(torch.bfloat16), k).float()
            return (s.relu() * w_eff[:, :, None]).sum(1) * k_scale

    return f"indexer_logits/{dtype}/B={rows}/L={length}", median_us(run, 5)


def bench_topk(rows, length, k, device):
    sets = [(torch.randn(rows, length, device=device),)
            for _ in range(rotation_sets(rows * length * 4))]
    fn = cycling(sets, lambda x: torch.topk(x, k, dim=-1))
    return f"topk/k={k}/B={rows}/L={length}", median_us(fn, 200 if rows == 1 else 20)


def bench_sparse_mla(dtype, rows, device):
    heads, topk, lat, rope = 128, 2048, 512, 64
    scale = 192 ** -0.5
    tokens = rows * topk
    if dtype == "bf16":
        cache = torch.randn(tokens + PAGE, lat + rope, device=device).to(torch.bfloat16)
    else:
        vals = torch.randn(tokens + PAGE, lat, device=device).to(torch.float8_e4m3fn)
        tile = torch.rand(tokens + PAGE, 4, device=device) + 0.5
        rope_v = torch.randn(tokens + PAGE, rope, device=device).to(torch.bfloat16)
        cache = torch.cat([vals.view(torch.uint8), tile.view(torch.uint8),
                           rope_v.view(torch.uint8)], dim=1)  # [N, 656] bytes
    indices = (torch.randperm(tokens, device=device) + PAGE).view(rows, topk)
    q = torch.randn(rows, heads, lat + rope, device=device)

    def run():
        if dtype == "bf16":
            kv = cache[indices]  # [rows, topk, 576]
        else:
            g = cache[indices]   # [rows, topk, 656] bytes
            c = g[..., :lat].contiguous().view(torch.float8_e4m3fn).float()
            s = g[..., lat:lat + 16].contiguous().view(torch.float32)
            c = (c.view(rows, topk, 4, 128) * s[..., None]).view(rows, topk, lat)
            r = g[..., lat + 16:].contiguous().view(torch.bfloat16)
            kv = torch.cat([c.to(torch.bfloat16), r], dim=-1)
        valid = (indices >= 0)[:, None, :]
        scores = torch.einsum("bhd,btd->bht", q.to(torch.bfloat16), kv).float() * scale
        p = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1)
        return torch.einsum("bht,btc->bhc", p.to(torch.bfloat16), kv[..., :lat])

    return f"sparse_mla/{dtype}/B={rows}/H=128/topk=2048", median_us(run, 50 if rows == 1 else 5)


def main():
    # --only FAMILIES: a comma-separated subset of indexer_logits, topk, sparse_mla.
    argv = [a for a in sys.argv[1:] if a != "--json"]
    families = {"indexer_logits", "topk", "sparse_mla"}
    if "--only" in argv:
        i = argv.index("--only")
        if i + 1 >= len(argv) or not set(argv[i + 1].split(",")) <= families:
            sys.exit(f"--only takes a comma-separated subset of {sorted(families)}")
        families = set(argv[i + 1].split(","))
        del argv[i:i + 2]
    if len(argv) != 1:
        sys.exit("usage: torch_attention.py [--only FAMILIES] [--json] OUT.json")
    args = argv
    device = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    if "indexer_logits" in families:
        for dtype in ("fp8", "bf16"):
            rows.append(bench_indexer(dtype, 64, 32768, device))
            rows.append(bench_indexer(dtype, 1, 131072, device))
    if "topk" in families:
        for k in (2048, 512):
            for length in (32768, 131072):
                for b in (1, 64, 256):
                    rows.append(bench_topk(b, length, k, device))
    if "sparse_mla" in families:
        for dtype in ("bf16", "fp8"):
            for b in (1, 64, 256):
                rows.append(bench_sparse_mla(dtype, b, device))
    for name, us in rows:
        print(f"  {name:<44} {us:10.2f} us")
    with open(args[0], "w") as f:
        json.dump([{"name": n, "us": u} for n, u in rows], f, indent=1)


if __name__ == "__main__":
    main()
