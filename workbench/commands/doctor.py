"""`workbench doctor RUN`: what is wrong with a run (slow, unstable, memory, overfitting, data), the
numbers that show it, and what to change. The diagnosis is ``workbench.analysis.doctor``; this prints it, with
what the queue says of the run and of the runs directory (``workbench.queue.doctor``): a run still queued, which
has no directory yet, is told as such."""

from __future__ import annotations

import argparse
import json
import textwrap
import time

from workbench import rundir
from workbench.analysis.doctor import Finding, diagnose, read_run, report
from workbench.commands.common import add_json_option, add_run_argument
from workbench.machine.activity import take_snapshot
from workbench.queue.doctor import QueueLook, look
from workbench.queue.store import QueueError

WIDTH = 100


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="diagnose a run: slow, unstable, memory, overfitting, data",
                       description="Check a live or finished run against its own metrics, its estimate and this "
                                   "machine (for a live run, what else uses the CPU and GPU, sampled for "
                                   "--interval seconds), and say what to change.")
    add_run_argument(p, "run id (a directory under the runs directory) or path")
    add_json_option(p, "machine-readable output (schema: docs/reference/doctor.md)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds to sample CPU and GPU use by process, for a live run (default 1)")
    p.set_defaults(func=run)


def _wrap(label: str, text: str) -> list[str]:
    pad = " " * 13
    return textwrap.wrap(text, WIDTH, initial_indent=f"   {label:<10}", subsequent_indent=pad,
                         break_on_hyphens=False, break_long_words=False) or [f"   {label}"]


def run(args: argparse.Namespace) -> int:
    root = args.runs_dir
    notes: list[str] = []
    try:
        queue = look(root)
    except QueueError as e:
        queue = None
        notes.append(f"the queue: {e}")
    try:
        run_dir = rundir.resolve_run(root, args.run)
    except rundir.RunError:
        if queue is None or queue.state_of(args.run) is None:
            raise
        return _not_started(args, queue)
    facts = read_run(run_dir)
    pid = facts.status.pid if facts.live else None
    snapshot = take_snapshot(int(pid) if pid else None, interval=max(0.1, args.interval))
    findings = sorted(diagnose(facts, snapshot, notes) + (queue.findings() if queue else []), key=Finding.sort_key)
    in_queue = _in_queue(queue, facts.run_id)
    if args.json:
        print(json.dumps({**report(facts, findings, notes, snapshot), "queue": in_queue}, indent=1))
        return 0
    p = facts.preset
    where = f", {p.name} on {facts.device}" if p and facts.device else ""
    print(f"run {facts.run_id} ({facts.state}, step {facts.step:,}/{facts.max_iters:,}{where}): "
          + (f"{len(findings)} finding(s), most important first" if findings else "no problems found"))
    _print(findings, notes, in_queue)
    return 0


def _in_queue(queue: QueueLook | None, name: str) -> dict | None:
    """``--json``'s ``queue``: the run's state and line in the queue, and the queue's line (None: no queue)."""
    if queue is None:
        return None
    return {"state": queue.state_of(name), "run": queue.about(name), "queue": queue.line(),
            "runner_pid": queue.runner}


def _not_started(args: argparse.Namespace, queue: QueueLook) -> int:
    """A run the queue has not started (queued; refused or removed from a sweep): nothing of its own to check."""
    name = args.run
    findings = queue.findings()
    in_queue = _in_queue(queue, name)
    assert in_queue is not None  # a queue given: its facts, never None
    notes = ["the run has no directory yet (the queue has not started it): nothing of its own to check"]
    if args.json:
        print(json.dumps({"run": name, "path": None, "state": in_queue["state"], "step": 0, "max_iters": None,
                          "preset": None, "device": None, "checked_at": round(time.time(), 3), "ok": not findings,
                          "findings": [f.to_dict() for f in findings], "notes": notes, "activity": None,
                          "queue": in_queue}, indent=1))
        return 0
    state = {"queued": "queued, not started yet", "refused": "refused by its sweep",
             "removed": "removed from the queue"}.get(in_queue["state"], f"{in_queue['state']} in the queue")
    print(f"run {name} ({state}; no run directory): "
          + (f"{len(findings)} finding(s), most important first" if findings else "no problems found"))
    _print(findings, notes, in_queue)
    return 0


def _print(findings: list[Finding], notes: list[str], in_queue: dict | None) -> None:
    for label, key in (("in queue", "run"), ("queue", "queue")):
        if in_queue and in_queue[key]:
            for line in _wrap(label, in_queue[key]):
                print(line)
    for i, f in enumerate(findings, 1):
        print()
        print(f"{i}. [{f.severity}] {f.kind}: {f.title}")
        for e in f.evidence:
            for line in _wrap("evidence", e):
                print(line)
        for line in _wrap("change", f.change):
            print(line)
        if f.command and f.command not in f.change:
            for line in _wrap("", f.command):
                print(line)
        for a in f.also:
            for line in _wrap("also", a):
                print(line)
    if notes:
        print()
        for n in notes:
            print(f"not checked: {n}")
