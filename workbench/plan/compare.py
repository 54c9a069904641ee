"""One preset on many GPUs: ``workbench estimate PRESET --gpu NAME`` and ``--compare``.

For each GPU of the table (:mod:`workbench.machine.gpus`) the preset is estimated as if it ran
there: a :class:`Machine` with that GPU, so every ``auto`` (precision, fused loss, compile),
the memory estimate and whether it fits follow from the same functions a run on that GPU would
use. Per GPU: fits or not (estimate <= 90 % of the memory, as ``estimate`` says everywhere), the
micro-batch ``workbench fit`` would choose (the same search on the estimate, same tokens per
step), tokens/s at an MFU that says where it comes from (:mod:`workbench.plan.throughput`), time
to ``max_iters``, energy at the GPU's board power, and cost where a price was given.

Prices are the user's (``--usd-per-hour NAME=PRICE``, a TOML file of ``"NAME" = PRICE``): the
table holds no prices. Torch-free.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from workbench.config import Preset
from workbench.errors import WorkbenchError
from workbench.fmt import human_bytes, millions
from workbench.fs import read_toml
from workbench.machine.detect import Gpu, Machine
from workbench.machine.gpus import GpuSpec, compare_set, find_gpu
from workbench.plan import cost as plan_cost
from workbench.plan import throughput
from workbench.plan.fit import memory as est
from workbench.plan.fit.batch import plan_accumulation, search_batch
from workbench.plan.fit.flops import count_params
from workbench.plan.fit.recommend import fitting_savers
from workbench.plan.report import EstimateReport, OnGpu, build_report
from workbench.plan.settings import RunSettings, resolve_settings

SORT_KEYS = ("time", "cost")
SMALL_MODEL = 50_000_000  # below this many parameters, say that the MFU is the least certain


# ----------------------------------------------------------------------------- one GPU

def on_gpu(preset: Preset, gpu: GpuSpec, precision: str | None = None) -> tuple[Preset, str]:
    """(the preset as it would run on ``gpu``, a note): the GPU's device, ``precision`` if given
    (else the preset's); bf16 on a GPU without it (T4, V100) becomes fp16, as one would set it."""
    prec = precision if precision not in (None, "auto") else preset.hardware.precision
    note = ""
    if prec == "bf16" and gpu.bf16 is None:
        prec, note = "fp16", "no bf16 on this GPU: estimated in fp16 (hardware.precision = fp16)"
    p = est.what_if(preset, device=gpu.device, precision=prec if prec != "auto" else None)
    return p, note


def machine_with(gpu: GpuSpec) -> Machine:
    """A machine whose one accelerator is ``gpu``, all of its memory free (a GPU one is about to buy
    or rent): an NVIDIA card as cuda:0, or an Apple-silicon Mac whose unified memory is ``gpu``'s
    (MPS then gets about 2/3 of it, see ``Machine.memory``)."""
    if gpu.device == "mps":
        return Machine(mps=True, ram_total=gpu.memory_bytes, ram_available=gpu.memory_bytes)
    return Machine(gpus=(Gpu(index=0, name=gpu.name, total_memory=gpu.memory_bytes,
                             compute_capability=gpu.compute_capability),))


def gpu_peak(gpu: GpuSpec) -> Callable[[str, str], float | None]:
    """The table's dense peak of ``gpu`` as resolve_settings wants it: (device, precision) -> FLOP/s."""
    return lambda _device, precision: gpu.peak_flops(precision)


def gpu_settings(preset: Preset, gpu: GpuSpec) -> tuple[Machine, RunSettings]:
    """The machine with ``gpu`` and the settings of one process of ``preset`` there (``preset``
    already :func:`on_gpu`)."""
    machine = machine_with(gpu)
    return machine, resolve_settings(preset, machine, world_size=1, peak=gpu_peak(gpu))


def fit_batch(preset: Preset, gpu: GpuSpec, available: int) -> tuple[int, int, int, str]:
    """(largest micro-batch, batch_size, grad_accum, note) that ``workbench fit`` would choose on
    ``gpu`` from the estimate: the same search (``search_batch`` from the preset's batch up to its
    sequences per step) against 90 % of the memory, and the same accumulation plan."""
    machine = machine_with(gpu)
    seqs = preset.train.batch_size * preset.train.grad_accum
    limit = (1 - est.HEADROOM) * available

    def trial(b: int) -> bool:
        s = resolve_settings(est.what_if(preset, batch_size=b), machine, world_size=1, peak=gpu_peak(gpu))
        return est.estimate_memory(preset, settings=s).total <= limit

    best, _ = search_batch(trial, cap=seqs, start=min(preset.train.batch_size, seqs))
    if not best:
        return 0, 0, 0, "even batch_size 1 does not fit"
    batch, accum, note = plan_accumulation(seqs, best)
    return best, batch, accum, note


def gpu_row(preset: Preset, gpu: GpuSpec, *, precision: str | None = None, mfu: float | None = None,
            usd_per_hour: float | None = None, usd_per_kwh: float | None = None) -> dict[str, Any]:
    """Everything ``--compare`` shows for ``preset`` on ``gpu``, as a JSON-serialisable dict."""
    p, note = on_gpu(preset, gpu, precision)
    machine, settings = gpu_settings(p, gpu)
    mem = est.estimate_memory(p, settings=settings)
    available, _what = machine.memory(gpu.device)
    assert available is not None  # a machine made from the GPU table knows its memory
    best, batch, accum, batch_note = fit_batch(p, gpu, available)
    savers = [] if best else fitting_savers(p, gpu.device, available, machine)
    if savers:  # what makes it fit there after all, cheapest in speed first
        o = savers[0]
        batch_note += (f"; fits with --set {' '.join(o['set'])} ({human_bytes(o['total'])}"
                       + (f"; {o['why']})" if o["why"] else ")"))
    m = throughput.mfu_for(p, settings, gpu, given=mfu)
    tps = throughput.tokens_per_s(p, settings, m)
    t = plan_cost.estimate_time(p, tps) if tps and best else None
    cost = plan_cost.estimate_cost(t.total_s, gpu.power_w, usd_per_hour, usd_per_kwh) if t else None
    return {
        "gpu": gpu.name, "device": gpu.device, "memory": gpu.memory_bytes, "available": available,
        "estimate": mem.total, "fits": est.fits(mem, available),
        "precision": settings.precision, "compile_mode": settings.compile_mode, "peak_flops": settings.peak_flops,
        "fit_batch": best, "batch_size": batch, "grad_accum": accum, "batch_note": batch_note,
        "mfu": m.value if tps and best else None, "mfu_basis": m.basis, "mfu_why": m.why,
        "tokens_per_s": tps if best else None, "time_s": t.total_s if t else None,
        "watts": gpu.power_w, "kwh": cost.kwh if cost else None,
        "usd_per_hour": usd_per_hour, "usd": cost.usd if cost else None,
        "note": note or ("" if tps else f"no {settings.precision} peak for {gpu.name}"),
        "savers": savers,
    }


def gpu_report(preset: Preset, gpu: GpuSpec, *, precision: str | None = None, mfu: float | None = None,
               tokens_per_s: float | None = None, watts: float | None = None, usd_per_hour: float | None = None,
               usd_per_kwh: float | None = None) -> EstimateReport:
    """The ``workbench estimate`` report of ``preset`` as if on ``gpu`` (``estimate --gpu NAME``): on
    :func:`machine_with` that GPU, at its dense peak and the MFU of :mod:`workbench.plan.throughput`
    (or ``mfu``), with its board power for the energy. Its ``on_gpu`` says the table's row, why the preset
    changed for it, and the MFU."""
    check_mfu(mfu)
    p, note = on_gpu(preset, gpu, precision)
    machine, settings = gpu_settings(p, gpu)
    m = throughput.mfu_for(p, settings, gpu, given=mfu)
    source = "given with --tokens-per-s"
    if tokens_per_s is None:
        tokens_per_s = throughput.tokens_per_s(p, settings, m)
        source = throughput.describe(p, settings, gpu, m) if tokens_per_s else ""
    r = build_report(p, machine, device=gpu.device, tokens_per_s=tokens_per_s, peak=gpu_peak(gpu),
                     watts=gpu.power_w if watts is None else watts, usd_per_hour=usd_per_hour,
                     usd_per_kwh=usd_per_kwh)
    r.tokens_per_s_source = source or None
    if r.cost:
        r.cost.watts_source = "given" if watts is not None else f"{gpu.name} typical power, GPU table"
    r.on_gpu = OnGpu(gpu, note, m.to_dict() if r.tokens_per_s else None)
    return r


# ----------------------------------------------------------------------------- many GPUs

def _sort_key(sort: str) -> Callable[[dict], tuple]:
    def key(row: dict) -> tuple:
        time = row["time_s"] if row["time_s"] is not None else math.inf
        if sort == "cost":
            return (row["usd"] is None, row["usd"] if row["usd"] is not None else 0.0, time)
        return (time,)
    return key


def compare(preset: Preset, gpus: Iterable[GpuSpec] | None = None, *, precision: str | None = None,
            mfu: float | None = None, prices: Mapping[str, float] | None = None, usd_per_kwh: float | None = None,
            sort: str = "time") -> dict[str, Any]:
    """``preset`` on each of ``gpus`` (default: the table's compare set), one row per GPU, sorted by
    time to max_iters or by cost (rows without one last, in table order). ``prices``: $ per hour
    by GPU table name (see :func:`parse_price`, :func:`load_prices`)."""
    if sort not in SORT_KEYS:
        raise WorkbenchError(f"--sort {sort!r} must be one of {', '.join(SORT_KEYS)}")
    check_mfu(mfu)
    prices = dict(prices or {})
    for name, value in prices.items():
        check_price(value, f"the price of {name}")
    if usd_per_kwh is not None:
        check_price(usd_per_kwh, "--usd-per-kwh")
    if sort == "cost" and not prices and usd_per_kwh is None:
        raise WorkbenchError("--sort cost needs prices: --usd-per-hour 'NAME=PRICE' (repeatable), --prices FILE.toml "
                             "or --usd-per-kwh")
    chosen = list(gpus) if gpus is not None else compare_set()
    rows = [gpu_row(preset, g, precision=precision, mfu=mfu, usd_per_hour=prices.get(g.name),
                    usd_per_kwh=usd_per_kwh) for g in chosen]
    rows.sort(key=_sort_key(sort))
    n = count_params(preset.model)
    notes = []
    if mfu is None:
        notes.append("MFU: measured on an H100 for a setup compiled the same way, scaled by model size "
                     f"(x (N / N_measured)^{throughput.SIZE_EXPONENT}); the same on every GPU (see "
                     "workbench/plan/throughput.py); give --mfu to use your own")
    if n < SMALL_MODEL:
        notes.append(f"{millions(n, '.1f')} parameters: small models are launch- and memory-bound, the MFU is the "
                     "least certain number here")
    if any(r["fit_batch"] and not r["fits"] for r in rows):
        notes.append("where the preset fits only at a smaller micro-batch (fits: no, a fit batch), the time is at "
                     "the same MFU; a smaller micro-batch usually reaches less")
    unpriced = [r["gpu"] for r in rows if r["usd"] is None and r["time_s"] is not None]
    if prices and unpriced:
        notes.append(f"no price given for {len(unpriced)} GPU(s)")
    return {
        "preset": preset.name, "params": n, "max_iters": preset.train.max_iters,
        "tokens_per_step": preset.tokens_per_step(), "tokens": preset.tokens_per_step() * preset.train.max_iters,
        "headroom": est.HEADROOM, "sort": sort, "mfu_given": mfu, "prices": prices, "usd_per_kwh": usd_per_kwh,
        "rows": rows, "notes": notes,
    }


# ----------------------------------------------------------------------------- checks and prices

def check_mfu(mfu: float | None) -> None:
    if mfu is not None and not (math.isfinite(mfu) and 0 < mfu <= 1):
        raise WorkbenchError(f"--mfu {mfu:g} must be a fraction in (0, 1], e.g. 0.35 for 35 %")


def check_price(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise WorkbenchError(f"{what} must be a number of dollars >= 0, got {value!r}")
    return float(value)


def parse_price(text: str) -> tuple[str, float]:
    """``"NAME=PRICE"`` (dollars per hour) -> (the GPU's table name, price)."""
    name, sep, value = text.rpartition("=")
    if not sep or not name.strip() or not value.strip():
        raise WorkbenchError(f"--usd-per-hour {text!r}: write NAME=PRICE, e.g. --usd-per-hour 'H100=2.49'")
    try:
        price = float(value)
    except ValueError:
        raise WorkbenchError(f"--usd-per-hour {text!r}: {value.strip()!r} is not a number of dollars per "
                             "hour") from None
    return find_gpu(name.strip()).name, check_price(price, f"--usd-per-hour {text!r}")


def load_prices(path: str | Path) -> dict[str, float]:
    """Dollars per hour by GPU from a TOML file: ``"NAME" = PRICE`` lines (names as ``--gpu`` takes
    them), at the top level or in a ``[usd_per_hour]`` table."""
    path = Path(path)
    data = read_toml(path, WorkbenchError, "cannot read prices file {path}: {why}",
                     "prices file {path} is not valid TOML: {why}")
    table = data.get("usd_per_hour", data) if isinstance(data.get("usd_per_hour"), dict) else data
    if table is not data and set(data) - {"usd_per_hour"}:
        extra = ", ".join(sorted(set(data) - {"usd_per_hour"}))
        raise WorkbenchError(f"prices file {path}: unexpected key(s) {extra} beside [usd_per_hour]")
    prices: dict[str, float] = {}
    for name, value in table.items():
        try:
            gpu = find_gpu(name)
        except WorkbenchError as e:
            raise WorkbenchError(f"prices file {path}: {e}") from None
        prices[gpu.name] = check_price(value, f"prices file {path}: the price of {name!r}")
    return prices

