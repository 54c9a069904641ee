"""The ``workbench estimate`` report: parameters, FLOPs, memory by component, whether it fits,
tokens/s (measured by an earlier run, given, or from a calibrated peak), time, energy and cost.

Torch-free: a measured peak FLOP/s is passed in by the caller (``workbench.machine.probe``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from workbench.config import Preset
from workbench.config.objectives import objective_spec
from workbench.errors import WorkbenchError
from workbench.fmt import duration, human_bytes
from workbench.machine.detect import Machine
from workbench.machine.gpus import GpuSpec, spec_for_device
from workbench.machine.peaks import peak_flops
from workbench.machine.rates import BUSY_SHARE
from workbench.plan import cost, throughput
from workbench.plan.cost import CostEstimate, TimeEstimate
from workbench.plan.fit import memory as est
from workbench.plan.fit.flops import count_params, flops_per_token, param_breakdown
from workbench.plan.fit.memory import HEADROOM, MemoryEstimate
from workbench.plan.fit.recommend import fitting_savers, suggest_changes
from workbench.plan.schedule.budget_plan import EVAL_SHARE, budget_plan_at, budget_too_short_at_best
from workbench.plan.settings import RunSettings
from workbench.reward.prompts import held_out_count, read_prompts

# What an earlier run of a preset measured on a device type (tokens/s, ...), or None: the reading of past
# runs lives above this layer (workbench.analysis.history.measured_in gives one for a runs directory).
History = Callable[[Preset, str], "dict | None"]

CPU_WATTS_ASSUMED = 65.0  # a desktop CPU package under load (the seeds' "CPU (i7) 65W")

# Share of the measured matmul rate a whole eager training step reaches: small
# models spend much of the step in memory-bound ops (norms, RoPE, softmax,
# AdamW). Measured eager on an H100: 10 % (medium) to 25 % (datacenter-80gb)
# of the bf16 peak; on a 2-core AVX-512 CPU, cpu-small reaches 67 % of the
# measured fp32 matmul rate (the CPU's matmul rate is far below its peak). Used only when no run
# of the preset has been measured here, and on CUDA only for a GPU that is not in the GPU table
# (one that is gets the MFU of workbench.plan.throughput, as `estimate --gpu` does).
ASSUMED_EFFICIENCY = {"cpu": 0.5, "cuda": 0.15, "mps": 0.15}
MEASURED_RATE = "this machine's measured matmul rate"


def table_gpu(machine: Machine, settings: RunSettings) -> GpuSpec | None:
    """The run's GPU as a row of the GPU table, when the settings' peak is that row's (not a calibration)."""
    g = machine.gpu(settings.device)
    spec = spec_for_device(g.name) if g else None
    return spec if spec and settings.peak_flops == spec.peak_flops(settings.precision) else None


def hardware_speed(p: Preset, settings: RunSettings, machine: Machine, device: str
                   ) -> tuple[float | None, str | None, str | None]:
    """(tokens/s, where it comes from, its basis in a few words) for ``p`` trained with ``settings`` on this
    machine's ``device``, from the hardware alone: a GPU of the table at the MFU `estimate --gpu` expects for it
    (workbench.plan.throughput: small models reach a small share), else the peak (measured here, or the table's)
    at an assumed efficiency. The estimate's when no run of the preset has measured it, and a budgeted run's
    guess at its end step until it has timed its own steps."""
    if not settings.peak_flops:
        return None, None, None
    if gpu := table_gpu(machine, settings):
        mfu = throughput.mfu_for(p, settings, gpu)  # the same MFU as `estimate --gpu` for this GPU
        tps = throughput.tokens_per_s(p, settings, mfu)
        return (tps, throughput.describe(p, settings, gpu, mfu), "estimate") if tps else (None, None, None)
    eff = ASSUMED_EFFICIENCY.get(settings.device_type, 0.3)
    tps = cost.tokens_per_s_from_flops(p.model, settings.peak_flops, eff)
    g = machine.gpu(device)
    # not the table's: the best matmul rate measured here (by this command, a run, or an earlier estimate)
    how = "peak table" if g and peak_flops(g.name, settings.precision) else MEASURED_RATE
    source = (f"estimate: {settings.peak_flops / 1e12:.3g} TFLOP/s ({how}) x {eff:.0%} assumed efficiency / "
              f"{flops_per_token(p.model) / 1e6:.4g} MFLOP per token")
    return tps, source, f"estimate from {how}"


