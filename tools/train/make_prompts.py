#!/usr/bin/env python3
"""Writes DATA/prompts.json (the CI test's prompts, tokenized by `deltaserve tokenize`) and
DATA/vocab.json (the vocabulary size the trainer needs).
Usage: make_prompts.py DELTASERVE DATA N_VOCAB"""
import array
import json
import os
import subprocess
import sys
import tempfile

PROMPTS = [
    "The jury said that",
    "It was a cold morning, and",
    "<|im_start|>user\nContinue the text. The old house stood at the end of the road.<|im_end|>\n"
    "<|im_start|>assistant\n",
]


def tokenize(binary, vocab, text):
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "p.txt"), os.path.join(d, "p.u16")
        with open(src, "w", encoding="utf-8") as f:
            f.write(text)
        subprocess.run([binary, "tokenize", "--model", vocab, "--text", src, "--out", dst], check=True,
                       stderr=subprocess.DEVNULL)
        a = array.array("H")
        with open(dst, "rb") as f:
            a.frombytes(f.read())
        return list(a)


def main():
    binary, data = sys.argv[1], sys.argv[2]
    vocab = os.path.join(data, "vocab.gguf")
    out = [{"text": p, "ids": tokenize(binary, vocab, p)} for p in PROMPTS]
    with open(os.path.join(data, "prompts.json"), "w") as f:
        json.dump(out, f, indent=1)
    n_vocab = int(sys.argv[3])  # bpe-train --vocab-size: the vocabulary has exactly that many ids
    with open(os.path.join(data, "vocab.json"), "w") as f:
        json.dump({"n_vocab": n_vocab}, f)
    for p in out:
        print(len(p["ids"]), "tokens:", repr(p["text"][:40]))


if __name__ == "__main__":
    main()
