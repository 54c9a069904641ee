"""The trainer's checkpoints (save, restore, when) and the one line a failed run ends with."""

from __future__ import annotations

import time
import traceback
from typing import TYPE_CHECKING, Callable

import torch

from workbench import rundir
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine
from workbench.plan.estimate import estimate_memory
from workbench.plan.schedule import decay_start
from workbench.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    apply_retention,
    check_model_compatible,
    check_model_compatible_keys,
    gather_sharded_state,
    load_sharded_state,
    save_checkpoint,
)
from workbench.train.lora import adapter_state_dict
from workbench.train.runtime import is_oom
from workbench.train.state import HostRng, TrainerState, set_torch_rng, torch_rng

if TYPE_CHECKING:  # the trainer owns this object; only its type is needed here
    from workbench.train.loop import Trainer


class CheckpointIO:
    """Saving and restoring everything a run needs to continue exactly: weights, optimizer,
    GradScaler, every rank's RNG, the trainer's state (see workbench.train.state)."""

    def __init__(self, trainer: "Trainer"):
        self.tr = trainer
        self.elapsed_before = 0.0   # training time of the run before this process
        self.ckpt_seconds = 0.0     # time spent saving, in this process
        self.changes: dict = {}     # [train] keys changed since the checkpoint restored: {key: [old, new]}

    def report_changes(self) -> None:
        tr = self.tr
        if self.changes:
            tr.report.event("preset_changed", tr.state.step, changes=self.changes)
            tr.report.log("preset changes since that checkpoint: "
                          + ", ".join(f"train.{k} {a!r} -> {b!r}" for k, (a, b) in self.changes.items()))

    def elapsed(self) -> float:
        return self.elapsed_before + (time.time() - self.tr.started)

    def due(self, step: int) -> bool:
        t = self.tr.preset.train
        return step % t.ckpt_interval == 0 or step == t.max_iters

    def save(self, train_loss: float | None, val_loss: float | None, reason: str) -> None:
        tr = self.tr
        b, dist, st, p = tr.built, tr.dist, tr.state, tr.preset
        # Collective: every rank's RNG state goes into the checkpoint, which rank 0 writes.
        rank_rng = dist.gather(torch_rng())
        sharded = tr.settings.parallel == "fsdp"
        if sharded:  # also collective: the shards are gathered whole onto rank 0's CPU
            sd, optim_sd = gather_sharded_state(b.model, b.optimizer.adamw)  # (Muon refuses sharding)
        if not dist.is_main:
            return
        if not sharded:
            sd, optim_sd = model_checkpoint_state(b.model, p), b.optimizer.state_dict()
        state = {"optimizer": optim_sd, "scaler": b.scaler.state_dict(), "rng": rank_rng[0]}
        if dist.enabled:
            state["rank_rng"] = rank_rng
        st.sampler = tr.sampler.state()
        st.host_rng = HostRng.capture()
        st.train_preset = vars(p.train)
        ts = dict(st.to_dict(), elapsed_s=self.elapsed())
        meta = {"train_loss": train_loss, "val_loss": val_loss, "tokens_seen": st.tokens_seen,
                "elapsed_s": round(self.elapsed(), 2), "reason": reason, "preset": p.name,
                "best_val_loss": st.best_val, "model": vars(p.model), "world_size": dist.world,
                "finetune": p.train.finetune}
        t0 = time.time()
        try:
            path = save_checkpoint(tr.run_dir, st.step, sd, state, ts, meta, tr.faults)
        except OSError as e:
            prev = rundir.list_checkpoints(tr.run_dir)
            keep = f"; checkpoint {prev[-1]['name']} is intact" if prev else ""
            raise CheckpointError(f"could not save checkpoint at step {st.step}: {e.strerror or e} (disk full?){keep}; "
                                  f"free space, then `workbench resume {tr.run_dir.name}`") from None
        pinned = (decay_start(p),) if p.train.schedule == "wsd" else ()
        removed = apply_retention(tr.run_dir, p.train.keep_last, p.train.milestone_interval, pinned)
        dt = time.time() - t0
        self.ckpt_seconds += dt
        tr.report.event("checkpoint", st.step, name=path.name, reason=reason, seconds=round(dt, 3), removed=removed)
        tr.report.log(f"saved checkpoint {path.name} ({reason}, {dt:.2f} s)")

    def restore(self, ck: Checkpoint, at_start: bool) -> Callable[[], None]:
        """Load ``ck`` into the built model, optimizer and scaler, and the trainer's state; returns
        the function that restores the RNGs (called last, once nothing else draws random numbers)."""
        tr = self.tr
        b, dist = tr.built, tr.dist
        lora = tr.preset.train.finetune == "lora"
        where = f"checkpoint {ck.meta['name']}"
        if lora:  # the adapters alone, beside the frozen weights the model was built with
            check_model_compatible_keys(adapter_state_dict(b.model), ck.model, where)
        else:
            check_model_compatible(b.model, ck.model, where)
        sharded = tr.settings.parallel == "fsdp"
        if sharded:
            load_sharded_state(b.model, None, ck.model, None)
        else:
            b.model.load_state_dict(ck.model, strict=not lora)
        step = ck.trainer_state["step"]
        try:
            if sharded:
                load_sharded_state(b.model, b.optimizer.adamw, None, ck.state["optimizer"])
            else:
                b.optimizer.load_state_dict(ck.state["optimizer"])
            if ck.state.get("scaler"):
                b.scaler.load_state_dict(ck.state["scaler"])
            ranks = ck.state.get("rank_rng")
            if ranks and len(ranks) == dist.world:
                rng = ranks[dist.rank]
            else:
                rng = ck.state["rng"]
                if dist.enabled:  # another world size: rank-specific dropout streams cannot continue
                    torch.manual_seed(tr.preset.train.seed + dist.rank + 7919 * step)
                    rng = torch_rng()
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise CheckpointError(f"checkpoint {ck.meta['name']} does not match this run's optimizer: {e}") from None
        tr.state = TrainerState.from_dict(ck.trainer_state)
        tr.sampler.set_state(tr.state.sampler)
        if at_start:
            self.elapsed_before = tr.state.elapsed_s
        tr.report.log(f"resumed from checkpoint {ck.meta['name']} (step {step})")
        # Safe changes since the checkpoint (schedule length, intervals) are allowed and recorded, after
        # the resume event (``report_changes``).
        old = tr.state.train_preset
        self.changes = {k: [old[k], v] for k, v in vars(tr.preset.train).items() if k in old and old[k] != v}
        host = tr.state.host_rng

        def restore_rng() -> None:
            set_torch_rng(rng)
            if host is not None:
                host.restore()
        return restore_rng


