"""Muon's share of a training step on a CPU, per Newton-Schulz schedule, against AdamW.

    python bench/muon_cpu.py cpu-small [--set k=v ...] [--steps 10]

The model is built as the trainer builds it (``workbench.train.build``, the preset's RunSettings on this
machine), trained on random tokens; each variant (AdamW, then Muon with each of ``NS_SCHEDULES``) takes a few
warm steps, then ``--steps`` timed whole steps (forward, backward, clip, optimizer), interleaved round by
round so that a machine getting busier slows every variant alike; the median is printed. For Muon, the
Newton-Schulz iterations alone (``orthogonalize`` on every matrix Muon updates, as its step runs them) are
timed too: their share of the Muon step, and the step against AdamW's. A step is the preset's
batch_size x grad_accum sequences. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from workbench.config import resolve_preset
from workbench.machine.probe import measured_peak, this_machine
from workbench.plan.settings import resolve_settings
from workbench.train.build import build
from workbench.train.dist import Dist
from workbench.train.optim import NS_SCHEDULES, orthogonalize


def variant(preset: str, overrides: list[str], optimizer: str, schedule: str):
    p = resolve_preset(preset, [*overrides, f"train.optimizer={optimizer}",
                                f"train.muon_ns={'jordan' if schedule == 'before' else schedule}"])
    s = resolve_settings(p, this_machine(), world_size=1, peak=measured_peak)
    torch.manual_seed(0)
    b = build(p, s, torch.device("cpu"), Dist(), Path("/tmp/wb-muon-cpu-cache"))
    B, T, V, accum = p.train.batch_size, p.model.seq_len, p.model.vocab_size, p.train.grad_accum
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        for _ in range(accum):
            x = torch.randint(0, V, (B, T + 1), generator=gen)
            (b.train_forward(x[:, :-1], x[:, 1:])[1] / accum).backward()
        torch.nn.utils.clip_grad_norm_(b.model.parameters(), 1.0)
        b.optimizer.step(b.scaler)
        b.optimizer.zero_grad(set_to_none=True)

    def ns() -> None:
        muon = b.optimizer.parts["muon"]
        for q in (q for g in muon.param_groups for q in g["params"]):
            orthogonalize(muon.state[q]["momentum_buffer"], schedule=muon.ns_schedule)

    def ns_before() -> None:  # jordan as written before 2026-11-25: the products, then the sums apart
        muon = b.optimizer.parts["muon"]
        for q in (q for g in muon.param_groups for q in g["params"]):
            x = muon.state[q]["momentum_buffer"].float()
            x = x.mT if x.size(0) > x.size(1) else x
            x = x / (x.norm() + 1e-7)
            for _ in range(5):
                m = x @ x.mT
                x = 3.4445 * x + (-4.7750 * m + 2.0315 * m @ m) @ x
    return step, ((ns_before if schedule == "before" else ns) if optimizer == "muon" else None), B * T * accum


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[])
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    names = ["adamw", *NS_SCHEDULES]
    variants = {n: variant(a.preset, a.overrides, "adamw" if n == "adamw" else "muon", "jordan" if n == "adamw"
                           else n) for n in names}
    # Newton-Schulz as it was before (step timed with today's jordan; only its Newton-Schulz time differs)
    variants["jordan, before"] = variant(a.preset, a.overrides, "muon", "before")
    for step, _ns, _tokens in variants.values():
        for _ in range(3):  # warm: the optimizer's states, the allocator
            step()
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    ns_times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(a.steps):
        for n, (step, ns, _tokens) in variants.items():
            times[n].append(timed(step))
            if ns is not None:
                ns_times[n].append(timed(ns))
    label = f"{a.preset} {' '.join(a.overrides)}".strip()
    print(f"== {label}: {torch.get_num_threads()} threads, {a.steps} steps each, medians")
    base = statistics.median(times["adamw"])
    med = {n: statistics.median(v) for n, v in ns_times.items() if v}
    for n in names:
        t = statistics.median(times[n])
        if n == "jordan, before":  # today's jordan step with the old Newton-Schulz in place of the new
            t = statistics.median(times["jordan"]) - med["jordan"] + med[n]
        tokens = variants[n][2]
        line = f"  {n:15s} {t * 1e3:7.1f} ms/step  {tokens / t:8,.0f} tokens/s  x{t / base:.3f} AdamW's step"
        if ns_times[n]:
            share = statistics.median(ns_times[n]) / t
            line += f"  Newton-Schulz {statistics.median(ns_times[n]) * 1e3:.1f} ms = {share:.1%} of the step"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
