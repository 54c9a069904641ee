"""Evaluation: mean loss and bits per byte over fixed batches of the train and the val data."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable

import torch

from workbench.config import Preset
from workbench.data.chat_data import IGNORE, ChatData
from workbench.data.tokens import TokenData
from workbench.rundir import EvalRecord
from workbench.train.batches import Sampler, new_sampler
from workbench.train.dist import Dist


@torch.no_grad()
def evaluate(model: torch.nn.Module, p: Preset, data: TokenData | ChatData, token_bytes: torch.Tensor, dist: Dist,
             autocast: contextlib.AbstractContextManager, device: torch.device,
             batch: Callable[[Sampler], tuple[torch.Tensor | None, ...]], step: int) -> EvalRecord:
    """Mean loss over eval_iters fixed batches of train and of val (the same batches every eval), and their
    bits per byte: the loss in bits over the UTF-8 bytes the target tokens stand for (``token_bytes``: bytes
    per token id), which does not depend on the tokenizer. Text: windows; chat: rows of conversations, the
    loss over their trained targets. ``batch(sampler)``: this rank's (x, y, positions, segments) of the
    sampler's next global batch, on the device; under DDP the sums of all ranks are added up."""
    model.eval()
    loss, bpb = [], []
    for part in ("train", "val"):
        s = new_sampler(data, part, p, seed=p.train.seed + 1)
        nats, count, nbytes = (torch.zeros((), device=device) for _ in range(3))
        for _ in range(p.train.eval_iters):
            x, y, pos, seg = batch(s)
            trained = y != IGNORE
            with autocast:
                nats += model(x, y, positions=pos, segments=seg, loss_tokens=1.0)[1].float()
            count += trained.sum()
            nbytes += token_bytes[y.clamp_min(0)][trained].sum()
        vec = dist.sum_(torch.stack([nats, count.float(), nbytes.float()]))
        loss.append(vec[0].item() / max(1.0, vec[1].item()))
        bpb.append(vec[0].item() / math.log(2) / max(1.0, vec[2].item()))
    model.train()
    return EvalRecord(step=step, train_loss=loss[0], val_loss=loss[1], time=time.time(), train_bpb=bpb[0],
                      val_bpb=bpb[1])
