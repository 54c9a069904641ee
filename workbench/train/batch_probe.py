"""``workbench fit``'s measurement: the largest micro-batch that fits a device.

On CUDA and MPS it is a real probe (:class:`Prober`): a few forward/backward/AdamW steps of the
preset's model per trial, built as the trainer would build it (the same RunSettings), micro-batch
sizes doubled until one fails (out of memory, or peak memory above the margin) and then bisected;
memory is freed between trials. On a CPU it is the memory estimate against the available RAM.
The search itself is ``workbench.plan.fit.batch.search_batch``.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from workbench.config import Preset
from workbench.errors import WorkbenchError
from workbench.fmt import human_bytes
from workbench.machine.detect import Machine
from workbench.plan.fit.batch import search_batch
from workbench.plan.fit.memory import estimate_memory, what_if
from workbench.plan.settings import PeakFn, RunSettings, resolve_settings
from workbench.train.lora import apply_lora, cast_frozen
from workbench.train.model import GPT, document_mask
from workbench.train.optim import build_optimizer
from workbench.train.runtime import amp_dtype, free_cached, is_oom, synchronize


class Prober:
    """Runs a few real training steps of ``preset`` at a given micro-batch and reports peak memory.

    The model and AdamW (with its states) are built once and kept, as in training."""

    def __init__(self, preset: Preset, settings: RunSettings, micro_batches: int = 1):
        self.preset, self.settings = preset, settings
        self.device = torch.device(settings.device)
        self.micro_batches = micro_batches  # 2 when the preset accumulates: gradients stay resident
        self.model = GPT(preset.model, activation_checkpointing=settings.activation_checkpointing,
                         loss_chunk_tokens=settings.loss_chunk_tokens)
        t = preset.train
        if t.finetune == "lora":  # as the trainer builds it (random weights weigh the same)
            apply_lora(self.model, t)
            if amp_dtype(settings) is not None:
                cast_frozen(self.model, amp_dtype(settings))
        self.model.to(self.device)
        self.optimizer = build_optimizer(self.model, t, fused=settings.fused_optimizer,
                                         states=settings.optimizer_states)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self.amp = amp_dtype(settings)

    def free(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        free_cached(self.device)

    def device_total(self) -> int | None:
        if self.device.type == "cuda":
            return torch.cuda.mem_get_info(self.device)[1]
        if self.device.type == "mps":
            return torch.mps.recommended_max_memory()
        return None

    def trial(self, batch: int, steps: int = 3, loss_chunk_tokens: int | None = None) -> dict[str, Any]:
        """{"ok", "oom", "peak_allocated", "peak_reserved", "tokens_per_s", "error"}. ``loss_chunk_tokens``:
        the fused loss's chunk the trainer would use at this batch (default: the settings')."""
        T, V = self.preset.model.seq_len, self.preset.model.vocab_size
        if loss_chunk_tokens is not None:
            self.model.loss_chunk_tokens = loss_chunk_tokens
        self.free()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        out: dict[str, Any] = {"batch": batch, "ok": False, "oom": False}
        packed = packed_inputs(batch, T, self.device) if self.settings.packed else {}
        if packed and self.settings.attention_kernel == "flex":
            packed["segments"] = document_mask(packed["segments"])
        try:
            gen = torch.Generator(device="cpu").manual_seed(batch)
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                for _ in range(self.micro_batches):
                    x = torch.randint(0, V, (batch, T), generator=gen).to(self.device)
                    with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                        _, loss = self.model(x, x, **packed)
                    (loss / self.micro_batches).backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step(self.scaler)
                self.optimizer.zero_grad(set_to_none=True)
                synchronize(self.device)
                times.append(time.perf_counter() - t0)
                del x, loss, _
            del packed
            timed = times[1:] or times
            out["tokens_per_s"] = batch * T * self.micro_batches * len(timed) / sum(timed)
            out["ok"] = True
        except (RuntimeError, torch.OutOfMemoryError) as e:  # an OOM surfaces as either
            if not is_oom(e):
                raise
            out["oom"] = True
            out["error"] = str(e).splitlines()[0][:200]
        if self.device.type == "cuda":
            out["peak_allocated"] = torch.cuda.max_memory_allocated(self.device)
            out["peak_reserved"] = torch.cuda.max_memory_reserved(self.device)
        elif self.device.type == "mps":
            out["peak_allocated"] = torch.mps.driver_allocated_memory()
            out["peak_reserved"] = out["peak_allocated"]
        self.free()
        return out


def packed_inputs(batch: int, seq_len: int, device: torch.device, per_row: int = 4) -> dict[str, torch.Tensor]:
    """A packed chat batch's ``segments`` and ``positions`` (``per_row`` conversations a row, positions from 0
    in each), so a probe's attention takes the block-diagonal mask the trainer's does."""
    seg = torch.arange(seq_len).mul(per_row).div(seq_len, rounding_mode="floor")
    pos = torch.arange(seq_len) - torch.searchsorted(seg, seg)
    return {"segments": seg.expand(batch, seq_len).to(device), "positions": pos.expand(batch, seq_len).to(device)}


@dataclass
class FitResult:
    settings: RunSettings                 # the run's settings at the source preset's batch
    best: int                             # the largest micro-batch that fits (0: none)
    how: str                              # how that was decided, for the preset's header
    trials: list[tuple[int, str]] = field(default_factory=list)
    measured: dict | None = None          # the probe's numbers at ``best`` (GPU)


def fit_target(src: Preset, device: str, machine: Machine, peak: PeakFn | None = None) -> tuple[Preset, RunSettings]:
    """The preset on the device being fitted (auto: the best device of ``machine``) and the settings of
    one process of its run there (``peak``: the measured peak FLOP/s, as the trainer has it)."""
    preset = what_if(src, device=device) if device != "auto" else src
    return preset, resolve_settings(preset, machine, world_size=1, peak=peak)


def find_batch(preset: Preset, settings: RunSettings, machine: Machine, margin: float, steps: int,
               on_trial: Callable[[int, str], None] = lambda b, desc: None) -> FitResult:
    """The largest micro-batch of ``preset`` that fits its device (see ``fit_target``)."""
    src = preset
    seqs = src.train.batch_size * src.train.grad_accum
    result = FitResult(settings=settings, best=0, how="")

    def settings_at(b: int) -> RunSettings:
        # activation checkpointing as the preset's own batch has it (the probe's model is built once with it,
        # and `fit` writes it into the fitted preset); the loss is auto's choice at each batch, as in training
        at_b = what_if(preset, batch_size=b, activation_checkpointing=settings.activation_checkpointing)
        return resolve_settings(at_b, machine, world_size=1)

    if settings.device_type == "cpu":
        avail, what = machine.memory("cpu")
        if not avail:
            raise WorkbenchError("cannot tell how much RAM is available here; give --device cuda or mps")
        limit = (1 - margin) * avail

        def trial(b: int) -> bool:
            m = estimate_memory(preset, settings=settings_at(b))
            ok = m.total <= limit
            desc = f"estimate {human_bytes(m.total)} {'fits' if ok else 'too big'}"
            result.trials.append((b, desc))
            on_trial(b, desc)
            return ok
        result.best, _ = search_batch(trial, cap=seqs, start=min(src.train.batch_size, seqs))
        result.how = f"estimate against {human_bytes(avail)} {what} (keeping {margin:.0%} free)"
        return result

    prober = Prober(preset, settings, micro_batches=2 if src.train.grad_accum > 1 else 1)
    total = prober.device_total()
    limit = (1 - margin) * total if total else None
    results: dict[int, dict] = {}

    def probe(b: int) -> bool:
        r = results[b] = prober.trial(b, steps, settings_at(b).loss_chunk_tokens)
        peak = r.get("peak_reserved")
        ok = r["ok"] and (limit is None or peak is None or peak <= limit)
        desc = "out of memory" if r["oom"] else (f"peak {human_bytes(peak)}" + ("" if ok else " over the margin")
                                                 + f", {r.get('tokens_per_s', 0):,.0f} tokens/s")
        result.trials.append((b, desc))
        on_trial(b, desc)
        return ok
    result.best, _ = search_batch(probe, cap=seqs, start=min(src.train.batch_size, seqs))
    result.how = (f"real probe, {steps} steps per trial, peak reserved memory within {1 - margin:.0%} of "
                  f"{human_bytes(total)}")
    result.measured = results.get(result.best)
    return result
