"""Memory: a run out of memory or near the device's limit, or far below it where a larger micro-batch
(what ``workbench fit`` would choose) would keep the device busier for the same tokens per step."""

from __future__ import annotations

from typing import Any

from workbench.analysis.doctor.facts import Context
from workbench.analysis.doctor.finding import Finding, percent, set_line
from workbench.config import Preset
from workbench.errors import WorkbenchError
from workbench.fmt import human_bytes
from workbench.plan.fit.batch import plan_accumulation, search_batch
from workbench.plan.fit.memory import MemoryEstimate, estimate_memory, what_if
from workbench.plan.settings import resolve_settings

# Near the limit: above 90 % of the device's memory. The estimate calls a preset that fits only when it
# keeps 10 % free (plan.fit.memory.HEADROOM): an eval's forward, a longer sequence or fragmentation grows
# the peak by that much, and CUDA's out-of-memory error ends the run.
MEM_NEAR_FRACTION = 0.90
# What `workbench fit` keeps free when it picks a micro-batch (commands.fit.MARGIN).
FIT_MARGIN = 0.10
# A larger micro-batch is worth a new run only when it is at least twice the current one.
MIN_BATCH_GAIN = 2
# On a GPU, a run with no accumulation that uses under a quarter of the memory could take a micro-batch
# several times larger (more tokens per step: a change of the training recipe, so only a hint).
GPU_ROOM_FRACTION = 0.25
GPU_ROOM_MAX_FACTOR = 8


def device_limit(ctx: Context) -> tuple[int | None, str]:
    """(bytes the run's device has, what that is) on the snapshot's machine."""
    dev, m = ctx.facts.device or "", ctx.machine
    if dev.startswith("cuda"):
        g = m.gpu(dev)
        return (g.total_memory, f"{g.name} memory") if g and g.total_memory else (None, "")
    if dev == "mps":
        return (int(m.ram_total * 2 / 3), "the ~2/3 of RAM that MPS may use") if m.ram_total else (None, "")
    return (m.ram_total, "RAM") if m.ram_total else (None, "")


def measured_peak(ctx: Context) -> tuple[float | None, str]:
    """(MiB, what) the run's largest memory figure: CUDA's reserved memory (what the allocator holds) where
    logged, else the peak the trainer logs as mem_mb (allocated on a GPU, peak RSS on a CPU)."""
    f = ctx.facts
    if (f.device or "").startswith("cuda") and f.peak_reserved_mb:
        return f.peak_reserved_mb, "peak reserved"
    return f.peak_mem_mb, "peak RSS" if f.device == "cpu" else "peak allocated"


