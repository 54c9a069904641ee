"""`workbench hw [--json]`: what this machine has, and the preset that suits it."""

from __future__ import annotations

import argparse
import json

from workbench.commands.common import add_json_option
from workbench.fmt import human_bytes
from workbench.machine.detect import detect
from workbench.machine.gpus import GPUS
from workbench.plan.fit.recommend import recommend_preset


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("hw", help="show this machine's CPU, RAM, GPUs and what torch can use",
                       description="Show this machine's CPU, RAM, NVIDIA GPUs (NVML), CUDA/MPS availability, "
                                   "capability flags, and the recommended preset.")
    add_json_option(p, "print the detection as JSON")
    p.add_argument("--no-torch", action="store_true", help="skip importing torch (fast; no CUDA/MPS flags)")
    p.add_argument("--gpus", action="store_true",
                   help="list the GPU table instead (memory, dense TFLOPS, bandwidth, power, sources) that "
                        "`estimate --gpu/--compare` and MFU use")
    p.set_defaults(func=run)


def _tf(v: float | None) -> str:
    return "—" if v is None else f"{v:g}"


def print_gpu_table() -> None:
    """The GPU table (workbench.machine.gpus), one line per entry, then its sources."""
    rows = [("GPU", "device", "memory", "bf16", "fp16", "tf32", "fp32", "GB/s", "W", "compare")]
    for g in GPUS:
        rows.append((g.name, g.device, f"{g.memory_gib:g} GiB", _tf(g.bf16), _tf(g.fp16), _tf(g.tf32), _tf(g.fp32),
                     f"{g.bandwidth_gbs:g}", f"{g.power_w:g}", "yes" if g.compare else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    print("\nTFLOPS dense (no sparsity); bf16/fp16 on tensor cores with FP32 accumulate; tf32: fp32 matmuls with "
          "TF32; memory as the device reports it; W: typical board power. compare: a default row of "
          "`workbench estimate PRESET --compare`.\n")
    sources: dict[tuple[str, str], list[str]] = {}
    for g in GPUS:
        sources.setdefault((g.source, g.approx), []).append(g.name)
    for (source, approx), names in sources.items():
        print(f"{', '.join(names)}: {source}" + (f"; approximate: {approx}" if approx else ""))


def _yn(v: object) -> str:
    return "yes" if v else ("no" if v is not None else "?")


def run(args: argparse.Namespace) -> int:
    if args.gpus:
        if args.json:
            print(json.dumps([g.to_dict() for g in GPUS], indent=2))
        else:
            print_gpu_table()
        return 0
    if args.no_torch:
        info = detect()
    else:
        from workbench.machine.probe import detect_with_torch  # imports torch
        info = detect_with_torch()
    name, reason = recommend_preset(info)
    info["recommendation"] = {"preset": name, "reason": reason}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    c = info["cpu"]
    print(f"host      {info['host']} ({info['os']}, Python {info['python']})")
    print(f"cpu       {c['model']}, {c['physical_cores']} physical / {c['logical_cores']} logical cores"
          + (f" ({c['usable_cores']} usable)" if c.get("usable_cores") not in (None, c["logical_cores"]) else "")
          + f", native bf16: {_yn(c['native_bf16'])}")
    print(f"ram       {human_bytes(c['ram_total'])} total, {human_bytes(c['ram_available'])} available")
    if info["nvidia"]:
        for g in info["nvidia"]:
            peak = f", {g['peak_bf16_tflops']:g} TFLOP/s bf16 peak" if g.get("peak_bf16_tflops") else ""
            extra = ", ".join(x for x in (
                f"util {g['utilization_pct']} %" if g.get("utilization_pct") is not None else "",
                f"{g['temperature_c']} °C" if g.get("temperature_c") is not None else "",
                f"{g['power_w']:g} W" + (f" / {g['power_limit_w']:g} W" if g.get("power_limit_w") else "")
                if g.get("power_w") is not None else "") if x)
            print(f"gpu {g['index']}     {g['name']}: {human_bytes(g['vram_total'])} "
                  f"({human_bytes(g['vram_free'])} free), compute {g['compute_capability']}, "
                  f"driver {g['driver']}{peak}" + (f"; {extra}" if extra else ""))
    else:
        print(f"gpu       {info['nvidia_note']}")
    t = info.get("torch")
    if t is None:
        print("torch     not checked (--no-torch)")
    elif not t["available"]:
        print(f"torch     {t['note']}")
    else:
        print(f"torch     {t['version']}, CUDA {'available' if t['cuda'] else 'not available'}"
              f"{' (build ' + t['cuda_build'] + ')' if t.get('cuda_build') else ''}, "
              f"MPS {'available' if t['mps'] else 'not available'}")
        for d in t.get("cuda_devices", []):
            print(f"  cuda:{d['index']}  {d['name']}: bf16 {_yn(d['bf16'])}, tf32 {_yn(d['tf32'])}, "
                  f"flash attention {_yn(d['flash_attention'])}, fused AdamW {_yn(d['fused_adamw'])}, "
                  f"torch.compile {_yn(d['compile'])}")
        if t.get("mps"):
            m = t["mps_caps"]
            print(f"  mps     bf16 {_yn(m['bf16'])}, fused AdamW {_yn(m['fused_adamw'])}, "
                  "attention: math kernel (T x T weights)")
        print(f"  cpu     {t.get('cpu_capability') or '?'} kernels, native bf16 {_yn(t.get('cpu_bf16_native'))}, "
              f"fused AdamW {_yn(t.get('fused_adamw_cpu'))}, torch.compile {_yn(t.get('compile_cpu'))} "
              "(needs a C++ compiler)")
    print(f"preset    {name}: {reason}")
    return 0
