"""Batch-size sweep: tokens/s and peak memory per micro-batch size, beside the estimate.

    python bench/batch_sweep.py PRESET [--batch-sizes 1,2,4,8] [--device cpu|cuda|mps]
                                [--steps 4] [--set section.key=value ...] [--json]

Each size runs in a fresh Python process (so peaks do not mix and an out of
memory ends only that size): a few real AdamW steps of the preset's model
(eager, no torch.compile) with the training loop's step. Measured peak memory
is torch.cuda.max_memory_allocated / max_memory_reserved on CUDA, the driver's
allocation on MPS, and the process's peak RSS (ru_maxrss) on CPU. The table sets
each beside workbench.plan.fit.memory.estimate_memory, with the estimate's error in percent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one(preset_name: str, overrides: list[str], batch: int, device: str, steps: int) -> dict:
    """Run in the child: a few steps at ``batch``; print one JSON line."""
    import resource

    from workbench.config import resolve_preset
    from workbench.machine.probe import this_machine
    from workbench.plan.fit.memory import what_if
    from workbench.plan.settings import resolve_settings
    from workbench.train.batch_probe import Prober
    from workbench.train.runtime import apply_backend_flags
    p = what_if(resolve_preset(preset_name, overrides + [f"train.batch_size={batch}"]), device=device)
    s = resolve_settings(p, this_machine(), world_size=1)
    apply_backend_flags(s)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    prober = Prober(p, s, micro_batches=2 if p.train.grad_accum > 1 else 1)
    r = prober.trial(batch, steps)
    r["precision"] = s.precision
    r["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    r["rss_before_model"] = rss0
    return r


def sweep(preset_name: str, overrides: list[str], sizes: list[int], device: str, steps: int) -> list[dict]:
    from workbench.config import resolve_preset
    from workbench.plan.fit.memory import estimate_memory
    out = []
    for b in sizes:
        cmd = [sys.executable, __file__, preset_name, "--one", str(b), "--device", device, "--steps", str(steps)]
        for o in overrides:
            cmd += ["--set", o]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=os.getcwd())
        line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        try:
            r = json.loads(line)
        except ValueError:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            r = {"batch": b, "ok": False, "oom": "out of memory" in proc.stderr.lower(), "error": tail}
        r["wall_s"] = time.time() - t0
        p = resolve_preset(preset_name, overrides + [f"train.batch_size={b}"])
        m = estimate_memory(p, r.get("precision"), device)
        r["estimate_peak_allocated"] = m.peak_allocated
        r["estimate_reserved"] = m.peak_allocated + m.fragmentation
        r["estimate_total"] = m.total
        r["estimate_phase"] = m.peak_phase
        out.append(r)
    return out


def _mib(n) -> str:
    return f"{n / 2**20:9.0f}" if n else f"{'-':>9}"


def _err(meas, est) -> str:
    return f"{(est - meas) / meas * 100:+6.1f}%" if meas and est else f"{'':>7}"


def print_table(rows: list[dict], device: str) -> None:
    if device == "cpu":
        print(f"{'batch':>5} {'tokens/s':>10} {'peak RSS MiB':>13} {'est MiB':>9} {'err':>7}  note")
        for r in rows:
            tps = f"{r['tokens_per_s']:10,.0f}" if r.get("ok") else f"{'OOM' if r.get('oom') else 'failed':>10}"
            print(f"{r['batch']:>5} {tps} {_mib(r.get('peak_rss')):>13} {_mib(r['estimate_total'])} "
                  f"{_err(r.get('peak_rss'), r['estimate_total'])}  {r.get('error', '')[:60]}")
        return
    print(f"{'batch':>5} {'tokens/s':>10} {'alloc MiB':>9} {'est MiB':>9} {'err':>7} "
          f"{'reserved':>9} {'est MiB':>9} {'err':>7}  phase / note")
    for r in rows:
        tps = f"{r['tokens_per_s']:10,.0f}" if r.get("ok") else f"{'OOM' if r.get('oom') else 'failed':>10}"
        print(f"{r['batch']:>5} {tps} {_mib(r.get('peak_allocated'))} {_mib(r['estimate_peak_allocated'])} "
              f"{_err(r.get('peak_allocated'), r['estimate_peak_allocated'])} {_mib(r.get('peak_reserved'))} "
              f"{_mib(r['estimate_reserved'])} {_err(r.get('peak_reserved'), r['estimate_reserved'])}  "
              f"{r['estimate_phase']} {r.get('error', '')[:60]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset")
    ap.add_argument("--batch-sizes", default="1,2,4,8", help="comma-separated micro-batch sizes")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per size (the first is not timed)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    device = args.device
    if device == "auto":
        from workbench.machine.probe import this_machine
        device = this_machine().best_device()
    if args.one is not None:
        print(json.dumps(one(args.preset, args.overrides, args.one, device, args.steps)))
        return 0
    try:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
        assert sizes and all(s > 0 for s in sizes)
    except (ValueError, AssertionError):
        ap.error(f"--batch-sizes {args.batch_sizes!r}: give positive integers separated by commas, e.g. 1,2,4,8")
    from workbench.config import resolve_preset
    from workbench.errors import WorkbenchError
    try:
        p = resolve_preset(args.preset, args.overrides)
    except WorkbenchError as e:
        print(f"batch_sweep: error: {e}", file=sys.stderr)
        return 2
    print(f"{p.name} on {device}: seq_len {p.model.seq_len}, {args.steps} steps per size (eager)",
          file=sys.stderr if args.json else sys.stdout, flush=True)
    rows = sweep(args.preset, args.overrides, sizes, device, args.steps)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows, device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
