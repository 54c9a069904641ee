"""Causal attention forward + backward through F.scaled_dot_product_attention, each SDPA backend this
GPU has, at one shape (default the ~124 M config's: batch 32, 12 heads, 1024 tokens, head dim 64,
bf16). Prints ms per call and TFLOP/s counted as the trainer's MFU counts attention (12*L*H*Q*T a
token: the masked half included). Which kernel torch picks by default is the line marked "default".
A benchmark, not a test; needs CUDA.

    python bench/attention_kernels.py [--batch 32 --heads 12 --seq 1024 --head-dim 64]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_call(fn, iters: int = 20, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    a = ap.parse_args()
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    flops = 12 * a.batch * a.heads * a.seq * a.seq * a.head_dim  # fwd 4BHT^2d + bwd 8BHT^2d

    def step():
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, q/k/v {list(shape)} bf16, causal")
    for name, backends in [("default", None), ("flash", [SDPBackend.FLASH_ATTENTION]),
                           ("cudnn", [SDPBackend.CUDNN_ATTENTION]), ("efficient", [SDPBackend.EFFICIENT_ATTENTION])]:
        try:
            if backends is None:
                ms = time_call(step)
            else:
                with sdpa_kernel(backends):
                    ms = time_call(step)
            print(f"  {name:10s} {ms:7.3f} ms  {flops / ms / 1e9:6.0f} TFLOP/s")
        except RuntimeError as e:  # a backend this GPU or build lacks
            print(f"  {name:10s} not available: {str(e).splitlines()[0][:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
