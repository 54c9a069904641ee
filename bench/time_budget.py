"""The best model in the time you have: a run given a time budget against today's way of planning one.

    python bench/time_budget.py                      # 5 minutes, 1 seed (~20 minutes on a quiet 2-core CPU)
    python bench/time_budget.py --minutes 5,10 --seeds 3 --kill
    python bench/time_budget.py --minutes 5 --seeds 3 --kill --budget-only   # where the budgeted runs end, alone
    python bench/time_budget.py --minutes 10 --seeds 3 --planned-set train.optimizer=adamw train.schedule=cosine \
        train.lr=2e-3 train.warmup_iters=150      # the planned runs with the default before 2026-11-27

For each budget T and seed, one run after the other, cpu-small as shipped (cosine schedule, the built-in corpus):

1. **budget**: `workbench train cpu-small --time-budget T`. Reported: the budget spent when it ended (its own
   clock: set-up and the first step left out) and how far past T that is, its steps, its final val loss.
2. **planned**: today's way: max_iters set to the steps `workbench estimate cpu-small` says fit in T on this
   machine (estimated before any run, as a user would), the run stopped (`workbench stop`) when its training
   time reaches T, so a schedule planned from a wrong estimate is cut mid-decay (or ends early).
3. Both runs' last checkpoints are scored by the same function (val loss over 50 fixed batches of the
   validation split), so the comparison does not depend on where their evals fell.
4. With --kill: a third run with the (first) budget is killed with kill -9 when half of it is spent and resumed; the
   budget spent at its end, and the resumed process's wall time against what was left, are reported.

Runs and the data cache live in --out (default: a new temporary directory); the commands are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COMMON = ["train.sample_prompt=", "train.log_interval=1"]
COMMANDS: list[str] = []


def cli(out: Path, *args: str, check: bool = True, wait: bool = True):
    COMMANDS.append(f"WORKBENCH_CACHE_DIR={shlex.quote(str(out / 'cache'))} python -m workbench {shlex.join(args)}")
    argv = [sys.executable, "-m", "workbench", *args]
    env = dict(os.environ, WORKBENCH_CACHE_DIR=str(out / "cache"))
    if not wait:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    cp = subprocess.run(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if check and cp.returncode != 0:
        raise SystemExit(f"time_budget: {shlex.join(args)} failed:\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}")
    return cp


def records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def val_loss(run_dir: Path, batches: int = 50) -> float:
    """The val loss of ``run_dir``'s latest checkpoint over ``batches`` fixed batches (the same for every run)."""
    import dataclasses

    import torch

    from workbench.config import load_preset_file
    from workbench.data.preset_data import prepare_data
    from workbench.train.batches import on_device
    from workbench.train.checkpoint import load_run_model
    from workbench.train.dist import Dist
    from workbench.train.evaluation import EvalBatches, evaluate

    p = load_preset_file(run_dir / "preset.toml")
    # every run scored on the same batches, whatever its own seed
    p = dataclasses.replace(p, train=dataclasses.replace(p.train, eval_iters=batches, seed=1337))
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: None)
    model = load_run_model(run_dir, "latest").model

    def batch(s):
        return on_device(s.next_batch(), torch.device("cpu"))
    token_bytes = torch.from_numpy(data.tokenizer.byte_lengths())
    evals = EvalBatches.draw(p, data, batches, token_bytes, torch.device("cpu"), batch)
    import contextlib
    return evaluate(model, evals, Dist(), contextlib.nullcontext(), 0).val_loss


def first_step_time(run_dir: Path) -> float | None:
    recs = [r for r in records(run_dir) if r.get("kind") == "train"] if (run_dir / "metrics.jsonl").exists() else []
    return recs[0]["time"] if recs else None


def finished(run_dir: Path) -> bool:
    """A run this script finished in the same --out before (a rerun after a crash of the script goes on)."""
    return (run_dir / "status.json").exists() and json.loads((run_dir / "status.json").read_text())["state"] in (
        "finished", "stopped")


def budget_run(out: Path, name: str, seconds: float, seed: int) -> dict:
    if not finished(out / "runs" / name):
        cli(out, "train", "cpu-small", "--runs-dir", str(out / "runs"), "--name", name, "--yes", "--time-budget",
            f"{seconds:g}s", "--set", *COMMON, f"train.seed={seed}")
    st = json.loads((out / "runs" / name / "status.json").read_text())
    return {"spent": st["budget_spent_s"], "steps": st["step"], "val": val_loss(out / "runs" / name)}


def planned_run(out: Path, name: str, seconds: float, seed: int, steps: int, extra: list[str]) -> dict:
    run_dir = out / "runs" / name
    proc = None if finished(run_dir) else cli(
        out, "train", "cpu-small", "--runs-dir", str(out / "runs"), "--name", name, "--yes", "--set", *COMMON,
        *extra, f"train.seed={seed}", f"train.max_iters={steps}", wait=False)
    while proc is not None and proc.poll() is None:
        t0 = first_step_time(run_dir)
        if t0 is not None and time.time() - t0 >= seconds:
            cli(out, "stop", name, "--runs-dir", str(out / "runs"), check=False)
            proc.wait()
            break
        time.sleep(0.5)
    if not (run_dir / "status.json").exists():
        raise SystemExit(f"time_budget: the planned run {name} did not start (run its command, printed below)")
    st = json.loads((run_dir / "status.json").read_text())
    return {"steps": st["step"], "planned": steps, "state": st["state"], "val": val_loss(run_dir)}


