"""train.time_budget: the run ends when its budget is spent, on the trainer's own clock.

The clock of a process starts as its first step begins (with a compile: when that step, which compiles, is done; set-up
and the compile are left out) and counts everything after it, evals and checkpoints included; the step-0 eval before it
is paid from the budget too (its seconds count as spent: the budget's evals are sized to a share of it,
``plan.schedule.budget_plan.plan_budget``); training stops early enough for the last eval to end at the budget
(``reserve``: that eval's time, as measured or estimated). A resumed run goes on from the budget its checkpoint had
spent (the time between that checkpoint and a crash is spent again). The schedule follows the share of the budget spent
(the trainer hands it to its ``plan.schedule.horizon.Horizon``), so it needs no step count; the step the budget will end
at is re-estimated from this process's pace (blended with the estimate's, ``smoothed_pace``) and handed over the same
way. This module keeps the clock alone; where the run ends, its learning rate and what a checkpoint keeps of both are
the horizon's. A run counted in steps has a clock too, :class:`StepCount`, that measures nothing: the trainer asks
either the same questions and never branches on which it has."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from workbench.analysis.history import measured_in
from workbench.config import Preset
from workbench.fmt import duration
from workbench.machine.detect import Machine
from workbench.plan.report import estimated_speed
from workbench.plan.schedule.budget_plan import BudgetPlan, budget_plan_at, samples, step_measured
from workbench.plan.settings import RunSettings

# How many seconds of this process's own pace the estimate's pace weighs as, at most (a tenth of the budget when
# that is less): the end shown moves from the estimate's to the pace's over the first seconds instead of jumping
# with the first steps' noise (a 45 s run showed 1/28, 2/7, 3/9).
PRIOR_SECONDS = 10.0


def estimated_plan(p: Preset, settings: RunSettings, machine: Machine, seconds: float, runs_dir: Path
                   ) -> tuple[BudgetPlan, float | None]:
    """(the budget's plan, the tokens/s it rests on) before the run has timed anything: at the speed the estimate
    and `workbench train`'s first line take (a run of the preset measured in ``runs_dir``, else this machine's
    hardware), so the trainer's first guess at its end is the number the CLI showed. GRPO: a speed measured on a GRPO
    run, or none (the hardware's estimate does not time a rollout: the run times one as it starts)."""
    tps, _, basis = estimated_speed(p, settings, machine, settings.device,
                                    measured_in(runs_dir)(p, settings.device_type))
    plan = budget_plan_at(p, tps, seconds, basis=basis)
    assert plan is not None
    return plan, None if samples(p) and not step_measured(basis) else tps


class Budget:
    """train.time_budget's clock."""

    def __init__(self, seconds: float, spent_before: float, first_guess: int, now: float,
                 prior_rate: float | None = None):
        self.seconds = seconds
        self.spent_before = spent_before   # what the run had spent before this process (its checkpoint's)
        self.t0: float | None = None       # this process's clock start: the end of its first step
        self.step0 = 0
        self.first_guess = first_guess     # the end step shown until this process has a pace (train.max_iters)
        self.prior_rate = prior_rate       # steps a second by the estimate (None: unknown), blended into the pace
        self.reserve = 0.0                 # kept for the eval after the last step
        self.first_eval: float | None = None  # the step-0 eval's seconds (before the clock: a bound until timed)
        self.last_eval: float | None = None   # the last eval's on this clock, its sample and checkpoint included
        self.agreed = self.progress(now)      # the share spent, as every rank agreed after a step (the schedule)

    @property
    def usable(self) -> float:
        """The seconds training steps may use: the budget less what the last eval will take."""
        return max(1e-9, self.seconds - self.reserve)

    def pace(self, step: int, now: float) -> float | None:
        """Steps a second in this process so far (None: no step timed yet)."""
        if self.t0 is None or step <= self.step0 or now <= self.t0:
            return None
        return (step - self.step0) / (now - self.t0)

    def step_share(self, step: int, now: float) -> float:
        """The share of the budget's training time the next step will take, at the smoothed pace (0: no pace yet)."""
        rate = self.smoothed_pace(step, now)
        return min(1.0, 1.0 / (rate * self.usable)) if rate else 0.0

    def smoothed_pace(self, step: int, now: float) -> float | None:
        """The pace the end is estimated from: this process's, with the estimate's weighing as PRIOR_SECONDS of it
        (a tenth of the budget when less), so the end shown moves smoothly from the estimate's to the measured."""
        rate = self.pace(step, now)
        if rate is None or not self.prior_rate:
            return rate
        tau, ran = min(PRIOR_SECONDS, 0.1 * self.seconds), now - self.t0
        return (step - self.step0 + self.prior_rate * tau) / (ran + tau)

    def start(self, now: float, step: int) -> None:
        """Start this process's clock (once): before its first step, or, with a compile, after it."""
        if self.t0 is None:
            self.t0, self.step0 = now, step

    def pay_first_eval(self, seconds: float) -> None:
        """The step-0 eval, before the clock starts, is paid from the budget: its seconds are spent (and bound the
        reserve until an eval is timed on the clock)."""
        self.first_eval = seconds
        self.spent_before += seconds

    def took_last_eval(self, seconds: float) -> None:
        """An eval on the clock took ``seconds``, its sample and checkpoint included: the run's last eval is
        expected to take as long (the reserve)."""
        if self.t0 is not None:
            self.last_eval = seconds

    def spent(self, now: float) -> float:
        return self.spent_before + (now - self.t0 if self.t0 is not None else 0.0)

    def progress(self, now: float) -> float:
        """The share of the budget's training time spent, 0 to 1."""
        return min(1.0, self.spent(now) / self.usable)

    def update_reserve(self, timed: float | None, estimated: float | None, first_eval: float | None) -> None:
        """What to keep for the last eval: the last eval timed on this clock (its sample and checkpoint included);
        until there is one, the estimate from the pace, at most the step-0 eval's seconds (it scored the same
        batches: under load, or with Muon's heavier step, the pace's guess was 2-4x it, and a 40 s budget beside
        a busy test suite trained 2 steps)."""
        if timed is not None:
            self.reserve = timed
        elif estimated is not None:
            self.reserve = min(estimated, first_eval or estimated)

    def after_step(self, step: int, now: float, *, clock_runs: bool,
                   eval_due: bool | Callable[[float, float], bool],
                   eval_estimate: Callable[[float], float],
                   agree: Callable[[tuple[float, float]], tuple[float, float]] | None = None) -> int:
        """After a step: start the clock (``clock_runs``: once any compile is done), the reserve, the share of the
        budget spent (``agreed``, the next step's schedule) and the step the run ends at, returned (``step``: this
        one is its last). ``eval_estimate(tokens/s)`` is an eval's seconds at that pace; ``agree`` hands rank 0's
        (spent, reserve) to every rank, so all use the same learning rate and end at the same step. ``eval_due``:
        whether an eval is due after this step, or a function of the share spent before and after it that says."""
        if clock_runs:
            self.start(now, step)
        rate = self.pace(step, now)
        self.update_reserve(self.last_eval, eval_estimate(rate) if rate else None, self.first_eval)
        spent = self.spent(now)
        if agree is not None:
            spent, self.reserve = agree((spent, self.reserve))
        # never back: the reserve changes as evals are timed (a slower first eval, then faster ones), and a
        # larger usable share must not raise the learning rate again
        before, self.agreed = self.agreed, max(self.agreed, min(1.0, spent / self.usable))
        due = eval_due(before, self.agreed) if callable(eval_due) else eval_due
        return step if self.ends_at(spent, due) else self.end_step(step, now)

    def describe(self, step: int, now: float) -> str:
        """The budget at the start of a process, for train.log."""
        if self.done(now):
            return (f"time budget {duration(self.seconds)}: spent already, nothing left to train (resume --more N "
                    "trains N steps more)")
        left = f"{duration(self.seconds - self.spent_before)} left, " if self.spent_before else ""
        steps = (f"~{self.first_guess - step:,} steps by the estimate; " if self.prior_rate else
                 "its steps unknown until its own are timed (no measured speed); ")
        return (f"time budget {duration(self.seconds)}: {left}{steps}"
                "the end is re-estimated from the run's own pace, and the schedule follows the clock")

    def status(self, max_iters: int, now: float, warmup: int | None = None) -> dict:
        """status.json's view: the step it should end at (max_iters), its seconds and those spent, its warmup (what a
        sweep reads to tell a trial that never left it)."""
        # to the millisecond: a sweep's pruner compares it with the evals' budget_share (a 3 s budget's eval that began
        # at 0.4997 of it read as begun after a status rounded to 1.5 s, and the rung took the eval before it)
        return {"max_iters": max_iters, "budget_s": self.seconds, "budget_spent_s": round(self.spent(now), 3)} | (
            {"warmup": warmup} if warmup is not None else {})

    def ends_at(self, spent: float, eval_due: bool) -> bool:
        """Whether the step just taken, with ``spent`` seconds of the budget gone, is the run's last: the budget is
        spent, or an eval is due whose time would carry the run past where its last eval must start (that eval is
        made the last one, not followed by another)."""
        return spent >= self.usable or (eval_due and spent + self.reserve >= self.usable)

    def done(self, now: float) -> bool:
        return self.spent(now) >= self.usable

    def end_step(self, step: int, now: float) -> int:
        """The step the budget will end at, by this process's pace so far; more than ``step`` until it is spent."""
        if self.done(now):
            return step
        rate = self.smoothed_pace(step, now)
        if rate is None:
            return max(step + 1, self.first_guess)
        return max(step + 1, step + round((self.usable - self.spent(now)) * rate))


class StepCount:
    """A run counted in steps (no train.time_budget): the budget's clock, measuring nothing. Its end is the horizon's
    end step; nothing is spent, nothing kept back, nothing said in status.json."""
    seconds: float | None = None
    first_guess: int | None = None
    reserve = 0.0

    def pay_first_eval(self, seconds: float) -> None:
        pass

    def took_last_eval(self, seconds: float) -> None:
        pass

    def start(self, now: float, step: int) -> None:
        pass

    def spent(self, now: float) -> float:
        return 0.0

    def status(self, max_iters: int, now: float, warmup: int | None = None) -> dict:
        return {}
