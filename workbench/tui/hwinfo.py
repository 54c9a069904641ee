"""Hardware facts for the Hardware pane, without torch.

Uses ``workbench.hardware.detect(use_torch=False)`` (psutil + NVML) and derives
what precision / TF32 / flash attention / compile this machine supports from the
GPU's compute capability, so the TUI never has to load torch to say it.
"""

from __future__ import annotations

import platform
import shutil
from typing import Any


def detect() -> dict[str, Any]:
    try:
        from workbench import hardware
        info = hardware.detect(use_torch=False)
    except Exception as e:  # the module is missing or broke: still show something useful
        info = _fallback_detect()
        info["note"] = f"workbench.hardware unavailable ({e.__class__.__name__}); basic facts only"
    info.setdefault("mps", platform.system() == "Darwin" and platform.machine() == "arm64")
    info.setdefault("cxx", bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")))
    return info


def _fallback_detect() -> dict[str, Any]:
    import os
    import psutil
    vm = psutil.virtual_memory()
    return {"cpu": {"model": platform.processor() or platform.machine(), "arch": platform.machine(),
                    "physical_cores": psutil.cpu_count(logical=False),
                    "logical_cores": psutil.cpu_count(logical=True),
                    "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                    "ram_total": vm.total, "ram_available": vm.available, "native_bf16": None},
            "nvidia": [], "nvidia_note": "no NVIDIA GPU information"}


def _cc(gpu: dict) -> tuple[int, int]:
    try:
        major, minor = str(gpu.get("compute_capability") or "0.0").split(".")
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def capabilities(info: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Rows (device, precision, TF32, attention, compile) of what training can use here."""
    rows = []
    for g in info.get("nvidia") or []:
        cc = _cc(g)
        ampere = cc >= (8, 0)
        rows.append((f"cuda:{g.get('index', 0)}",
                     "bf16, fp16, fp32" if ampere else "fp16 (GradScaler), fp32",
                     "yes" if ampere else "no",
                     "flash (SDPA)" if ampere else "memory-efficient (SDPA)",
                     "yes (triton)" if cc >= (7, 0) else "no"))
    if info.get("mps"):
        rows.append(("mps", "bf16, fp32", "n/a", "SDPA (no flash)", "no"))
    cpu = info.get("cpu") or {}
    bf16 = cpu.get("native_bf16")
    rows.append(("cpu", "fp32" + (", bf16 (native)" if bf16 else ""), "n/a", "SDPA (math)",
                 "yes (inductor)" if info.get("cxx") else "no C++ compiler"))
    return rows


def recommend(info: dict[str, Any], injected: bool = False) -> tuple[str, str]:
    """(preset name, why). Uses workbench.hardware.recommend_preset when it exists."""
    if not injected:
        try:
            from workbench.hardware import recommend_preset
            rec = recommend_preset(info)
            if isinstance(rec, (tuple, list)) and rec:
                return str(rec[0]), str(rec[1]) if len(rec) > 1 else ""
            if isinstance(rec, dict) and rec.get("name"):
                return str(rec["name"]), str(rec.get("why") or rec.get("reason") or "")
            if isinstance(rec, str) and rec:
                return rec, ""
        except Exception:
            pass
    gpus = info.get("nvidia") or []
    if gpus:
        vram = max((g.get("vram_total") or 0) for g in gpus) / 1024 ** 3
        name = "datacenter-80gb" if vram >= 70 else "gpu-24gb" if vram >= 20 else "gpu-8gb" if vram >= 7 else "medium"
        return name, f"largest NVIDIA GPU has {vram:.0f} GB"
    if info.get("mps"):
        return "apple-m4pro", "Apple silicon (MPS)"
    return "cpu-small", "no GPU: CPU training"
