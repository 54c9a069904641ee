"""The matmul rates measured on this machine, kept between processes: the best one is its peak.

A CPU's matmul rate measured while other processes load it is partly theirs: 51 GFLOP/s beside a
busy neighbour on a machine that reaches 197 alone, and MFU against 51 reads four times too high.
Load only ever lowers a measurement, so the peak behind MFU and time estimates is the best rate
measured here, not the latest: ``settle`` turns a measurement into the peak to use (a
:class:`Calibration`) and the cache ``matmul_rates.json`` keeps the best per machine (CPU model,
core count, torch version) and per device, precision and thread count. A peak that was only ever
measured while other processes used the CPU is marked uncertain until a quieter measurement
confirms or beats it.

Torch-free: ``workbench.machine.probe`` measures and records; ``detect()`` hands the best rates to
the torch-free estimates (the TUI's new-run form, ``estimate --no-calibrate``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from workbench.fs import cache_root, read_json, write_json_atomic
from workbench.machine.gpus import canonical_precision

RATES_FILE = "matmul_rates.json"
BUSY_SHARE = 0.2    # other processes using this share of the CPUs make a measurement one "under load"
CONFIRMS = 0.9      # a quiet measurement within this fraction of the best confirms it


def rate_key(device: str, precision: str, threads: int | None = None) -> str:
    """"cpu:fp32:2t" (a CPU rate depends on the threads torch uses), "mps:bf16", "cuda:fp32"."""
    kind = device.split(":")[0]
    return f"{kind}:{precision}" + (f":{threads}t" if kind == "cpu" and threads else "")


@dataclass(frozen=True)
class Calibration:
    """One calibration: what was measured now, and the peak it settles on."""
    device: str
    precision: str
    threads: int | None      # torch's CPU threads during the measurement (None: not a CPU)
    measured: float          # FLOP/s measured now
    flops: float             # the peak to use: the best measured on this machine, this measurement included
    best_before: float | None
    others_busy: float       # share of the CPUs other processes used while it measured (0-1)
    uncertain: bool          # the peak was only ever measured while other processes loaded the CPU

    @property
    def busy(self) -> bool:
        return self.others_busy >= BUSY_SHARE

    def describe(self) -> str:
        """The peak and where it comes from, for train.log and `workbench estimate`."""
        rate = f"{self.flops / 1e9:,.1f} GFLOP/s"
        now = (f"{self.measured / 1e9:,.1f} GFLOP/s now"
               + (f", with other processes using {self.others_busy:.0%} of the CPU" if self.busy else ""))
        if self.uncertain:
            return (f"{rate}, this machine's {self.precision} matmul rate, measured only while other processes "
                    f"loaded the CPU ({now}): uncertain, MFU may read high until a calibration on a quiet machine "
                    "(the next run, or `workbench estimate`) raises it")
        if self.flops * CONFIRMS > self.measured:
            return f"{rate}, the best {self.precision} matmul rate measured on this machine ({now})"
        return f"{rate}, this machine's {self.precision} matmul rate ({now})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def settle(device: str, precision: str, threads: int | None, measured: float, others_busy: float,
           known: dict[str, Any] | None) -> tuple[Calibration, dict[str, Any]]:
    """(the calibration, the cache entry to keep) for a rate ``measured`` now while other processes used
    ``others_busy`` of the CPUs, given the entry ``known`` for it (None: never measured here)."""
    busy = others_busy >= BUSY_SHARE
    best = float(known["flops"]) if known else None
    entry = dict(known or {})
    if best is None or measured > best:
        # beating a best that was measured quietly: the quiet one was the low one, so this is near the peak
        entry = {"flops": measured, "busy": busy and bool(entry.get("busy", True)),
                 "others_busy": round(others_busy, 3), "at": time.time()}
    elif not busy and measured >= CONFIRMS * best:
        entry["busy"] = False           # a quiet measurement near the best confirms it
    cal = Calibration(device=device, precision=precision, threads=threads, measured=measured,
                      flops=float(entry["flops"]), best_before=best, others_busy=round(others_busy, 3),
                      uncertain=bool(entry.get("busy")))
    return cal, entry


def _read() -> dict[str, Any]:
    known = read_json(cache_root() / RATES_FILE)
    return known if isinstance(known, dict) else {}


def known_rates(machine: str) -> dict[str, dict[str, Any]]:
    """The cache entries of ``machine`` (``detect.machine_identity()``), by ``rate_key``."""
    entries = _read().get(machine)
    return {k: v for k, v in entries.items() if isinstance(v, dict) and isinstance(v.get("flops"), (int, float))
            } if isinstance(entries, dict) else {}


def remember(machine: str, key: str, entry: dict[str, Any]) -> None:
    """Keep ``entry`` for ``key`` of ``machine`` (a cache: an unwritable one only costs later estimates)."""
    path = cache_root() / RATES_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        known = _read()
        mine = known.get(machine)
        mine = mine if isinstance(mine, dict) else {}
        if mine.get(key) == entry:
            return
        known[machine] = {**mine, key: entry}
        write_json_atomic(path, known, fsync=False)
    except OSError:
        pass


def kept_rate(machine: str, device: str, precision: str, threads: int | None) -> float | None:
    """The peak kept for ``device`` at ``precision`` (and on a CPU, ``threads``) of ``machine``, or None: what a
    calibration there would settle on, unless it beat it (torch-free: a command that needs the peak asks here
    first, and imports torch to measure only where nothing is kept)."""
    entry = known_rates(machine).get(rate_key(device, canonical_precision(precision), threads))
    return float(entry["flops"]) if entry else None


def best_rates(machine: str) -> dict[str, float]:
    """This machine's peak by "device:precision", as the estimates take it: on the CPU the rate measured
    with the most threads (a run's default: torch takes every core)."""
    out: dict[str, tuple[int, float]] = {}
    for key, entry in known_rates(machine).items():
        kind, _, rest = key.partition(":")
        precision, _, threads = rest.partition(":")
        n = int(threads[:-1]) if threads.endswith("t") and threads[:-1].isdigit() else 0
        rank = (n, float(entry["flops"]))
        if rank > out.get(f"{kind}:{precision}", (-1, 0.0)):
            out[f"{kind}:{precision}"] = rank
    return {k: v[1] for k, v in sorted(out.items())}
