"""Dense peak FLOP/s of a CUDA device by its name, for MFU and for time estimates.

The numbers live in the one GPU table, :mod:`workbench.machine.gpus` (with their sources and the
conventions: dense, tensor cores with FP32 accumulate, "tf32" for fp32 matmuls with TF32 allowed);
this module only finds a device's row by its name. No imports beyond that table.
"""

from __future__ import annotations

from workbench.machine.gpus import PRECISION_ALIASES, spec_for_device

__all__ = ["PRECISION_ALIASES", "peak_flops"]


def peak_flops(gpu_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of the named GPU at ``precision`` (bf16, fp16, tf32, fp32), or None.

    Matched by the device name's words (e.g. "NVIDIA GeForce RTX 4090", see
    ``gpus.spec_for_device``); None when the GPU is not in the table or the precision is not
    native on it (then calibrate with ``measure_matmul_flops``)."""
    spec = spec_for_device(gpu_name)
    return spec.peak_flops(precision) if spec else None
