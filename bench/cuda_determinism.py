"""Which part of a run is not bit-for-bit reproducible on CUDA: each variant trained twice side by side (and the
first variant also killed with kill -9 half-way and resumed), with ``hardware.deterministic=true``; per variant,
how many steps' losses are bitwise equal, the first that differs, and torch's warnings about ops without a
deterministic kernel (``warn_only``: they land in train.log).

    python bench/cuda_determinism.py [--steps 30] [--variant 'NAME=OVERRIDES' ...] [--runs-dir DIR]

The default variants split cpu-small's recipe (Muon + wsd, QK-norm, per-block compile) into its parts: the
optimizer, the compile, QK-norm. Every run is its own process; they run at once (a tiny model: the GPU has room).
A CPU run is deterministic anyway; this needs a GPU (``--device cpu`` checks the harness).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench import cli_client  # noqa: E402

TINY = ("model.dim=64 model.n_layers=2 model.n_heads=4 model.n_kv_heads=2 model.seq_len=64 model.vocab_size=512 "
        "train.batch_size=8 train.warmup_iters=2 train.eval_iters=2 train.log_interval=1 data.builtin_mb=0.3 "
        "data.tokenizer_sample_mb=0.3 model.dropout=0.1 hardware.deterministic=true")
VARIANTS = {
    "muon-wsd": "",                                                   # cpu-small's recipe as shipped
    "adamw-cosine": "train.optimizer=adamw train.schedule=cosine",
    "muon-eager": "hardware.compile=false",
    "adamw-eager": "train.optimizer=adamw train.schedule=cosine hardware.compile=false",
    "muon-no-qknorm": "model.qk_norm=false",
    "muon-no-dropout": "model.dropout=0.0",
}


def losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "train":
            out[r["step"]] = r["loss"]
    return out


def compare(a: dict[int, float], b: dict[int, float]) -> str:
    steps = sorted(set(a) & set(b))
    if not steps:
        return "no common steps (a run failed: see its train.log)"
    same = sum(a[s] == b[s] for s in steps)
    first = next((s for s in steps if a[s] != b[s]), None)
    diff = max(abs(a[s] - b[s]) for s in steps)
    return f"{same}/{len(steps)} steps bitwise equal, first different step {first}, max |loss diff| {diff:.3g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--variant", action="append", default=[], help="NAME=OVERRIDES (replaces the default list)")
    ap.add_argument("--runs-dir", default="/tmp/wbdet")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    variants = dict(v.split("=", 1) for v in a.variant) if a.variant else VARIANTS
    root = Path(a.runs_dir)
    base = (f"{TINY} hardware.device={a.device} hardware.compile=true hardware.activation_checkpointing=true "
            f"train.max_iters={a.steps} train.lr_decay_iters={a.steps} train.ckpt_interval={max(1, a.steps // 3)} "
            f"train.eval_interval={max(1, a.steps // 3)}")   # a checkpoint before the kill at half-way
    wb = [sys.executable, "-m", "workbench"]
    # the tokenizer and data once, before the runs that share them start at once
    cli_client.run([*wb, "train", "cpu-small", "--name", "prep", "--runs-dir", str(root), "--set", *base.split(),
                    "train.max_iters=1", "hardware.compile=false"])
    procs, t0 = {}, time.time()
    first = next(iter(variants))
    for name, extra in variants.items():
        runs = ["a", "b"] + (["killed"] if name == first else [])
        for k in runs:
            env = dict(os.environ)
            if k == "killed":
                env["WORKBENCH_TEST_KILL_AT_STEP"] = str(a.steps // 2)
            procs[(name, k)] = cli_client.popen(
                [*wb, "train", "cpu-small", "--name", f"{name}-{k}", "--runs-dir", str(root), "--set",
                 *base.split(), *extra.split()], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    for p in procs.values():
        p.wait()
    if (first, "killed") in procs:
        cli_client.run([*wb, "resume", f"{first}-killed", "--runs-dir", str(root)])
    print(f"{len(procs)} runs side by side in {time.time() - t0:.0f} s; {a.steps} steps each; base: {base}")
    for name, extra in variants.items():
        try:
            ra, rb = losses(root / f"{name}-a"), losses(root / f"{name}-b")
        except (OSError, ValueError) as e:
            print(f"{name} ({extra or 'as shipped'}): could not read the runs: {e}")
            continue
        print(f"{name} ({extra or 'as shipped'}): the same run twice: {compare(ra, rb)}")
        if name == first:
            try:
                print(f"    killed at step {a.steps // 2} and resumed: {compare(ra, losses(root / f'{name}-killed'))}")
            except (OSError, ValueError) as e:
                print(f"    killed and resumed: could not read the run: {e}")
        log = (root / f"{name}-a" / "train.log")
        warns = sorted(set(re.findall(r"([\w.]+ does not have a deterministic implementation[^.\n]*)",
                                      log.read_text(errors="replace")))) if log.is_file() else []
        for w in warns[:6]:
            print(f"    warning: {w}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
