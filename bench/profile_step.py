"""Where a training step's GPU time goes: the model built as the trainer builds it (the same
RunSettings: compile mode, fused AdamW, the non-finite check), a few warm steps on random tokens,
then torch.profiler over several steps. Prints the step time, tokens/s, MFU and peak memory, then
GPU time by kind of kernel (matmul, attention, Triton-fused elementwise, optimizer, copies, other)
and the top kernels. With --variant, a model change is tried in the same process and timed beside
the model as it is. A benchmark, not a test; needs CUDA.

    python bench/profile_step.py gpu-8gb --set model.dim=768 ... [--steps 5] [--variant fused-proj]
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from workbench.config import resolve_preset
from workbench.machine.probe import measured_peak, this_machine
from workbench.plan.fit.flops import flops_per_token
from workbench.plan.settings import resolve_settings
from workbench.train import model as model_mod
from workbench.train.build import build
from workbench.train.dist import Dist
from workbench.train.runtime import apply_backend_flags, autocast, synchronize


def kind_of(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("fmha", "flash", "attention", "sdpa")):  # before matmul: cuDNN's are named sm90_...
        return "attention"
    if any(k in n for k in ("gemm", "xmma", "cutlass", "nvjet", "sm90", "sm80_", "cublas")):
        return "matmul"
    if "adam" in n:
        return "optimizer"
    if n.startswith("triton") or "triton_" in n:
        return "triton (fused elementwise / reductions)"
    if any(k in n for k in ("memcpy", "memset", "copy", "cat")):
        return "copies"
    return "other"


def fused_projections() -> None:
    """One matmul for q, k and v, and one for the MLP's gate and up: the weights concatenated in the
    forward (the parameters and their names stay as they are)."""
    def attn_forward(self, x, cos, sin, cache=None, layer=0):
        if cache is not None or self.q_norm is not None or self.wq.bias is not None:
            return orig_attn(self, x, cos, sin, cache, layer)
        B, T, _ = x.shape
        w = torch.cat([self.wq.weight, self.wk.weight, self.wv.weight])
        q, k, v = F.linear(x, w).split([self.n_heads * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], dim=-1)
        q = q.view(B, T, self.n_heads, self.hd).transpose(1, 2)
        k = k.view(B, T, self.n_kv, self.hd).transpose(1, 2)
        v = v.view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q, k = model_mod.apply_rope(q, cos, sin), model_mod.apply_rope(k, cos, sin)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))

    def mlp_forward(self, x):
        a, b = F.linear(x, torch.cat([self.w1.weight, self.w3.weight])).chunk(2, dim=-1)
        return self.w2(F.silu(a) * b)

    orig_attn = model_mod.Attention.forward
    model_mod.Attention.forward = attn_forward
    model_mod.SwiGLU.forward = mlp_forward


def bf16_rope() -> None:
    """RoPE in the activations' dtype (bf16) instead of fp32."""
    def apply_rope(x, cos, sin):
        xr = x.reshape(*x.shape[:-1], -1, 2)
        x0, x1 = xr[..., 0], xr[..., 1]
        c, s = cos.to(x.dtype), sin.to(x.dtype)
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    model_mod.apply_rope = apply_rope


def rope_before_transpose() -> None:
    """QK-norm and RoPE on q and k as the projections lay them out ([B, T, heads, hd], each row contiguous),
    then the transpose to [B, heads, T, hd] as a view for attention (nanoGPT's layout): the fused norm + RoPE
    kernel reads and writes contiguous rows instead of writing a transposed copy. The same arithmetic."""
    def attn_forward(self, x, cos, sin, cache=None, layer=0, mask=None):
        if cache is not None or (mask is not None and not isinstance(mask, torch.Tensor)):
            return orig_attn(self, x, cos, sin, cache, layer, mask)
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.hd)
        k = self.wk(x).view(B, T, self.n_kv, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # cos / sin: [T, hd/2] (or [B, 1, T, hd/2] for packed rows) -> broadcast over the heads of [B, T, H, hd/2]
        c, s = (cos.unsqueeze(-2), sin.unsqueeze(-2)) if cos.dim() == 2 else (cos.transpose(1, 2), sin.transpose(1, 2))
        q, k = model_mod.apply_rope(q, c, s).transpose(1, 2), model_mod.apply_rope(k, c, s).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd)))

    orig_attn = model_mod.Attention.forward
    model_mod.Attention.forward = attn_forward


def rope_after_transpose() -> None:
    """The model before 2026-11-27: q and k transposed to [B, heads, T, hd] first, then RoPE (its output a new
    tensor in that layout)."""
    def attn_forward(self, x, cos, sin, cache=None, layer=0, mask=None):
        if cache is not None or (mask is not None and not isinstance(mask, torch.Tensor)):
            return orig_attn(self, x, cos, sin, cache, layer, mask)
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.hd)
        k = self.wk(x).view(B, T, self.n_kv, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q, k = model_mod.apply_rope(q, cos, sin), model_mod.apply_rope(k, cos, sin)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd)))

    orig_attn = model_mod.Attention.forward
    model_mod.Attention.forward = attn_forward


