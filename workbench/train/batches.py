"""What the engine does with a batch of any kind of data (:mod:`workbench.data.train_data`): this rank's rows of
it on the device, and its loss. The loop and the evaluation ask these; neither looks inside a batch."""

from __future__ import annotations

from typing import Callable

import torch

from workbench.data.train_data import Batch
from workbench.train import runtime
from workbench.train.objective import Objective


def on_device(batch: Batch, device: torch.device, rank: int = 0, rows: int | None = None,
              flex: bool = False) -> Batch[torch.Tensor]:
    """This rank's part of a global batch (rows ``[rank * rows, (rank + 1) * rows)``; all of it when ``rows`` is
    None) on ``device``; ``flex``: its segments as flex attention's block mask (runtime.batch_to_device)."""
    if rows is not None:
        batch = batch.map(lambda a: a[rank * rows:(rank + 1) * rows])
    return runtime.batch_to_device(batch, device, flex=flex)


def batch_loss(forward: Callable, batch: Batch[torch.Tensor], loss_tokens: float | None,
               objective: Objective | None = None) -> torch.Tensor:
    """The loss of one batch on the device through ``forward`` (the model, or its compiled / DDP wrapper): the
    next-token cross-entropy over its trained targets, their mean (``loss_tokens`` None) or their sum over
    ``loss_tokens``. The one place a batch meets the model's loss: a preference run's ``objective`` (DPO, SimPO,
    ORPO, KTO: :mod:`workbench.train.objective`) takes its batches here, not in the loop."""
    if objective is not None:
        return objective.loss(forward, batch, loss_tokens)
    return forward(batch.inputs, batch.targets, positions=batch.positions, segments=batch.segments,
                   loss_tokens=loss_tokens)[1]


__all__ = ["batch_loss", "on_device"]
