#!/usr/bin/env python3
"""Racecheck's hazards by source-location pair, as a markdown table.

Reads compute-sanitizer racecheck output (the whole device log, or the part after a step marker),
groups the hazards by (type, first access, second access) with addresses and thread coordinates
stripped, and writes the table. Every hazard line it cannot place is counted under "unparsed"
with its first raw lines kept, so a report the table does not understand never reads as clean:
the script exits 1 when racecheck's summary counts hazards and none were tabled or the table
misses some.

    racecheck_table.py LOG OUT.md [--marker "=== sanitizer-racecheck:"] [--raw RAW.txt]
"""
import argparse
import collections
import os
import re
import sys

HAZARD = re.compile(r"Potential (\w+) hazard")
ACCESS = re.compile(r"(Write|Read)\s+Thread.*?\bin\s+(.+?)\s*$")
RACE = re.compile(r"Race reported between (\w+) access.*?\bin\s+(\S+).*?\band (\w+) access.*?"
                  r"\bin\s+(\S+)")
SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warn")


def place(loc: str) -> str:
    """file:line and the function (with its template arguments), no directories or offsets."""
    m = re.search(r"([^\s/:]+\.(?:cu|cuh|h|hpp|cpp)):(\d+)", loc)
    if not m:
        return re.sub(r"\+?0x[0-9a-fA-F]+", "", loc)[:80]
    fn = loc[m.end():].lstrip(":").removeprefix("void ")
    fn = fn.replace("(anonymous namespace)::", "").replace("dsa::cuda::", "")
    if fn.endswith(")") and "(" in fn:
        depth = 0  # cut the argument list: the last top-level parenthesis
        for i in range(len(fn) - 1, -1, -1):
            depth += fn[i] == ")"
            depth -= fn[i] == "("
            if depth == 0:
                fn = fn[:i]
                break
    return f"{m.group(1)}:{m.group(2)} {fn[:60]}".strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("out")
    ap.add_argument("--marker", default="=== sanitizer-racecheck:")
    ap.add_argument("--raw", help="write the section's first 120 hazard lines here")
    a = ap.parse_args()
    text = open(a.log, errors="replace").read()
    if a.marker and a.marker in text:
        text = text.split(a.marker, 1)[1].split("\n=== ", 1)[0]
    lines = text.splitlines()
    pairs = collections.Counter()
    unparsed = 0
    raw = []
    for i, line in enumerate(lines):
        m = HAZARD.search(line)
        if m:
            acc = [ACCESS.search(x) for x in lines[i + 1:i + 4]]
            acc = [x for x in acc if x]
            if len(raw) < 120:
                raw.extend(lines[i:i + 4])
            if len(acc) >= 2:
                pairs[(m.group(1), f"{acc[0].group(1)} {place(acc[0].group(2))}",
                       f"{acc[1].group(1)} {place(acc[1].group(2))}")] += 1
            else:
                unparsed += 1
            continue
        r = RACE.search(line)
        if r:
            pairs[("race", f"{r.group(1)} {place(r.group(2))}",
                   f"{r.group(3)} {place(r.group(4))}")] += 1
    summary = SUMMARY.search(text)
    counted = int(summary.group(1)) if summary else 0
    out = ["| hazard | first access | second access | count |", "|---|---|---|---|"]
    out += [f"| {k[0]} | {k[1]} | {k[2]} | {n} |" for k, n in pairs.most_common()]
    if unparsed:
        out.append(f"| unparsed | | | {unparsed} |")
    if not pairs and not unparsed:
        out.append("| none | | | 0 |")
    tabled = sum(n for k, n in pairs.items() if k[0] != "race") + unparsed
    out.append("")
    out.append(f"racecheck summary: {summary.group(0) if summary else 'none found'}; "
               f"tabled {tabled}")
    open(a.out, "w").write("\n".join(out) + "\n")
    print("\n".join(out))
    if a.raw:
        open(a.raw, "w").write("\n".join(raw) + "\n")
    # A summary that counts hazards the table does not hold is a parser gap, never "clean".
    return 1 if counted > 0 and (tabled == 0 or unparsed > 0) else 0


if __name__ == "__main__":
    sys.exit(main())
