"""Training memory by component, run time, energy and cost of a preset: arithmetic, no torch.

Every ``auto`` (device, precision, attention kernel, fused AdamW, the fused loss's chunk) comes
from :func:`workbench.plan.settings.resolve_settings`, so the estimate describes the run the
trainer would do. Parameter and FLOP counts are in :mod:`workbench.plan.flops`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.config import Preset, lora_projections
from workbench.errors import WorkbenchError
from workbench.fmt import GiB as GB
from workbench.fmt import MiB as MB
from workbench.machine.detect import Machine, detect
from workbench.plan.flops import (
    count_params,
    flops_per_token,
    lora_params,
    matmul_params,
    param_breakdown,
    param_tensors,
    projection_shapes,
)
from workbench.plan.settings import RunSettings, resolve_settings

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
HEADROOM = 0.10
# workbench.train.loop keeps the logits returned by the model until the next
# forward (`_, loss = model(x, y)`); they count at every phase of the peak.
# torch.compile on CUDA without activation checkpointing (the blocks one graph: whole model, or all but
# the fused loss): inductor's partitioner recomputes the cheap elementwise work in backward and keeps
# this share of what eager saves. Its fused cross-entropy (whole model) keeps no fp32 logits: at the
# start of backward the logits in the compute dtype, their gradient and one more such buffer. Fitted
# on an H100 (torch 2.11, bf16) to the ~124 M config (dim 768, 12 layers, seq 1024, vocab 32k) at batch
# 32 with the plain loss (20,098 MiB peak allocated) and the fused loss (14,962 MiB); then within 1.2 %
# at batch 16 and 48 and for gpu-8gb without checkpointing (GQA, dropout, another MLP width), which the
# fit did not see (README, GPU numbers; tests/test_estimate.py).
COMPILED_ACTIVATION_SHARE = 0.68
COMPILED_LOGIT_COPIES = 3
LOGITS_HELD = False  # "fits" means total <= (1 - HEADROOM) x what the device has
# hardware.optimizer_states = 8bit (torchao's AdamW8bit): each moment of a tensor of at least this many values
# (a multiple of the block) is one uint8 code per value, one fp32 scale per block and a 256-entry fp32 map;
# smaller tensors keep fp32 moments (as bitsandbytes does).
STATE_BLOCK = 256
STATE_MIN_VALUES = 4096


def adamw_state_bytes(sizes: list[int], states: str = "fp32") -> int:
    """Bytes of AdamW's two moments for tensors of ``sizes`` values: 8 a value in fp32; with 8-bit
    states ~2 a value (above) for each tensor large enough to be quantised."""
    def one(n: int) -> int:
        if states == "8bit" and n >= STATE_MIN_VALUES and n % STATE_BLOCK == 0:
            return 2 * (n + 4 * (n // STATE_BLOCK) + 4 * 256)
        return 8 * n
    return sum(one(n) for n in sizes)


def layer_activation_bytes(model_cfg, batch_size: int, precision: str, attention: str,
                           device: str = "cuda") -> int:
    """Bytes one block saves for backward (no activation checkpointing), eager PyTorch.

    Counted from what autograd keeps for ``workbench.train.model.Block``: the
    residual stream is fp32 (fp32 weights, autocast leaves adds alone); RMSNorm
    keeps its input and the normalised fp32 tensor; under autocast each Linear
    keeps its own compute-dtype copy of its input (autocast caches casts of
    weights, not of activations, so wq, wk and wv each cast the norm output);
    SDPA keeps q, the (GQA-expanded) k and v, its output and the fp32
    log-sum-exp (flash) or the T x T weights (math); SwiGLU keeps w1/w3
    outputs, silu(w1) and the product; dropout keeps a mask (1 byte on CUDA,
    the tensor's dtype elsewhere). RoPE and the GQA repeat keep nothing large.
    QK-norm (``model.qk_norm``) normalises the projections' outputs, so each of
    its two RMSNorms keeps an fp32 copy of q (or k) and the normalised tensor
    (fp32 without autocast, the compute dtype with it).
    """
    c = model_cfg
    B, T, D, F, H = batch_size, c.seq_len, c.dim, c.hidden_dim, c.n_heads
    BTD = B * T * D
    mixed = precision != "fp32"
    a = 2 if mixed else 4
    norms = 2 * (4 * BTD + 4 * BTD)          # each RMSNorm: its fp32 input + the normalised tensor
    # (wq, wk, wv) + (w1, w3) casts, or the shared fp32 norm output
    linear_inputs = (3 + 2) * a * BTD if mixed else 2 * 4 * BTD
    wo_input = a * BTD
    if attention == "flash":
        attn = 4 * a * BTD + 4 * B * H * T   # q, k, v, out + fp32 logsumexp
    else:
        # CPU's math kernel upcasts bf16/fp16 to fp32 (measured with saved-tensor hooks)
        am = 4 if device == "cpu" else a
        attn = 3 * am * BTD + am * B * H * T * T   # q, k, v + softmax weights
        if c.dropout > 0:
            attn += 2 * am * B * H * T * T         # dropout mask and dropped weights
    mlp = 4 * a * B * T * F                   # w1 out, silu(w1 out), w3 out, product (w2 input)
    qk = (4 + a) * B * T * c.head_dim * (H + c.n_kv_heads) if c.qk_norm else 0
    drop = 0
    if c.dropout > 0:
        drop = 2 * BTD * (1 if device.startswith("cuda") else a)
    return norms + linear_inputs + wo_input + attn + mlp + qk + drop


def lora_layer_activation_bytes(model_cfg, train_cfg, batch_size: int, precision: str, attention: str,
                                device: str = "cuda") -> int:
    """Bytes one block saves for backward with LoRA (train.finetune = lora), from the full count
    (:func:`layer_activation_bytes`): frozen weights need no weight gradient, so autograd keeps neither
    the normalised tensors the RMSNorm weights would need (2 x fp32) nor the input of a projection
    without an adapter (its compute-dtype copy under autocast; in fp32 the shared norm output when no
    projection reading it has one); each adapter keeps its [B, T, r] hidden (and with lora_dropout the
    dropout mask and its dropped input). Measured with saved-tensor hooks on CPU: within 1 % for the
    default targets."""
    c, t = model_cfg, train_cfg
    B, T, D, F = batch_size, c.seq_len, c.dim, c.hidden_dim
    mixed = precision != "fp32"
    a = 2 if mixed else 4
    saved = layer_activation_bytes(c, B, precision, attention, device) - 2 * 4 * B * T * D
    targets = set(lora_projections(t.lora_targets))
    shapes = projection_shapes(c)
    if mixed:  # each projection keeps its own cast of its input
        saved -= sum(a * B * T * shapes[n][0] for n in ("wq", "wk", "wv", "wo", "w1", "w3") if n not in targets)
    else:      # the shared norm outputs, when nothing reading them has an adapter
        saved -= 4 * B * T * D * ((not targets & {"wq", "wk", "wv"}) + (not targets & {"w1", "w3"}))
        saved -= 0 if "wo" in targets else a * B * T * shapes["wo"][0]
    if "w2" not in targets:
        saved -= a * B * T * F
    mask = 1 if device.startswith("cuda") else 4
    for n in targets:
        saved += a * B * T * t.lora_rank
        if t.lora_dropout > 0:
            saved += B * T * shapes[n][0] * (4 + mask)
    return saved


def what_if(preset: Preset, *, precision: str | None = None, device: str | None = None,
            batch_size: int | None = None, activation_checkpointing: bool | None = None) -> Preset:
    """The preset with these values in place of its own (the estimate of another setup)."""
    hw, tr = {}, {}
    if precision:
        hw["precision"] = precision
    if device:
        hw["device"] = device
    if activation_checkpointing is not None:
        hw["activation_checkpointing"] = activation_checkpointing
    if batch_size:
        tr["batch_size"] = batch_size
    return dataclasses.replace(preset, hardware=dataclasses.replace(preset.hardware, **hw),
                               train=dataclasses.replace(preset.train, **tr))


def estimate_settings(preset: Preset, machine: Machine | None = None, peak=None) -> RunSettings:
    """The settings of one process of the preset's run: on ``machine`` (default: this one, detected
    without torch), or, when the preset names a device that machine lacks, on a machine that has it
    (an estimate for the GPU one is about to rent)."""
    machine = machine or Machine.from_info(detect())
    want = preset.hardware.device
    if want != "auto" and not machine.has(want):
        machine = Machine.assumed(want)
    return resolve_settings(preset, machine, world_size=1, peak=peak)


def estimate_memory(preset: Preset, precision: str | None = None, device: str | None = None,
                    batch_size: int | None = None, activation_checkpointing: bool | None = None, *,
                    machine: Machine | None = None, settings: RunSettings | None = None) -> dict[str, Any]:
    """Training memory by component, in bytes, at the step's peak, for eager PyTorch.

    Weights and gradients are fp32 whatever the precision (autocast computes in
    bf16/fp16 but keeps fp32 parameters, the "master" copy), AdamW keeps two
    fp32 states per parameter. Under autocast each Linear's weight is also cast
    once per forward and that copy lives until its backward ("weight casts").

    The peak is the largest of three moments:
    * end of forward: + all saved activations + logits (compute dtype) + fp32 copy + log-softmax
    * start of backward: the fp32 log-softmax output, its gradient and the
      gradient of its input (12 bytes per logit) and the logits the loop still
      holds (``LOGITS_HELD``); gradients are not yet allocated when grad_accum == 1
      (the loop zeroes them with set_to_none)
    * late in backward: all gradients, one block's activations (recomputed
      under checkpointing) and its backward temporaries
    * optimizer step: weights + gradients + states (+ one fp32 temporary per
      parameter for CUDA's foreach AdamW; a few tensors' worth for the per-tensor
      loop on CPU/MPS; none for the fused kernel)
    ``components`` holds what is resident at the peak and sums to ``peak_allocated``;
    ``total`` adds allocator fragmentation and the framework's own memory
    (CUDA context or torch's RSS). Compiled on CUDA without checkpointing, the blocks save less
    (``COMPILED_ACTIVATION_SHARE``) and a whole-model compile keeps the logits in the compute dtype
    only; per-block compile under activation checkpointing is modelled as eager, which it matches.
    """
    preset = what_if(preset, precision=precision, device=device, batch_size=batch_size,
                     activation_checkpointing=activation_checkpointing)
    if settings is None:
        settings = estimate_settings(preset, machine)
    c, t = preset.model, preset.train
    dev, prec = settings.device_type, settings.precision
    B = settings.micro_batch
    T, D, V, L = c.seq_len, c.dim, c.vocab_size, c.n_layers
    ckpt = settings.activation_checkpointing
    attn = settings.attention
    fused_adamw = settings.fused_optimizer
    mixed = prec != "fp32"
    a = 2 if mixed else 4
    BTD, BTV = B * T * D, B * T * V

    n = count_params(c)
    n_matmul = matmul_params(c)
    parts = param_breakdown(c)
    lora = t.finetune == "lora"
    # LoRA (workbench.train.lora): the frozen projections (and an untied head) are kept in the compute
    # dtype, the embedding and norms in fp32; only the adapters have gradients and AdamW states.
    n_train = lora_params(c, t) if lora else n
    if lora:
        frozen_cast = parts["attention"] + parts["mlp"] + parts["lm_head"]
        weights = (2 if mixed else 4) * frozen_cast + 4 * (n - frozen_cast) + 4 * n_train
    else:
        weights = 4 * n
    grads = 4 * n_train
    # AdamW keeps two fp32 states per parameter; with train.optimizer = muon the hidden matrices
    # (attention and MLP) have Muon's one momentum buffer instead.
    # (the hidden matrices: attention and MLP weights, not their biases, which AdamW keeps)
    muon = t.optimizer == "muon" and not lora
    tensors = param_tensors(c, t)
    n_muon = sum(n for kind, n in tensors if muon and kind in ("attention", "mlp"))
    adamw_sizes = [n for kind, n in tensors if not (muon and kind in ("attention", "mlp"))]
    eight_bit = settings.optimizer_states == "8bit"
    optimizer = adamw_state_bytes(adamw_sizes, settings.optimizer_states) + 4 * n_muon
    # AdamW's step: the fused kernel needs no temporaries; the foreach version
    # (CUDA's default) makes one fp32 sqrt(v) per parameter at once; the
    # per-tensor loop (CPU and MPS default) about three temporaries of the largest tensor.
    if eight_bit:  # the compiled per-tensor step: the moments of one tensor dequantised, and its update
        opt_temp = 16 * max(adamw_sizes)
    elif fused_adamw:
        opt_temp = 0
    elif dev.startswith("cuda"):
        opt_temp = 4 * (n_train - n_muon)
    elif lora:
        opt_temp = 12 * t.lora_rank * max(D, c.hidden_dim, c.n_heads * c.head_dim)
    else:
        opt_temp = 12 * max(V * D, D * c.hidden_dim, D * c.n_heads * c.head_dim)
    if n_muon:  # Newton-Schulz works on one matrix at a time: a few copies of the largest hidden one
        opt_temp = max(opt_temp, 16 * max(D * c.hidden_dim, D * c.n_heads * c.head_dim))
    # Under autocast each fp32 weight a matmul reads is cast once per forward (LoRA: the adapters, and a
    # tied head, which is the fp32 embedding).
    head_fp32 = not lora or c.tie_embeddings
    if lora:
        casts_all = (2 * n_train + (2 * V * D if c.tie_embeddings else 0)) if mixed else 0
        casts_head = 2 * V * D if mixed and c.tie_embeddings else 0
        layer_full = lora_layer_activation_bytes(c, t, B, prec, attn, dev)
    else:
        casts_all = 2 * n_matmul if mixed else 0
        casts_head = 2 * V * D if mixed else 0
        layer_full = layer_activation_bytes(c, B, prec, attn, dev)
    layer_ckpt = 4 * BTD  # the checkpoint keeps only the block's input
    # ids, targets, dropout mask
    emb = 16 * B * T + (BTD * (1 if dev.startswith("cuda") else 4) if c.dropout > 0 else 0)
    # final norm input + normalised (kept for the norm weight's gradient: not with LoRA) + lm_head input
    head = 4 * BTD + (0 if lora else 4 * BTD) + (a * BTD if mixed else 4 * BTD)
    per_layer = layer_ckpt if ckpt else layer_full
    activations = L * per_layer + emb + head
    grads_resident = grads if t.grad_accum > 1 else 0

    static = weights + optimizer + grads_resident
    # Logits exist for one loss chunk at a time when the loss is chunked (hardware.chunked_loss).
    chunk = settings.loss_chunk_tokens
    compiled_cuda = settings.compile and dev.startswith("cuda") and not ckpt
    whole_compiled = compiled_cuda and settings.compile_mode == "whole model"
    if compiled_cuda:  # the blocks are one compiled graph: inductor saves less than eager
        activations = int(COMPILED_ACTIVATION_SHARE * activations)
    if chunk:
        # The fused loss: one chunk's logits (fp32, plus the matmul output and the gradient's
        # cast in the compute dtype), and the gradients of x and w it computes as it goes,
        # which wait for the backward pass.
        fused_grads = 4 * BTD + (0 if lora else 4 * V * D)  # a frozen head gets no gradient
        held = 0
        fwd_logits = chunk * V * (4 + (2 * a if mixed else 0)) + fused_grads + (a * V * D if mixed and head_fp32
                                                                                else 0)
        bwd_logits = fused_grads
    elif whole_compiled:
        held = 0
        fwd_logits = a * BTV + 8 * B * T           # the logits and their log-sum-exp
        bwd_logits = COMPILED_LOGIT_COPIES * a * BTV  # the logits, their gradient, one more
    else:
        # The loop drops the logits right after the forward (LOGITS_HELD False).
        held = a * BTV if LOGITS_HELD else 0
        # logits (+ the previous ones), their fp32 copy (none in fp32), log-softmax output
        fwd_logits = held + a * BTV + (4 * BTV if mixed else 0) + 4 * BTV
        # log-softmax output + its gradient + the gradient of its input, and the held logits
        bwd_logits = held + 12 * BTV
    end_of_forward = static + casts_all + activations + fwd_logits
    start_of_backward = static + (casts_head if ckpt else casts_all) + activations + bwd_logits
    # late in backward: nearly all gradients exist, one block's activations are
    # alive (recomputed under checkpointing, with its casts) plus its backward temporaries
    layer_casts = (2 * ((n_train if lora else n_matmul - V * D) // L)) if mixed else 0
    transient = 3 * a * B * T * c.hidden_dim + 8 * BTD
    late_backward = (weights + optimizer + grads + held + layer_full + layer_casts + transient
                     + (layer_ckpt if ckpt else 0))
    opt_step = weights + grads + optimizer + opt_temp + held
    phases = {"end of forward": end_of_forward, "start of backward": start_of_backward,
              "optimizer step": opt_step}
    phases["late backward"] = late_backward
    phase = max(phases, key=phases.get)
    peak = phases[phase]

    workspace = CUDA_WORKSPACE_BYTES if dev.startswith("cuda") else 0
    phases = {k: v + workspace for k, v in phases.items()}
    peak = phases[phase]
    comp: dict[str, int] = {"weights": weights, "gradients": 0, "optimizer": optimizer,
                            "weight_casts": 0, "activations": 0, "logits": 0, "optimizer_temp": 0,
                            "workspace": workspace}
    if phase == "optimizer step":
        comp.update(gradients=grads, optimizer_temp=opt_temp, logits=held)
    else:
        comp["gradients"] = grads_resident
        comp["activations"] = activations
        if phase == "end of forward":
            comp.update(weight_casts=casts_all, logits=fwd_logits)
        elif phase == "start of backward":
            comp.update(weight_casts=casts_head if ckpt else casts_all, logits=bwd_logits)
        else:
            comp.update(activations=layer_full + transient + (layer_ckpt if ckpt else 0),
                        weight_casts=layer_casts, gradients=grads, logits=held)
    assert sum(comp.values()) == peak
    churn = comp["activations"] + comp["logits"] + comp["weight_casts"] + comp["optimizer_temp"]
    fragmentation = int(FRAGMENTATION * churn)
    if dev.startswith("cuda"):
        framework = CUDA_CONTEXT_BYTES
    elif dev == "mps":
        framework = MPS_FRAMEWORK_BYTES
    else:
        framework = CPU_FRAMEWORK_BYTES + (CPU_COMPILE_RUNTIME_BYTES if settings.compile or eight_bit else 0)
    return {
        "preset": preset.name, "device": dev, "precision": prec, "attention": attn,
        "activation_checkpointing": ckpt, "fused_adamw": bool(fused_adamw), "whole_compiled": whole_compiled,
        "optimizer_states": settings.optimizer_states,
        "batch_size": B, "seq_len": T, "grad_accum": t.grad_accum, "params": n,
        "components": comp,
        "peak_phase": phase,
        "phases": phases,
        "peak_allocated": peak,
        "fragmentation": fragmentation,
        "framework": framework,
        "total": peak + fragmentation + framework,
        "per_layer": {
            "saved": per_layer,
            "flash": layer_activation_bytes(c, B, prec, "flash", dev),
            "math": layer_activation_bytes(c, B, prec, "math", dev),
            "checkpointed": layer_ckpt,
        },
        "model_states": weights + grads + optimizer,
        "finetune": t.finetune,
        "trainable_params": n_train,
        "activations_total": activations,
        # a checkpoint's model.pt + state.pt: the weights (a LoRA run's adapters alone) and AdamW's states
        "checkpoint_bytes": 4 * n_train + optimizer,
    }


def fits(mem: dict[str, Any], available: int | None, headroom: float = HEADROOM) -> bool | None:
    """Whether ``mem['total']`` fits in ``available`` bytes keeping ``headroom`` spare (None: unknown)."""
    if not available:
        return None
    return mem["total"] <= (1.0 - headroom) * available


# ----------------------------------------------------------------------------- time, energy, cost

def tokens_per_s_from_flops(model_cfg, flops_per_s: float, efficiency: float) -> float:
    return flops_per_s * efficiency / flops_per_token(model_cfg)


def estimate_time(preset, tokens_per_s: float) -> dict[str, float]:
    """Seconds to train to max_iters at ``tokens_per_s``, plus the periodic evaluations
    (eval_iters batches of train and of val every eval_interval, forward only: ~1/3 of a step)."""
    if not tokens_per_s or tokens_per_s <= 0:
        raise WorkbenchError(f"tokens per second must be > 0, got {tokens_per_s!r}")
    t, c = preset.train, preset.model
    train_tokens = t.max_iters * preset.tokens_per_step()
    n_evals = t.max_iters // t.eval_interval + 1
    eval_tokens = n_evals * 2 * t.eval_iters * t.batch_size * c.seq_len
    train_s = train_tokens / tokens_per_s
    eval_s = eval_tokens / (3.0 * tokens_per_s)
    return {"tokens": float(train_tokens), "train_s": train_s, "eval_s": eval_s, "total_s": train_s + eval_s}


def estimate_cost(seconds: float, watts: float | None = None, usd_per_hour: float | None = None,
                  usd_per_kwh: float | None = None) -> dict[str, float | None]:
    """Energy (kWh at ``watts``) and cost: hours x $/hour plus kWh x $/kWh, each when given."""
    hours = seconds / 3600.0
    kwh = (watts * hours / 1000.0) if watts else None
    cost = None
    if usd_per_hour is not None or (usd_per_kwh is not None and kwh is not None):
        cost = (hours * usd_per_hour if usd_per_hour else 0.0) + (kwh * usd_per_kwh if usd_per_kwh and kwh else 0.0)
    return {"hours": hours, "watts": watts, "kwh": kwh, "usd": cost}