def estimated_speed(p: Preset, settings: RunSettings, machine: Machine, device: str, prev: dict | None,
                    is_here: bool = True) -> tuple[float | None, str | None, str | None]:
    """(tokens/s, where it comes from, its basis in a few words) as the estimate has it without a given rate: an
    earlier run of the preset here (``prev``: a History's answer), else this machine's hardware
    (:func:`hardware_speed`). The estimate's, the CLI's first line's and a budgeted run's first guess at its end
    (the trainer asks the same with the same runs directory, so they say one number)."""
    if prev:
        source = f"measured: median of {prev['records']} log records of run {prev['run']}"
        if prev.get("match") == "model":  # a fine-tune of the same model under another preset's name
            source += f" (preset {prev['preset']}: the same model, batch, method and hardware settings)"
        basis = "measured"
        if (prev.get("others_busy") or 0.0) >= BUSY_SHARE:  # no quiet run of it here: say the number is low
            source += (f", which started with other processes using {prev['others_busy']:.0%} of the CPU (this "
                       "machine alone is likely faster)")
            basis = "measured beside other processes"
        return prev["tokens_per_s"], source, basis
    if is_here:
        return hardware_speed(p, settings, machine, device)
    return None, None, None


@dataclass
class OnGpu:
    """``estimate --gpu NAME``: the GPU of the table it is estimated on (:func:`workbench.plan.compare.gpu_report`)."""
    gpu: GpuSpec
    note: str                     # why the preset changed for it (a precision it lacks), or ""
    mfu: dict[str, Any] | None    # the MFU it assumes (throughput.Mfu.to_dict()), None when its speed is unknown


@dataclass
class FinetuneFacts:
    """``estimate --init-from RUN``: the checkpoint it starts from, its model, and the fine-tuning methods."""
    init: dict[str, Any]          # the preset's init (run, step, ...)
    source: dict[str, Any] | None  # where that model came from (an import's source), if known
    init_model: dict[str, int]    # the source's model shape (plan.recipe.finetune), whatever the preset's [model] says
    methods: dict[str, Any]       # plan.recipe.finetune.compare_methods: full / LoRA / LoRA + checkpointing here


@dataclass
class EstimateReport:
    """Everything ``workbench estimate`` prints. :meth:`to_dict` is its JSON (``estimate --json``): the optional
    fields (None) are left out, but for ``previous_run`` and the speed, which are always said."""
    preset: str
    params: dict[str, int]            # parameters by part (flops.param_breakdown) and their total
    flops_per_token: float
    tokens_per_step: int
    settings: RunSettings
    memory: MemoryEstimate
    available: int | None             # bytes of memory on the device here; None: unknown, or not this machine's
    available_what: str
    fits: bool | None
    device_here: str
    suggestion: str | None = None     # when it does not fit a known memory: what to change ...
    savers: list[dict[str, Any]] | None = None   # ... and every way it would fit (recommend.fitting_savers)
    previous_run: dict[str, Any] | None = None   # an earlier run of the preset here (a History's answer)
    tokens_per_s: float | None = None
    tokens_per_s_source: str | None = None
    tokens_per_s_basis: str | None = None
    budget_warning: str = ""
    time: TimeEstimate | None = None  # with a speed: the time (or a budget's steps), energy and cost
    cost: CostEstimate | None = None
    on_gpu: OnGpu | None = None       # estimate --gpu NAME
    calibration: dict[str, Any] | None = None    # the matmul rate measured now (machine.rates.Calibration)
    optimizer: str | None = None      # the preset's train.optimizer (the CLI's report)
    finetune: FinetuneFacts | None = None        # estimate --init-from RUN
    mixture: dict[str, Any] | None = None        # a mixture of sources: its realized shares

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "preset": self.preset, "params": self.params, "flops_per_token": self.flops_per_token,
            "tokens_per_step": self.tokens_per_step, "settings": self.settings.to_dict(), "memory": self.memory,
            "available": self.available, "available_what": self.available_what, "fits": self.fits,
            "device_here": self.device_here,
        }
        if self.savers is not None:
            d |= {"suggestion": self.suggestion, "savers": self.savers}
        d |= {"previous_run": self.previous_run, "tokens_per_s": self.tokens_per_s,
              "tokens_per_s_source": self.tokens_per_s_source, "tokens_per_s_basis": self.tokens_per_s_basis,
              "budget_warning": self.budget_warning}
        if self.time is not None:
            d |= {"time": self.time.to_dict(), "cost": self.cost.to_dict() if self.cost else None}
        if self.on_gpu is not None:
            d |= {"gpu": self.on_gpu.gpu.to_dict(), "gpu_note": self.on_gpu.note, "mfu": self.on_gpu.mfu}
        if self.calibration is not None:
            d["calibration"] = self.calibration
        if self.optimizer is not None:
            d["optimizer"] = self.optimizer
        if (f := self.finetune) is not None:
            d |= {"init": f.init, "source": f.source, "init_model": f.init_model, "methods": f.methods}
        if self.mixture is not None:
            d["mixture"] = self.mixture
        return d


