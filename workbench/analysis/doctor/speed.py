"""Slow: the run below the speed its estimate expects, and why: not on the GPU, other processes on the
CPU or GPU, waiting for data, compile off where it would pay, fp32 on a GPU with bf16, a throttled GPU; and a
large share of its wall-clock spent in evals."""

from __future__ import annotations

import dataclasses
import math
import statistics

from workbench.analysis.doctor.facts import Context, RunFacts
from workbench.analysis.doctor.finding import Finding, env_path_hint, num, percent, set_line
from workbench.errors import WorkbenchError
from workbench.fmt import millions
from workbench.machine.activity import GpuProcess
from workbench.machine.peaks import peak_flops
from workbench.plan.report import build_report
from workbench.plan.schedule.evals import eval_batches
from workbench.plan.settings import resolve_settings
from workbench.rundir import LIVE_STATES

# Throughput is compared with the estimate from SPEED_MIN_RECORDS log records on (the median of the
# last SPEED_WINDOW): fewer are warm-up and noise.
SPEED_WINDOW = 20
SPEED_MIN_RECORDS = 5
# Below ~1 M parameters a step is mostly fixed per-step cost (Python, kernel launches, the optimizer's
# loop over tensors), and FLOP-based estimates overstate the rate many times (a 0.13 M-parameter test
# model reaches ~1 % of the CPU's measured matmul rate): no speed verdict from the estimate there.
SPEED_MIN_PARAMS = 1_000_000
# Slow: under half the expected tokens/s. The estimate's own error is well inside that (cpu-small runs
# at ~1.3x the CPU estimate's assumed efficiency; the GPU MFUs were measured), so half is a real shortfall.
SLOW_RATIO = 0.5
SLOW_RATIO_HIGH = 0.25

# Other processes: a quarter of the machine's CPU taken from a trainer that uses every core costs it
# about that share of its speed (measured here: cpu-small 3,197 vs 4,313 tokens/s with another process
# on the 2 cores); half of it is most of a 2-core laptop.
OTHERS_CPU_SHARE = 0.25
OTHERS_CPU_HIGH = 0.5
# Another process on the run's GPU: this share of its SMs, or of its memory, is contention worth naming.
GPU_OTHER_SM_PCT = 10.0
GPU_OTHER_MEMORY = 0.10

# Waiting for data: a tenth of each step drawing batches. A window read from the page cache costs well
# under 1 % of a step (0.1 % in the tiny test runs); 10 % means the token file is read from a slow or
# busy disk (or does not fit in RAM), and the device idles that long every step.
DATA_WAIT_FRACTION = 0.10
DATA_WAIT_HIGH = 0.30        # ... and a high-severity finding from this share on

# Evals: the share of the run's wall-clock spent in them, their samples included (analysis.time_spent). A tenth
# is a tenth of the training given up to watch it: worth knowing; a quarter is a clear waste. (cpu-small as
# shipped, 600 steps on a 2-core CPU: 8.9 % before eval_iters became auto and the eval's loss lost its needless
# gradient, 5.7 % after; README, Performance.)
EVAL_SHARE = 0.10
EVAL_SHARE_HIGH = 0.25
# ... judged, while the run is live, once it has had this much wall-clock: before, the step-0 eval and the set-up
# weigh more than they will over the run. A run that has ended is judged whatever its length: that was its time.
EVAL_SHARE_MIN_SECONDS = 60.0
# The eval_interval suggested brings the share to about this.
EVAL_SHARE_TARGET = 0.05
# Evals that took less than this in all are no finding, whatever their share: a run of a few seconds (the suite's
# tiny runs) spends ~5-10 % of them in evals, and saving a second is nothing to act on.
EVAL_SHARE_MIN_EVAL_SECONDS = 2.0

THERMAL = ("thermal (software)", "thermal (hardware)", "hardware slowdown", "power brake (hardware)")


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for fn in (_not_on_gpu, _busy_cpu, _busy_gpu, _throttled, _data_wait, _compile_off, _fp32_on_bf16_gpu):
        if (f := fn(ctx)) is not None:
            out.append(f)
    if (f := _throughput(ctx, causes=out)) is not None:
        out.insert(0, f)
    if (f := _eval_share(ctx)) is not None:  # not a cause of slow steps: tokens/s leaves evals out
        out.append(f)
    return out


