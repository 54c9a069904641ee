"""Load on the machine, as a busy neighbour makes it: processes that spin on every CPU for a block."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def cpu_hog() -> Iterator[list[subprocess.Popen]]:
    """Two processes spinning per CPU for the block (yielded, so a test can tell them apart): a calibration beside
    them gets about a third of the machine on two cores, whatever else (another test worker) runs there too."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * _cpus())]
    try:
        time.sleep(0.3)  # every one of them spinning
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
