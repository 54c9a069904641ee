"""What earlier runs of a preset measured: tokens/s and memory, read from their run directories.

``workbench estimate`` prefers a measurement here over a calibration; the Presets pane shows it.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable

from workbench.config import Preset, PresetError, TrainConfig, parse_toml
from workbench.machine.rates import BUSY_SHARE
from workbench.rundir import METRICS_FILE, PRESET_FILE, EventRecord, TrainRecord, iter_run_dirs, last_records

TAIL_BYTES = 4 << 20  # the end of a long run's metrics is enough for a median


# What a step computes besides the model and the batch: a LoRA step has no weight gradients for the frozen
# matrices (and its adapters' size), a preference step runs two rows (and perhaps a reference) a record, Muon
# orthogonalises each matrix's update.
METHOD_KEYS = ("finetune", "objective", "optimizer")
LORA_KEYS = ("lora_rank", "lora_targets")
TRAIN_DEFAULTS = {k: getattr(TrainConfig(), k) for k in METHOD_KEYS + LORA_KEYS}
# [hardware] keys left out of a fine-tune's comparison: one that only describes, and the device and precision,
# which the estimate resolves (cpu for auto) where a run's preset keeps what was asked (the device's type is
# compared with the run's start record).
NOTE_KEYS = ("expected_memory_gb", "device", "precision")


def same_setup(data: dict, want: dict) -> str | None:
    """Whether the run whose preset.toml holds ``data`` trained the steps the preset ``want`` asks for (both as
    dicts), with the same model, batch and method (full or LoRA, the objective, the optimizer): "preset" (under the same
    preset's name), "model" (a fine-tune's: the same hardware settings under any preset's name, as the model is
    the source's and the name only the recipe's), or None."""
    train, their = want["train"], dict(TRAIN_DEFAULTS, **data.get("train", {}))  # an older preset.toml's absences
    if data.get("model") != want["model"] or their.get("batch_size") != train["batch_size"]:
        return None
    keys = METHOD_KEYS + (LORA_KEYS if train["finetune"] == "lora" else ())
    if any(their[k] != train[k] for k in keys):
        return None
    if data.get("name") == want["name"]:
        return "preset"
    if want.get("init") is None:
        return None

    def hw(d: dict) -> dict:
        return {k: v for k, v in (d.get("hardware") or {}).items() if k not in NOTE_KEYS}
    return "model" if hw(data) == hw(want) else None


def previous_run(preset: Preset, runs_root: Path, device: str) -> dict[str, Any] | None:
    """The newest run in ``runs_root`` of the same preset (name, model, batch size, fine-tuning method) on
    ``device``, or for a fine-tune (``--init-from``) of the same model trained the same way under any preset
    (``same_setup``): its median tokens/s and peak memory, from metrics.jsonl. A run that started while other
    processes used the CPU (its calibration says how much: ``others_busy``) measured them too, so a quiet one is
    preferred however old: a 30 s budget was told "~0 steps" from a run that had trained beside a test suite."""
    want = preset.to_dict()
    best: dict[str, Any] | None = None
    best_quiet: dict[str, Any] | None = None
    for d in iter_run_dirs(runs_root):
        pt, mt = d / PRESET_FILE, d / METRICS_FILE
        if not mt.is_file():
            continue
        try:
            data = parse_toml(pt.read_text(encoding="utf-8"), str(pt))
        except (PresetError, OSError):
            continue
        match = same_setup(data, want)
        if match is None:
            continue
        tps, mem, reserved, run_device, busy = [], [], [], None, None
        for r in last_records(mt, TAIL_BYTES):
            if isinstance(r, EventRecord) and r.event in ("start", "resume") and r.get("device"):
                run_device = str(r.get("device"))
                busy = (r.get("calibration") or {}).get("others_busy")
            elif isinstance(r, TrainRecord):
                if r.tokens_per_s is not None:
                    tps.append(r.tokens_per_s)
                if r.mem_mb is not None:
                    mem.append(r.mem_mb)
                if "mem_reserved_mb" in r.memory:
                    reserved.append(r.memory["mem_reserved_mb"])
        if not tps or (run_device and run_device.split(":")[0] != device.split(":")[0]):
            continue
        mtime = mt.stat().st_mtime
        found: dict[str, Any] = {
            "run": d.name, "mtime": mtime, "match": match, "preset": data.get("name"),
            "tokens_per_s": statistics.median(tps[1:] or tps), "records": len(tps),
            "device": run_device, "others_busy": busy, "mem_mb": max(mem) if mem else None,
            "mem_reserved_mb": max(reserved) if reserved else None}
        if best is None or mtime > best["mtime"]:
            best = found
        if not (busy or 0.0) >= BUSY_SHARE and (best_quiet is None or mtime > best_quiet["mtime"]):
            best_quiet = found
    return best_quiet or best


def measured_in(runs_root: Path | None) -> Callable[[Preset, str], dict[str, Any] | None] | None:
    """``previous_run`` over ``runs_root``, as the estimate report takes it (``plan.report.History``)."""
    return None if runs_root is None else (lambda preset, device: previous_run(preset, runs_root, device))
