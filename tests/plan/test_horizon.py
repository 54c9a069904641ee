"""The horizon (plan/schedule/horizon.py): where a run ends, where a wsd decay starts, the learning rate at a step, and
what going on for more steps does, decided in one place from the preset and a checkpoint's trainer state."""

from __future__ import annotations

import dataclasses
import math

import pytest

from workbench.config import resolve_preset
from workbench.plan.schedule.horizon import Horizon, extension


def test_schedules_counted_in_steps():
    cos = Horizon.of(resolve_preset("cpu-small", ["train.max_iters=1000", "train.warmup_iters=100",
                                                  "train.schedule=cosine"]))
    wsd = Horizon.of(resolve_preset("cpu-small", ["train.max_iters=1000", "train.warmup_iters=100",
                                                  "train.schedule=wsd", "train.decay_fraction=0.2"]))
    assert (wsd.end_step, wsd.decay_start, cos.decay_start) == (1000, 800, None)
    assert wsd.lr_at(99) == pytest.approx(wsd.lr * 100 / 101) and wsd.lr_at(100) == wsd.lr_at(799) == wsd.lr
    assert wsd.lr_at(899) == pytest.approx(wsd.lr - (wsd.lr - wsd.min_lr) * 100 / 200)
    assert wsd.lr_at(999) == pytest.approx(wsd.min_lr)
    assert all(wsd.lr_factor(s) >= wsd.lr_factor(s + 1) for s in range(100, 999))
    assert cos.lr_at(550) == pytest.approx(cos.min_lr + 0.5 * (cos.lr - cos.min_lr))
    assert not wsd.is_end(999) and wsd.is_end(1000)
    # train.lr_decay_iters ends a cosine decay before the run's end
    short = Horizon.of(resolve_preset("cpu-small", ["train.max_iters=1000", "train.warmup_iters=100",
                                                    "train.schedule=cosine", "train.lr_decay_iters=500"]))
    assert short.lr_at(500) == short.lr_at(900) == pytest.approx(short.min_lr)
    assert short.lr_at(499) > short.lr_at(500)


@pytest.mark.parametrize("schedule", ["wsd", "cosine"])
def test_a_budgeted_schedule_follows_the_share_of_the_budget_spent(schedule):
    p = resolve_preset("cpu-small", [f"train.schedule={schedule}", "train.decay_fraction=0.25", "train.lr=1e-3",
                                     "train.min_lr=1e-4", "train.warmup_iters=10", "train.time_budget=60s"])
    h = Horizon.of(p).ended_at(400)
    floor = 0.1

    def at(step: int, progress: float) -> float:
        return dataclasses.replace(h, progress=progress).lr_factor(step)
    assert h.end_step == 400 and h.budgeted
    assert at(3, 0.5) == 4 / 11                                # warmup is counted in steps
    # a warmup the budget cuts short (a slow or busy machine) yields to the decay: the run still ends at min_lr
    assert at(3, 1.0) == pytest.approx(floor)
    decaying = (1 - 0.5 * (1 - floor) if schedule == "wsd"
                else floor + 0.5 * (1 + math.cos(math.pi * 0.875)) * (1 - floor))
    assert at(8, 0.875) == pytest.approx(decaying) and decaying < 9 / 11
    want = ({0.0: 1.0, 0.5: 1.0, 0.75: 1.0, 0.875: 1 - 0.5 * (1 - floor), 1.0: floor, 1.2: floor}
            if schedule == "wsd" else {0.0: 1.0, 0.5: floor + 0.5 * (1 - floor), 1.0: floor, 1.2: floor})
    for progress, factor in want.items():
        assert at(5000, progress) == pytest.approx(factor, abs=1e-12), progress
    steps = Horizon.of(dataclasses.replace(p, train=dataclasses.replace(p.train, time_budget="")))
    assert steps.lr_factor(5000) == pytest.approx(floor) != at(5000, 0.5)  # no budget: the steps decide


