"""Data-parallel training under torchrun: who we are, and the few collectives the loop needs.

torchrun sets WORLD_SIZE / RANK / LOCAL_RANK. With a world of one (plain
``python -m workbench.train``) every method is a cheap no-op, so the single-process
loop is unchanged. Rank 0 alone writes the run directory; every rank computes the
same decisions (evals, checkpoints, early stop, stop requests) so collectives line up.
Replicated (DDP) by default; sharded (FSDP2, ``hardware.shard``) on request.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist


class Dist:
    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.world > 1
        self.is_main = self.rank == 0

    def init(self, device: torch.device) -> None:
        if self.enabled and not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=10))

    def device_for(self, device: torch.device) -> torch.device:
        """Each rank gets its own GPU (cuda:LOCAL_RANK); CPU ranks share the CPU."""
        if self.enabled and device.type == "cuda":
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return device

    def shard(self, model: torch.nn.Module) -> None:
        """FSDP2 instead of DDP: each rank keeps 1/world of every parameter, its gradient and its
        optimizer state. Rank 0's weights go to every rank first (DDP does the same when it wraps),
        since each rank initialised its own; then each transformer block becomes one all-gather /
        reduce-scatter unit and the root takes the rest (embedding, final norm). In place: the
        model's parameters become DTensor shards, so an optimizer must be built after this."""
        from torch.distributed.fsdp import fully_shard  # lazily: sharded runs only
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, src=0)
        for block in model.layers:
            fully_shard(block)
        fully_shard(model)

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (on every rank)."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (checkpoints are read by rank 0 alone)."""
        if not self.enabled:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self, clean: bool) -> None:
        """Leave the group. After a clean finish, wait for every rank first: tearing gloo down while
        rank 0 is still writing its last checkpoint aborts the others ("terminate called...")."""
        if self.enabled and dist.is_initialized():
            if clean:
                try:
                    dist.barrier()
                except Exception:
                    pass
            dist.destroy_process_group()
