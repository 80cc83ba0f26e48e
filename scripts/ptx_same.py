#!/usr/bin/env python3
"""Whether moving CUDA code changed any kernel: the PTX of every kernel before and after.

For a change that only moves device code (a split into files, a helper folded into a struct),
the device code should not change at all. This compiles the kernels of the old files (from a git
revision) and of the new ones (the working tree) to PTX with the build's own flags
(build-gpu/compile_commands.json, without -lineinfo), and compares each kernel's body after
renaming what a move renames by itself: the anonymous namespace's per-file mangling, and the
per-file numbering of branch labels. Nothing runs on a GPU; it needs nvcc and a configured
build-gpu/ (scripts/gpu-build.sh).

usage: ptx_same.py [--base REV] OLD.cu [OLD.cu ...] -- NEW.cu [NEW.cu ...]
  --base REV  the revision the old files are read at (default HEAD); the whole src/ and include/
              of REV are unpacked beside them, so they compile against their own headers.
Prints one line per kernel (same, DIFFERENT, only before, only after) and exits 0 when every
kernel of the old files is in the new ones with the same body, 1 otherwise, 2 on bad usage.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

USAGE = "usage: ptx_same.py [--base REV] OLD.cu [OLD.cu ...] -- NEW.cu [NEW.cu ...]"
ANON = re.compile(r"\d*_GLOBAL__N__[0-9a-f]+_\d+_[A-Za-z0-9_]+?_cu_[0-9a-f]+")
LABEL = re.compile(r"\$L__BB\d+_")
ENTRY = re.compile(r"\.entry (\S+)\(")


def compile_command(root: str, path: str) -> list:
    """The build's nvcc command for `path` (any .cu of src/backend/cuda serves as the model)."""
    db = json.load(open(os.path.join(root, "build-gpu", "compile_commands.json")))
    model = next((e for e in db if e["file"].endswith(".cu")), None)
    if model is None:
        sys.exit("ptx_same.py: build-gpu/compile_commands.json has no .cu entry "
                 "(run scripts/gpu-build.sh first)")
    args = shlex.split(model["command"])
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c"):
            skip = a == "-o"
            continue
        if a == "-lineinfo" or a.endswith(".cu"):
            continue
        out.append(a)
    return out + ["-ptx", path]


def kernels(ptx: str) -> dict:
    out = {}
    for m in ENTRY.finditer(ptx):
        name = m.group(1)
        i = ptx.index("{", ptx.index(")", m.start()))
        depth, j = 0, i
        while True:
            depth += {"{": 1, "}": -1}.get(ptx[j], 0)
            if depth == 0:
                break
            j += 1
        body = ptx[m.start():j + 1].replace(name, "KERNEL")
        out[ANON.sub("ANON", name)] = LABEL.sub("$L__BB_", ANON.sub("ANON", body))
    return out


def ptx_of(root: str, include_root: str, path: str, work: str) -> dict:
    cmd = compile_command(root, path)
    # The old tree's headers first: -I<root>/src and friends are swapped for the unpacked ones.
    cmd = [a.replace(os.path.join(root, ""), os.path.join(include_root, "")) if a.startswith("-I")
           else a for a in cmd]
    out = os.path.join(work, os.path.basename(path) + f".{abs(hash(path))}.ptx")
    subprocess.run(cmd + ["-o", out], check=True, cwd=os.path.join(root, "build-gpu"))
    return kernels(open(out).read())


def main() -> int:
    args = sys.argv[1:]
    base = "HEAD"
    if args[:1] == ["--base"] and len(args) > 1:
        base, args = args[1], args[2:]
    cut = args.index("--") if "--" in args else -1
    old_files, new_files = (args[:cut], args[cut + 1:]) if cut >= 0 else ([], [])
    if not old_files or not new_files:
        print(USAGE, file=sys.stderr)
        return 2
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as work:
        old_root = os.path.join(work, "old")
        os.makedirs(old_root)
        archive = subprocess.run(["git", "archive", base, "src", "include"], cwd=root,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old_root], input=archive, check=True)
        before, after = {}, {}
        for f in old_files:
            before.update(ptx_of(root, old_root, os.path.join(old_root, f), work))
        for f in new_files:
            after.update(ptx_of(root, root, os.path.join(root, f), work))
    ok = True
    for name in sorted(set(before) | set(after)):
        if name not in after:
            state, ok = "only before", False
        elif name not in before:
            state = "only after"
        elif before[name] == after[name]:
            state = "same"
        else:
            state, ok = "DIFFERENT", False
        print(f"{state:12} {name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
