"""``workbench queue run``: start the queued runs, each its own detached trainer, and record how each ended;
one at a time, or several at once where the machine has room (``--slots N`` on a CPU machine, one run a GPU on a
machine with GPUs: :mod:`workbench.queue.devices` places them, each watched in a thread); one runner per runs
directory (``queue.lock``, an flock the OS drops when the runner
dies, however it dies).

Nothing that matters lives in the runner: the queue is in ``queue.db`` and each run in its directory. So a
runner started after another died (kill -9, a reboot) first looks at the item the last one left ``running``:

- its trainer is alive (only the runner died): it is adopted and watched to its end;
- its trainer ended while no runner watched: its end is recorded;
- its trainer died too (a reboot, a crash): it is resumed from its last complete checkpoint through
  ``workbench resume`` (bitwise, as a resume is), or started again when it died before its first checkpoint
  (the directory it left is kept beside it as ``NAME-try1``, a crashed run). A run whose trainer died
  ``MAX_LAUNCHES`` times is failed, so one that cannot run does not hold the queue forever.

While a trainer trains, the runner samples what other processes use of the machine (``OthersLoad``: their CPU,
and their processes on the run's GPU where NVML answers; the trainer's processes and the runner's are not
others, nor are the queue's other runs, which the user asked to run side by side) and records it with the run
when it ends (``others_cpu``, ``others``): a trial that ran beside a busy neighbour is flagged, its result not
comparable. A trainer adopted from a dead runner is measured from then on.
On a machine with an NVIDIA GPU it also records the GPU's free memory just before each trainer starts and once
its process has exited (``gpu_free_before``, ``gpu_free_after``): every trial is its own process, so a trial
that left memory behind, or a neighbour that took some, shows as a difference between trials.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

import psutil

from workbench import rundir
from workbench.cli_client import CliError
from workbench.errors import WorkbenchError
from workbench.fs import PidLock
from workbench.machine.activity import OthersLoad, run_processes
from workbench.machine.detect import detect, gpu_free_mib
from workbench.queue import devices as devices_mod
from workbench.queue import rounds, sweep
from workbench.queue.launch import CliLauncher
from workbench.queue.outcome import Metric, beside_note, failure_line, final_metric, run_metric
from workbench.queue.placing import Placing
from workbench.queue.store import ENDED, Item, QueueError, QueueStore
from workbench.queue.sweep_results import sweep_metric

LOCK_FILE = "queue.lock"
MAX_LAUNCHES = 3          # starts and resumes of one run before it is failed
POLL_S = 0.5              # how often a running trainer's status is read
GONE_S = 20.0            # how long an ended trainer's process may take to exit (its GPU memory freed)
ADOPT_GRACE_S = 3.0       # a run the last runner was launching: how long its directory may take to appear


class RunnerBusy(QueueError):
    pass


class RunnerLock(PidLock):
    """One runner per runs directory: an flock on ``queue.lock`` holding the runner's pid."""

    def __init__(self, root: Path):
        super().__init__(Path(root) / LOCK_FILE)

    def acquire(self) -> "RunnerLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        holder = self.try_acquire()
        if holder is not None:
            raise RunnerBusy(f"a queue runner (pid {holder}) is already running on {self.path.parent}: one runner "
                             "at a time; it starts what you queue, so nothing more is needed")
        return self

    def __enter__(self) -> "RunnerLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def runner_pid(root: Path) -> int | None:
    """The pid of the runner working on ``root``'s queue, None when there is none (checked without taking
    the lock from it)."""
    return RunnerLock(root).holder()


