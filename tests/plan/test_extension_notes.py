"""What the "+ More" dialog and ``resume --more`` say the learning rate will do (plan.schedule.horizon.extension) is
what the longer run's horizon does, step by step, from where it goes on to where it ends: above all when that start is
inside the warmup (issue 53, bug 2: a branch of a 3-step budgeted run was told "stays at 3.00e-03 until step 30, then
decays ... by step 4" while its learning rate only rose, 2.9e-4 to 3.9e-4, inside a 30-step warmup)."""

from __future__ import annotations

import dataclasses
import re

from workbench.config import Preset, resolve_preset
from workbench.plan.schedule.horizon import Horizon, extension

RATE = re.compile(r"\d\.\d\de[-+]\d\d")


def longer_run(p: Preset, end: int) -> Horizon:
    """The horizon the extended run trains with (as plan_resume makes its preset: max_iters the new end, counted
    in steps)."""
    return Horizon.of(dataclasses.replace(p, train=dataclasses.replace(p.train, max_iters=end, time_budget="")))


def assert_true_to_the_run(note: str, run: Horizon, start: int, end: int) -> None:
    """The note's words against the learning rates the run takes after ``start`` .. ``end - 1`` steps: it says
    the rate decays only if it falls, the warmup only if it trains inside it, and only rates the run takes (or the
    peak it says it falls short of)."""
    lrs = [run.lr_at(k) for k in range(start, end)]
    falls = any(b < a * (1 - 1e-9) for a, b in zip(lrs, lrs[1:]))
    assert bool(re.search(r"decays to|down to", note)) == falls, (note, lrs)
    assert ("warm" in note) == (start < run.warmup), note
    taken = {f"{x:.2e}" for x in lrs}
    short = re.search(r"short of its peak (\S+),", note)
    for rate in RATE.findall(note):
        assert rate in taken or (short and rate == short.group(1)), (rate, note, sorted(taken))


def test_the_walks_branch_inside_its_warmup_is_told_the_warmup_goes_on_past_its_end():
    """The walk: cpu-small at a 20 s budget trained 3 steps (its decay began at step 2, the preset's 30-step warmup
    not over) and "+ More" offered 1 more step: a branch from step 2 to step 4, all of it inside the warmup."""
    p = resolve_preset("cpu-small", ["train.time_budget=20s"])
    e = extension(p, {"step": 3, "decay_step": 2, "budget_progress": 1.0}, 3, 1)
    run = longer_run(p, 4)
    assert (e.from_step, e.end_step, run.warmup) == (2, 4, 30)
    assert "stays at 3.00e-03 until step 30" not in e.note
    assert e.note == (
        "wsd: it goes on from step 2, where the decay began (a new run, the decayed one kept), so the warmup goes "
        f"on to step 30, past the new end: the learning rate rises from {run.lr_at(2):.2e} to {run.lr_at(3):.2e} "
        "by step 4, short of its peak 3.00e-03, and does not decay (more than 27 more steps leave the warmup); "
        "train.time_budget = 20s is spent, so the 1 more steps are counted in steps")
    assert_true_to_the_run(e.note, run, 2, 4)
    # and resume refuses a run that ends inside its warmup (the preset's check): the dialog says so before it
    assert e.problem == ("the run would end inside its warmup (train.warmup_iters = 30, to step 30): give more than "
                         "27 more steps")
    assert not extension(p, {"step": 3, "decay_step": 2, "budget_progress": 1.0}, 3, 28).problem


def test_a_wsd_run_stopped_inside_its_warmup_goes_on_through_it_then_holds_its_peak_then_decays():
    p = resolve_preset("cpu-small")           # wsd, warmup 30, decay_fraction 0.4; stopped at step 20 of 2,000
    e = extension(p, {}, 20, 100)
    run = longer_run(p, 120)
    assert (e.from_step, e.end_step, run.steps_decay_start) == (20, 120, 72)
    assert e.note == (f"wsd: the warmup goes on to step 30, where the learning rate reaches its peak 3.00e-03 (from "
                      f"{run.lr_at(20):.2e}), stays there until step 72, then decays to 1.00e-04 by step 120")
    assert_true_to_the_run(e.note, run, 20, 120)


