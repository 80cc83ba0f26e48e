#!/usr/bin/env python3
"""Where a kernel's warps wait, per CUDA source line, from Nsight Compute's source page.

Reads the CSV of `ncu -i REPORT --page source --csv --print-source cuda,sass` (a report taken
with --section SourceCounters --import-source yes) and prints the lines with the most warp-stall
samples: share of all samples, file:line, the source text and the three largest stall reasons.
Lines without a number are SASS the compiler attributed to no line of that file.

usage: ncu_stalls.py SOURCE.csv [TOP]
"""
import collections
import csv
import sys


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    header = None
    current = None
    samples = collections.Counter()
    reasons = collections.defaultdict(collections.Counter)
    text = {}
    with open(sys.argv[1], newline="") as f:
        for row in csv.reader(f):
            if not row or row[0] == "Function Name":
                continue
            if row[0] == "File Path":
                current = row[1].split("/")[-1]
                continue
            if row[0] == "Line No":
                header = row
                continue
            if header is None:
                continue
            try:
                count = int(row[4] or 0)
            except ValueError:
                continue
            key = (current, row[0])
            samples[key] += count
            text[key] = row[1].strip()
            for i, name in enumerate(header):
                if name.startswith("stall_") and "(Not" not in name and i < len(row):
                    try:
                        value = int(row[i] or 0)
                    except ValueError:
                        continue
                    if value:
                        reasons[key][name[len("stall_"):]] += value
    total = sum(samples.values())
    if total == 0:
        print("no stall samples in", sys.argv[1], file=sys.stderr)
        return 1
    print(f"total samples {total}")
    for key, count in samples.most_common(top):
        top3 = ", ".join(f"{r} {n}" for r, n in reasons[key].most_common(3))
        print(f"{100 * count / total:5.1f}% {key[0]}:{key[1]} {text[key][:90]} | {top3}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
