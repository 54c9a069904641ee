"""Tokens/s of workbench's own trainer for a preset, printed as one line.

    python bench/throughput.py cpu-small [--set k=v ...] [--steps 30] [--repeat 3] [--nproc 2]
    python bench/throughput.py cpu-small --vs-reference [--repeat 3]
    python bench/throughput.py cpu-small --vs-reference --as-full-run   # auto's settings for the preset's own length

Runs the real trainer (`workbench train`, under torchrun when --nproc > 1) on a
throwaway run directory and reports the median of the per-interval tokens/s the
trainer itself logged, leaving out the first interval (warm-up / compile). With
--vs-reference it alternates with bench/reference_loop.py (a plain PyTorch loop
for the same model, data and batch) and prints workbench ÷ reference: ratios
measured side by side in one run mean more than absolute numbers on a noisy machine.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(preset: str, overrides: list[str], steps: int, log_every: int, nproc: int | None = None) -> dict:
    ov = list(overrides) + [f"train.max_iters={steps}", f"train.log_interval={log_every}",
                            f"train.eval_interval={steps * 10}", f"train.ckpt_interval={steps * 10}",
                            "train.warmup_iters=0", "train.sample_prompt=''", "train.eval_iters=1"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "workbench", "train", preset, "--name", "bench", "--runs-dir", tmp,
               *(["--nproc", str(nproc)] if nproc else []), "--set", *ov]
        cp = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if cp.returncode != 0:
            raise SystemExit(f"bench: workbench train failed:\n{cp.stderr[-2000:]}")
        recs = [json.loads(line) for line in (Path(tmp) / "bench" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train" and r.get("tokens_per_s")]
    start = next(r for r in recs if r.get("event") == "start")
    body = train[1:] or train
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in body),
            "mfu": statistics.median(r["mfu"] for r in body) if body[0].get("mfu") is not None else None,
            "mem_mb": max(r["mem_mb"] for r in train), "device": start["device"], "precision": start["precision"],
            "compile": start.get("compile_mode", "off") if start["compile"] else "off", "params": start["params"],
            "tokens_per_step": start["tokens_per_step"], "world_size": start.get("world_size", 1)}


def reference(preset: str, overrides: list[str], steps: int, log_every: int) -> float:
    cmd = [sys.executable, str(ROOT / "bench" / "reference_loop.py"), preset, "--steps", str(steps),
           "--log-every", str(log_every)] + (["--set", *overrides] if overrides else [])
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"([\d,]+) tokens/s", out).group(1).replace(",", ""))


def full_run_compile(preset: str, overrides: list[str]) -> bool:
    from workbench.config import resolve_preset
    from workbench.machine.probe import measured_peak, this_machine
    from workbench.plan.settings import resolve_settings
    p = resolve_preset(preset, overrides)
    return resolve_settings(p, this_machine(), world_size=1, peak=measured_peak).compile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=1, help="repetitions; medians are printed")
    ap.add_argument("--nproc", type=int, default=None,
                    help="trainer processes (torchrun, DDP); default: the preset's hardware.nproc (0 = auto)")
    ap.add_argument("--vs-reference", action="store_true", help="also time bench/reference_loop.py and print the ratio")
    ap.add_argument("--as-full-run", action="store_true",
                    help="use the settings auto picks for a run of the preset's own max_iters (the bench's short "
                         "run would otherwise skip what only pays back over a long run: torch.compile on a CPU)")
    args = ap.parse_args()
    if args.as_full_run:
        compile_full = str(full_run_compile(args.preset, args.overrides)).lower()
        args.overrides = [*args.overrides, f"hardware.compile={compile_full}"]
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    wb, ref = [], []
    for _ in range(args.repeat):  # alternate, so drift in machine load hits both sides alike
        wb.append(measure(args.preset, args.overrides, args.steps, args.log_every, args.nproc))
        if args.vs_reference:
            ref.append(reference(args.preset, args.overrides, args.steps, args.log_every))
    tps = statistics.median(x["tokens_per_s"] for x in wb)
    r = wb[0]
    mfu = f"{statistics.median(x['mfu'] for x in wb):.1%}" if r["mfu"] is not None else "n/a"
    procs = f"{r['world_size']} process{'es' if r['world_size'] > 1 else ''}"
    label = f"{args.preset} {' '.join(args.overrides)}".strip() + f" ({procs})"
    line = (f"{label}: {tps:,.0f} tokens/s (median of {args.repeat}), MFU {mfu}, {r['params'] / 1e6:.1f} M params, "
            f"{r['tokens_per_step']:,} tokens/step, device {r['device']}, {r['precision']}, compile {r['compile']}, "
            f"peak mem {r['mem_mb']:,.0f} MB")
    if args.vs_reference:
        rt = statistics.median(ref)
        ratios = [w["tokens_per_s"] / x for w, x in zip(wb, ref)]
        line += (f" | reference {rt:,.0f} tokens/s | ratio {statistics.median(ratios):.3f} "
                 f"(runs: {', '.join(f'{x:.3f}' for x in ratios)})")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
