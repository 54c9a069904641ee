"""Parameters, FLOPs per token, training memory by component, time, energy and cost.

Everything here is arithmetic on a preset; this module never imports torch, so
the TUI and `workbench estimate` can use it without paying for torch.

The MFU convention, stated once
-------------------------------
``flops_per_token(cfg) = 6 * N_matmul + 12 * L * H * Q * T``  (training: forward + backward)

* ``N_matmul`` counts the weights that take part in a matrix multiply: every
  Linear weight (wq, wk, wv, wo, w1, w2, w3 in each block) plus the output
  projection (vocab x dim). With tied embeddings that output projection *is*
  the embedding, so it is counted once; an untied input embedding is a table
  lookup (no FLOPs) and is left out. RMSNorm weights are left out (elementwise).
  Each such weight costs 2 FLOPs per token forward and 4 backward, hence 6.
* ``12 * L * H * Q * T`` is attention's score and weighted-sum matmuls
  (L layers, H query heads, Q head dim, T = seq_len), counted for the full
  T x T square as in PaLM (appendix B) and nanoGPT, although causal kernels skip
  about half of it. GQA does not change it: the key/value heads are shared, the
  dot products are not.

MFU = tokens_per_s * flops_per_token(cfg) / peak FLOP/s (see ``workbench.hardware.peak_flops``).
"""

from __future__ import annotations

from typing import Any

GB = 1024 ** 3
MB = 1024 ** 2


# ----------------------------------------------------------------------------- parameters

def param_breakdown(model_cfg) -> dict[str, int]:
    """Parameter count by part, exactly as ``workbench.train.model.GPT`` builds it."""
    c = model_cfg
    D, V, L, F = c.dim, c.vocab_size, c.n_layers, c.hidden_dim
    hd = c.head_dim
    attn = D * (c.n_heads * hd) + 2 * D * (c.n_kv_heads * hd) + (c.n_heads * hd) * D
    mlp = 3 * D * F
    norms = 2 * D
    out = {
        "embedding": V * D,
        "attention": L * attn,
        "mlp": L * mlp,
        "norms": L * norms + D,  # two per block and the final one
        "lm_head": 0 if c.tie_embeddings else V * D,
    }
    return out


def count_params(model_cfg) -> int:
    """Exact number of parameters of ``GPT(model_cfg)`` (equal to ``GPT(cfg).num_params()``)."""
    return sum(param_breakdown(model_cfg).values())


def matmul_params(model_cfg) -> int:
    """N_matmul of the MFU formula (see the module docstring)."""
    b = param_breakdown(model_cfg)
    output_projection = model_cfg.vocab_size * model_cfg.dim
    return b["attention"] + b["mlp"] + output_projection


def flops_per_token(model_cfg) -> float:
    """Training FLOPs per token: 6 * N_matmul + 12 * L * H * Q * T (module docstring)."""
    c = model_cfg
    return 6.0 * matmul_params(c) + 12.0 * c.n_layers * c.n_heads * c.head_dim * c.seq_len


# ----------------------------------------------------------------------------- memory

# Allowances that are not tensors of the model. CUDA: the context (driver,
# kernels, cuBLAS/cuDNN handles) lives outside PyTorch's allocator and shows
# in nvidia-smi, ~0.3-0.6 GB with lazy module loading. CPU: importing torch
# and its CPU libraries adds ~0.35 GB of RSS (measured: peak RSS of bench/batch_sweep.py at batch 1).
CUDA_CONTEXT_BYTES = int(0.5 * GB)
CPU_FRAMEWORK_BYTES = int(0.35 * GB)
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
LOGITS_HELD = False  # "fits" means total <= (1 - HEADROOM) x what the device has


def _resolve_device(device: str | None, preset) -> str:
    dev = device or preset.hardware.device
    if dev == "auto":
        from workbench import hardware
        dev = hardware.best_device(hardware.detect(use_torch=False))
    return dev


