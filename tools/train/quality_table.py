#!/usr/bin/env python3
"""Prints the perplexity tables of docs/quality.md from the measurement files (lines of
`deltaserve perplexity --json`; pytorch_ref.json from tools/train/train.py):
  quality_table.py DIR PYTORCH_REF.json
DIR holds cpu_ppl.jsonl and cuda_ppl.jsonl (whole held-out text), cpu_short_ppl.jsonl,
cuda_prefill_short_ppl.jsonl and cuda_decode_ppl.jsonl (its first 4096 tokens)."""
import json
import os
import sys

TYPES = ["f32", "f16", "q8_0", "q6_k", "q5_k", "q4_k", "iq4_xs", "iq4_nl"]


def load(path):
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            out[os.path.basename(j["model"]).replace("demo-", "").replace(".gguf", "")] = j
    return out


def fmt(x):
    return f"{x:.4f}" if x is not None else "not measured"


def rel(a, b):
    return f"{(a / b - 1) * 100:+.4f}%" if a is not None and b is not None else "-"


def ppl(d, t):
    return d.get(t, {}).get("perplexity")


def main():
    d, ref = sys.argv[1], json.load(open(sys.argv[2]))
    cpu, cuda = load(f"{d}/cpu_ppl.jsonl"), load(f"{d}/cuda_ppl.jsonl")
    cs, ps, ds = (load(f"{d}/cpu_short_ppl.jsonl"), load(f"{d}/cuda_prefill_short_ppl.jsonl"),
                  load(f"{d}/cuda_decode_ppl.jsonl"))
    n = next(iter(cuda.values()))["scored"] if cuda else 0
    print(f"Whole held-out text ({n} scored tokens, windows of 512):\n")
    print("| weights | file MB | CPU | CUDA | CUDA vs CPU | CUDA vs CUDA F32 |")
    print("|---|---|---|---|---|---|")
    base = ppl(cpu, "f32")
    for t in TYPES:
        f = f"build/demo-variants/demo-{t}.gguf"
        size = f"{os.path.getsize(f) / 1e6:.1f}" if os.path.exists(f) else "-"
        print(f"| {t.upper()} | {size} | {fmt(ppl(cpu, t))} | {fmt(ppl(cuda, t))} | "
              f"{rel(ppl(cuda, t), ppl(cpu, t))} | {rel(ppl(cuda, t), ppl(cuda, 'f32')) if t != 'f32' else ''} |")
    print(f"| PyTorch F32 | | {ref['ppl_f32_ctx512']:.4f} | | | |")
    print(f"| PyTorch F16-rounded | | {ref['ppl_f16_ctx512']:.4f} | | | |")
    m = next(iter(ps.values()))["scored"] if ps else 0
    print(f"\nFirst 4096 held-out tokens ({m} scored): the CUDA prefill path (the window as one chunk) and "
          "decode path (`--decode-path`: one token per step, the decode kernels) against the CPU:\n")
    print("| weights | CPU | CUDA prefill | CUDA decode | prefill vs CPU | decode vs CPU |")
    print("|---|---|---|---|---|---|")
    for t in TYPES:
        c = ppl(cs, t)
        print(f"| {t.upper()} | {fmt(c)} | {fmt(ppl(ps, t))} | {fmt(ppl(ds, t))} | {rel(ppl(ps, t), c)} | "
              f"{rel(ppl(ds, t), c)} |")
    if base:
        print(f"\nCPU F32 vs PyTorch F32: {rel(base, ref['ppl_f32_ctx512'])}; "
              f"CUDA F32 vs PyTorch F32: {rel(ppl(cuda, 'f32'), ref['ppl_f32_ctx512'])}.")


if __name__ == "__main__":
    main()
