"""How good the model gets per hour: two settings on the same tokens, and how much sooner one reaches
the other's final validation loss.

    python bench/time_to_loss.py cpu-small "cpu-small train.optimizer=muon train.schedule=wsd" --steps 600 --repeat 3
    python bench/time_to_loss.py cpu-small "cpu-small ..." --steps 600 --steps-b 400 --a-from earlier.json

Each setting is a preset name followed by `section.key=value` overrides. The runs alternate (A, B, A,
B, ...) on the same corpus; the i-th A and B share seed 1337 + i (--first-seed moves it) (the same
weights at the start and the same batches), each through `workbench train` in a fresh runs directory
(the corpus is prepared once, before the first run). For every eval the script prints (seconds since
the run's start, val loss, val bits per byte); then, with L = A's median final val loss, the time each
run needed to reach L (interpolated between evals) and the ratio A / B of the medians: above 1, B
gets there sooner. A run that never reaches L counts as not reaching it (no ratio). Then the same paired by
seed: each A's time to its own final loss over its B's time to that loss, and their median.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(setting: str, steps: int, eval_every: int, eval_iters: int, runs: Path, name: str,
             seed: int = 1337) -> dict:
    preset, *overrides = shlex.split(setting)
    ov = [*overrides, f"train.seed={seed}", f"train.max_iters={steps}", f"train.eval_interval={eval_every}",
          f"train.eval_iters={eval_iters}", f"train.ckpt_interval={steps}", "train.patience=0",
          "train.sample_prompt=''", "train.log_interval=10"]
    cmd = [sys.executable, "-m", "workbench", "train", preset, "--name", name, "--runs-dir", str(runs), "--yes",
           "--set", *ov]
    cp = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if cp.returncode != 0:
        raise SystemExit(f"time_to_loss: {setting!r} failed:\n{cp.stderr[-2000:]}")
    recs = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]
    t0 = next(r["time"] for r in recs if r.get("event") == "start")
    evals = [(r["time"] - t0, r["val_loss"], r.get("val_bpb")) for r in recs if r["kind"] == "eval"]
    tps = [r["tokens_per_s"] for r in recs if r["kind"] == "train" and r.get("tokens_per_s")]
    return {"evals": evals, "final": evals[-1][1], "tokens_per_s": statistics.median(tps) if tps else None,
            "eval_steps": [r["step"] for r in recs if r["kind"] == "eval"]}


def time_to(evals: list[tuple[float, float, float]], target: float) -> float | None:
    """Seconds until the val loss first reaches ``target``, interpolated between the evals around it."""
    prev = None
    for t, loss, _bpb in evals:
        if loss <= target:
            if prev is None or prev[1] == loss:
                return t
            t0, l0 = prev
            return t0 + (t - t0) * (l0 - target) / (l0 - loss)
        prev = (t, loss)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help='the baseline: "PRESET key=value ..."')
    ap.add_argument("b", help='the challenger: "PRESET key=value ..."')
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--steps-b", type=int, default=None,
                    help="B's planned steps (default --steps): a schedule that decays reaches a loss sooner when "
                         "it is planned to end sooner")
    ap.add_argument("--a-from", default=None,
                    help="take A's runs from an earlier --json of this script (same A, same seeds) instead of "
                         "running them again")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-iters", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=1337, help="the i-th pair's seed is this + i")
    ap.add_argument("--json", default=None, help="also write every run's numbers to this file")
    args = ap.parse_args()
    runs = Path(tempfile.mkdtemp(prefix="wb-ttl-"))
    results: dict[str, list[dict]] = {"A": [], "B": []}
    earlier = json.loads(Path(args.a_from).read_text()) if args.a_from else None
    if earlier and earlier["a"] != args.a:
        raise SystemExit(f"time_to_loss: {args.a_from} holds A = {earlier['a']!r}, not {args.a!r}")
    for i in range(args.repeat):
        for key, setting in (("A", args.a), ("B", args.b)):
            if key == "A" and earlier:
                if i >= len(earlier["runs"]["A"]):
                    raise SystemExit(f"time_to_loss: {args.a_from} has {len(earlier['runs']['A'])} A runs, "
                                     f"--repeat {args.repeat} needs {args.repeat}")
                results["A"].append(earlier["runs"]["A"][i])
                print(f"A{i} {setting}: from {args.a_from}: final val loss {earlier['runs']['A'][i]['final']:.4f}")
                continue
            steps = args.steps_b if key == "B" and args.steps_b else args.steps
            r = run_once(setting, steps, args.eval_every, args.eval_iters, runs, f"{key}{i}",
                         seed=args.first_seed + i)
            results[key].append(r)
            if args.json:  # after every run, so a long bench stopped half-way keeps what it measured
                Path(args.json).write_text(json.dumps({"a": args.a, "b": args.b, "runs": results}, indent=1))
            print(f"{key}{i} {setting}: final val loss {r['final']:.4f}, {r['tokens_per_s'] or 0:,.0f} tokens/s",
                  flush=True)
            print("   " + "  ".join(f"({t:.0f}s {loss:.3f} {bpb:.3f})" if bpb is not None else f"({t:.0f}s {loss:.3f})"
                                   for t, loss, bpb in r["evals"]), flush=True)
    target = statistics.median(r["final"] for r in results["A"])
    print(f"\ntarget: A's median final val loss {target:.4f}")
    medians = {}
    for key in ("A", "B"):
        times = [time_to(r["evals"], target) for r in results[key]]
        shown = ", ".join("never" if t is None else f"{t:.0f}s" for t in times)
        reached = [t for t in times if t is not None]
        medians[key] = statistics.median(reached) if len(reached) * 2 > len(times) else None
        finals = ", ".join(f"{r['final']:.4f}" for r in results[key])
        print(f"  {key}: time to target {shown}; final val loss {finals}")
    if medians["A"] and medians["B"]:
        print(f"  ratio A / B of the median times: {medians['A'] / medians['B']:.2f} (above 1: B is sooner)")
    # Paired by seed: each B against its own seed's A (the same weights, batches and eval batches), to A's own
    # final loss; the seeds' spread of final losses (~0.08 on cpu-small) can leave the median target out of a
    # seed's reach, which the median above counts as never.
    paired = []
    for a, b in zip(results["A"], results["B"]):
        ta, tb = time_to(a["evals"], a["final"]), time_to(b["evals"], a["final"])
        paired.append(None if tb is None else ta / tb)
    if paired:
        shown = ", ".join("never" if r is None else f"{r:.2f}" for r in paired)
        reached = sorted(r for r in paired if r is not None)
        med = f"{statistics.median(reached):.2f}" if len(reached) * 2 > len(paired) else "never"
        print(f"  paired by seed, A's time to its own final loss / B's: {shown}; median {med}")
    if args.json:
        Path(args.json).write_text(json.dumps({"a": args.a, "b": args.b, "target": target, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