def resolve_precision(precision: str | None, preset, device: str) -> str:
    """The training loop's rule: auto = bf16 on CUDA (fp16 on pre-Ampere, same bytes) and MPS, fp32 on CPU."""
    prec = precision or preset.hardware.precision
    if prec in (None, "auto"):
        return "fp32" if device.startswith("cpu") else "bf16"
    if prec not in ("fp32", "bf16", "fp16"):
        from workbench.errors import WorkbenchError
        raise WorkbenchError(f"precision {prec!r} is not one of auto, fp32, bf16, fp16")
    return prec


def attention_kind(device: str, dropout: float) -> str:
    """Which SDPA kernel the model gets, for memory: "flash" keeps O(T) per head
    (CUDA flash / memory-efficient kernels, CPU flash without dropout); "math"
    materialises the T x T attention weights (MPS; CPU with dropout)."""
    if device.startswith("cuda"):
        return "flash"
    if device == "mps":
        return "math"
    return "math" if dropout > 0 else "flash"


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
    """
    c = model_cfg
    B, T, D, F, H = batch_size, c.seq_len, c.dim, c.hidden_dim, c.n_heads
    BTD = B * T * D
    mixed = precision != "fp32"
    a = 2 if mixed else 4
    norms = 2 * (4 * BTD + 4 * BTD)          # each RMSNorm: its fp32 input + the normalised tensor
    linear_inputs = (3 + 2) * a * BTD if mixed else 2 * 4 * BTD  # (wq,wk,wv)+(w1,w3) casts, or the shared fp32 norm output
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
    drop = 0
    if c.dropout > 0:
        drop = 2 * BTD * (1 if device.startswith("cuda") else a)
    return norms + linear_inputs + wo_input + attn + mlp + drop


def auto_loss_chunk(batch_size: int, seq_len: int, vocab_size: int, setting: str, device: str = "cpu") -> int:
    """Tokens per chunk of the fused loss (FusedLinearCrossEntropy), or 0 for the plain loss.

    CPU: always on (auto), 512 tokens a chunk (at most 64 MiB of fp32 logits). Measured in one
    process against the plain loss: cpu-small +11 % (256 and 512 rows alike), medium +6 % at
    512 rows, +5 % at 128 or 256. GPU / MPS: only when the step's fp32 logits would exceed
    1 GiB (then ~256 MiB chunks): there the plain loss was measured, the fused one not yet.
    """
    n_tok = batch_size * seq_len
    if setting == "false":
        return 0
    if not (device.startswith("cuda") or device == "mps"):
        return min(n_tok, 512, max(64, (2**26) // (4 * vocab_size)))
    if setting == "auto" and n_tok * vocab_size * 4 <= 2**30:
        return 0
    return max(256, min(n_tok, (2**28) // (4 * vocab_size)))


def estimate_memory(preset, precision: str | None = None, device: str | None = None,
                    batch_size: int | None = None, activation_checkpointing: bool | None = None,
                    attention: str | None = None, fused_adamw: bool | None = None) -> dict[str, Any]:
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
    (CUDA context or torch's RSS). torch.compile usually saves less than this.
    """
    c, t, h = preset.model, preset.train, preset.hardware
    dev = _resolve_device(device, preset)
    prec = resolve_precision(precision, preset, dev)
    B = batch_size or t.batch_size
    T, D, V, L = c.seq_len, c.dim, c.vocab_size, c.n_layers
    ckpt = h.activation_checkpointing if activation_checkpointing is None else activation_checkpointing
    attn = attention or attention_kind(dev, c.dropout)
    if fused_adamw is None:
        fused_adamw = h.fused_adamw == "true" or (h.fused_adamw == "auto" and dev != "mps")
    mixed = prec != "fp32"
    a = 2 if mixed else 4
    BTD, BTV = B * T * D, B * T * V

    n = count_params(c)
    n_matmul = matmul_params(c)
    weights = 4 * n
    grads = 4 * n
    optimizer = 8 * n
    # AdamW's step: the fused kernel needs no temporaries; the foreach version
    # (CUDA's default) makes one fp32 sqrt(v) per parameter at once; the
    # per-tensor loop (CPU and MPS default) about three temporaries of the largest tensor.
    if fused_adamw:
        opt_temp = 0
    elif dev.startswith("cuda"):
        opt_temp = 4 * n
    else:
        opt_temp = 12 * max(V * D, D * c.hidden_dim, D * c.n_heads * c.head_dim)
    casts_all = 2 * n_matmul if mixed else 0
    casts_head = 2 * V * D if mixed else 0
    layer_full = layer_activation_bytes(c, B, prec, attn, dev)
    layer_ckpt = 4 * BTD  # the checkpoint keeps only the block's input
    emb = 16 * B * T + (BTD * (1 if dev.startswith("cuda") else 4) if c.dropout > 0 else 0)  # ids, targets, dropout mask
    head = 4 * BTD + 4 * BTD + (a * BTD if mixed else 4 * BTD)  # final norm input + normalised + lm_head input
    per_layer = layer_ckpt if ckpt else layer_full
    activations = L * per_layer + emb + head
    grads_resident = grads if t.grad_accum > 1 else 0

    static = weights + optimizer + grads_resident
    # Logits exist for one loss chunk at a time when the loss is chunked (hardware.chunked_loss).
    chunk = auto_loss_chunk(B, T, V, h.chunked_loss, dev)
    if chunk:
        # The fused loss: one chunk's logits (fp32, plus the matmul output and the gradient's
        # cast in the compute dtype), and the gradients of x and w it computes as it goes,
        # which wait for the backward pass.
        fused_grads = 4 * BTD + 4 * V * D
        held = 0
        fwd_logits = chunk * V * (4 + (2 * a if mixed else 0)) + fused_grads + (a * V * D if mixed else 0)
        bwd_logits = fused_grads
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
    layer_casts = 2 * (n_matmul - V * D) // L if mixed else 0
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
        framework = CPU_FRAMEWORK_BYTES
    return {
        "preset": preset.name, "device": dev, "precision": prec, "attention": attn,
        "activation_checkpointing": ckpt, "fused_adamw": bool(fused_adamw),
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
    }