def build_report(preset: Preset, machine: Machine, *, device: str | None = None, precision: str | None = None,
                 tokens_per_s: float | None = None, history: History | None = None,
                 peak: Callable[[str, str], float | None] | None = None, watts: float | None = None,
                 usd_per_hour: float | None = None, usd_per_kwh: float | None = None,
                 power_limit_w: float | None = None) -> EstimateReport:
    """Everything ``workbench estimate`` prints (:meth:`EstimateReport.to_dict`: as JSON).

    ``device`` / ``precision``: estimate another setup than the preset's. ``peak``: measured peak
    FLOP/s for (device, precision) on this machine, for the throughput when no run measured it."""
    for flag, v in (("usd_per_hour", usd_per_hour), ("usd_per_kwh", usd_per_kwh), ("watts", watts),
                    ("tokens_per_s", tokens_per_s)):
        if v is not None and (not math.isfinite(v) or v < 0 or (flag == "tokens_per_s" and v == 0)):
            raise WorkbenchError(f"--{flag.replace('_', '-')} {v:g} must be a positive number")
    here = machine.best_device()
    if device in (None, "auto"):
        device = preset.hardware.device if device is None else "auto"
    if device == "auto":
        device = here
    p = est.what_if(preset, precision=None if precision in (None, "auto") else precision, device=device)
    is_here = machine.has(device)
    settings = est.estimate_settings(p, machine, peak=peak if is_here else None)
    kind = settings.device_type
    mem = est.estimate_memory(p, settings=settings)
    avail, what = machine.memory(device) if is_here else (None, "")
    report = EstimateReport(
        preset=p.name, params=param_breakdown(p.model) | {"total": count_params(p.model)},
        flops_per_token=flops_per_token(p.model), tokens_per_step=p.tokens_per_step(), settings=settings,
        memory=mem, available=avail, available_what=what, fits=est.fits(mem, avail), device_here=here)
    if report.fits is False and avail is not None:  # (an unknown size fits neither way)
        report.suggestion = suggest_changes(p, device, avail, machine)
        report.savers = fitting_savers(p, device, avail, machine)

    # throughput: given > a previous run here > calibration
    prev = history(p, kind) if history else None
    report.previous_run = prev
    tps: float | None
    source: str | None
    basis: str | None
    if tokens_per_s:
        tps, source, basis = tokens_per_s, "given with --tokens-per-s", "given"
    else:
        tps, source, basis = estimated_speed(p, settings, machine, device, prev, is_here)
    report.tokens_per_s, report.tokens_per_s_source, report.tokens_per_s_basis = tps, source, basis
    # (unknown speed: nothing to say of a budget; the trainer sizes its evals from an eval batch it times)
    if tps:
        report.time = cost.estimate_time(p, tps)
        report.budget_warning = cost.budget_warning(p, tps)
        watts_src = "given"
        if watts is None:
            if kind == "cuda" and power_limit_w:
                watts, watts_src = power_limit_w, "GPU power limit (NVML)"
            elif kind == "cpu":
                watts, watts_src = CPU_WATTS_ASSUMED, "assumed for a CPU; set --watts"
        report.cost = cost.estimate_cost(report.time.total_s, watts, usd_per_hour, usd_per_kwh)
        report.cost.watts_source = watts_src if watts else None
    return report


