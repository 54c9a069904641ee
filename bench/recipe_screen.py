"""Screen training recipes on loss per step: many settings, several seeds, runs side by side.

    python bench/recipe_screen.py --report screen.json     # the summary of an earlier screen
    python bench/recipe_screen.py "cpu-small" "cpu-small train.optimizer=muon train.schedule=wsd train.max_iters=450" \
        --seeds 3 --parallel 8 --set hardware.device=cuda hardware.precision=fp32 --json screen.json

The first setting is the baseline. Every run is compared with the baseline's run of the same seed: for every
setting the script prints its planned steps, its final val loss less the baseline's (each seed) and the median
step at which it reached the baseline's final val loss (interpolated between evals; "never" where fewer than
half the seeds got there). A step's cost is not measured here: the
loss a step buys does not depend on how busy the machine is, so the screen can run many runs at once (on a GPU,
or beside other work), and the few settings worth it are then timed one after another with
``bench/time_to_loss.py`` on the machine they are for. Each setting is a preset followed by ``key=value``
overrides; ``train.max_iters=N`` in a setting plans it for N steps (default --steps). Seed i of every setting
starts from the same weights and batches (train.seed = --first-seed + i).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_to_loss import run_once, time_to  # noqa: E402


def planned(setting: str, default: int) -> tuple[str, int]:
    """The setting without its train.max_iters, and the steps it plans."""
    words = shlex.split(setting)
    steps = [int(w.split("=", 1)[1]) for w in words if w.startswith("train.max_iters=")]
    rest = [w for w in words if not w.startswith("train.max_iters=")]
    return shlex.join(rest), steps[-1] if steps else default


def report(settings: list[str], results: dict, default_steps: int) -> None:
    """Paired by seed: seed i of a setting against seed i of the baseline (the same weights, batches and eval
    batches; the seeds' own spread, ~0.1-0.2 nats here, is larger than most settings' effects)."""
    base = results[0]
    print(f"\nagainst the baseline's final val loss of the same seed ({settings[0]})")
    print(f"{'#':>2} {'steps':>5} {'final - baseline (each seed)':>30} {'step to it (median)':>19}  each seed")
    for k, setting in enumerate(settings):
        seeds = sorted(results[k])
        at = []
        for i in seeds:
            r = results[k][i]
            at.append(time_to(list(zip(r["eval_steps"], (e[1] for e in r["evals"]), (e[2] for e in r["evals"]))),
                              base[i]["final"]))
        reached = [s for s in at if s is not None]
        med = f"{statistics.median(reached):.0f}" if len(reached) * 2 > len(at) else "never"
        diffs = " ".join(f"{results[k][i]['final'] - base[i]['final']:+.3f}" for i in seeds)
        each = " ".join("never" if s is None else f"{s:.0f}" for s in at)
        print(f"{k:>2} {planned(setting, default_steps)[1]:>5} {diffs:>30} {med:>19}  {each}  {setting}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("settings", nargs="+", help='"PRESET key=value ...", the baseline first')
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=1337)
    ap.add_argument("--parallel", type=int, default=1, help="runs at once")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each run")
    ap.add_argument("--set", nargs="*", default=[], help="overrides added to every setting (device, precision)")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-iters", type=int, default=8)
    ap.add_argument("--json", default=None, help="write every run's evals to this file (rewritten as runs end)")
    ap.add_argument("--report", default=None, help="only print the summary of an earlier --json")
    args = ap.parse_args()
    if args.report:
        earlier = json.loads(Path(args.report).read_text())
        results = {int(k): {int(i): r for i, r in v.items()} for k, v in earlier["results"].items()}
        report(earlier["settings"], results, args.steps)
        return 0
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    runs = Path(tempfile.mkdtemp(prefix="wb-screen-"))
    jobs = []
    for k, setting in enumerate(args.settings):
        base, steps = planned(setting, args.steps)
        full = shlex.join([*shlex.split(base), *args.set])
        jobs += [(k, i, full, steps) for i in range(args.seeds)]
    results: dict[int, dict[int, dict]] = {k: {} for k in range(len(args.settings))}

    def one(job):
        k, i, full, steps = job
        r = run_once(full, steps, args.eval_every, args.eval_iters, runs, f"s{k}-{i}", seed=args.first_seed + i)
        results[k][i] = r
        print(f"[{k}] seed {args.first_seed + i}: final {r['final']:.4f}  {args.settings[k]}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"settings": args.settings, "results": results}, indent=0))
        return r

    # The baseline's first seed alone first: it prepares the corpus that every other run then reads.
    one(jobs[0])
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(one, jobs[1:]))
    report(args.settings, results, args.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
