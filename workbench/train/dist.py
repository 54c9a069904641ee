"""Data-parallel training under torchrun: who we are, and the few collectives the loop needs.

torchrun sets WORLD_SIZE / RANK / LOCAL_RANK. With a world of one (plain
``python -m workbench.train``) every method is a cheap no-op, so the single-process
loop is unchanged. Rank 0 alone writes the run directory; every rank computes the
same decisions (evals, checkpoints, early stop, stop requests) so collectives line up.
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
