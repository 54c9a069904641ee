"""Training memory by component of a preset: arithmetic, no torch (run time, energy and cost: ``plan.cost``).

Every ``auto`` (device, precision, attention kernel, fused AdamW, the fused loss's chunk) comes
from :func:`workbench.plan.settings.resolve_settings`, so the estimate describes the run the
trainer would do. Parameter and FLOP counts are in :mod:`workbench.plan.fit.flops`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from workbench.config import Preset, PresetError
from workbench.config.objectives import SFT, objective_spec
from workbench.fmt import GiB as GB
from workbench.fmt import MiB as MB
from workbench.machine.detect import Machine, detect
from workbench.plan.fit.activations import layer_activation_bytes, lora_layer_activation_bytes, qk_norm_bytes
from workbench.plan.fit.flops import (
    count_params,
    lora_params,
    matmul_params,
    param_breakdown,
    param_tensors,
)
from workbench.plan.recipe.objective_plan import ObjectivePlan, objective_plan
from workbench.plan.settings import PeakFn, RunSettings, resolve_settings

# ----------------------------------------------------------------------------- memory

# Allowances that are not tensors of the model. CUDA: the context (driver,
# kernels, cuBLAS/cuDNN handles) lives outside PyTorch's allocator and shows
# in nvidia-smi, ~0.3-0.6 GB with lazy module loading. CPU: importing torch
# and its CPU libraries adds ~0.35 GB of RSS (measured: peak RSS of bench/batch_sweep.py at batch 1).
CUDA_CONTEXT_BYTES = int(0.5 * GB)
CPU_FRAMEWORK_BYTES = int(0.35 * GB)
# torch.compile's own machinery (dynamo, inductor, the compiled kernels' loader) on a CPU, where it shares
# the RSS with the tensors: +146 MB measured after compiling one small function. A CPU run pays it when it
# compiles the model (hardware.compile) or steps 8-bit AdamW states (torchao compiles that step).
CPU_COMPILE_RUNTIME_BYTES = 146 * MB
MPS_FRAMEWORK_BYTES = int(0.25 * GB)
# The caching allocator (CUDA, MPS) and malloc (CPU) keep freed blocks that do
# not fit the next request. Measured on an H100 (bench/batch_sweep.py, eager):
# reserved = allocated x 1.06-1.22, the most where big logits come and go.
FRAGMENTATION = 0.12
# cuBLAS / cuBLASLt workspaces, allocated through PyTorch's caching allocator
# (so inside max_memory_allocated): measured ~70-120 MiB above the tensors on an
# H100 with torch 2.11 / CUDA 13 across presets.
CUDA_WORKSPACE_BYTES = 72 * MB
HEADROOM = 0.10  # "fits" means total <= (1 - HEADROOM) x what the device has
# workbench.train.loop keeps only the loss of a forward (the logits are dropped at once), so the logits count
# at the end of the forward and the start of the backward, not in the late backward or the optimizer step.
# torch.compile on CUDA without activation checkpointing (the blocks one graph: whole model, or all but
# the fused loss): inductor's partitioner recomputes the cheap elementwise work in backward and keeps
# this share of what eager saves. Its fused cross-entropy (whole model) keeps no fp32 logits: at the
# start of backward the logits in the compute dtype, their gradient and one more such buffer. Fitted
# on an H100 (torch 2.11, bf16) to the ~124 M config (dim 768, 12 layers, seq 1024, vocab 32k) at batch
# 32 with the plain loss (20,098 MiB peak allocated) and the fused loss (14,962 MiB); then within 1.2 %
# at batch 16 and 48 and for gpu-8gb without checkpointing (GQA, dropout, another MLP width), which the
# fit did not see (README, GPU numbers; tests/plan/test_estimate.py).
COMPILED_ACTIVATION_SHARE = 0.68
COMPILED_LOGIT_COPIES = 3
# hardware.optimizer_states = 8bit (torchao's AdamW8bit): each moment of a tensor of at least this many values
# (a multiple of the block) is one uint8 code per value, one fp32 scale per block and a 256-entry fp32 map;
# smaller tensors keep fp32 moments (as bitsandbytes does).
STATE_BLOCK = 256
STATE_MIN_VALUES = 4096
# hardware.optimizer_states = offload: torchao's CPUOffloadOptimizer keeps tensors under this many values (its
# minimal_size) and their states on the device
OFFLOAD_MIN_VALUES = 4096


def adamw_state_bytes(sizes: list[int], states: str = "fp32") -> int:
    """Bytes of AdamW's two moments for tensors of ``sizes`` values: 8 a value in fp32; with 8-bit
    states ~2 a value (above) for each tensor large enough to be quantised."""
    def one(n: int) -> int:
        if states == "8bit" and n >= STATE_MIN_VALUES and n % STATE_BLOCK == 0:
            return 2 * (n + 4 * (n // STATE_BLOCK) + 4 * 256)
        return 8 * n
    return sum(one(n) for n in sizes)


def what_if(preset: Preset, *, precision: str | None = None, device: str | None = None,
            batch_size: int | None = None, activation_checkpointing: bool | None = None) -> Preset:
    """The preset with these values in place of its own (the estimate of another setup)."""
    hw: dict[str, Any] = {}
    tr: dict[str, Any] = {}
    if precision:
        hw["precision"] = precision
    if device:
        hw["device"] = device
    if activation_checkpointing is not None:
        hw["activation_checkpointing"] = "true" if activation_checkpointing else "false"
    if batch_size:
        tr["batch_size"] = batch_size
    return dataclasses.replace(preset, hardware=dataclasses.replace(preset.hardware, **hw),
                               train=dataclasses.replace(preset.train, **tr))


def estimate_settings(preset: Preset, machine: Machine | None = None, peak: PeakFn | float | None = None
                      ) -> RunSettings:
    """The settings of one process of the preset's run: on ``machine`` (default: this one, detected
    without torch), or, when the preset names a device that machine lacks, on a machine that has it
    (an estimate for the GPU one is about to rent)."""
    machine = machine or Machine.from_info(detect())
    want = preset.hardware.device
    if want != "auto" and not machine.has(want):
        machine = Machine.assumed(want)
    return resolve_settings(preset, machine, world_size=1, peak=peak)


@dataclass(frozen=True)
class MemoryEstimate:
    """Training memory of one preset on one setup, in bytes (``estimate_memory``). ``components`` is what
    is resident at the peak and sums to ``peak_allocated``; ``total`` adds allocator fragmentation and the
    framework's own memory. ``to_dict()`` is its JSON form (``workbench estimate --json``'s "memory")."""
    preset: str
    device: str
    precision: str
    attention: str
    activation_checkpointing: bool
    fused_adamw: bool
    whole_compiled: bool
    optimizer_states: str
    batch_size: int
    seq_len: int
    grad_accum: int
    params: int
    components: dict[str, int]
    peak_phase: str
    phases: dict[str, int]
    peak_allocated: int
    fragmentation: int
    framework: int
    total: int
    per_layer: dict[str, int]
    model_states: int
    finetune: str
    trainable_params: int
    activations_total: int
    checkpoint_bytes: int      # a checkpoint's model.pt + state.pt: the trained weights and the optimizer's states
    host_offload: int = 0      # hardware.optimizer_states = offload: pinned host memory (weights, gradients, moments)
    objective: str = SFT       # train.objective (plan.recipe.objective_plan)
    reference: str = "none"    # a preference run's reference: none | adapters off | frozen copy
    reference_why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ModelStates:
    """The weights, their gradients and the optimizer's states, and the optimizer step's temporaries."""
    params: int
    trainable: int
    weights: int
    gradients: int
    optimizer: int
    optimizer_temp: int
    offloaded: int = 0         # hardware.optimizer_states = offload: pinned host bytes (see model_state_bytes)
    offloaded_states: int = 0  # of which AdamW's moments (a checkpoint holds them)


def model_state_bytes(preset: Preset, settings: RunSettings) -> ModelStates:
    """Weights and gradients are fp32 whatever the precision (autocast computes in bf16/fp16 but keeps fp32
    parameters, the "master" copy); AdamW keeps two fp32 states per parameter (~2 bytes with 8-bit states),
    Muon one momentum buffer for the hidden matrices. A LoRA run keeps its frozen projections (and an
    untied head) in the compute dtype, the embedding and norms in fp32; only its adapters are trained."""
    c, t = preset.model, preset.train
    mixed = settings.precision != "fp32"
    D = c.dim
    n = count_params(c)
    lora = t.finetune == "lora"
    n_train = lora_params(c, t) if lora else n
    if lora:
        parts = param_breakdown(c)
        frozen_cast = parts["attention"] + parts["mlp"] + parts["lm_head"]
        weights = (2 if mixed else 4) * frozen_cast + 4 * (n - frozen_cast) + 4 * n_train
    else:
        weights = 4 * n
    # the hidden matrices (attention and MLP weights, not their biases) have Muon's one buffer under muon
    muon = t.optimizer == "muon" and not lora
    tensors = param_tensors(c, t)
    n_muon = sum(k for kind, k in tensors if muon and kind in ("attention", "mlp"))
    adamw_sizes = [k for kind, k in tensors if not (muon and kind in ("attention", "mlp"))]
    optimizer = adamw_state_bytes(adamw_sizes, settings.optimizer_states) + 4 * n_muon
    offloaded = offloaded_states = 0
    if settings.optimizer_states == "offload":
        # torchao's CPUOffloadOptimizer: each tensor of OFFLOAD_MIN_VALUES or more keeps a pinned host copy of
        # its weight and its gradient and AdamW's two fp32 moments there (16 bytes a value, none on the GPU);
        # smaller ones (the norms) stay on the device with their moments.
        big = sum(k for k in adamw_sizes if k >= OFFLOAD_MIN_VALUES)
        offloaded_states = adamw_state_bytes([k for k in adamw_sizes if k >= OFFLOAD_MIN_VALUES])
        offloaded = 2 * 4 * big + offloaded_states
        optimizer = adamw_state_bytes([k for k in adamw_sizes if k < OFFLOAD_MIN_VALUES]) + 4 * n_muon
    # AdamW's step: the fused kernel needs no temporaries; the foreach version (CUDA's default) makes one
    # fp32 sqrt(v) per parameter at once; the per-tensor loop (CPU and MPS default) about three temporaries
    # of the largest tensor; 8-bit states' compiled per-tensor step one tensor's moments dequantised and
    # its update.
    if settings.optimizer_states == "8bit":
        opt_temp = 16 * max(adamw_sizes)
    elif settings.fused_optimizer or settings.optimizer_states == "offload":  # offload: the step is the host's
        opt_temp = 0
    elif settings.device_type.startswith("cuda"):
        opt_temp = 4 * (n_train - n_muon)
    elif lora:
        opt_temp = 12 * t.lora_rank * max(D, c.hidden_dim, c.n_heads * c.head_dim)
    else:
        opt_temp = 12 * max(c.vocab_size * D, D * c.hidden_dim, D * c.n_heads * c.head_dim)
    if n_muon:  # Newton-Schulz works on one matrix at a time: a few copies of the largest hidden one
        opt_temp = max(opt_temp, 16 * max(D * c.hidden_dim, D * c.n_heads * c.head_dim))
    return ModelStates(n, n_train, weights, 4 * n_train, optimizer, opt_temp, offloaded, offloaded_states)


@dataclass(frozen=True)
class Activations:
    """What the forward saves for the backward, and the casts of the weights that live with it."""
    total: int                 # the whole model's saved activations (inductor's share where compiled)
    layer_full: int            # one block's, computed (or recomputed under checkpointing)
    layer_checkpointed: int    # one block's under activation checkpointing: its input
    casts_all: int             # every matmul weight cast to the compute dtype (autocast)
    casts_head: int            # the head's cast alone
    layer_casts: int           # one block's casts
    transient: int             # one block's backward temporaries


def activation_bytes(preset: Preset, settings: RunSettings) -> Activations:
    """Saved activations, per block and in all, and the autocast weight casts (each fp32 weight a matmul
    reads is cast once per forward and lives until its backward; LoRA: the adapters and a tied head).
    Compiled on CUDA without checkpointing the blocks save ``COMPILED_ACTIVATION_SHARE`` of eager's."""
    c, t = preset.model, preset.train
    dev, prec = settings.device_type, settings.precision
    B, T, D, V, L = settings.micro_batch, c.seq_len, c.dim, c.vocab_size, c.n_layers
    mixed = prec != "fp32"
    a = 2 if mixed else 4
    BTD = B * T * D
    lora = t.finetune == "lora"
    if lora:
        n_train = lora_params(c, t)
        casts_all = (2 * n_train + (2 * V * D if c.tie_embeddings else 0)) if mixed else 0
        casts_head = 2 * V * D if mixed and c.tie_embeddings else 0
        layer_full = lora_layer_activation_bytes(c, t, B, prec, settings.attention, dev, settings.masked_attention)
        layer_casts = 2 * (n_train // L) if mixed else 0
    else:
        casts_all = 2 * matmul_params(c) if mixed else 0
        casts_head = 2 * V * D if mixed else 0
        layer_full = layer_activation_bytes(c, B, prec, settings.attention, dev, settings.masked_attention)
        layer_casts = 2 * ((matmul_params(c) - V * D) // L) if mixed else 0
    layer_ckpt = 4 * BTD  # the checkpoint keeps only the block's input
    # ids, targets, dropout mask
    emb = 16 * B * T + (BTD * (1 if dev.startswith("cuda") else 4) if c.dropout > 0 else 0)
    if settings.packed:  # positions and segments (int64) and the bool mask all blocks share (none with flex)
        emb += 16 * B * T + (B * T * T if settings.masked_attention else 0)
    # final norm input + normalised (kept for the norm weight's gradient: not with LoRA) + lm_head input
    head = 4 * BTD + (0 if lora else 4 * BTD) + (a * BTD if mixed else 4 * BTD)
    total = L * (layer_ckpt if settings.activation_checkpointing else layer_full) + emb + head
    if compiled_blocks(settings):  # the blocks are one compiled graph: inductor saves less than eager
        # QK-norm apart: inductor keeps q and k in the compute dtype and recomputes both norms (H100, 2026-11-24)
        qk_eager, qk_compiled = (0, 0) if lora else (qk_norm_bytes(c, B, a, False), qk_norm_bytes(c, B, a, True))
        total = int(COMPILED_ACTIVATION_SHARE * (total - L * qk_eager)) + L * qk_compiled
    transient = 3 * a * B * T * c.hidden_dim + 8 * BTD
    return Activations(total, layer_full, layer_ckpt, casts_all, casts_head, layer_casts, transient)


def compiled_blocks(settings: RunSettings) -> bool:
    """Compiled on CUDA without activation checkpointing: the blocks are one graph."""
    return settings.compile and settings.device_type.startswith("cuda") and not settings.activation_checkpointing


@dataclass(frozen=True)
class Logits:
    forward: int               # at the end of the forward
    backward: int              # at the start of the backward


def logit_bytes(preset: Preset, settings: RunSettings) -> Logits:
    """The logits and the loss's buffers. The fused loss (hardware.chunked_loss) holds one chunk's logits
    and the gradients of x and w it computes as it goes; a whole-model compile keeps no fp32 copy;
    eager keeps the logits, their fp32 copy and the log-softmax, then 12 bytes per logit in backward."""
    c, t = preset.model, preset.train
    mixed = settings.precision != "fp32"
    a = 2 if mixed else 4
    B, T, D, V = settings.micro_batch, c.seq_len, c.dim, c.vocab_size
    BTV = B * T * V
    lora = t.finetune == "lora"
    chunk = settings.loss_chunk_tokens
    if chunk:
        fused_grads = 4 * B * T * D + (0 if lora else 4 * V * D)  # a frozen head gets no gradient
        head_fp32 = not lora or c.tie_embeddings
        fwd = chunk * V * (4 + (2 * a if mixed else 0)) + fused_grads + (a * V * D if mixed and head_fp32 else 0)
        return Logits(fwd, fused_grads)
    if compiled_blocks(settings) and settings.compile_mode == "whole model":
        return Logits(a * BTV + 8 * B * T, COMPILED_LOGIT_COPIES * a * BTV)  # + their log-sum-exp
    return Logits(a * BTV + (4 * BTV if mixed else 0) + 4 * BTV, 12 * BTV)


def peak_phase(states: ModelStates, acts: Activations, logits: Logits, settings: RunSettings,
               grad_accum: int, workspace: int, reference: int = 0) -> tuple[str, dict[str, int], dict[str, int]]:
    """(the phase of the step's peak, every phase's bytes, what is resident at the peak by component).

    * end of forward: all saved activations, the logits (and their fp32 copy and log-softmax)
    * start of backward: the loss's backward buffers; gradients are not yet allocated when grad_accum == 1
      (the loop zeroes them with set_to_none)
    * late in backward: all gradients, one block's activations (recomputed under checkpointing, with its
      casts) and its backward temporaries
    * optimizer step: weights + gradients + states + the step's temporaries

    A preference run's frozen ``reference`` copy is resident throughout."""
    ckpt = settings.activation_checkpointing
    grads_resident = states.gradients if grad_accum > 1 else 0
    static = states.weights + states.optimizer + grads_resident + reference
    late_acts = acts.layer_full + acts.transient + (acts.layer_checkpointed if ckpt else 0)
    casts_backward = acts.casts_head if ckpt else acts.casts_all
    parts = {
        "end of forward": dict(gradients=grads_resident, activations=acts.total, weight_casts=acts.casts_all,
                               logits=logits.forward),
        "start of backward": dict(gradients=grads_resident, activations=acts.total, weight_casts=casts_backward,
                                  logits=logits.backward),
        "optimizer step": dict(gradients=states.gradients, optimizer_temp=states.optimizer_temp),
        "late backward": dict(gradients=states.gradients, activations=late_acts, weight_casts=acts.layer_casts),
    }
    components = {name: {"weights": states.weights, "gradients": 0, "optimizer": states.optimizer,
                         "weight_casts": 0, "activations": 0, "logits": 0, "optimizer_temp": 0,
                         "workspace": workspace, "reference": reference} | kv for name, kv in parts.items()}
    phases = {name: sum(comp.values()) for name, comp in components.items()}
    assert phases["end of forward"] == static + acts.casts_all + acts.total + logits.forward + workspace
    phase = max(phases, key=lambda name: phases[name])
    return phase, phases, components[phase]


def framework_bytes(settings: RunSettings) -> int:
    """Memory outside the tensors: the CUDA context, or torch's own RSS (and compile's, on a CPU)."""
    dev = settings.device_type
    if dev.startswith("cuda"):
        return CUDA_CONTEXT_BYTES
    if dev == "mps":
        return MPS_FRAMEWORK_BYTES
    compiles = settings.compile or settings.optimizer_states == "8bit"
    return CPU_FRAMEWORK_BYTES + (CPU_COMPILE_RUNTIME_BYTES if compiles else 0)


def estimate_memory(preset: Preset, precision: str | None = None, device: str | None = None,
                    batch_size: int | None = None, activation_checkpointing: bool | None = None, *,
                    machine: Machine | None = None, settings: RunSettings | None = None) -> MemoryEstimate:
    """Training memory by component, in bytes, at the step's peak: the model's states, the activations, the
    logits, each phase of the step (see the helpers above), fragmentation and the framework. Eager PyTorch,
    except where compiled on CUDA without checkpointing (``COMPILED_ACTIVATION_SHARE``, and a whole-model
    compile's logits); per-block compile under activation checkpointing is modelled as eager, which it
    matches."""
    preset = what_if(preset, precision=precision, device=device, batch_size=batch_size,
                     activation_checkpointing=activation_checkpointing)
    if settings is None:
        settings = estimate_settings(preset, machine)
    c, t = preset.model, preset.train
    dev = settings.device_type
    states = model_state_bytes(preset, settings)
    objective = objective_or_none(preset)
    # a preference pair is two rows a forward (its chosen and its rejected answer); the reference's own forward
    # runs before the policy's, without gradients, so only a frozen copy's weights add to the peak
    rows = dataclasses.replace(settings, micro_batch=settings.micro_batch * objective.rows_per_item)
    acts = activation_bytes(preset, rows)
    workspace = CUDA_WORKSPACE_BYTES if dev.startswith("cuda") else 0
    reference = reference_bytes(preset, settings, objective)
    phase, phases, comp = peak_phase(states, acts, logit_bytes(preset, rows), settings, t.grad_accum, workspace,
                                     reference)
    churn = comp["activations"] + comp["logits"] + comp["weight_casts"] + comp["optimizer_temp"]
    fragmentation = int(FRAGMENTATION * churn)
    framework = framework_bytes(settings)
    B, prec, ckpt = settings.micro_batch, settings.precision, settings.activation_checkpointing
    return MemoryEstimate(
        preset=preset.name, device=dev, precision=prec, attention=settings.attention,
        activation_checkpointing=ckpt, fused_adamw=bool(settings.fused_optimizer),
        whole_compiled=compiled_blocks(settings) and settings.compile_mode == "whole model",
        optimizer_states=settings.optimizer_states, batch_size=B, seq_len=c.seq_len, grad_accum=t.grad_accum,
        params=states.params, components=comp, peak_phase=phase, phases=phases, peak_allocated=phases[phase],
        fragmentation=fragmentation, framework=framework, total=phases[phase] + fragmentation + framework,
        per_layer={"saved": acts.layer_checkpointed if ckpt else acts.layer_full,
                   "flash": layer_activation_bytes(c, B, prec, "flash", dev, settings.masked_attention),
                   "math": layer_activation_bytes(c, B, prec, "math", dev, settings.masked_attention),
                   "checkpointed": acts.layer_checkpointed},
        model_states=states.weights + states.gradients + states.optimizer, finetune=t.finetune,
        trainable_params=states.trainable, activations_total=acts.total,
        checkpoint_bytes=4 * states.trainable + states.optimizer + states.offloaded_states,
        host_offload=states.offloaded, objective=objective.objective, reference=objective.reference,
        reference_why=objective.reference_why)


def objective_or_none(preset: Preset) -> ObjectivePlan:
    """The preset's objective plan; one that cannot run (a reference objective with no --init-from) is estimated
    as if it needed no reference (the run itself is refused with the reason)."""
    try:
        return objective_plan(preset)
    except PresetError:
        o = preset.train.objective
        return ObjectivePlan(o, rows_per_item=objective_spec(o).rows_per_item)


def reference_bytes(preset: Preset, settings: RunSettings, objective: ObjectivePlan) -> int:
    """A frozen copy of the weights (a full fine-tune's reference): its matrices in the compute dtype (2 bytes a
    parameter in bf16/fp16, 4 in fp32), its embedding and norms in fp32 as the policy's are (so that it computes
    what the policy computes under autocast); the reference of a LoRA run is the model itself with its adapters
    off (0)."""
    if objective.reference != "frozen copy":
        return 0
    parts = param_breakdown(preset.model)
    kept = parts["embedding"] + parts["norms"]
    return (2 if settings.precision != "fp32" else 4) * (count_params(preset.model) - kept) + 4 * kept


def fits(mem: MemoryEstimate, available: int | None, headroom: float = HEADROOM) -> bool | None:
    """Whether ``mem.total`` fits in ``available`` bytes keeping ``headroom`` spare (None: unknown)."""
    if not available:
        return None
    return mem.total <= (1.0 - headroom) * available
