#!/usr/bin/env python3
"""Joins dsa_gpu_bench's JSON with the torch baselines' JSON by row name.

For each dsa row: speedup over torch (torch_us / dsa_us) and the share of the floor reached
(floor_us / dsa_us, 1.0 = at the floor). Prints a markdown table, writes it with --markdown, and
writes the merged rows with --json.
"""
import argparse
import json
import os


def load_rows(path):
    data = json.load(open(path))
    return data.get("results", data) if isinstance(data, dict) else data


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dsa", required=True, help="dsa_gpu_bench --json output")
    ap.add_argument("--torch", nargs="*", default=[], help="torch_*.py --json outputs")
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    args = ap.parse_args()

    dsa = json.load(open(args.dsa))
    baselines = {}  # name -> (source, us)
    eager = {}      # name -> torch's eager time, when the baseline also timed a CUDA graph
    for path in args.torch:
        if not os.path.exists(path):
            continue
        source = os.path.splitext(os.path.basename(path))[0]
        for row in load_rows(path):
            baselines[row["name"]] = (source, float(row["us"]))
            if "us_eager" in row:
                eager[row["name"]] = float(row["us_eager"])

    ceil = dsa.get("ceilings", {})
    lines = [f"## bench: {dsa.get('device', '?')}", "",
             f"ceilings: copy {ceil.get('copy_gbs', 0):.0f} GB/s, empty launch "
             f"{ceil.get('empty_launch_us', 0):.2f} us, bf16 {ceil.get('bf16_tflops', 0):.0f} TFLOP/s",
             "",
             "| name | dsa us | GB/s | % copy | floor us | floor/dsa | torch us | torch/dsa | "
             "torch eager us |",
             "|---|---|---|---|---|---|---|---|---|"]
    merged = []
    for r in dsa.get("results", []):
        row = dict(r)
        us = float(r["us"])
        base = baselines.get(r["name"])
        if base:
            row["torch_source"], row["torch_us"] = base
            row["speedup_vs_torch"] = base[1] / us if us > 0 else None
        row["floor_ratio"] = float(r.get("floor_us", 0)) / us if us > 0 else None
        merged.append(row)
        torch_us = f"{base[1]:.2f}" if base else "-"
        speedup = f"{base[1] / us:.2f}x" if base and us > 0 else "-"
        if r["name"] in eager:
            row["torch_eager_us"] = eager[r["name"]]
        torch_eager = f"{eager[r['name']]:.2f}" if r["name"] in eager else "-"
        lines.append(f"| {r['name']} | {us:.2f} | {r.get('gbs', 0):.0f} | "
                     f"{r.get('pct_copy', 0):.0f}% | {r.get('floor_us', 0):.2f} | "
                     f"{row['floor_ratio'] or 0:.2f} | {torch_us} | {speedup} | {torch_eager} |")
    unmatched = sorted(set(baselines) - {r["name"] for r in dsa.get("results", [])})
    if unmatched:
        lines += ["", "torch rows without a dsa row: " + ", ".join(unmatched)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        open(args.markdown, "w").write(text)
    if args.json:
        json.dump({"device": dsa.get("device"), "ceilings": ceil, "results": merged},
                  open(args.json, "w"), indent=2)


if __name__ == "__main__":
    main()
