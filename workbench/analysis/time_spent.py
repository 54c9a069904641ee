"""Where a run's wall-clock went: its seconds in evals and in checkpoint saves against the whole, as the
trainer's eval records and its end event carry them (``rundir.TIME_KEYS``: totals of the whole run, across
resumes). ``workbench runs`` and the doctor read the newest of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from workbench.rundir import TIME_KEYS, EvalRecord, EventRecord, Record

# The events that end a trainer's work (the run's state), each with the run's time totals.
END_EVENTS = ("finish", "stopped", "early_stopped")


@dataclass(frozen=True)
class TimeSpent:
    step: int
    elapsed_s: float    # the run's wall-clock so far (set-up, steps, evals, saves)
    eval_s: float       # ... spent in evals
    ckpt_s: float       # ... spent saving checkpoints

    @property
    def eval_share(self) -> float:
        return self.eval_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def ckpt_share(self) -> float:
        return self.ckpt_s / self.elapsed_s if self.elapsed_s > 0 else 0.0


def time_spent_of(r: Record) -> TimeSpent | None:
    """The totals an eval record or an end event carries; None for other records, and for those of a trainer
    from before they were recorded."""
    if isinstance(r, EvalRecord):
        vals = r.time_spent()
    elif isinstance(r, EventRecord) and r.event in END_EVENTS:
        vals = {k: r.get(k) for k in TIME_KEYS}
    else:
        return None
    nums = {k: float(v) for k, v in vals.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return TimeSpent(step=r.step, **nums) if len(nums) == len(vals) else None


def latest_time_spent(records: Iterable[Record]) -> TimeSpent | None:
    """The newest totals among ``records`` (in file order)."""
    out = None
    for r in records:
        out = time_spent_of(r) or out
    return out
