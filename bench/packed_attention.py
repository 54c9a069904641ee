"""Packed conversations on a GPU: what the cross-conversation mask costs in attention, and what flex attention
would save. Needs CUDA.

    python bench/packed_attention.py                       # gpu-8gb's shape: batch 24, seq 1024, 12 heads (6 KV), hd 64
    python bench/packed_attention.py --batch 32 --heads 12 --kv-heads 12 --mean 300

Rows of --seq tokens are packed with conversations whose lengths are drawn uniformly from [--min, --max] (the
last one cut at the row's end), as `data.packing` packs them. Timed with CUDA events, forward + backward of
attention alone (q, k, v [B, H, T, hd] bf16, GQA expanded as the model does), after warm-up:

- causal: SDPA with is_causal and no mask: what a row of one document costs (torch picks cuDNN or flash);
- sdpa+mask: SDPA with the [B, 1, T, T] bool mask, causal inside each conversation: what the trainer runs for
  packed rows today (no flash or cuDNN kernel takes such a mask: torch falls back to the memory-efficient one);
- flex: torch's flex_attention (compiled) with a BlockMask built from the same segments: blocks wholly across
  conversations are skipped, so it does less work than causal.

Each line: ms for forward + backward, TFLOP/s counted as a causal row's work (2 * 2 * B * H * T^2 * hd / 2 for
forward, x2.5 with backward), and the largest difference of its output and gradients from sdpa+mask's.
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.nn.functional as F
from attention_kernels import time_call  # bench/: CUDA events around warm calls


def segments_for(batch: int, seq: int, lo: int, hi: int, seed: int = 0) -> torch.Tensor:
    rng = random.Random(seed)
    rows = []
    for _ in range(batch):
        seg, doc = [], 0
        while len(seg) < seq:
            seg += [doc] * rng.randint(lo, hi)
            doc += 1
        rows.append(seg[:seq])
    return torch.tensor(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=6)
    ap.add_argument("--hd", type=int, default=64)
    ap.add_argument("--min", type=int, default=64, help="shortest conversation, tokens")
    ap.add_argument("--max", type=int, default=512, help="longest conversation, tokens")
    args = ap.parse_args()
    dev, B, T, H, KV, D = "cuda", args.batch, args.seq, args.heads, args.kv_heads, args.hd
    torch.manual_seed(0)
    seg = segments_for(B, T, args.min, args.max).to(dev)
    n_docs = int((seg[:, 1:] != seg[:, :-1]).sum() + B)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; batch {B} x seq {T}, {H} heads ({KV} KV), "
          f"hd {D}, bf16; conversations {args.min}-{args.max} tokens, {n_docs / B:.1f} a row")
    q = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, KV, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, KV, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16)
    rep = H // KV
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    mask = (seg[:, None, :, None] == seg[:, None, None, :]) & causal  # as workbench.train.model builds it

    def expand(t):
        return t.repeat_interleave(rep, dim=1) if rep > 1 else t

    def run_causal():
        return F.scaled_dot_product_attention(q, expand(k), expand(v), is_causal=True)

    def run_masked():
        return F.scaled_dot_product_attention(q, expand(k), expand(v), attn_mask=mask)

    variants = {"causal": run_causal, "sdpa+mask": run_masked}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def doc_causal(b, h, qi, ki):
            return (seg[b, qi] == seg[b, ki]) & (qi >= ki)

        block = create_block_mask(doc_causal, B, None, T, T, device=dev)
        flex = torch.compile(flex_attention, dynamic=False)
        sparsity = block.sparsity()

        def run_flex():
            return flex(q, k, v, block_mask=block, enable_gqa=rep > 1)

        variants["flex"] = run_flex
        print(f"flex BlockMask: {sparsity:.1f} % of blocks skipped")
    except Exception as e:  # noqa: BLE001 - a benchmark: say why and go on
        print(f"flex attention unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200]}")

    flops = 2 * 2 * B * H * T * T * D / 2 * 3.5  # causal fwd (2 matmuls, half the square) + bwd (2.5x fwd)
    ref = None
    for name, fn in variants.items():
        def step():
            for t in (q, k, v):
                t.grad = None
            fn().backward(dy)
        try:
            ms = time_call(step)
        except Exception as e:  # noqa: BLE001
            print(f"{name:<10} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        step()
        out = (fn().detach().float(), q.grad.float(), k.grad.float(), v.grad.float())
        if name == "sdpa+mask":
            ref = out
        diff = ("" if ref is None or name == "sdpa+mask" or name == "causal" else
                "; max diff from sdpa+mask: out {:.2g}, dq {:.2g}, dk {:.2g}, dv {:.2g}".format(
                    *[(a - b).abs().max().item() for a, b in zip(out, ref)]))
        print(f"{name:<10} {ms:8.3f} ms fwd+bwd  {flops / ms / 1e9:7.1f} TFLOP/s (as a causal row's work){diff}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
