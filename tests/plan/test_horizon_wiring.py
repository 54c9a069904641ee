"""A wsd run counted in steps whose warmup takes most of it (workbench/plan/schedule/horizon.py): the decay starts where
the warmup ends, never inside it, so the learning rate goes up to its peak and then down in equal steps to min_lr, with
no jump at the end of the warmup (issue 54's break 9: 110 steps and 100 of warmup, 0.4 of them to decay, would start the
decay at step 66 and drop the factor 0.99 -> 0.41 at step 100)."""

from __future__ import annotations

import pytest

from workbench.config import resolve_preset
from workbench.plan.schedule.horizon import Horizon


def test_a_wsd_decay_starts_at_the_end_of_a_long_warmup_without_a_jump():
    p = resolve_preset("cpu-small", ["train.max_iters=110", "train.warmup_iters=100", "train.schedule=wsd",
                                     "train.decay_fraction=0.4", "train.lr=3e-3", "train.min_lr=1e-4"])
    h = Horizon.of(p)
    floor = 1e-4 / 3e-3
    f = [h.lr_factor(s) for s in range(110)]
    assert f[99] == pytest.approx(100 / 101)            # the warmup's last step: its ramp, not yet the decay
    assert f[100] == pytest.approx(1 - 0.1 * (1 - floor))   # the decay's first of 10 equal steps
    assert not h.budgeted and h.decay_start == 100      # floored at the warmup's end (110 - 44 = 66 is inside it)
    assert f[109] == pytest.approx(floor)               # the run ends at min_lr
    steps = [f[s] - f[s + 1] for s in range(100, 109)]
    assert steps == pytest.approx([0.1 * (1 - floor)] * 9)  # linear to min_lr over the 10 steps after the warmup
    assert f[99] - f[100] < 0.1                          # no jump where the warmup hands over
    assert all(a < b for a, b in zip(f[:99], f[1:100]))  # the warmup still ramps up to its last step
