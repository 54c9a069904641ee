"""A run's horizon: where it ends, where a wsd decay starts, and the learning-rate factor at each step.

One owner for these facts (torchtitan keeps its LR scheduler as a component with a state of its own, which
the trainer steps and the checkpointer saves; this is that, torch-free). A :class:`Horizon` is made once from
the preset (:meth:`Horizon.of`) and what a checkpoint's trainer state recorded (:meth:`Horizon.from_state`),
a time budget's first guess at its end step set on it (:meth:`Horizon.ended_at`); the trainer steps it
(:meth:`Horizon.after_step`, which returns a new one: the preset is never written), saves it with its state
(:meth:`Horizon.to_state`: the one owner of what a checkpoint keeps of the run's end, a time budget's seconds
spent included), and everything that shows or reasons about the run reads it: the loop's end, its evals and
samples, the checkpointer's decay-start save, ``status.json``'s ``max_iters``, a resume's plan and the "+ more
steps" dialog's note (:func:`extension`), the doctor and the TUI.

Counted in steps, the run ends at ``train.max_iters``; cosine decays to ``min_lr`` at ``lr_decay_iters``
(default the end), wsd is stable until ``decay_fraction`` of the steps are left, then linear to ``min_lr``.
With ``train.time_budget``, the schedule follows the share of the budget spent (``progress``) after warmup
(wsd: stable until ``1 - decay_fraction`` of the budget is spent, then linear; cosine over the whole
budget), the end step is re-estimated after every step from the run's pace, and the wsd decay's first step
is known only once the clock gets there (``decay_step``). A warmup the budget cuts short yields to the
decay (the lower of the two), so a budgeted run always ends at ``min_lr``.

A time budget's plan (its evals, steps and warmup) is :mod:`workbench.plan.schedule.budget_plan`'s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from workbench.config import Preset, eval_share_list
from workbench.plan.schedule.budget_plan import BudgetPlan, budget_warmup


@dataclass(frozen=True)
class Horizon:
    schedule: str                  # cosine | wsd
    lr: float                      # the peak (AdamW's train.lr; every group runs at the same share of its own)
    min_lr: float
    warmup: int                    # steps of linear warmup (always counted in steps)
    end_step: int                  # the step the run ends at: max_iters, or a budget's current estimate
    decay_fraction: float          # wsd: the share of the run (or of the budget) the decay takes
    lr_decay_iters: int = 0        # cosine counted in steps: where the decay ends (0: at end_step)
    budget_s: float | None = None  # train.time_budget in seconds; None: counted in steps
    progress: float = 0.0          # budgeted: the share of the budget spent, as every rank agreed (never back)
    decay_step: int | None = None  # budgeted wsd: the step its decay began, once the clock got there
    eval_iters: int = 0            # budgeted: the batches each eval scores, as planned (0: not planned yet)
    step_share: float = 0.0        # budgeted: the share of the budget the next step takes, at the run's pace
    evals_on_the_way: int = 0      # budgeted: evals between the step-0 and the last one, at even shares of it
    eval_shares: tuple[float, ...] = ()  # train.eval_shares: the shares the evals on the way fall at instead
    eval_next: bool = False        # budgeted: an eval on the way is due after the step just taken (the clock said)
    spent_before: float = 0.0      # budgeted: the budget's seconds its checkpoint had spent (the clock goes on)

    # ------------------------------------------------------------------ made once

    @classmethod
    def of(cls, p: Preset) -> "Horizon":
        """The horizon of a new run of ``p``, ending at train.max_iters (a time budget's: until its first guess
        at its end is set, ``ended_at``)."""
        t = p.train
        return cls(schedule=t.schedule, lr=t.lr, min_lr=t.min_lr, warmup=t.warmup_iters, end_step=t.max_iters,
                   decay_fraction=t.decay_fraction, lr_decay_iters=t.lr_decay_iters, budget_s=t.time_budget_s,
                   eval_shares=eval_share_list(t.eval_shares))

    @classmethod
    def from_state(cls, p: Preset, state: dict[str, Any] | None) -> "Horizon":
        """The horizon of ``p`` going on from a checkpoint's trainer state (``trainer_state.json``): a budgeted
        run keeps the decay step it recorded and the share it had spent (its end is guessed again: this
        process's pace decides it); a run counted in steps is the preset's (a resume may have changed
        max_iters: ``--more``)."""
        h = cls.of(p)
        if h.budget_s is None or not state:
            return h
        decay = state.get("decay_step")
        # a budget's plan as its start made it (checkpoints from before plans: the preset's warmup, evals unplanned)
        planned = state.get("eval_iters") is not None
        return dataclasses.replace(h, decay_step=int(decay) if decay is not None else None,
                                   progress=float(state.get("budget_progress") or 0.0),
                                   spent_before=float(state.get("budget_spent") or 0.0),
                                   warmup=int(state["warmup"]) if planned else h.warmup,
                                   eval_iters=int(state["eval_iters"]) if planned else 0,
                                   evals_on_the_way=int(state["evals_on_the_way"]) if planned else 0)

    def planned(self, plan: "BudgetPlan") -> "Horizon":
        """A budgeted run's horizon with its plan (its start's: the warmup, the eval batches, the evals on the way;
        the end stays the first guess, the estimate's, until the run's own pace moves it)."""
        return dataclasses.replace(self, warmup=plan.warmup, eval_iters=plan.eval_iters,
                                   evals_on_the_way=plan.evals_on_the_way)

    def to_state(self, spent: float = 0.0, reserve: float = 0.0) -> dict[str, Any]:
        """What a checkpoint keeps of it (beside the trainer state's other fields); ``spent``: a budget's seconds
        spent when it is saved, ``reserve``: those kept back then for the last eval (its training time: the rest)."""
        out: dict[str, Any] = {"end_step": self.end_step, "decay_step": self.decay_step,
                               "budget_progress": self.progress, "budget_spent": round(spent, 3),
                               "budget_reserve": round(reserve, 3)}
        if self.budgeted and self.eval_iters:
            out |= {"warmup": self.warmup, "eval_iters": self.eval_iters, "evals_on_the_way": self.evals_on_the_way}
        return out

    # ------------------------------------------------------------------ stepped

    def after_step(self, step: int, end_step: int, progress: float | None = None,
                   step_share: float | None = None, eval_next: bool = False) -> "Horizon":
        """After ``step``: the end step as now estimated (a budget's), the share of the budget spent (the next
        step's schedule; it never goes back), the share the next step will take (its learning rate is the
        schedule's where that step ends, so the step that ends the budget runs at min_lr), whether an eval on the
        way is due after it (``eval_next``: a budget's, decided on its clock) and, for a budgeted wsd run, the
        decay's first step once the budget reaches it."""
        prog = self.progress if progress is None else max(self.progress, min(1.0, progress))
        decay = self.decay_step
        if (self.budgeted and self.schedule == "wsd" and decay is None
                and prog >= 1.0 - self.decay_fraction):
            decay = step
        warmup = self.warmup
        if self.budgeted and self.eval_iters and step < warmup:
            # the end's estimate came down (a slower pace than the estimate's): the warmup keeps its share of it
            # (never longer: the ramp only goes up)
            warmup = min(warmup, budget_warmup(self.warmup, end_step))
        share = self.step_share if step_share is None else step_share
        # where the next step's rate is read (the share spent and the next step's) never moves back either: after an
        # eval the pace (so the step's share) can drop by more than the clock moved, and the decay's rate rose by
        # 4e-9 in a CI run
        share = max(share, self.progress + self.step_share - prog)
        return dataclasses.replace(self, end_step=end_step, progress=prog, decay_step=decay, warmup=warmup,
                                   step_share=share, eval_next=eval_next)

    def eval_between(self, before: float, after: float) -> bool:
        """Budgeted: whether an eval on the way falls due between the shares of the budget ``before`` and
        ``after`` a step (at train.eval_shares, else at 1/(n+1), 2/(n+1), ... of it, n the evals on the way; the
        last eval is the end's)."""
        n = self.evals_on_the_way
        if not n or after >= 1.0:
            return False
        if self.eval_shares:
            return any(before + 1e-9 < s <= after + 1e-9 for s in self.eval_shares)
        return math.floor(after * (n + 1) + 1e-9) > math.floor(before * (n + 1) + 1e-9)

    def eval_after(self, step: int, eval_interval: int) -> bool:
        """Whether ``step`` is followed by an eval: the run's last; on a budget, at the shares of it its plan chose
        (``eval_next``, as its clock said after the step); counted in steps, every ``eval_interval`` steps and at
        train.eval_shares of them."""
        if self.is_end(step):
            return True
        if self.budgeted:
            return self.eval_next
        return step % eval_interval == 0 or self.eval_at_share(step)

    def sample_after(self, step: int) -> bool:
        """Whether the eval after ``step`` writes a sample: every eval's, but a budget's evals on the way (they
        keep to their share of it); its last eval's always."""
        return not self.budgeted or self.is_end(step)

    @property
    def share(self) -> float | None:
        """An eval's record of where the run is: the share of the budget spent (None: counted in steps)."""
        return round(self.progress, 6) if self.budgeted else None

    def eval_at_share(self, step: int) -> bool:
        """Counted in steps: whether train.eval_shares puts an eval after ``step`` (the first step at or past each
        share of the end step)."""
        return not self.budgeted and any(step == math.ceil(s * self.end_step - 1e-9) for s in self.eval_shares)

    def ended_at(self, step: int) -> "Horizon":
        """The run ends at ``step``: a budget's first guess at its end, or where it is when the budget was spent
        before this process trained anything."""
        return dataclasses.replace(self, end_step=step)

    # ------------------------------------------------------------------ read

    @property
    def budgeted(self) -> bool:
        return self.budget_s is not None

    @property
    def decay_start(self) -> int | None:
        """wsd: the first step of the decay (where an extension goes on from): counted in steps, where
        ``decay_fraction`` of the steps are left; budgeted, the step the clock got there (None until then).
        cosine: None."""
        if self.schedule != "wsd":
            return None
        if self.budgeted:
            return self.decay_step
        return self.steps_decay_start

    @property
    def steps_decay_start(self) -> int:
        """wsd counted in steps: the first step of the decay, where ``decay_fraction`` of the steps are left."""
        return max(self.warmup, self.end_step - max(1, round(self.decay_fraction * self.end_step)))

    def is_end(self, step: int) -> bool:
        """Whether ``step`` is the run's last (its final eval, checkpoint and log line are due)."""
        return step >= self.end_step

    def lr_factor(self, step: int) -> float:
        """The learning rate for the update after ``step`` steps, as a share of its peak (the same for every
        parameter group: AdamW's train.lr, Muon's train.muon_lr), ending at min_lr / lr."""
        floor = self.min_lr / self.lr
        ramp = (step + 1) / (self.warmup + 1) if step < self.warmup else 1.0
        if self.budgeted:
            progress = min(1.0, max(0.0, self.progress + self.step_share))
            if self.schedule == "wsd":
                frac = max(0.0, (progress - (1.0 - self.decay_fraction)) / self.decay_fraction)
                return min(ramp, 1.0 - frac * (1.0 - floor))
            return min(ramp, floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor))
        if ramp < 1.0:
            return ramp
        if self.schedule == "wsd":
            start = self.steps_decay_start
            if step < start:
                return 1.0
            frac = min(1.0, (step - start + 1) / max(1, self.end_step - start))
            return 1.0 - frac * (1.0 - floor)
        decay_end = self.lr_decay_iters or self.end_step
        if step >= decay_end:
            return floor
        frac = (step - self.warmup) / max(1, decay_end - self.warmup)
        return floor + 0.5 * (1.0 + math.cos(math.pi * frac)) * (1.0 - floor)

    def lr_at(self, step: int) -> float:
        """AdamW's learning rate for the update after ``step`` steps."""
        return self.lr * self.lr_factor(step)




# ----------------------------------------------------------------------------- going on for more steps

@dataclass(frozen=True)
class Extension:
    """What ``resume --more N`` does with a run's horizon: which step it goes on from and what it says."""
    from_step: int        # the checkpoint step it goes on from (a wsd run past its decay: the decay start)
    end_step: int         # where the longer run ends
    note: str             # the one line the CLI prints and the "+ more steps" dialog shows
    budget_cleared: bool  # a budgeted run's extension is counted in steps
    problem: str = ""     # why resume refuses it (it would end inside its warmup: the preset's check), or ""
    warmup: int | None = None  # a budgeted run's: the warmup its plan gave it, which the longer run keeps


def extension(p: Preset, state: dict[str, Any] | None, ckpt_step: int, more: int) -> Extension:
    """``resume --more more`` from the checkpoint at ``ckpt_step`` of a run of ``p`` (``state``: that
    checkpoint's trainer state, where a budgeted run recorded its decay step): the run goes on from that
    checkpoint, or, for a wsd run whose decay had begun, from the decay start (the stable phase continues, a
    new decay ends the longer run; the decayed run is kept), for ``more`` steps counted from ``ckpt_step``.
    ``plan_resume`` (what runs) and the TUI's dialog (what is said) both ask this. The note describes the longer
    run's own horizon (counted in steps, with the preset's train.warmup_iters) from where it goes on: through the
    rest of its warmup when it starts inside it."""
    h = Horizon.from_state(p, state)
    end = ckpt_step + more
    # a budget's planned warmup (a share of its steps) is the longer run's too: it does not warm up again
    kept = h.warmup if h.budgeted and h.eval_iters else None
    longer_p = dataclasses.replace(p, train=dataclasses.replace(
        p.train, max_iters=end, time_budget="", warmup_iters=p.train.warmup_iters if kept is None else kept))
    longer = Horizon.of(longer_p)
    budget = h.budgeted
    # wsd past its decay: from where the decay began; before it (a budget whose clock never got there, too), and
    # cosine: from the checkpoint
    decay = h.decay_start if h.schedule == "wsd" else None
    decayed = decay is not None and ckpt_step > decay
    start = decay if decay is not None and decayed else ckpt_step
    counted = (f"; train.time_budget = {p.train.time_budget} is spent, so the {more:,} more steps are counted in "
               "steps") if budget else ""
    branch = (f"wsd: it goes on from step {start:,}, where the decay began (a new run, the decayed one kept), so "
              if decayed else "")
    if start < longer.warmup:  # the longer run trains inside its warmup at first: say where that ends, and then
        lead = branch or ("wsd: " if h.schedule == "wsd" else "cosine schedule: ")
        note, problem = _through_warmup(longer, start, ckpt_step, end, h.warmup)
        return Extension(start, end, lead + note + counted, budget, problem, kept)
    if decayed:
        note = (f"{branch}the learning rate stays at {p.train.lr:.2e} until step {longer.steps_decay_start:,}, then "
                f"decays to {p.train.min_lr:.2e} by step {end:,}")
        return Extension(start, end, note + counted, budget, warmup=kept)
    after, final = longer.lr_at(ckpt_step), longer.lr_at(end - 1)
    if h.schedule == "wsd":
        note = (f"wsd: the stable phase goes on at {after:.2e} until step {longer.steps_decay_start:,}, then the "
                f"learning rate decays to {final:.2e}")
    elif p.train.lr_decay_iters and ckpt_step < p.train.lr_decay_iters:
        to = min(end, p.train.lr_decay_iters)
        note = (f"the cosine decay ends at step {p.train.lr_decay_iters} (train.lr_decay_iters), so the learning "
                f"rate goes on from {after:.2e} down to {longer.lr_at(to - 1):.2e} by step {to:,}"
                + (", then stays there" if end > to else ""))
    elif p.train.lr_decay_iters:
        note = (f"the cosine decay ends at step {p.train.lr_decay_iters} (train.lr_decay_iters), so the learning "
                f"rate stays at {after:.2e} for the {more:,} new steps")
    else:
        before = h.lr_at(max(0, ckpt_step - 1)) if not budget else None
        went = f"goes from {before:.2e} at step {ckpt_step:,} {'up ' if after > before * 1.01 else ''}to" \
            if before is not None else "restarts at"
        note = (f"cosine schedule: its decay is stretched to end at step {end:,}, so the learning rate {went} "
                f"{after:.2e}, then decays to {final:.2e}")
    return Extension(ckpt_step, end, note + counted, budget, warmup=kept)


def _through_warmup(run: Horizon, start: int, ckpt_step: int, end: int, own_warmup: int) -> tuple[str, str]:
    """The learning rate of ``run`` (an extension's, counted in steps) from ``start``, inside its warmup, to
    ``end``: the rest of the warmup, then the peak and the decay; and why resume refuses it when it would end
    inside the warmup (the preset's own check). ``own_warmup``: the warmup of the run before (a budget's is a
    share of its steps, shorter than train.warmup_iters, which the extension takes: it warms up again)."""
    w, first = run.warmup, run.lr_at(start)
    rise = (f"the learning rate warms up again to step {w:,} (train.warmup_iters; the budget's warmup was "
            f"{own_warmup:,} steps)" if start >= own_warmup else f"the warmup goes on to step {w:,}")
    if end <= w:
        note = (f"{rise}, past the new end: the learning rate rises from {first:.2e} to {run.lr_at(end - 1):.2e} by "
                f"step {end:,}, short of its peak {run.lr:.2e}, and does not decay (more than {w - ckpt_step:,} more "
                "steps leave the warmup)")
        return note, (f"the run would end inside its warmup (train.warmup_iters = {w:,}, to step {w:,}): give more "
                      f"than {w - ckpt_step:,} more steps")
    peak = f", where the learning rate reaches its peak {run.lr:.2e} (from {first:.2e})"
    if run.schedule == "wsd":
        d = run.steps_decay_start
        if d > w:
            return f"{rise}{peak}, stays there until step {d:,}, then decays to {run.min_lr:.2e} by step {end:,}", ""
        # no stable phase left: the decay takes over at the warmup's end, short of the peak
        top = max(run.lr_at(w - 1), run.lr_at(w))
        return (f"{rise}: the learning rate rises from {first:.2e} to {top:.2e}, then decays to {run.min_lr:.2e} "
                f"by step {end:,}"), ""
    if run.lr_decay_iters and run.lr_decay_iters < end:
        return (f"{rise}{peak}, then decays to {run.min_lr:.2e} by step {run.lr_decay_iters:,} "
                "(train.lr_decay_iters) and stays there"), ""
    return f"{rise}{peak}, then decays to {run.lr_at(end - 1):.2e} by step {end:,}", ""