def _not_on_gpu(ctx: Context) -> Finding | None:
    f, m = ctx.facts, ctx.machine
    if f.device != "cpu" or not m.gpus or f.preset is None:
        return None
    names = ", ".join(f"{g.name} (cuda:{g.index})" for g in m.gpus)
    if f.preset.hardware.device == "cpu":
        values = {"hardware.device": "auto"}
        return Finding("slow", "slow.not_on_gpu", "high", "the run trains on the CPU while this machine has a GPU",
                       (f"device cpu (hardware.device = \"cpu\"); NVML sees {names}",), set_line(values), values,
                       ctx.apply_command(values), step=f.start.step if f.start else None)
    check_cmd = "python -c 'import torch; print(torch.__version__, torch.cuda.is_available())'"
    return Finding("slow", "slow.not_on_gpu", "high", "the run trains on the CPU: PyTorch does not see this "
                   "machine's GPU", (f"device cpu with hardware.device = \"auto\"; NVML sees {names}",),
                   f"install a CUDA build of PyTorch (https://pytorch.org/get-started/locally/), then check: "
                   f"{check_cmd}", command=check_cmd, step=f.start.step if f.start else None)


def _busy_cpu(ctx: Context) -> Finding | None:
    a, f = ctx.snapshot.activity, ctx.facts
    if a is None or not f.live:
        if not f.live:
            ctx.note("other processes: not sampled (the run is not running)")
        return None
    if a.others_share < OTHERS_CPU_SHARE:
        return None
    named = ", ".join(f"pid {p.pid} {p.name} ({percent(p.cpu_share)})" for p in a.others[:5]) or "none above " \
        "a few % each"
    top = a.others[0] if a.others else None
    evidence: tuple[str, ...] = (
        f"over {a.interval_s:g} s: other processes {percent(a.others_share)} of the {a.logical_cores} logical cores, "
        f"the trainer {percent(a.run_share)}", f"busiest: {named}")
    if top is not None and top.command:
        evidence += (f"pid {top.pid}: {top.command}",)
    if top is None:
        change, command = "close what else runs (`top` shows it)", "top"
    else:
        command = f"renice -n 19 -p {top.pid}"
        change = f"stop pid {top.pid} ({top.name}) while training, or lower its priority: {command}"
    return Finding("slow", "slow.busy_cpu", "high" if a.others_share >= OTHERS_CPU_HIGH else "medium",
                   f"other processes use {percent(a.others_share)} of the CPU while the run trains", evidence,
                   change, command=command, step=f.step,
                   also=("`kill -STOP PID` pauses a process and `kill -CONT PID` lets it go on",),
                   data={"others_share": a.others_share, "run_share": a.run_share,
                         "processes": [dataclasses.asdict(p) for p in a.others]})


def _run_gpu_index(ctx: Context) -> int | None:
    dev = ctx.facts.device or ""
    return int(dev.partition(":")[2] or 0) if dev.startswith("cuda") else None


def _busy_gpu(ctx: Context) -> Finding | None:
    a, f, idx = ctx.snapshot.activity, ctx.facts, _run_gpu_index(ctx)
    if a is None or idx is None or not f.live:
        return None
    on_gpu = [p for p in a.gpu_processes if p.gpu == idx]
    if on_gpu and not any(p.pid in a.run_pids for p in on_gpu):
        ctx.note("GPU processes: NVML's process ids do not match the trainer's (another pid namespace, "
                 "e.g. a container): not compared")
        return None
    g = ctx.machine.gpu(f.device or "")
    total = g.total_memory if g else None
    busy = [p for p in on_gpu if p.pid not in a.run_pids and ((p.sm_pct or 0) >= GPU_OTHER_SM_PCT or (
        total and p.memory_bytes and p.memory_bytes / total >= GPU_OTHER_MEMORY))]
    if not busy:
        return None

    def what(p: GpuProcess) -> str:
        parts = [f"{p.sm_pct:.0f} % of the SMs"] if p.sm_pct is not None else []
        if p.memory_bytes:
            parts.append(f"{p.memory_bytes / 2**30:.1f} GiB")
        return f"pid {p.pid} {p.name} ({', '.join(parts) or 'busy'})"
    pids = " ".join(str(p.pid) for p in busy)
    return Finding("slow", "slow.busy_gpu", "high", f"other processes share the run's GPU (cuda:{idx})",
                   (f"NVML: {', '.join(what(p) for p in busy)}",),
                   f"stop pid {busy[0].pid} ({busy[0].name}) while training (`nvidia-smi` lists what uses the GPU)",
                   command=f"kill {pids}", step=f.step,
                   data={"processes": [dataclasses.asdict(p) for p in busy]})


