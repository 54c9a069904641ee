"""Sweeps over several machines: one Optuna study in a shared database (``--storage postgresql://...``, or
mysql://), a worker on each machine (``workbench queue run --storage URL``) that takes the study's next trial,
trains it here and tells the study what it reached. Torch-free; Optuna and SQLAlchemy are loaded when used.

What is where:

- **The study** holds everything the machines share: the sweep's spec (a study attribute: the same name with
  another spec is refused), its trials (grid and random: every point enqueued when the sweep is made, so the
  trial count is the study's and no point runs twice; tpe: drawn by each worker while the study has fewer than
  ``trials`` counted trials), each trial's reports (the pruner compares every worker's) and results.
- **A worker** takes a waiting trial (``WAITING`` -> ``RUNNING`` in one update that only one worker can win),
  trains it as ``workbench train`` in the foreground, its own child (``PR_SET_PDEATHSIG``: the trainer gets
  SIGTERM, saves a checkpoint and exits when its worker dies, however it dies), records a heartbeat every
  ``heartbeat`` seconds from a thread, and tells the study how the run ended. Before each trial it calls
  ``fail_stale_trials`` (ask/tell users must: Optuna only does it inside ``optimize``).
- **A dead worker** (kill -9, a lost machine): its trial's heartbeat stops; after ``grace`` seconds the next
  worker's ``fail_stale_trials`` fails it, and Optuna's retry callback (``RetryHeartbeatStaleTrialCallback``,
  ``RetryFailedTrialCallback`` before Optuna 4.9; ``max_retry=1``) enqueues it again
  (same parameters) for any worker. The retry **resumes from the dead trial's last checkpoint when its run
  directory is visible here** (a shared runs directory: the trial's ``run`` attribute names it, and it has a
  complete checkpoint), and **starts from the beginning otherwise** (separate runs directories); the trial's
  ``resumed_from`` attribute says which. A worker waits while another's trial is running, so a trial that
  dies is retried as long as one worker is left.

A URL's password is never printed: every message shows the URL masked (``postgresql://wb:***@host/db``), and
nothing of the URL is written into a run's files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from workbench import cli_client, rundir
from workbench.cli_client import cli_argv
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine
from workbench.queue import devices as devices_mod
from workbench.queue import sweep as local
from workbench.queue.dburl import HEARTBEAT_S, StorageError, masked, open_storage
from workbench.queue.outcome import final_metric
from workbench.queue.shared_study import SPEC_ATTR, TRIALS_ATTR, _optuna, _spec_of, counted
from workbench.queue.store import trial_name
from workbench.queue.sweep_spec import Param, SweepSpec, point_sets

__all__ = ["HEARTBEAT_S", "StorageError", "Worker", "counted", "create", "masked", "open_storage"]

POLL_S = 1.0              # how often the worker looks at its trainer, and at the study when it waits


# ----------------------------------------------------------------------------- making the sweep

def _points(spec: SweepSpec) -> list[dict[str, Any]] | None:
    """Every trial's settings when they are known before any runs: the grid, or the random draws (seeded)."""
    points = spec.points()
    if points is not None or spec.method != "random":
        return points
    optuna = _optuna()
    study = optuna.create_study(sampler=local._sampler(spec, 0), direction=spec.metric.goal)  # in memory
    return [dict(study.ask(local._distributions(spec.params)).params) for _ in range(spec.trials)]


