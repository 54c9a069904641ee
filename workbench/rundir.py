"""The run-directory contract shared by the trainer, the CLI and the TUI.

``runs/<id>/`` holds:

- ``preset.toml``      the resolved preset, frozen at start (launcher)
- ``metrics.jsonl``    append-only, one JSON object a line, flushed per line (trainer)
- ``status.json``      replaced atomically: state, pid, step, max_iters, error (trainer)
- ``samples.jsonl``    prompts and generations (trainer at eval time, sampler)
- ``train.log``        the trainer's stdout/stderr
- ``checkpoints/step_NNNNNNN/``  complete checkpoints; ``meta.json`` inside is written
  last and marks the directory complete, so listing never needs torch
- ``lock``             held (flock) by the one trainer working on the run

Imports neither torch nor textual: the TUI and ``workbench runs`` use it directly.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from workbench.errors import WorkbenchError

STATES = ("starting", "running", "finished", "stopped", "early_stopped", "failed", "crashed")
LIVE_STATES = ("starting", "running")
CKPT_PREFIX = "step_"
TMP_PREFIX = ".tmp_"


class RunError(WorkbenchError):
    pass


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
        import difflib
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


# ----------------------------------------------------------------------------- atomic files

def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str, fsync: bool = True) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over ``path``.
    Readers see the old or the new file, never half of one (with or without the fsync,
    which only adds durability across power loss)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json_atomic(path: Path, obj: Any, fsync: bool = True) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n", fsync)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------- status

def process_start_time(pid: int) -> float | None:
    try:
        import psutil
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
        import psutil
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except Exception:
        pass
    return True


def write_status(run_dir: Path, **fields: Any) -> dict:
    """Merge ``fields`` into status.json and replace it atomically."""
    path = Path(run_dir) / "status.json"
    cur = read_json(path) or {}
    cur.update(fields)
    cur["updated"] = time.time()
    # No fsync: status is rewritten every log interval from the training loop, and an fsync
    # there cost more than a whole step of a small model. The rename keeps it atomic.
    write_json_atomic(path, cur, fsync=False)
    return cur


def read_status(run_dir: Path) -> dict:
    """status.json, with a live state whose process is gone reported as ``crashed``."""
    st = read_json(Path(run_dir) / "status.json") or {"state": "starting"}
    if st.get("state") in LIVE_STATES and not pid_alive(st.get("pid"), st.get("pid_start")):
        st = dict(st, state="crashed", error=st.get("error") or
                  "the trainer process is gone without saying why; see train.log, then `workbench resume`")
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


# ----------------------------------------------------------------------------- metrics

class MetricsWriter:
    """Appends one JSON object per line to metrics.jsonl and flushes each line."""

    def __init__(self, path: Path):
        self.f = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.f.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


class LineTail:
    """Complete lines appended to a file since the last call, by byte offset (never re-reading it).

    A half-written last line waits for its newline. If the file shrinks (replaced),
    reading starts again from the beginning.
    """

    def __init__(self, path: Path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset
        self._partial = b""

    def read_lines(self, max_bytes: int = 4 << 20) -> list[bytes]:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return []
        if size < self.offset:
            self.offset, self._partial = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(max_bytes)
        self.offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        return lines


class MetricsTail(LineTail):
    """The records appended to metrics.jsonl since the last call (see LineTail)."""

    def read_new(self, max_bytes: int = 4 << 20) -> list[dict]:
        out = []
        for line in self.read_lines(max_bytes):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out


def read_metrics(path: Path) -> list[dict]:
    """All records of a metrics file (for one-shot readers such as `workbench metrics`)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return []
    return MetricsTail(path).read_new(max_bytes=size + 1)


def last_records(path: Path, tail_bytes: int = 65536) -> list[dict]:
    """Records from the last ``tail_bytes`` of a metrics file, for quick summaries."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return []
    t = MetricsTail(path, offset=max(0, size - tail_bytes))
    recs = t.read_new(max_bytes=tail_bytes)
    return recs


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


def dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


# ----------------------------------------------------------------------------- summaries

@dataclass
class RunSummary:
    id: str
    path: str
    state: str
    preset: str
    step: int
    max_iters: int
    train_loss: float | None = None
    val_loss: float | None = None
    best_val_loss: float | None = None
    tokens_per_s: float | None = None
    mem_mb: float | None = None
    checkpoints: list[dict] = field(default_factory=list)
    disk_bytes: int = 0
    error: str | None = None
    started: float | None = None
    device: str | None = None
    est_mem_mb: float | None = None   # the estimator's figure for what mem_mb measures
    mem_err_pct: float | None = None  # (measured - estimate) / estimate


def first_event(path: Path, event: str, head_bytes: int = 16384) -> dict | None:
    try:
        with open(path, "rb") as f:
            head = f.read(head_bytes)
    except OSError:
        return None
    for line in head.split(b"\n"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("event") == event:
            return r
    return None


def estimate_for_run(run_dir: Path, device: str, precision: str) -> float | None:
    """MiB the estimator predicts for the figure the trainer logs as mem_mb
    (peak allocated on CUDA/MPS, the whole process's RSS on CPU)."""
    try:
        from workbench.config import load_preset_file
        from workbench.estimate import estimate_memory
        m = estimate_memory(load_preset_file(Path(run_dir) / "preset.toml"), precision, device)
    except Exception:
        return None
    return (m["total"] if device == "cpu" else m["peak_allocated"]) / 2**20


def summarize_run(run_dir: Path) -> RunSummary:
    import tomllib
    run_dir = Path(run_dir)
    st = read_status(run_dir)
    try:
        preset = tomllib.loads((run_dir / "preset.toml").read_text()).get("name", "?")
    except (OSError, ValueError):
        preset = "?"
    s = RunSummary(id=run_dir.name, path=str(run_dir), state=st.get("state", "?"), preset=preset,
                   step=int(st.get("step") or 0), max_iters=int(st.get("max_iters") or 0),
                   error=st.get("error"), started=st.get("started"),
                   best_val_loss=st.get("best_val_loss"))
    for r in last_records(run_dir / "metrics.jsonl"):
        if r.get("kind") == "train":
            s.train_loss, s.tokens_per_s = r.get("loss"), r.get("tokens_per_s")
            mem = r.get("mem_peak_rss_mb", r.get("mem_mb"))
            if mem is not None:
                s.mem_mb = max(s.mem_mb or 0.0, mem)
        elif r.get("kind") == "eval":
            s.val_loss = r.get("val_loss")
    start = first_event(run_dir / "metrics.jsonl", "start")
    if start and start.get("device"):
        s.device = start["device"].split(":")[0]
        s.est_mem_mb = estimate_for_run(run_dir, s.device, start.get("precision", "fp32"))
        if s.est_mem_mb and s.mem_mb:
            s.mem_err_pct = 100.0 * (s.mem_mb - s.est_mem_mb) / s.est_mem_mb
    s.checkpoints = list_checkpoints(run_dir)
    if s.best_val_loss is None:
        b = best_checkpoint(s.checkpoints)
        s.best_val_loss = b["val_loss"] if b else None
    s.disk_bytes = dir_size(run_dir)
    return s


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"
