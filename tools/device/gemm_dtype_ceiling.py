#!/usr/bin/env python3
"""What the card's vendor kernels do at the 27B's prefill GEMM shapes in each operand type
(issue #22: whether int8 / FP8 prefill GEMMs can beat bf16, before building one): PyTorch on the
device machine, bf16 `matmul`, int8 `torch._int_mm` (cuBLASLt IMMA, int32 out) and FP8 e4m3
`torch._scaled_mm` with per-token x per-channel scales (rowwise) and, where this PyTorch has it,
with DeepSeek-V3's block scales (1 x 128 for the activations, 128 x 128 for the weights: cuBLASLt's
VEC128 / BLK128x128 modes) and an f32 output.
Prints us per product and T(FL)OPS. Usage: python3 tools/device/gemm_dtype_ceiling.py [T ...]
"""
import sys

import torch

SHAPES = [("ffn_gate", 17408, 5120), ("ffn_down", 5120, 17408), ("gdn_qkv", 10240, 5120),
          ("attn_q+gate", 12288, 5120), ("ssm_out", 5120, 6144)]


def timed(fn, iters=10):
    for _ in range(2):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main():
    tokens = [int(t) for t in sys.argv[1:]] or [512, 4096, 8192]
    dev = torch.device("cuda")
    print(torch.__version__, torch.cuda.get_device_name(0))
    print(f"{'matrix':12s} {'T':>5s} {'bf16 us':>9s} {'int8 us':>9s} {'fp8 us':>9s} "
          f"{'bf16 TF':>8s} {'int8 TOPS':>9s} {'fp8 TF':>8s} {'fp8blk us':>9s} {'blk TF':>7s}")
    for name, m, k in SHAPES:
        w = torch.randn(m, k, device=dev, dtype=torch.bfloat16) * 0.02
        w8 = torch.randint(-127, 127, (m, k), device=dev, dtype=torch.int8)
        wf8 = w.to(torch.float8_e4m3fn)
        sw = torch.rand(1, m, device=dev, dtype=torch.float32)
        for t in tokens:
            x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
            x8 = torch.randint(-127, 127, (t, k), device=dev, dtype=torch.int8)
            xf8 = x.to(torch.float8_e4m3fn)
            sx = torch.rand(t, 1, device=dev, dtype=torch.float32)
            ops = 2.0 * m * k * t
            bf = timed(lambda: x @ w.t())
            try:
                i8 = timed(lambda: torch._int_mm(x8, w8.t()))
            except Exception as e:  # noqa: BLE001
                i8 = float("nan")
                print("int8:", str(e).splitlines()[0])
            try:
                f8 = timed(lambda: torch._scaled_mm(xf8, wf8.t(), scale_a=sx, scale_b=sw,
                                                    out_dtype=torch.bfloat16))
            except Exception as e:  # noqa: BLE001
                f8 = float("nan")
                print("fp8:", str(e).splitlines()[0])
            blk = float("nan")
            sxb = torch.rand(k // 128, t, device=dev, dtype=torch.float32).t()  # outer-dim major
            swb = torch.rand(m // 128, k // 128, device=dev, dtype=torch.float32)
            for variant, (sa, sb) in {"blk": (sxb, swb), "blk-t": (sxb, swb.t()),
                                      "blk-c": (sxb.contiguous(), swb.t().contiguous())}.items():
                try:
                    blk = timed(lambda: torch._scaled_mm(xf8, wf8.t(), scale_a=sa, scale_b=sb,
                                                         out_dtype=torch.float32))
                    if name == "ffn_gate" and t == tokens[0]:
                        print("block scales:", variant)
                    break
                except Exception as e:  # noqa: BLE001
                    if name == "ffn_gate" and t == tokens[0]:
                        print("fp8 block", variant, ":", str(e).splitlines()[0][:200])
            print(f"{name:12s} {t:5d} {bf:9.1f} {i8:9.1f} {f8:9.1f} {ops / bf * 1e-6:8.0f} "
                  f"{ops / i8 * 1e-6:9.0f} {ops / f8 * 1e-6:8.0f} {blk:9.1f} {ops / blk * 1e-6:7.0f}")


if __name__ == "__main__":
    main()
