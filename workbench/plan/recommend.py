"""The preset that suits a machine, and what to change when a preset does not fit.

One recommender for the CLI (``workbench hw``, ``train`` with no preset) and the TUI's Hardware
pane: the first choice by device class and memory, checked with the memory estimate.
"""

from __future__ import annotations

from typing import Any

from workbench.config import Preset, PresetError, preset_paths, resolve_preset
from workbench.fmt import GiB, human_bytes
from workbench.machine.detect import Machine, detect
from workbench.plan import estimate as est
from workbench.plan.batch import plan_accumulation, search_batch

# Larger to smaller, per device class: the first that fits (by estimate) is recommended.
LADDER = {
    "cuda": ["datacenter-80gb", "gpu-24gb", "gpu-8gb", "medium", "cpu-small"],
    "mps": ["apple-m4pro", "medium", "cpu-small"],
    "cpu": ["cpu-small"],
}


def first_choice(device: str, mem: int | None) -> str:
    """By device class, and on CUDA by memory: >= 60 GB datacenter-80gb, >= 20 gpu-24gb, >= 7 gpu-8gb."""
    if device == "cpu":
        return "cpu-small"
    if device == "mps":
        return "apple-m4pro"
    gb = (mem or 0) / GiB
    if gb >= 60:
        return "datacenter-80gb"
    if gb >= 20:
        return "gpu-24gb"
    if gb >= 7:
        return "gpu-8gb"
    return "medium"


def suggest_changes(preset: Preset, device: str, available: int, machine: Machine | None = None) -> str:
    """What to change so ``preset`` fits ``available`` bytes on ``device``, by estimate:
    a smaller micro-batch with more accumulation, then activation checkpointing, bf16, a shorter sequence."""
    seqs = preset.train.batch_size * preset.train.grad_accum
    limit = (1 - est.HEADROOM) * available

    def best_batch(**kw) -> int:
        return search_batch(lambda b: est.estimate_memory(preset, device=device, batch_size=b, machine=machine,
                                                          **kw)["total"] <= limit,
                            cap=seqs, start=min(preset.train.batch_size, seqs))[0]

    def plan(b: int) -> str:
        bs, acc, note = plan_accumulation(seqs, b)
        same = "same tokens per step" if not note else f"{(bs * acc - seqs) / seqs:+.0%} tokens per step"
        return f"batch_size {preset.train.batch_size} -> {bs} with grad_accum {acc} ({same})"

    b = best_batch()
    if b:
        return plan(b) + f"; `workbench fit {preset.name}` writes it"
    if not preset.hardware.activation_checkpointing:
        b = best_batch(activation_checkpointing=True)
        if b:
            return "hardware.activation_checkpointing = true and " + plan(b)
    precision = est.estimate_settings(est.what_if(preset, device=device), machine).precision
    if device != "cpu" and precision == "fp32":
        return "hardware.precision = bf16 (halves activations)"
    return f"a shorter model.seq_len (now {preset.model.seq_len}) or a smaller model"


def recommend_preset(info: dict[str, Any] | None = None) -> tuple[str, str]:
    """(preset name, one-line reason) for this machine (or ``info`` from a detection).

    CPU -> cpu-small; MPS -> apple-m4pro; CUDA by VRAM (>= 60 GB datacenter-80gb,
    >= 20 gpu-24gb, >= 7 gpu-8gb, else medium), then checked with the memory
    estimate: if the first choice does not fit with headroom, the next smaller
    preset that does is recommended and the reason says what to change to run
    the first choice.
    """
    machine = Machine.from_info(info if info is not None else detect())
    device = machine.best_device()
    mem, what = machine.memory(device)
    first = first_choice(device, mem)
    known = preset_paths()
    ladder = [n for n in LADDER[device] if n in known]
    if first not in known or not mem:
        return first, f"{device} with {human_bytes(mem)} {what}" if mem else f"{device} detected"
    ladder = ladder[ladder.index(first):] if first in ladder else [first]
    first_note = ""
    for name in ladder:
        try:
            p = resolve_preset(name)
            m = est.estimate_memory(p, device=device, machine=machine)
        except PresetError:
            continue
        if est.fits(m, mem):
            why = f"{device}: needs ~{human_bytes(m['total'])} (estimate) of {human_bytes(mem)} {what}"
            if name != first:
                why += f"; {first_note}"
            return name, why
        if name == first:
            first_note = (f"{first} needs ~{human_bytes(m['total'])} (estimate), more than {human_bytes(mem)} {what} "
                          f"allows with {est.HEADROOM:.0%} headroom; to run it: "
                          + suggest_changes(p, device, mem, machine))
    return first, first_note or f"{device} with {human_bytes(mem)} {what}"
