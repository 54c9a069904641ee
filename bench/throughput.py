"""Tokens/s of workbench's own trainer for a preset, printed as one line.

    python bench/throughput.py cpu-small [--set train.batch_size=16 ...] [--steps 30] [--repeat 3]

Runs the real trainer (workbench.train.loop.Trainer) on a throwaway run directory
for --steps optimizer steps, and reports the median of the per-interval tokens/s
the trainer itself logged, leaving out the first interval (warm-up / compile).
A benchmark, not a test: compare numbers measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.config import preset_to_toml, resolve_preset  # noqa: E402
from workbench.rundir import write_text_atomic  # noqa: E402


def measure(preset: str, overrides: list[str], steps: int, log_every: int) -> dict:
    from workbench.train.loop import Trainer
    ov = list(overrides) + [f"train.max_iters={steps}", f"train.log_interval={log_every}",
                            f"train.eval_interval={steps * 10}", f"train.ckpt_interval={steps * 10}",
                            "train.warmup_iters=0", "train.sample_prompt=''"]
    p = resolve_preset(preset, ov)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "bench"
        run.mkdir()
        write_text_atomic(run / "preset.toml", preset_to_toml(p))
        tr = Trainer(run, echo=False)
        # No step-0 eval or final eval/checkpoint cost in the measurement window: it's logged per interval.
        with open(os.devnull, "w") as devnull:
            old = sys.stdout
            sys.stdout = devnull
            try:
                tr.run()
            finally:
                sys.stdout = old
        recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train" and r.get("tokens_per_s")]
    start = next(r for r in recs if r.get("event") in ("start", "resume"))
    body = train[1:] or train
    return {"preset": preset, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in body),
            "mfu": statistics.median(r["mfu"] for r in body) if body[0].get("mfu") is not None else None,
            "mem_mb": max(r["mem_mb"] for r in train), "device": start["device"], "precision": start["precision"],
            "compile": start["compile"], "params": start["params"], "tokens_per_step": start["tokens_per_step"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=1, help="repetitions; the median is printed")
    args = ap.parse_args()
    results = [measure(args.preset, args.overrides, args.steps, args.log_every) for _ in range(args.repeat)]
    tps = statistics.median(r["tokens_per_s"] for r in results)
    r = results[0]
    mfu = f"{statistics.median(x['mfu'] for x in results):.1%}" if r["mfu"] is not None else "n/a"
    print(f"{args.preset} {' '.join(args.overrides)}: {tps:,.0f} tokens/s (median of {args.repeat}), MFU {mfu}, "
          f"{r['params'] / 1e6:.1f} M params, {r['tokens_per_step']:,} tokens/step, device {r['device']}, "
          f"{r['precision']}, compile {'on' if r['compile'] else 'off'}, peak mem {r['mem_mb']:,.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