def test_a_cosine_run_inside_its_warmup_extended_short_of_its_end_does_not_decay():
    p = resolve_preset("cpu-small", ["train.schedule=cosine"])        # stopped at step 10 of 2,000
    e = extension(p, {}, 10, 5)
    run = longer_run(p, 15)
    assert e.note.startswith("cosine schedule: the warmup goes on to step 30, past the new end"), e.note
    assert_true_to_the_run(e.note, run, 10, 15)
    assert e.problem.startswith("the run would end inside its warmup")
    # long enough to leave it: the peak at the warmup's end, then the stretched decay
    e = extension(p, {}, 10, 90)
    run = longer_run(p, 100)
    assert e.note == (f"cosine schedule: the warmup goes on to step 30, where the learning rate reaches its peak "
                      f"3.00e-03 (from {run.lr_at(10):.2e}), then decays to {run.lr_at(99):.2e} by step 100")
    assert_true_to_the_run(e.note, run, 10, 100)


def test_a_budgeted_runs_extension_keeps_the_warmup_its_budget_planned():
    """A budget plans its own warmup (a share of the steps it buys: 4 here); the extension, counted in steps, keeps
    it (resume --more sets train.warmup_iters to it), so a branch from step 20 does not warm up again to the
    preset's 30: it stays at the peak, then decays, and the note says so."""
    p = resolve_preset("cpu-small", ["train.time_budget=20s"])
    state = {"step": 36, "decay_step": 20, "budget_progress": 1.0, "warmup": 4, "eval_iters": 2,
             "evals_on_the_way": 3}
    e = extension(p, state, 36, 20)
    assert (e.from_step, e.end_step, e.warmup) == (20, 56, 4)
    run = longer_run(resolve_preset("cpu-small", ["train.warmup_iters=4"]), 56)
    assert "warms up again" not in e.note and "stays at 3.00e-03 until step 34, then decays to 1.00e-04 by step 56" \
        in e.note, e.note
    assert_true_to_the_run(e.note, run, 20, 56)


def test_a_cosine_decay_that_lr_decay_iters_ends_later_goes_on_decaying():
    """train.lr_decay_iters past the checkpoint: the rate goes on down to it (the note said "stays at")."""
    p = resolve_preset("cpu-small", ["train.max_iters=100", "train.schedule=cosine", "train.warmup_iters=10",
                                     "train.lr_decay_iters=300"])
    e = extension(p, {}, 100, 100)
    run = longer_run(p, 200)
    assert e.note == (f"the cosine decay ends at step 300 (train.lr_decay_iters), so the learning rate goes on from "
                      f"{run.lr_at(100):.2e} down to {run.lr_at(199):.2e} by step 200")
    assert_true_to_the_run(e.note, run, 100, 200)
    past = extension(p, {}, 300, 50)                                   # past it: min_lr throughout
    assert past.note.startswith("the cosine decay ends at step 300 (train.lr_decay_iters), so the learning rate "
                                "stays at 1.00e-04 for the 50 new steps"), past.note
    assert_true_to_the_run(past.note, longer_run(p, 350), 300, 350)


def test_the_notes_outside_the_warmup_stay_true():
    """The cases the earlier notes got right (past the warmup) keep their words, and their words hold."""
    p = resolve_preset("cpu-small", ["train.max_iters=100", "train.warmup_iters=10", "train.schedule=wsd",
                                     "train.decay_fraction=0.2"])
    for ckpt, more in ((100, 50), (60, 50), (100, 5)):
        e = extension(p, {}, ckpt, more)
        assert_true_to_the_run(e.note, longer_run(p, ckpt + more), e.from_step, e.end_step)
