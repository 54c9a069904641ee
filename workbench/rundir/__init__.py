"""The run-directory contract shared by the trainer, the CLI and the TUI.

``runs/<id>/`` holds:

- ``preset.toml``      the resolved preset, frozen at start (launcher)
- ``metrics.jsonl``    append-only, one typed record a line, flushed per line (trainer;
  the record kinds are defined in :mod:`workbench.rundir.records`)
- ``status.json``      replaced atomically: state, pid, step, max_iters, error (trainer)
- ``tasks.jsonl``      task scores from ``workbench eval`` (typed task records, like metrics.jsonl's)
- ``samples.jsonl``    prompts and generations (trainer at eval time, sampler)
- ``train.log``        the trainer's stdout/stderr
- ``checkpoints/step_NNNNNNN/``  complete checkpoints; ``meta.json`` inside is written
  last and marks the directory complete, so listing never needs torch
- ``lock``             held (flock) by the one trainer working on the run
- ``tokenizer.model`` or ``tokenizer.json`` (+ ``tokenizer_config.json``)  the run's tokenizer
- ``init/model.pt``    the weights a run started from (``train --init-from``, ``import``): a hard link
  to the source checkpoint's; a LoRA run's checkpoints hold only adapters on top of it

This package is the contract and nothing above it: paths, status, the lock, metric records
and their tailing, checkpoint listing. It imports neither the preset config, the planning
layer, torch nor textual, so the TUI, ``workbench runs`` and your own scripts use it directly.
Summaries that need an estimate live above it (:mod:`workbench.analysis.summary`).
"""

from __future__ import annotations

import dataclasses
import difflib
import fcntl
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import psutil

from workbench.errors import WorkbenchError
from workbench.fs import read_json, write_atomic, write_json_atomic
from workbench.rundir.records import (
    LIVE_STATES,
    STATES,
    TIME_KEYS,
    TIMELINE_EVENTS,
    EvalRecord,
    EventRecord,
    LineTail,
    MetricsTail,
    MetricsWriter,
    NullWriter,
    Record,
    RunStatus,
    RunView,
    TaskRecord,
    TrainRecord,
    current_timeline,
    first_event,
    last_records,
    parse_record,
    read_jsonl_tail,
    read_metrics,
)

CKPT_PREFIX = "step_"
TMP_PREFIX = ".tmp_"
INIT_DIR = "init"   # the weights a run started from (init/model.pt)
TASKS_FILE = "tasks.jsonl"   # task scores written by `workbench eval` (typed task records)
# The files a run's tokenizer may consist of (sentencepiece; or a Hugging Face tokenizer.json and its config), and
# the chat template it renders conversations through (the model's own, or the one the run trained with), with
# other named templates in TEMPLATES_DIR: what a run started from this one (a fine-tune, a branch) must have.
CHAT_TEMPLATE_FILE = "chat_template.jinja"    # transformers 5's name for a model's template
TEMPLATES_DIR = "additional_chat_templates"    # ... and the directory of its other named ones (NAME.jinja)
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", CHAT_TEMPLATE_FILE)


class RunError(WorkbenchError):
    pass


def copy_tokenizer(src_dir: Path, dst_dir: Path) -> None:
    """``src_dir``'s tokenizer files and chat templates (TOKENIZER_FILES, TEMPLATES_DIR) into ``dst_dir``."""
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    for name in TOKENIZER_FILES:
        if (src_dir / name).is_file():
            write_atomic(dst_dir / name, (src_dir / name).read_bytes())
    if (src_dir / TEMPLATES_DIR).is_dir():
        (dst_dir / TEMPLATES_DIR).mkdir(exist_ok=True)
        for f in sorted((src_dir / TEMPLATES_DIR).glob("*.jinja")):
            write_atomic(dst_dir / TEMPLATES_DIR / f.name, f.read_bytes())


# ----------------------------------------------------------------------------- locations

def runs_root(arg: str | os.PathLike | None = None) -> Path:
    """``--runs-dir``, else ``$WORKBENCH_RUNS_DIR``, else ``./runs``."""
    return Path(arg or os.environ.get("WORKBENCH_RUNS_DIR") or "runs").resolve()


_RUN_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")


def sanitize_run_name(name: str) -> str:
    """A run name that cannot escape the runs directory: letters, digits, '.', '_', '-'."""
    clean = _RUN_NAME_RE.sub("-", name.strip()).strip(".-")[:80]
    if not clean:
        raise RunError(f"run name {name!r} has no usable characters; use letters, digits, '.', '_' or '-'")
    return clean


