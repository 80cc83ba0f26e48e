#!/usr/bin/env python3
"""The decode step per batch from every decode-<name>.json that `dsa bench-decode --json` wrote
into a folder (the device scripts' $OUT), as a markdown table: one row per file, graph-replay ms
at B = 1 / 8 / 64 / 256; with --eager, "graph / eager" ms in each cell. --prefix names the files'
prefix (default decode-).

usage: decode_table.py [--eager] [--prefix PREFIX] OUT_DIR
"""
import argparse
import glob
import json
import os


def cell(row, eager):
    if row is None:
        return ""
    return f"{row['graph_ms']:.3f} / {row['eager_ms']:.3f}" if eager else f"{row['graph_ms']:.3f}"


def table(out, prefix="decode-", eager=False):
    what = "graph / eager ms" if eager else "graph ms"
    lines = [f"| decode step, {what} | B = 1 | B = 8 | B = 64 | B = 256 |",
             "|---|---|---|---|---|"]
    for path in sorted(glob.glob(os.path.join(out, f"{prefix}*.json"))):
        rows = {r["batch"]: r for r in json.load(open(path)).get("results", [])}
        name = os.path.basename(path)[len(prefix):-len(".json")]
        lines.append(f"| {name} | " + " | ".join(cell(rows.get(b), eager)
                                                 for b in (1, 8, 64, 256)) + " |")
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("out", metavar="OUT_DIR")
    parser.add_argument("--eager", action="store_true", help="graph / eager ms in each cell")
    parser.add_argument("--prefix", default="decode-", help="the files' prefix (decode-)")
    args = parser.parse_args()
    print("\n".join(table(args.out, args.prefix, args.eager)))
