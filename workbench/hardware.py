"""What this machine has: CPU, RAM, NVIDIA GPUs (NVML), and what torch can do on it.

The TUI imports this module and must never import torch, so torch is only
imported inside functions, and only when asked (``detect(use_torch=True)``,
``measure_matmul_flops``). ``detect(use_torch=False)`` reads /proc, psutil and
NVML only and takes a few milliseconds, so the Hardware pane can refresh it live.

A machine without an NVIDIA GPU or without the NVML library is reported plainly
(``{"nvidia": [], "nvidia_note": "no NVIDIA GPU (NVML library not found)"}``),
never as a traceback.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import time
from typing import Any

GB = 1024 ** 3

# ----------------------------------------------------------------------------- peak FLOPs

# Dense (no 2:4 sparsity) peak TFLOP/s from NVIDIA's datasheets / whitepapers.
# bf16/fp16 are tensor-core rates with FP32 accumulate (what autocast uses):
# GeForce cards run that at half their FP16-accumulate rate, so e.g. the RTX
# 4090 is 165 here, not 330. "tf32" is the tensor-core rate for fp32 matmuls
# with TF32 allowed; "fp32" is plain FP32 (CUDA cores). None = not supported
# natively (bf16 before Ampere). RTX 50 figures are from the Blackwell
# whitepaper's FP32 rate x 2 (approximate). The first key that is a substring
# of the device name wins, so longer, more specific keys come first.
PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    "H100 SXM":      {"bf16": 989.0, "fp16": 989.0, "tf32": 494.7, "fp32": 66.9},
    "H100 NVL":      {"bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0},
    "H100 PCIe":     {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100":          {"bf16": 989.0, "fp16": 989.0, "tf32": 494.7, "fp32": 66.9},  # "NVIDIA H100 80GB HBM3" is the SXM part
    "H800":          {"bf16": 989.0, "fp16": 989.0, "tf32": 494.7, "fp32": 66.9},
    "H200":          {"bf16": 989.0, "fp16": 989.0, "tf32": 494.7, "fp32": 66.9},
    "GH200":         {"bf16": 989.0, "fp16": 989.0, "tf32": 494.7, "fp32": 66.9},
    "H20":           {"bf16": 148.0, "fp16": 148.0, "tf32": 74.0, "fp32": 44.0},
    "B200":          {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0},
    "B100":          {"bf16": 1750.0, "fp16": 1750.0, "tf32": 875.0, "fp32": 60.0},
    "A100":          {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "A800":          {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "A30":           {"bf16": 165.0, "fp16": 165.0, "tf32": 82.0, "fp32": 10.3},
    "A40":           {"bf16": 149.7, "fp16": 149.7, "tf32": 74.8, "fp32": 37.4},
    "A10G":          {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2},
    "A10":           {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "L40S":          {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6},
    "L40":           {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5},
    "L4":            {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "RTX 6000 Ada":  {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1},
    "RTX A6000":     {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
    "T4":            {"bf16": None, "fp16": 65.0, "tf32": None, "fp32": 8.1},
    "V100":          {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7},
    "RTX 5090":      {"bf16": 209.5, "fp16": 209.5, "tf32": 104.8, "fp32": 104.8},
    "RTX 5080":      {"bf16": 112.6, "fp16": 112.6, "tf32": 56.3, "fp32": 56.3},
    "RTX 5070 Ti":   {"bf16": 87.9, "fp16": 87.9, "tf32": 43.9, "fp32": 43.9},
    "RTX 5070":      {"bf16": 61.7, "fp16": 61.7, "tf32": 30.9, "fp32": 30.9},
    "RTX 5060 Ti":   {"bf16": 47.4, "fp16": 47.4, "tf32": 23.7, "fp32": 23.7},
    "RTX 5060":      {"bf16": 38.4, "fp16": 38.4, "tf32": 19.2, "fp32": 19.2},
    "RTX 4090":      {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "RTX 4080 SUPER": {"bf16": 104.4, "fp16": 104.4, "tf32": 52.2, "fp32": 52.2},
    "RTX 4080":      {"bf16": 97.5, "fp16": 97.5, "tf32": 48.7, "fp32": 48.7},
    "RTX 4070 Ti":   {"bf16": 80.2, "fp16": 80.2, "tf32": 40.1, "fp32": 40.1},
    "RTX 4070 SUPER": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.5, "fp32": 35.5},
    "RTX 4070":      {"bf16": 58.3, "fp16": 58.3, "tf32": 29.1, "fp32": 29.1},
    "RTX 4060 Ti":   {"bf16": 44.1, "fp16": 44.1, "tf32": 22.1, "fp32": 22.1},
    "RTX 4060":      {"bf16": 30.2, "fp16": 30.2, "tf32": 15.1, "fp32": 15.1},
    "RTX 3090 Ti":   {"bf16": 80.0, "fp16": 80.0, "tf32": 40.0, "fp32": 40.0},
    "RTX 3090":      {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
    "RTX 3080 Ti":   {"bf16": 68.2, "fp16": 68.2, "tf32": 34.1, "fp32": 34.1},
    "RTX 3080":      {"bf16": 59.5, "fp16": 59.5, "tf32": 29.8, "fp32": 29.8},
    "RTX 3070":      {"bf16": 40.6, "fp16": 40.6, "tf32": 20.3, "fp32": 20.3},
    "RTX 3060 Ti":   {"bf16": 32.4, "fp16": 32.4, "tf32": 16.2, "fp32": 16.2},
    "RTX 3060":      {"bf16": 25.6, "fp16": 25.6, "tf32": 12.7, "fp32": 12.7},
}

_PRECISION_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}


def peak_flops(gpu_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of the named GPU at ``precision`` (bf16, fp16, tf32, fp32), or None.

    Matched by case-insensitive substring of the device name (e.g. "NVIDIA
    GeForce RTX 4090"); None when the GPU is not in ``PEAK_TFLOPS`` or the
    precision is not native on it (then calibrate with ``measure_matmul_flops``).
    """
    prec = _PRECISION_ALIASES.get(precision.lower(), precision.lower())
    name = " ".join(gpu_name.upper().replace("-", " ").split())
    for key, row in PEAK_TFLOPS.items():
        if key.upper() in name:
            value = row.get(prec)
            return None if value is None else value * 1e12
    return None


