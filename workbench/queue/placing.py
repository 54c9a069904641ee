"""Where the runner places each run (the rules are :mod:`workbench.queue.devices`'): the machine's GPUs and their
free memory (NVML, read again as each run is placed; tests describe them), the CPU slot or the GPUs a queued run
takes now given the ones the runner's other runs hold, or why it can never run here, its need (hardware.nproc, the
estimated memory on each GPU, planned as ``train`` plans it), and where a run the last runner left running trains.
A mixin of :class:`workbench.queue.runner.Runner`, which holds the state it reads. Torch-free."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.machine.detect import detect_nvidia
from workbench.queue import devices as devices_mod
from workbench.queue.store import Item


class Placing:
    """The runner's placement of its runs: where a queued run goes now, if anywhere, by what it needs."""

    # the runner's, set by its __init__
    root: Path
    info: dict
    slots: int | None                # --slots: CPU runs at once (on GPUs, a cap)
    cores: int
    given_devices: list[devices_mod.Device] | None
    active: dict[int, tuple[threading.Thread, devices_mod.Placement]]   # the runs being watched, by item id
    needs: dict[int, devices_mod.Need]                                  # each item's, once estimated

    def devices(self) -> list[devices_mod.Device]:
        """The GPUs and their free memory now (NVML, read again each time a run is placed), or the given ones."""
        if self.given_devices is not None:
            return self.given_devices
        return devices_mod.inventory({"nvidia": detect_nvidia()[0]})

    def place(self, item: Item, cap: int) -> tuple[devices_mod.Placement | None, str | None]:
        """(where ``item`` runs now, or None: it waits; why it can never run here, or None)."""
        held_slots = {p.slot for _, p in self.active.values() if p.slot is not None}
        devs = self.devices()
        if not devs:
            if not self.slots:
                return devices_mod.Placement("cpu", slot=1), None
            slot = next(k for k in range(1, cap + 1) if k not in held_slots)
            return devices_mod.cpu_placement(slot, cap, self.cores), None
        need = self.need(item)
        if (never := devices_mod.never_fits(need, devs)):
            return None, never
        held = {g for _, p in self.active.values() for g in p.gpus}
        gpus = devices_mod.place(need, devs, held)
        return (None if gpus is None else devices_mod.gpu_placement(gpus, self.cores, cap)), None

    def need(self, item: Item) -> devices_mod.Need:
        """What ``item`` asks of the GPUs: its hardware.nproc (auto: one) and its estimated memory on each."""
        if item.id not in self.needs:
            self.needs[item.id] = estimate_need(self.root, item, self.info)
        return self.needs[item.id]

    def placement_of(self, item: Item, cap: int) -> devices_mod.Placement:
        """Where a run the last runner left running trains (as it was placed; a run from an older queue: as one
        run at a time would have run it)."""
        if item.gpus:
            return devices_mod.gpu_placement(item.gpus, self.cores, cap)
        if item.slot is not None and self.slots:
            return devices_mod.cpu_placement(item.slot, cap, self.cores)
        return devices_mod.Placement(item.place or "cpu", slot=item.slot)


def estimate_need(root: Path, item: Item, info: dict) -> devices_mod.Need:
    """``item``'s GPUs (hardware.nproc; auto is one under the queue) and its estimated MiB on each, planned as
    ``train`` plans it; a run that cannot be planned now asks for one GPU of unknown need (``train`` then says
    what is wrong, and the run fails with that line)."""
    from workbench.machine.detect import Machine
    from workbench.plan.report import build_report
    from workbench.plan.run_plan import plan_new_run
    try:
        run = item.new_run()
        plan = plan_new_run(run, root, info)
        gpus = plan.preset.hardware.nproc or 1
        if not plan.preset.hardware.nproc:
            plan = plan_new_run(dataclasses.replace(run, overrides=tuple(run.overrides) + ("hardware.nproc=1",)),
                                root, info)
        report = build_report(plan.preset, Machine.from_info(info))
        return devices_mod.Need(gpus, report.memory.total / 2**20)
    except (WorkbenchError, OSError, ValueError):
        return devices_mod.Need(1, None)
