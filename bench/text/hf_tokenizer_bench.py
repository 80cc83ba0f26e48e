#!/usr/bin/env python3
"""Hugging Face `tokenizers` encode throughput on one thread, on the corpus of
bench/text/bench_tokenizer.cpp (the repository's C++ sources sorted by path, README.md and
tests/data/text/multilingual.txt, joined by newlines), so both run on the same CPU in one go:

  TOKENIZERS_PARALLELISM=false python3 bench/text/hf_tokenizer_bench.py \
      [--tokenizer-dir ../shared/data/deepseek-v3-tokenizer] [--dsa build/dsa]

Prints MB/s for the whole corpus (best of --repeats, after one warm-up pass that fills the word
cache, as the C++ benchmark's repetitions do) and ns/token at about 10K/50K/100K/200K tokens.
With --dsa, also checks that `dsa tokenize` gives the same ids for the corpus.
"""
import argparse
import json
import os
import pathlib
import subprocess
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")
from tokenizers import Tokenizer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def corpus():
    files = []
    for d in ("src", "tools", "include"):
        for p in (ROOT / d).rglob("*"):
            if p.is_file() and p.suffix in (".cpp", ".h", ".cu", ".cuh"):
                files.append(p.relative_to(ROOT).as_posix())
    files.sort(key=lambda s: s.encode())
    files += ["README.md", "tests/data/text/multilingual.txt"]
    return "".join((ROOT / f).read_bytes().decode("utf-8") + "\n" for f in files)


def best_time(fn, repeats):
    fn()  # warm-up: fills the word cache
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", default=str(ROOT.parent / "shared/data/deepseek-v3-tokenizer"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--dsa", help="the dsa program, to compare its ids on the corpus")
    a = ap.parse_args()
    tok = Tokenizer.from_file(str(pathlib.Path(a.tokenizer_dir) / "tokenizer.json"))
    text = corpus()
    nbytes = len(text.encode("utf-8"))
    ids = tok.encode(text, add_special_tokens=False).ids
    t = best_time(lambda: tok.encode(text, add_special_tokens=False), a.repeats)
    print(f"HF tokenizers {__import__('tokenizers').__version__}, 1 thread: corpus {nbytes} bytes, "
          f"{len(ids)} tokens, {t * 1e3:.2f} ms, {nbytes / t / 1e6:.2f} MB/s")
    bytes_per_token = len(text) / len(ids)
    for n in (10_000, 50_000, 100_000, 200_000):
        s = (text * (int(n * bytes_per_token) // len(text) + 1))[: int(n * bytes_per_token)]
        k = len(tok.encode(s, add_special_tokens=False).ids)
        ts = best_time(lambda: tok.encode(s, add_special_tokens=False), 3)
        print(f"  {k:7d} tokens: {ts * 1e3:8.2f} ms, {ts * 1e9 / k:7.1f} ns/token")
    if a.dsa:
        with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
            f.write(text.encode("utf-8"))
        out = subprocess.run([a.dsa, "tokenize", "--tokenizer",
                              str(pathlib.Path(a.tokenizer_dir) / "tokenizer.json"),
                              "--file", f.name, "--json"], check=True, capture_output=True)
        os.unlink(f.name)
        same = json.loads(out.stdout) == ids
        print(f"dsa tokenize ids on the corpus: {'identical' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
