"""What earlier runs of a preset measured: tokens/s and memory, read from their run directories.

``workbench estimate`` prefers a measurement here over a calibration; the Presets pane shows it.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable

from workbench.config import Preset, PresetError, parse_toml
from workbench.machine.rates import BUSY_SHARE
from workbench.rundir import METRICS_FILE, PRESET_FILE, EventRecord, TrainRecord, iter_run_dirs, last_records

TAIL_BYTES = 4 << 20  # the end of a long run's metrics is enough for a median


def previous_run(preset: Preset, runs_root: Path, device: str) -> dict[str, Any] | None:
    """The newest run in ``runs_root`` of the same preset (name, model, batch size) on ``device``:
    its median tokens/s and peak memory, from metrics.jsonl. A run that started while other processes used
    the CPU (its calibration says how much: ``others_busy``) measured them too, so a quiet one is preferred
    however old: a 30 s budget was told "~0 steps" from a run that had trained beside a test suite."""
    want_model = preset.to_dict()["model"]
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
        if (data.get("name") != preset.name or data.get("model") != want_model
                or data.get("train", {}).get("batch_size") != preset.train.batch_size):
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
            "run": d.name, "mtime": mtime, "tokens_per_s": statistics.median(tps[1:] or tps), "records": len(tps),
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
