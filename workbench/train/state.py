"""The trainer's own state: what a checkpoint must hold, besides weights and optimizer, for a
resumed run to continue exactly as the original would have.

:class:`TrainerState` is saved as ``trainer_state.json`` (``to_dict``) and read back with
``from_dict``: adding a field is one edit here. The random number generators are captured and
restored as a pair too: :class:`HostRng` (Python's and NumPy's, JSON) and :func:`torch_rng` /
:func:`set_torch_rng` (torch's CPU, CUDA and MPS generators, tensors kept in ``state.pt``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch


@dataclass
class HostRng:
    """Python's ``random`` and NumPy's legacy global generator, as JSON lists."""
    python: list
    numpy: list

    @classmethod
    def capture(cls) -> "HostRng":
        py = random.getstate()
        nps = np.random.get_state()
        return cls(python=[py[0], list(py[1]), py[2]],
                   numpy=[nps[0], nps[1].tolist(), int(nps[2]), int(nps[3]), float(nps[4])])

    def restore(self) -> None:
        py, nps = self.python, self.numpy
        random.setstate((py[0], tuple(py[1]), py[2]))
        np.random.set_state((nps[0], np.array(nps[1], dtype=np.uint32), *nps[2:]))


def torch_rng() -> dict[str, Any]:
    """torch's generators: CPU always, CUDA and MPS where they are in use."""
    st: dict[str, Any] = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["torch_cuda"] = torch.cuda.get_rng_state_all()
    if hasattr(torch, "mps") and torch.backends.mps.is_available():
        try:
            st["torch_mps"] = torch.mps.get_rng_state()
        except RuntimeError:
            pass
    return st


def set_torch_rng(st: dict[str, Any]) -> None:
    # RNG states are CPU byte tensors whatever device they were loaded to.
    torch.set_rng_state(st["torch_cpu"].cpu())
    if "torch_cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in st["torch_cuda"]])
    if "torch_mps" in st and torch.backends.mps.is_available():
        torch.mps.set_rng_state(st["torch_mps"].cpu())


@dataclass
class TrainerState:
    step: int = 0                     # optimizer steps done
    tokens_seen: int = 0
    best_val: float | None = None     # best val loss so far (early stopping, "best" checkpoints)
    bad_evals: int = 0                # evals since the best one (early stopping)
    lr_scale: float = 1.0             # halved by each rollback after non-finite steps
    rollbacks: int = 0
    skipped_total: int = 0            # non-finite steps skipped in the whole run
    elapsed_s: float = 0.0            # training time before this process started
    eval_s: float = 0.0               # the run's seconds in evals (and their samples) so far
    ckpt_s: float = 0.0               # ... and in checkpoint saves (a checkpoint holds those before its own)
    sampler: dict | None = None       # the data sampler's generator state
    host_rng: HostRng | None = None
    train_preset: dict = field(default_factory=dict)  # [train] at save time: resume reports what changed

    def replace_with(self, other: "TrainerState") -> None:
        """Become ``other``, in place: the loop's parts (the skip counter) hold this object."""
        for f in fields(self):
            setattr(self, f.name, getattr(other, f.name))

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "host_rng"}
        if self.host_rng is not None:
            d["python_rng"], d["numpy_rng"] = self.host_rng.python, self.host_rng.numpy
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainerState":
        """Missing keys (a checkpoint from an older workbench) take their defaults."""
        known = {f.name for f in fields(cls)} - {"host_rng"}
        st = cls(**{k: v for k, v in d.items() if k in known})
        if "python_rng" in d and "numpy_rng" in d:
            st.host_rng = HostRng(python=d["python_rng"], numpy=d["numpy_rng"])
        return st