def smaller_batch(ctx: Context, p: Preset) -> dict[str, Any]:
    """Half the micro-batch with twice the accumulation (same tokens per step); at batch 1, activation
    checkpointing, then half the sequence."""
    b, a = p.train.batch_size, p.train.grad_accum
    if b >= 2:
        bs, acc, _ = plan_accumulation(b * a, b // 2)
        return {"train.batch_size": bs, "train.grad_accum": acc}
    if not ctx.facts.start_value("activation_checkpointing", p.hardware.activation_checkpointing == "true"):
        return {"hardware.activation_checkpointing": True}
    return {"model.seq_len": max(16, p.model.seq_len // 2)}


def check(ctx: Context) -> list[Finding]:
    f, p = ctx.facts, ctx.facts.preset
    if p is None or not f.device:
        return []
    error = f.status.error or ""
    if f.state in ("failed", "crashed") and "out of memory" in error.lower():
        values = smaller_batch(ctx, p)
        same = " (same tokens per step)" if "train.grad_accum" in values else ""
        return [Finding("memory", "memory.oom", "high", "the run ran out of memory", (f"error: {error[:200]}",),
                        set_line(values) + same, values, ctx.apply_command(values), step=f.step,
                        also=("close other programs on the device (`nvidia-smi` lists them)",
                              f"`workbench fit {ctx.preset_ref}` finds the largest micro-batch that fits"))]
    limit, what = device_limit(ctx)
    peak_mb, peak_what = measured_peak(ctx)
    if not limit or not peak_mb:
        if f.train_records:
            ctx.note("memory: the device's size is not known on this machine")
        return []
    peak = peak_mb * 2**20
    share = peak / limit
    if share >= MEM_NEAR_FRACTION:
        values = smaller_batch(ctx, p)
        return [Finding("memory", "memory.near_limit", "medium",
                        f"memory use is {percent(share)} of the device: little room for an eval or a longer "
                        f"sequence", (f"{peak_what} {human_bytes(peak)} of {human_bytes(limit)} {what}",),
                        set_line(values), values, ctx.apply_command(values), step=f.step,
                        data={"peak_bytes": int(peak), "limit_bytes": int(limit)})]
    return [x for x in (_headroom(ctx, p, peak, limit, what, peak_what),) if x is not None]


def _headroom(ctx: Context, p: Preset, peak: float, limit: int, what: str, peak_what: str) -> Finding | None:
    f = ctx.facts
    b, a = p.train.batch_size, p.train.grad_accum
    gpu = (f.device or "").startswith(("cuda", "mps"))
    if a == 1 and not (gpu and peak / limit < GPU_ROOM_FRACTION):
        return None
    if int(f.start_value("world_size") or 1) > 1 or not ctx.machine.has(f.device or ""):
        return None
    device, kind = f.device or "cpu", (f.device or "cpu").split(":")[0]
    # The estimate, scaled to what this run measured (its peak over the estimate of the same figure).
    try:
        def est(batch: int) -> MemoryEstimate:
            q = what_if(p, batch_size=batch, device=device)
            return estimate_memory(q, settings=resolve_settings(q, ctx.machine, world_size=1))
        now = est(b)
        # like with like: the peak RSS against the whole estimate on a CPU, peak allocated against the
        # estimate's allocated peak on a GPU; the scaled whole estimate then has to fit
        measured = peak if kind == "cpu" else (f.peak_mem_mb or 0) * 2**20 or peak
        ratio = measured / (now.total if kind == "cpu" else now.peak_allocated) if now.total else 1.0
        cap = b * a if a > 1 else b * GPU_ROOM_MAX_FACTOR
        best, _ = search_batch(lambda x: est(x).total * ratio <= (1 - FIT_MARGIN) * limit, cap=cap, start=b)
    except WorkbenchError:
        return None
    if a > 1:
        bs, acc, note = plan_accumulation(b * a, best)
        if bs < MIN_BATCH_GAIN * b:
            return None
        values = {"train.batch_size": bs, "train.grad_accum": acc}
        return Finding("memory", "memory.headroom", "medium",
                       f"memory use is {percent(peak / limit)} of {what}: a micro-batch of {bs} fits, not {b}",
                       (f"{peak_what} {human_bytes(peak)} of {human_bytes(limit)} {what}",
                        f"batch_size {b} x grad_accum {a} = {b * a} sequences per step",
                        f"`workbench fit` would choose {bs} x {acc} (the memory estimate scaled by this run's "
                        f"measured peak, x{ratio:.2f}; {percent(FIT_MARGIN)} kept free)"
                        + (f"; {note}" if note else "")),
                       set_line(values) + " (same tokens per step; fewer, larger steps keep the device busier)",
                       values, ctx.apply_command(values), step=f.step,
                       also=(f"`workbench fit {ctx.preset_ref}` measures it and writes a preset",),
                       data={"peak_bytes": int(peak), "limit_bytes": int(limit), "fit_batch": bs, "fit_accum": acc})
    if best < MIN_BATCH_GAIN * b:
        return None
    values = {"train.batch_size": best}
    return Finding("memory", "memory.headroom", "low",
                   f"the GPU has room for a micro-batch of {best} (now {b})",
                   (f"{peak_what} {human_bytes(peak)} of {human_bytes(limit)} {what}",
                    f"estimate scaled by this run's measured peak (x{ratio:.2f}): batch {best} fits with "
                    f"{percent(FIT_MARGIN)} free"),
                   set_line(values) + f" ({best // b}x the tokens per step: keep train.lr or raise it by up to "
                   f"{(best / b) ** 0.5:.1f}x)", values, ctx.apply_command(values), step=f.step,
                   data={"peak_bytes": int(peak), "limit_bytes": int(limit), "fit_batch": best})
