"""What this machine has: CPU, RAM, NVIDIA GPUs (NVML), Apple MPS, without importing torch.

``detect()`` reads /proc, psutil and NVML and takes a few milliseconds, so the Hardware pane
can refresh it live; ``workbench.machine.probe.detect_with_torch`` adds what torch can use.
Both return a JSON-serialisable dict (``workbench hw --json``); :class:`Machine` is the typed
description that the planning layer resolves presets against, built from such a dict or,
in tests, written by hand for a machine that is not this one.

A machine without an NVIDIA GPU or without the NVML library is reported plainly
(``{"nvidia": [], "nvidia_note": "no NVIDIA GPU (NVML library not found)"}``), never as a
traceback.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Callable

import psutil

from workbench.machine.peaks import peak_flops
from workbench.machine.rates import best_rates


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
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
    try:  # lazily: NVML is for NVIDIA machines only, and may be missing
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
        def opt(fn: Callable[..., Any], *a: Any) -> Any:
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

def mps_likely() -> bool:
    """Apple silicon running macOS: MPS is there unless torch says otherwise (asked without torch)."""
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def have_cxx() -> bool:
    """A C++ compiler, which torch.compile needs on the CPU."""
    return any(shutil.which(c) for c in ("c++", "g++", "clang++"))


@functools.lru_cache(maxsize=1)
def torch_version() -> str | None:
    """The installed torch's version, read from its package metadata (torch is not imported)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_identity() -> str:
    """What a measured matmul rate belongs to: the CPU model, its logical cores and the torch version
    (its kernels). A cache shared by machines (a home on NFS) keeps each one's rates apart."""
    return f"{_cpu_model()}; {psutil.cpu_count(logical=True)} logical cores; torch {torch_version() or 'absent'}"


def calibration() -> dict[str, float]:
    """This machine's best measured matmul rates, by "device:precision" (``workbench.machine.rates``)."""
    return best_rates(machine_identity())