def rms_norm_op() -> None:
    """RMSNorm through torch's own F.rms_norm (fp32 inside, as ours) instead of the hand-written ops."""
    def forward(self, x):
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight
    model_mod.RMSNorm.forward = forward


VARIANTS = {"fused-proj": [fused_projections], "bf16-rope": [bf16_rope],
            "both": [fused_projections, bf16_rope], "rope-before-transpose": [rope_before_transpose],
            "rope-after-transpose": [rope_after_transpose],
            "rms-norm-op": [rms_norm_op], "rope-before-transpose+rms-norm-op": [rope_before_transpose, rms_norm_op]}


def profile_table(step: Callable[[], None], steps: int, dev: torch.device, dt: float) -> None:
    """torch.profiler over ``steps`` calls of ``step`` (warm already; ``dt``: its wall seconds a step, measured
    before): GPU time (CPU time off CUDA) by kind of kernel (:func:`kind_of`), then the top kernels.
    bench/gpu_peers.py's --profile calls it too."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_ctx
    acts = [ProfilerActivity.CUDA] if dev.type == "cuda" else [ProfilerActivity.CPU]
    with prof_ctx(activities=acts) as prof:
        for _ in range(steps):
            step()
        synchronize(dev)
    by_kind: dict[str, float] = collections.Counter()
    rows = []
    for e in prof.key_averages():
        us = (getattr(e, "self_device_time_total", 0) if dev.type == "cuda" else e.self_cpu_time_total) or 0
        if us <= 0:
            continue
        by_kind[kind_of(e.key)] += us
        rows.append((us, e.count, e.key))
    total = sum(by_kind.values())
    print(f"  GPU busy {total / steps / 1e3:.1f} ms/step of {dt * 1e3:.1f} ms wall "
          f"({total / steps / 1e3 / (dt * 1e3):.0%})")
    for k, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {k:42s} {us / steps / 1e3:7.2f} ms/step  {us / total:5.1%}")
    print("  top kernels (ms/step, calls/step):")
    for us, n, key in sorted(rows, reverse=True)[:22]:
        print(f"    {us / steps / 1e3:7.2f}  {n // steps:4d}  {key[:110]}")


def measure(preset: str, overrides: list[str], steps: int, profile: bool, tag: str) -> float:
    p = resolve_preset(preset, overrides)
    s = resolve_settings(p, this_machine(), world_size=1, peak=measured_peak)
    apply_backend_flags(s)
    dev = torch.device(s.device)
    b = build(p, s, dev, Dist(), Path("/tmp/wb-profile-cache"))
    amp = autocast(s)
    B, T, V = p.train.batch_size, p.model.seq_len, p.model.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)

    def step():
        x = torch.randint(0, V, (B, T + 1), generator=gen)
        x = x.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else x
        with amp:
            loss = b.train_forward(x[:, :-1], x[:, 1:])[1]
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(b.model.parameters(), 1.0)
        bad = ~(torch.isfinite(loss) & torch.isfinite(gn))
        if s.nonfinite_check == "device":
            b.optimizer.step_unless(bad)
        else:
            b.optimizer.step(b.scaler)
        b.optimizer.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for _ in range(3):
        step()
    synchronize(dev)
    warm = time.perf_counter() - t0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(dev)
    dt = (time.perf_counter() - t0) / steps
    tps = B * T / dt
    mfu = tps * flops_per_token(p.model) / s.peak_flops if s.peak_flops else float("nan")
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else 0
    print(f"[{tag}] {s.describe()}: first 3 steps (compile) {warm:.1f} s; {dt * 1e3:.1f} ms/step, "
          f"{tps:,.0f} tokens/s, MFU {mfu:.1%}, peak allocated {peak:,.0f} MiB", flush=True)
    if profile:
        profile_table(step, steps, dev, dt)
    b = None  # free the model before the next one is built
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    torch._dynamo.reset()
    return tps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--variant", action="append", default=[], choices=sorted(VARIANTS))
    ap.add_argument("--no-profile", action="store_true")
    a = ap.parse_args()
    base = measure(a.preset, a.overrides, a.steps, not a.no_profile, "as it is")
    for name in a.variant:
        saved = (model_mod.Attention.forward, model_mod.SwiGLU.forward, model_mod.apply_rope,
                 model_mod.RMSNorm.forward)
        for change in VARIANTS[name]:
            change()
        tps = measure(a.preset, a.overrides, a.steps, False, name)
        print(f"  {name}: x{tps / base:.3f} tokens/s against the model as it is")
        (model_mod.Attention.forward, model_mod.SwiGLU.forward, model_mod.apply_rope,
         model_mod.RMSNorm.forward) = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
