"""`workbench stop`: ask a running trainer to save a checkpoint and exit (SIGTERM)."""

from __future__ import annotations

import argparse
import os
import signal
import time

from workbench import rundir
from workbench.commands.common import add_run_argument


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stop", help="stop a run (it saves a checkpoint first)")
    add_run_argument(p)
    p.add_argument("--no-wait", action="store_true", help="return at once instead of waiting for the save")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default 300)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = args.runs_dir
    run_dir = rundir.resolve_run(root, args.run)
    st = rundir.read_status(run_dir)
    if not st.live:
        raise rundir.RunError(f"run {run_dir.name} is not running (state: {st.state}); "
                              f"nothing to stop")
    pid = st.pid
    assert pid is not None  # read_status reports a live state only for a process it found alive
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise rundir.RunError(f"run {run_dir.name}: its trainer (pid {pid}) is gone") from None
    print(f"asked run {run_dir.name} (pid {pid}) to stop; it saves a checkpoint first")
    if args.no_wait:
        return 0
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        st = rundir.read_status(run_dir)
        if not st.live:
            print(f"run {run_dir.name}: {st.state} at step {st.step}")
            return 0 if st.state in ("stopped", "finished", "early_stopped") else 1
        time.sleep(0.2)
    print(f"run {run_dir.name} is still saving after {args.timeout:.0f} s; check `workbench runs`")
    return 1
