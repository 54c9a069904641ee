"""The learning-rate schedule: arithmetic on the preset, shared by the trainer and anything that
wants to show or reason about it."""

from __future__ import annotations

import dataclasses
import math

from workbench.config import Preset


def decay_start(p: Preset) -> int:
    """wsd: the first step of the decay (the stable phase ends here); cosine: the end of warmup."""
    t = p.train
    if t.schedule != "wsd":
        return t.warmup_iters
    return max(t.warmup_iters, t.max_iters - max(1, round(t.decay_fraction * t.max_iters)))


def lr_factor(step: int, p: Preset, progress: float | None = None) -> float:
    """The learning rate at ``step`` as a share of its peak: the same for every parameter group (AdamW's
    train.lr, Muon's train.muon_lr), ending at min_lr / lr. ``progress``: with train.time_budget, the share
    of the budget spent (0-1); after warmup the schedule follows it instead of the step (wsd: stable until
    1 - decay_fraction of the budget, then linear to min_lr at its end; cosine: over the whole budget). A warmup
    the budget cuts short yields to that decay (the lower of the two), so a budgeted run always ends at min_lr:
    a 2-minute cpu-small budget beside a busy CPU trained 29 steps of its 30-step warmup and ended at its peak."""
    t = p.train
    floor = t.min_lr / t.lr
    ramp = (step + 1) / (t.warmup_iters + 1) if step < t.warmup_iters else 1.0
    if progress is not None:
        progress = min(1.0, max(0.0, progress))
        if t.schedule == "wsd":
            frac = max(0.0, (progress - (1.0 - t.decay_fraction)) / t.decay_fraction)
            return min(ramp, 1.0 - frac * (1.0 - floor))
        return min(ramp, floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor))
    if ramp < 1.0:
        return ramp
    if t.schedule == "wsd":
        start = decay_start(p)
        if step < start:
            return 1.0
        frac = min(1.0, (step - start + 1) / max(1, t.max_iters - start))
        return 1.0 - frac * (1.0 - floor)
    decay_end = t.lr_decay_iters or t.max_iters
    if step >= decay_end:
        return floor
    frac = (step - t.warmup_iters) / max(1, decay_end - t.warmup_iters)
    return floor + 0.5 * (1.0 + math.cos(math.pi * frac)) * (1.0 - floor)


def lr_at(step: int, p: Preset) -> float:
    """AdamW's learning rate at ``step``: linear warmup to lr, then the cosine decay to min_lr at
    lr_decay_iters (default max_iters), or wsd's stable phase and linear decay."""
    return p.train.lr * lr_factor(step, p)


def extension_note(p: Preset, from_step: int, more: int) -> str:
    """What continuing a run from ``from_step`` for ``more`` steps does to its learning rate, in a line
    (``p``: the run's preset as it was)."""
    if p.train.schedule == "wsd" and from_step > decay_start(p):
        start = decay_start(p)
        longer = dataclasses.replace(p, train=dataclasses.replace(p.train, max_iters=from_step + more))
        return (f"wsd: it goes on from step {start:,}, where the decay began (a new run, the decayed one kept), so "
                f"the learning rate stays at {p.train.lr:.2e} until step {decay_start(longer):,}, then decays to "
                f"{p.train.min_lr:.2e} by step {longer.train.max_iters:,}")
    new_max = from_step + more
    longer = dataclasses.replace(p, train=dataclasses.replace(p.train, max_iters=new_max))
    before, after = lr_at(max(0, from_step - 1), p), lr_at(from_step, longer)
    end = lr_at(new_max - 1, longer)
    if p.train.schedule == "wsd":
        return (f"wsd: the stable phase goes on at {after:.2e} until step {decay_start(longer):,}, then the learning "
                f"rate decays to {end:.2e}")
    if p.train.lr_decay_iters:
        return (f"the cosine decay ends at step {p.train.lr_decay_iters} (train.lr_decay_iters), so the learning "
                f"rate stays at {after:.2e} for the {more:,} new steps")
    return (f"cosine schedule: its decay is stretched to end at step {new_max:,}, so the learning rate goes from "
            f"{before:.2e} at step {from_step:,} {'up ' if after > before * 1.01 else ''}to {after:.2e}, then decays "
            f"to {end:.2e}")
