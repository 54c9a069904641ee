"""The tailer: one background thread that follows the runs the panes show.

Every ``interval`` seconds it reads, for each watched run, only the bytes
appended to ``metrics.jsonl`` and ``train.log`` since last time (by byte offset,
never re-reading a file), plus the small ``status.json`` and ``tasks.jsonl`` (task
scores from ``workbench eval``: read whole, when its size or time changed), and
hands what changed to ``post``. It never touches widgets: ``post`` is the app's ``post_message``.

Plain Python apart from the message type (and Textual's log), so the offset logic is easy to test.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

from textual import log

from workbench.rundir import (
    LOG_FILE,
    METRICS_FILE,
    STATUS_FILE,
    TASKS_FILE,
    LineTail,
    MetricsTail,
    RunStatus,
    read_status,
)
from workbench.tui.messages import RunUpdated

LOG_TAIL_BYTES = 16384  # how much of an existing train.log to show on first attach


class LogTail(LineTail):
    """New complete lines of a text file, by byte offset; starts near the end of the file."""

    def __init__(self, path: Path, start_tail_bytes: int = LOG_TAIL_BYTES):
        super().__init__(path)
        self.start_tail_bytes = start_tail_bytes
        self._started = False

    def read_new(self, max_bytes: int = 1 << 20) -> list[str]:
        skip_first = False
        if not self._started:
            try:
                size = os.path.getsize(self.path)
            except OSError:
                return []
            self._started = True
            self.offset = max(0, size - self.start_tail_bytes)
            skip_first = self.offset > 0  # we probably landed mid-line
        lines = self.read_lines(max_bytes)
        if skip_first and lines:
            lines = lines[1:]
        # a trainer's progress output may use \r; show the last state of such a line
        return [ln.decode("utf-8", "replace").rsplit("\r", 1)[-1] for ln in lines]


class _Watched:
    def __init__(self, run_dir: Path, with_log: bool):
        self.run_dir = run_dir
        self.metrics = MetricsTail(run_dir / METRICS_FILE)
        self.log = LogTail(run_dir / LOG_FILE) if with_log else None
        self.status_mtime: float | None = None
        self.status: RunStatus | None = None
        self.last_state: str | None = None
        self.tasks_sig: tuple[int, int] | None = None   # (size, mtime) of tasks.jsonl when last read


class RunWatcher:
    """Follows a set of run directories; ``poll_once`` is one pass, ``run`` loops."""

    def __init__(self, runs_dir: Path, post: Callable[..., object], interval: float = 1.0):
        self.runs_dir = runs_dir
        self.post = post
        self.interval = interval
        self._lock = threading.Lock()
        self._want: dict[str, bool] = {}  # run id -> also tail train.log
        self._watched: dict[str, _Watched] = {}
        self._fresh_log: set[str] = set()  # runs whose train.log tail should start over
        self.wake = threading.Event()
        self.stopped = threading.Event()

    def watch(self, run_id: str, with_log: bool = False, fresh_log: bool = False) -> None:
        """Follow ``run_id``; ``with_log`` also tails train.log, ``fresh_log`` restarts that tail
        (from the last few KB) because the pane showing it was cleared."""
        with self._lock:
            self._want[run_id] = self._want.get(run_id, False) or with_log
            if fresh_log:
                self._fresh_log.add(run_id)
        self.wake.set()

    def unwatch(self, run_id: str) -> None:
        with self._lock:
            self._want.pop(run_id, None)

    def poll_once(self) -> int:
        """Read what is new in every watched run and post it; returns how many runs changed."""
        with self._lock:
            want = dict(self._want)
            fresh, self._fresh_log = self._fresh_log, set()
        for rid in list(self._watched):
            if rid not in want:
                del self._watched[rid]
        changed = 0
        for rid, with_log in want.items():
            w = self._watched.get(rid)
            if w is None:
                w = self._watched[rid] = _Watched(self.runs_dir / rid, with_log)
            elif with_log and (w.log is None or rid in fresh):
                w.log = LogTail(w.run_dir / LOG_FILE)  # metrics keep their offset: no duplicates
            records: list[dict] = []
            while True:  # a long history arrives in 4 MB pieces
                batch = w.metrics.read_new()
                if not batch:
                    break
                records.extend(batch)
            status_changed = self._read_status(w)
            assert w.status is not None  # (read above: a run never read has no state, so it is never skipped)
            lines = w.log.read_new() if w.log else []
            task_file = self._read_tasks(w)
            if records or status_changed or lines or task_file is not None:
                changed += 1
                self.post(RunUpdated(rid, records, w.status, lines, task_file))
        return changed

    @staticmethod
    def _read_tasks(w: _Watched) -> list[dict] | None:
        """Every record of tasks.jsonl when it changed since the last call (``[]``: it is gone), else None.
        It is small (a few records per checkpoint scored), so it is read whole: that also copes with a
        file replaced rather than appended to."""
        path = w.run_dir / TASKS_FILE
        try:
            st = os.stat(path)
            sig: tuple[int, int] | None = (st.st_size, st.st_mtime_ns)
        except OSError:
            sig = None
        if sig == w.tasks_sig:
            return None
        w.tasks_sig = sig
        return MetricsTail(path).read_new(max_bytes=sig[0] + 1) if sig else []

    def _read_status(self, w: _Watched) -> bool:
        path = w.run_dir / STATUS_FILE
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            mtime = None
        # a live run's status must be re-checked even unchanged: its process may have died
        if mtime == w.status_mtime and w.last_state not in ("starting", "running", None):
            return False
        st = read_status(w.run_dir) if w.run_dir.is_dir() else RunStatus(state="deleted")
        w.status_mtime = mtime
        changed = st != w.status
        w.status, w.last_state = st, st.state
        return changed

    def run(self, cancelled: Callable[[], bool]) -> None:
        while not cancelled() and not self.stopped.is_set():
            try:
                self.poll_once()
            except Exception as e:  # keep following the other runs
                log.error(f"watcher: {e!r}")
            self.wake.wait(self.interval)
            self.wake.clear()
