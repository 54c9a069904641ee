"""Unstable: non-finite steps skipped or rolled back, gradient-norm spikes, loss spikes against the recent
trend; the change is a lower learning rate, a longer warmup, clipping, or bf16 instead of fp16."""

from __future__ import annotations

from typing import Any

from workbench.analysis.doctor.facts import Context
from workbench.analysis.doctor.finding import Finding, set_line
from workbench.analysis.doctor.spikes import GRAD_SPIKE_FACTOR, LOSS_SPIKE_FRACTION, SPIKE_WINDOW, Spike
from workbench.config import Preset

# A learning-rate cut of this factor: what the trainer's own rollback does (train.loop.ROLLBACK_LR_FACTOR).
LR_CUT = 0.5
# Trouble within this many warmup lengths of the start is the warmup's: the learning rate rose too fast.
EARLY_WARMUPS = 2
# A warmup is lengthened to twice its steps, at least this many, and stays under a tenth of the run.
MIN_WARMUP = 100
# This many spikes make a pattern rather than one bad batch.
SPIKES_MEDIUM = 3
SHOWN = 5   # steps listed in the evidence


def _lr_change(ctx: Context, p: Preset, first_step: int) -> dict[str, Any]:
    """Half the peak learning rate (or what rollbacks brought it to, halved once more if they did not
    help), clipping if it is off, a longer warmup if the trouble began early, bf16 for fp16."""
    f = ctx.facts
    values: dict[str, Any] = {}
    scale = min([float(e.get("lr_scale") or 1.0) for e in f.event_list("rollback")] or [1.0])
    values["train.lr"] = float(f"{p.train.lr * scale * LR_CUT:.3g}")
    if p.train.grad_clip == 0:
        values["train.grad_clip"] = 1.0
    w = p.train.warmup_iters
    if first_step <= EARLY_WARMUPS * max(w, 1):
        longer = min(max(2 * w, MIN_WARMUP), max(1, f.max_iters // 10))
        if longer > w:
            values["train.warmup_iters"] = longer
    if f.start_value("precision") == "fp16":
        g = ctx.machine.gpu(f.device or "")
        values["hardware.precision"] = "bf16" if g is None or g.ampere_or_newer else "fp32"
    return values


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _steps(spikes: list[Spike]) -> str:
    shown = ", ".join(f"{s.step} ({s.value:.3g} vs {s.median:.3g})" for s in spikes[:SHOWN])
    return shown + (f", and {len(spikes) - SHOWN} more" if len(spikes) > SHOWN else "")


def check(ctx: Context) -> list[Finding]:
    f, p = ctx.facts, ctx.facts.preset
    if p is None:
        return []
    out = []
    if (x := _nonfinite(ctx, p)) is not None:
        out.append(x)
    grad, loss = f.grad_spikes.spikes, f.loss_spikes.spikes
    if loss:
        values = _lr_change(ctx, p, loss[0].step)
        out.append(Finding(
            "unstable", "unstable.loss_spikes", "medium" if len(loss) >= SPIKES_MEDIUM else "low",
            f"the training loss jumped {_n(len(loss), 'time')} well above its recent trend",
            (f"steps (loss vs the median of up to {SPIKE_WINDOW} records before): {_steps(loss)}",
             f"a jump is {LOSS_SPIKE_FRACTION:.0%} or more above that median"
             + (f"; learning rate {loss[0].lr:.3g} at step {loss[0].step} (as logged)" if loss[0].lr else "")),
            set_line(values), values, ctx.apply_command(values), step=loss[0].step,
            also=("bad data can do it too: `workbench data inspect CORPUS` shows the documents as the trainer "
                  "reads them",),
            data={"spikes": [s.to_dict() for s in loss]}))
    if grad:
        clip = p.train.grad_clip
        values = {"train.grad_clip": 1.0} if clip == 0 else _lr_change(ctx, p, grad[0].step)
        severity = "medium" if clip == 0 or len(grad) >= SPIKES_MEDIUM else "low"
        clipped = (f"clipping at {clip:g} limited those updates" if clip else
                   "clipping is off (train.grad_clip = 0): each went into the weights at full size")
        out.append(Finding(
            "unstable", "unstable.grad_spikes", severity,
            f"the gradient norm spiked {_n(len(grad), 'time')} to {GRAD_SPIKE_FACTOR:g}x or more its recent median",
            (f"steps (norm vs the median before): {_steps(grad)}", clipped),
            set_line(values), values, ctx.apply_command(values), step=grad[0].step,
            data={"spikes": [s.to_dict() for s in grad]}))
    return out


def _nonfinite(ctx: Context, p: Preset) -> Finding | None:
    f = ctx.facts
    skips, rollbacks = f.event_list("nonfinite_skip"), f.event_list("rollback")
    error = f.status.error or ""
    failed = f.state == "failed" and "non-finite" in error
    if not (skips or rollbacks or failed):
        return None
    first = (skips or rollbacks)[0].step if (skips or rollbacks) else f.step
    values = _lr_change(ctx, p, first)
    steps = ", ".join(str(e.step) for e in skips[:SHOWN]) + (f", and {len(skips) - SHOWN} more"
                                                             if len(skips) > SHOWN else "")
    lr = skips[0].get("lr") if skips else None  # as the trainer logged it (none in a run older than the field)
    evidence = [f"{_n(len(skips), 'step')} with a non-finite loss or gradient norm, update skipped"
                + (f": {'steps' if len(skips) > 1 else 'step'} {steps}" if skips else ""),
                (f"learning rate {lr:.3g} at step {first}, as logged " if lr is not None else "")
                + f"(peak {p.train.lr:.3g}, warmup {p.train.warmup_iters} steps)"]
    for r in rollbacks:
        evidence.append(f"rolled back from step {r.get('from_step')} to {r.get('to')}, learning rate "
                        f"x{float(r.get('lr_scale') or 1):g}")
    if failed:
        evidence.append(f"the run failed: {error[:160]}")
    title = f"{_n(len(skips), 'training step')} went non-finite (NaN or inf)" + (
        f" and the run rolled back {_n(len(rollbacks), 'time')}" if rollbacks else "")
    return Finding("unstable", "unstable.nonfinite", "high" if rollbacks or failed else "medium", title,
                   tuple(evidence), set_line(values), values, ctx.apply_command(values), step=first,
                   also=("bad data can do it too: `workbench data inspect CORPUS` shows the documents as the "
                         "trainer reads them",),
                   data={"skipped": len(skips), "rollbacks": len(rollbacks), "steps": [e.step for e in skips]})