class Runner(Placing):
    """Runs the queue of ``root`` until nothing is left to start (``follow``: waits for more).

    Several runs at once where the machine has room (:mod:`workbench.queue.devices`, through
    :class:`~workbench.queue.placing.Placing`): ``slots`` runs on a CPU machine (the cores divided), one a GPU on a
    machine with GPUs (``slots`` caps that). Each run is watched by a runner of its own in a thread (its own
    database connection), placed where it trains (``placement``)."""

    def __init__(self, root: Path, log: Callable[[str], None] = print, follow: bool = False,
                 launcher: CliLauncher | None = None, poll: float = POLL_S, slots: int | None = None,
                 devices: list[devices_mod.Device] | None = None, info: dict | None = None,
                 placement: devices_mod.Placement | None = None):
        self.root = Path(root)
        self.log = log
        self.follow = follow
        self.poll = poll
        self.launcher = launcher or CliLauncher(self.root)
        self.store = QueueStore(self.root)
        self.info = detect() if info is None else info
        self.given_devices = devices     # a described inventory (tests); None: NVML's, read again as runs start
        self.slots = slots
        self.placement = placement       # a runner watching one run: where that run trains
        self.cores = max(1, int((self.info.get("cpu") or {}).get("physical_cores") or os.cpu_count() or 1))
        self.ran = 0
        self.loads: dict[int, OthersLoad] = {}   # what other processes used while each item trained, by item id
        self.queue_pids: dict[int, set[int]] = {}  # the queue's other trainers seen while each item trained
        self.active: dict[int, tuple[threading.Thread, devices_mod.Placement]] = {}
        self.needs: dict[int, devices_mod.Need] = {}
        self.waiting_for: int | None = None
        self._lock = threading.Lock()

    def say(self, msg: str) -> None:
        where = f"[{self.placement.label}] " if self.placement and self.placement.label else ""
        self.log(f"{time.strftime('%H:%M:%S')} {where}{msg}")

    def run(self) -> int:
        with RunnerLock(self.root):
            devs = self.devices()
            cap = devices_mod.capacity(devs, self.slots)
            if devs:
                where = f"{len(devs)} GPU(s), up to {cap} run(s) at once, one a GPU"
            elif self.slots:
                where = f"{cap} CPU slot(s) of {max(1, self.cores // cap)} thread(s) each ({self.cores} cores)"
            else:
                where = "one run at a time"
            self.say(f"queue runner {os.getpid()} on {self.root}: {where}")
            for item in self.store.items(("running",)):
                self.say(f"{item.name} was running when the last runner stopped: looking at it")
                self.spawn(item, self.placement_of(item, cap), recovering=True)
            self._sweeps_catch_up()
            rounds.catch_up(self.store, self.say)   # a chain's next round a dead runner left unqueued
            while True:
                self.reap()
                if len(self.active) < cap and self.start_next(cap):
                    continue
                if not self.active and self.waiting_for is None:
                    if self.follow:
                        time.sleep(max(self.poll, 1.0))
                        continue
                    if self.store.next_queued() is None:
                        break
                time.sleep(self.poll)
            queued = len(self.store.items(("queued",)))
            why = "the queue is paused" if queued and self.store.paused() else "nothing left to start"
            self.say(f"{why}: {self.ran} run(s) ended here, {queued} queued")
        return 0

    # ------------------------------------------------------------------ placing runs

    def start_next(self, cap: int) -> bool:
        """Start the next queued run if it has a place now (True: one was started, or failed as never fitting)."""
        item = self.store.next_queued()
        if item is None:
            self.waiting_for = None
            return False
        placement, never = self.place(item, cap)
        if never:
            claimed = self.store.claim_next(only=item.id)
            if claimed is not None:
                self.end(claimed, "failed", f"cannot run on this machine: {never}")
            return claimed is not None
        if placement is None:
            if self.waiting_for != item.id:
                need = self.needs.get(item.id)
                mib = f" with ~{need.mib:,.0f} MiB free" if need and need.mib else ""
                self.say(f"{item.name} waits for {need.gpus if need else 1} free GPU(s){mib}")
            self.waiting_for = item.id
            return False
        self.waiting_for = None
        claimed = self.store.claim_next(only=item.id, place=placement.label, gpus=placement.gpus,
                                        slot=placement.slot)
        if claimed is None:  # moved, removed or paused since it was read
            return False
        self.spawn(claimed, placement)
        return True

    def spawn(self, item: Item, placement: devices_mod.Placement, recovering: bool = False) -> None:
        """Watch ``item`` in a thread of its own, by a runner that starts its trainer where ``placement`` says."""
        placed = getattr(self.launcher, "placed", None)
        launcher = placed(placement.env) if placed and placement.env else self.launcher

        def body() -> None:
            child = Runner(self.root, self.log, launcher=launcher, poll=self.poll, slots=self.slots,
                           devices=self.given_devices, info=self.info, placement=placement)
            child.active = self.active   # (read only: the queue's other trainers are not its run's neighbours)
            try:
                if recovering:
                    child.watch(item, recovering=True)
                else:
                    child.launch(item)
            except Exception as e:  # the item stays running: the next runner looks at it again
                child.say(f"{item.name}: its watcher failed ({type(e).__name__}: {e}); `workbench queue run` "
                          "again looks at it")
            finally:
                child.store.close()
                with self._lock:
                    self.ran += child.ran

        t = threading.Thread(target=body, name=f"queue-{item.name}", daemon=True)
        self.active[item.id] = (t, placement)
        t.start()

    def reap(self) -> None:
        for item_id, (t, _) in list(self.active.items()):
            if not t.is_alive():
                del self.active[item_id]

    def sibling_pids(self, item: Item) -> set[int]:
        """The processes of the queue's other trainers running now (not ``item``'s neighbours: the queue put
        them there, and the user asked for it)."""
        out: set[int] = set()
        for other_id in list(self.active):
            if other_id == item.id:
                continue
            try:
                other = self.store.by_id(other_id)
            except QueueError:  # removed meanwhile
                continue
            if other.pid:
                out |= run_processes(other.pid)
        return out

    def queue_trainers_beside(self, item: Item) -> set[int]:
        """The trainers of the queue's other items that ran while ``item`` did, by the pids their run directories
        recorded (``sibling_pids`` finds them as they run, once their own watch has seen them start: a sibling
        started moments before ``item`` ended was counted as another process in a CI run)."""
        out: set[int] = set()
        for other in self.store.items(("running", *ENDED)):
            if other.id == item.id or other.started is None or (
                    other.ended is not None and item.started is not None and other.ended < item.started):
                continue
            if other.pid:
                out.add(other.pid)
            if (self.run_dir(other) / rundir.STATUS_FILE).is_file() and (pid := rundir.read_status(
                    self.run_dir(other)).pid):
                out.add(pid)
        return out

    # ------------------------------------------------------------------ one item

    def run_dir(self, item: Item) -> Path:
        return self.root / item.name

    def launch(self, item: Item, how: str = "starting") -> None:
        """Start ``item``'s trainer (a fresh start) and watch it to its end."""
        item = self.store.update(item.id, launches=item.launches + 1)
        sets = self.placement.sets_for(item.sets) if self.placement else ()
        shown = " ".join((*item.sets, *sets))
        self.say(f"{how} {item.name} ({item.preset}{', ' + shown if shown else ''})")
        if self.info.get("nvidia") and item.gpu_free_before is None and (free := self._gpu_free()) is not None:
            item = self.store.update(item.id, gpu_free_before=round(free, 1))
        try:
            if (chain := rounds.round_of(self.root, item)) is not None:  # a round: its pairs first
                item = rounds.prepare(self.store, item, *chain, getattr(self.launcher, "env", None), self.say)
            self.launcher.start(item, sets) if sets else self.launcher.start(item)
        except CliError as e:
            self.end(item, "failed", str(e))
            return
        self.watch(item)

    def watch(self, item: Item, recovering: bool = False) -> None:
        """Follow ``item``'s trainer through its run directory until it ends, then record the end."""
        run_dir = self.run_dir(item)
        pruner = self._pruner(item)
        load = self.loads.setdefault(item.id, OthersLoad(every=max(self.poll, 1.0)))
        stop_asked = False
        deadline = time.monotonic() + ADOPT_GRACE_S
        while True:
            if not (run_dir / rundir.PRESET_FILE).is_file():
                if recovering and time.monotonic() < deadline:  # the last runner's `train` may still be at work
                    time.sleep(self.poll)
                    continue
                self.revive(item, "its run was never created")
                return
            st = rundir.read_status(run_dir)
            if st.live:
                if st.pid and st.pid != item.pid:
                    item = self.store.update(item.id, pid=st.pid)
                if recovering:
                    self.say(f"adopted {item.name}: its trainer (pid {st.pid}) is still running")
                    recovering = False
                load.sample(st.pid)
                if len(self.active) > 1:
                    self.queue_pids.setdefault(item.id, set()).update(self.sibling_pids(item))
                if pruner is not None and not stop_asked and pruner.should_prune(run_dir, st):
                    self.say(f"pruning {item.name}: {pruner.reason}")
                    try:
                        self.launcher.stop(item.name)
                        stop_asked = True
                    except CliError as e:
                        self.say(f"could not stop {item.name}: {e}")
                time.sleep(self.poll)
                continue
            load.sample(st.pid, last=True)
            if pruner is not None and st.state in ("finished", "early_stopped", "stopped"):
                pruner.report_rungs(run_dir, st)  # the rungs it passed since the last look, each at its own eval
            if st.state in ("finished", "early_stopped"):
                note = f"early stopped at step {st.step:,}" if st.state == "early_stopped" else None
                if stop_asked and pruner is not None:  # the pruner's stop came as the run was ending: it stands
                    note = f"reached its end before the pruner's stop ({pruner.reason})"
                self.end(item, "finished", note)
            elif st.state == "stopped":
                self.end(item, "pruned" if stop_asked else "stopped",
                         pruner.reason if stop_asked and pruner else f"stopped at step {st.step:,}")
            elif st.state == "failed":
                self.end(item, "failed", failure_line(run_dir, st, self.info))
            else:  # crashed: the trainer died without saying why (kill -9, a reboot, the OOM killer)
                self.revive(item, st.error or "its trainer died")
            return

    def revive(self, item: Item, why: str) -> None:
        """The trainer of a running item is gone: resume it from its last checkpoint, or start it again."""
        run_dir = self.run_dir(item)
        if item.launches >= MAX_LAUNCHES:
            self.end(item, "failed", f"its trainer died {item.launches} times (last: {why}); see "
                                     f"{run_dir / rundir.LOG_FILE}, then `workbench resume {item.name}`")
            return
        has_run = (run_dir / rundir.PRESET_FILE).is_file()
        ckpts = rundir.list_checkpoints(run_dir) if has_run else []
        if ckpts:
            item = self.store.update(item.id, launches=item.launches + 1)
            self.say(f"resuming {item.name} from {ckpts[-1]['name']} ({why})")
            try:
                self.launcher.resume(item.name)
            except CliError as e:
                self.end(item, "failed", f"could not resume: {e}")
                return
            self.watch(item)
            return
        if run_dir.exists():  # died before its first checkpoint: kept, as a crashed run, beside the new start
            aside = next(self.root / f"{item.name}-try{k}" for k in range(1, 1000)
                         if not (self.root / f"{item.name}-try{k}").exists())
            os.rename(run_dir, aside)
            self.say(f"{item.name} died before its first checkpoint ({why}): kept as {aside.name}, starting again")
        self.launch(item, how="starting again")

    def end(self, item: Item, state: str, note: str | None) -> None:
        run_dir = self.run_dir(item)
        metric = None
        if (run_dir / rundir.PRESET_FILE).is_file():
            try:
                metric = final_metric(run_dir, self._metric(item))
            except (OSError, ValueError, WorkbenchError):
                metric = None
        item = self.store.update(item.id, state=state, note=note, ended=time.time(), metric=metric,
                                 **self._load_fields(item), **self._gpu_after(item))
        self.ran += 1
        shown = f", {self._metric(item).name} {metric:.4f}" if metric is not None else ""
        self.say(f"{item.name} {state}{shown}" + (f": {note}" if note else ""))
        if (beside := beside_note(item.others_cpu, item.others)):
            self.say(f"{item.name} {beside}: not comparable with runs that had the machine to themselves")
        if item.sweep:
            sweep.trial_ended(self.store, item, self.info, self.say)
        rounds.round_ended(self.store, item, self.say)   # a finished round queues the next

    def _load_fields(self, item: Item) -> dict:
        """What other processes used while ``item`` trained, as the queue keeps it (nothing: never sampled)."""
        load = self.loads.pop(item.id, None)
        siblings = self.queue_pids.pop(item.id, set()) | self.queue_trainers_beside(item)
        if load is None or load.share is None:
            return {}
        for key in [k for k in load.cpu_s if k[0] in siblings]:  # the queue's own runs are not others
            del load.cpu_s[key]
        for pid in siblings:
            load.gpu_others.pop(pid, None)
        others = [{"pid": u.pid, "name": u.name, "cpu_share": u.cpu_share} for u in load.busiest()]
        others += [{"pid": g.pid, "name": g.name, "gpu": g.gpu} for g in load.gpu_others.values()]
        return {"others_cpu": round(load.share, 4), "others": others}

    def _gpu_after(self, item: Item) -> dict:
        """The GPU's free MiB once ``item``'s trainer has exited (its CUDA context gone); nothing without a GPU."""
        if not self.info.get("nvidia"):
            return {}
        if item.pid:
            try:
                psutil.Process(item.pid).wait(GONE_S)
            except (psutil.NoSuchProcess, psutil.TimeoutExpired):
                pass
        free = self._gpu_free()
        return {} if free is None else {"gpu_free_after": round(free, 1)}

    def _gpu_free(self) -> float | None:
        """MiB free on the (first) GPU this runner's run holds, as NVML reports it."""
        if self.placement and self.placement.gpus:
            first = self.placement.gpus[0]
            return next((d.free_mib for d in self.devices() if d.index == first), None)
        return gpu_free_mib()

    # ------------------------------------------------------------------ sweeps

    def _metric(self, item: Item) -> Metric:
        if not item.sweep:  # the run's own eval: a GRPO run's held-out reward, else its val loss
            return run_metric(self.run_dir(item))
        return sweep_metric(self.store, item.sweep)

    def _pruner(self, item: Item) -> sweep.Pruning | None:
        if not item.sweep:
            return None
        return sweep.pruner_for(self.store, item)

    def _sweeps_catch_up(self) -> None:
        """Results a killed runner had not yet given to Optuna, and trials it had not yet asked for."""
        if self.store.sweep_names():
            for name in self.store.sweep_names():
                sweep.catch_up(self.store, name, self.info, self.say)

