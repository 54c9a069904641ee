"""When the trainer saves a checkpoint, and how a save is written, pruned and reported.

The checkpointer is handed the state it saves (the trainer's ``state_dict()``, see
:mod:`workbench.train.stateful`), never the trainer: it decides *when* (``maybe_save``) and owns
the files (``save_checkpoint``, retention, the event and the log line).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from workbench import rundir
from workbench.config import Preset
from workbench.faults import Faults
from workbench.plan.schedule.horizon import Horizon
from workbench.train.checkpoint import CheckpointError, apply_retention, save_checkpoint
from workbench.train.reporter import Reporter


class Checkpointer:
    def __init__(self, run_dir: Path, preset: Preset, report: Reporter, faults: Faults,
                 horizon: Callable[[], Horizon]):
        self.run_dir, self.preset, self.report, self.faults = Path(run_dir), preset, report, faults
        self.horizon = horizon      # the run's horizon as the trainer has it now (its end, a wsd decay start)
        self.seconds = 0.0          # time spent saving, in this process
        self.last_seconds = 0.0     # the last save's (a time budget keeps it for the run's final checkpoint)

    def decay_step(self) -> int | None:
        """A wsd schedule's decay start (where an extension goes on from), if there is one yet."""
        return self.horizon().decay_start

    def due(self, step: int) -> str | None:
        """Why a checkpoint is due after ``step`` (its interval or the run's end; a wsd schedule's decay start,
        where an extension goes on from), or None."""
        t = self.preset.train
        if step % t.ckpt_interval == 0 or self.horizon().is_end(step):
            return "interval"
        if step == self.decay_step():
            return "decay start"
        return None

    def maybe_save(self, step: int, state_dict: Callable[[], dict[str, Any] | None], train_loss: float | None,
                   val_loss: float | None = None, reason: str | None = None) -> bool:
        """Save after ``step`` when ``reason`` is given (best, stop) or a save is due; True when it saved.
        Every rank calls it: ``state_dict`` is collective and returns the state on rank 0 alone."""
        due = self.due(step)
        if reason and due == "decay start":  # where an extension goes on from: said even when it is also the best
            reason = f"{reason}, {due}"
        reason = reason or due
        if reason is None:
            return False
        state = state_dict()
        if state is not None:
            self._write(step, state, train_loss, val_loss, reason)
        return True

    def _write(self, step: int, state: dict[str, Any], train_loss: float | None, val_loss: float | None,
               reason: str) -> None:
        p = self.preset
        meta = dict(state["meta"], train_loss=train_loss, val_loss=val_loss, reason=reason)
        t0 = time.time()
        try:
            path = save_checkpoint(self.run_dir, step, state["model"], state["state"], state["trainer_state"], meta,
                                   self.faults)
        except OSError as e:
            prev = rundir.list_checkpoints(self.run_dir)
            keep = f"; checkpoint {prev[-1]['name']} is intact" if prev else ""
            raise CheckpointError(f"could not save checkpoint at step {step}: {e.strerror or e} (disk full?){keep}; "
                                  f"free space, then `workbench resume {self.run_dir.name}`") from None
        pinned = () if self.decay_step() is None else (self.decay_step(),)
        removed = apply_retention(self.run_dir, p.train.keep_last, p.train.milestone_interval, pinned)
        dt = time.time() - t0
        self.seconds += dt
        self.last_seconds = dt
        self.report.event("checkpoint", step, name=path.name, reason=reason, seconds=round(dt, 3), removed=removed)
        self.report.log(f"saved checkpoint {path.name} ({reason}, {dt:.2f} s)")
