#!/usr/bin/env python3
"""The V3.2 decode step per batch from every decode-<name>.json that `dsa bench-decode --json`
wrote into a folder (the device scripts' $OUT), as a markdown table: one row per file, graph-replay
ms at B = 1 / 8 / 64 / 256.

usage: decode_table.py OUT_DIR
"""
import glob
import json
import os
import sys


def table(out):
    lines = ["| decode step, graph ms | B = 1 | B = 8 | B = 64 | B = 256 |",
             "|---|---|---|---|---|"]
    for path in sorted(glob.glob(os.path.join(out, "decode-*.json"))):
        rows = {r["batch"]: r["graph_ms"] for r in json.load(open(path)).get("results", [])}
        name = os.path.basename(path)[len("decode-"):-len(".json")]
        lines.append(f"| {name} | " + " | ".join(f"{rows[b]:.3f}" if b in rows else ""
                                                 for b in (1, 8, 64, 256)) + " |")
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip())
    print("\n".join(table(sys.argv[1])))
