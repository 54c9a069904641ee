"""The learning-rate schedule: arithmetic on the preset, shared by the trainer and anything that
wants to show or reason about it."""

from __future__ import annotations

import dataclasses
import math

from workbench.config import Preset


def lr_at(step: int, p: Preset) -> float:
    """Linear warmup to lr, then cosine decay to min_lr at lr_decay_iters (default max_iters)."""
    t = p.train
    decay_end = t.lr_decay_iters or t.max_iters
    if step < t.warmup_iters:
        return t.lr * (step + 1) / (t.warmup_iters + 1)
    if step >= decay_end:
        return t.min_lr
    frac = (step - t.warmup_iters) / max(1, decay_end - t.warmup_iters)
    return t.min_lr + 0.5 * (1.0 + math.cos(math.pi * frac)) * (t.lr - t.min_lr)


def extension_note(p: Preset, from_step: int, more: int) -> str:
    """What continuing a run from ``from_step`` for ``more`` steps does to its learning rate, in a line
    (``p``: the run's preset as it was)."""
    new_max = from_step + more
    longer = dataclasses.replace(p, train=dataclasses.replace(p.train, max_iters=new_max))
    before, after = lr_at(max(0, from_step - 1), p), lr_at(from_step, longer)
    end = lr_at(new_max - 1, longer)
    if p.train.lr_decay_iters:
        return (f"the cosine decay ends at step {p.train.lr_decay_iters} (train.lr_decay_iters), so the learning "
                f"rate stays at {after:.2e} for the {more:,} new steps")
    return (f"cosine schedule: its decay is stretched to end at step {new_max:,}, so the learning rate goes from "
            f"{before:.2e} at step {from_step:,} {'up ' if after > before * 1.01 else ''}to {after:.2e}, then decays "
            f"to {end:.2e}")
