"""Flex attention for packed conversations (hardware.attention_kernel = flex, auto on CUDA for packed rows
without dropout): the model gives the same hidden states with flex attention's BlockMask as with SDPA's
[B, 1, T, T] mask; the settings choose it and refuse it with attention dropout; the estimate counts no
per-block mask. Flex attention has no backward on a CPU: the training step is tests/train/test_gpu.py's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.support.chat import conversations, write_jsonl
from workbench.config import ModelConfig, Preset
from workbench.config.schema import HardwareConfig
from workbench.machine.detect import Gpu, Machine
from workbench.plan.fit.memory import estimate_memory
from workbench.plan.settings import SettingsError, resolve_settings
from workbench.train.model import GPT, document_mask

H100 = Machine(gpus=(Gpu(0, "NVIDIA H100", 80 * 2**30, 80 * 2**30, (9, 0)),))


def test_the_block_mask_gives_the_hidden_states_of_the_bool_mask():
    """Three and two conversations in two rows of 256 (blocks of 128 wholly inside, across and astride
    conversations), GQA: flex attention (compiled) against SDPA with the mask the model builds from the
    segments, and a row's conversations never see each other (changing the first conversation's tokens
    leaves the others' states as they were)."""
    cfg = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=256, ffn_hidden=128,
                      dropout=0.0)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    lengths = ((40, 100, 116), (200, 56))
    seg = torch.tensor([sum(([i] * n for i, n in enumerate(row)), []) for row in lengths])
    pos = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths])
    idx = torch.randint(0, 256, (2, 256))
    with torch.no_grad():
        sdpa = model.hidden(idx, None, pos, seg)
        flex = model.hidden(idx, None, pos, document_mask(seg))
        assert (flex - sdpa).abs().max().item() < 1e-5
        other = idx.clone()
        other[0, :40] = (other[0, :40] + 1) % 256
        changed = model.hidden(other, None, pos, document_mask(seg))
    assert (changed[0, 40:] - flex[0, 40:]).abs().max().item() < 1e-5
    assert (changed[0, :40] - flex[0, :40]).abs().max().item() > 1e-3


def test_flex_is_auto_for_packed_rows_on_cuda_and_the_estimate_keeps_no_mask(tmp_path):
    chat = write_jsonl(tmp_path / "chat.jsonl", conversations(5, seed=0))
    p = Preset(model=ModelConfig(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=128,
                                 ffn_hidden=128, dropout=0.0),
               hardware=HardwareConfig(device="cuda", precision="bf16", compile="false"))  # eager: exact sums
    packed = dataclasses.replace(p, data=dataclasses.replace(p.data, corpus=str(chat)))

    def kernel(preset, **hw):
        preset = dataclasses.replace(preset, hardware=dataclasses.replace(preset.hardware, **hw))
        return resolve_settings(preset, H100, world_size=1).attention_kernel

    assert kernel(packed) == "flex" and kernel(p) == "auto"  # text rows: torch's choice
    assert kernel(packed, deterministic=True) == "efficient" and kernel(packed, attention_kernel="cudnn") == "cudnn"
    dropout = dataclasses.replace(packed, model=dataclasses.replace(packed.model, dropout=0.1))
    assert kernel(dropout) == "auto"  # SDPA with the mask keeps attention dropout
    with pytest.raises(SettingsError, match=r"^hardware.attention_kernel = 'flex' has no attention dropout \(model"):
        kernel(dropout, attention_kernel="flex")
    flex = estimate_memory(packed, machine=H100)
    sdpa = estimate_memory(dataclasses.replace(packed, hardware=dataclasses.replace(packed.hardware,
                                                                                  attention_kernel="efficient")),
                           machine=H100)
    text = estimate_memory(p, machine=H100)
    B, T, L = p.train.batch_size, p.model.seq_len, p.model.n_layers
    assert flex.activations_total - text.activations_total == 16 * B * T  # positions and segments alone
    assert sdpa.activations_total - flex.activations_total == L * 2 * B * T * T + B * T * T
