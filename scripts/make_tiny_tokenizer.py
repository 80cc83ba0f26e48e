#!/usr/bin/env python3
"""Derives the tiny presets' tokenizer (data/tokenizers/tiny/) from DeepSeek-V3's tokenizer.json.

Deterministic: the same input file gives the same bytes. The result is a 1024-entry byte-level
BPE with DeepSeek-V3's normalizer, pre-tokenizer, post-processor and decoder unchanged:
  ids 0-2      <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, <｜▁pad▁｜> (DeepSeek's ids)
  ids 3-258    the 256 byte-level characters (DeepSeek's ids)
  ids 259-...  DeepSeek's merges in rank order, each kept when both of its parts are kept, until
               the vocabulary reaches 1024 minus the chat tokens
  the last 17  DeepSeek-V3's chat / tool / FIM added tokens plus <think> and </think>, with
               DeepSeek's special/normalized flags (<think> and </think> as <｜User｜>).
Merges are written in the ["a", "b"] pair form (DeepSeek's file uses "a b" strings), so both
forms are exercised.

  /usr/bin/python3 scripts/make_tiny_tokenizer.py \
      ../shared/data/deepseek-v3-tokenizer/tokenizer.json data/tokenizers/tiny
"""
import json
import os
import sys

VOCAB_SIZE = 1024
TAIL_TOKENS = [
    "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>", "<｜tool▁sep｜>", "<think>", "</think>",
]


def main(src, out_dir):
    with open(src, encoding="utf-8") as f:
        ds = json.load(f)
    ds_vocab = ds["model"]["vocab"]
    ds_by_id = {i: t for t, i in ds_vocab.items()}
    ds_added = {t["content"]: t for t in ds["added_tokens"]}

    vocab = {}
    for i in range(259):  # the three sentence tokens and the byte alphabet
        vocab[ds_by_id[i]] = i
    n_merges_target = VOCAB_SIZE - len(TAIL_TOKENS) - len(vocab)
    merges = []
    for m in ds["model"]["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b not in vocab:
            vocab[a + b] = len(vocab)
            merges.append([a, b])
            if len(merges) == n_merges_target:
                break
    assert len(vocab) == VOCAB_SIZE - len(TAIL_TOKENS)

    def added(content, token_id):
        base = ds_added.get(content) or ds_added["<｜User｜>"]
        return {"id": token_id, "content": content, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": base["normalized"], "special": base["special"]}

    added_tokens = [added(ds_by_id[i], i) for i in range(3)]
    added_tokens += [added(c, len(vocab) + k) for k, c in enumerate(TAIL_TOKENS)]

    model = dict(ds["model"])
    model["vocab"] = vocab
    model["merges"] = merges
    tok = {
        "version": ds["version"], "truncation": None, "padding": None,
        "added_tokens": added_tokens, "normalizer": ds["normalizer"],
        "pre_tokenizer": ds["pre_tokenizer"], "post_processor": ds["post_processor"],
        "decoder": ds["decoder"], "model": model,
    }
    config = {
        "add_bos_token": True, "add_eos_token": False,
        "bos_token": ds_by_id[0], "eos_token": ds_by_id[1], "pad_token": ds_by_id[1],
        "clean_up_tokenization_spaces": False, "model_max_length": 131072,
        "tokenizer_class": "LlamaTokenizerFast", "unk_token": None,
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    same = sum(1 for t, i in vocab.items() if ds_vocab.get(t) == i)
    print(f"wrote {out_dir}: {len(vocab)} vocab entries ({same} with DeepSeek's id), "
          f"{len(merges)} merges, {len(added_tokens)} added tokens, vocab_size {VOCAB_SIZE}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
