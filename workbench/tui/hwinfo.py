"""Hardware facts for the Hardware pane, without torch: ``workbench.machine.detect`` (psutil +
NVML), what precision / TF32 / attention / compile the devices support (from the GPU's compute
capability), and the recommended preset from the one recommender (``workbench.plan.fit.recommend``)."""

from __future__ import annotations

from typing import Any

from workbench.machine.detect import detect
from workbench.plan.fit.recommend import recommend_preset
from workbench.plan.settings import attention_kind

__all__ = ["capabilities", "detect", "recommend"]


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
        rows.append(("mps", "bf16, fp32", "n/a", f"SDPA ({attention_kind('mps', 0.0)})", "no"))
    cpu = info.get("cpu") or {}
    bf16 = cpu.get("native_bf16")
    # the kernel the run gets, as the estimate and the trainer take it (torch's CPU flash kernel; with attention
    # dropout, math): "SDPA (math)" here beside "attention flash" in `workbench estimate` was a contradiction
    cpu_attention = f"SDPA ({attention_kind('cpu', 0.0)}; {attention_kind('cpu', 0.1)} with dropout)"
    rows.append(("cpu", "fp32" + (", bf16 (native)" if bf16 else ""), "n/a", cpu_attention,
                 "yes (inductor)" if info.get("cxx") else "no C++ compiler"))
    return rows


def recommend(info: dict[str, Any]) -> tuple[str, str]:
    """(preset name, why) for the machine ``info`` describes (detected, or injected by tests)."""
    return recommend_preset(info)
