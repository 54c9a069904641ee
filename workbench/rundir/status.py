"""``status.json``, the one file of a run that is replaced whole: written by the launcher, the trainer and
``workbench import`` through :func:`write_status`, read by everyone through :func:`read_status` (which
tells a live run from one whose trainer process is gone). The record itself is
:class:`workbench.rundir.records.RunStatus`."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import psutil

from workbench.fs import read_json, write_json_atomic
from workbench.rundir.names import STATUS_FILE
from workbench.rundir.records import RunStatus


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
    path = Path(run_dir) / STATUS_FILE
    st = dataclasses.replace(RunStatus.from_dict(read_json(path)), **fields,
                             updated=time.time() if now is None else now)
    # No fsync: status is rewritten every log interval from the training loop, and an fsync
    # there cost more than a whole step of a small model. The rename keeps it atomic.
    write_json_atomic(path, st.to_dict(), fsync=False)
    return st


def read_status(run_dir: Path) -> RunStatus:
    """status.json, with a live state whose process is gone reported as ``crashed``."""
    raw = read_json(Path(run_dir) / STATUS_FILE)
    st = RunStatus.from_dict(raw) if isinstance(raw, dict) else RunStatus(state="starting")
    if st.live and not pid_alive(st.pid, st.pid_start):
        st = dataclasses.replace(st, state="crashed", error=st.error or
                                 "the trainer process is gone without saying why; see train.log, then "
                                 "`workbench resume`")
    return st


__all__ = ["pid_alive", "process_start_time", "read_status", "write_status"]
