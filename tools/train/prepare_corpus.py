#!/usr/bin/env python3
"""Brown Corpus (form C, tagged) -> plain English text for the demo model.

Each corpus file becomes one document: the part-of-speech tags are removed, the tokens are joined
back into ordinary spacing (punctuation attached, `` '' turned into double quotes) and paragraphs are
separated by a blank line. Documents are separated by <|endoftext|>. Every 20th file (sorted by
name) is held out for perplexity and MTP acceptance measurements.

A share of the training paragraphs is also written in the ChatML format the gateway uses
(common/tokenizer/chat_format.cc): the user asks to continue a sentence, the assistant continues
it. That is all the "chat" the demo model knows: it answers by continuing in Brown-corpus English.

Usage: prepare_corpus.py PACKAGE_DIR OUT_DIR
Writes OUT_DIR/train.txt, OUT_DIR/heldout.txt, OUT_DIR/corpus_stats.txt. Only the standard library.
"""
import os
import random
import re
import sys

NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "'", "''", "'s", "n't", "%"}
NO_SPACE_AFTER = {"(", "[", "``", "$"}
PROMPTS = ["Continue the text.", "Please continue.", "What comes next?", "Go on.",
           "Continue this passage."]


def detok(tokens):
    out = []
    prev = None
    for t in tokens:
        w = t
        if t == "``":
            w = '"'
        elif t == "''":
            w = '"'
        attach = (not out or t in NO_SPACE_BEFORE or (prev in NO_SPACE_AFTER)
                  or t.startswith("'") and len(t) <= 3 and t not in ("``", "''") and t != "'")
        if t == "'":
            attach = True
        out.append(w if attach else " " + w)
        prev = t
    s = "".join(out).strip()
    s = re.sub(r"\s+", " ", s)
    # Brown spells a few ligatures/dashes with doubled characters.
    s = s.replace(" --", " --")
    return s


def read_file(path):
    paras, cur = [], []
    with open(path, encoding="latin-1") as f:
        for line in f:
            if not line.strip():
                continue
            if line.startswith("\t") and cur:
                paras.append(" ".join(cur))
                cur = []
            toks = []
            for wt in line.split():
                w = wt.rsplit("/", 1)[0] if "/" in wt else wt
                toks.append(w)
            sent = detok(toks)
            if sent:
                cur.append(sent)
    if cur:
        paras.append(" ".join(cur))
    return paras


def main():
    src, out = sys.argv[1], sys.argv[2]
    names = sorted(n for n in os.listdir(src) if re.fullmatch(r"c[a-r]\d\d", n))
    rng = random.Random(1234)
    train, held = [], []
    n_chat = 0
    for i, n in enumerate(names):
        paras = read_file(os.path.join(src, n))
        if i % 20 == 10:
            held.append("\n\n".join(paras))
            continue
        train.append("\n\n".join(paras))
        # Chat-format examples from this document's paragraphs (about one in six).
        for p in paras:
            if rng.random() >= 1 / 6:
                continue
            sents = re.split(r"(?<=[.?!]) (?=[A-Z\"])", p)
            if len(sents) < 2:
                continue
            k = max(1, len(sents) // 3)
            user = " ".join(sents[:k])
            asst = " ".join(sents[k:])
            train.append("<|im_start|>user\n" + rng.choice(PROMPTS) + " " + user +
                         "<|im_end|>\n<|im_start|>assistant\n" + asst + "<|im_end|>\n")
            n_chat += 1
    rng.shuffle(train)
    sep = "<|endoftext|>"
    with open(os.path.join(out, "train.txt"), "w", encoding="utf-8") as f:
        f.write(sep.join(train))
    with open(os.path.join(out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(sep.join(held))
    with open(os.path.join(out, "corpus_stats.txt"), "w") as f:
        f.write(f"files {len(names)} heldout_files {len(held)} train_docs {len(train)} "
                f"chat_examples {n_chat}\n")
    print(f"{len(names)} files: {len(held)} held out, {len(train)} training documents "
          f"({n_chat} chat examples)")


if __name__ == "__main__":
    main()