def model_checkpoint_state(model: torch.nn.Module, p) -> dict:
    """What a checkpoint's model.pt holds: the whole state dict, or a LoRA run's adapters alone."""
    return adapter_state_dict(model) if p.train.finetune == "lora" else model.state_dict()


def oom_message(tr: "Trainer") -> str:
    p = tr.preset
    t, s = p.train, tr.settings
    half = max(1, t.batch_size // 2)
    est = ""
    try:
        m = estimate_memory(p, s.precision, s.device_type, batch_size=half, machine=Machine.assumed(s.device_type))
        est = f" (estimated {m.total / 2**30:.1f} GiB at batch_size {half})"
    except WorkbenchError:  # the advice stands without the number
        pass
    return (f"out of memory on {tr.device} at batch_size {t.batch_size} x seq_len {p.model.seq_len}; lower "
            f"train.batch_size (raise train.grad_accum to keep the tokens per step){est}, lower model.seq_len, or set "
            f"hardware.activation_checkpointing = true; `workbench fit {p.name}` finds a batch that fits")


def failure_message(tr: "Trainer", e: BaseException) -> str:
    """The one line status.json and the CLI show for a run that failed with ``e``."""
    if isinstance(e, WorkbenchError):
        return str(e)
    if is_oom(e) and tr.settings is not None:
        return oom_message(tr)
    if isinstance(e, KeyboardInterrupt):
        return "interrupted twice; stopped without saving (the last checkpoint is intact)"
    tr.report.log(traceback.format_exc())
    if tr.dist.enabled and isinstance(e, (RuntimeError, OSError)):
        return (f"rank {tr.dist.rank}: another rank of this run stopped (its process died or was killed: "
                f"{type(e).__name__} in a collective); see train.log for which, then "
                f"`workbench resume {tr.run_dir.name}`")
    return f"{type(e).__name__}: {e} (traceback in train.log)"
