"""Dense peak FLOP/s of NVIDIA GPUs, for MFU and for time estimates. A table, no imports."""

from __future__ import annotations

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
    # "NVIDIA H100 80GB HBM3" is the SXM part
    "H100":          {"bf16": 989.0, "fp16": 989.0, "tf32": 494.7, "fp32": 66.9},
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

PRECISION_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}


def peak_flops(gpu_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of the named GPU at ``precision`` (bf16, fp16, tf32, fp32), or None.

    Matched by case-insensitive substring of the device name (e.g. "NVIDIA
    GeForce RTX 4090"); None when the GPU is not in ``PEAK_TFLOPS`` or the
    precision is not native on it (then calibrate with ``measure_matmul_flops``).
    """
    prec = PRECISION_ALIASES.get(precision.lower(), precision.lower())
    name = " ".join(gpu_name.upper().replace("-", " ").split())
    for key, row in PEAK_TFLOPS.items():
        if key.upper() in name:
            value = row.get(prec)
            return None if value is None else value * 1e12
    return None
