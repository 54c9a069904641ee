"""Starting trainers: in this process (foreground) or detached in their own session.

Torch-free: the TUI may import it. The trainer itself is ``python -m workbench.train``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from workbench import rundir


def start_detached(run_dir: Path, resume: bool = False, checkpoint: str | None = None) -> int:
    """Start the trainer in a new session (closing a terminal or the TUI does not stop it)."""
    cmd = [sys.executable, "-m", "workbench.train", str(run_dir), "--detached"]
    if resume:
        cmd.append("--resume")
        if checkpoint:
            cmd += ["--checkpoint", str(checkpoint)]
    log = open(Path(run_dir) / "train.log", "a", encoding="utf-8")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=env, close_fds=True)
    log.close()
    rundir.write_status(run_dir, state="starting", pid=proc.pid,
                        pid_start=rundir.process_start_time(proc.pid), error=None)
    return proc.pid


def run_foreground(run_dir: Path, resume: bool = False, checkpoint: str | None = None) -> int:
    from workbench.train.loop import Trainer  # imports torch
    return Trainer(Path(run_dir), resume=resume, checkpoint=checkpoint, echo=True).run()
