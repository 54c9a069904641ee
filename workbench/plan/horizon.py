"""A run's horizon: where it ends, where a wsd decay starts, and the learning-rate factor at each step.

One owner for these facts (torchtitan keeps its LR scheduler as a component with a state of its own, which
the trainer steps and the checkpointer saves; this is that, torch-free). A :class:`Horizon` is made once from
the preset (:meth:`Horizon.of`), with a time budget's first guess at its end step and what a checkpoint's
trainer state recorded (:meth:`Horizon.from_state`); the trainer steps it (:meth:`Horizon.after_step`, which
returns a new one: the preset is never written), saves it with its state (:meth:`Horizon.to_state`), and
everything that shows or reasons about the run reads it: the loop's end and last eval, the checkpointer's
decay-start save, ``status.json``'s ``max_iters``, a resume's plan and the "+ more steps" dialog's note
(:func:`extension`), the doctor and the TUI.

Counted in steps, the run ends at ``train.max_iters``; cosine decays to ``min_lr`` at ``lr_decay_iters``
(default the end), wsd is stable until ``decay_fraction`` of the steps are left, then linear to ``min_lr``.
With ``train.time_budget``, the schedule follows the share of the budget spent (``progress``) after warmup
(wsd: stable until ``1 - decay_fraction`` of the budget is spent, then linear; cosine over the whole
budget), the end step is re-estimated after every step from the run's pace, and the wsd decay's first step
is known only once the clock gets there (``decay_step``). A warmup the budget cuts short yields to the
decay (the lower of the two), so a budgeted run always ends at ``min_lr``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from workbench.config import Preset, budget_seconds


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

    # ------------------------------------------------------------------ made once

    @classmethod
    def of(cls, p: Preset, first_guess: int | None = None) -> "Horizon":
        """The horizon of a new run of ``p``; ``first_guess``: with a time budget, the step it is estimated to
        end at before any step is timed (default train.max_iters)."""
        t = p.train
        budget = budget_seconds(t.time_budget)
        end = first_guess if budget is not None and first_guess is not None else t.max_iters
        return cls(schedule=t.schedule, lr=t.lr, min_lr=t.min_lr, warmup=t.warmup_iters, end_step=end,
                   decay_fraction=t.decay_fraction, lr_decay_iters=t.lr_decay_iters, budget_s=budget)

    @classmethod
    def from_state(cls, p: Preset, state: dict[str, Any] | None, first_guess: int | None = None) -> "Horizon":
        """The horizon of ``p`` going on from a checkpoint's trainer state (``trainer_state.json``): a budgeted
        run keeps the decay step it recorded and the share it had spent (its end is guessed again: this
        process's pace decides it); a run counted in steps is the preset's (a resume may have changed
        max_iters: ``--more``)."""
        h = cls.of(p, first_guess)
        if h.budget_s is None or not state:
            return h
        decay = state.get("decay_step")
        return dataclasses.replace(h, decay_step=int(decay) if decay is not None else None,
                                   progress=float(state.get("budget_progress") or 0.0))

    def to_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of it (beside the trainer state's other fields)."""
        return {"end_step": self.end_step, "decay_step": self.decay_step, "budget_progress": self.progress}

    # ------------------------------------------------------------------ stepped

    def after_step(self, step: int, end_step: int, progress: float | None = None) -> "Horizon":
        """After ``step``: the end step as now estimated (a budget's), the share of the budget spent (the next
        step's schedule; it never goes back) and, for a budgeted wsd run, the decay's first step once the
        budget reaches it."""
        prog = self.progress if progress is None else max(self.progress, min(1.0, progress))
        decay = self.decay_step
        if (self.budgeted and self.schedule == "wsd" and decay is None
                and prog >= 1.0 - self.decay_fraction):
            decay = step
        return dataclasses.replace(self, end_step=end_step, progress=prog, decay_step=decay)

    def ended_at(self, step: int) -> "Horizon":
        """The run ends at ``step`` (a budget spent before this process trained anything)."""
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
            progress = min(1.0, max(0.0, self.progress))
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


def extension(p: Preset, state: dict[str, Any] | None, ckpt_step: int, more: int) -> Extension:
    """``resume --more more`` from the checkpoint at ``ckpt_step`` of a run of ``p`` (``state``: that
    checkpoint's trainer state, where a budgeted run recorded its decay step): the run goes on from that
    checkpoint, or, for a wsd run whose decay had begun, from the decay start (the stable phase continues, a
    new decay ends the longer run; the decayed run is kept), for ``more`` steps counted from ``ckpt_step``.
    ``plan_resume`` (what runs) and the TUI's dialog (what is said) both ask this."""
    h = Horizon.from_state(p, state)
    end = ckpt_step + more
    longer_p = dataclasses.replace(p, train=dataclasses.replace(p.train, max_iters=end, time_budget=""))
    longer = Horizon.of(longer_p)
    budget = h.budgeted
    # wsd: where the decay began; a budget whose clock never got there goes on from the checkpoint (stable phase)
    start = (ckpt_step if h.decay_start is None else h.decay_start) if h.schedule == "wsd" else ckpt_step
    counted = (f"; train.time_budget = {p.train.time_budget} is spent, so the {more:,} more steps are counted in "
               "steps") if budget else ""
    if h.schedule == "wsd" and ckpt_step > start:
        note = (f"wsd: it goes on from step {start:,}, where the decay began (a new run, the decayed one kept), so "
                f"the learning rate stays at {p.train.lr:.2e} until step {longer.steps_decay_start:,}, then decays to "
                f"{p.train.min_lr:.2e} by step {end:,}")
        return Extension(start, end, note + counted, budget)
    after, final = longer.lr_at(ckpt_step), longer.lr_at(end - 1)
    if h.schedule == "wsd":
        note = (f"wsd: the stable phase goes on at {after:.2e} until step {longer.steps_decay_start:,}, then the "
                f"learning rate decays to {final:.2e}")
    elif p.train.lr_decay_iters:
        note = (f"the cosine decay ends at step {p.train.lr_decay_iters} (train.lr_decay_iters), so the learning "
                f"rate stays at {after:.2e} for the {more:,} new steps")
    else:
        before = h.lr_at(max(0, ckpt_step - 1)) if not budget else None
        went = f"goes from {before:.2e} at step {ckpt_step:,} {'up ' if after > before * 1.01 else ''}to" \
            if before is not None else "restarts at"
        note = (f"cosine schedule: its decay is stretched to end at step {end:,}, so the learning rate {went} "
                f"{after:.2e}, then decays to {final:.2e}")
    return Extension(ckpt_step, end, note + counted, budget)