def test_stepping_a_budgeted_wsd_horizon_finds_its_decay_start_and_never_goes_back():
    p = resolve_preset("cpu-small", ["train.schedule=wsd", "train.decay_fraction=0.4", "train.warmup_iters=2",
                                     "train.time_budget=60s"])
    h0 = Horizon.of(p).ended_at(100)
    h = h0
    trail = []
    for step, end, progress in [(1, 90, 0.1), (2, 95, 0.3), (3, 95, 0.59), (4, 97, 0.61), (5, 97, 0.55),
                                (6, 98, 0.8)]:
        h = h.after_step(step, end, progress)
        trail.append((h.end_step, h.progress, h.decay_step))
    assert trail == [(90, 0.1, None), (95, 0.3, None), (95, 0.59, None), (97, 0.61, 4), (97, 0.61, 4), (98, 0.8, 4)]
    assert h0.end_step == 100 and h0.decay_step is None      # each step makes a new horizon; none is changed
    assert h.decay_start == 4
    # what a checkpoint keeps, and a resume's horizon from it: the decay step and the share spent go on
    back = Horizon.from_state(p, {**h.to_state(), "step": 6}).ended_at(120)
    assert (back.decay_step, back.progress, back.end_step) == (4, 0.8, 120)
    assert back.lr_factor(7) == h.lr_factor(7)


def test_a_budgeted_rate_never_rises_when_the_pace_shrinks_the_next_steps_share():
    """A budgeted run's rate is read where its next step ends (the share spent, plus that step's share at the pace).
    After an eval the pace can shrink the step's share by more than the clock moved: the point read never moves back
    (a CI run's decay rose by 4e-9 at the step after an eval)."""
    p = resolve_preset("cpu-small", ["train.schedule=wsd", "train.decay_fraction=0.3", "train.time_budget=8s"])
    h = Horizon.of(p).ended_at(700).after_step(640, 700, 0.94, 0.006)
    h2 = h.after_step(641, 700, 0.9441, 0.0015)  # the clock moved 0.0001, the step's share fell by 0.0045
    assert h2.progress == 0.9441 and h2.lr_factor(641) <= h.lr_factor(640)
    h3 = h2.after_step(642, 700, 0.95, 0.0015)   # the clock past that point: the pace's share again
    assert h3.step_share == 0.0015 and h3.lr_factor(642) < h2.lr_factor(641)


def test_a_budget_spent_before_training_ends_where_it_is():
    h = Horizon.of(resolve_preset("cpu-small", ["train.time_budget=1s"])).ended_at(7)
    assert h.is_end(7) and h.end_step == 7


def test_extension_of_a_run_counted_in_steps():
    p = resolve_preset("cpu-small", ["train.max_iters=100", "train.warmup_iters=10", "train.schedule=wsd",
                                     "train.decay_fraction=0.2"])
    decayed = extension(p, {}, 100, 50)           # past its decay (at 80): from the decay start, a new run
    assert (decayed.from_step, decayed.end_step) == (80, 150)
    assert decayed.note == (f"wsd: it goes on from step 80, where the decay began (a new run, the decayed one "
                            f"kept), so the learning rate stays at {p.train.lr:.2e} until step 120, then decays to "
                            f"{p.train.min_lr:.2e} by step 150")
    stable = extension(p, {}, 60, 50)             # in its stable phase: from the checkpoint
    assert (stable.from_step, stable.end_step) == (60, 110)
    assert stable.note.startswith("wsd: the stable phase goes on at") and "until step 88" in stable.note
    cos = dataclasses.replace(p, train=dataclasses.replace(p.train, schedule="cosine"))
    e = extension(cos, {}, 100, 100)
    assert (e.from_step, e.end_step, e.budget_cleared) == (100, 200, False)
    assert e.note.startswith("cosine schedule: its decay is stretched to end at step 200")


def test_extension_of_a_budgeted_wsd_run_goes_on_from_the_step_its_clock_began_the_decay():
    """The decay start of a budgeted run is the step its trainer recorded, not one computed from the preset's
    max_iters (the first guess): the "+ more steps" dialog said "stable phase until step 34" from the preset
    while the resume went on from step 7."""
    p = resolve_preset("cpu-small", ["train.max_iters=2000", "train.warmup_iters=2", "train.schedule=wsd",
                                     "train.decay_fraction=0.4", "train.time_budget=8s"])
    e = extension(p, {"step": 36, "decay_step": 7, "budget_progress": 1.0}, 36, 20)
    assert (e.from_step, e.end_step, e.budget_cleared) == (7, 56, True)
    assert e.note.startswith("wsd: it goes on from step 7, where the decay began")
    assert "until step 34, then decays" in e.note and e.note.endswith(
        "train.time_budget = 8s is spent, so the 20 more steps are counted in steps")
    # the clock never reached the decay (a budget spent in the stable phase): from the checkpoint itself
    early = extension(p, {"step": 5, "decay_step": None, "budget_progress": 0.5}, 5, 20)
    assert (early.from_step, early.end_step) == (5, 25) and early.note.startswith("wsd: the stable phase goes on")
