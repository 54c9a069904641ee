"""The run-directory contract shared by the trainer, the CLI and the TUI.

``runs/<id>/`` holds (each name a constant of :mod:`workbench.rundir.names`, spelled nowhere else):

- ``preset.toml``      the resolved preset, frozen at start (the launcher: ``train``, ``import``, a branch;
  rewritten only by a resume that changes keys)
- ``metrics.jsonl``    append-only, one typed record a line, flushed per line (trainer;
  the record kinds are defined in :mod:`workbench.rundir.records`)
- ``status.json``      replaced atomically: state, pid, step, max_iters, error (launcher, trainer, import)
- ``tasks.jsonl``      task scores from ``workbench eval`` (typed task records, like metrics.jsonl's)
- ``samples.jsonl``    prompts and generations (the trainer, at each eval when ``train.sample_prompt`` is set)
- ``train.log``        the trainer's stdout/stderr
- ``checkpoints/step_NNNNNNN/``  complete checkpoints; ``meta.json`` inside is written
  last and marks the directory complete, so listing never needs torch
- ``lock``             held (flock) by the one trainer working on the run
- ``tokenizer.model`` or ``tokenizer.json`` (+ ``tokenizer_config.json``)  the run's tokenizer
- ``init/model.pt``    the weights a run started from (``train --init-from``, ``import``): a hard link
  to the source checkpoint's; a LoRA run's checkpoints hold only adapters on top of it

This package is the contract and nothing above it. It imports neither the preset config, the planning
layer, torch nor textual, so the TUI, ``workbench runs`` and your own scripts use it directly.
Summaries that need an estimate live above it (:mod:`workbench.analysis.summary`). Its modules:

- ``names``     every file name of a run directory and of a checkpoint, as constants
- ``files``     the one writer of run directories: the one maker of a run (fresh, fine-tune, import, branch,
                removed again if its start fails), a branch's name and its parent (the lineage), the
                preset's file, hard links (else copies) of another run's files, the tokenizer's copy, the
                lock, deleting a run or a checkpoint
- ``status``    status.json: its one writer and reader, and whether a run's trainer process is alive
- ``records``   the typed records (metrics.jsonl, tasks.jsonl, status.json's RunStatus) and the timeline
- ``jsonl``     the JSON-lines files: the trainer's writer, other processes' appends, reading by byte offset
- ``__init__``  where runs are (the runs directory, a run by name), checkpoint listing and selection
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from workbench.fs import read_json
from workbench.rundir.files import (
    RunError,
    RunLock,
    branch_name,
    check_deletable,
    copy_tokenizer,
    delete_checkpoint,
    delete_run,
    link_file,
    link_tree,
    make_branch,
    make_run,
    parent_of,
    sanitize_run_name,
    start_from,
    write_preset,
)
from workbench.rundir.jsonl import (
    LineTail,
    MetricsTail,
    MetricsWriter,
    NullWriter,
    append_feedback,
    append_jsonl,
    append_records,
    first_event,
    last_records,
    read_jsonl_tail,
    read_metrics,
)
from workbench.rundir.names import (
    CHAT_TEMPLATE_FILE,
    CHECKPOINTS_DIR,
    CKPT_META,
    CKPT_MODEL,
    CKPT_OPTIMIZER,
    CKPT_PREFIX,
    CKPT_TRAINER_STATE,
    INIT_DIR,
    LOCK_FILE,
    LOG_FILE,
    METRICS_FILE,
    PREFERENCES_FILE,
    PRESET_FILE,
    RATINGS_FILE,
    SAMPLES_FILE,
    STATUS_FILE,
    TASKS_FILE,
    TEMPLATES_DIR,
    TMP_PREFIX,
    TOKENIZER_FILES,
    ckpt_name,
)
from workbench.rundir.records import (
    LIVE_STATES,
    STATES,
    TIME_KEYS,
    TIMELINE_EVENTS,
    EvalRecord,
    EventRecord,
    PreferenceRecord,
    Record,
    RewardRecord,
    RunStatus,
    RunView,
    TaskRecord,
    TrainRecord,
    current_timeline,
    parse_record,
)
from workbench.rundir.status import pid_alive, process_start_time, read_status, write_status

# ----------------------------------------------------------------------------- locations

def runs_root(arg: str | os.PathLike | None = None) -> Path:
    """``--runs-dir``, else ``$WORKBENCH_RUNS_DIR``, else ``./runs``."""
    return Path(arg or os.environ.get("WORKBENCH_RUNS_DIR") or "runs").resolve()


def resolve_run(root: Path, run: str) -> Path:
    """A run by id (a directory name inside the runs dir) or by path to a run directory."""
    cand = Path(run)
    if cand.is_dir() and (cand / PRESET_FILE).exists():
        return cand.resolve()
    if os.sep in run or run in (".", "..") or sanitize_run_name(run) != run:
        raise RunError(f"no run {run!r} in {root}: give a run id from `workbench runs` or a run directory path")
    path = root / run
    if not (path / PRESET_FILE).exists():
        known = [p.name for p in iter_run_dirs(root)]
        close = difflib.get_close_matches(run, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RunError(f"no run {run!r} in {root}{hint}; `workbench runs` lists them")
    return path


def iter_run_dirs(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        if p.is_dir() and (p / PRESET_FILE).exists():
            yield p


# ----------------------------------------------------------------------------- checkpoints

def list_checkpoints(run_dir: Path) -> list[dict]:
    """Complete checkpoints (those with their sidecar, CKPT_META), oldest first, from the sidecars."""
    out: list[dict] = []
    cdir = Path(run_dir) / CHECKPOINTS_DIR
    if not cdir.is_dir():
        return out
    for p in sorted(cdir.iterdir()):
        if not p.name.startswith(CKPT_PREFIX) or not p.is_dir():
            continue
        meta = read_json(p / CKPT_META)
        if meta is None:
            continue
        meta = dict(meta, path=str(p), name=p.name)
        out.append(meta)
    out.sort(key=lambda m: m.get("step", 0))
    return out


def best_checkpoint(ckpts: list[dict]) -> dict | None:
    scored = [c for c in ckpts if c.get("val_loss") is not None]
    return min(scored, key=lambda c: (c["val_loss"], -c["step"])) if scored else None


def is_latest_checkpoint(run_dir: Path, ckpt: dict) -> bool:
    """``ckpt`` is ``run_dir``'s newest complete checkpoint (resuming from it continues in place)."""
    ckpts = list_checkpoints(run_dir)
    return bool(ckpts) and ckpts[-1]["step"] == ckpt["step"]


