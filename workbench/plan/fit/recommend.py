"""The preset that suits a machine, and what to change when a preset does not fit.

One recommender for the CLI (``workbench hw``, ``train`` with no preset) and the TUI's Hardware
pane: the first choice by device class and memory, checked with the memory estimate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.config import Preset, PresetError, preset_paths, resolve_preset
from workbench.fmt import GiB, human_bytes
from workbench.machine.detect import Machine, detect
from workbench.plan.fit import memory as est
from workbench.plan.fit.batch import plan_accumulation, search_batch
from workbench.plan.settings import SettingsError

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


# What each memory saver costs in speed, by device kind ("*": any): (factor on tokens/s, why). Activation
# checkpointing runs each block's forward again in backward: 8 instead of 6 FLOPs per parameter and token.
# 8-bit AdamW states: torchao's step, compiled per tensor, in place of the fused fp32 kernel; measured on a
# CPU by bench/savers.py (~100 M parameters, batch 1 x 32: 14 vs 81 tokens/s, the step dominating at so
# small a batch), not yet on a GPU.
SAVER_SPEED: dict[str, dict[str, tuple[float | None, str]]] = {
    "hardware.activation_checkpointing": {"*": (0.75, "x0.75 tokens/s: one more forward in backward")},
    "hardware.optimizer_states": {"cpu": (0.17, "x0.17 tokens/s measured on a CPU at batch 1 (bench/savers.py)"),
                                  "cuda": (0.52, "x0.52 tokens/s measured on an H100 (~124 M params, 32,768 tokens "
                                                 "a step; bench/savers.py)"),
                                  "*": (None, "speed not yet measured on this device")},
    # AdamW's states and step on the host (CUDA only): the same H100 run, its host 16 cores
    "hardware.optimizer_states=offload": {"cuda": (0.52, "x0.52 tokens/s measured on an H100 with 16 host cores "
                                                         "(~124 M params, 32,768 tokens a step; bench/savers.py)")},
    # frozen matrices need no weight gradients: ~4 instead of 6 FLOPs per parameter and token
    "train.finetune": {"*": (1.5, "x1.5 tokens/s by FLOPs; trains low-rank adapters, not every weight")},
}
# Cheapest in speed first. LoRA only for a fine-tune (a preset with [init]) that trains every weight.
SAVERS: tuple[dict[str, str], ...] = (
    {}, {"hardware.optimizer_states": "8bit"}, {"hardware.optimizer_states": "offload"},
    {"hardware.activation_checkpointing": "true"},
    {"hardware.activation_checkpointing": "true", "hardware.optimizer_states": "8bit"},
    {"hardware.activation_checkpointing": "true", "hardware.optimizer_states": "offload"})
CUDA_ONLY = {("hardware.optimizer_states", "offload")}
LORA_SAVERS = ({"train.finetune": "lora"}, {"train.finetune": "lora", "hardware.activation_checkpointing": "true"})


def saver_changes(preset: Preset, savers: dict[str, Any]) -> dict[str, Any]:
    """The ``{"section.key": value}`` changes ``savers`` make to ``preset``: the savers, and what they need
    (8-bit states bring their own AdamW step, so an explicit fused_adamw = true goes back to auto)."""
    changes = dict(savers)
    if savers.get("hardware.optimizer_states") in ("8bit", "offload") and preset.hardware.fused_adamw == "true":
        changes["hardware.fused_adamw"] = "auto"
    return changes


def with_savers(preset: Preset, savers: dict[str, Any]) -> Preset:
    """``preset`` with the changes ``savers`` make (:func:`saver_changes`)."""
    sections: dict[str, dict] = {}
    for key, value in saver_changes(preset, savers).items():
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = value
    return dataclasses.replace(preset, **{sec: dataclasses.replace(getattr(preset, sec), **kw)
                                          for sec, kw in sections.items()})


def fitting_savers(preset: Preset, device: str, available: int, machine: Machine | None = None) -> list[dict[str, Any]]:
    """Each combination of memory savers (smaller micro-batch with accumulation; 8-bit AdamW states;
    activation checkpointing; for a full fine-tune, LoRA) that makes ``preset`` fit ``available`` bytes on
    ``device`` by the estimate, cheapest in speed first: {"set": [KEY=VALUE, ...], "batch": the micro-batch
    fit would pick, "batch_size", "grad_accum", "total": bytes, "speed": factor on tokens/s or None, "why"}."""
    seqs = preset.train.batch_size * preset.train.grad_accum
    limit = (1 - est.HEADROOM) * available
    combos = list(SAVERS) + (list(LORA_SAVERS) if preset.init is not None and preset.train.finetune == "full"
                             else [])
    out = []
    for savers in combos:
        if any(getattr(getattr(preset, k.split(".")[0]), k.split(".")[1]) == v for k, v in savers.items()):
            continue  # already on
        if device.split(":")[0] != "cuda" and CUDA_ONLY & set(savers.items()):
            continue
        p = with_savers(preset, savers)
        try:
            est.estimate_settings(est.what_if(p, device=device), machine)
        except SettingsError:  # e.g. offload on a GPU that trains in fp16
            continue

        def total_at(b: int, p: Preset = p) -> int:
            """The estimate with the micro-batch ``b`` and the accumulation that keeps the tokens a step (its
            gradients stay resident between micro-batches: another peak than one micro-batch's alone)."""
            bs, acc, _ = plan_accumulation(seqs, b)
            return est.estimate_memory(dataclasses.replace(p, train=dataclasses.replace(
                p.train, batch_size=bs, grad_accum=acc)), device=device, machine=machine).total

        b = search_batch(lambda b: total_at(b) <= limit, cap=seqs, start=min(preset.train.batch_size, seqs))[0]
        if not b:
            continue
        bs, acc, note = plan_accumulation(seqs, b)
        speed: float | None = 1.0
        why = []
        for key in savers:
            by_kind = SAVER_SPEED.get(f"{key}={savers[key]}", SAVER_SPEED[key])
            factor, reason = by_kind.get(device.split(":")[0]) or by_kind["*"]
            speed = speed * factor if speed is not None and factor is not None else None
            why.append(reason)
        sets = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in saver_changes(preset, savers).items()]
        if (bs, acc) != (preset.train.batch_size, preset.train.grad_accum):
            sets += [f"train.batch_size={bs}", f"train.grad_accum={acc}"]
            why.append("same tokens per step" if not note else f"{(bs * acc - seqs) / seqs:+.0%} tokens per step")
        total = total_at(b)
        out.append({"set": sets, "batch": b, "batch_size": bs, "grad_accum": acc, "total": total, "speed": speed,
                    "why": "; ".join(why)})
    return out


def suggest_changes(preset: Preset, device: str, available: int, machine: Machine | None = None) -> str:
    """What to change so ``preset`` fits ``available`` bytes on ``device``, by estimate: the first of
    :func:`fitting_savers` (a smaller micro-batch with more accumulation, then 8-bit AdamW states, then
    activation checkpointing), else bf16, else a shorter sequence."""
    options = fitting_savers(preset, device, available, machine)
    if options:
        o = options[0]
        tail = "; `workbench fit` writes it" if o["set"] and all(s.startswith("train.") for s in o["set"]) else ""
        return "--set " + " ".join(o["set"]) + (f" ({o['why']})" if o["why"] else "") + tail
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
            why = f"{device}: needs ~{human_bytes(m.total)} (estimate) of {human_bytes(mem)} {what}"
            if name != first:
                why += f"; {first_note}"
            return name, why
        if name == first:
            first_note = (f"{first} needs ~{human_bytes(m.total)} (estimate), more than {human_bytes(mem)} {what} "
                          f"allows with {est.HEADROOM:.0%} headroom; to run it: "
                          + suggest_changes(p, device, mem, machine))
    return first, first_note or f"{device} with {human_bytes(mem)} {what}"
