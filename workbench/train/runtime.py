"""The torch side of :class:`workbench.plan.settings.RunSettings`: devices, the AMP dtype, backend
flags, memory readings, out-of-memory errors. The settings decide; this module only applies."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import sys

import numpy as np
import psutil
import torch

from workbench.data.train_data import Batch
from workbench.plan.settings import RunSettings
from workbench.train.model import document_mask

# The one map from a precision name to the autocast dtype.
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def amp_dtype(settings: RunSettings) -> torch.dtype | None:
    return AMP_DTYPES.get(settings.autocast or "")


def autocast(settings: RunSettings) -> contextlib.AbstractContextManager:
    """The forward pass's autocast context (a no-op in fp32)."""
    dtype = amp_dtype(settings)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(settings.device_type, dtype=dtype)


def apply_backend_flags(settings: RunSettings) -> None:
    if settings.deterministic:
        # Before the first matmul creates cuBLAS's handle; warn_only: an op without a deterministic
        # kernel warns in train.log rather than failing the run.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        if settings.compile:
            # Inductor times candidate kernels (a reduction's block sizes) and keeps the fastest: two runs could
            # keep different ones, which sum in another order. On an H200 a compiled QK-norm run trained twice
            # agreed on 4 of 30 steps, eager on 30 of 30 (bench/cuda_determinism.py). Its deterministic mode
            # skips the timings that change numbers.
            import torch._inductor.config as inductor_config  # a compiled deterministic run alone needs it

            if hasattr(inductor_config, "deterministic"):
                inductor_config.deterministic = True
    if settings.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = settings.tf32
        torch.backends.cudnn.allow_tf32 = settings.tf32
        if (k := settings.attention_kernel) not in ("auto", "flex"):  # the one SDPA backend left on (math stays)
            torch.backends.cuda.enable_flash_sdp(k == "flash")
            torch.backends.cuda.enable_cudnn_sdp(k == "cudnn")
            torch.backends.cuda.enable_mem_efficient_sdp(k == "efficient")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def free_cached(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


def memory_mb(device: torch.device) -> tuple[float, dict[str, float]]:
    """(mem_mb, the device's detailed figures): mem_mb is the headline figure, peak allocated on
    CUDA, allocated on MPS, process RSS on CPU (whose peak RSS catches the activations' peak
    inside the step that RSS after it misses)."""
    rss = psutil.Process().memory_info().rss / 2**20
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        peak = torch.cuda.max_memory_allocated(device) / 2**20
        return peak, {"mem_allocated_mb": peak, "mem_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
                      "mem_device_used_mb": (total - free) / 2**20, "mem_rss_mb": rss}
    if device.type == "mps":
        alloc = torch.mps.current_allocated_memory() / 2**20
        return alloc, {"mem_allocated_mb": alloc, "mem_rss_mb": rss}
    return rss, {"mem_rss_mb": rss, "mem_peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's own peak RSS. On Linux from /proc (VmHWM): getrusage's ru_maxrss keeps the
    high-water mark of the process that launched it across fork and exec, so a trainer started from a
    large process (the TUI, a test session) would report that process's memory as its own."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024  # bytes on macOS, KiB elsewhere


OOM_MARKERS = ("CUDA out of memory", "MPS backend out of memory", "out of memory")


def batch_to_device(batch: Batch[np.ndarray], device: torch.device, flex: bool = False) -> Batch[torch.Tensor]:
    """A batch's arrays on ``device`` (pinned and copied asynchronously to a GPU). ``flex``
    (hardware.attention_kernel = flex): its segments become flex attention's BlockMask (model.document_mask),
    made here, outside compiled code."""
    def move(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)
    out = batch.map(move)
    if flex and out.segments is not None:
        out = dataclasses.replace(out, segments=document_mask(out.segments))
    return out


def compile_cache_counts() -> dict[str, int]:
    """How torch.compile's caches served this process so far: compiled graphs found in the inductor cache
    (``runs/<id>/cache/inductor``) against those compiled anew, and the same for AOTAutograd's cache. A
    resume that compiles warm has inductor hits and no misses; Dynamo still traces the model each start (and
    AOTAutograd at times, where its cache misses), which the inductor cache does not cover."""
    from torch._dynamo.utils import counters  # lazily: dynamo takes ~1 s to import; compiled runs only
    ind, aot = counters["inductor"], counters["aot_autograd"]
    return {"fxgraph_hits": int(ind["fxgraph_cache_hit"]), "fxgraph_misses": int(ind["fxgraph_cache_miss"]),
            "autograd_hits": int(aot["autograd_cache_hit"]), "autograd_misses": int(aot["autograd_cache_miss"])}


def is_oom(e: BaseException) -> bool:
    """CUDA ("CUDA out of memory", torch.OutOfMemoryError) and MPS ("MPS backend out of memory")."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    text = str(e).lower()
    return any(m.lower() in text for m in OOM_MARKERS)