def select_checkpoint(run_dir: Path, selector: str | int | None = "latest") -> dict:
    """``latest`` | ``best`` | a step number → that checkpoint's sidecar (with ``path``)."""
    ckpts = list_checkpoints(run_dir)
    name = Path(run_dir).name
    if not ckpts:
        raise RunError(f"run {name} has no complete checkpoint yet; train it past its first "
                       "checkpoint (train.ckpt_interval) or stop it with `workbench stop`, which saves one")
    sel = "latest" if selector in (None, "") else str(selector)
    if sel == "latest":
        return ckpts[-1]
    if sel == "best":
        best = best_checkpoint(ckpts)
        if best is None:
            raise RunError(f"run {name} has no checkpoint with a val loss yet; use --checkpoint latest")
        return best
    m = re.fullmatch(rf"(?:{CKPT_PREFIX})?0*(\d+)", sel)
    if not m:
        raise RunError(f"checkpoint {selector!r} is not latest, best or a step number")
    step = int(m.group(1))
    for c in ckpts:
        if c.get("step") == step:
            return c
    steps = ", ".join(str(c["step"]) for c in ckpts)
    raise RunError(f"run {name} has no checkpoint at step {step}; it has: {steps}")


def clean_stale_temporaries(run_dir: Path) -> list[str]:
    """Remove half-written checkpoint directories left by a killed trainer."""
    removed = []
    cdir = Path(run_dir) / CHECKPOINTS_DIR
    if cdir.is_dir():
        for p in cdir.iterdir():
            if p.name.startswith(TMP_PREFIX) or (p.name.startswith(CKPT_PREFIX) and not (p / CKPT_META).exists()):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
    return removed


__all__ = ["PREFERENCES_FILE", "RATINGS_FILE", "append_feedback", "append_jsonl", "append_records", "best_checkpoint",
           "branch_name", "CHAT_TEMPLATE_FILE", "check_deletable", "CHECKPOINTS_DIR", "CKPT_META", "CKPT_MODEL",
           "ckpt_name", "CKPT_OPTIMIZER", "CKPT_PREFIX", "CKPT_TRAINER_STATE", "clean_stale_temporaries",
           "copy_tokenizer", "current_timeline", "delete_checkpoint", "delete_run", "EvalRecord", "EventRecord",
           "first_event", "INIT_DIR", "is_latest_checkpoint", "iter_run_dirs", "last_records", "LineTail", "link_file",
           "link_tree", "list_checkpoints", "LIVE_STATES", "LOCK_FILE", "LOG_FILE", "METRICS_FILE", "MetricsTail",
           "MetricsWriter", "make_branch", "make_run", "NullWriter", "parent_of", "parse_record", "pid_alive",
           "PRESET_FILE", "process_start_time", "read_jsonl_tail", "read_metrics", "read_status", "Record",
           "resolve_run", "RunError", "RunLock", "runs_root", "RunStatus", "RunView", "SAMPLES_FILE",
           "sanitize_run_name", "select_checkpoint", "start_from", "STATES", "STATUS_FILE", "PreferenceRecord",
           "RewardRecord", "TaskRecord", "TASKS_FILE", "TEMPLATES_DIR", "TIME_KEYS", "TIMELINE_EVENTS", "TMP_PREFIX",
           "TOKENIZER_FILES", "TrainRecord", "write_preset", "write_status"]