# ----------------------------------------------------------------------------- calibration

_MATMUL_CACHE: dict[tuple[str, str], float] = {}


def measure_matmul_flops(device: str = "cpu", precision: str = "fp32", seconds: float = 0.3) -> float:
    """Measured matmul FLOP/s on ``device`` at ``precision``: an honest peak for MFU.

    Times square matmuls for about ``seconds`` after a warm-up. Results are
    cached per process (the CPU one is what `workbench estimate` and MFU on CPU
    use). fp32 on CUDA means strict FP32; ask for "tf32" to allow TF32.
    """
    prec = _PRECISION_ALIASES.get(precision.lower(), precision.lower())
    key = (device, prec)
    if key in _MATMUL_CACHE:
        return _MATMUL_CACHE[key]
    import torch

    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
             "fp16": torch.float16}.get(prec)
    if dtype is None:
        from workbench.errors import WorkbenchError
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
    return flops


def mfu_peak(device: str, precision: str, gpu_name: str | None = None) -> tuple[float, str]:
    """(peak FLOP/s, "table" | "measured") for MFU on ``device``: the table where it knows
    the GPU, otherwise a short matmul calibration (always on CPU and MPS)."""
    if device.startswith("cuda"):
        if gpu_name is None:
            import torch
            gpu_name = torch.cuda.get_device_name(torch.device(device))
        value = peak_flops(gpu_name, precision)
        if value:
            return value, "table"
    return measure_matmul_flops(device, precision), "measured"


# ----------------------------------------------------------------------------- detection

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        import subprocess
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                 text=True, timeout=2)
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


_CPU_FLAGS: set[str] | None = None


