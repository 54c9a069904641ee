"""What torch.compile costs at start-up, cold and warm: seconds from the trainer's start to its first step.

    python bench/compile_cache.py cpu-small [--set k=v ...]

Three runs of the real trainer, each timed from its start event to the first logged
training step (metrics.jsonl): eager; compiled with an empty compile cache (cold); and a
resume of that compiled run, which finds the run's own inductor cache in
runs/<id>/cache/inductor (warm). The compile cost is the difference to the eager run.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def first_step_seconds(run: Path, after: float = 0.0) -> float:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in recs if r.get("event") in ("start", "resume") and r["time"] >= after)
    step = next(r for r in recs if r["kind"] == "train" and r["time"] >= start["time"])
    return step["time"] - start["time"]


def wb(*args: str) -> None:
    cp = subprocess.run([sys.executable, "-m", "workbench", *args], cwd=ROOT, capture_output=True, text=True)
    if cp.returncode != 0:
        raise SystemExit(f"bench: workbench {args[0]} failed:\n{cp.stderr[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[])
    args = ap.parse_args()
    ov = args.overrides + ["train.log_interval=1", "train.eval_interval=1000", "train.ckpt_interval=1000",
                           "train.sample_prompt=''", "train.eval_iters=1", "train.warmup_iters=0"]
    with tempfile.TemporaryDirectory() as tmp:
        wb("train", args.preset, "--name", "eager", "--runs-dir", tmp, "--set", *ov,
           "train.max_iters=2", "hardware.compile=false")
        eager = first_step_seconds(Path(tmp) / "eager")
        wb("train", args.preset, "--name", "c", "--runs-dir", tmp, "--set", *ov,
           "train.max_iters=2", "hardware.compile=true")
        cold = first_step_seconds(Path(tmp) / "c")
        t = time.time()
        wb("resume", "c", "--runs-dir", tmp, "--set", "train.max_iters=4")
        warm = first_step_seconds(Path(tmp) / "c", after=t)
    print(f"{args.preset} {' '.join(args.overrides)}".strip()
          + f": start to first step: eager {eager:.1f} s, compiled cold {cold:.1f} s (compile +{cold - eager:.1f} s), "
            f"compiled warm on resume {warm:.1f} s (+{warm - eager:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
