"""The compute a sweep's pruner saves: one seeded 12-trial sweep run in full, then with each pruner.

    python bench/sweep_pruning.py      # 10 s a trial, median and halving (14 minutes at load 10 on 2 cores)
    python bench/sweep_pruning.py --budget 15s --pruners halving --startup 3

The sweep: a grid of 12 learning rates (log-spaced 1e-4 .. 1e-1, AdamW + cosine) of a tiny cpu-small (dim 64, 2
layers, seq 32), in an order shuffled by --seed, each trial --budget of training. The same sweep runs through
`workbench sweep` and `workbench queue run` as a user runs it: once without a pruner (every trial to its end), then
once per pruner (the spec's `pruner = { type, startup, shares }`), each in its own runs directory beside a shared,
warmed data cache. Reported side by side: each sweep's best trial (the same learning rate?) and val loss, its trials
finished and pruned, its trial-seconds (each trial's wall-clock from start to end, its start-up included: what a
user waits for) and the share fewer than the full sweep's, and the saving `sweep show` reports (the budget the
pruned trials left unused), and the training seconds (the budget each trial spent, by its own clock: the start-up,
paid by every trial pruned or not, left out). The machine's load average is printed before and after: timings beside
other work are slower, the shares less so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY = ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.seq_len=32",
        "model.vocab_size=512", "train.batch_size=4", "train.warmup_iters=5", "train.eval_iters=4",
        "train.eval_interval=4", "train.log_interval=4", "data.builtin_mb=0.3", "data.tokenizer_sample_mb=0.3",
        "hardware.nproc=1", "hardware.compile=false", "train.optimizer=adamw", "train.schedule=cosine",
        "train.min_lr=1e-6", "train.sample_prompt=\"\"",  # no 64-token sample at each eval: not the metric
        "train.patience=0"]  # no early stop: every trial runs its budget unless the pruner stops it
LRS = [round(1e-4 * 1000 ** (k / 11), 7) for k in range(12)]   # 1e-4 .. 1e-1, x1.87 apart


def wb(*args: str, env: dict, timeout: float = 3600) -> str:
    cmd = [sys.executable, "-m", "workbench", *args]
    cp = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    if cp.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{cp.stdout}\n{cp.stderr}")
    return cp.stdout


def spec_text(name: str, budget: str, lrs: list[float], pruner: str | None, startup: int,
              shares: list[float], steps: int | None = None) -> str:
    """A trial trains ``budget`` (a time budget) or, with ``steps``, that many steps: then a trial is the same
    run, bit for bit, in every sweep (a CPU run is deterministic), and the sweeps differ by the pruner alone."""
    sets = TINY + ([f"train.max_iters={steps}"] if steps else [])
    lines = [f'name = "{name}"', 'preset = "cpu-small"'] + ([] if steps else [f'time_budget = "{budget}"']) + [
             "set = [" + ", ".join(json.dumps(s) for s in sets) + "]"]
    if pruner:
        lines.append(f'pruner = {{ type = "{pruner}", startup = {startup}, shares = {json.dumps(shares)} }}')
    lines += ["[parameters]", '"train.lr" = [' + ", ".join(repr(v) for v in lrs) + "]"]
    return "\n".join(lines) + "\n"


def run_sweep(out: Path, name: str, text: str, env: dict, tabulate: bool) -> dict:
    """The sweep run to its end through the CLI (with --tabulate: one run before, read again)."""
    root = out / name
    spec = out / f"{name}.toml"
    wall = None
    if not tabulate:
        spec.write_text(text)
        print(f"$ workbench sweep {spec} --runs-dir {root} && workbench queue run --runs-dir {root}", flush=True)
        t0 = time.monotonic()
        wb("sweep", str(spec), "--runs-dir", str(root), env=env)
        wb("queue", "run", "--runs-dir", str(root), env=env)
        wall = time.monotonic() - t0
    res = json.loads(wb("sweep", "show", name, "--json", "--runs-dir", str(root), env=env))
    res["wall_s"], res["root"] = wall, root
    print(wb("sweep", "show", name, "--runs-dir", str(root), env=env), flush=True)
    return res


def summary(res: dict) -> dict:
    from workbench import rundir
    rows = res["trials"]
    best = res["best"]
    # training seconds: the budget each trial spent (its own clock: start-up, the first eval and the end left out)
    status = [rundir.read_status(res["root"] / r["run"]) for r in rows]
    trained = sum(st.budget_spent_s or 0.0 for st in status)
    steps = sum(st.step or 0 for st in status)
    return {"best": best["run"].rsplit("-", 1)[-1] if best else "-",
            "lr": best["params"]["train.lr"] if best else None,
            "val_loss": best["metric"] if best else None,
            "finished": sum(r["state"] == "finished" for r in rows),
            "pruned": sum(r["state"] == "pruned" for r in rows), "trained": trained, "steps": steps,
            "spent": res["compute"]["spent_s"], "saved_share": res["compute"]["saved_share"], "wall": res["wall_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="10s", help="each trial's time budget (default 10s)")
    ap.add_argument("--steps", type=int, default=None,
                    help="each trial trains this many steps instead of a time budget: the same lr trains the same "
                         "run in every sweep, so the best trial is compared without the machine's timing noise")
    ap.add_argument("--pruners", default="median,halving", help="the pruners to compare with the full sweep")
    ap.add_argument("--startup", type=int, default=2, help="trials that end before a pruner stops any (default 2)")
    ap.add_argument("--shares", default="0.25,0.5,0.75", help="shares of the budget the trials report at")
    ap.add_argument("--seed", type=int, default=0, help="shuffles the order of the 12 learning rates")
    ap.add_argument("--out", default=None, help="runs and the data cache (default: a new temporary directory)")
    ap.add_argument("--tabulate", action="store_true", help="run nothing: the table of the sweeps already in --out")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="sweep-pruning-"))
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, WORKBENCH_CACHE_DIR=str(out / "cache"), PYTHONPATH=str(ROOT))
    lrs = LRS[:]
    random.Random(a.seed).shuffle(lrs)
    shares = [float(s) for s in a.shares.split(",")]
    load0 = os.getloadavg()
    each = f"{a.steps} steps" if a.steps else a.budget
    print(f"out: {out}; 12 trials of {each}, learning rates in this order: {', '.join(f'{v:.3g}' for v in lrs)}")
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} ({os.cpu_count()} CPUs)", flush=True)
    if not a.tabulate:  # the data cache warmed first, so no sweep's first trial pays for the corpus's preparation
        wb("train", "cpu-small", "--name", "warm", "--runs-dir", str(out / "warm"), "--set", *TINY,
           "train.max_iters=10", env=env)
    results = {}
    for pruner in ["", *(p for p in a.pruners.split(",") if p)]:
        name = pruner or "full"
        text = spec_text(name, a.budget, lrs, pruner or None, a.startup, shares, a.steps)
        res = run_sweep(out, name, text, env, a.tabulate)
        results[name] = summary(res)
    load1 = os.getloadavg()
    full = results["full"]
    names = list(results)
    table = [("best trial", lambda r: f"{r['best']} (lr {r['lr']:.3g})" if r["lr"] else "-"),
             ("its val loss", lambda r: f"{r['val_loss']:.4f}" if r["val_loss"] is not None else "-"),
             ("same best as full", lambda r: "-" if r is full else ("yes" if r["lr"] == full["lr"] else "NO")),
             ("finished / pruned", lambda r: f"{r['finished']} / {r['pruned']}"),
             ("trial-seconds", lambda r: f"{r['spent']:,.0f}"),
             ("less than full", lambda r: "-" if r is full else f"{1 - r['spent'] / full['spent']:.0%}"),
             ("saved (sweep show)", lambda r: f"{r['saved_share']:.0%}"),
             *([("training seconds", lambda r: f"{r['trained']:,.0f}"),
                ("less than full", lambda r: "-" if r is full else f"{1 - r['trained'] / full['trained']:.0%}")]
               if full["trained"] else []),   # a step budget: no clock of its own
             ("steps trained", lambda r: f"{r['steps']:,}"),
             ("less than full", lambda r: "-" if r is full else f"{1 - r['steps'] / full['steps']:.0%}"),
             ("wall-clock", lambda r: f"{r['wall']:,.0f} s" if r["wall"] is not None else "-")]
    print(f"\n12-trial sweep, {each} a trial, startup {a.startup}, shares {a.shares}, seed {a.seed}; load average "
          f"{load0[0]:.1f} before, {load1[0]:.1f} after")
    print(f"| {'':<18} | " + " | ".join(f"{n:<18}" for n in names) + " |")
    print("|" + "|".join(["---"] * (len(names) + 1)) + "|")
    for label, cell in table:
        print(f"| {label:<18} | " + " | ".join(f"{cell(results[n]):<18}" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