def _cpu_flags() -> set[str]:
    global _CPU_FLAGS
    if _CPU_FLAGS is None:
        flags: set[str] = set()
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith(("flags", "Features")):
                        flags = set(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
        _CPU_FLAGS = flags
    return _CPU_FLAGS


def cpu_has_native_bf16() -> bool | None:
    """True when the CPU has bf16 matmul instructions (AVX512-BF16, AMX, ARM BF16);
    None when it cannot tell (macOS: Apple M2 and newer have them)."""
    flags = _cpu_flags()
    if not flags:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def detect_cpu() -> dict[str, Any]:
    import psutil
    vm = psutil.virtual_memory()
    return {
        "model": _cpu_model(),
        "arch": platform.machine(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(logical=True),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_total": vm.total,
        "ram_available": vm.available,
        "native_bf16": cpu_has_native_bf16(),
    }


_NVML_MISSING: str | None = None  # the library does not appear mid-process: remember its absence


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def detect_nvidia() -> tuple[list[dict[str, Any]], str]:
    """(GPUs, note) from NVML. The note says plainly why the list is empty."""
    global _NVML_MISSING
    if _NVML_MISSING is not None:
        return [], _NVML_MISSING
    try:
        import pynvml
    except ImportError:
        _NVML_MISSING = "no NVIDIA GPU information (the nvidia-ml-py package is not installed)"
        return [], _NVML_MISSING
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        if isinstance(e, getattr(pynvml, "NVMLError_LibraryNotFound", ())):
            _NVML_MISSING = "no NVIDIA GPU (NVML library not found)"
            return [], _NVML_MISSING
        if isinstance(e, getattr(pynvml, "NVMLError_DriverNotLoaded", ())):
            return [], "no NVIDIA GPU (NVIDIA driver not loaded)"
        return [], f"no NVIDIA GPU information (NVML: {_s(e)})"
    gpus: list[dict[str, Any]] = []
    try:
        def opt(fn, *a):
            try:
                return fn(*a)
            except pynvml.NVMLError:
                return None

        driver = opt(pynvml.nvmlSystemGetDriverVersion)
        count = pynvml.nvmlDeviceGetCount()
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = opt(pynvml.nvmlDeviceGetMemoryInfo, h)
            cc = opt(pynvml.nvmlDeviceGetCudaComputeCapability, h)
            util = opt(pynvml.nvmlDeviceGetUtilizationRates, h)
            temp = opt(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
            power = opt(pynvml.nvmlDeviceGetPowerUsage, h)
            limit = opt(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
            name = _s(pynvml.nvmlDeviceGetName(h))
            gpus.append({
                "index": i,
                "name": name,
                "vram_total": int(mem.total) if mem else None,
                "vram_used": int(mem.used) if mem else None,
                "vram_free": int(mem.free) if mem else None,
                "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
                "driver": _s(driver) if driver is not None else None,
                "utilization_pct": int(util.gpu) if util else None,
                "memory_utilization_pct": int(util.memory) if util else None,
                "temperature_c": int(temp) if temp is not None else None,
                "power_w": round(power / 1000.0, 1) if power is not None else None,
                "power_limit_w": round(limit / 1000.0, 1) if limit is not None else None,
                "peak_bf16_tflops": (peak_flops(name, "bf16") or 0) / 1e12 or None,
            })
    except pynvml.NVMLError as e:
        return gpus, f"NVML error while reading GPUs: {_s(e)}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return gpus, (f"{len(gpus)} NVIDIA GPU(s)" if gpus else "no NVIDIA GPU (NVML found no devices)")


def detect_torch() -> dict[str, Any]:
    """What torch offers here: CUDA/MPS and the capability flags training cares about."""
    try:
        import torch
    except ImportError:
        return {"available": False, "note": "torch is not installed"}
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
    have_cxx = any(shutil.which(c) for c in ("c++", "g++", "clang++"))
    out["compile_cpu"] = have_cxx
    out["fused_adamw_cpu"] = "cpu" in fused_devices

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


def detect(use_torch: bool = True) -> dict[str, Any]:
    """Everything workbench knows about this machine, as a JSON-serialisable dict.

    ``use_torch=False`` skips importing torch (the TUI's live refresh).
    """
    gpus, note = detect_nvidia()
    info: dict[str, Any] = {
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "cpu": detect_cpu(),
        "nvidia": gpus,
        "nvidia_note": note,
    }
    if use_torch:
        info["torch"] = detect_torch()
    return info


def best_device(info: dict[str, Any]) -> str:
    """cuda > mps > cpu, from a ``detect()`` result (NVML GPUs count as cuda when torch was not asked)."""
    t = info.get("torch") or {}
    if t.get("cuda") or (not t and info.get("nvidia")):
        return "cuda"
    if t.get("mps"):
        return "mps"
    return "cpu"


def device_memory(info: dict[str, Any], device: str) -> tuple[int | None, str]:
    """(bytes usable for training on ``device``, what that number is)."""
    index = int(device.split(":")[1]) if device.startswith("cuda:") else 0
    device = device.split(":")[0]
    if device == "cuda":
        gpus = info.get("nvidia") or []
        if index < len(gpus) and gpus[index].get("vram_total"):
            g = gpus[index]
            return g["vram_free"] or g["vram_total"], f"{g['name']} free VRAM"
        for d in (info.get("torch") or {}).get("cuda_devices", []):
            if d["index"] == index:
                return d["memory"], f"{d['name']} total VRAM"
        return None, "no CUDA device"
    ram = info["cpu"]["ram_available"]
    if device == "mps":
        # Metal lets one process use about 2/3 of unified memory by default
        # (recommendedMaxWorkingSetSize); stay under that.
        total = info["cpu"]["ram_total"]
        return int(min(ram, total * 2 / 3)), "unified memory usable by MPS (~2/3 of RAM)"
    return ram, "available RAM"


# ----------------------------------------------------------------------------- recommendation

# Larger to smaller, per device class: the first that fits (by estimate) is recommended.
_LADDER = {
    "cuda": ["datacenter-80gb", "gpu-24gb", "gpu-8gb", "medium", "cpu-small"],
    "mps": ["apple-m4pro", "medium", "cpu-small"],
    "cpu": ["cpu-small"],
}


def _first_choice(device: str, mem: int | None) -> str:
    if device == "cpu":
        return "cpu-small"
    if device == "mps":
        return "apple-m4pro"
    gb = (mem or 0) / GB
    if gb >= 60:
        return "datacenter-80gb"
    if gb >= 20:
        return "gpu-24gb"
    if gb >= 7:
        return "gpu-8gb"
    return "medium"


def suggest_changes(preset, device: str, available: int) -> str:
    """What to change so ``preset`` fits ``available`` bytes on ``device``, by estimate:
    a smaller micro-batch with more accumulation, then activation checkpointing, bf16, a shorter sequence."""
    from workbench import estimate as est
    from workbench.commands.fit import plan_accumulation, search_batch
    seqs = preset.train.batch_size * preset.train.grad_accum
    limit = (1 - est.HEADROOM) * available

    def best_batch(**kw) -> int:
        return search_batch(lambda b: est.estimate_memory(preset, device=device, batch_size=b, **kw)["total"] <= limit,
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
    if device != "cpu" and est.resolve_precision(None, preset, device) == "fp32":
        return "hardware.precision = bf16 (halves activations)"
    return f"a shorter model.seq_len (now {preset.model.seq_len}) or a smaller model"


def recommend_preset(info: dict[str, Any] | None = None) -> tuple[str, str]:
    """(preset name, one-line reason) for this machine (or ``info`` from ``detect``).

    CPU -> cpu-small; MPS -> apple-m4pro; CUDA by VRAM (>= 60 GB datacenter-80gb,
    >= 20 gpu-24gb, >= 7 gpu-8gb, else medium), then checked with the memory
    estimate: if the first choice does not fit with headroom, the next smaller
    preset that does is recommended and the reason says what to change to run
    the first choice.
    """
    from workbench import estimate as est
    from workbench.config import PresetError, preset_paths, resolve_preset
    if info is None:
        info = detect(use_torch=False)
    device = best_device(info)
    mem, what = device_memory(info, device)
    first = _first_choice(device, mem)
    known = preset_paths()
    ladder = [n for n in _LADDER[device] if n in known]
    if first not in known or not mem:
        return first, f"{device} with {human(mem)} {what}" if mem else f"{device} detected"
    ladder = ladder[ladder.index(first):] if first in ladder else [first]
    first_note = ""
    for name in ladder:
        try:
            p = resolve_preset(name)
            m = est.estimate_memory(p, device=device)
        except PresetError:
            continue
        if est.fits(m, mem):
            why = (f"{device}: needs ~{human(m['total'])} (estimate) of {human(mem)} {what}")
            if name != first:
                why += f"; {first_note}"
            return name, why
        if name == first:
            first_note = (f"{first} needs ~{human(m['total'])} (estimate), more than {human(mem)} {what} "
                          f"allows with {est.HEADROOM:.0%} headroom; to run it: "
                          + suggest_changes(p, device, mem))
    return first, first_note or f"{device} with {human(mem)} {what}"


def human(n: int | None) -> str:
    from workbench.estimate import human_bytes
    return human_bytes(n)
