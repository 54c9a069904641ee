"""What else this machine is doing while a run trains: CPU shares by process (psutil), the
processes on each NVIDIA GPU and its clock throttle reasons (NVML). Torch-free.

``take_snapshot(run_pid)`` is the hardware half of the run doctor's input
(:mod:`workbench.analysis.doctor`): the machine (``detect()``) plus, for a live run, one
:class:`Activity` sample. CPU shares are measured over ``interval`` seconds: psutil's
per-process CPU time before and after, as a share of the whole machine (1.0 = every logical
core busy), so "pid 812 python3 48 %" on a 2-core machine is one core spinning.

The trainer's own processes (its pid, its children such as compile workers, and under torchrun
the launcher and its other ranks) count as the run; the process taking the sample is left out.

``OthersLoad`` sums the same per-process view over a whole run, sample by sample, without blocking:
the queue runner's record of what else used the machine during each trial (``queue ls``, ``sweep show``).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import psutil

from workbench.machine.detect import Machine, detect

# Processes below this share of the machine are not named one by one (a shell, an editor, the
# kernel's threads): they are noise next to a trainer, and a list of them hides the one that matters.
NAMED_SHARE = 0.03
NAMED_MAX = 8          # at most this many other processes are named

# NVML's clock event ("throttle") reasons that slow a busy GPU down, by bit (nvml.h,
# nvmlClocksEventReason*). Idle, application-clock and display settings and sync boost are left
# out: they are not a slowdown of a GPU that is training.
THROTTLE_REASONS = {
    0x4: "power cap (software)",
    0x8: "hardware slowdown",
    0x20: "thermal (software)",
    0x40: "thermal (hardware)",
    0x80: "power brake (hardware)",
}


@dataclass(frozen=True)
class ProcessUse:
    """One process's share of the machine's CPU over the sample."""
    pid: int
    name: str
    cpu_share: float       # of the whole machine (1.0 = every logical core)
    command: str = ""      # its command line, shortened


@dataclass(frozen=True)
class GpuProcess:
    """A process holding an NVIDIA GPU (NVML's compute processes)."""
    gpu: int
    pid: int
    name: str
    memory_bytes: int | None = None
    sm_pct: float | None = None   # its share of the GPU's SMs over NVML's last samples (None: not reported)


@dataclass(frozen=True)
class GpuClocks:
    """An NVIDIA GPU's load and what holds its clocks down now."""
    index: int
    name: str
    utilization_pct: int | None = None
    throttle: tuple[str, ...] = ()   # THROTTLE_REASONS that NVML reports now


@dataclass(frozen=True)
class Activity:
    """One sample of what the machine is doing, taken while a run trains."""
    interval_s: float
    logical_cores: int
    cpu_busy: float                          # the whole machine, 0-1
    run_pids: tuple[int, ...] = ()           # the trainer's processes
    run_share: float = 0.0                   # their share of the machine
    others_share: float = 0.0                # every other process together
    others: tuple[ProcessUse, ...] = ()      # the busiest other processes (>= NAMED_SHARE), busiest first
    gpu_processes: tuple[GpuProcess, ...] = ()
    gpus: tuple[GpuClocks, ...] = ()
    note: str = ""                           # what could not be read

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Activity":
        return cls(interval_s=float(d.get("interval_s") or 0), logical_cores=int(d.get("logical_cores") or 1),
                   cpu_busy=float(d.get("cpu_busy") or 0), run_pids=tuple(d.get("run_pids") or ()),
                   run_share=float(d.get("run_share") or 0), others_share=float(d.get("others_share") or 0),
                   others=tuple(ProcessUse(**p) for p in d.get("others") or ()),
                   gpu_processes=tuple(GpuProcess(**p) for p in d.get("gpu_processes") or ()),
                   gpus=tuple(GpuClocks(**{**g, "throttle": tuple(g.get("throttle") or ())})
                              for g in d.get("gpus") or ()),
                   note=str(d.get("note") or ""))


@dataclass(frozen=True)
class HardwareSnapshot:
    """The run doctor's view of the hardware: the machine, and what it is doing (a live run only)."""
    info: dict[str, Any] = field(default_factory=dict)   # detect(), or written by hand in tests
    activity: Activity | None = None
    taken: float = 0.0

    @property
    def machine(self) -> Machine:
        return Machine.from_info(self.info)

    def to_dict(self) -> dict[str, Any]:
        return {"info": self.info, "activity": self.activity.to_dict() if self.activity else None,
                "taken": self.taken}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HardwareSnapshot":
        act = d.get("activity")
        return cls(info=d.get("info") or {}, activity=Activity.from_dict(act) if act else None,
                   taken=float(d.get("taken") or 0))


# ----------------------------------------------------------------------------- the run's processes

def _is_launcher(p: psutil.Process) -> bool:
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return False
    return "torch.distributed.run" in cmd or "torchrun" in cmd


def run_processes(pid: int | None) -> set[int]:
    """The trainer ``pid`` and its descendants; under torchrun the launcher and all its ranks."""
    if not pid:
        return set()
    try:
        p = psutil.Process(pid)
        parent = p.parent()
        root = parent if parent is not None and _is_launcher(parent) else p
        return {root.pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return {pid}


def _command(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return ""
    return cmd if len(cmd) <= 100 else cmd[:97] + "..."


# ----------------------------------------------------------------------------- sampling

def _cpu_sample(run: set[int], interval: float, exclude: set[int]) -> tuple[float, float, float, list[ProcessUse]]:
    """(machine busy, the run's share, others' share, others by process) over ``interval`` seconds."""
    procs: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["name"]):
        try:
            p.cpu_percent(None)   # the first call only starts the process's clock
            procs[p.pid] = p
        except psutil.Error:
            continue
    psutil.cpu_percent(None)
    time.sleep(interval)
    busy = psutil.cpu_percent(None) / 100.0
    cores = psutil.cpu_count(logical=True) or 1
    run_share = others_share = 0.0
    others: list[ProcessUse] = []
    for pid, p in procs.items():
        try:
            share = p.cpu_percent(None) / (100.0 * cores)
        except psutil.Error:
            continue
        if pid in run:
            run_share += share
        elif pid not in exclude and share > 0:
            others_share += share
            if share >= NAMED_SHARE:
                others.append(ProcessUse(pid, str(p.info.get("name") or "?"), round(share, 4), _command(p)))
    others.sort(key=lambda u: -u.cpu_share)
    return busy, run_share, others_share, others[:NAMED_MAX]


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"  # e.g. a process of another container: NVML sees it, /proc does not


def _gpu_sample() -> tuple[list[GpuProcess], list[GpuClocks], str]:
    """The processes on each NVIDIA GPU and its throttle reasons now; an empty answer and a note
    where there is no NVML."""
    try:  # lazily: NVML is for NVIDIA machines only, and may be missing
        import pynvml
    except ImportError:
        return [], [], "no NVML (the nvidia-ml-py package is not installed)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return [], [], f"no NVIDIA GPU ({e})"
    procs: list[GpuProcess] = []
    gpus: list[GpuClocks] = []

    def opt(fn: Callable[..., Any] | None, *a: Any) -> Any:
        try:
            return fn(*a) if fn is not None else None
        except pynvml.NVMLError:
            return None

    try:
        # renamed "clock event reasons" in NVML 12.x; the old name stays as an alias in older bindings
        reasons_fn = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                      or getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        since_us = int((time.time() - 10) * 1e6)  # per-process SM samples of the last 10 s
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            util = opt(pynvml.nvmlDeviceGetUtilizationRates, h)
            mask = opt(reasons_fn, h) or 0
            gpus.append(GpuClocks(i, name, int(util.gpu) if util else None,
                                  tuple(why for bit, why in THROTTLE_REASONS.items() if mask & bit)))
            sm: dict[int, float] = {}
            for s in opt(pynvml.nvmlDeviceGetProcessUtilization, h, since_us) or []:
                sm[int(s.pid)] = max(sm.get(int(s.pid), 0.0), float(s.smUtil))
            for p in opt(pynvml.nvmlDeviceGetComputeRunningProcesses, h) or []:
                used = getattr(p, "usedGpuMemory", None)
                procs.append(GpuProcess(i, int(p.pid), _name(int(p.pid)),
                                        int(used) if isinstance(used, int) else None, sm.get(int(p.pid))))
    except pynvml.NVMLError as e:
        return procs, gpus, f"NVML error while reading GPU processes: {e}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return procs, gpus, ""


def _cpus() -> list[int]:
    """This process's CPUs (its affinity), or every one where that cannot be asked."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(psutil.cpu_count(logical=True) or 1))


class OthersCpu:
    """``with OthersCpu() as w: ...``, then ``w.share``: the share of this process's CPUs that other
    processes used while the block ran (0-1), to tell a calibration measured beside a busy neighbour.

    The CPUs' busy time (a hypervisor's steal included: another machine's load) less this run's own
    CPU time (this process; under torchrun also its launcher and the other ranks, which calibrate at the
    same moment), over the block's wall time on those CPUs."""

    def __init__(self) -> None:
        self.cpus = _cpus()
        self.share = 0.0
        me = psutil.Process()
        try:
            parent = me.parent()
        except psutil.Error:
            parent = None
        self.ours = run_processes(me.pid) if parent is not None and _is_launcher(parent) else {me.pid}
        self._start: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def _busy(self) -> float:
        per = psutil.cpu_times(percpu=True)
        total = 0.0
        for i in self.cpus:
            if i < len(per):
                t = per[i]
                # guest time is counted in user already; idle and iowait are free time
                total += sum(v for k, v in t._asdict().items() if k not in ("idle", "iowait", "guest", "guest_nice"))
        return total

    def _ours(self) -> float:
        total = 0.0
        for pid in self.ours:
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except psutil.Error:
                continue
        return total

    def __enter__(self) -> "OthersCpu":
        self._start = (time.monotonic(), self._busy(), self._ours())
        return self

    def __exit__(self, *exc: object) -> None:
        t0, busy0, ours0 = self._start
        wall = (time.monotonic() - t0) * len(self.cpus)
        others = (self._busy() - busy0) - (self._ours() - ours0)
        self.share = min(1.0, max(0.0, others / wall)) if wall > 0 else 0.0


class OthersLoad:
    """What other processes use of the machine while a run trains, summed over its samples: the queue runner
    calls ``sample(run_pid)`` as it polls the run (at most every ``every`` seconds; ``last=True`` as the run ends,
    so the next sample starts a new span), then reads ``share`` (their CPU over the sampled span, of the whole
    machine: the doctor's ``others_share``), ``busiest()`` and ``gpu_others``.

    Per process, as the doctor samples: each process's CPU time between samples, or all of it for one that
    started since the last. The run's processes (``run_processes``) and this process are left out; a process
    that starts and ends between two samples is missed. NVML's processes on the GPUs are read every ``gpu_every``
    seconds where NVML answers (never again where it does not); another process on a GPU the run holds is a
    neighbour (``gpu_others``)."""

    def __init__(self, every: float = 1.0, gpu_every: float = 10.0):
        self.every, self.gpu_every = every, gpu_every
        self.cores = psutil.cpu_count(logical=True) or 1
        self.wall_s = 0.0
        self.cpu_s: dict[tuple[int, float], float] = {}    # others' CPU seconds by (pid, start time)
        self.names: dict[tuple[int, float], str] = {}
        self.gpu_others: dict[int, GpuProcess] = {}          # other processes seen on a GPU, by pid
        self._last: dict[tuple[int, float], float] | None = None
        self._at = self._wall_at = 0.0
        self._gpu_at: float | None = None
        self._gpu = True

    @property
    def share(self) -> float | None:
        """Others' mean share of the machine's CPU over the samples (None: fewer than two samples)."""
        if self.wall_s <= 0:
            return None
        return min(1.0, sum(self.cpu_s.values()) / (self.wall_s * self.cores))

    def busiest(self, n: int = 3) -> list[ProcessUse]:
        """The ``n`` other processes that used the most CPU over the samples (those >= NAMED_SHARE)."""
        if self.wall_s <= 0:
            return []
        use = [ProcessUse(pid, self.names.get((pid, t), "?"), round(cpu / (self.wall_s * self.cores), 4))
               for (pid, t), cpu in self.cpu_s.items()]
        return sorted((u for u in use if u.cpu_share >= NAMED_SHARE), key=lambda u: -u.cpu_share)[:n]

    def sample(self, run_pid: int | None, last: bool = False) -> None:
        now = time.monotonic()
        if self._last is not None and not last and now - self._at < self.every:
            return
        run = run_processes(run_pid)
        ours = run | {os.getpid()}
        times: dict[tuple[int, float], float] = {}
        names: dict[tuple[int, float], str] = {}
        for p in psutil.process_iter(["name", "cpu_times", "create_time"], ad_value=None):
            cpu, started = p.info["cpu_times"], p.info["create_time"]
            if p.pid in ours or cpu is None or started is None:
                continue
            times[(p.pid, started)] = cpu.user + cpu.system
            names[(p.pid, started)] = str(p.info["name"] or "?")
        if self._last is not None:
            self.wall_s += now - self._at
            for key, t in times.items():
                # a process that started since the last sample: all its CPU time is in the span
                before = self._last.get(key, 0.0 if key[1] >= self._wall_at else None)
                if before is not None and t > before:
                    self.cpu_s[key] = self.cpu_s.get(key, 0.0) + t - before
                    self.names[key] = names[key]
        self._last = None if last else times
        self._at, self._wall_at = now, time.time()
        if self._gpu and (self._gpu_at is None or last or now - self._gpu_at >= self.gpu_every):
            self._gpu_at = now
            procs, gpus, note = _gpu_sample()
            self._gpu = bool(gpus) or not note   # no NVML, or no NVIDIA GPU: not asked again
            run_gpus = {g.gpu for g in procs if g.pid in run}   # another process on another GPU is no neighbour
            for g in procs:
                if g.pid not in ours and g.gpu in run_gpus:
                    self.gpu_others[g.pid] = g


def sample_activity(run_pid: int | None, interval: float = 1.0, exclude: set[int] | None = None) -> Activity:
    """What the machine does over the next ``interval`` seconds, the trainer ``run_pid`` told apart
    from everything else (this process is left out, and ``exclude`` too)."""
    run = run_processes(run_pid)
    busy, run_share, others_share, others = _cpu_sample(run, interval, {os.getpid(), *(exclude or ())})
    gpu_procs, gpus, note = _gpu_sample()
    return Activity(interval_s=interval, logical_cores=psutil.cpu_count(logical=True) or 1,
                    cpu_busy=round(busy, 4), run_pids=tuple(sorted(run)), run_share=round(run_share, 4),
                    others_share=round(others_share, 4), others=tuple(others), gpu_processes=tuple(gpu_procs),
                    gpus=tuple(gpus), note=note)


def take_snapshot(run_pid: int | None = None, interval: float = 1.0, info: dict[str, Any] | None = None
                  ) -> HardwareSnapshot:
    """The machine (``detect()``, or ``info``) and, when ``run_pid`` is a live trainer, what it and
    everything else are doing over ``interval`` seconds."""
    activity = sample_activity(run_pid, interval) if run_pid else None
    return HardwareSnapshot(info=info if info is not None else detect(), activity=activity, taken=time.time())
