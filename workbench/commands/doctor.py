"""`workbench doctor RUN`: what is wrong with a run (slow, unstable, memory, overfitting, data), the
numbers that show it, and what to change. The diagnosis is ``workbench.analysis.doctor``; this prints it."""

from __future__ import annotations

import json
import textwrap

from workbench import rundir
from workbench.analysis.doctor import diagnose, read_run, report
from workbench.commands.common import add_json_option, add_run_argument
from workbench.machine.activity import take_snapshot

WIDTH = 100


def register(sub) -> None:
    p = sub.add_parser("doctor", help="diagnose a run: slow, unstable, memory, overfitting, data",
                       description="Check a live or finished run against its own metrics, its estimate and this "
                                   "machine (for a live run, what else uses the CPU and GPU, sampled for "
                                   "--interval seconds), and say what to change.")
    add_run_argument(p, "run id (a directory under the runs directory) or path")
    add_json_option(p, "machine-readable output (schema in the README)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds to sample CPU and GPU use by process, for a live run (default 1)")
    p.set_defaults(func=run)


def _wrap(label: str, text: str) -> list[str]:
    pad = " " * 13
    return textwrap.wrap(text, WIDTH, initial_indent=f"   {label:<10}", subsequent_indent=pad,
                         break_on_hyphens=False, break_long_words=False) or [f"   {label}"]


def run(args) -> int:
    root = args.runs_dir
    run_dir = rundir.resolve_run(root, args.run)
    facts = read_run(run_dir)
    pid = facts.status.pid if facts.live else None
    snapshot = take_snapshot(int(pid) if pid else None, interval=max(0.1, args.interval))
    notes: list[str] = []
    findings = diagnose(facts, snapshot, notes)
    if args.json:
        print(json.dumps(report(facts, findings, notes, snapshot), indent=1))
        return 0
    p = facts.preset
    where = f", {p.name} on {facts.device}" if p and facts.device else ""
    print(f"run {facts.run_id} ({facts.state}, step {facts.step:,}/{facts.max_iters:,}{where}): "
          + (f"{len(findings)} finding(s), most important first" if findings else "no problems found"))
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
    return 0