def kill_run(out: Path, name: str, seconds: float, seed: int) -> dict:
    run_dir = out / "runs" / name
    proc = cli(out, "train", "cpu-small", "--runs-dir", str(out / "runs"), "--name", name, "--yes", "--time-budget",
               f"{seconds:g}s", "--set", *COMMON, f"train.seed={seed}", "train.ckpt_interval=50", wait=False)
    while proc.poll() is None:
        st = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").exists() else {}
        if (st.get("budget_spent_s") or 0) >= seconds / 2 and (run_dir / "checkpoints").is_dir():
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.2)
    ckpts = sorted((run_dir / "checkpoints").iterdir())
    left = json.loads((ckpts[-1] / "trainer_state.json").read_text())["budget_spent"]
    t0 = time.time()
    cli(out, "resume", name, "--runs-dir", str(out / "runs"))
    wall = time.time() - t0
    st = json.loads((run_dir / "status.json").read_text())
    return {"spent": st["budget_spent_s"], "at_kill_checkpoint": left, "resume_wall": wall,
            "left": seconds - left}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", default="5", help="budgets in minutes, comma-separated (default 5)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per budget (medians over them; default 1)")
    ap.add_argument("--kill", action="store_true", help="also kill -9 a budgeted run at half and resume it")
    ap.add_argument("--out", type=Path, default=None, help="runs and cache here (default: a new temp dir)")
    ap.add_argument("--budget-only", action="store_true",
                    help="only the budgeted runs (and --kill): where they end, without the planned runs to compare")
    ap.add_argument("--planned-set", nargs="*", default=[],
                    help="overrides of the planned run (and its estimate), e.g. the old default: train.optimizer=adamw "
                         "train.schedule=cosine train.lr=2e-3 train.warmup_iters=150")
    a = ap.parse_args()
    out = (a.out or Path(tempfile.mkdtemp(prefix="wb-budget-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ["WORKBENCH_CACHE_DIR"] = str(out / "cache")
    cli(out, "data", "prepare", "builtin")  # the corpus once, before any clock
    print(f"time_budget in {out}", flush=True)
    rows = []
    for minutes in (float(m) for m in a.minutes.split(",")):
        seconds = minutes * 60
        est = json.loads(cli(out, "estimate", "cpu-small", "--runs-dir", str(out / "fresh-runs"), "--json", "--set",
                             *a.planned_set, f"train.time_budget={seconds:g}s").stdout)
        from workbench.config import resolve_preset
        steps = max(resolve_preset("cpu-small", a.planned_set).train.warmup_iters + 1, round(est["time"]["steps"]))
        print(f"\n{minutes:g} min: the estimate before any run says ~{steps:,} steps "
              f"({est['tokens_per_s']:,.0f} tokens/s, {est['tokens_per_s_source']})", flush=True)
        got = []
        for seed in range(a.seeds):
            b = budget_run(out, f"budget-{minutes:g}m-s{seed}", seconds, 1337 + seed)
            print(f"  seed {seed}: budget: spent {b['spent']:.1f} s of {seconds:.0f} "
                  f"({(b['spent'] - seconds) / seconds:+.1%}), {b['steps']:,} steps, val loss {b['val']:.4f}",
                  flush=True)
            if a.budget_only:
                got.append((b, None))
                continue
            p = planned_run(out, f"planned-{minutes:g}m-s{seed}", seconds, 1337 + seed, steps, a.planned_set)
            print(f"  seed {seed}: planned {p['planned']:,} steps: {p['state']} at step {p['steps']:,}, val loss "
                  f"{p['val']:.4f}", flush=True)
            got.append((b, p))
        rows.append((minutes, steps, got))
        if a.kill and len(rows) == 1:  # the first budget only
            k = kill_run(out, f"killed-{minutes:g}m", seconds, 1337)
            print(f"  kill -9 at half, resumed: spent {k['spent']:.1f} s of {seconds:.0f} "
                  f"({(k['spent'] - seconds) / seconds:+.1%}); the resumed process ran {k['resume_wall']:.0f} s for "
                  f"the {k['left']:.0f} s its checkpoint had left (set-up and the first step included)", flush=True)
    print("\n| budget | seeds | budget: spent (over) | steps | val loss | planned steps (estimate) | planned: "
          "stopped at | val loss | budget - planned |\n|---|---|---|---|---|---|---|---|---|")
    for minutes, steps, got in rows:
        bv = statistics.median(b["val"] for b, _ in got)
        spent = statistics.median(b["spent"] for b, _ in got)
        planned = "- | - | - |"
        if not a.budget_only:
            pv = statistics.median(p["val"] for _, p in got)
            planned = f"{statistics.median(p['steps'] for _, p in got):,.0f} | {pv:.4f} | {bv - pv:+.4f} |"
        print(f"| {minutes:g} min | {len(got)} | {spent:.1f} s ({(spent - minutes * 60) / (minutes * 60):+.1%}) | "
              f"{statistics.median(b['steps'] for b, _ in got):,.0f} | {bv:.4f} | {steps:,} | {planned}")
    print("commands:")
    for c in COMMANDS:
        print("  " + c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
