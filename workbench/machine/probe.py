"""What torch can use on this machine, and a measured matmul rate: the torch side of detection.

Imports torch (the TUI never imports this module; it uses ``workbench.machine.detect``).
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import torch

from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine, cpu_has_native_bf16, detect, have_cxx, remember_calibration
from workbench.machine.peaks import PRECISION_ALIASES, peak_flops

# ----------------------------------------------------------------------------- calibration

_MATMUL_CACHE: dict[tuple[str, str], float] = {}


def measure_matmul_flops(device: str = "cpu", precision: str = "fp32", seconds: float = 0.3) -> float:
    """Measured matmul FLOP/s on ``device`` at ``precision``: an honest peak for MFU.

    Times square matmuls for about ``seconds`` after a warm-up. Results are
    cached per process (the CPU one is what `workbench estimate` and MFU on CPU
    use). fp32 on CUDA means strict FP32; ask for "tf32" to allow TF32.
    """
    prec = PRECISION_ALIASES.get(precision.lower(), precision.lower())
    key = (device, prec)
    if key in _MATMUL_CACHE:
        return _MATMUL_CACHE[key]

    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
             "fp16": torch.float16}.get(prec)
    if dtype is None:
        raise WorkbenchError(f"precision {precision!r} is not one of fp32, tf32, bf16, fp16")
    dev = torch.device(device)
    n = 1024 if dev.type == "cpu" else 4096

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        elif dev.type == "mps":
            torch.mps.synchronize()

    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    # Its own generator: the trainer's RNG streams must not move (exact resume).
    gen = torch.Generator(device="cpu").manual_seed(0)
    try:
        a = torch.randn(n, n, generator=gen).to(device=dev, dtype=dtype)
        b = torch.randn(n, n, generator=gen).to(device=dev, dtype=dtype)
        for _ in range(3):  # warm-up: kernel selection, thread pool start, clocks
            c = a @ b
        sync()
        # The best of several short windows: a peak is what the hardware *can* do, and on a
        # shared machine the mean of one long window measures the neighbours too.
        best, t_end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < t_end or best == 0.0:
            iters, t0 = 0, time.perf_counter()
            while iters < 4:
                c = a @ b
                iters += 1
            sync()
            best = max(best, 2.0 * n ** 3 * iters / (time.perf_counter() - t0))
        del c
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    flops = best
    _MATMUL_CACHE[key] = flops
    remember_calibration(device, prec, flops)
    return flops


def mfu_peak(device: str, precision: str, gpu_name: str | None = None) -> tuple[float, str]:
    """(peak FLOP/s, "table" | "measured") for MFU on ``device``: the table where it knows
    the GPU, otherwise a short matmul calibration (always on CPU and MPS)."""
    if device.startswith("cuda"):
        if gpu_name is None:
            gpu_name = torch.cuda.get_device_name(torch.device(device))
        value = peak_flops(gpu_name, precision)
        if value:
            return value, "table"
    return measure_matmul_flops(device, precision), "measured"


def detect_torch() -> dict[str, Any]:
    """What torch offers here: CUDA/MPS and the capability flags training cares about."""
    out: dict[str, Any] = {"available": True, "version": torch.__version__,
                           "cuda_build": torch.version.cuda, "cuda": False, "mps": False}
    try:
        out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:  # older torch
        out["cpu_capability"] = None
    out["cpu_bf16_native"] = cpu_has_native_bf16()
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
        fused_devices = set(_get_fused_kernels_supported_devices())
    except Exception:
        fused_devices = {"cuda"}
    have_triton = importlib.util.find_spec("triton") is not None
    out["compile_cpu"] = have_cxx()
    out["fused_adamw_cpu"] = "cpu" in fused_devices
    out["fused_devices"] = sorted(fused_devices)

    if torch.cuda.is_available():
        out["cuda"] = True
        devs = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            cc = (p.major, p.minor)
            devs.append({
                "index": i, "name": p.name, "memory": int(p.total_memory),
                "compute_capability": f"{p.major}.{p.minor}",
                "bf16": cc >= (8, 0),
                "tf32": cc >= (8, 0),
                # SDPA's flash kernel needs sm80+; older cards get the memory-efficient kernel.
                "flash_attention": cc >= (8, 0) and torch.backends.cuda.flash_sdp_enabled(),
                "mem_efficient_attention": torch.backends.cuda.mem_efficient_sdp_enabled(),
                "fused_adamw": "cuda" in fused_devices,
                "compile": have_triton and cc >= (7, 0),
            })
        out["cuda_devices"] = devs
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out["mps"] = True
        out["mps_caps"] = {"bf16": True, "fused_adamw": "mps" in fused_devices,
                           "compile": False, "flash_attention": False}
    return out


def detect_with_torch() -> dict[str, Any]:
    """``detect()`` plus torch's view of CUDA, MPS and its capability flags."""
    info = detect()
    info["torch"] = detect_torch()
    return info


def this_machine() -> Machine:
    """This machine as torch sees it (what the trainer and ``fit`` resolve a preset against)."""
    return Machine.from_info(detect_with_torch())


def measured_peak(device: str, precision: str) -> float | None:
    """Peak FLOP/s for MFU and run-time estimates: the GPU table where it knows the GPU, else a short
    matmul calibration; None when the calibration cannot run."""
    try:
        return mfu_peak(device, precision)[0]
    except Exception:  # noqa: BLE001 - a peak is an estimate's input, never a reason to fail
        return None
