"""Evaluation: mean loss and bits per byte over fixed windows of the train and the val tokens."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable

import torch

from workbench.config import Preset
from workbench.data.tokens import TokenData, WindowSampler
from workbench.rundir import EvalRecord
from workbench.train.dist import Dist


@torch.no_grad()
def evaluate(model: torch.nn.Module, p: Preset, data: TokenData, token_bytes: torch.Tensor, dist: Dist,
             autocast: contextlib.AbstractContextManager, device: torch.device,
             batch: Callable[[WindowSampler], tuple[torch.Tensor, torch.Tensor]], step: int) -> EvalRecord:
    """Mean loss over eval_iters fixed windows of train and of val (the same windows every eval), and their
    bits per byte: the loss in bits over the UTF-8 bytes the target tokens stand for (``token_bytes``: bytes
    per token id), which does not depend on the tokenizer. ``batch(sampler)``: this rank's (x, y) of the
    sampler's next global batch, on the device; under DDP the sums of all ranks are added up."""
    model.eval()
    loss, bpb = [], []
    for tokens in (data.train, data.val):
        s = WindowSampler(tokens, p.model.seq_len, p.train.batch_size, seed=p.train.seed + 1)
        losses, nats, nbytes = [], torch.zeros((), device=device), torch.zeros((), device=device)
        for _ in range(p.train.eval_iters):
            x, y = batch(s)
            with autocast:
                batch_loss = model(x, y)[1].float()
            losses.append(batch_loss)
            nats += batch_loss * y.numel()
            nbytes += token_bytes[y].sum()
        vec = dist.sum_(torch.stack([torch.stack(losses).mean(), nats, nbytes.float()]))
        loss.append(vec[0].item() / dist.world)
        bpb.append(vec[1].item() / math.log(2) / max(1.0, vec[2].item()))
    model.train()
    return EvalRecord(step=step, train_loss=loss[0], val_loss=loss[1], time=time.time(), train_bpb=bpb[0],
                      val_bpb=bpb[1])