def fits(mem: dict[str, Any], available: int | None, headroom: float = HEADROOM) -> bool | None:
    """Whether ``mem['total']`` fits in ``available`` bytes keeping ``headroom`` spare (None: unknown)."""
    if not available:
        return None
    return mem["total"] <= (1.0 - headroom) * available


# ----------------------------------------------------------------------------- time, energy, cost

# Share of the measured matmul rate a whole eager training step reaches: small
# models spend much of the step in memory-bound ops (norms, RoPE, softmax,
# AdamW). Measured eager on an H100: 10 % (medium) to 25 % (datacenter-80gb)
# of the bf16 peak; on a 2-core AVX-512 CPU, cpu-small reaches 67 % of the
# measured fp32 matmul rate (the CPU's matmul rate is far below its peak). Used only when no run of the preset has been measured here.
ASSUMED_EFFICIENCY = {"cpu": 0.5, "cuda": 0.15, "mps": 0.15}


def tokens_per_s_from_flops(model_cfg, flops_per_s: float, efficiency: float) -> float:
    return flops_per_s * efficiency / flops_per_token(model_cfg)


def estimate_time(preset, tokens_per_s: float) -> dict[str, float]:
    """Seconds to train to max_iters at ``tokens_per_s``, plus the periodic evaluations
    (eval_iters batches of train and of val every eval_interval, forward only: ~1/3 of a step)."""
    if not tokens_per_s or tokens_per_s <= 0:
        from workbench.errors import WorkbenchError
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


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", GB), ("MiB", MB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def human_duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m {s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h {m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d {h}h"
