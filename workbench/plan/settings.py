"""Every ``auto`` of a preset, decided once: :func:`resolve_settings` turns a preset and a
machine description into frozen :class:`RunSettings` that the trainer, ``estimate``, ``fit``,
the launcher and the TUI all read. No other module decides device, precision, the AMP dtype,
TF32, the attention kernel, the fused optimizer, the fused loss's chunk, compile, or the
process layout.

Torch-free: the machine is a :class:`workbench.machine.detect.Machine` (detected with or
without torch, or written by hand for a machine that is not this one), and the peak FLOP/s
that the CPU compile rule needs is passed in.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

from workbench.config import DataConfig, Preset
from workbench.config.objectives import objective_spec
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine
from workbench.plan.fit.flops import flops_per_token
from workbench.plan.fit.savers import choose_memory_savers, compile_mode


class SettingsError(WorkbenchError):
    """A preset that asks for something this machine does not have (exit 2, nothing started)."""


PeakFn = Callable[[str, str], "float | None"]

# hardware.compile = auto compiles a CPU run expected to take at least this long (eager).
CPU_COMPILE_MIN_SECONDS = 600
# The share of the peak an eager CPU step reaches (the loop measured 70-85 %), for run time.
EAGER_CPU_EFFICIENCY = 0.7


@dataclass(frozen=True)
class RunSettings:
    """What a run of a preset does on a machine, every ``auto`` resolved."""
    device: str                  # cpu | mps | cuda | cuda:N
    precision: str               # fp32 | bf16 | fp16
    autocast: str | None         # the AMP dtype (bf16 | fp16), None for fp32
    grad_scaler: bool            # fp16 needs loss scaling
    tf32: bool                   # TF32 matmuls on CUDA
    attention: str               # flash | math: the SDPA kernel's memory behaviour
    fused_optimizer: bool        # the fused AdamW kernel
    loss_chunk_tokens: int       # > 0: the fused loss, this many tokens a chunk; 0: the plain loss
    activation_checkpointing: bool
    compile: bool
    compile_mode: str            # off | per block | all but the loss | whole model
    compile_reason: str
    nproc: int                   # trainer processes on this machine
    nproc_reason: str
    world_size: int              # processes over all machines
    micro_batch: int             # sequences per process per micro-batch
    parallel: str                # none | ddp | fsdp
    peak_flops: float | None     # for MFU and the compile rule
    attention_kernel: str = "auto"    # auto | flash | cudnn | efficient: the CUDA SDPA backend; flex (packed rows)
    deterministic: bool = False       # CUDA: deterministic algorithms (hardware.deterministic)
    compile_kernels: str = "default"  # torch.compile's mode (default | reduce-overhead | max-autotune ...)
    nonfinite_check: str = "host"     # host | device: where a non-finite step is caught (nonfinite_check())
    optimizer_states: str = "fp32"    # fp32 | 8bit | offload: AdamW's moments (hardware.optimizer_states)
    packed: bool = False              # packed conversations: attention takes a block-diagonal mask
    savers_reason: str = ""           # why the fused loss and activation checkpointing are on or off
    warnings: tuple[str, ...] = ()

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def masked_attention(self) -> bool:
        """Packed rows through SDPA with a [B, 1, T, T] mask (flex attention takes a BlockMask instead)."""
        return self.packed and self.attention_kernel != "flex"

    def describe(self) -> str:
        """One line: what a user would want to know before a run starts."""
        parts = [self.device, self.precision, f"compile {self.compile_mode}",
                 "fused loss" if self.loss_chunk_tokens else "plain loss",
                 "fused AdamW" if self.fused_optimizer else
                 {"8bit": "AdamW, 8-bit states", "offload": "AdamW, states on the CPU"}.get(self.optimizer_states,
                                                                                            "AdamW")]
        if self.activation_checkpointing:
            parts.append("activation checkpointing")
        if self.world_size > 1:
            parts.append(f"{self.world_size} processes ({self.parallel})")
        return ", ".join(parts)


# ----------------------------------------------------------------------------- the single decisions

def resolve_device(want: str, machine: Machine) -> str:
    """auto: cuda > mps > cpu. An explicit device this machine lacks is refused."""
    if want == "auto":
        return machine.best_device()
    if not machine.has(want):
        if want.startswith("cuda"):
            have = ", ".join(f"cuda:{g.index}" for g in machine.gpus)
            what = f"this machine has {have}" if have else "CUDA is not available here"
            raise SettingsError(f"hardware.device = {want!r} but {what}; use --set hardware.device=auto (or cpu)")
        raise SettingsError(f"hardware.device = {want!r} but MPS is not available here; "
                            "use --set hardware.device=auto")
    return want


def resolve_precision(want: str, device: str, machine: Machine) -> str:
    """auto: bf16 on CUDA with bf16 tensor cores (Ampere+) and on MPS, fp16 with a GradScaler on
    older CUDA, fp32 on CPU (bf16 autocast on a CPU without native bf16 is ~28x slower)."""
    kind = device.split(":")[0]
    if want != "auto":
        if want == "fp16" and kind == "cpu":
            raise SettingsError("hardware.precision = 'fp16' is not supported on CPU; use fp32 (or bf16)")
        return want
    if kind == "cuda":
        gpu = machine.gpu(device)
        return "bf16" if gpu is None or gpu.ampere_or_newer else "fp16"
    return "bf16" if kind == "mps" else "fp32"


def attention_kind(device: str, dropout: float) -> str:
    """Which SDPA kernel the model gets, for memory: "flash" keeps O(T) per head (CUDA flash /
    memory-efficient kernels, CPU flash without dropout); "math" materialises the T x T
    attention weights (MPS; CPU with dropout). Packed conversations' mask does not change the class
    (the CPU flash and CUDA memory-efficient kernels take it); it adds its own bytes (the estimate's
    ``masked``)."""
    if device.startswith("cuda"):
        return "flash"
    if device == "mps":
        return "math"
    return "math" if dropout > 0 else "flash"


def attention_kernel(setting: str, device_type: str, deterministic: bool, packed: bool = False,
                     dropout: float = 0.0) -> str:
    """The CUDA attention kernel: the preset's, or torch's choice (auto); with hardware.deterministic,
    auto means the memory-efficient kernel, whose backward can run without atomics. Packed conversations
    without attention dropout: auto means flex attention (a BlockMask skips the blocks across
    conversations; on an H100 at gpu-8gb's shape 0.67 ms for attention's forward + backward against 1.41 ms
    for SDPA with the mask, which only the memory-efficient kernel takes: bench/packed_attention.py)."""
    if device_type != "cuda":
        return "auto"
    if setting == "flex" and dropout > 0:
        raise SettingsError(f"hardware.attention_kernel = 'flex' has no attention dropout (model.dropout = "
                            f"{dropout:g}); set model.dropout = 0, or hardware.attention_kernel = auto")
    if deterministic and setting == "auto":
        return "efficient"
    if setting == "auto" and packed and dropout == 0:
        return "flex"
    return setting


def fused_optimizer_wanted(setting: str, device: str, machine: Machine) -> bool:
    """auto: the fused AdamW kernel on CUDA and on CPU (+1 % for cpu-small, same state dict) where
    this torch has it; not on MPS (untested there)."""
    if setting != "auto":
        return setting == "true"
    kind = device.split(":")[0]
    return kind in ("cuda", "cpu") and kind in machine.fused_optimizer_devices


def eager_seconds(p: Preset, steps: int, peak: float | None) -> float | None:
    """Rough eager run time from FLOPs at 70 % of the peak (the CPU loop reaches 70-85 %)."""
    fpt = flops_per_token(p.model)
    if not (fpt and peak):
        return None
    return steps * p.tokens_per_step() * fpt / (EAGER_CPU_EFFICIENCY * peak)


def compile_wanted(setting: str, device_type: str, eager_seconds_left: float | None) -> bool:
    """torch.compile or not. auto: on for CUDA; on a CPU when the rest of the run would take
    10 minutes or more eager, so the compile pays back (cpu-small: 18 s cold for +4-6 %
    tokens/s, i.e. after ~7 minutes; a resume compiles warm from the run's cache); off on MPS."""
    if setting != "auto":
        return setting == "true"
    if device_type == "cuda":
        return True
    return device_type == "cpu" and eager_seconds_left is not None and eager_seconds_left >= CPU_COMPILE_MIN_SECONDS


def nonfinite_check(setting: str, *, world: int, fused_optimizer: bool, optimizer: str, grad_scaler: bool) -> str:
    """Where a step with a non-finite loss or gradient norm is caught. host: both are copied to the
    CPU before every update, which makes the CPU wait for the GPU once a step (it then has no work
    queued while it launches the next step). device: the fused AdamW kernel is handed a flag it
    checks itself (its found_inf argument, as a GradScaler uses it) and skips the update, step count
    included; the loop reads the loss and norm a step later, or at once where it logs, evaluates or
    saves. auto: device where that kernel does the whole update (one process, fused AdamW, no Muon,
    no fp16 GradScaler, which keeps its own check); else host."""
    can = world == 1 and fused_optimizer and optimizer == "adamw" and not grad_scaler
    if setting == "device" and not can:
        raise SettingsError("hardware.nonfinite_check = 'device' needs one process, fused AdamW, "
                            "train.optimizer = adamw and no fp16; use auto or host")
    if setting == "host":
        return "host"
    return "device" if can else "host"


def process_layout(p: Preset, machine: Machine) -> tuple[int, str]:
    """(trainer processes on this machine, why). hardware.nproc > 0 is taken as it is; 0 = auto:
    one process per GPU, or on a CPU one per physical core (1 thread each; for cpu-small on 2
    cores: 4,189 vs 4,313 tokens/s for 1 x 2 threads on a quiet machine, but 3,197 vs 2,633 when
    another process shared the cores), the largest count that divides train.batch_size."""
    if p.hardware.nproc:
        return p.hardware.nproc, "hardware.nproc"
    dev = p.hardware.device
    if dev.startswith("cuda") or (dev == "auto" and machine.gpus):
        n, what = max(1, len(machine.gpus)), "one per GPU"
    elif dev == "mps" or (dev == "auto" and machine.mps):
        return 1, "one process (MPS)"
    else:
        n, what = min(8, machine.physical_cores or 1), "one per physical core, 1 thread each"
    b = p.train.batch_size
    while n > 1 and b % n:
        n -= 1
    return n, (what if n > 1 else "one process")


def parallel_kind(p: Preset, world: int, precision: str) -> str:
    """none (one process), ddp (replicated) or fsdp (hardware.shard: sharded), with what sharding refuses."""
    h, t = p.hardware, p.train
    parallel = "none" if world == 1 else ("fsdp" if h.shard else "ddp")
    if parallel == "fsdp" and t.optimizer == "muon":
        raise SettingsError("train.optimizer = muon does not work with hardware.shard = true (Muon orthogonalises "
                            "each whole matrix; FSDP2 splits them over the processes); set hardware.shard = false "
                            "(DDP) or train.optimizer = adamw")
    if parallel == "fsdp" and t.finetune == "lora":
        raise SettingsError("train.finetune = lora does not work with hardware.shard = true (the frozen weights and "
                            "the adapters differ in dtype and gradients); set hardware.shard = false: DDP copies "
                            "the small adapters' states to each process")
    if parallel == "fsdp" and h.optimizer_states == "8bit":
        raise SettingsError("hardware.optimizer_states = '8bit' does not work with hardware.shard = true yet (the "
                            "sharded 8-bit states do not gather into a loadable checkpoint); set hardware.shard = "
                            "false (DDP) or hardware.optimizer_states = 'fp32'")
    if parallel == "fsdp" and precision == "fp16":
        raise SettingsError("hardware.shard = true does not support fp16 (its GradScaler would decide to skip a "
                            "step on each rank's shard alone); use hardware.precision = bf16 or fp32")
    return parallel


# ----------------------------------------------------------------------------- all of them at once

def _packed_rows(d: DataConfig) -> bool:
    """``data.chat.chat_data.packed_rows``; the built-in corpus is never conversations, so a preset on it is resolved
    without loading the corpus readers (and numpy): the TUI's first frame recommends a shipped preset, and
    does not wait for them (bench/tui_first_paint.py)."""
    if d.format != "chat" and d.corpus in ("builtin", ["builtin"]):
        return False
    from workbench.data.chat.chat_data import packed_rows
    return packed_rows(d)


def resolve_settings(p: Preset, machine: Machine, *, world_size: int | None = None, steps_left: int | None = None,
                     peak: PeakFn | float | None = None) -> RunSettings:
    """The preset's run on ``machine``: every ``auto`` decided, impossible requests refused.

    ``world_size``: processes over all machines (default: this machine's process layout).
    ``steps_left``: optimizer steps still to run (default max_iters), for the compile rule.
    ``peak``: peak FLOP/s for (device, precision), a number or a function; default the GPU
    table (None on CPU and MPS, where it is measured: then auto does not compile a CPU run)."""
    h, t, m = p.hardware, p.train, p.model
    device = resolve_device(h.device, machine)
    kind = device.split(":")[0]
    precision = resolve_precision(h.precision, device, machine)
    warnings: list[str] = []
    if precision == "bf16" and kind == "cpu" and not machine.cpu_native_bf16:
        warnings.append("bf16 autocast on CPU is much slower than fp32 unless the CPU has native bf16")
    nproc, nproc_reason = process_layout(p, machine)
    world = world_size or nproc
    if t.batch_size % world:
        raise SettingsError(f"train.batch_size = {t.batch_size} does not split over {world} processes; "
                            f"use a batch size that is a multiple of {world}")
    parallel = parallel_kind(p, world, precision)
    micro = t.batch_size // world
    peak_value = peak(device, precision) if callable(peak) else peak
    if peak_value is None:
        peak_value = machine.peak_flops(device, precision)
    steps = t.max_iters if steps_left is None else steps_left
    eager = eager_seconds(p, steps, peak_value)
    if (budget := t.time_budget_s) is not None:
        eager = budget  # a budgeted run takes its budget, whatever max_iters says
    want_compile = compile_wanted(h.compile, kind, eager)
    if kind == "cpu" and want_compile and not machine.can_compile_cpu:
        want_compile = False
        warnings.append("torch.compile needs a C++ compiler on the CPU and none was found: training eager")
    if h.compile != "auto":
        reason = f"hardware.compile = {h.compile}"
    elif kind == "cuda":
        reason = "auto: always on CUDA"
    elif kind == "cpu":
        reason = ("auto: no run-time estimate, eager" if eager is None else
                  f"auto: ~{eager / 60:.0f} min eager, {'>=' if want_compile else '<'} "
                  f"{CPU_COMPILE_MIN_SECONDS // 60} min, where a compile pays back")
    else:
        reason = "auto: off on MPS"
    fused = fused_optimizer_wanted(h.fused_adamw, device, machine)
    packed = not objective_spec(p.train.objective).preference and _packed_rows(p.data)  # preference: an answer a row
    if packed and kind == "cuda" and h.attention_kernel == "flash":
        raise SettingsError("hardware.attention_kernel = 'flash' cannot mask packed conversations (the flash kernel "
                            "takes no mask); use hardware.attention_kernel = auto, or data.packing = false")
    if h.optimizer_states in ("8bit", "offload"):
        if h.fused_adamw == "true":
            raise SettingsError(f"hardware.optimizer_states = '{h.optimizer_states}' has its own AdamW step "
                                "(torchao), not the fused kernel; set hardware.fused_adamw = auto or false")
        fused = False
    if h.optimizer_states == "offload":
        check_offload(kind, world, precision)
    s = RunSettings(
        device=device, precision=precision, autocast=precision if precision in ("bf16", "fp16") else None,
        grad_scaler=precision == "fp16", tf32=bool(h.tf32 and kind == "cuda"),
        attention=attention_kind(device, m.dropout),
        fused_optimizer=fused,
        loss_chunk_tokens=0, activation_checkpointing=False,
        compile=want_compile, compile_mode=compile_mode(False, 0) if want_compile else "off",
        compile_reason=reason, nproc=nproc, nproc_reason=nproc_reason, world_size=world, micro_batch=micro,
        parallel=parallel, peak_flops=peak_value, compile_kernels=h.compile_kernels,
        attention_kernel=attention_kernel(h.attention_kernel, kind, h.deterministic, packed, m.dropout),
        deterministic=h.deterministic and kind == "cuda",
        nonfinite_check=nonfinite_check(h.nonfinite_check, world=world, fused_optimizer=fused,
                                        optimizer=t.optimizer, grad_scaler=precision == "fp16"),
        optimizer_states=h.optimizer_states, packed=packed,
        warnings=tuple(warnings))
    return choose_memory_savers(p, s, machine)


def check_offload(kind: str, world: int, precision: str) -> None:
    """hardware.optimizer_states = offload (torchao's CPUOffloadOptimizer) runs on one CUDA GPU: it copies
    each gradient to the host as backward makes it and each updated weight back, with no collective, and
    its step has no GradScaler to unscale the host's copies."""
    if kind != "cuda":
        raise SettingsError("hardware.optimizer_states = 'offload' moves AdamW's states off a CUDA GPU; on "
                            f"{kind} they already live in this memory: use fp32 or 8bit")
    if world > 1:
        raise SettingsError("hardware.optimizer_states = 'offload' works with one process only; use hardware.nproc "
                            "= 1, or hardware.shard = true (FSDP2 splits the states over the GPUs) with fp32 states")
    if precision == "fp16":
        raise SettingsError("hardware.optimizer_states = 'offload' does not support fp16 (its GradScaler cannot "
                            "unscale the host's gradients); use hardware.precision = bf16 or fp32")


def check_installed(s: RunSettings) -> None:
    """Refuse, before a run starts, what this Python cannot do (the settings themselves are the same for
    an estimate on a machine one does not have): 8-bit optimizer states need torchao."""
    if s.optimizer_states in ("8bit", "offload") and importlib.util.find_spec("torchao") is None:
        raise SettingsError(f"hardware.optimizer_states = '{s.optimizer_states}' needs torchao, which is not "
                            "installed: pip install 'workbench[savers]' (or set hardware.optimizer_states = 'fp32')")
