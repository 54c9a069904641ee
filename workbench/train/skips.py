"""What the loop keeps of each step once its loss and gradient norm are on the host: the last finite
loss, non-finite steps skipped (in a row and in all), whether a rollback is due, and the newest
step's result for the log line.

With the host check (``RunSettings.nonfinite_check == "host"``) a step is recorded as soon as it
ran. With the device check the GPU has already decided whether to apply the update (fused AdamW's
``found_inf``); the step's numbers stay on the device and are read when the next step has been
queued (the GPU has finished this one by then, so reading it waits for nothing), or at once by
:meth:`Skips.settle` where the loop needs them: a log line, an eval, a checkpoint, a stop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workbench.train.reporter import Reporter
from workbench.train.state import TrainerState


@dataclass(frozen=True)
class StepResult:
    step: int
    lr: float
    loss: float
    grad_norm: float
    finite: bool


class Skips:
    def __init__(self, state: TrainerState, report: Reporter, max_skips: int):
        self.state = state  # the trainer's state (a checkpoint's restore loads into this same object)
        self.report, self.max_skips = report, max_skips
        self.consecutive = 0
        self.last_loss: float | None = None   # the last finite training loss
        self.result: StepResult | None = None  # the newest step read
        self.rollback_due = False              # max_skips non-finite steps in a row were read
        self._pending: tuple[int, float, torch.Tensor] | None = None  # (step, lr, [loss, norm, bad]) on the device

    def record(self, step: int, lr: float, loss: float, grad_norm: float, finite: bool) -> None:
        if finite:
            self.consecutive = 0
            self.last_loss = loss
        else:
            st = self.state
            st.skipped_total += 1
            self.consecutive += 1
            self.report.event("nonfinite_skip", step, loss=loss if math.isfinite(loss) else None,
                              grad_norm=grad_norm if math.isfinite(grad_norm) else None, consecutive=self.consecutive,
                              lr=lr)
            self.report.log(f"step {step}: non-finite loss or gradient norm, update skipped "
                            f"({self.consecutive} in a row, {st.skipped_total} in all)")
            # kept even when a later finite step is read before the loop looks (device check)
            self.rollback_due = self.rollback_due or self.consecutive >= self.max_skips
        self.result = StepResult(step, lr, loss, grad_norm, finite)

    def queue(self, step: int, lr: float, loss: torch.Tensor, grad_norm: torch.Tensor, bad: torch.Tensor) -> None:
        """A step whose numbers are still on the device; the one queued before it is read now."""
        before, self._pending = self._pending, (step, lr, torch.stack([loss.float(), grad_norm.float(), bad.float()]))
        if before is not None:
            self._read(before)

    def settle(self) -> None:
        """Read the step the device may still be computing."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._read(pending)

    def _read(self, pending: tuple[int, float, torch.Tensor]) -> None:
        step, lr, vec = pending
        loss, grad_norm, bad = vec.tolist()
        self.record(step, lr, loss, grad_norm, not bad)

    def reset(self) -> None:
        """After a rollback: nothing pending, nothing in a row."""
        self._pending, self.consecutive, self.result, self.rollback_due = None, 0, None, False
