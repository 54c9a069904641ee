"""What a test session builds once and every test worker reads: a real run that several modules train alike.

A session fixture is per process, and pytest-xdist runs two: a run every worker needs was trained once on each.
:func:`built_once` builds a directory once for the whole session: in the temporary directory the workers share,
under a file lock, the first worker to ask builds it and the others wait and then read it. A build that failed
leaves no completion mark, so the next worker to ask builds it anew (and fails the same way, in its own test).
Callers copy what their tests write into (a run's picks, a DPO run beside it) to a directory of their own."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

DONE = ".built"


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The directory ``name`` that ``build(directory)`` filled, built once for the session whatever the number of
    workers (without xdist: in this session's own temporary directory)."""
    base = tmp_path_factory.getbasetemp()
    # under xdist each worker's base is <the session's>/popen-gwN: the session's is the one the workers share
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / f"built-{name}"
    with FileLock(str(out) + ".lock"):
        if not (out / DONE).is_file():
            shutil.rmtree(out, ignore_errors=True)   # a build that failed half-way
            out.mkdir(parents=True)
            build(out)
            (out / DONE).touch()
    return out
