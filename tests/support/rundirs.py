"""Run directories written as the trainer writes them, through the run-directory contract's own typed
records (``RunStatus``, ``TrainRecord``, ``EvalRecord``, ``TaskRecord``, ``EventRecord``) and writers: a field
the trainer does not write cannot be invented here. No torch: a checkpoint is its ``meta.json`` and a
placeholder file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.rundir import (
    TASKS_FILE,
    EvalRecord,
    EventRecord,
    MetricsWriter,
    PreferenceRecord,
    RewardRecord,
    TaskRecord,
    TrainRecord,
    ckpt_name,
    write_status,
)


class RunDir:
    """``RunDir(root, "alpha", preset_toml)`` then ``train``, ``eval``, ``task``, ``event``, ``checkpoint`` in step
    order, ``status(...)`` and ``close()`` (or ``with RunDir(...) as r:``); ``scored`` for ``workbench eval``'s."""

    def __init__(self, root: Path, rid: str, preset_toml: str):
        self.path = Path(root) / rid
        (self.path / "checkpoints").mkdir(parents=True)
        (self.path / "preset.toml").write_text(preset_toml)
        self.metrics = MetricsWriter(self.path / "metrics.jsonl")

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.metrics.close()

    def train(self, step: int, loss: float | None, *, lr: float | None = 1e-3, grad_norm: float | None = 1.0,
              tokens_per_s: float | None = None, tokens_seen: int = 0, elapsed_s: float | None = None,
              skipped: int = 0, time: float | None = None, mem_mb: float | None = None, mfu: float | None = None,
              data_fraction: float | None = None, memory: dict[str, float] | None = None) -> None:
        self.metrics.write(TrainRecord(step=step, loss=loss, lr=lr, grad_norm=grad_norm, tokens_per_s=tokens_per_s,
                                       tokens_seen=tokens_seen, elapsed_s=elapsed_s, skipped=skipped, time=time,
                                       mem_mb=mem_mb, mfu=mfu, data_fraction=data_fraction, memory=dict(memory or {})))

    def eval(self, step: int, train_loss: float | None, val_loss: float | None, **bpb: float) -> None:
        self.metrics.write(EvalRecord(step=step, train_loss=train_loss, val_loss=val_loss, **bpb))

    def pref(self, step: int, split: str = "train", **values: float | None) -> None:
        """A preference run's record (rewards, margin, accuracy, drift) as the trainer writes it."""
        self.metrics.write(PreferenceRecord(step=step, split=split, **values))

    def reward(self, step: int, split: str = "train", **values: float | None) -> None:
        """A GRPO run's record (mean reward, its sd, groups without signal, KL, completion length) as the trainer
        writes it."""
        self.metrics.write(RewardRecord(step=step, split=split, **values))

    def task(self, step: int, task: str, metric: str, value: float | None, n: int = 100, **extra: Any) -> None:
        """A task score as the trainer writes it (``train.eval_tasks``) into metrics.jsonl."""
        self.metrics.write(TaskRecord(step=step, task=task, metric=metric, value=value, n=n, extra=extra))

    def scored(self, step: int, task: str, metric: str, value: float | None, n: int = 100, **extra: Any) -> None:
        """A task score as ``workbench eval`` appends it to tasks.jsonl."""
        rec = TaskRecord(step=step, task=task, metric=metric, value=value, n=n, extra=extra)
        with open(self.path / TASKS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec.to_dict(), separators=(",", ":")) + "\n")

    def event(self, event: str, step: int, **data: Any) -> None:
        self.metrics.write(EventRecord(event=event, step=step, data=data))

    def status(self, **fields: Any) -> None:
        # a fixed "updated": the time's digits would change the run's size on disk, which the Runs table shows
        write_status(self.path, now=fields.get("started") or 1_700_000_000.0, **fields)

    def checkpoint(self, step: int, **meta: Any) -> Path:
        """A complete checkpoint as listing sees it: meta.json (written last) beside a placeholder model file."""
        c = self.path / "checkpoints" / ckpt_name(step)
        c.mkdir()
        (c / "model.safetensors").write_bytes(b"\0" * 1000)
        (c / "meta.json").write_text(json.dumps({"step": step, "bytes": 1000, **meta}))
        return c

    def write_text(self, name: str, text: str) -> None:
        (self.path / name).write_text(text)
