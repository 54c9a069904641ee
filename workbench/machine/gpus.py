"""The GPUs workbench knows: memory, dense peak FLOP/s, memory bandwidth and typical power, one row
per product (and per memory size where a product comes in several), each row with its source.

One table for every use: the peak FLOP/s behind MFU and time on this machine's GPU
(``workbench.machine.peaks`` matches the device name against ``match``), and ``workbench estimate
--gpu / --compare`` (a GPU one is about to buy or rent). No prices: they change by the week and by
provider, so the user gives them (``--usd-per-hour NAME=PRICE``, ``--prices FILE``).

Conventions
-----------
* TFLOPS are dense (no 2:4 sparsity). ``bf16`` / ``fp16`` are tensor-core rates with FP32
  accumulate, which is what autocast uses: GeForce cards run that at half their FP16-accumulate
  rate, so the RTX 4090 is 165 here, not 330. ``tf32`` is the tensor-core rate of fp32 matmuls with
  TF32 allowed; ``fp32`` is plain FP32 (CUDA cores). None: not native (bf16 and TF32 before Ampere).
* ``memory_gib``: what the device reports (nvidia-smi's total) where that is known to be less than
  the label (ECC on GDDR6 datacenter cards, HBM reserve), else the label's capacity (GDDR/HBM "GB"
  are GiB). Apple: the unified memory; MPS may use about 2/3 of it (``Machine.memory``).
* ``power_w``: the board power of the datasheet (TGP / TDP / max power); a training run near full
  load draws close to it. Apple: package power under a GPU load, a rough figure from reviews.
* Sources are the vendor's datasheets and architecture whitepapers, named per row; ``approx`` says
  which numbers are derived or third-party, and how.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from typing import Any

from workbench.errors import WorkbenchError

PRECISION_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}


def canonical_precision(precision: str) -> str:
    """``precision`` as the tables and the rate cache name it: bf16, fp16, tf32, fp32 (torch's names accepted)."""
    return PRECISION_ALIASES.get(precision.lower(), precision.lower())


@dataclass(frozen=True)
class GpuSpec:
    """One GPU (or Apple-silicon memory class) of the table."""
    name: str                     # shown and looked up: "RTX 4090 24GB", "H100 SXM 80GB", "Apple M4 Max 64GB"
    device: str                   # cuda | mps: what torch trains on
    memory_gib: float             # device memory (see the module docstring)
    bf16: float | None            # dense TFLOPS, tensor cores with FP32 accumulate (None: not native)
    fp16: float | None
    tf32: float | None
    fp32: float                   # plain FP32 TFLOPS
    bandwidth_gbs: float          # memory bandwidth, GB/s
    power_w: float                # typical board power while training, W
    source: str                   # where the numbers come from
    match: str = ""               # the words of a CUDA device name that identify it ("RTX 4090"); "": none
    compute_capability: tuple[int, int] | None = None
    aliases: tuple[str, ...] = ()
    compare: bool = False         # a row of `workbench estimate --compare` by default
    approx: str = ""              # which numbers are approximate, and why

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    def peak_flops(self, precision: str) -> float | None:
        """Dense peak FLOP/s at ``precision`` (bf16, fp16, tf32, fp32), None where not native."""
        prec = canonical_precision(precision)
        value = getattr(self, prec, None) if prec in ("bf16", "fp16", "tf32", "fp32") else None
        return None if value is None else value * 1e12

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- sources

H100_DS = "NVIDIA H100 Tensor Core GPU datasheet"
H200_DS = "NVIDIA H200 Tensor Core GPU datasheet"
A100_DS = "NVIDIA A100 Tensor Core GPU datasheet"
AMPERE_WP = "NVIDIA Ampere GA102 GPU architecture whitepaper (GeForce RTX 30 appendix) + GeForce product pages"
ADA_WP = "NVIDIA Ada GPU architecture whitepaper (GeForce RTX 40 appendix) + GeForce product pages"
BLACKWELL_WP = "NVIDIA RTX Blackwell GPU architecture whitepaper + GeForce RTX 50 product pages"
# GeForce tensor rates with FP32 accumulate are twice the FP32 shader rate on Ampere, Ada and
# Blackwell (the whitepapers' tables for the cards they list); cards not in a whitepaper's table
# take that rule from their FP32 rate.
DERIVED_TENSOR = "tensor rates = 2 x the FP32 shader rate (the rule of the whitepaper's other GeForce cards)"
ECC = "memory: nvidia-smi's total with ECC on (~23,030 MiB of the 24 GB label), as seen on cloud instances"
APPLE_TFLOPS = ("FP32 = GPU cores x 128 ALUs x 2 x GPU clock; Apple publishes no TFLOPS for M3/M4, the clock is "
                "third-party (hmc-tech.com GPU database), so +-15 %")
APPLE_POWER = "power: package power under a GPU load, a rough figure from reviews (powermetrics), not Apple's"
APPLE_HALF = "bf16/fp16 = the FP32 rate (Apple GPUs have no faster half-precision matmul path)"


def _nv(name: str, match: str, memory_gib: float, bf16: float | None, tf32: float | None, fp32: float,
        bandwidth_gbs: float, power_w: float, cc: tuple[int, int], source: str, *, fp16: float | None = None,
        aliases: tuple[str, ...] = (), compare: bool = False, approx: str = "") -> GpuSpec:
    return GpuSpec(name=name, device="cuda", memory_gib=memory_gib, bf16=bf16,
                   fp16=fp16 if fp16 is not None else bf16, tf32=tf32, fp32=fp32, bandwidth_gbs=bandwidth_gbs,
                   power_w=power_w, source=source, match=match, compute_capability=cc, aliases=aliases,
                   compare=compare, approx=approx)


def _apple(chip: str, gpu_cores: int, fp32: float, bandwidth_gbs: float, power_w: float, memories: tuple[int, ...],
           source: str, *, compare: tuple[int, ...] = (), approx: str = "") -> list[GpuSpec]:
    """One entry per unified-memory size of an Apple chip (the GPU is the same in each)."""
    notes = "; ".join(x for x in (approx, APPLE_HALF, APPLE_POWER) if x)
    return [GpuSpec(name=f"Apple {chip} {gb}GB", device="mps", memory_gib=float(gb), bf16=fp32, fp16=fp32,
                    tf32=None, fp32=fp32, bandwidth_gbs=bandwidth_gbs, power_w=power_w,
                    source=f"{source} ({gpu_cores}-core GPU)", aliases=(f"{chip} {gb}GB",),
                    compare=gb in compare, approx=notes)
            for gb in memories]


# ----------------------------------------------------------------------------- the table

# Order: datacenter, workstation, GeForce (newest first), Apple; `--compare` keeps this order when
# it cannot sort (rows without a time or a price).
#
#   name                       match           mem GiB  bf16   tf32   fp32   GB/s  W    cc
GPUS: tuple[GpuSpec, ...] = (
    # Hopper / Blackwell. "NVIDIA H100 80GB HBM3" (no form factor in the name) is the SXM part.
    # memory: nvidia-smi reports 81,559 MiB for the 80 GB parts, 143,771 MiB for the H200.
    _nv("H100 SXM 80GB", "H100", 79.6, 989.0, 494.7, 66.9, 3350, 700, (9, 0), f"{H100_DS} (SXM5 column)",
        aliases=("H100", "H100 80GB", "H100 SXM"), compare=True),
    _nv("H100 PCIe 80GB", "H100 PCIe", 79.6, 756.0, 378.0, 51.2, 2000, 350, (9, 0), f"{H100_DS} (PCIe column)"),
    _nv("H100 NVL 94GB", "H100 NVL", 93.6, 835.0, 417.5, 60.0, 3900, 400, (9, 0), f"{H100_DS} (NVL column)",
        approx="memory: 94 GB label less the HBM reserve, by analogy with the 80 GB part"),
    _nv("H200 141GB", "H200", 140.4, 989.0, 494.7, 66.9, 4800, 700, (9, 0), f"{H200_DS} (SXM column)",
        aliases=("H200",), compare=True),
    _nv("GH200 96GB", "GH200", 96.0, 989.0, 494.7, 66.9, 4000, 1000, (9, 0),
        "NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3 version)",
        approx="power: the superchip module (Grace CPU included), configurable 450-1000 W"),
    _nv("H800 80GB", "H800", 79.6, 989.0, 494.7, 66.9, 3350, 700, (9, 0), f"{H100_DS} (the H800 is its export "
        "variant: same compute and memory, reduced NVLink)", approx="all: taken as the H100 SXM's"),
    _nv("H20 96GB", "H20", 96.0, 148.0, 74.0, 44.0, 4000, 400, (9, 0), "press reports of NVIDIA's H20 specifications",
        approx="all: no public NVIDIA datasheet"),
    _nv("B200 180GB", "B200", 180.0, 2250.0, 1100.0, 80.0, 8000, 1000, (10, 0),
        "NVIDIA HGX B200 datasheet (8-GPU figures / 8)", approx="all: per-GPU share of the 8-GPU board's figures"),
    _nv("B100 192GB", "B100", 192.0, 1750.0, 875.0, 60.0, 8000, 700, (10, 0), "NVIDIA Blackwell launch figures "
        "(GTC 2024)", approx="all: announced figures, before a datasheet"),
    # Ampere datacenter. A100: SXM4 figures (the PCIe 80 GB has 1,935 GB/s and 300 W).
    _nv("A100 40GB", "A100", 40.0, 312.0, 156.0, 19.5, 1555, 400, (8, 0), f"{A100_DS} (SXM4 40GB column)",
        aliases=("A100 40",), compare=True),
    _nv("A100 80GB", "A100", 80.0, 312.0, 156.0, 19.5, 2039, 400, (8, 0), f"{A100_DS} (SXM4 80GB column)",
        aliases=("A100 80",), compare=True),
    _nv("A800 80GB", "A800", 80.0, 312.0, 156.0, 19.5, 2039, 400, (8, 0), f"{A100_DS} (the A800 is its export "
        "variant: same compute and memory, reduced NVLink)", approx="all: taken as the A100 80GB's"),
    _nv("A30 24GB", "A30", 24.0, 165.0, 82.0, 10.3, 933, 165, (8, 0), "NVIDIA A30 Tensor Core GPU datasheet"),
    _nv("A40 48GB", "A40", 48.0, 149.7, 74.8, 37.4, 696, 300, (8, 6), "NVIDIA A40 datasheet"),
    _nv("A10 24GB", "A10", 22.5, 125.0, 62.5, 31.2, 600, 150, (8, 6), "NVIDIA A10 Tensor Core GPU datasheet",
        approx=ECC),
    _nv("A10G 24GB", "A10G", 22.5, 70.0, 35.0, 31.2, 600, 300, (8, 6),
        "AWS EC2 G5 instance documentation (an AWS-only variant of the A10; no NVIDIA datasheet)",
        compare=True, approx=f"tensor rates: third-party (Baseten's A10 vs A10G comparison); power: nvidia-smi's "
                            f"limit on g5 instances; {ECC}"),
    # Ada datacenter and workstation
    _nv("L40S 48GB", "L40S", 48.0, 362.1, 183.0, 91.6, 864, 350, (8, 9), "NVIDIA L40S datasheet", compare=True),
    _nv("L40 48GB", "L40", 48.0, 181.0, 90.5, 90.5, 864, 300, (8, 9), "NVIDIA L40 datasheet"),
    _nv("L4 24GB", "L4", 22.5, 121.0, 60.0, 30.3, 300, 72, (8, 9), "NVIDIA L4 Tensor Core GPU datasheet",
        compare=True, approx=ECC),
    _nv("RTX 6000 Ada 48GB", "RTX 6000 Ada", 48.0, 364.2, 182.1, 91.1, 960, 300, (8, 9),
        "NVIDIA RTX 6000 Ada Generation datasheet"),
    _nv("RTX A6000 48GB", "RTX A6000", 48.0, 154.8, 77.4, 38.7, 768, 300, (8, 6), "NVIDIA RTX A6000 datasheet"),
    # Turing / Volta: no bf16, no TF32 (autocast picks fp16 with a GradScaler)
    _nv("T4 16GB", "T4", 15.0, None, None, 8.1, 320, 70, (7, 5), "NVIDIA T4 Tensor Core GPU datasheet", fp16=65.0,
        compare=True, approx="memory: nvidia-smi's 15,360 MiB"),
    _nv("V100 16GB", "V100", 16.0, None, None, 15.7, 900, 300, (7, 0), "NVIDIA V100 Tensor Core GPU datasheet "
        "(SXM2; a 32 GB version exists)", fp16=125.0),
    # GeForce RTX 50 (Blackwell)
    _nv("RTX 5090 32GB", "RTX 5090", 32.0, 209.5, 104.8, 104.8, 1792, 575, (12, 0), BLACKWELL_WP, compare=True,
        approx=DERIVED_TENSOR),
    _nv("RTX 5080 16GB", "RTX 5080", 16.0, 112.6, 56.3, 56.3, 960, 360, (12, 0), BLACKWELL_WP, approx=DERIVED_TENSOR),
    _nv("RTX 5070 Ti 16GB", "RTX 5070 Ti", 16.0, 87.9, 43.9, 43.9, 896, 300, (12, 0), BLACKWELL_WP,
        approx=DERIVED_TENSOR),
    _nv("RTX 5070 12GB", "RTX 5070", 12.0, 61.7, 30.9, 30.9, 672, 250, (12, 0), BLACKWELL_WP, approx=DERIVED_TENSOR),
    _nv("RTX 5060 Ti 16GB", "RTX 5060 Ti", 16.0, 47.4, 23.7, 23.7, 448, 180, (12, 0), BLACKWELL_WP,
        approx=DERIVED_TENSOR),
    _nv("RTX 5060 Ti 8GB", "RTX 5060 Ti", 8.0, 47.4, 23.7, 23.7, 448, 180, (12, 0), BLACKWELL_WP,
        approx=DERIVED_TENSOR),
    # 3,840 CUDA cores x 2 x 2.497 GHz boost = 19.2 TFLOPS FP32 (NVIDIA's "19 shader TFLOPS"), 145 W
    _nv("RTX 5060 8GB", "RTX 5060", 8.0, 38.4, 19.2, 19.2, 448, 145, (12, 0), BLACKWELL_WP, compare=True,
        approx=DERIVED_TENSOR),
    # GeForce RTX 40 (Ada)
    _nv("RTX 4090 24GB", "RTX 4090", 24.0, 165.2, 82.6, 82.6, 1008, 450, (8, 9), ADA_WP, compare=True),
    _nv("RTX 4080 SUPER 16GB", "RTX 4080 SUPER", 16.0, 104.4, 52.2, 52.2, 736, 320, (8, 9), ADA_WP,
        approx=DERIVED_TENSOR),
    _nv("RTX 4080 16GB", "RTX 4080", 16.0, 97.5, 48.7, 48.7, 716.8, 320, (8, 9), ADA_WP),
    # The 16 GB "4070 Ti" is the SUPER (8,448 cores x 2 x 2.61 GHz = 44.1 TFLOPS); the plain 4070 Ti has 12 GB.
    _nv("RTX 4070 Ti SUPER 16GB", "RTX 4070 Ti SUPER", 16.0, 88.2, 44.1, 44.1, 672, 285, (8, 9), ADA_WP,
        aliases=("4070 Ti 16GB", "RTX 4070 Ti 16GB"), compare=True, approx=DERIVED_TENSOR),
    _nv("RTX 4070 Ti 12GB", "RTX 4070 Ti", 12.0, 80.2, 40.1, 40.1, 504, 285, (8, 9), ADA_WP),
    _nv("RTX 4070 SUPER 12GB", "RTX 4070 SUPER", 12.0, 71.0, 35.5, 35.5, 504, 220, (8, 9), ADA_WP,
        approx=DERIVED_TENSOR),
    _nv("RTX 4070 12GB", "RTX 4070", 12.0, 58.3, 29.1, 29.1, 504, 200, (8, 9), ADA_WP),
    _nv("RTX 4060 Ti 16GB", "RTX 4060 Ti", 16.0, 44.1, 22.1, 22.1, 288, 165, (8, 9), ADA_WP),
    _nv("RTX 4060 Ti 8GB", "RTX 4060 Ti", 8.0, 44.1, 22.1, 22.1, 288, 160, (8, 9), ADA_WP),
    _nv("RTX 4060 8GB", "RTX 4060", 8.0, 30.2, 15.1, 15.1, 272, 115, (8, 9), ADA_WP, compare=True),
    # GeForce RTX 30 (Ampere)
    _nv("RTX 3090 Ti 24GB", "RTX 3090 Ti", 24.0, 80.0, 40.0, 40.0, 1008, 450, (8, 6), AMPERE_WP,
        approx=DERIVED_TENSOR),
    _nv("RTX 3090 24GB", "RTX 3090", 24.0, 71.0, 35.6, 35.6, 936, 350, (8, 6), AMPERE_WP, compare=True),
    _nv("RTX 3080 Ti 12GB", "RTX 3080 Ti", 12.0, 68.2, 34.1, 34.1, 912, 350, (8, 6), AMPERE_WP,
        approx=DERIVED_TENSOR),
    _nv("RTX 3080 10GB", "RTX 3080", 10.0, 59.5, 29.8, 29.8, 760, 320, (8, 6), AMPERE_WP),
    _nv("RTX 3070 8GB", "RTX 3070", 8.0, 40.6, 20.3, 20.3, 448, 220, (8, 6), AMPERE_WP),
    _nv("RTX 3060 Ti 8GB", "RTX 3060 Ti", 8.0, 32.4, 16.2, 16.2, 448, 200, (8, 6), AMPERE_WP, approx=DERIVED_TENSOR),
    _nv("RTX 3060 12GB", "RTX 3060", 12.0, 25.6, 12.7, 12.7, 360, 170, (8, 6), AMPERE_WP, compare=True,
        approx=DERIVED_TENSOR),
    # Apple silicon (MPS). M1/M2 TFLOPS are Apple's own figures; M3/M4 are derived (APPLE_TFLOPS).
    #       chip                 cores  FP32  GB/s   W   unified memory sizes
    *_apple("M1", 8, 2.6, 68.25, 20, (8, 16), "Apple M1 press release"),
    *_apple("M1 Pro", 16, 5.2, 200, 30, (16, 32), "Apple M1 Pro and M1 Max press release"),
    *_apple("M1 Max", 32, 10.4, 400, 60, (32, 64), "Apple M1 Pro and M1 Max press release"),
    *_apple("M1 Ultra", 64, 21.0, 800, 120, (64, 128), "Apple M1 Ultra press release"),
    *_apple("M2", 10, 3.6, 100, 20, (8, 16, 24), "Apple M2 press release"),
    *_apple("M2 Pro", 19, 6.8, 200, 35, (16, 32), "Apple M2 Pro and M2 Max press release"),
    *_apple("M2 Max", 38, 13.6, 400, 60, (32, 64, 96), "Apple M2 Pro and M2 Max press release"),
    *_apple("M2 Ultra", 76, 27.2, 800, 120, (64, 128, 192), "Apple M2 Ultra press release"),
    *_apple("M3", 10, 3.6, 100, 20, (8, 16, 24), "Apple M3 family press release", approx=APPLE_TFLOPS),
    *_apple("M3 Pro", 18, 6.4, 150, 35, (18, 36), "Apple M3 family press release", approx=APPLE_TFLOPS),
    *_apple("M3 Max", 30, 10.7, 300, 60, (36, 96), "Apple M3 family press release", approx=APPLE_TFLOPS),
    *_apple("M3 Max", 40, 14.3, 400, 70, (48, 64, 128), "Apple M3 family press release", approx=APPLE_TFLOPS),
    *_apple("M3 Ultra", 80, 28.6, 819, 140, (96, 256, 512), "Apple Mac Studio (2025) press release",
            approx=APPLE_TFLOPS),
    *_apple("M4", 10, 3.8, 120, 22, (16, 24, 32), "Apple M4 press release", compare=(16,), approx=APPLE_TFLOPS),
    *_apple("M4 Pro", 20, 7.5, 273, 45, (24, 48, 64), "Apple M4 Pro and M4 Max press release", compare=(24, 48),
            approx=APPLE_TFLOPS),
    *_apple("M4 Max", 32, 13.7, 410, 65, (36,), "Apple M4 Pro and M4 Max press release", compare=(36,),
            approx=APPLE_TFLOPS),
    *_apple("M4 Max", 40, 17.2, 546, 80, (48, 64, 128), "Apple M4 Pro and M4 Max press release", compare=(64, 128),
            approx=APPLE_TFLOPS),
)


# ----------------------------------------------------------------------------- lookups

def compare_set() -> list[GpuSpec]:
    """The rows of ``workbench estimate --compare`` when no GPUs are named."""
    return [g for g in GPUS if g.compare]


def _device_words(name: str) -> str:
    return " " + " ".join(name.upper().replace("-", " ").replace("_", " ").split()) + " "


def spec_for_device(device_name: str) -> GpuSpec | None:
    """The table's entry for a CUDA device name as NVML or torch give it ("NVIDIA GeForce RTX 4090",
    "NVIDIA A100-SXM4-80GB"), or None. The longest ``match`` found as whole words wins ("RTX 4070 Ti
    SUPER" over "RTX 4070 Ti", "A10G" over "A10"); of the sizes of one product, the one whose memory
    the name states ("80GB"), else the first."""
    words = _device_words(device_name)
    hits = [g for g in GPUS if g.match and f" {g.match.upper()} " in words]
    if not hits:
        return None
    longest = max(len(g.match) for g in hits)
    hits = [g for g in hits if len(g.match) == longest]
    sized = [g for g in hits if f"{g.memory_gib:.0f}GB" in words.replace(" ", "")]
    return (sized or hits)[0]


def _norm(text: str) -> str:
    s = text.lower()
    for word in ("nvidia", "geforce", "apple", "tesla"):
        s = s.replace(word, " ")
    return re.sub(r"[^a-z0-9]", "", s)


def _keys(g: GpuSpec) -> set[str]:
    """What a user may type for ``g``: its name or an alias, with or without the memory size and
    the "RTX" (normalised: lower case, letters and digits only)."""
    texts = (g.name, re.sub(r"\s*\d+\s*GB$", "", g.name, flags=re.I), *g.aliases)
    return {k for t in texts for k in (_norm(t), _norm(t).removeprefix("rtx"))} - {""}


def find_gpu(name: str) -> GpuSpec:
    """The table's entry for a name a user typed ("4090", "H100", "a100-80gb", "M4 Max 64GB").

    An exact name (or alias, or name without its memory size) wins; else a unique entry whose name
    contains what was typed. Unknown or ambiguous names raise a WorkbenchError of one line that
    says what was meant or could have been."""
    q = _norm(name)
    if not q:
        raise WorkbenchError(f"GPU name {name!r} is empty; `workbench hw --gpus` lists the names")
    exact = [g for g in GPUS if q in _keys(g)]
    if len(exact) == 1:
        return exact[0]
    found = exact or [g for g in GPUS if any(q in k for k in _keys(g))]
    if len(found) == 1:
        return found[0]
    if found:
        shown = ", ".join(g.name for g in found[:8]) + (", …" if len(found) > 8 else "")
        raise WorkbenchError(f"GPU name {name!r} is ambiguous: {shown}; give one of them")
    by_key = {k: g.name for g in GPUS for k in _keys(g)}
    close = difflib.get_close_matches(q, list(by_key), n=6, cutoff=0.6)
    names = list(dict.fromkeys(by_key[k] for k in close))[:3]
    hint = f"did you mean {' or '.join(repr(n) for n in names)}? " if names else ""
    raise WorkbenchError(f"unknown GPU {name!r}; {hint}`workbench hw --gpus` lists the GPUs workbench knows")
