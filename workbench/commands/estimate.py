"""`workbench estimate PRESET`: parameters, FLOPs, memory by component, fit, time, energy, cost."""

from __future__ import annotations

import json
from typing import Any

from workbench.commands.common import add_set_option
from workbench.config import resolve_preset
from workbench.fmt import duration, human_bytes
from workbench.machine.detect import Machine, detect
from workbench.plan import estimate as est
from workbench.plan import report
from workbench.rundir import runs_root


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


# ----------------------------------------------------------------------------- the command

def build_report(args) -> dict[str, Any]:
    p = resolve_preset(args.preset, args.overrides)
    info = detect()
    peak = None
    if not args.no_calibrate:
        from workbench.machine.probe import measured_peak  # imports torch: a short matmul calibration
        peak = measured_peak
    gpus = info.get("nvidia") or []
    return report.build_report(
        p, Machine.from_info(info), device=args.device, precision=args.precision, tokens_per_s=args.tokens_per_s,
        runs_root=runs_root(getattr(args, "runs_dir", None)), peak=peak, watts=args.watts,
        usd_per_hour=args.usd_per_hour, usd_per_kwh=args.usd_per_kwh,
        power_limit_w=gpus[0].get("power_limit_w") if gpus else None)


def _pct(measured: float, estimated: float) -> str:
    return f"{(estimated - measured) / measured * 100:+.0f} %"


def print_report(r: dict[str, Any]) -> None:
    hb = human_bytes
    m = r["memory"]
    pr = r["params"]
    print(f"{r['preset']}: {pr['total'] / 1e6:.2f} M parameters (embedding {pr['embedding'] / 1e6:.2f} M"
          + (", tied" if not pr["lm_head"] else f", lm_head {pr['lm_head'] / 1e6:.2f} M") + "), "
          f"{r['flops_per_token'] / 1e6:.4g} MFLOP per token (6N + 12·L·H·Q·T)")
    print(f"{m['device']}, {m['precision']}, attention {m['attention']}, activation checkpointing "
          f"{'on' if m['activation_checkpointing'] else 'off'}, AdamW {'fused' if m['fused_adamw'] else 'unfused'}; "
          f"batch {m['batch_size']} x seq {m['seq_len']} x accum {m['grad_accum']} = "
          f"{r['tokens_per_step']:,} tokens/step")
    st = r["settings"]
    loss = f"fused, {st['loss_chunk_tokens']} tokens a chunk" if st["loss_chunk_tokens"] else "plain"
    print(f"loss {loss}; compile {st['compile_mode']} ({st['compile_reason']})")
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
            line = (f"measured peak allocated {hb(meas)} (estimate {hb(m['peak_allocated'])}, "
                    f"{_pct(meas, m['peak_allocated'])})")
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
        print(f"time to max_iters: {duration(t['total_s'])} ({t['tokens'] / 1e6:,.1f} M tokens: "
              f"train {duration(t['train_s'])} + eval {duration(t['eval_s'])})")
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
