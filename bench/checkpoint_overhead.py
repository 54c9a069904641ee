"""What checkpointing costs a training run: the same run with a checkpoint every 100 steps vs none.

    python bench/checkpoint_overhead.py cpu-small [--steps 300] [--every 100] [--repeat 3] [--set k=v ...]

Runs the real trainer (`workbench train`) twice per repetition, alternating: once with
train.ckpt_interval = --every, once with no interval checkpoints. Evals are off in both
(an improved eval also saves). The time compared is the wall time from the first to the
last logged training step, read from the run's metrics.jsonl, so set-up and the final
save (both runs make one) are left out and every interval save is inside it. Prints the
per-save cost and the overhead (with ÷ without - 1), median over repetitions.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed_run(preset: str, overrides: list[str], steps: int, every: int) -> tuple[float, int, list[float]]:
    """(seconds between the first and last training log line, interval saves, their durations)."""
    ov = list(overrides) + [f"train.max_iters={steps}", "train.log_interval=10", f"train.eval_interval={steps * 10}",
                            f"train.ckpt_interval={every}", "train.sample_prompt=''", "train.eval_iters=1"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "workbench", "train", preset, "--name", "bench", "--runs-dir", tmp, "--set", *ov]
        cp = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if cp.returncode != 0:
            raise SystemExit(f"bench: workbench train failed:\n{cp.stderr[-2000:]}")
        recs = [json.loads(line) for line in (Path(tmp) / "bench" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    first, last = train[0], train[-1]
    saves = [r for r in recs if r.get("event") == "checkpoint" and first["step"] < r.get("step", 0) < last["step"]]
    return last["time"] - first["time"], len(saves), [r.get("seconds", 0.0) for r in saves]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    overheads, per_save, n_saves = [], [], 0
    for _ in range(args.repeat):
        t_with, n_saves, secs = timed_run(args.preset, args.overrides, args.steps, args.every)
        t_without, _, _ = timed_run(args.preset, args.overrides, args.steps, args.steps * 10)
        overheads.append(t_with / t_without - 1)
        per_save.extend(secs)
    save_s = f"{statistics.median(per_save):.2f} s per save" if per_save else "no save timings logged"
    print(f"{args.preset} {' '.join(args.overrides)}".strip()
          + f": {args.steps} steps, checkpoint every {args.every} ({n_saves} saves) vs none: "
            f"overhead {statistics.median(overheads):+.2%} (median of {args.repeat}; runs: "
            f"{', '.join(f'{x:+.2%}' for x in overheads)}), {save_s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
