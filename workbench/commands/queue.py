"""`workbench queue`: line runs up and walk away. add / ls / run / pause / resume / rm / move; the queue is
``workbench.queue`` (a SQLite database in the runs directory), this parses and prints."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from workbench.commands.common import (
    add_corpus_option,
    add_init_from_option,
    add_json_option,
    add_set_option,
    calibrated,
    time_budget_arg,
)
from workbench.machine.detect import Machine, detect
from workbench.queue.admit import admit
from workbench.queue.outcome import others_text
from workbench.queue.runner import Runner, RunnerBusy, runner_pid
from workbench.queue.store import NewItem, QueueError, QueueStore
from workbench.queue.view import rows

LOG_FILE = "queue.log"
STORAGE_ENV = "WORKBENCH_STORAGE"   # --storage's URL, kept off the command line (where `ps` shows a password)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("queue", help="a queue of runs, started one after the other by a runner",
                       description="Runs queued here start one at a time (`queue run`), each its own trainer as "
                                   "`train --detach` starts one. The queue is runs/queue.db; it survives the TUI, "
                                   "the runner's kill -9 and a reboot (run `queue run` again: it resumes the "
                                   "interrupted run from its last checkpoint and goes on).")
    qs = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = qs.add_parser("add", help="queue a run (the arguments of `workbench train`)")
    a.add_argument("preset", help="preset name or path to a .toml")
    add_corpus_option(a, " (default: the preset's data.corpus)")
    a.add_argument("--name", default=None, help="run id (default: <preset>-<date>-<time>); must be free")
    add_init_from_option(a)
    add_set_option(a)
    a.add_argument("--time-budget", metavar="DURATION", default=None,
                   help="train for this long (45m, 2h, 90s) instead of max_iters")
    a.add_argument("--yes", action="store_true", help="queue it even when the estimate says it will not fit")
    a.set_defaults(func=cmd_add)
    ls = qs.add_parser("ls", help="the queue: each run's state, place, progress, and how it ended")
    add_json_option(ls, "one JSON object per run")
    ls.set_defaults(func=cmd_ls)
    r = qs.add_parser("run", help="start the queued runs one after the other (one runner at a time)")
    r.add_argument("--follow", action="store_true", help="keep waiting for new runs when the queue is empty")
    r.add_argument("--slots", default=None, metavar="N",
                   help="runs at once: on a CPU machine N runs, each one process with cores // N threads "
                        "(OMP_NUM_THREADS, hardware.num_threads); on a GPU machine at most N (default: one run a GPU, "
                        "each through CUDA_VISIBLE_DEVICES; a run with hardware.nproc = K takes K free GPUs); with "
                        "--storage: N trials of the shared study at once, placed the same way (one GPU a trial)")
    r.add_argument("--storage", default=None, metavar="URL",
                   help="work on the sweeps of a shared study database (postgresql://USER:PASSWORD@HOST/DB, "
                        "mysql://...): run this on each machine; each takes the next trial, a dead one's trial is "
                        f"retried elsewhere (see `workbench sweep --storage`); default: ${STORAGE_ENV}")
    r.add_argument("--sweep", action="append", default=None, metavar="NAME",
                   help="with --storage: only this sweep (repeatable; default: every sweep in the database)")
    r.add_argument("--heartbeat", type=int, default=None, metavar="SECONDS",
                   help="with --storage: how often this worker says it is alive (default 10); a trial whose worker "
                        "is silent for 3 heartbeats is failed and retried once by another worker")
    r.add_argument("--detach", action="store_true",
                   help=f"run the runner in the background (its log: runs/{LOG_FILE}) and return")
    r.set_defaults(func=cmd_run)
    ps = qs.add_parser("pause", help="start nothing more (the running run goes on)")
    ps.set_defaults(func=cmd_pause)
    rs = qs.add_parser("resume", help="start queued runs again after a pause")
    rs.set_defaults(func=cmd_resume)
    rm = qs.add_parser("rm", help="take runs out of the queue (their run directories are kept)")
    rm.add_argument("names", nargs="+", metavar="NAME")
    rm.set_defaults(func=cmd_rm)
    mv = qs.add_parser("move", help="put a queued run at another place (1: next to start)")
    mv.add_argument("name", metavar="NAME")
    mv.add_argument("position", metavar="POSITION", type=_position)
    mv.set_defaults(func=cmd_move)


def _slots(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise QueueError(f"--slots {text} is not a number of slots; give 1 or more (--slots 2: two runs at once)")
    return n


def _position(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a position; give a number, 1 for next") from None


def cmd_add(args: argparse.Namespace) -> int:
    budget = time_budget_arg(args.time_budget)  # a bad one is the flag's (checked before anything is estimated)
    info = calibrated(detect(), args.preset) if budget else detect()
    new = NewItem(args.preset, tuple(args.overrides), tuple(args.corpus or ()), budget, args.init_from, args.yes,
                  args.name)
    adm = admit(args.runs_dir, new, Machine.from_info(info), info)
    if adm.refused:
        raise QueueError(f"{args.preset} {adm.refused}; queue it anyway with --yes, or `workbench fit` a preset "
                         "that fits")
    if adm.check.budget_problem and not args.yes:  # what `train` would refuse when the runner starts it
        raise QueueError(f"{adm.check.budget_problem} (queue it anyway with --yes)")
    store = QueueStore(args.runs_dir)
    item = store.add(adm.item)
    queued = store.items(("queued",))
    at = next(k for k, i in enumerate(queued, 1) if i.id == item.id)
    print("estimate: " + "; ".join(adm.check.lines()))
    print(f"queued {item.name} at position {at} of {len(queued)}"
          + ("" if runner_pid(args.runs_dir) else "; `workbench queue run` starts the queue"))
    print(item.name)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    store = QueueStore.open_existing(args.runs_dir, readonly=True)
    alive = runner_pid(args.runs_dir)
    listed = rows(store, alive is not None) if store else []
    if args.json:
        print(json.dumps({"paused": bool(store and store.paused()), "runner_pid": alive,
                          "runs": [r.to_dict() for r in listed]}, indent=1))
        return 0
    if store is None or not listed:
        print(f"the queue of {args.runs_dir} is empty; `workbench queue add PRESET` adds a run")
        return 0
    head = ("#", "run", "state", "progress", "val", "others", "where", "settings")
    table = [(str(r.position or ""), r.name, r.state, r.progress(),
              f"{r.item.metric:.4f}" if r.item.metric is not None else "", others_text(r.item.others_cpu),
              r.item.place or "", r.settings())
             for r in listed]
    widths = [max(len(h), *(len(t[k]) for t in table)) for k, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    for r, t in zip(listed, table):
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())
        for note in (r.note if r.state not in ("queued",) else "", r.beside):
            if note:
                print(f"    {note}")
    print(_footer(store, alive))
    return 0


def _footer(store: QueueStore, alive: int | None) -> str:
    queued = len(store.items(("queued",)))
    runner = f"runner pid {alive}" if alive else "no runner (`workbench queue run` starts one)"
    return f"{queued} queued; {'paused; ' if store.paused() else ''}{runner}"


def cmd_run(args: argparse.Namespace) -> int:
    root = args.runs_dir
    args.slots = _slots(args.slots)
    args.storage = args.storage or os.environ.get(STORAGE_ENV) or None
    if args.storage is None and (args.sweep or args.heartbeat):
        raise QueueError("--sweep and --heartbeat go with --storage URL (a shared study database)")
    if args.heartbeat is not None and args.heartbeat < 1:
        raise QueueError(f"--heartbeat {args.heartbeat} is not a number of seconds; give 1 or more")
    if args.storage is not None:
        return _run_worker(args)
    if args.detach:
        if (pid := runner_pid(root)):
            raise RunnerBusy(f"a queue runner (pid {pid}) is already running on {root}: one runner at a time")
        root.mkdir(parents=True, exist_ok=True)
        log = open(root / LOG_FILE, "a", encoding="utf-8")
        argv = [sys.executable, "-m", "workbench", "queue", "run", *(["--follow"] if args.follow else []),
                *(["--slots", str(args.slots)] if args.slots else []), "--runs-dir", str(root)]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
        log.close()
        print(f"queue runner started (pid {proc.pid}); its log: {root / LOG_FILE}; `workbench queue ls` shows "
              "the queue")
        return 0
    runner = Runner(root, log=lambda m: print(m, flush=True), follow=args.follow, slots=args.slots)
    try:
        return runner.run()
    except KeyboardInterrupt:
        running = [i.name for i in runner.store.items(("running",))]
        if running:
            print(f"runner stopped; {', '.join(running)} go{'es' if len(running) == 1 else ''} on training; "
                  "`workbench queue run` again adopts them", file=sys.stderr)
        raise


def _run_worker(args: argparse.Namespace) -> int:
    """A worker on a shared study database: the next trial of its sweeps, here, until none is left."""
    from workbench.queue.distributed import HEARTBEAT_S, Worker, masked, slot_placements
    if args.slots:   # more slots than GPUs: said here, not in the background worker's log
        slot_placements(args.slots, detect(), dict(os.environ))
    if args.detach:
        root = args.runs_dir
        root.mkdir(parents=True, exist_ok=True)
        log = open(root / LOG_FILE, "a", encoding="utf-8")
        # the URL through the environment: a password on a command line is seen by every user's `ps`
        argv = [sys.executable, "-m", "workbench", "queue", "run",
                *(a for n in args.sweep or () for a in ("--sweep", n)),
                *(["--heartbeat", str(args.heartbeat)] if args.heartbeat else []),
                *(["--slots", str(args.slots)] if args.slots else []), "--runs-dir", str(root)]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True,
                                env=dict(os.environ, **{STORAGE_ENV: args.storage}))
        log.close()
        print(f"worker started (pid {proc.pid}) on {masked(args.storage)}; its log: {root / LOG_FILE}")
        return 0
    worker = Worker(args.storage, args.runs_dir, detect(), log=lambda m: print(m, flush=True),
                    heartbeat=args.heartbeat or HEARTBEAT_S, slots=args.slots)
    return worker.run(args.sweep)


def cmd_pause(args: argparse.Namespace) -> int:
    store = QueueStore(args.runs_dir)
    store.set_paused(True)
    running = store.items(("running",))
    on = f"; {running[0].name} goes on to its end" if running else ""
    print(f"queue paused: nothing more starts{on}; `workbench queue resume` goes on")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    store = QueueStore(args.runs_dir)
    store.set_paused(False)
    n = len(store.items(("queued",)))
    tail = "" if runner_pid(args.runs_dir) else "; `workbench queue run` starts them"
    print(f"queue resumed: {n} queued{tail}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    store = QueueStore(args.runs_dir)
    for name in args.names:  # each checked first: a bad name removes nothing
        if (item := store.get(name)).state == "running":
            raise QueueError(f"{name} is running; stop it first with `workbench stop {name}` (the queue then goes "
                             "on), then remove it")
    for name in args.names:
        item = store.remove(name)
        kept = f" (its run directory {args.runs_dir / name} is kept)" if (args.runs_dir / name).exists() else ""
        print(f"removed {item.name} ({item.state}) from the queue{kept}")
    return 0


def cmd_move(args: argparse.Namespace) -> int:
    store = QueueStore(args.runs_dir)
    at = store.move(args.name, args.position)
    print(f"{args.name} is now at position {at} of {len(store.items(('queued',)))}")
    return 0