@dataclass
class FitCheck:
    """What a user should see before a run starts: does it fit, and how long will it take."""
    fits: bool | None          # None: this machine's memory is unknown
    memory: str                # "fits: 650 MiB of 23.1 GiB available RAM (estimate)"
    time: str                  # "~3m 20s for 2,000 steps at 4,700 tokens/s (measured by run X)"
    suggestion: str = ""       # what would make it fit
    options: tuple[dict[str, Any], ...] = ()   # every way it would fit (recommend.fitting_savers), cheapest first
    budget_problem: str = ""   # a time budget too short to buy a complete run at the estimated speed
    budget_warning: str = ""   # ... or one whose set train.eval_iters costs more than the evals' share
    budget_steps: int | None = None  # the steps a time budget buys by the estimate (the trainer's first guess)

    def lines(self) -> list[str]:
        return [self.memory + (f"; try {self.suggestion}" if self.suggestion else ""), self.time]


def held_prompts(p: Preset) -> int | None:
    """A GRPO run's held-out prompts (what its evals roll out), counted from its prompts file; None for other
    objectives, or where the file cannot be read (the run's own start says why, in one line)."""
    corpus = p.data.corpus
    if not objective_spec(p.train.objective).samples or not isinstance(corpus, str):
        return None
    try:
        return held_out_count(len(read_prompts(corpus).items), p.data.val_fraction)
    except WorkbenchError:
        return None


def fit_check(preset: Preset, machine: Machine, history: History | None = None,
              peak: Callable[[str, str], float | None] | None = None) -> FitCheck:
    """The estimate a new run is shown before it starts (the new-run dialog, `workbench train`, `sweep`); with a
    time budget, its plan (budget_plan.plan_budget: the steps, warmup and evals it buys), and ``budget_problem`` when
    it cannot buy a complete run. ``peak``: as for build_report (a budget's steps need this machine's speed)."""
    r = build_report(preset, machine, history=history, peak=peak)
    m, avail = r.memory, r.available
    total = human_bytes(m.total)
    if r.fits is None:
        where = r.available_what or f"this machine has no {m.device} device"
        memory = f"needs ~{total} on {m.device} (estimate); {where}"
    else:
        memory = (f"{'fits' if r.fits else 'does not fit'}: ~{total} of {human_bytes(avail)} "
                  f"{r.available_what} (estimate, {HEADROOM:.0%} kept free)")
    problem = warning = ""
    steps = None
    if r.time and r.tokens_per_s and r.time.budget_s:
        plan = budget_plan_at(preset, r.tokens_per_s, basis=r.tokens_per_s_basis, held_prompts=held_prompts(preset))
        assert plan is not None
        problem, warning, steps = plan.problem, plan.warning, plan.steps
        if problem and not budget_too_short_at_best(preset, r.tokens_per_s, r.tokens_per_s_basis):
            # short by the estimate, not by twice its speed: said, and the run sizes its evals from a timed batch
            problem, warning = "", (f"{plan.problem} by the estimate ({r.tokens_per_s:,.0f} tokens/s, "
                                    f"{r.tokens_per_s_basis}); the run sizes its evals from an eval batch it times")
        time = problem or f"{plan.describe()}; at {r.tokens_per_s:,.0f} tokens/s ({r.tokens_per_s_basis})"
        if warning:
            time += f"; warning: {warning}"
    elif r.time and r.tokens_per_s:
        time = (f"~{duration(r.time.total_s)} for {preset.train.max_iters:,} steps at {r.tokens_per_s:,.0f} tokens/s "
                f"({r.tokens_per_s_basis})")
    else:
        time = "time: unknown until this machine's speed is measured (after a first run, or `workbench estimate`)"
        if preset.train.time_budget_s:
            time += (f"; the budget's evals are sized to at most {EVAL_SHARE:.0%} of it from an eval batch the run "
                     "times before its step-0 eval")
    return FitCheck(r.fits, memory, time, r.suggestion or "", tuple(r.savers or ()), problem, warning, steps)
