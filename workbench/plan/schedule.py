"""The learning-rate schedule: arithmetic on the preset, shared by the trainer and anything that
wants to show or reason about it."""

from __future__ import annotations

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
