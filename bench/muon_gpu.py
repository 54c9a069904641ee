"""Muon against AdamW on a GPU: time per training step, and the share of it that Muon's Newton-Schulz
iterations take. The model is built as the trainer builds it (the same RunSettings: compile mode, fused
AdamW, activation checkpointing), trained a few warm steps on random tokens, then timed with CUDA
events: the whole step (forward, backward, clip, optimizer) with each optimizer, and, with Muon, the
optimizer step alone and the Newton-Schulz iterations alone (``workbench.train.optim.orthogonalize`` on
every matrix Muon updates, with that step's gradients), as the optimizer runs it (one matrix at a time,
eager) and two ways it could run: the same-shaped matrices stacked into one batched product, and
torch.compile'd. Also the peak allocated memory of the forward + backward and of the optimizer step
apart. A benchmark, not a test; needs CUDA.

    python bench/muon_gpu.py gpu-8gb [--set k=v ...] [--steps 20]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from workbench.config import resolve_preset
from workbench.machine.probe import measured_peak, this_machine
from workbench.plan.fit.flops import flops_per_token
from workbench.plan.settings import resolve_settings
from workbench.train.build import build
from workbench.train.dist import Dist
from workbench.train.optim import NS_COEFFICIENTS, orthogonalize
from workbench.train.runtime import apply_backend_flags, autocast


def cuda_ms(fn, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def orthogonalize_batched(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """``orthogonalize`` on a stack of same-shaped matrices (batch, rows, cols) in one batched product."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(torch.bfloat16)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        m = x @ x.mT
        x = a * x + (b * m + c * m @ m) @ x
    return (x.mT if tall else x).to(g.dtype)


def measure(preset: str, overrides: list[str], optimizer: str, steps: int) -> dict:
    p = resolve_preset(preset, [*overrides, f"train.optimizer={optimizer}"])
    s = resolve_settings(p, this_machine(), world_size=1, peak=measured_peak)
    apply_backend_flags(s)
    dev = torch.device(s.device)
    b = build(p, s, dev, Dist(), Path("/tmp/wb-muon-cache"))
    amp = autocast(s)
    B, T, V = p.train.batch_size, p.model.seq_len, p.model.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)

    def fwd_bwd():
        x = torch.randint(0, V, (B, T + 1), generator=gen).pin_memory().to(dev, non_blocking=True)
        with amp:
            loss = b.train_forward(x[:, :-1], x[:, 1:])[1]
        loss.backward()
        return loss, torch.nn.utils.clip_grad_norm_(b.model.parameters(), 1.0)

    def opt_step(loss, gn):
        if s.nonfinite_check == "device":
            b.optimizer.step_unless(~(torch.isfinite(loss) & torch.isfinite(gn)))
        else:
            b.optimizer.step(b.scaler)

    def step():
        opt_step(*fwd_bwd())
        b.optimizer.zero_grad(set_to_none=True)

    for _ in range(3):  # compile, the optimizer's states
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    loss, gn = fwd_bwd()
    torch.cuda.synchronize()
    peak_bwd = torch.cuda.max_memory_allocated() / 2**20
    torch.cuda.reset_peak_memory_stats()
    opt_step(loss, gn)
    torch.cuda.synchronize()
    peak_opt = torch.cuda.max_memory_allocated() / 2**20
    b.optimizer.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()
    step_ms = cuda_ms(step, steps)
    out = {"optimizer": optimizer, "step_ms": step_ms, "tokens_per_s": B * T / step_ms * 1e3,
           "mfu": B * T / step_ms * 1e3 * flops_per_token(p.model) / s.peak_flops,
           "peak_mib": torch.cuda.max_memory_allocated() / 2**20, "nonfinite_check": s.nonfinite_check,
           "compile": s.compile_mode if s.compile else "off",
           "peak_bwd_mib": peak_bwd, "peak_opt_mib": peak_opt, "fused": s.fused_optimizer}
    # the optimizer step alone, and (Muon) the Newton-Schulz iterations alone, on one step's gradients
    loss, gn = fwd_bwd()
    params = [q for g in b.optimizer.param_groups for q in g["params"] if q.grad is not None]
    saved = [q.detach().clone() for q in params]
    out["opt_ms"] = cuda_ms(lambda: opt_step(loss, gn), steps)  # the weights move; only the time is read
    if "muon" in getattr(b.optimizer, "parts", {}):
        muon = b.optimizer.parts["muon"]
        mats = [q.grad for g in muon.param_groups for q in g["params"] if q.grad is not None]
        ns = muon.param_groups[0]["ns_steps"]
        out["ns_ms"] = cuda_ms(lambda: [orthogonalize(m, ns) for m in mats], steps)
        out["muon_matrices"] = len(mats)
        out["muon_params"] = sum(m.numel() for m in mats)
        by_shape: dict[tuple, list] = {}
        for m in mats:
            by_shape.setdefault(tuple(m.shape), []).append(m)
        out["shapes"] = {k: len(v) for k, v in by_shape.items()}
        stacks = [torch.stack(v) for v in by_shape.values()]  # stacking is timed below too
        out["ns_batched_ms"] = cuda_ms(lambda: [orthogonalize_batched(torch.stack(v), ns)
                                                for v in by_shape.values()], steps)
        diff = max((orthogonalize_batched(st, ns)[0] - orthogonalize(v[0], ns)).abs().max().item()
                   for st, v in zip(stacks, by_shape.values()))
        out["ns_batched_maxdiff"] = diff
        compiled = torch.compile(orthogonalize)
        [compiled(m, ns) for m in mats]  # compile once per shape
        out["ns_compiled_ms"] = cuda_ms(lambda: [compiled(m, ns) for m in mats], steps)
    with torch.no_grad():
        for q, v in zip(params, saved):
            q.copy_(v)
    b = None
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[])
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    label = f"{a.preset} {' '.join(a.overrides)}".strip()
    print(f"== {label} on {torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})")
    rows = [measure(a.preset, a.overrides, o, a.steps) for o in ("adamw", "muon")]
    for r in rows:
        line = (f"  {r['optimizer']:5s}: {r['step_ms']:.1f} ms/step, {r['tokens_per_s']:,.0f} tokens/s, "
                f"MFU {r['mfu']:.1%}, peak {r['peak_mib']:,.0f} MiB allocated, optimizer step {r['opt_ms']:.2f} ms "
                f"(compile {r['compile']}, non-finite check {r['nonfinite_check']}, fused AdamW {r['fused']}); "
                f"peak {r['peak_bwd_mib']:,.0f} MiB in forward + backward, "
                f"{r['peak_opt_mib']:,.0f} MiB in the optimizer step")
        if "ns_ms" in r:
            line += (f"; Newton-Schulz {r['ns_ms']:.2f} ms on {r['muon_matrices']} matrices "
                     f"({r['muon_params'] / 1e6:.1f} M params) = {r['ns_ms'] / r['step_ms']:.1%} of the step; shapes "
                     f"{r['shapes']}; batched by shape {r['ns_batched_ms']:.2f} ms (max diff "
                     f"{r['ns_batched_maxdiff']:.2g}); torch.compile'd {r['ns_compiled_ms']:.2f} ms")
        print(line, flush=True)
    print(f"  muon / adamw step time: x{rows[1]['step_ms'] / rows[0]['step_ms']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
