"""`workbench runs`: every run with its state, progress, losses, checkpoints and disk use."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from workbench.analysis.summary import RunSummary, list_runs
from workbench.commands.common import add_json_option
from workbench.fmt import human_bytes


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("runs", help="list runs")
    add_json_option(p, "machine-readable output")
    p.set_defaults(func=run)


def _f(x: float | None, fmt: str = "{:.4f}") -> str:
    return "-" if x is None else fmt.format(x)


def share(x: float | None) -> str:
    """A share of the wall-clock as a percentage: one decimal below 10 %."""
    return "-" if x is None else f"{100 * x:.1f}" if x < 0.1 else f"{100 * x:.0f}"


def source_label(r: RunSummary) -> str:
    """'SmolLM2-135M' for an import, 'SmolLM2-135M, lora@smol@0' for a run fine-tuned from it."""
    if not r.source and not r.init:
        return "-"
    name = Path(r.source).name if r.source and not r.source.startswith("run ") else (r.source or "")
    tuned = f"{r.finetune} from {r.init}" if r.init else ""
    return ", ".join(x for x in (name, tuned) if x)


def run(args: argparse.Namespace) -> int:
    root = args.runs_dir
    runs = list_runs(root)  # newest first, as the Runs pane
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in runs], indent=1))
        return 0
    if not runs:
        print(f"no runs in {root}; start one with `workbench train`")
        return 0
    head = ["RUN", "STATE", "PRESET", "FROM", "SOURCE", "STEP", "TRAIN", "VAL", "VAL BPB", "BEST VAL", "TOK/S",
            "EVAL %", "SAVE %", "MEM MB", "EST MB", "ERR", "CKPTS", "DISK"]
    rows = []
    for r in runs:
        rows.append([r.id, r.state, r.preset, r.parent or "-", source_label(r), f"{r.step}/{r.max_iters}",
                     _f(r.train_loss),
                     _f(r.val_loss), _f(r.val_bpb, "{:.3f}"),
                     _f(r.best_val_loss), _f(r.tokens_per_s, "{:,.0f}"), share(r.eval_share), share(r.ckpt_share),
                     _f(r.mem_mb, "{:,.0f}"),
                     _f(r.est_mem_mb, "{:,.0f}"), _f(r.mem_err_pct, "{:+.0f}%"),
                     str(len(r.checkpoints)), human_bytes(r.disk_bytes)])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for row in [head, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
    print("FROM: the run and step a branch started from; SOURCE: the imported model a run's weights came from "
          "(and full or LoRA fine-tuning from which run); "
          "EVAL % / SAVE %: the share of the run's wall-clock spent in evals / saving checkpoints; "
          "MEM MB: peak measured (process RSS on CPU, peak allocated on GPU); EST MB: `workbench estimate` "
          "for the same preset; ERR: measured vs estimate; VAL of a preference run (dpo, simpo, orpo, kto): its "
          "objective's loss, not a text loss, so no VAL BPB; DISK: each file once (a file a branch or fine-tune "
          "shares with an older run, a hard link, is counted with that run)")
    for r in runs:
        if r.tasks:
            scores = ", ".join(f"{t} {v['value']:.3f}" if v["value"] is not None else f"{t} —"
                               for t, v in r.tasks.items())
            metrics = sorted({v["metric"] for v in r.tasks.values()})
            print(f"{r.id} tasks at step {r.task_step}: {scores} ({', '.join(metrics)})")
    for r in runs:
        if r.val_sources:  # a mixture: its last eval's val loss of each source
            print(f"{r.id} val loss by source: " + ", ".join(f"{n} {v:.4f}" for n, v in r.val_sources.items()))
    for r in runs:
        if r.error and r.state in ("failed", "crashed"):
            print(f"{r.id}: {r.error}")
    return 0
