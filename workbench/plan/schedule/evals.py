"""How many batches an eval scores: ``train.eval_iters``, or with 0 (auto) as many as the val split's size and
its noise call for. Decided here once, for the trainer, the run-time estimate and the time budget's reserve.

An eval's val loss is the mean over n windows of a split that has N distinct ones: against the whole split's
loss it is off by about ``sd / sqrt(n) * sqrt(1 - n / N)`` (sd: the spread of one window's mean loss). Every
eval of a run scores the same windows, and so does a run of the same data and seed, so the differences between
evals (the curve, the best checkpoint, early stopping) are much more precise than that: measured on cpu-small
(steps 400 -> 500 -> 600 of a 600-step run, the 286 windows of its val split), one window's change in loss
scattered 0.07 and 0.03 nats around the mean changes -0.14 and -0.06, so 100 windows give those changes to
~0.007 and ~0.003 nats, where the level itself scatters 0.65 nats a window (0.065 over 100).

auto therefore asks the level for EVAL_SE_NATS, the smallest differences the doctor acts on (a val loss within
0.05 of the best, a gap growing by 0.05); the changes between evals are then within ~0.01 nats. A split with
fewer windows than that needs is scored (nearly) whole, never more: ``n = N n0 / (N + n0 - 1)``, the sample
size for a finite population, with ``n0 = (sd / EVAL_SE_NATS)**2``.
"""

from __future__ import annotations

import math

from workbench.config import Preset

# The level's standard error auto aims at (see the module docstring).
EVAL_SE_NATS = 0.05
# One window's mean loss scatters WINDOW_SD_NATS at WINDOW_SD_TOKENS tokens, and as (tokens)^-WINDOW_SD_POWER
# for other lengths: measured on cpu-small's val split at steps 400 and 600 (0.64 and 0.66 nats for windows of
# 256 tokens; 0.99 and 1.01 for 32; tokens of one window are far from independent, so not tokens^-0.5).
WINDOW_SD_NATS = 0.65
WINDOW_SD_TOKENS = 256
WINDOW_SD_POWER = 0.2


def window_sd(seq_len: int) -> float:
    """The spread of one window's mean loss (nats) for windows of ``seq_len`` tokens (see WINDOW_SD_NATS)."""
    return WINDOW_SD_NATS * (WINDOW_SD_TOKENS / seq_len) ** WINDOW_SD_POWER


def eval_batches(p: Preset, val_tokens: int | None = None) -> tuple[int, str]:
    """(batches of train and of val each eval scores, why). ``val_tokens``: the val split's size, where it is
    known (the trainer); without it (an estimate before the data is prepared) auto assumes a split large enough
    not to limit it."""
    t, seq = p.train, p.model.seq_len
    if t.eval_iters:
        return t.eval_iters, f"train.eval_iters = {t.eval_iters}"
    n0 = (window_sd(seq) / EVAL_SE_NATS) ** 2
    within = f"~{EVAL_SE_NATS:g} nats"
    if val_tokens is None:
        windows = n0
        what = f"~{math.ceil(windows):,} windows: a val loss within {within}"
    else:
        distinct = max(1, val_tokens // seq)
        windows = distinct * n0 / (distinct + n0 - 1)
        what = (f"~{math.ceil(windows):,} of the val split's {distinct:,} distinct windows: its loss within {within} "
                "of the whole split's" if n0 < distinct else
                f"the val split's {distinct:,} distinct windows, fewer than the ~{math.ceil(n0):,} a val loss within "
                f"{within} needs: the doctor's data.val_split")
    n = max(1, math.ceil(windows / t.batch_size))
    return n, f"auto: {n} batch{'' if n == 1 else 'es'} of {t.batch_size} ({what})"
