"""`workbench metrics`: a run's metrics.jsonl as CSV, or as TensorBoard event files.

CSV: one table of the train and eval records, in file order. The fixed columns
come first (kind, step, loss, val_loss, train_loss, lr, tokens_per_s, tokens_seen,
elapsed_s, mem_mb, mfu, grad_norm); any other key found in the records follows, in
the order first seen. A record lacks a column → empty cell; None → empty cell.

TensorBoard: event files under ``runs/<id>/tb/`` converted after the fact from
metrics.jsonl (the trainer is not involved), so ``tensorboard --logdir runs`` shows
every run. Rerunning rewrites the directory (built beside it, then swapped in), so
it is idempotent and picks up a run that has trained further.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
from pathlib import Path

from workbench import rundir
from workbench.errors import WorkbenchError
from workbench.fs import atomic_dir, write_atomic
from workbench.rundir import EvalRecord, TrainRecord

COLUMNS = ["kind", "step", "loss", "val_loss", "train_loss", "lr", "tokens_per_s", "tokens_seen", "elapsed_s",
           "mem_mb", "mfu", "grad_norm"]
TB_DIR = "tb"
TB_PIP = "pip install tensorboard"


class MetricsError(WorkbenchError):
    pass


def register(sub) -> None:
    p = sub.add_parser("metrics", help="export a run's metrics as CSV or TensorBoard event files",
                       description="--csv: the train and eval records of metrics.jsonl as one CSV table "
                                   "(stdout, or --out FILE). --tensorboard: event files under runs/<id>/tb/ "
                                   "(needs the tensorboard package), then `tensorboard --logdir runs`.")
    p.add_argument("run", help="run id or run directory")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--csv", action="store_true", help="write CSV")
    g.add_argument("--tensorboard", action="store_true", help="write TensorBoard event files to runs/<id>/tb/")
    p.add_argument("--out", metavar="FILE", help="with --csv: write to FILE instead of stdout")
    p.set_defaults(func=run)


def load_records(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise MetricsError(f"run {Path(run_dir).name} has no metrics.jsonl yet; it has not started training")
    # the current timeline only: records a resume or rollback abandoned are not exported
    records = rundir.current_timeline(rundir.read_metrics(path))
    return [r.to_dict() for r in records if isinstance(r, (TrainRecord, EvalRecord))]


def columns_for(records: list[dict]) -> list[str]:
    cols = list(COLUMNS)
    seen = set(cols)
    for r in records:
        for k in r:
            if k not in seen:
                seen.add(k)
                cols.append(k)
    return cols


def _cell(v) -> str | int | float:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    if isinstance(v, (dict, list)):
        import json
        return json.dumps(v, separators=(",", ":"))
    return v


def to_csv(records: list[dict]) -> str:
    cols = columns_for(records)
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
    try:
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
            for key, tag in TB_SCALARS[r["kind"]].items():
                v = r.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    values.append(Summary.Value(tag=tag, simple_value=float(v)))
            if values:
                wall = r.get("time") if isinstance(r.get("time"), (int, float)) else 0.0
                w.add_event(Event(wall_time=float(wall), step=step, summary=Summary(value=values)))
                n += len(values)
        w.close()
    return final, n


def run(args) -> int:
    root = args.runs_dir
    run_dir = rundir.resolve_run(root, args.run)
    if args.out and not args.csv:
        raise MetricsError("--out goes with --csv; --tensorboard always writes runs/<id>/tb/")
    records = load_records(run_dir)
    if args.csv:
        text = to_csv(records)
        if args.out:
            out = Path(args.out).expanduser()
            try:
                write_atomic(out, text)
            except OSError as e:
                raise MetricsError(f"cannot write {out}: {e.strerror or e}") from None
            n_train = sum(r["kind"] == "train" for r in records)
            print(f"wrote {len(records)} records ({n_train} train, {len(records) - n_train} eval) to {out}",
                  file=sys.stderr)
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
