"""LoRA: low-rank adapters on a frozen model (``train.finetune = "lora"``).

Each target projection (``train.lora_targets``: attention's wq/wk/wv/wo, the MLP's w1/w2/w3) becomes a
:class:`LoRALinear`: the same frozen ``weight`` (and bias), plus ``lora_a`` [r, in] and ``lora_b`` [out, r],
computing ``x W^T + b + (alpha / r) * dropout(x) A^T B^T``. ``lora_b`` starts at zero, so a fresh adapter
changes nothing; ``lora_a`` starts as nn.Linear's weights do (Kaiming uniform), as in Hu et al. and PEFT.

Only the adapters train and only they are saved (``adapter_state_dict``): a checkpoint of a LoRA run is
a few MB whatever the model's size, and the base weights stay bit for bit those the run started from
(its ``init/model.pt``). Export merges them: ``W + (alpha / r) B A`` (``merge_adapters``).

State-dict names keep the base model's (``layers.0.attn.wq.weight``) and add the adapters beside them
(``layers.0.attn.wq.lora_a``), so a base checkpoint loads into the adapted model unchanged.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from workbench.config import TrainConfig, lora_projections
from workbench.train.model import GPT

ADAPTER_SUFFIXES = (".lora_a", ".lora_b")
# Where each projection lives in a block.
PROJECTION_PARENT = {"wq": "attn", "wk": "attn", "wv": "attn", "wo": "attn", "w1": "mlp", "w2": "mlp", "w3": "mlp"}


class LoRALinear(nn.Module):
    """A frozen nn.Linear's weight and bias with a trainable low-rank update beside it."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.rank, self.scale = rank, alpha / rank
        dev = base.weight.device
        self.lora_a = nn.Parameter(torch.empty(rank, self.in_features, device=dev))
        self.lora_b = nn.Parameter(torch.zeros(self.out_features, rank, device=dev))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.disabled = False  # adapters_off: the frozen projection alone (a preference run's reference)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight, self.bias)
        if self.disabled:
            return base
        return base + F.linear(F.linear(self.drop(x), self.lora_a), self.lora_b) * self.scale


def apply_lora(model: GPT, t: TrainConfig) -> int:
    """Freeze every weight of ``model`` and put adapters on ``train.lora_targets``, in place; returns
    the number of trainable (adapter) parameters. The adapters' initial values come from torch's RNG."""
    for p in model.parameters():
        p.requires_grad_(False)
    targets = lora_projections(t.lora_targets)
    for block in model.layers:
        for name in targets:
            parent = getattr(block, PROJECTION_PARENT[name])
            setattr(parent, name, LoRALinear(getattr(parent, name), t.lora_rank, t.lora_alpha, t.lora_dropout))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[None]:
    """The model without its adapters while inside: its frozen weights alone (a LoRA preference run's reference:
    the model it started from, with no second copy of the weights)."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for m in layers:
        m.disabled = True
    try:
        yield
    finally:
        for m in layers:
            m.disabled = False


def cast_frozen(model: GPT, dtype: torch.dtype) -> None:
    """Keep the frozen projection weights (and an untied head) in the compute dtype (bf16/fp16): autocast
    would cast them every step anyway, and this halves the frozen model's memory. The embedding, norms
    and adapters stay fp32 (the residual stream stays fp32)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, LoRALinear)) and not m.weight.requires_grad:
            m.weight.data = m.weight.data.to(dtype)
            if m.bias is not None:
                m.bias.data = m.bias.data.to(dtype)


def is_adapter(name: str) -> bool:
    return name.endswith(ADAPTER_SUFFIXES)


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters alone (what a LoRA checkpoint holds)."""
    return {k.removeprefix("_orig_mod."): v for k, v in model.state_dict().items() if is_adapter(k)}


def merge_adapters(base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor],
                   t: TrainConfig) -> dict[str, torch.Tensor]:
    """The plain state dict of the adapted model: each target weight W + (alpha / r) B A, in fp32
    (the sum computed in float64 so it is the best fp32 value). ``base`` is left as it is."""
    out = dict(base)
    scale = t.lora_alpha / t.lora_rank
    for key in adapters:
        if not key.endswith(".lora_a"):
            continue
        stem = key.removesuffix(".lora_a")
        a, b = adapters[stem + ".lora_a"].double(), adapters[stem + ".lora_b"].double()
        w = base[stem + ".weight"]
        out[stem + ".weight"] = (w.double() + scale * (b @ a)).to(torch.float32)
    return out
