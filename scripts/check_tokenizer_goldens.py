#!/usr/bin/env python3
"""Re-encodes the committed tokenizer goldens (tests/data/text/goldens_*.json, made with the npm
build of Hugging Face tokenizers by scripts/make_tokenizer_goldens.js) with Python `tokenizers`,
and reports how many cases give the same ids. Exit status 1 on any difference.

  python3 scripts/check_tokenizer_goldens.py [--deepseek-dir ../shared/data/deepseek-v3-tokenizer]
"""
import argparse
import json
import pathlib
import sys

from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent


def check(tokenizer_file, goldens_file):
    tok = Tokenizer.from_file(str(tokenizer_file))
    cases = json.loads(goldens_file.read_text(encoding="utf-8"))["cases"]
    bad = [c["name"] for c in cases
           if tok.encode(c["text"], add_special_tokens=False).ids != c["ids"]]
    print(f"{goldens_file.name}: {len(cases) - len(bad)}/{len(cases)} identical "
          f"(Python tokenizers {__import__('tokenizers').__version__})"
          + (f"; differ: {bad[:10]}" if bad else ""))
    return not bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepseek-dir", default=str(ROOT.parent / "shared/data/deepseek-v3-tokenizer"))
    a = ap.parse_args()
    data = ROOT / "tests/data/text"
    ok = check(ROOT / "data/tokenizers/tiny/tokenizer.json", data / "goldens_tiny.json")
    ok &= check(pathlib.Path(a.deepseek_dir) / "tokenizer.json", data / "goldens_deepseek_v3.json")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
