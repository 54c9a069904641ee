"""Estimates against the real model: parameter counts, FLOPs, memory components."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench.config import ModelConfig, preset_paths, resolve_preset
from workbench.estimate import count_params, flops_per_token, matmul_params
from workbench.train.model import GPT


def _meta_count(cfg: ModelConfig) -> int:
    with torch.device("meta"):
        return GPT(cfg).num_params()


@pytest.mark.parametrize("name", sorted(preset_paths()))
def test_param_count_equals_model_for_every_preset(name):
    cfg = resolve_preset(name).model
    assert count_params(cfg) == _meta_count(cfg)


@pytest.mark.parametrize("n_heads,n_kv_heads,tie", [(8, 8, True), (8, 2, True), (8, 1, True), (8, 4, False), (6, 3, False)])
def test_param_count_gqa_mqa_and_untied(n_heads, n_kv_heads, tie):
    cfg = ModelConfig(vocab_size=300, dim=96, n_layers=3, n_heads=n_heads, n_kv_heads=n_kv_heads,
                      seq_len=32, ffn_hidden=0, tie_embeddings=tie)
    assert count_params(cfg) == _meta_count(cfg)
    cfg2 = dataclasses.replace(cfg, ffn_hidden=200)
    assert count_params(cfg2) == _meta_count(cfg2)


def test_flops_per_token_hand_computed():
    cfg = ModelConfig(vocab_size=1000, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=16, ffn_hidden=128)
    # per layer: wq 64*64 + wk,wv 2*64*32 + wo 64*64 + mlp 3*64*128 = 4096+4096+4096+24576
    per_layer = 4096 + 4096 + 4096 + 24576
    n = 2 * per_layer + 1000 * 64  # + output projection (the tied embedding, once)
    assert matmul_params(cfg) == n
    assert flops_per_token(cfg) == 6 * n + 12 * 2 * 4 * 16 * 16
