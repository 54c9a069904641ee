"""What one transformer block saves for backward, in bytes, counted from the autograd graph of
``workbench.train.model.Block`` (eager; the whole-model compile's share and the checkpointed case are
``workbench.plan.fit.memory``'s), with and without QK-norm and LoRA. Arithmetic, no torch.
"""

from __future__ import annotations

from workbench.config import ModelConfig, TrainConfig, lora_projections
from workbench.plan.fit.flops import projection_shapes


def layer_activation_bytes(model_cfg: ModelConfig, batch_size: int, precision: str, attention: str,
                           device: str = "cuda", masked: bool = False) -> int:
    """Bytes one block saves for backward (no activation checkpointing), eager PyTorch.

    Counted from what autograd keeps for ``workbench.train.model.Block``: the
    residual stream is fp32 (fp32 weights, autocast leaves adds alone); RMSNorm
    keeps its input and the normalised fp32 tensor; under autocast each Linear
    keeps its own compute-dtype copy of its input (autocast caches casts of
    weights, not of activations, so wq, wk and wv each cast the norm output);
    SDPA keeps q, the (GQA-expanded) k and v, its output and the fp32
    log-sum-exp (flash; wo's input is a view of that output) or the T x T weights (math); SwiGLU keeps w1/w3
    outputs, silu(w1) and the product; dropout keeps a mask (1 byte on CUDA,
    the tensor's dtype elsewhere). RoPE and the GQA repeat keep nothing large.
    QK-norm (``model.qk_norm``) normalises the projections' outputs, so each of
    its two RMSNorms keeps an fp32 copy of q (or k) and the normalised tensor
    (fp32 without autocast, the compute dtype with it). ``masked`` (packed
    conversations): SDPA turns the [B, 1, T, T] bool mask into an additive one of
    q's dtype in each block and keeps it (measured on CPU: 4 bytes fp32, 2 bf16).
    """
    c = model_cfg
    B, T, D, F, H = batch_size, c.seq_len, c.dim, c.hidden_dim, c.n_heads
    BTD = B * T * D
    mixed = precision != "fp32"
    a = 2 if mixed else 4
    norms = 2 * (4 * BTD + 4 * BTD)          # each RMSNorm: its fp32 input + the normalised tensor
    # (wq, wk, wv) + (w1, w3) casts, or the shared fp32 norm output
    linear_inputs = (3 + 2) * a * BTD if mixed else 2 * 4 * BTD
    # flash: attention's output is laid out as q is, [B, T, heads, hd] (q and k are rotated before the transpose),
    # so wo's input is a view of the output SDPA keeps, kept once; math: a copy of its own
    wo_input = 0 if attention == "flash" else a * BTD
    if attention == "flash":
        attn = 4 * a * BTD + 4 * B * H * T   # q, k, v, out + fp32 logsumexp
    else:
        # CPU's math kernel upcasts bf16/fp16 to fp32 (measured with saved-tensor hooks)
        am = 4 if device == "cpu" else a
        attn = 3 * am * BTD + am * B * H * T * T   # q, k, v + softmax weights
        if c.dropout > 0:
            attn += 2 * am * B * H * T * T         # dropout mask and dropped weights
    if masked:
        attn += (4 if device == "cpu" and attention != "flash" else a) * B * T * T
    mlp = 4 * a * B * T * F                   # w1 out, silu(w1 out), w3 out, product (w2 input)
    qk = qk_norm_bytes(c, B, a, False)
    drop = 0
    if c.dropout > 0:
        drop = 2 * BTD * (1 if device.startswith("cuda") else a)
    return norms + linear_inputs + wo_input + attn + mlp + qk + drop


def qk_norm_bytes(c: ModelConfig, batch_size: int, a: int, compiled: bool) -> int:
    """What QK-norm saves in one block: eager, each of its RMSNorms keeps an fp32 copy of q (or k) and the
    normalised tensor (``4 + a`` bytes a value, ``a`` the compute dtype's); compiled on CUDA (one graph, no
    checkpointing), inductor recomputes the norms and RoPE and keeps about half of q and k in the compute
    dtype (``a / 2`` bytes a value): measured on an H200 with the norm and RoPE in the projections' layout
    (2026-11-27: 614 MiB over no QK-norm at ~110 M, batch 32; the earlier order, rotating after the transpose,
    kept q and k whole, 1,188 MiB; README GPU numbers)."""
    if not c.qk_norm:
        return 0
    per_value = a / 2 if compiled else 4 + a
    return int(per_value * batch_size * c.seq_len * c.head_dim * (c.n_heads + c.n_kv_heads))


def lora_layer_activation_bytes(model_cfg: ModelConfig, train_cfg: TrainConfig, batch_size: int, precision: str,
                                attention: str, device: str = "cuda", masked: bool = False) -> int:
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
    saved = layer_activation_bytes(c, B, precision, attention, device, masked) - 2 * 4 * B * T * D
    targets = set(lora_projections(t.lora_targets))
    shapes = projection_shapes(c)
    # wo's input is attention's output with flash, which attention keeps anyway: nothing of its own to drop
    own_input = ("wq", "wk", "wv", "w1", "w3") + (() if attention == "flash" else ("wo",))
    if mixed:  # each projection keeps its own cast of its input
        saved -= sum(a * B * T * shapes[n][0] for n in own_input if n not in targets)
    else:      # the shared norm outputs, when nothing reading them has an adapter
        saved -= 4 * B * T * D * ((not targets & {"wq", "wk", "wv"}) + (not targets & {"w1", "w3"}))
        saved -= 0 if "wo" in targets or "wo" not in own_input else a * B * T * shapes["wo"][0]
    if "w2" not in targets:
        saved -= a * B * T * F
    mask = 1 if device.startswith("cuda") else 4
    for n in targets:
        saved += a * B * T * t.lora_rank
        if t.lora_dropout > 0:
            saved += B * T * shapes[n][0] * (4 + mask)
    return saved
