"""Building what a run trains, as its RunSettings say: the model (activation checkpointing, the
fused loss's chunk; the weights it starts from and its LoRA adapters), torch.compile, DDP or FSDP2,
AdamW, the GradScaler."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from workbench.config import Preset
from workbench.plan.settings import RunSettings
from workbench.rundir import INIT_DIR
from workbench.train.checkpoint import load_weights
from workbench.train.dist import Dist
from workbench.train.lora import apply_lora, cast_frozen
from workbench.train.model import GPT
from workbench.train.optim import Optimizers, build_optimizer
from workbench.train.runtime import amp_dtype

# Read before torch can set it: inductor writes its default cache dir into the environment.
USER_INDUCTOR_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


@dataclass
class Built:
    model: GPT                          # owns the weights: state dicts, evals, samples (FSDP2 shards it in place)
    train_forward: torch.nn.Module      # what a training step calls: the model, wrapped by DDP and/or compiled
    optimizer: Optimizers
    scaler: torch.amp.GradScaler
    trainable: int = 0                  # parameters the optimizer updates (the adapters' alone with LoRA)


def use_inductor_cache(cache: Path) -> None:
    """Compiled kernels go to the run's own cache, so a resume compiles warm (unless the user chose one). Where
    torch._dynamo was imported before this module (its import writes inductor's default into the environment),
    the default is not taken for the user's choice: the run's cache was lost that way under test load."""
    # lazily: inductor (with dynamo, ~1 s to import) for compiled runs only
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    cache.mkdir(parents=True, exist_ok=True)
    if not USER_INDUCTOR_CACHE or USER_INDUCTOR_CACHE == default_cache_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)


def build(p: Preset, s: RunSettings, device: torch.device, dist: Dist, cache_dir: Path,
          init: dict | None = None) -> Built:
    """``init``: the weights to start from (a run's init/model.pt); with train.finetune = lora they are
    frozen and adapters are added (their initial values drawn from torch's RNG, after the model's)."""
    model = GPT(p.model, activation_checkpointing=s.activation_checkpointing,
                loss_chunk_tokens=s.loss_chunk_tokens)
    if init is not None:
        load_weights(model, init, f"{INIT_DIR}/model.pt")
    if p.train.finetune == "lora":
        apply_lora(model, p.train)
        if (dtype := amp_dtype(s)) is not None:
            cast_frozen(model, dtype)
    model = model.to(device)
    kw = {} if s.compile_kernels == "default" else {"mode": s.compile_kernels}
    if s.compile:
        use_inductor_cache(cache_dir)
        # Each variant keeps the state dict's plain names (see plan.settings.compile_mode for why these three).
        if s.compile_mode == "per block":
            for block in model.layers:
                block.compile(**kw)
        elif s.compile_mode == "all but the loss":
            model.compile_hidden(**kw)
    train_forward: torch.nn.Module = model
    if s.parallel == "fsdp":
        dist.shard(model)  # in place: the parameters become shards, so the optimizer is built after this
    elif s.parallel == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        train_forward = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
    if s.compile and s.compile_mode == "whole model":
        train_forward = torch.compile(train_forward, **kw)
    optimizer = build_optimizer(model, p.train, fused=s.fused_optimizer, states=s.optimizer_states)
    scaler = torch.amp.GradScaler(device.type, enabled=s.grad_scaler)
    trainable = sum(q.numel() for q in model.parameters() if q.requires_grad)
    return Built(model, train_forward, optimizer, scaler, trainable)