def gpu_free_mib() -> float | None:
    """MiB free on the GPU a trainer started now trains on (the first of ``CUDA_VISIBLE_DEVICES`` when it
    names an index, else GPU 0), as NVML reports it; None without an NVIDIA GPU."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    index = int(first) if first.isdigit() else 0
    gpus, _ = detect_nvidia()
    free = next((g["vram_free"] for g in gpus if g["index"] == index), None)
    return None if free is None else free / 2**20


def detect() -> dict[str, Any]:
    """Everything workbench knows about this machine without torch, as a JSON-serialisable dict."""
    gpus, note = detect_nvidia()
    return {
        "calibration": calibration(),
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "cpu": detect_cpu(),
        "nvidia": gpus,
        "nvidia_note": note,
        "mps": mps_likely(),
        "cxx": have_cxx(),
    }


# ----------------------------------------------------------------------------- the typed description

def _cc(text: Any) -> tuple[int, int] | None:
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except ValueError:
        return None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    total_memory: int | None = None
    free_memory: int | None = None
    compute_capability: tuple[int, int] | None = None

    @property
    def ampere_or_newer(self) -> bool:
        """bf16 and TF32 tensor cores (sm80+); a GPU of unknown capability is taken as modern."""
        return self.compute_capability is None or self.compute_capability >= (8, 0)


@dataclass(frozen=True)
class Machine:
    """A machine as the planning layer sees it: its devices, memory and what torch offers there.

    Built from ``detect()`` (torch not asked: NVML's GPUs count as CUDA devices and MPS is
    guessed from the platform) or from ``probe.detect_with_torch()`` (torch's own view), or
    written by hand for an estimate on a machine that is not this one."""
    gpus: tuple[Gpu, ...] = ()
    mps: bool = False
    physical_cores: int = 1
    ram_total: int | None = None
    ram_available: int | None = None
    cpu_native_bf16: bool | None = None
    # Device types that have a fused AdamW kernel in this torch (2.4+: CUDA and CPU; asked of torch when loaded).
    fused_optimizer_devices: frozenset[str] = frozenset({"cuda", "cpu"})
    can_compile_cpu: bool = True      # a C++ compiler for inductor's CPU code
    torch_asked: bool = False
    measured_flops: tuple[tuple[str, float], ...] = ()   # ("cpu:fp32", FLOP/s) measured here earlier

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> "Machine":
        cpu = info.get("cpu") or {}
        t = info.get("torch") or {}
        nv = {g.get("index", i): g for i, g in enumerate(info.get("nvidia") or [])}
        if t:  # torch's view decides what training can use (a CPU-only torch on a GPU box has no CUDA)
            gpus = tuple(Gpu(index=d["index"], name=d["name"], total_memory=d.get("memory"),
                             free_memory=(nv.get(d["index"]) or {}).get("vram_free"),
                             compute_capability=_cc(d.get("compute_capability")))
                         for d in t.get("cuda_devices", []) if t.get("cuda"))
            mps = bool(t.get("mps"))
            fused = frozenset(t.get("fused_devices") or ("cuda", "cpu"))
        else:
            gpus = tuple(Gpu(index=g.get("index", i), name=str(g.get("name") or "NVIDIA GPU"),
                             total_memory=g.get("vram_total"), free_memory=g.get("vram_free"),
                             compute_capability=_cc(g.get("compute_capability")))
                         for i, g in enumerate(info.get("nvidia") or []))
            mps = bool(info.get("mps"))
            fused = frozenset({"cuda", "cpu"})
        return cls(gpus=gpus, mps=mps, physical_cores=int(cpu.get("physical_cores") or 1),
                   measured_flops=tuple(sorted((info.get("calibration") or {}).items())),
                   ram_total=cpu.get("ram_total"), ram_available=cpu.get("ram_available"),
                   cpu_native_bf16=cpu.get("native_bf16"), fused_optimizer_devices=fused,
                   can_compile_cpu=bool(info.get("cxx", t.get("compile_cpu", True))), torch_asked=bool(t))

    @classmethod
    def assumed(cls, device: str) -> "Machine":
        """A machine that has ``device`` (cpu, cuda, mps), for estimates made elsewhere: a modern
        GPU of unknown size, an Apple-silicon Mac, a CPU; memory unknown."""
        kind = device.split(":")[0]
        if kind == "cuda":
            return cls(gpus=(Gpu(index=0, name="CUDA GPU"),))
        return cls(mps=kind == "mps")

    def best_device(self) -> str:
        """cuda > mps > cpu."""
        if self.gpus:
            return "cuda"
        return "mps" if self.mps else "cpu"

    def has(self, device: str) -> bool:
        kind, _, index = device.partition(":")
        if kind == "cuda":
            return any(g.index == int(index or 0) for g in self.gpus)
        return kind == "cpu" or (kind == "mps" and self.mps)

    def gpu(self, device: str) -> Gpu | None:
        if not device.startswith("cuda"):
            return None
        index = int(device.partition(":")[2] or 0)
        return next((g for g in self.gpus if g.index == index), None)

    def peak_flops(self, device: str, precision: str) -> float | None:
        """The datasheet peak of a known GPU, else the matmul rate measured here earlier (CPU, MPS), else None."""
        g = self.gpu(device)
        if g and (table := peak_flops(g.name, precision)):
            return table
        return dict(self.measured_flops).get(f"{device.split(':')[0]}:{precision}")

    def memory(self, device: str) -> tuple[int | None, str]:
        """(bytes usable for training on ``device``, what that number is)."""
        kind = device.split(":")[0]
        if kind == "cuda":
            g = self.gpu(device)
            if g is None:
                return None, "no CUDA device"
            if g.free_memory:
                return g.free_memory, f"{g.name} free VRAM"
            return g.total_memory, f"{g.name} total VRAM"
        if kind == "mps":
            # Metal lets one process use about 2/3 of unified memory by default
            # (recommendedMaxWorkingSetSize); stay under that.
            if not (self.ram_available and self.ram_total):
                return None, "unified memory (unknown)"
            return int(min(self.ram_available, self.ram_total * 2 / 3)), "unified memory usable by MPS (~2/3 of RAM)"
        return self.ram_available, "available RAM"
