"""Evaluation: mean loss and bits per byte over fixed batches of the train and the val data.

The batches are the same at every eval of a run (drawn from ``train.seed + 1``), so they are drawn once,
moved to the device once and kept there (:class:`EvalBatches`: cpu-small's 14 batches take 0.9 MB, 50 of
datacenter-80gb's 52 MB), with their target and byte counts; an eval is then the forward passes alone. The
record is the one the batches drawn anew each time gave, to the bit (tests/train/test_evaluation.py)."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from workbench.config import Preset
from workbench.data.train_data import IGNORE, Batch, Sampler, TrainData
from workbench.rundir import EvalRecord
from workbench.train.batches import batch_loss
from workbench.train.dist import Dist
from workbench.train.objective import Objective

PARTS = ("train", "val")
SOURCE = "val:"   # a mixture's source's own val batches: "val:<name>" (its held-out documents alone)


@dataclass
class EvalPart:
    """One split's eval batches on the device: this rank's part of each, and the trained targets and the UTF-8
    bytes they stand for, summed (float32, in the order the loop summed them)."""
    batches: list[Batch[torch.Tensor]]
    count: torch.Tensor
    nbytes: torch.Tensor


@dataclass
class EvalBatches:
    """The fixed batches every eval of a run scores: ``n`` of train and ``n`` of val."""
    n: int
    parts: dict[str, EvalPart]

    @classmethod
    def draw(cls, p: Preset, data: TrainData, n: int, token_bytes: torch.Tensor, device: torch.device,
             batch: Callable[[Sampler], Batch[torch.Tensor]]) -> "EvalBatches":
        """``n`` batches of each split from a sampler seeded ``train.seed + 1``; ``batch(sampler)``: this rank's
        part of the sampler's next global batch, on the device."""
        samplers = {part: data.sampler(part, p, seed=p.train.seed + 1) for part in PARTS}
        if (per_source := getattr(data, "source_samplers", None)) is not None:  # a mixture: each source's val too
            samplers.update({SOURCE + name: s for name, s in per_source("val", p, seed=p.train.seed + 1).items()})
        parts = {}
        for part, s in samplers.items():
            count, nbytes = (torch.zeros((), device=device) for _ in range(2))
            batches = []
            for _ in range(n):
                b = batch(s)
                trained = b.targets != IGNORE
                count += b.loss_units()  # trained targets; a preference batch's pairs or answers
                nbytes += token_bytes[b.targets.clamp_min(0)][trained].sum()
                batches.append(b)
            parts[part] = EvalPart(batches, count, nbytes)
        return cls(n, parts)


@torch.no_grad()
def evaluate(model: torch.nn.Module, evals: EvalBatches, dist: Dist, autocast: contextlib.AbstractContextManager,
             step: int, objective: Objective | None = None) -> EvalRecord:
    """Mean loss over the fixed batches of train and of val, and their bits per byte: the loss in bits over the
    UTF-8 bytes the target tokens stand for, which does not depend on the tokenizer. Text: windows; chat: rows of
    conversations, the loss over their trained targets; preference data (``objective``): the objective's loss per
    pair (or answer), its bits over the chosen answers' bytes, and its measures as ``extra["preference"]``
    (PreferenceRecords of the eval's train and val batches); a mixture: each source's val loss (its own held-out
    documents) as ``extra["val_sources"]`` ({name: loss}, and ``val_sources_bpb``). Under DDP the sums of all ranks
    are added up."""
    model.eval()
    loss, bpb = [], []
    prefs = []
    for part in evals.parts:
        ep = evals.parts[part]
        nats = torch.zeros((), device=ep.count.device)
        for b in ep.batches:
            with autocast:
                nats += batch_loss(model, b, loss_tokens=1.0, objective=objective).float()
        if objective is not None and (rec := objective.take(step, "val" if part == "val" else "eval-train",
                                                           time.time())) is not None:
            prefs.append(rec)
        vec = dist.sum_(torch.stack([nats, ep.count.float(), ep.nbytes.float()]))
        loss.append(vec[0].item() / max(1.0, vec[1].item()))
        bpb.append(vec[0].item() / math.log(2) / max(1.0, vec[2].item()))
    model.train()
    extra: dict = {"preference": prefs} if prefs else {}
    if len(loss) > len(PARTS):  # a mixture: each source's val loss and bits per byte, by name
        names = [part[len(SOURCE):] for part in evals.parts if part.startswith(SOURCE)]
        extra["val_sources"] = dict(zip(names, loss[len(PARTS):]))
        extra["val_sources_bpb"] = dict(zip(names, bpb[len(PARTS):]))
    return EvalRecord(step=step, train_loss=loss[0], val_loss=loss[1], time=time.time(), train_bpb=bpb[0],
                      val_bpb=bpb[1], extra=extra)


def per_source(ev: EvalRecord) -> str:
    """A mixture's val loss per source for the eval's log line ('; val by source: web 4.1234, code 3.9876'), or ''."""
    by = ev.extra.get("val_sources")
    return "; val by source: " + ", ".join(f"{n} {v:.4f}" for n, v in by.items()) if by else ""


@torch.no_grad()
def time_eval_batch(model: torch.nn.Module, evals: EvalBatches, autocast: contextlib.AbstractContextManager,
                    objective: Objective | None = None) -> float:
    """Seconds of one eval batch's forward on this device now (the first train batch, twice: the second timed, the first
    paying for any first-call cost), which sizes a time budget's evals (plan.schedule.budget_plan.plan_budget)."""
    b = evals.parts["train"].batches[0]
    model.eval()
    try:
        for _ in range(2):
            t0 = time.perf_counter()
            with autocast:
                batch_loss(model, b, loss_tokens=1.0, objective=objective).float().item()  # .item(): synced
        return time.perf_counter() - t0
    finally:
        model.train()