def _throttled(ctx: Context) -> Finding | None:
    a, idx = ctx.snapshot.activity, _run_gpu_index(ctx)
    if a is None or idx is None or not ctx.facts.live:
        return None
    g = next((x for x in a.gpus if x.index == idx), None)
    if g is None or not g.throttle:
        return None
    thermal = [r for r in g.throttle if r in THERMAL]
    if thermal:
        change = "cool the card: fans, airflow, dust; `nvidia-smi -q -d TEMPERATURE,PERFORMANCE` shows why"
    else:
        change = ("the card is at its power limit (normal under full load): `nvidia-smi -q -d POWER` shows it; "
                  "`sudo nvidia-smi -pl WATTS` raises it where the card allows")
    return Finding("slow", "slow.throttled", "medium" if thermal else "low",
                   f"the GPU's clocks are held down: {', '.join(g.throttle)}",
                   (f"NVML clock event reasons on {g.name} (cuda:{idx}): {', '.join(g.throttle)}"
                    + (f"; utilisation {g.utilization_pct} %" if g.utilization_pct is not None else ""),),
                   change, command="nvidia-smi -q -d PERFORMANCE", step=ctx.facts.step)


def _recent(ctx: Context, attr: str) -> list[float]:
    vals = [v for r in ctx.facts.recent if (v := getattr(r, attr)) is not None]
    return vals[-SPEED_WINDOW:]


def _data_wait(ctx: Context) -> Finding | None:
    fr = _recent(ctx, "data_fraction")
    if len(fr) < SPEED_MIN_RECORDS:
        return None
    med = statistics.median(fr)
    if med < DATA_WAIT_FRACTION:
        return None
    return Finding("slow", "slow.data_wait", "high" if med >= DATA_WAIT_HIGH else "medium",
                   f"{percent(med)} of each step is spent waiting for training data",
                   (f"median data_fraction {med:.3f} over the last {len(fr)} log records (the share of each logged "
                    f"interval spent drawing batches and moving them to the device)",
                    f"the token cache: {env_path_hint()}"),
                   "keep the token cache on a fast local disk with RAM to spare: "
                   "export WORKBENCH_CACHE_DIR=/fast/local/disk (then `workbench data prepare` the corpus there)",
                   command="export WORKBENCH_CACHE_DIR=/fast/local/disk", step=ctx.facts.step,
                   also=("free RAM so the token file stays in the page cache",),
                   data={"data_fraction": med})


def _compile_off(ctx: Context) -> Finding | None:
    f = ctx.facts
    p = f.preset
    if p is None or f.start_value("compile") is not False or p.hardware.compile == "auto" or not f.device:
        return None
    if not ctx.machine.has(f.device):
        return None
    # the run's device, with compile left to auto (the same rule that decides it for a new run)
    auto = dataclasses.replace(p, hardware=dataclasses.replace(p.hardware, compile="auto", device=f.device))
    steps_left = max(0, f.max_iters - f.step) if f.live else f.max_iters
    try:
        s = resolve_settings(auto, ctx.machine, world_size=int(f.start_value("world_size") or 1),
                             steps_left=steps_left, peak=f.start_value("peak_flops"))
    except WorkbenchError:
        return None
    if not s.compile:
        return None
    gain = ("on an H100 the ~124 M model went from 183,517 to 462,652 tokens/s" if s.device_type == "cuda"
            else "cpu-small: +4-6 % tokens/s for an ~18 s compile")
    values = {"hardware.compile": "auto"}
    return Finding("slow", "slow.compile_off", "medium" if s.device_type == "cuda" else "low",
                   "torch.compile is off where it would pay back",
                   (f"hardware.compile = \"{p.hardware.compile}\"; with auto it would compile ({s.compile_reason}; "
                    f"compile mode: {s.compile_mode})", f"measured: {gain}"),
                   set_line(values), values, ctx.apply_command(values), step=f.start.step if f.start else None)