def new_run_dir(root: Path, preset_name: str, name: str | None = None) -> Path:
    """Create and return a fresh run directory. An explicit name that exists is an error."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"cannot create runs directory {root}: {e.strerror}; "
                       "choose another with --runs-dir or WORKBENCH_RUNS_DIR") from None
    if not os.access(root, os.W_OK):
        raise RunError(f"runs directory {root} is not writable; choose another with --runs-dir "
                       "or WORKBENCH_RUNS_DIR")
    if name:
        rid = sanitize_run_name(name)
        path = root / rid
        try:
            path.mkdir()
        except FileExistsError:
            raise RunError(f"a run named {rid!r} already exists in {root}; choose another --name "
                           f"or resume it with `workbench resume {rid}`") from None
        return path
    base = sanitize_run_name(f"{preset_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    for i in range(1000):
        path = root / (base if i == 0 else f"{base}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RunError(f"could not create a new run directory under {root}")


def resolve_run(root: Path, run: str) -> Path:
    """A run by id (a directory name inside the runs dir) or by path to a run directory."""
    cand = Path(run)
    if cand.is_dir() and (cand / "preset.toml").exists():
        return cand.resolve()
    if os.sep in run or run in (".", "..") or sanitize_run_name(run) != run:
        raise RunError(f"no run {run!r} in {root}: give a run id from `workbench runs` or a run directory path")
    path = root / run
    if not (path / "preset.toml").exists():
        known = [p.name for p in iter_run_dirs(root)]
        close = difflib.get_close_matches(run, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RunError(f"no run {run!r} in {root}{hint}; `workbench runs` lists them")
    return path


def iter_run_dirs(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        if p.is_dir() and (p / "preset.toml").exists():
            yield p


# ----------------------------------------------------------------------------- status

def process_start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except Exception:
        return None


def pid_alive(pid: int | None, start_time: float | None = None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start_time is not None:
        actual = process_start_time(pid)
        if actual is not None and abs(actual - start_time) > 1.0:
            return False  # the pid was reused by another process
    try:  # a zombie (exited, not yet reaped) is not running
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except Exception:
        pass
    return True


def write_status(run_dir: Path, now: float | None = None, **fields: Any) -> RunStatus:
    """Set ``fields`` (names of :class:`RunStatus`) in status.json and replace it atomically; ``updated`` is
    ``now`` (default: the time; canned test runs give a fixed one, so their files have fixed sizes)."""
    unknown = set(fields) - set(RunStatus.fields())
    if unknown:
        raise TypeError(f"RunStatus has no field {', '.join(sorted(unknown))}")
    path = Path(run_dir) / "status.json"
    st = dataclasses.replace(RunStatus.from_dict(read_json(path)), **fields,
                             updated=time.time() if now is None else now)
    # No fsync: status is rewritten every log interval from the training loop, and an fsync
    # there cost more than a whole step of a small model. The rename keeps it atomic.
    write_json_atomic(path, st.to_dict(), fsync=False)
    return st


def read_status(run_dir: Path) -> RunStatus:
    """status.json, with a live state whose process is gone reported as ``crashed``."""
    raw = read_json(Path(run_dir) / "status.json")
    st = RunStatus.from_dict(raw) if isinstance(raw, dict) else RunStatus(state="starting")
    if st.live and not pid_alive(st.pid, st.pid_start):
        st = dataclasses.replace(st, state="crashed", error=st.error or
                                 "the trainer process is gone without saying why; see train.log, then "
                                 "`workbench resume`")
    return st


# ----------------------------------------------------------------------------- lock

class RunLock:
    """One trainer per run directory: an flock on ``lock`` that the OS drops when the holder dies."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "lock"
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 64).decode().strip() or "?"
            finally:
                os.close(fd)
            raise RunError(f"run {self.path.parent.name} is already being trained by process {holder}; "
                           f"stop it first with `workbench stop {self.path.parent.name}`") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def held_by_other(self) -> bool:
        """True when a live process holds the lock (checked without keeping it)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)


# ----------------------------------------------------------------------------- checkpoints

def ckpt_name(step: int) -> str:
    return f"{CKPT_PREFIX}{step:07d}"


def list_checkpoints(run_dir: Path) -> list[dict]:
    """Complete checkpoints (those with meta.json), oldest first, from the sidecars."""
    out = []
    cdir = Path(run_dir) / "checkpoints"
    if not cdir.is_dir():
        return out
    for p in sorted(cdir.iterdir()):
        if not p.name.startswith(CKPT_PREFIX) or not p.is_dir():
            continue
        meta = read_json(p / "meta.json")
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
    m = re.fullmatch(r"(?:step_)?0*(\d+)", sel)
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
    cdir = Path(run_dir) / "checkpoints"
    if cdir.is_dir():
        for p in cdir.iterdir():
            if p.name.startswith(TMP_PREFIX) or (p.name.startswith(CKPT_PREFIX) and not (p / "meta.json").exists()):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
    return removed


__all__ = ["CHAT_TEMPLATE_FILE", "best_checkpoint", "ckpt_name", "CKPT_PREFIX", "clean_stale_temporaries",
           "copy_tokenizer", "current_timeline",
           "EvalRecord", "EventRecord", "first_event", "INIT_DIR", "is_latest_checkpoint", "iter_run_dirs",
           "last_records", "LineTail", "list_checkpoints", "LIVE_STATES", "MetricsTail", "MetricsWriter",
           "new_run_dir", "NullWriter", "parse_record", "pid_alive", "process_start_time", "read_jsonl_tail",
           "read_metrics", "read_status", "Record", "resolve_run", "RunError", "RunLock", "runs_root", "RunStatus",
           "RunView", "sanitize_run_name", "select_checkpoint", "STATES", "TIME_KEYS", "TIMELINE_EVENTS", "TMP_PREFIX",
           "TaskRecord", "TASKS_FILE", "TEMPLATES_DIR", "TOKENIZER_FILES", "TrainRecord", "write_status"]
