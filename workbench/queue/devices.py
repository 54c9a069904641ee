"""Where the queue runs each run: a GPU (or several) of this machine, or a share of its cores. Torch-free.

The runner asks :func:`place` for devices with the machine's inventory as input (a list of :class:`Device`,
each with its free memory: :func:`inventory` reads it from ``detect()``'s NVML view; the tests describe
machines by hand), so the rule is the same on a 4-GPU box and in a unit test:

- **GPUs**: one run a GPU at once. A run asking for N trainer processes (``hardware.nproc = N``, torchrun)
  takes N GPUs that no queued run holds, each with the run's estimated memory free (NVML's free memory, so a
  process outside the queue is counted). A run that fits no free device waits for one (the queue is started
  in order: the next run waits, the ones behind it wait with it); a run that could never fit (more GPUs than
  the machine has, or more memory than any of them) is failed with one line instead of waiting forever.
  Among the devices that fit, the ones with the least free memory are taken, so a big one stays for a big run.
  The run sees its GPUs through ``CUDA_VISIBLE_DEVICES`` and trains with ``hardware.nproc`` = their count.
- **CPU** (no GPU, ``--slots N``): N runs at once, the physical cores divided between them: each run trains as
  one process with ``cores // N`` threads (at least 1): ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in its
  environment and ``--set hardware.nproc=1 hardware.num_threads=K`` (torch.set_num_threads in the trainer),
  unless the run sets those keys itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The keys the queue sets on a run it places, unless the run sets them itself
PLACED_KEYS = ("hardware.nproc", "hardware.num_threads")


@dataclass(frozen=True)
class Device:
    """One GPU as the placement sees it: its index (what CUDA_VISIBLE_DEVICES names), and MiB total and free."""
    index: int
    name: str = "GPU"
    total_mib: float | None = None
    free_mib: float | None = None


@dataclass(frozen=True)
class Need:
    """What a run asks of the devices: how many GPUs (its trainer processes) and MiB on each (None: unknown)."""
    gpus: int = 1
    mib: float | None = None


@dataclass(frozen=True)
class Placement:
    """Where one run trains: its GPUs (none on a CPU slot), its CPU slot, what ``queue ls`` shows, the environment
    its trainer starts with and the ``--set`` values the queue adds."""
    label: str                       # "gpu 2", "gpu 0,1", "cpu slot 1/2 (1 thread)"
    gpus: tuple[int, ...] = ()
    slot: int | None = None          # 1..N on a CPU machine
    env: dict[str, str] = field(default_factory=dict)
    sets: tuple[str, ...] = ()

    def sets_for(self, run_sets: tuple[str, ...]) -> tuple[str, ...]:
        """The queue's --set values a run gets: those whose key the run does not set itself."""
        own = {s.split("=", 1)[0].strip() for s in run_sets}
        return tuple(s for s in self.sets if s.split("=", 1)[0] not in own)


def inventory(info: dict[str, Any]) -> list[Device]:
    """This machine's GPUs as ``detect()`` sees them through NVML (an empty list: no NVIDIA GPU)."""
    out = []
    for i, g in enumerate(info.get("nvidia") or []):
        total, free = g.get("vram_total"), g.get("vram_free")
        out.append(Device(int(g.get("index", i)), str(g.get("name") or "GPU"),
                          None if total is None else total / 2**20, None if free is None else free / 2**20))
    return out


def _fits(d: Device, need: Need) -> bool:
    return need.mib is None or d.free_mib is None or d.free_mib >= need.mib


def place(need: Need, devices: list[Device], held: set[int]) -> tuple[int, ...] | None:
    """The GPUs a run needing ``need`` takes now: ``need.gpus`` devices not in ``held`` that each have its memory
    free (the fullest that fit first), or None: it waits."""
    free = [d for d in devices if d.index not in held and _fits(d, need)]
    if len(free) < need.gpus:
        return None
    chosen = sorted(free, key=lambda d: (d.free_mib if d.free_mib is not None else float("inf"), d.index))
    return tuple(sorted(d.index for d in chosen[:need.gpus]))


def never_fits(need: Need, devices: list[Device]) -> str | None:
    """Why a run can never be placed on this machine, however many runs end (None: it can, once devices free)."""
    if need.gpus > len(devices):
        return (f"asks for {need.gpus} GPUs (hardware.nproc = {need.gpus}); this machine has {len(devices)}: set "
                f"hardware.nproc to at most {len(devices)}")
    if need.mib is not None:
        big = [d for d in devices if d.total_mib is None or d.total_mib >= need.mib]
        if len(big) < need.gpus:
            top = max((d.total_mib or 0) for d in devices)
            return (f"needs ~{need.mib:,.0f} MiB on each of {need.gpus} GPU(s) by the estimate; the largest here "
                    f"has {top:,.0f} MiB: `workbench fit` a smaller micro-batch")
    return None


def gpu_placement(gpus: tuple[int, ...], cores: int, runs: int) -> Placement:
    """A run on ``gpus``: CUDA_VISIBLE_DEVICES names them, one trainer process each; the cores shared by the
    ``runs`` that may run at once."""
    threads = max(1, cores // max(1, runs))
    shown = ",".join(str(g) for g in gpus)
    env = {"CUDA_VISIBLE_DEVICES": shown, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return Placement(f"gpu {shown}", gpus, None, env, (f"hardware.nproc={len(gpus)}",))


def cpu_placement(slot: int, slots: int, cores: int) -> Placement:
    """CPU slot ``slot`` of ``slots``: one trainer process with ``cores // slots`` threads (at least 1)."""
    threads = max(1, cores // slots)
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return Placement(f"cpu slot {slot}/{slots} ({threads} thread{'s' if threads > 1 else ''})", (), slot, env,
                     ("hardware.nproc=1", f"hardware.num_threads={threads}"))


def capacity(devices: list[Device], slots: int | None) -> int:
    """How many runs may run at once: ``--slots``, else one a GPU (one on a machine without a GPU)."""
    if slots is not None:
        return slots
    return max(1, len(devices))