def create(url: str, spec: SweepSpec, root: Path, machine: Machine, info: dict, storage: Any = None
           ) -> tuple[Any, bool]:
    """Make the sweep's study in the shared database (its points enqueued), or find it made by another machine
    with the same spec: (the study, made now). The same name with another spec is refused."""
    optuna = _optuna()
    storage = storage or open_storage(url)
    study = optuna.create_study(storage=storage, study_name=spec.name, direction=spec.metric.goal,
                                load_if_exists=True)
    have = study.user_attrs.get(SPEC_ATTR)
    if have is not None:
        if have != json.loads(json.dumps(spec.to_dict())):
            theirs = SweepSpec.from_dict(have)
            raise StorageError(f"a sweep named {spec.name!r} exists in {masked(url)} with another spec "
                               f"({theirs.method} over {', '.join(p.describe() for p in theirs.params)} of "
                               f"{theirs.preset}); choose another --name, or run that one with `workbench queue "
                               f"run --storage URL`")
        return study, False
    if study.trials:
        raise StorageError(f"a study named {spec.name!r} exists in {masked(url)} that no workbench sweep made; "
                           "choose another --name")
    points = _points(spec)
    first = points[0] if points else None
    if first is not None:  # a value the preset refuses is refused now, on this machine, not on every worker
        local._admit(root, spec, first, machine, info)
    study.set_user_attr(SPEC_ATTR, spec.to_dict())
    study.set_user_attr(TRIALS_ATTR, len(points) if points is not None else spec.trials)
    for point in points or ():
        study.enqueue_trial(point)
    return study, True


# ----------------------------------------------------------------------------- the study's trials

def _state(name: str) -> Any:
    return getattr(_optuna().trial.TrialState, name)


def take(study: Any, spec: SweepSpec, target: int) -> Any | None:
    """The next trial this worker trains (marked RUNNING, its first heartbeat recorded), or None: nothing waits
    (and, for tpe, the study has its count)."""
    optuna = _optuna()
    storage = study._storage
    for f in study.get_trials(deepcopy=False, states=(_state("WAITING"),)):
        try:
            won = storage.set_trial_state_values(f._trial_id, state=_state("RUNNING"))
        except optuna.exceptions.UpdateFinishedTrialError:
            won = False
        if won:
            storage.record_heartbeat(f._trial_id)
            return optuna.trial.Trial(study, f._trial_id)
    if spec.method == "tpe" and counted(study) < target:
        trial = study.ask()
        storage.record_heartbeat(trial._trial_id)
        return trial
    return None


def _suggest(trial: Any, p: Param) -> Any:
    if p.values:
        return trial.suggest_categorical(p.key, list(p.values))
    assert p.low is not None and p.high is not None
    if p.integer:
        return trial.suggest_int(p.key, int(p.low), int(p.high), log=p.log)
    return trial.suggest_float(p.key, float(p.low), float(p.high), log=p.log)


class Heartbeat:
    """Records the trial's heartbeat every ``every`` seconds from a thread, until stopped."""

    def __init__(self, storage: Any, trial_id: int, every: float):
        self.storage, self.trial_id, self.every = storage, trial_id, every
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")

    def _beat(self) -> None:
        while not self.stop_event.wait(self.every):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # a database hiccup: the next beat tries again (a long outage fails the trial)
                pass

    def __enter__(self) -> "Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)


def visible_gpu_sets(env: dict[str, str], run_sets: tuple[str, ...]) -> tuple[str, ...]:
    """A worker started with ``CUDA_VISIBLE_DEVICES`` (one worker a GPU): its trials train with one process per
    GPU it sees (NVML, which the planner's auto nproc counts, sees every GPU of the machine), unless the trial
    sets ``hardware.nproc`` itself."""
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if "CUDA_VISIBLE_DEVICES" not in env or not visible:
        return ()
    return devices_mod.Placement("", sets=(f"hardware.nproc={len(visible)}",)).sets_for(run_sets)


def retry_from(root: Path, run: str | None) -> str | None:
    """The checkpoint a retry of the dead trial's ``run`` resumes from on a machine whose runs directory is
    ``root``: its newest complete checkpoint when the run's directory is there (a shared runs directory), else
    None (the retry starts from the beginning)."""
    if not run or not (Path(root) / run / rundir.PRESET_FILE).is_file():
        return None
    ckpts = rundir.list_checkpoints(Path(root) / run)
    return str(ckpts[-1]["name"]) if ckpts else None


