"""Short runs that mean something: `workbench train --time-budget T` from the recommended preset, as a new user
types it, for several budgets, on a quiet machine and beside one CPU hog (issue 53).

    python bench/short_budgets.py                          # 20s, 45s, 2m and 10m, quiet then beside a hog
    python bench/short_budgets.py --budgets 20s,45s --conditions quiet

For each budget and condition, one run after the other (the corpus prepared and this machine's matmul rate
measured once before, with `workbench estimate`, so the start-up is the command's own): the wall-clock of the
whole command; its start-up (the command's start to the step-0 eval's start: the estimate, torch, the model, the
timed eval batch); the budgeted part (the step-0 eval's start to the run's end), against the budget; the steps,
the warmup its plan gave it and whether it left it; the evals (how many, their seconds with their samples and
their share of the budget); the last step's learning rate against min_lr; the last val loss. A hog is one
process spinning on one core for the whole run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def spin() -> None:
    while True:
        pass


def records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def one(out: Path, budget: str, condition: str) -> dict:
    name = f"{condition}-{budget}"
    argv = [sys.executable, "-m", "workbench", "train", "--time-budget", budget, "--runs-dir", str(out / "runs"),
            "--name", name]
    env = dict(os.environ, WORKBENCH_CACHE_DIR=str(out / "cache"))
    print(f"$ WORKBENCH_CACHE_DIR={out / 'cache'} {shlex.join(argv[1:])}", flush=True)
    hog = multiprocessing.Process(target=spin, daemon=True) if condition == "hog" else None
    if hog:
        hog.start()
    t0 = time.time()
    try:
        cp = subprocess.run(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    finally:
        wall = time.time() - t0
        if hog:
            hog.terminate()
            hog.join()
    first = cp.stdout.splitlines()[0] if cp.stdout else ""
    if cp.returncode != 0:
        return {"budget": budget, "condition": condition, "refused": (cp.stderr.strip() or cp.stdout[-300:]),
                "first": first, "wall": wall}
    d = out / "runs" / name
    recs = records(d)
    st = json.loads((d / "status.json").read_text())
    evals = [r for r in recs if r["kind"] == "eval"]
    train = [r for r in recs if r["kind"] == "train"]
    finish = next(r for r in recs if r.get("event") == "finish")
    began = evals[0]["time"] - evals[0]["seconds"]
    preset = (d / "preset.toml").read_text()
    min_lr = float(next(x for x in preset.splitlines() if x.startswith("min_lr")).split("=")[1])
    plan = next((x.split(": ", 1)[1] for x in (d / "train.log").read_text().splitlines()
                 if "an eval batch timed at" in x), "")
    return {"budget": budget, "condition": condition, "budget_s": st["budget_s"], "wall": wall,
            "startup": began - t0, "budgeted": finish["time"] - began, "steps": st["step"], "warmup": st.get("warmup"),
            "evals": len(evals), "eval_s": finish["eval_s"], "last_lr": train[-1]["lr"], "min_lr": min_lr,
            "val": evals[-1]["val_loss"], "first": first, "plan": plan}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="20s,45s,2m,10m")
    ap.add_argument("--conditions", default="quiet,hog", help="quiet and/or hog (one process spinning on a core)")
    ap.add_argument("--out", type=Path, default=None, help="runs and cache here (default: a new temp dir)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="wb-short-"))
    env = dict(os.environ, WORKBENCH_CACHE_DIR=str(out / "cache"))
    subprocess.run([sys.executable, "-m", "workbench", "data", "prepare", "builtin", "--preset", "cpu-small"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    # this machine's matmul rate measured before any hog (a new user's machine has one from `estimate` or a run)
    subprocess.run([sys.executable, "-m", "workbench", "estimate", "cpu-small"], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    rows = []
    for condition in args.conditions.split(","):
        for budget in args.budgets.split(","):
            r = one(out, budget, condition)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print("\n| budget | machine | wall | start-up | budgeted part | steps | warmup (left it) | evals | eval s (share) "
          "| last lr / min_lr | val loss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "refused" in r:
            print(f"| {r['budget']} | {r['condition']} | {r['wall']:.1f} s | refused: {r['refused']} |||||||")
            continue
        over = (r["budgeted"] - r["budget_s"]) / r["budget_s"]
        print(f"| {r['budget']} | {r['condition']} | {r['wall']:.1f} s | {r['startup']:.1f} s | {r['budgeted']:.1f} s "
              f"({over:+.1%}) | {r['steps']:,} | {r['warmup']} ({'yes' if r['steps'] > (r['warmup'] or 0) else 'no'}) "
              f"| {r['evals']} | {r['eval_s']:.1f} s ({r['eval_s'] / r['budget_s']:.1%}) "
              f"| {r['last_lr']:.2e} / {r['min_lr']:.0e} | {r['val']:.3f} |")
    print(f"\nruns in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
