"""What torch can use on this machine, and its measured matmul rate: the torch side of detection.

Imports torch (the TUI never imports this module; it uses ``workbench.machine.detect``).
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import torch

from workbench.errors import WorkbenchError
from workbench.machine.activity import OthersCpu
from workbench.machine.detect import Machine, cpu_has_native_bf16, detect, have_cxx, machine_identity
from workbench.machine.gpus import canonical_precision
from workbench.machine.peaks import peak_flops
from workbench.machine.rates import Calibration, known_rates, rate_key, remember, settle

# ----------------------------------------------------------------------------- calibration

_CALIBRATIONS: dict[tuple[str, str, int | None], Calibration] = {}


def time_matmul(device: str = "cpu", precision: str = "fp32", seconds: float = 0.3, warmup: int = 3) -> float:
    """Matmul FLOP/s on ``device`` at ``precision`` now: the best of short windows (at least one) over about
    ``seconds`` after ``warmup`` products. fp32 on CUDA means strict FP32; ask for "tf32" to allow TF32."""
    prec = canonical_precision(precision)
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
        for _ in range(warmup):  # kernel selection, thread pool start, clocks
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
    return best


# How long a calibration measures: the first on a machine (for a device, precision and thread count) finds its peak;
# later ones only raise the best kept (``settle``) and say how busy the CPU is as the run starts, which one window
# after one warm-up product does: on this 2-core machine 0.4 s at every trainer start on one thread became 0.11 s
# (0.7 CPU-seconds on two, 0.17) where a test suite starts 400 of them.
FIRST_SECONDS = 0.3


def calibrate(device: str = "cpu", precision: str = "fp32", seconds: float | None = None) -> Calibration:
    """The peak matmul rate for MFU and time estimates on ``device``: measured now (``time_matmul``; for
    ``seconds``, by default FIRST_SECONDS, or one window where a best rate is kept already), noting how busy
    other processes kept the CPU meanwhile, and settled against the best rate measured on this machine before
    (``workbench.machine.rates``), which it raises when it beats it. Once per process for a device, precision and
    CPU thread count."""
    prec = canonical_precision(precision)
    threads = torch.get_num_threads() if torch.device(device).type == "cpu" else None
    key = (device, prec, threads)
    if key in _CALIBRATIONS:
        return _CALIBRATIONS[key]
    machine, rkey = machine_identity(), rate_key(device, prec, threads)
    known = known_rates(machine).get(rkey)
    if seconds is None and known is not None:  # a peak is kept: one window after one warm-up product
        window, warmup = 0.0, 1
    else:
        window, warmup = FIRST_SECONDS if seconds is None else seconds, 3
    with OthersCpu() as load:
        measured = time_matmul(device, prec, window, warmup)
    # A GPU's rate is not the CPU's neighbours' to lower; the best-of cache still guards it against other jobs.
    cal, entry = settle(device, prec, threads, measured, load.share if threads else 0.0, known)
    remember(machine, rkey, entry)
    _CALIBRATIONS[key] = cal
    return cal


def measure_matmul_flops(device: str = "cpu", precision: str = "fp32", seconds: float | None = None) -> float:
    """The peak matmul FLOP/s on ``device`` at ``precision`` (``calibrate``): the honest peak that MFU on a CPU
    (or a GPU missing from the table) and `workbench estimate` use."""
    return calibrate(device, precision, seconds).flops


def calibration_here(device: str, precision: str) -> Calibration | None:
    """This process's calibration of ``device`` at ``precision`` with torch's current threads, if it made
    one (none where the peak came from the GPU table)."""
    threads = torch.get_num_threads() if torch.device(device).type == "cpu" else None
    return _CALIBRATIONS.get((device, canonical_precision(precision), threads))


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
    try:  # a private torch helper, imported where it is used so that a torch without it is only a fallback
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