def slot_placements(slots: int, info: dict, env: dict[str, str]) -> list[devices_mod.Placement]:
    """Where each of a worker's ``--slots N`` trials trains: on a machine without a GPU (or one whose worker sees
    none: ``CUDA_VISIBLE_DEVICES=""``) N CPU slots, the cores divided as the local queue divides them; on a machine
    with GPUs one GPU a slot (the GPUs this worker sees), so at most as many slots as GPUs (a StorageError)."""
    cores = max(1, int((info.get("cpu") or {}).get("physical_cores") or os.cpu_count() or 1))
    gpus = [d.index for d in devices_mod.inventory(info)]
    if "CUDA_VISIBLE_DEVICES" in env:
        gpus = [int(d) for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip().isdigit()]
    if not gpus:
        return [devices_mod.cpu_placement(k, slots, cores) for k in range(1, slots + 1)]
    if slots > len(gpus):
        raise StorageError(f"--slots {slots}: this worker sees {len(gpus)} GPU(s) (one trial a GPU); give --slots "
                           f"{len(gpus)} or fewer")
    return [devices_mod.gpu_placement((g,), cores, slots) for g in gpus[:slots]]


def device_label(info: dict, env: dict[str, str], placement: devices_mod.Placement | None) -> str:
    """Where a trial trains, as the Queue tab and ``sweep show`` name it: its slot's place, the GPUs this worker
    sees (``CUDA_VISIBLE_DEVICES``, else every GPU of the machine), or "cpu"."""
    if placement is not None:
        return placement.label
    if "CUDA_VISIBLE_DEVICES" in env:
        seen = [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
        return f"gpu {','.join(seen)}" if seen else "cpu"
    gpus = [str(d.index) for d in devices_mod.inventory(info)]
    return f"gpu {','.join(gpus)}" if gpus else "cpu"


class SharedPruning(local.Pruning):
    """The sweep's pruner on a trial of the shared study: it compares the trial with every worker's reports."""

    def __init__(self, study: Any, spec: SweepSpec, trial: Any):
        self.spec, self.study, self.trial, self.reason = spec, study, trial, ""
        frozen = study._storage.get_trial(trial._trial_id)
        self.reported = {s for s in spec.prune_shares if round(s * 100) in frozen.intermediate_values}


class Worker:
    """``workbench queue run --storage URL``: trains the shared sweeps' trials on this machine until none is left."""

    def __init__(self, url: str, root: Path, info: dict, log: Callable[[str], None] = print,
                 heartbeat: int = HEARTBEAT_S, grace: int | None = None, poll: float = POLL_S,
                 env: dict[str, str] | None = None, slots: int | None = None):
        self.url, self.root, self.info, self.log = url, Path(root), info, log
        self.heartbeat, self.poll = heartbeat, poll
        self.env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
        # --slots N: N trials at once, each in a thread of its own with its own heartbeat, placed as the local
        # queue places runs (None: one trial at a time, with every GPU this worker sees)
        self.places: list[devices_mod.Placement | None] = (
            list(slot_placements(slots, info, self.env)) if slots else [None])
        self.storage = open_storage(url, heartbeat, grace)
        self.ran = 0
        self.host = platform.node()
        self.lock = threading.Lock()   # one take() at a time on this worker, and the counts

    def say(self, msg: str) -> None:
        self.log(f"{time.strftime('%H:%M:%S')} {msg}")

    def sweeps(self, names: list[str] | None) -> list[str]:
        optuna = _optuna()
        ours = [s.study_name for s in optuna.get_all_study_summaries(self.storage, include_best_trial=False)
                if SPEC_ATTR in s.user_attrs]
        for n in names or ():
            if n not in ours:
                raise StorageError(f"no sweep {n!r} in {masked(self.url)}; its sweeps: {', '.join(ours) or 'none'} "
                                   "(`workbench sweep SPEC --storage URL` makes one)")
        return list(names) if names else ours

    def run(self, names: list[str] | None = None) -> int:
        todo = self.sweeps(names)
        self.say(f"worker {os.getpid()} on {self.host}, runs in {self.root}, study database {masked(self.url)}: "
                 f"{len(todo)} sweep(s)")
        for name in todo:
            self.run_sweep(name)
        self.say(f"nothing left to run: {self.ran} trial(s) ran here")
        return 0

    def run_sweep(self, name: str) -> None:
        optuna = _optuna()
        study = optuna.load_study(study_name=name, storage=self.storage)
        spec = _spec_of(study)
        assert spec is not None  # (only workbench's sweeps are listed)
        # tpe's sampler seeded apart on each worker: two workers started together must not draw the same startup
        # points (a worker's draws are not reproducible anyway: they depend on what the others have told)
        made = len(study.trials) + 1000 * (hash((self.host, os.getpid())) % 9973)
        study = optuna.load_study(study_name=name, storage=self.storage,
                                  sampler=local._sampler(spec, made), pruner=local._pruner(spec))
        target = int(study.user_attrs.get(TRIALS_ATTR) or spec.trials or 0)
        waiting_said = False
        busy: dict[int, threading.Thread] = {}   # slot index -> the thread training its trial
        while True:
            for k in [k for k, t in busy.items() if not t.is_alive()]:
                busy.pop(k).join()
            free = [k for k in range(len(self.places)) if k not in busy]
            trial = None
            if free:
                with self.lock:
                    optuna.storages.fail_stale_trials(study)
                    trial = take(study, spec, target)
            if trial is not None:
                waiting_said = False
                k = free[0]
                if len(self.places) == 1:   # one slot: trained here, as before slots
                    self.run_trial(study, spec, trial, self.places[k])
                    continue
                busy[k] = threading.Thread(target=self._slot, args=(study, spec, trial, self.places[k]),
                                           name=f"slot-{k + 1}", daemon=True)
                busy[k].start()
                continue
            if busy:   # this worker's own trials train: a slot frees when one ends
                time.sleep(self.poll)
                continue
            if study.get_trials(deepcopy=False, states=(_state("RUNNING"),)):
                if not waiting_said:  # another worker's trial may die and come back to be retried here
                    self.say(f"sweep {name}: nothing waits; watching the other workers' running trials")
                    waiting_said = True
                time.sleep(self.poll)
                continue
            break
        done = study.get_trials(deepcopy=False, states=(_state("COMPLETE"),))
        best = (min if spec.metric.goal == "minimize" else max)(done, key=lambda t: t.value) if done else None
        self.say(f"sweep {name} done: {counted(study)} trial(s)" + (
            f"; best {best.user_attrs.get('run')} ({' '.join(point_sets(best.params))}), {best.value:.4f}"
            if best else "; no trial recorded the metric"))

    def _slot(self, study: Any, spec: SweepSpec, trial: Any, placement: devices_mod.Placement | None) -> None:
        """One slot's trial, in its thread: an unexpected error is said and fails the trial (not the worker)."""
        try:
            self.run_trial(study, spec, trial, placement)
        except Exception as e:  # the worker goes on with its other slots
            self.say(f"trial {trial.number + 1} failed in this worker: {e!r}")
            try:
                study.tell(trial, state=_state("FAIL"))
            except Exception:
                pass

    def run_trial(self, study: Any, spec: SweepSpec, trial: Any,
                  placement: devices_mod.Placement | None = None) -> None:
        optuna = _optuna()
        storage = study._storage
        frozen = storage.get_trial(trial._trial_id)
        where = device_label(self.info, self.env, placement)
        say = (lambda m: self.say(f"[{placement.label}] {m}")) if placement is not None else self.say
        with Heartbeat(storage, trial._trial_id, self.heartbeat):
            params = {p.key: _suggest(trial, p) for p in spec.params}
            name = trial_name(spec.name, frozen.number + 1)
            history = frozen.system_attrs.get("retry_history") or []
            resume = None
            if history:
                before = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(
                    study._study_id, history[-1]))
                prev = before.user_attrs.get("run")
                ckpt = retry_from(self.root, prev)
                resume = prev if ckpt else None
                how = (f"resuming its run {prev} from {ckpt} (its run directory is shared with this machine)"
                       if resume else
                       f"from the start (its run {prev} is not in {self.root}: not a shared runs directory, or no "
                       "checkpoint yet)")
                say(f"{name} retries trial {history[-1] + 1} (failed by heartbeat on "
                         f"{before.user_attrs.get('host', 'another machine')}), {how}")
            try:
                item, note = local._admit(self.root, spec, params, Machine.from_info(self.info), self.info)
            except WorkbenchError as e:
                item, note = None, str(e)
            if item is None:
                trial.set_user_attr("note", f"refused here: {note}")
                study.tell(trial, state=_state("FAIL"))
                say(f"{name} refused on this machine: {note}")
                return
            run = resume or name
            for k, v in {"run": run, "host": self.host, "device": where, "runs_dir": str(self.root),
                         "resumed_from": resume or ""}.items():
                trial.set_user_attr(k, v)
            if resume:
                argv = cli_argv(self.root, "resume", resume)
            else:
                new = item.new_run()
                extra = (placement.sets_for(new.overrides) if placement is not None
                         else visible_gpu_sets(self.env, new.overrides))
                new = dataclasses.replace(new, name=name, overrides=tuple(new.overrides) + extra)
                argv = cli_argv(self.root, "train", *new.cli_args())
            say(f"{'resuming' if resume else 'starting'} {run} ({' '.join(point_sets(params))}), "
                     f"trial {frozen.number + 1}")
            env = {**self.env, **placement.env} if placement is not None else self.env
            state, value, why = self._train(study, spec, trial, run, argv, env, say)
        try:
            if state == "COMPLETE":
                study.tell(trial, value)
            else:
                if why:
                    trial.set_user_attr("note", why)
                study.tell(trial, state=_state(state))
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError) as e:
            say(f"{run}: the study had already ended this trial ({e}); its result is not counted")
        with self.lock:
            self.ran += 1
        say(f"{run} {state.lower()}" + (f", {spec.metric.name} {value:.4f}" if value is not None else "")
                 + (f": {why}" if why else ""))

    def _train(self, study: Any, spec: SweepSpec, trial: Any, run: str, argv: list[str], env: dict[str, str],
               say: Callable[[str], None]) -> tuple[str, float | None, str]:
        """Train ``run`` in a child process (it dies with this worker), pruned as the sweep says: (the Optuna state
        to tell, the metric, why it did not complete)."""
        run_dir = self.root / run
        logs = self.root / "worker-logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = logs / f"{run}.log"
        pruning = SharedPruning(study, spec, trial) if spec.pruner != "none" else None
        stop_asked = False
        with open(out, "a", encoding="utf-8") as f:
            proc = cli_client.popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    parent_death_signal=signal.SIGTERM)
            while proc.poll() is None:
                time.sleep(self.poll)
                if pruning is None or stop_asked or not (run_dir / rundir.STATUS_FILE).is_file():
                    continue
                now = rundir.read_status(run_dir)
                if now.live and pruning.should_prune(run_dir, now):
                    say(f"pruning {run}: {pruning.reason}")
                    proc.send_signal(signal.SIGTERM)
                    stop_asked = True
        st = rundir.read_status(run_dir) if (run_dir / rundir.STATUS_FILE).is_file() else None
        if st is None:
            lines = [ln for ln in out.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
            return "FAIL", None, (lines[-1] if lines else f"`workbench train` exited with status {proc.returncode}")
        if pruning is not None:
            pruning.report_rungs(run_dir, st)
        if st.state in ("finished", "early_stopped"):
            value = final_metric(run_dir, spec.metric)
            return ("COMPLETE", value, "") if value is not None else ("FAIL", None, "the run recorded no metric")
        if st.state == "stopped" and stop_asked:
            return "PRUNED", None, pruning.reason if pruning else ""
        return "FAIL", None, st.error or f"the trainer ended {st.state} (see {run_dir / rundir.LOG_FILE})"
