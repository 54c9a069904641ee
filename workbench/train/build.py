"""Building what a run trains, as its RunSettings say: the model (activation checkpointing, the
fused loss's chunk), torch.compile, DDP or FSDP2, AdamW, the GradScaler."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from workbench.config import Preset
from workbench.plan.settings import RunSettings
from workbench.train.dist import Dist
from workbench.train.model import GPT
from workbench.train.optim import Optimizers, build_optimizer

# Read before torch can set it: inductor writes its default cache dir into the environment.
USER_INDUCTOR_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


@dataclass
class Built:
    model: GPT                          # owns the weights: state dicts, evals, samples (FSDP2 shards it in place)
    train_forward: torch.nn.Module      # what a training step calls: the model, wrapped by DDP and/or compiled
    optimizer: Optimizers
    scaler: torch.amp.GradScaler


def use_inductor_cache(cache: Path) -> None:
    """Compiled kernels go to the run's own cache, so a resume compiles warm (unless the user chose one)."""
    cache.mkdir(parents=True, exist_ok=True)
    if not USER_INDUCTOR_CACHE:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)


def build(p: Preset, s: RunSettings, device: torch.device, dist: Dist, cache_dir: Path) -> Built:
    model = GPT(p.model, activation_checkpointing=s.activation_checkpointing,
                loss_chunk_tokens=s.loss_chunk_tokens).to(device)
    if s.compile:
        use_inductor_cache(cache_dir)
        # Each variant keeps the state dict's plain names (see plan.settings.compile_mode for why these three).
        if s.compile_mode == "per block":
            for block in model.layers:
                block.compile()
        elif s.compile_mode == "all but the loss":
            model.compile_hidden()
    train_forward: torch.nn.Module = model
    if s.parallel == "fsdp":
        dist.shard(model)  # in place: the parameters become shards, so the optimizer is built after this
    elif s.parallel == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        train_forward = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
    if s.compile and s.compile_mode == "whole model":
        train_forward = torch.compile(train_forward)
    optimizer = build_optimizer(model, p.train, fused=s.fused_optimizer)
    scaler = torch.amp.GradScaler(device.type, enabled=s.grad_scaler)
    return Built(model, train_forward, optimizer, scaler)