def _fp32_on_bf16_gpu(ctx: Context) -> Finding | None:
    f = ctx.facts
    if not (f.device or "").startswith("cuda") or f.start_value("precision") != "fp32":
        return None
    g = ctx.machine.gpu(f.device or "")
    if g is None or g.compute_capability is None or not g.ampere_or_newer:
        return None
    bf16, fp32 = peak_flops(g.name, "bf16"), peak_flops(g.name, "fp32")
    peaks = (f"; peak {bf16 / 1e12:.0f} TFLOP/s in bf16 vs {fp32 / 1e12:.0f} in fp32 (GPU table)"
             if bf16 and fp32 else "")
    values = {"hardware.precision": "auto"}
    return Finding("slow", "slow.fp32", "medium", "training in fp32 on a GPU with bf16 tensor cores",
                   (f"precision fp32 on {g.name} (compute capability {g.compute_capability[0]}."
                    f"{g.compute_capability[1]}){peaks}",),
                   set_line(values) + " (bf16 autocast there; weights and optimizer stay fp32)", values,
                   ctx.apply_command(values), step=f.start.step if f.start else None)


def nice_ceil(x: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at least ``x``: an interval a person would choose."""
    k = 10 ** max(0, math.floor(math.log10(max(1.0, x))))
    return next(m * k for m in (1, 2, 5, 10) if m * k >= x)


def _eval_cadence(f: RunFacts, interval: int, step_s: float, per_eval: float, batches: int) -> str:
    """How often the run evaluates, as it does: "an eval every 200 steps of ~0.05 s, each ...", or for a run no longer
    than its interval the evals it made ("2 evals in 17 steps (at steps 0 and 17: ...), each ...": the step-0 eval and
    the last)."""
    each = f"each ~{per_eval:.2f} s ({batches or '?'} batches of train and of val)"
    if interval < f.max_iters or not f.evals:
        return f"an eval every {interval:,} steps of ~{step_s:.2f} s, {each}"
    steps = [f"{e.step:,}" for e in f.evals]
    at = " and ".join([", ".join(steps[:-1]), steps[-1]] if len(steps) > 1 else steps)
    n = len(steps)
    return (f"{n} eval{'' if n == 1 else 's'} in {f.step:,} steps (at step{'' if n == 1 else 's'} {at}: the eval "
            f"interval, {interval:,}, is longer than the run), {each}; a step ~{step_s:.2f} s")


def _eval_share(ctx: Context) -> Finding | None:
    f, p, ts = ctx.facts, ctx.facts.preset, ctx.facts.time_spent
    young = f.state in LIVE_STATES and ts is not None and ts.elapsed_s < EVAL_SHARE_MIN_SECONDS
    if p is None or ts is None or young or ts.eval_share < EVAL_SHARE or ts.eval_s < EVAL_SHARE_MIN_EVAL_SECONDS:
        return None
    t = p.train
    recorded = [e.seconds for e in f.evals if e.seconds is not None and e.step > 0]  # the first draws its batches
    per_eval = statistics.median(recorded) if recorded else ts.eval_s / max(1, len(f.evals))
    step_s = max(1e-9, ts.elapsed_s - ts.eval_s - ts.ckpt_s) / max(1, ts.step)
    # the interval at which an eval is EVAL_SHARE_TARGET of the time: per_eval / (per_eval + interval x step_s)
    interval = min(f.max_iters, nice_ceil(per_eval * (1 - EVAL_SHARE_TARGET) / (EVAL_SHARE_TARGET * step_s)))
    batches = int(f.start_value("eval_iters") or t.eval_iters or 0)
    val_tokens = f.start_value("val_tokens")
    auto = eval_batches(dataclasses.replace(p, train=dataclasses.replace(t, eval_iters=0)),
                        int(val_tokens) if val_tokens else None)[0]
    options = []
    if t.eval_iters and auto < batches:
        options.append(({"train.eval_iters": 0}, f"auto: {auto} batches of train and of val instead of {batches}, "
                        f"~{percent(ts.eval_share * auto / batches)} of the time"))
    if interval > t.eval_interval:
        options.append(({"train.eval_interval": interval}, f"an eval every {interval:,} steps instead of "
                         f"{t.eval_interval:,}, ~{percent(EVAL_SHARE_TARGET)} of the time"))
    if not options and batches > 1:
        # the evals that weigh are ones no interval removes (the step-0 and the last, in a run shorter than an
        # interval): fewer batches each, at the price of a noisier val loss. An eval's time is its batches'.
        rest = ts.elapsed_s - ts.eval_s
        fewer = max(1, math.floor(batches * EVAL_SHARE_TARGET / (1 - EVAL_SHARE_TARGET) * rest / ts.eval_s))
        if fewer < batches:
            new_eval = ts.eval_s * fewer / batches
            options.append(({"train.eval_iters": fewer}, f"{fewer} batch{'' if fewer == 1 else 'es'} of train and of "
                             f"val instead of {batches}, ~{percent(new_eval / (rest + new_eval))} of the time; the val "
                             "loss is noisier"))
    longer = ("a longer time budget (train.time_budget): the first and last evals take the same time however long "
              "the run" if t.time_budget else "more steps (train.max_iters): the first and last evals take the same "
              "time however long the run")
    if not options:
        options.append(({}, longer))
    elif len(f.evals) <= 2:
        options.append(({}, longer))
    (values, why), also = options[0], tuple(f"{set_line(v)} ({w})" if v else w for v, w in options[1:])
    return Finding("slow", "slow.eval_share", "medium" if ts.eval_share >= EVAL_SHARE_HIGH else "low",
                   f"{percent(ts.eval_share)} of the run's time goes to evals",
                   (f"{num(ts.eval_s)} s of the run's {num(ts.elapsed_s)} s in evals and their samples, as of step "
                    f"{ts.step}", _eval_cadence(f, t.eval_interval, step_s, per_eval, batches)),
                   f"{set_line(values)} ({why})" if values else why, values,
                   ctx.apply_command(values) if values else "", step=ts.step, also=also,
                   data={"eval_share": ts.eval_share, "eval_s": ts.eval_s, "elapsed_s": ts.elapsed_s,
                         "eval_seconds": per_eval, "step_seconds": step_s})


def _throughput(ctx: Context, causes: list[Finding]) -> Finding | None:
    f = ctx.facts
    p, start = f.preset, f.start
    if p is None or start is None or not f.device:
        return None
    params = int(start.get("params") or 0)
    if params < SPEED_MIN_PARAMS:
        ctx.note(f"speed vs the estimate: not judged below {millions(SPEED_MIN_PARAMS, 'g')} parameters "
                 f"(this model has {millions(params, '.2f')}; per-step overhead dominates)")
        return None
    if int(start.get("world_size") or 1) > 1:
        ctx.note("speed vs the estimate: not judged for a run of several processes")
        return None
    tps = _recent(ctx, "tokens_per_s")
    if len(tps) < SPEED_MIN_RECORDS:
        return None
    if not ctx.machine.has(f.device):
        ctx.note(f"speed vs the estimate: the run's device {f.device} is not on this machine")
        return None
    peak = start.get("peak_flops")
    try:
        r = build_report(p, ctx.machine, device=f.device, precision=start.get("precision"),
                         peak=(lambda _d, _p: peak) if peak else None)
    except WorkbenchError as e:
        ctx.note(f"speed vs the estimate: no estimate ({e})")
        return None
    expected = r.tokens_per_s
    if not expected:
        ctx.note("speed vs the estimate: no estimate of tokens/s on this device")
        return None
    med = statistics.median(tps)
    ratio = med / expected
    if ratio >= SLOW_RATIO:
        return None
    mfu = _recent(ctx, "mfu")
    mfu_text = f" (MFU {percent(statistics.median(mfu))})" if mfu else ""
    first = causes[0] if causes else None
    change = first.change if first else (
        "check that nothing else uses the machine (`top`, `nvidia-smi`) and that PyTorch is current "
        "(`pip install -U torch`); `workbench estimate` shows what the estimate assumes")
    return Finding("slow", "slow.throughput", "high" if ratio < SLOW_RATIO_HIGH else "medium",
                   f"training runs at {percent(ratio)} of the speed expected on this device",
                   (f"median {num(med)} tokens/s over the last {len(tps)} log records{mfu_text}",
                    f"expected ~{num(expected)} tokens/s ({r.tokens_per_s_source})"),
                   change, dict(first.set) if first else {}, first.command if first else "", step=f.step,
                   also=tuple(c.change for c in causes[1:3]),
                   data={"tokens_per_s": med, "expected_tokens_per_s": expected, "ratio": ratio})
