#!/usr/bin/env python3
"""Runs one dsa command and checks its exit status and its two output streams separately.

  expect_exit.py STATUS [checks and set-up ...] -- COMMAND [ARGS ...]

Checks:   --stderr RE     stderr must match RE (re.search, DOTALL)
          --stdout RE     stdout must match RE
          --no-stdout RE  stdout must not match RE
An argument @EMPTY@ of the command is passed as the empty string (CMake drops empty arguments).
Set-up (run in order, before the command; paths are created fresh):
          --stdout-file PATH      send the command's stdout to PATH (e.g. /dev/full)
          --mkfifo PATH           a FIFO at PATH
          --make-file PATH BYTES  a regular file of BYTES bytes of 'a'
          --copy-dir SRC DST      a copy of directory SRC at DST
          --set-json FILE KEY JSON  set FILE[KEY] = JSON (a JSON object file)
          --truncate FILE BYTES   cut FILE to BYTES bytes
"""
import json
import os
import re
import shutil
import subprocess
import sys


def main(argv):
    if "--" not in argv:
        sys.exit("expect_exit.py: no '--' before the command")
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1:]
    want = int(opts.pop(0))
    checks, stdout_file, i = [], None, 0
    while i < len(opts):
        flag = opts[i]
        if flag in ("--stderr", "--stdout", "--no-stdout"):
            checks.append((flag, opts[i + 1]))
            i += 2
        elif flag == "--stdout-file":
            stdout_file = opts[i + 1]
            i += 2
        elif flag == "--mkfifo":
            path = opts[i + 1]
            if os.path.lexists(path):
                os.remove(path)
            os.mkfifo(path)
            i += 2
        elif flag == "--make-file":
            with open(opts[i + 1], "wb") as f:
                f.write(b"a" * int(opts[i + 2]))
            i += 3
        elif flag == "--copy-dir":
            shutil.rmtree(opts[i + 2], ignore_errors=True)
            shutil.copytree(opts[i + 1], opts[i + 2])
            i += 3
        elif flag == "--set-json":
            with open(opts[i + 1]) as f:
                doc = json.load(f)
            doc[opts[i + 2]] = json.loads(opts[i + 3])
            with open(opts[i + 1], "w") as f:
                json.dump(doc, f)
            i += 4
        elif flag == "--truncate":
            os.truncate(opts[i + 1], int(opts[i + 2]))
            i += 3
        else:
            sys.exit(f"expect_exit.py: unknown option {flag}")

    command = ["" if a == "@EMPTY@" else a for a in command]
    out_target = open(stdout_file, "wb") if stdout_file else subprocess.PIPE
    proc = subprocess.run(command, stdout=out_target, stderr=subprocess.PIPE, timeout=120)
    out = proc.stdout.decode(errors="replace") if proc.stdout is not None else ""
    err = proc.stderr.decode(errors="replace")
    failures = []
    if proc.returncode != want:
        failures.append(f"exit status {proc.returncode}, expected {want}")
    for flag, pattern in checks:
        text = err if flag == "--stderr" else out
        found = re.search(pattern, text, re.DOTALL) is not None
        if found != (flag != "--no-stdout"):
            stream = "stderr" if flag == "--stderr" else "stdout"
            failures.append(f"{stream} {'matches' if found else 'lacks'} /{pattern}/")
    if failures:
        print("command:", " ".join(command))
        print("--- stdout ---\n" + out[-4000:])
        print("--- stderr ---\n" + err[-4000:])
        print("FAILED: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
