"""`workbench estimate PRESET`: parameters, FLOPs, memory by component, fit, time, energy, cost."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from workbench import estimate as est
from workbench.config import PresetError, parse_toml, resolve_preset
from workbench.errors import WorkbenchError
from workbench.commands.common import add_set_option

CPU_WATTS_ASSUMED = 65.0  # a desktop CPU package under load (the seeds' "CPU (i7) 65W")


def register(sub) -> None:
    p = sub.add_parser("estimate", help="memory, fit, tokens/s, time and cost of a preset on this machine",
                       description="Estimate a preset's parameters, FLOPs per token, training memory by "
                                   "component, whether it fits this machine, tokens/s, time to max_iters, "
                                   "energy and cost. Every number is an estimate unless it says measured.")
    p.add_argument("preset", help="preset name or path to a .toml file")
    add_set_option(p)
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda", "mps"],
                   help="device to estimate for (default: the preset's hardware.device)")
    p.add_argument("--precision", default=None, choices=["auto", "fp32", "bf16", "fp16"],
                   help="precision (default: the preset's hardware.precision)")
    p.add_argument("--tokens-per-s", type=float, default=None,
                   help="use this throughput instead of a previous run or the calibration")
    p.add_argument("--no-calibrate", action="store_true", help="skip the short matmul calibration (no torch)")
    p.add_argument("--usd-per-hour", type=float, default=None, help="machine price, for the cost")
    p.add_argument("--usd-per-kwh", type=float, default=None, help="electricity price, for the cost")
    p.add_argument("--watts", type=float, default=None,
                   help="power draw while training (default: the GPU's power limit, or 65 W for a CPU)")
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.set_defaults(func=run)


# ----------------------------------------------------------------------------- previous runs

def _tail_lines(path: Path, max_bytes: int = 4 * 2**20) -> list[str]:
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        data = f.read().decode("utf-8", errors="replace")
    lines = data.splitlines()
    return lines[1:] if size > max_bytes else lines


def previous_run(preset, runs_root: Path, device: str) -> dict[str, Any] | None:
    """The newest run in ``runs_root`` of the same preset (name, model, batch size) on ``device``:
    its median tokens/s and peak memory, from metrics.jsonl."""
    if not runs_root.is_dir():
        return None
    want_model = preset.to_dict()["model"]
    best = None
    for d in runs_root.iterdir():
        pt, mt = d / "preset.toml", d / "metrics.jsonl"
        if not (pt.is_file() and mt.is_file()):
            continue
        try:
            data = parse_toml(pt.read_text(encoding="utf-8"), str(pt))
        except (PresetError, OSError):
            continue
        if (data.get("name") != preset.name or data.get("model") != want_model
                or data.get("train", {}).get("batch_size") != preset.train.batch_size):
            continue
        tps, mem, reserved, run_device = [], [], [], None
        try:
            for line in _tail_lines(mt):
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("kind") == "event" and r.get("event") in ("start", "resume") and r.get("device"):
                    run_device = str(r["device"])
                if r.get("kind") == "train":
                    if isinstance(r.get("tokens_per_s"), (int, float)):
                        tps.append(float(r["tokens_per_s"]))
                    if isinstance(r.get("mem_mb"), (int, float)):
                        mem.append(float(r["mem_mb"]))
                    if isinstance(r.get("mem_reserved_mb"), (int, float)):
                        reserved.append(float(r["mem_reserved_mb"]))
        except OSError:
            continue
        if not tps or (run_device and run_device.split(":")[0] != device.split(":")[0]):
            continue
        mtime = mt.stat().st_mtime
        if best is None or mtime > best["mtime"]:
            best = {"run": d.name, "mtime": mtime, "tokens_per_s": statistics.median(tps[1:] or tps),
                    "records": len(tps), "device": run_device,
                    "mem_mb": max(mem) if mem else None, "mem_reserved_mb": max(reserved) if reserved else None}
    return best


# ----------------------------------------------------------------------------- the command

def build_report(args) -> dict[str, Any]:
    from workbench import hardware
    p = resolve_preset(args.preset, args.overrides)
    for flag in ("usd_per_hour", "usd_per_kwh", "watts", "tokens_per_s"):
        v = getattr(args, flag)
        if v is not None and (not math.isfinite(v) or v < 0 or (flag == "tokens_per_s" and v == 0)):
            raise WorkbenchError(f"--{flag.replace('_', '-')} {v:g} must be a positive number")
    info = hardware.detect(use_torch=False)
    here = hardware.best_device(info)
    device = args.device or p.hardware.device
    if device == "auto":
        device = here
    device = device.split(":")[0] if device.startswith("cuda") else device
    mem = est.estimate_memory(p, args.precision, device)
    avail, what = hardware.device_memory(info, device) if device == here or device == "cpu" else (None, "")
    report: dict[str, Any] = {
        "preset": p.name,
        "params": est.param_breakdown(p.model) | {"total": est.count_params(p.model)},
        "flops_per_token": est.flops_per_token(p.model),
        "tokens_per_step": p.tokens_per_step(),
        "memory": mem,
        "available": avail, "available_what": what,
        "fits": est.fits(mem, avail),
        "device_here": here,
    }
    if report["fits"] is False:
        report["suggestion"] = hardware.suggest_changes(p, device, avail)

    # throughput: given > a previous run here > calibration
    from workbench.rundir import runs_root
    prev = previous_run(p, runs_root(getattr(args, "runs_dir", None)), device)
    report["previous_run"] = prev
    tps, source = None, None
    if args.tokens_per_s:
        tps, source = args.tokens_per_s, "given with --tokens-per-s"
    elif prev:
        tps, source = prev["tokens_per_s"], f"measured: median of {prev['records']} log records of run {prev['run']}"
    elif device == here and not args.no_calibrate:
        gpu = info["nvidia"][0]["name"] if (device == "cuda" and info["nvidia"]) else None
        try:
            peak, how = hardware.mfu_peak(device, mem["precision"], gpu)
        except ImportError:
            peak, how = None, None
        if peak:
            eff = est.ASSUMED_EFFICIENCY.get(device, 0.3)
            tps = est.tokens_per_s_from_flops(p.model, peak, eff)
            source = (f"estimate: {peak / 1e12:.3g} TFLOP/s ({'peak table' if how == 'table' else 'measured matmul'}) "
                      f"x {eff:.0%} assumed efficiency / {est.flops_per_token(p.model) / 1e6:.4g} MFLOP per token")
    report["tokens_per_s"], report["tokens_per_s_source"] = tps, source
    if tps:
        report["time"] = est.estimate_time(p, tps)
        watts, watts_src = args.watts, "given"
        if watts is None:
            if device == "cuda" and info["nvidia"] and info["nvidia"][0].get("power_limit_w"):
                watts, watts_src = info["nvidia"][0]["power_limit_w"], "GPU power limit (NVML)"
            elif device == "cpu":
                watts, watts_src = CPU_WATTS_ASSUMED, "assumed for a CPU; set --watts"
        report["cost"] = est.estimate_cost(report["time"]["total_s"], watts, args.usd_per_hour, args.usd_per_kwh)
        report["cost"]["watts_source"] = watts_src if watts else None
    return report


def _pct(measured: float, estimated: float) -> str:
    return f"{(estimated - measured) / measured * 100:+.0f} %"


def print_report(r: dict[str, Any]) -> None:
    hb = est.human_bytes
    m = r["memory"]
    pr = r["params"]
    print(f"{r['preset']}: {pr['total'] / 1e6:.2f} M parameters (embedding {pr['embedding'] / 1e6:.2f} M"
          + (", tied" if not pr["lm_head"] else f", lm_head {pr['lm_head'] / 1e6:.2f} M") + "), "
          f"{r['flops_per_token'] / 1e6:.4g} MFLOP per token (6N + 12·L·H·Q·T)")
    print(f"{m['device']}, {m['precision']}, attention {m['attention']}, activation checkpointing "
          f"{'on' if m['activation_checkpointing'] else 'off'}, AdamW {'fused' if m['fused_adamw'] else 'unfused'}; "
          f"batch {m['batch_size']} x seq {m['seq_len']} x accum {m['grad_accum']} = {r['tokens_per_step']:,} tokens/step")
    c = m["components"]
    cast = "bf16/fp16" if m["precision"] != "fp32" else ""
    rows = [
        ("weights (fp32)", c["weights"], ""),
        ("gradients (fp32)", c["gradients"],
         "" if c["gradients"] else f"{hb(m['model_states'] // 4)} allocated after this point (grad_accum 1)"),
        ("optimizer states (AdamW, 2 x fp32)", c["optimizer"], ""),
        (f"weight casts ({cast or 'none in fp32'})", c["weight_casts"], ""),
        ("activations", c["activations"],
         f"{m['per_layer']['saved'] / 2**20:.1f} MiB/layer saved"),
        ("logits + fp32 log-softmax", c["logits"], ""),
        ("optimizer temporaries", c["optimizer_temp"], ""),
    ]
    if c.get("workspace"):
        rows.append(("cuBLAS workspaces", c["workspace"], ""))
    print(f"\nmemory at the peak ({m['peak_phase']}), estimate:")
    for name, v, note in rows:
        print(f"  {name:<38} {hb(v):>11}" + (f"   {note}" if note else ""))
    print(f"  {'= peak allocated (tensors)':<38} {hb(m['peak_allocated']):>11}")
    print(f"  {'allocator fragmentation (~12 %)':<38} {hb(m['fragmentation']):>11}")
    fw = "CUDA context" if m["device"] == "cuda" else "torch runtime"
    print(f"  {fw:<38} {hb(m['framework']):>11}")
    print(f"  {'= total':<38} {hb(m['total']):>11}")
    pl = m["per_layer"]
    print(f"  per layer: {hb(pl['flash'])} with SDPA flash / memory-efficient attention, {hb(pl['math'])} with "
          f"eager (math) attention, {hb(pl['checkpointed'])} with activation checkpointing")
    if r["available"]:
        verdict = {True: "fits", False: "does NOT fit", None: "?"}[r["fits"]]
        print(f"fit: {verdict}: {hb(m['total'])} of {hb(r['available'])} {r['available_what']} "
              f"(keeping {est.HEADROOM:.0%} headroom)")
        if r.get("suggestion"):
            print(f"  to fit: {r['suggestion']}")
    else:
        print(f"fit: no {m['device']} device here ({r['device_here']}); the numbers above are for {m['device']}")
    prev = r.get("previous_run")
    if prev and (prev.get("mem_mb") or prev.get("mem_reserved_mb")):
        meas = prev["mem_mb"] * 2**20 if prev.get("mem_mb") else None
        if m["device"] == "cuda" and meas:
            line = f"measured peak allocated {hb(meas)} (estimate {hb(m['peak_allocated'])}, {_pct(meas, m['peak_allocated'])})"
            if prev.get("mem_reserved_mb"):
                res = prev["mem_reserved_mb"] * 2**20
                est_res = m["peak_allocated"] + m["fragmentation"]
                line += f"; reserved {hb(res)} (estimate {hb(est_res)}, {_pct(res, est_res)})"
            print(f"run {prev['run']}: {line}")
        elif meas:
            print(f"run {prev['run']}: measured memory {hb(meas)} (process RSS at log time; "
                  f"estimated peak {hb(m['total'])}, {_pct(meas, m['total'])})")
    if r["tokens_per_s"]:
        t = r["time"]
        print(f"throughput: {r['tokens_per_s']:,.0f} tokens/s ({r['tokens_per_s_source']})")
        print(f"time to max_iters: {est.human_duration(t['total_s'])} ({t['tokens'] / 1e6:,.1f} M tokens: "
              f"train {est.human_duration(t['train_s'])} + eval {est.human_duration(t['eval_s'])})")
        cst = r["cost"]
        parts = []
        if cst["kwh"] is not None:
            parts.append(f"energy {cst['kwh']:.3g} kWh at {cst['watts']:g} W ({cst['watts_source']})")
        if cst["usd"] is not None:
            parts.append(f"cost ${cst['usd']:,.2f}")
        elif cst["kwh"] is not None:
            parts.append("cost: give --usd-per-hour or --usd-per-kwh")
        if parts:
            print("; ".join(parts))
    else:
        print("throughput: unknown (no previous run of this preset here, and the device is not this machine's; "
              "give --tokens-per-s)")


def run(args) -> int:
    r = build_report(args)
    if args.json:
        print(json.dumps(r, indent=2, default=str))
    else:
        print_report(r)
    return 0
