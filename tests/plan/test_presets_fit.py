"""Every shipped preset fits the machine it says it is sized for, by the memory estimate, on its own
device and precision (a preset that runs out of memory where it is meant to run is a broken preset)."""

from __future__ import annotations

import pytest

from workbench.config import preset_paths, resolve_preset
from workbench.machine.detect import Gpu, Machine
from workbench.plan.fit.memory import estimate_memory, fits

GiB = 2**30
SHIPPED = sorted(n for n, (_path, kind) in preset_paths().items() if kind == "shipped")


def sized_for(device: str, gb: float) -> Machine:
    """A machine of the preset's device with the memory the preset names (a modern GPU, Ampere or newer)."""
    if device.startswith("cuda"):
        return Machine(gpus=(Gpu(0, "CUDA GPU", int(gb * GiB), int(gb * GiB), (8, 0)),))
    return Machine(mps=device == "mps", ram_total=int(gb * GiB), ram_available=int(gb * GiB))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_preset_fits_what_it_is_sized_for(name):
    p = resolve_preset(name)
    assert p.hardware.expected_memory_gb > 0, f"{name} does not say what it is sized for"
    device = "cpu" if p.hardware.device == "auto" else p.hardware.device
    machine = sized_for(device, p.hardware.expected_memory_gb)
    est = estimate_memory(p, machine=machine)
    available, what = machine.memory(device)
    assert fits(est, available), (f"{name} on {device}: ~{est.total / GiB:.2f} GiB at {est.peak_phase}, but "
                                  f"{available / GiB:.2f} GiB {what} with 10 % kept free")
