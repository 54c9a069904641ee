"""`workbench metrics`: a run's metrics.jsonl as CSV, or as TensorBoard event files.

CSV: one table of the train and eval records, in file order. The fixed columns
come first (kind, step, loss, val_loss, train_loss, lr, tokens_per_s, tokens_seen,
elapsed_s, mem_mb, mfu, grad_norm); any other key found in the records follows, in
the order first seen. A record lacks a column → empty cell; None → empty cell.

``--csv --tasks``: the run's task scores instead (step, task, metric, value, n, source, checkpoint), one
row per step, task and metric, from metrics.jsonl (scored while training) and tasks.jsonl
(``workbench eval``), the scores over more items where both scored a step.

TensorBoard: event files under ``runs/<id>/tb/`` converted after the fact from
metrics.jsonl (the trainer is not involved), so ``tensorboard --logdir runs`` shows
every run. Rerunning rewrites the directory (built beside it, then swapped in), so
it is idempotent and picks up a run that has trained further.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
from pathlib import Path

from workbench import rundir
from workbench.analysis.report_card import task_scores
from workbench.commands.common import add_run_argument
from workbench.errors import WorkbenchError
from workbench.fs import atomic_dir, write_atomic
from workbench.rundir import EvalRecord, TaskRecord, TrainRecord

COLUMNS = ["kind", "step", "loss", "val_loss", "train_loss", "lr", "tokens_per_s", "tokens_seen", "elapsed_s",
           "mem_mb", "mfu", "grad_norm"]
TB_DIR = "tb"
TB_PIP = "pip install tensorboard"


class MetricsError(WorkbenchError):
    pass


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("metrics", help="export a run's metrics as CSV or TensorBoard event files",
                       description="--csv: the train and eval records of metrics.jsonl as one CSV table "
                                   "(stdout, or --out FILE). --tensorboard: event files under runs/<id>/tb/ "
                                   "(needs the tensorboard package), then `tensorboard --logdir runs`.")
    add_run_argument(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--csv", action="store_true", help="write CSV")
    g.add_argument("--tensorboard", action="store_true", help="write TensorBoard event files to runs/<id>/tb/")
    p.add_argument("--tasks", action="store_true", help="with --csv: the task scores (train.eval_tasks, "
                   "workbench eval) instead of the train and eval records")
    p.add_argument("--out", metavar="FILE", help="with --csv: write to FILE instead of stdout")
    p.set_defaults(func=run)


def load_records(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / rundir.METRICS_FILE
    if not path.is_file():
        raise MetricsError(f"run {Path(run_dir).name} has no metrics.jsonl yet; it has not started training")
    # the current timeline only: records a resume or rollback abandoned are not exported
    records = rundir.current_timeline(rundir.read_metrics(path))
    return [r.to_dict() for r in records if isinstance(r, (TrainRecord, EvalRecord, TaskRecord))]


TASK_COLUMNS = ["step", "task", "metric", "value", "n", "source", "checkpoint"]


def task_rows(run_dir: Path) -> list[dict]:
    scores = task_scores(run_dir)
    if not scores:
        raise MetricsError(f"run {Path(run_dir).name} has no task scores; set train.eval_tasks or run "
                           f"`workbench eval {Path(run_dir).name} --task builtin`")
    return [{"step": r.step, "task": r.task, "metric": r.metric, "value": r.value, "n": r.n,
             "source": r.extra.get("source"), "checkpoint": r.extra.get("checkpoint")}
            for at in scores.values() for r in at.values()]


def columns_for(records: list[dict], first: list[str] = COLUMNS) -> list[str]:
    cols = list(first)
    seen = set(cols)
    for r in records:
        for k in r:
            if k not in seen:
                seen.add(k)
                cols.append(k)
    return cols


def _cell(v: str | int | float | dict | list | None) -> str | int | float:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return v


def to_csv(records: list[dict], first: list[str] = COLUMNS) -> str:
    cols = columns_for(records, first)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in records:
        w.writerow([_cell(r.get(c)) for c in cols])
    return buf.getvalue()


# Which record keys become which TensorBoard scalars.
TB_SCALARS = {
    "train": {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
              "tokens_per_s": "perf/tokens_per_s", "mfu": "perf/mfu", "mem_mb": "perf/mem_mb",
              "tokens_seen": "train/tokens_seen"},
    "eval": {"val_loss": "eval/val_loss", "train_loss": "eval/train_loss"},
}


def write_tensorboard(run_dir: Path, records: list[dict]) -> tuple[Path, int]:
    """Rewrite ``run_dir/tb`` from the records; returns (the directory, the number of scalars written)."""
    try:  # lazily: tensorboard is optional
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise MetricsError(f"--tensorboard needs the tensorboard package, which is not installed; "
                           f"install it with `{TB_PIP}` (or use --csv)") from None
    final = Path(run_dir) / TB_DIR
    n = 0
    with atomic_dir(final) as tmp:
        w = EventFileWriter(str(tmp))
        for r in records:
            step = r.get("step")
            if not isinstance(step, int):
                continue
            values = []
            for key, tag in TB_SCALARS.get(r["kind"], {}).items():
                v = r.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    values.append(Summary.Value(tag=tag, simple_value=float(v)))
            if r["kind"] == "task" and isinstance(r.get("value"), (int, float)) and math.isfinite(r["value"]):
                values.append(Summary.Value(tag=f"tasks/{r['task']}/{r['metric']}", simple_value=float(r["value"])))
            if values:
                t = r.get("time")
                wall = t if isinstance(t, (int, float)) else 0.0
                w.add_event(Event(wall_time=float(wall), step=step, summary=Summary(value=values)))
                n += len(values)
        w.close()
    return final, n


def run(args: argparse.Namespace) -> int:
    root = args.runs_dir
    run_dir = rundir.resolve_run(root, args.run)
    if args.out and not args.csv:
        raise MetricsError("--out goes with --csv; --tensorboard always writes runs/<id>/tb/")
    if args.tasks and not args.csv:
        raise MetricsError("--tasks goes with --csv (TensorBoard shows task scores under tasks/ already)")
    records = task_rows(run_dir) if args.tasks else load_records(run_dir)
    if args.csv:
        text = to_csv(records, TASK_COLUMNS) if args.tasks else to_csv([r for r in records if r["kind"] != "task"])
        if args.out:
            out = Path(args.out).expanduser()
            try:
                write_atomic(out, text)
            except OSError as e:
                raise MetricsError(f"cannot write {out}: {e.strerror or e}") from None
            if args.tasks:
                print(f"wrote {len(records)} task scores to {out}", file=sys.stderr)
            else:
                n_train = sum(r["kind"] == "train" for r in records)
                n_eval = sum(r["kind"] == "eval" for r in records)
                print(f"wrote {n_train + n_eval} records ({n_train} train, {n_eval} eval) to {out}", file=sys.stderr)
        else:
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except BrokenPipeError:  # `workbench metrics RUN --csv | head`
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    tb, n = write_tensorboard(run_dir, records)
    print(f"wrote {n} scalars from {len(records)} records to {tb}; view with: tensorboard --logdir {root}")
    return 0
